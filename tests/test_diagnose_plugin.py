"""The --gpu-diagnose session, exercised through pytester."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

HIDDEN = {"env.cuda_visible_devices": "", "env.variables": {"CUDA_VISIBLE_DEVICES": ""},
          "torch.cuda_available": False, "torch.device_count": 0}


def test_empty_folder_on_a_machine_without_gpu_exits_0_and_explains(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("cpu_laptop")
    result = pytester.runpytest("--gpu-diagnose")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "gputrain: no NVIDIA GPU visible: see GT001 in the diagnosis below",
        "gputrain: torch * (CPU-only build)",
        "*= gputrain diagnosis =*",
        "WARNING GT001 no-nvidia-driver: *",
        "    where: session",
        "    No NVIDIA GPU can be used here: the NVIDIA driver is not installed*",
    ])


def test_the_header_says_why_there_is_no_gpu_where_no_finding_does(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("cpu_laptop")
    result = pytester.runpytest("--gpu-diagnose", "--gpu-ignore=GT001")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["gputrain: no NVIDIA GPU visible: the NVIDIA driver is not "
                                 "installed*"])
    assert "GT001" not in result.stdout.str()


def test_real_machine_diagnosis_never_crashes(pytester: pytest.Pytester) -> None:
    """On whatever machine runs the suite: a header, a diagnosis, and no internal error."""
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--gpu-diagnose", "--gpu-fail-on=never")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["gputrain: *", "*= gputrain diagnosis =*"])
    assert "INTERNALERROR" not in result.stdout.str()


def test_healthy_gpu_has_no_findings_and_header_shows_device(
    pytester: pytest.Pytester, use_facts: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    use_facts("h200_healthy")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--gpu-diagnose", "--gpu-fail-on=warning")
    assert result.ret == 0
    result.stdout.fnmatch_lines([  # fitted to 80 columns
        "gputrain: NVIDIA driver * (CUDA 13.0), 1 GPU(s) |",
        "            torch * (CUDA 13.0*sees 1 GPU(s))",
        "gputrain: GPU 0 NVIDIA H200 | cc 9.0 | mem * / * GiB*",
    ])
    assert "WARNING" not in result.stdout.str()
    assert "ERROR" not in result.stdout.str()


def test_error_finding_fails_the_run_unless_told_otherwise(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("h200_healthy", HIDDEN)
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--gpu-diagnose")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*ERROR*GT003*", "*failing the run*--gpu-fail-on*"])
    assert pytester.runpytest("--gpu-diagnose", "--gpu-fail-on=never").ret == 0
    pytester.makeini("[pytest]\ngpu_fail_on = never\n")
    assert pytester.runpytest("--gpu-diagnose").ret == 0


def test_failing_tests_keep_their_exit_code(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile("def test_bad(): assert False")
    assert pytester.runpytest("--gpu-diagnose").ret == 1


def test_ini_turns_diagnosis_on_and_selects_rules(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("h200_healthy", HIDDEN | {"env.cuda_launch_blocking": True})
    pytester.makeini("[pytest]\ngpu_diagnose = true\ngpu_ignore = GT003\n")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*GT015*"])
    assert "GT003" not in result.stdout.str()
    assert result.ret == 0
    pytester.makeini("[pytest]\ngpu_diagnose = true\n")
    result = pytester.runpytest("--gpu-select=GT003")
    assert "GT015" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*GT003*"])


def test_severity_and_param_overrides(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("h200_healthy", {"host.shm_total": 600 * 2**20})
    assert "GT016" not in pytester.runpytest("--gpu-diagnose").stdout.str()
    result = pytester.runpytest("--gpu-diagnose", "--gpu-rule-param=GT016.min_shm=1GiB",
                                "--gpu-severity=GT016=error")
    result.stdout.fnmatch_lines(["*ERROR*GT016*"])
    assert result.ret == 1


def test_json_and_markdown_reports(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("h200_healthy", HIDDEN)
    result = pytester.runpytest("--gpu-diagnose", "--gpu-report=out/report.json",
                                "--gpu-report=summary.md", "--gpu-fail-on=never")
    assert result.ret == 0
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    assert report["schema"] == "pytest-gputrain-report"
    assert report["schema_version"] == 1
    assert report["summary"]["error"] == 1
    assert [f["code"] for f in report["findings"]] == ["GT003"]
    finding = report["findings"][0]
    assert set(finding) >= {"code", "severity", "subject", "message", "fix", "why", "evidence"}
    assert report["environment"]["devices"][0]["name"] == "NVIDIA H200"
    markdown = (pytester.path / "summary.md").read_text()
    assert markdown.startswith("## GPU diagnosis (pytest-gputrain)")
    assert "`GT003`" in markdown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu-fail-on=sometimes"],
         "*--gpu-fail-on*'sometimes' is not a severity that fails the session; expected one of "
         "error, warning*"),
        (["--gpu-report=report.txt"],
         "*--gpu-report*'report.txt' must end in .json, .md or .html*"),
        (["--gpu-severity=GT016=fatal"], "*--gpu-severity*'GT016=fatal' must be CODE=LEVEL*"),
        (["--gpu-severity=GT999=error"], "*--gpu-severity: no rule with code GT999*"),
        (["--gpu-rule-param=GT016.min_shm=lots"], "*GT016.min_shm='lots'*invalid size*"),
        (["--gpu-rule-param=GT016.nope=1"], "*GT016 has no parameter 'nope'*"),
        (["--gpu-rule-param=GT016.min_shm=" + "9" * 5000],
         "*GT016.min_shm='9999*'... (5000 characters): more than 18 digits (default*"),
        (["--gpu-rule-param=GT016.min_shm=1e400"], "*GT016.min_shm='1e400': invalid size*"),
        (["--gpu-rule-param=GT102.max_wait_percent=nan"],
         "*GT102.max_wait_percent='nan': not a finite number of at most 18 digits*"),
        (["--gpu-select=G!"], "*--gpu-select*'G!' is not a rule code*"),
        (["--gpu-rules-dir=missing"], "*missing: rule directory does not exist*"),
    ],
)
def test_bad_settings_are_usage_errors(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    result = pytester.runpytest("--gpu-diagnose", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_malformed_project_rule_is_a_usage_error_naming_file_and_field(
    pytester: pytest.Pytester,
) -> None:
    rules = pytester.mkdir("gpu-rules")
    (rules / "GT901-bad.toml").write_text(
        'code = "GT901"\nname = "bad"\ntitle = "t"\nscope = "session"\nseverity = "warning"\n'
        'condition = "host.cpu_count_logical >"\nmessage = "m"\nfix = "f"\nwhy = "w"\n'
    )
    result = pytester.runpytest("--gpu-diagnose", "--gpu-rules-dir=gpu-rules")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*GT901-bad.toml: field 'condition':*"])
    (rules / "GT901-bad.toml").write_text(
        'code = "GT901"\nname = "bad"\ntitle = "t"\nscope = "session"\nseverity = "warning"\n'
        'condition = "host.cpu_count > 2"\nmessage = "m"\nfix = "f"\nwhy = "w"\n'
    )
    result = pytester.runpytest("--gpu-diagnose", "--gpu-rules-dir=gpu-rules")
    result.stderr.fnmatch_lines(["*GT901-bad.toml: unknown fact(s) host.cpu_count*"])


def test_project_rule_directory_adds_rules(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("cpu_laptop")
    rules = pytester.mkdir("gpu-rules")
    (rules / "GT900-few-cpus.toml").write_text(
        'code = "GT900"\nname = "few-cpus"\ntitle = "Few CPUs"\nscope = "session"\n'
        'severity = "error"\ncondition = "host.cpu_count_logical < params.min_cpus"\n'
        'message = "only {host.cpu_count_logical} CPUs"\nfix = "use a bigger runner"\n'
        'why = "workers"\n[params]\nmin_cpus = 64\n'
    )
    pytester.makeini("[pytest]\ngpu_rules_dir = gpu-rules\n")
    result = pytester.runpytest("--gpu-diagnose")
    result.stdout.fnmatch_lines(["*ERROR*GT900*", "*only * CPUs*"])
    assert result.ret == 1


def test_facts_out_replays_to_the_same_findings(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("h200_healthy", HIDDEN | {"env.cuda_launch_blocking": True})
    result = pytester.runpytest("--gpu-diagnose", "--gpu-facts-out=facts.json",
                                "--gpu-report=report.json", "--gpu-fail-on=never")
    assert result.ret == 0
    live = json.loads((pytester.path / "report.json").read_text())["findings"]
    replay = subprocess.run(
        [sys.executable, "-m", "pytest_gputrain", "replay", str(pytester.path / "facts.json"),
         "--format", "json"], capture_output=True, text=True, check=False)
    assert replay.returncode == 1, replay.stderr  # an error-level finding
    assert json.loads(replay.stdout)["findings"] == live
    assert [f["code"] for f in live] == ["GT003", "GT015"]


def test_without_the_flag_nothing_is_collected_or_imported(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import sys
        def test_torch_not_imported():
            assert "torch" not in sys.modules
            assert "pydantic" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "gputrain:" not in result.stdout.str()


def test_plugin_can_be_disabled(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "no:gputrain", "--gpu-diagnose")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unrecognized arguments: --gpu-diagnose*"])


def test_xdist_diagnoses_once_on_the_controller(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile("def test_a(): pass\ndef test_b(): pass")
    result = pytester.runpytest_subprocess("--gpu-diagnose", "-n", "2", "--gpu-fail-on=never")
    assert result.ret == 0
    assert result.stdout.str().count("gputrain diagnosis") == 1


def test_debugging_switches_in_the_environment_are_read_and_judged(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GT022/GT023 from the real collector: the variables reach the facts and the rules."""
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
    monkeypatch.setenv("TORCH_COMPILE_DEBUG", "1")
    monkeypatch.setenv("TORCH_LOGS", "recompiles")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--gpu-diagnose", "--gpu-facts-out=facts.json",
                                "--gpu-report=report.json", "--gpu-fail-on=never")
    assert result.ret == 0
    env = json.loads((pytester.path / "facts.json").read_text())["environment"]["env"]
    assert env["cuda_memory_caching_disabled"] is True
    assert env["compile_debug_settings"] == ["TORCH_COMPILE_DEBUG=1"]
    codes = {f["code"]: f for f in
             json.loads((pytester.path / "report.json").read_text())["findings"]}
    assert codes["GT023"]["severity"] == "info"
    cuda = json.loads((pytester.path / "facts.json").read_text())[
        "environment"]["torch"]["cuda_available"]
    assert ("GT022" in codes) is bool(cuda)  # only where CUDA works
