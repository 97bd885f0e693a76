"""`python -m pytest_gputrain`: replay recorded facts, list and explain rules, clear errors."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_gputrain.cli import build_parser, main
from pytest_gputrain.engine.rules import builtin_rules_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

FACTS = Path(__file__).parent / "facts"
RULES = builtin_rules_dir()


def replay(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_gputrain", "replay", str(path), *args],
                          capture_output=True, text=True, check=False)


def test_recorded_healthy_2xh200_replays_to_no_findings() -> None:
    """Recorded with --gpu-facts-out on the lent 2x H200 (driver 580.159.04, torch 2.11)."""
    result = replay(FACTS / "h200x2_recorded.json", "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["findings"] == []
    assert [d["name"] for d in report["environment"]["devices"]] == ["NVIDIA H200"] * 2


def test_recorded_hidden_gpus_replay_to_gt003() -> None:
    """Recorded there with CUDA_VISIBLE_DEVICES="": the same finding as on the device."""
    result = replay(FACTS / "h200x2_hidden_recorded.json")
    assert result.returncode == 1  # an error-level finding fails, as --gpu-fail-on=error does
    text = " ".join(result.stdout.split())  # as wrapped to the terminal's width
    assert ("ERROR GT003 gpus-hidden-by-cuda-visible-devices: CUDA_VISIBLE_DEVICES hides every "
            "GPU from torch where: session") in text
    assert 'CUDA_VISIBLE_DEVICES="" hides every GPU: NVML lists 2 GPU(s)' in text
    assert replay(FACTS / "h200x2_hidden_recorded.json", "--fail-on", "never").returncode == 0
    assert replay(FACTS / "h200x2_hidden_recorded.json", "--ignore", "GT003").returncode == 0


def test_markdown_replay() -> None:
    result = replay(FACTS / "h200x2_hidden_recorded.json", "--format", "md")
    assert result.stdout.startswith("## GPU diagnosis (pytest-gputrain)")
    assert "| `GT003`" in result.stdout.replace("🔴 error ", "")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("{not json", "not valid JSON"),
        ('{"kind": "something-else"}', "not a pytest-gputrain facts file"),
        ('{"kind": "pytest-gputrain-facts", "schema_version": 99}', "schema version 99"),
        ('{"kind": "pytest-gputrain-facts", "schema_version": 1, "environment": '
         '{"devices": [{"memory_total": "lots"}]}}', "invalid facts at environment.devices.0"),
    ],
)
def test_bad_facts_files_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "facts.json"
    if content is not None:
        path.write_text(content)
    assert main(["replay", str(path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("pytest_gputrain: error: ")
    assert str(path) in error
    assert message in error
    if content is not None:
        assert path.read_text() == content  # never touched


def _healthy_run_with(marker: str, inserted: str) -> str:
    """The recorded healthy run's facts file with ``marker`` (a JSON value in it) replaced."""
    text = json.dumps(json.loads((FACTS / "run_healthy_h200.json").read_text()))
    assert marker in text
    return text.replace(marker, inserted, 1)


DEEP = "arrays or objects are nested too deeply to read (a facts file nests fewer than ten levels)"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[" * 100_000, "not a pytest-gputrain facts file (written by --gpu-facts-out): its top "
                        "level is not an object"),
        (_healthy_run_with('"runs": [', '"runs": [' + "[" * 100_000 + "]" * 100_000 + ","),
         DEEP),
        (_healthy_run_with('"runs": [', '"runs": [' + "9" * 5000 + ","),
         "the integer '" + "9" * 40 + "'... (5000 characters) is out of range (a fact is at "
         "most 2**63)"),
        (_healthy_run_with('"memory_used": ', '"memory_used": ' + "1" + "0" * 400 + ", \"x\": "),
         "the integer '1000000000000000000000000000000000000000'... (401 characters) is out of "
         "range (a fact is at most 2**63)"),
        (_healthy_run_with('"memory_used": ', '"memory_used": NaN, "x": '),
         "NaN is not a JSON number (write null for an unknown value)"),
        (_healthy_run_with('"memory_used": ', '"memory_used": -Infinity, "x": '),
         "-Infinity is not a JSON number (write null for an unknown value)"),
    ],
    ids=["deep", "deep-inside-facts", "5000-digits", "400-digits", "nan", "infinity"],
)
def test_hostile_facts_files_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "facts.json"
    path.write_text(content)
    result = replay(path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"pytest_gputrain: error: {path}: {message}\n"


@pytest.mark.parametrize("output", ["text", "md", "json"])
def test_a_lone_surrogate_in_a_device_name_is_printed_escaped(tmp_path: Path,
                                                              output: str) -> None:
    path = tmp_path / "facts.json"
    path.write_text(_healthy_run_with('"NVIDIA H200"', '"NVIDIA \\ud800 H200"'))
    result = replay(path, "--format", output)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)["environment"]["devices"][0]["name"] if output == "json" \
        else result.stdout
    assert "NVIDIA \\ud800 H200" in shown


def test_rules_lists_the_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules"]) == 0
    out = capsys.readouterr().out
    assert "GT001" in out and "no-nvidia-driver" in out
    assert main(["rules", "--scope", "device"]) == 0
    device_only = capsys.readouterr().out
    assert "GT007" in device_only and "GT001" not in device_only


def test_explain_prints_the_docs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "gt007"]) == 0
    out = capsys.readouterr().out
    for heading in ("## What it checks", "## Why is this bad", "## Example", "## Fix",
                    "## Options", "## References"):
        assert heading in out
    assert "GT007.min_memory" in out
    assert main(["explain", "GT999"]) == 2
    assert "no rule 'GT999'" in capsys.readouterr().err


def test_facts_and_schema_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["facts", "--scope", "device"]) == 0
    out = capsys.readouterr().out
    assert "device.memory_total" in out and "bytes" in out
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["properties"]["schema_version"]["default"] == 1
    assert "findings" in schema["required"]


@pytest.mark.parametrize("command", [
    ["rules"],
    ["replay", str(FACTS / "h200x2_hidden_recorded.json")],
    ["replay", str(FACTS / "run_healthy_h200.json"), "--format", "md"],
    ["replay", str(FACTS / "run_healthy_h200.json"), "--format", "json"],
    ["explain", "GT007"],
    ["facts", "--scope", "run"],
    ["schema"],
    ["--help"],
    ["--version"],
    ["history", "--help"],
], ids=lambda command: " ".join(Path(part).name for part in command))
def test_a_reader_that_went_away_ends_the_command_quietly(command: list[str]) -> None:
    """`python -m pytest_gputrain rules | head`: no BrokenPipeError traceback, whichever
    command. The pipe's reading end is closed before the command starts, so every write fails
    (as it does for `| true`, or for `| head` once head has its lines)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "pytest_gputrain", *command],
                                stdout=write_end, stderr=subprocess.PIPE, text=True,
                                check=False)
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode in (0, 1)  # 1 as Python's docs do; argparse's --help exits 0


def test_head_takes_its_lines_and_the_rest_stops_quietly() -> None:
    """A real shell pipeline: `head` has its line from the first command and is gone by the
    time the second one writes."""
    command = (f"{shlex.quote(sys.executable)} -m pytest_gputrain explain GT007; "
               + f"{shlex.quote(sys.executable)} -m pytest_gputrain schema")
    result = subprocess.run(["bash", "-c", f"({command}) | head -n 1"],
                            capture_output=True, text=True, check=False)
    assert result.stdout.startswith("GT007")
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr


# -- the project's settings, as pytest reads them ----------------------------------------------

PROJECT_RULE = """
code = "GT901"
name = "few-cpus"
title = "Few CPUs for the GPUs"
scope = "session"
severity = "warning"
condition = "host.cpu_count_logical < params.min_cpus"
message = "only {host.cpu_count_logical} CPUs"
fix = "use a bigger runner"
why = "data loading"
[params]
min_cpus = 4
"""


def project(tmp_path: Path, ini_name: str, ini_text: str) -> Path:
    """A project with its rules folder (GT901, and GT902 that always fires) and its settings
    in ``ini_name``; its tests folder."""
    (tmp_path / "ci-rules").mkdir(parents=True)
    (tmp_path / "ci-rules" / "GT901-few-cpus.toml").write_text(PROJECT_RULE)
    (tmp_path / "ci-rules" / "GT902-always.toml").write_text(
        PROJECT_RULE.replace("GT901", "GT902").replace("few-cpus", "always").replace(
            "host.cpu_count_logical < params.min_cpus", "devices.count >= 0"))
    (tmp_path / ini_name).write_text(ini_text)
    (tmp_path / "tests").mkdir()
    return tmp_path / "tests"


def replay_in(directory: Path, path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_gputrain", "replay", str(path),
                           "--format", "json", *args], capture_output=True, text=True,
                          check=False, cwd=directory)


@pytest.mark.parametrize(("ini_name", "ini_text"), [
    ("pyproject.toml", '[tool.pytest.ini_options]\ngpu_rules_dir = ["ci-rules"]\n'
                       'gpu_ignore = ["GT902"]\ngpu_severity = ["GT003=warning"]\n'
                       'gpu_rule_param = ["GT901.min_cpus=64"]\ngpu_fail_on = "warning"\n'),
    ("pytest.ini", "[pytest]\ngpu_rules_dir = ci-rules\ngpu_ignore = GT902\n"
                   "gpu_severity = GT003=warning\ngpu_rule_param = GT901.min_cpus=64\n"
                   "gpu_fail_on = warning\n"),
    ("tox.ini", "[pytest]\ngpu_rules_dir = ci-rules\ngpu_ignore = GT902\n"
                "gpu_severity = GT003=warning\ngpu_rule_param = GT901.min_cpus=64\n"
                "gpu_fail_on = warning\n"),
    ("setup.cfg", "[tool:pytest]\ngpu_rules_dir = ci-rules\ngpu_ignore = GT902\n"
                  "gpu_severity = GT003=warning\ngpu_rule_param = GT901.min_cpus=64\n"
                  "gpu_fail_on = warning\n"),
])
def test_replay_reads_the_project_settings_as_pytest_does(
        tmp_path: Path, ini_name: str, ini_text: str) -> None:
    """From a folder inside the project, as `pytest --gpu-diagnose` run there would."""
    tests = project(tmp_path / "project", ini_name, ini_text)
    result = replay_in(tests, FACTS / "h200x2_hidden_recorded.json")
    assert result.returncode == 1, result.stderr  # GT003, now a warning, reaches gpu_fail_on
    findings = json.loads(result.stdout)["findings"]
    assert [(f["code"], f["severity"]) for f in findings] == [("GT003", "warning"),
                                                                ("GT901", "warning")]
    assert findings[1]["message"].startswith("only ")
    # The command line still wins, as in pytest.
    overridden = replay_in(tests, FACTS / "h200x2_hidden_recorded.json", "--fail-on", "never",
                           "--ignore", "GT0")
    assert overridden.returncode == 0, overridden.stderr
    assert [f["code"] for f in json.loads(overridden.stdout)["findings"]] == ["GT901", "GT902"]


def test_rules_and_explain_read_the_project_settings_and_take_rootdir_and_c(
        tmp_path: Path) -> None:
    tests = project(tmp_path / "project", "pytest.ini",
                    "[pytest]\ngpu_rules_dir = ci-rules\ngpu_ignore = GT0\n")

    def run(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest_gputrain", *args],
                              capture_output=True, text=True, check=False, cwd=directory)

    listed = run(tests, "rules")
    assert listed.returncode == 0, listed.stderr
    codes = [line.split()[0] for line in listed.stdout.splitlines()[2:]]
    assert "GT901" in codes and not any(code.startswith("GT0") for code in codes)
    assert "min_cpus = 4" in run(tests, "explain", "GT901").stdout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert "GT901" not in run(elsewhere, "rules").stdout  # no project here
    assert "GT901" in run(elsewhere, "rules", "--rootdir", str(tmp_path / "project"),
                          "-c", str(tmp_path / "project" / "pytest.ini")).stdout
    broken = run(elsewhere, "rules", "-c", str(tmp_path / "missing.ini"))
    assert broken.returncode == 2
    assert "pytest could not read the project's configuration" in broken.stderr


@pytest.mark.parametrize(("where", "value", "message"), [
    ("environment.devices.0.memory_total", True, "Input should be a valid integer"),
    ("environment.devices.0.memory_total", -1, "greater than or equal to 0"),
    ("environment.devices.0.memory_total", "80000000000", "Input should be a valid integer"),
    ("environment.devices.0.temperature", True, "Input should be a valid number"),
    ("environment.host.shm_total", -4096, "greater than or equal to 0"),
    ("environment.host.cpu_count_logical", False, "Input should be a valid integer"),
    ("runs.0.memory.peak_allocated", -5, "greater than or equal to 0"),
    ("runs.0.step_time", "0.02", "Input should be a valid number"),
])
def test_booleans_strings_and_negative_sizes_are_refused(
        tmp_path: Path, where: str, value: object, message: str) -> None:
    data = json.loads((FACTS / "run_healthy_h200.json").read_text())
    *parents, last = where.split(".")
    target: object = data
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]  # type: ignore[index]
    assert isinstance(target, dict) and last in target
    target[last] = value
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    result = replay(path)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_run_may_shrink_its_memory(tmp_path: Path) -> None:
    """A growth is a difference: negative is a fact, not an error."""
    data = json.loads((FACTS / "run_healthy_h200.json").read_text())
    data["runs"][0]["memory"]["growth_total"] = -2048
    data["runs"][0]["memory"]["growth_per_step"] = -12.5
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    assert replay(path).returncode == 0


def test_terminal_control_characters_are_written_out(tmp_path: Path) -> None:
    data = json.loads((FACTS / "h200x2_hidden_recorded.json").read_text())
    data["environment"]["devices"][0]["name"] = "NVIDIA H200\x1b[2J\x1b]0;pwned\x07\x9b"
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    for fmt in ("text", "md"):
        result = replay(path, "--format", fmt)
        assert result.returncode == 1, result.stderr
        assert "NVIDIA H200\\x1b[2J\\x1b]0;pwned\\x07\\x9b" in result.stdout
        assert not any(char in result.stdout for char in "\x1b\x07\x9b")


def test_judging_a_recording_is_linear_in_its_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each failure finds its run through an index, and the session's names are built once:
    a look-up per failure over every run made 20,000 failures quadratic."""
    from pytest_gputrain import facts as facts_module
    from pytest_gputrain import scopes
    from pytest_gputrain.cli import load_facts
    from pytest_gputrain.engine.evaluate import RuleEngine
    from pytest_gputrain.probe import facts as probe_facts

    data = json.loads((FACTS / "run_failure_h200.json").read_text())
    count = 300
    for key in ("runs", "failures"):
        data[key] = [{**data[key][0], "nodeid": f"t.py::t[{i}]"} for i in range(count)]
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"gputrain-linear-{os.getpid()}.json"
    path.write_text(json.dumps(data))
    try:
        recording = load_facts(path)
    finally:
        path.unlink()
    engine = RuleEngine.load()  # loading checks the rules' names on empty records: not counted
    looked_at: list[object] = []
    built: list[object] = []
    runs_found: list[str] = []
    real_getitem = scopes.Records.__getitem__
    real_build = facts_module._build_session_namespace
    real_failure_namespace = probe_facts.failure_namespace

    def failure_namespace(env: Any, failure: Any, run: Any = None) -> Any:
        assert run is not None and run.nodeid == failure.nodeid
        runs_found.append(run.nodeid)
        return real_failure_namespace(env, failure, run)

    monkeypatch.setattr(scopes.Records, "__getitem__",
                        lambda self, index: looked_at.append(index) or real_getitem(self, index))
    monkeypatch.setattr(facts_module, "_build_session_namespace",
                        lambda env: built.append(env) or real_build(env))
    monkeypatch.setattr(probe_facts, "failure_namespace", failure_namespace)
    engine.evaluate_records(recording)
    assert sorted(runs_found) == sorted(f"t.py::t[{i}]" for i in range(count))
    assert len(looked_at) <= 4 * count  # each record once, and each failure's run once
    assert len(built) == 1


@pytest.mark.parametrize("command", ["", "replay", "rules", "explain", "facts", "schema",
                                     "compare", "history"])
def test_every_command_prints_its_help(command: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """argparse expands % in help texts: a default such as "step_time:5%" must not break it."""
    with pytest.raises(SystemExit) as exited:
        main([*filter(None, [command]), "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:")
    if command == "compare":
        assert "step_time:5%" in out


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    [commands] = [action for action in parser._actions
                  if isinstance(action, argparse._SubParsersAction)]
    return dict(commands.choices)


def test_every_command_says_what_it_does_and_every_argument_has_help() -> None:
    for name, command in _subcommands().items():
        assert command.description, f"{name}: no description for its --help"
        unexplained = [action.dest for action in command._actions
                       if not action.help and not isinstance(action, argparse._HelpAction)]
        assert not unexplained, f"{name}: arguments without help: {unexplained}"


def test_explain_takes_no_selection_and_documents_rules_the_project_leaves_out(
        tmp_path: Path) -> None:
    options = {name: {option for action in command._actions
                      for option in action.option_strings}
               for name, command in _subcommands().items()}
    assert {"--select", "--ignore"} <= options["rules"] & options["replay"]
    assert not {"--select", "--ignore"} & options["explain"]
    tests = project(tmp_path, "pytest.ini",
                    "[pytest]\ngpu_rules_dir = ci-rules\ngpu_ignore = GT0\n")
    explained = subprocess.run([sys.executable, "-m", "pytest_gputrain", "explain", "GT007"],
                               capture_output=True, text=True, check=False, cwd=tests)
    assert explained.returncode == 0, explained.stderr
    assert explained.stdout.startswith("GT007 other-processes-hold-vram")


def test_usage_names_the_command_as_it_was_started() -> None:
    module = subprocess.run([sys.executable, "-m", "pytest_gputrain", "explain", "--help"],
                            capture_output=True, text=True, check=False)
    assert module.returncode == 0, module.stderr
    assert module.stdout.startswith("usage: python -m pytest_gputrain explain ")
    # The console script runs main() with sys.argv[0] set to its own path.
    as_script = ("import sys; sys.argv[0] = '/opt/venv/bin/pytest-gputrain'; "
                 "from pytest_gputrain.cli import main; sys.exit(main(['explain', '--help']))")
    script = subprocess.run([sys.executable, "-c", as_script],
                            capture_output=True, text=True, check=False)
    assert script.returncode == 0, script.stderr
    assert script.stdout.startswith("usage: pytest-gputrain explain ")
    installed = shutil.which("pytest-gputrain", path=str(Path(sys.executable).parent))
    if installed is not None:
        console = subprocess.run([installed, "rules", "--help"],
                                 capture_output=True, text=True, check=False)
        assert console.stdout.startswith("usage: pytest-gputrain rules "), console.stderr


def test_explain_keeps_every_example_line_as_written(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A docs section's code (its indented lines) prints as the rule file has it, indentation
    included, where it fits the terminal; its prose is re-flowed to the width, every word kept
    (a long code line's trailing comment moves above it, its words kept too)."""
    monkeypatch.setenv("COLUMNS", "80")
    for rule_file in sorted(RULES.glob("GT*.toml")):
        docs = tomllib.loads(rule_file.read_text(encoding="utf-8")).get("docs", {})
        assert main(["explain", rule_file.name[:5]]) == 0
        out = capsys.readouterr().out
        for key, heading in (("example", "Example"), ("use_instead", "Use instead")):
            if key not in docs:
                continue
            source = [line.rstrip() for line in docs[key].strip("\n").splitlines()]
            section = out.split(f"## {heading}\n", 1)[1].split("\n\n## ", 1)[0]
            shown = section.splitlines()
            for line in source:
                if line[:1].isspace() and len(line) <= 80:
                    assert line in shown, f"{rule_file.name} {key}: {line!r}"
            assert sorted(section.split()) == sorted(" ".join(source).split()), \
                f"{rule_file.name} {key}"
