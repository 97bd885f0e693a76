"""Options of the diagnosis: which turn it on, and bad values are errors in every mode."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

RULE = ('code = "{code}"\nname = "probe-rule"\ntitle = "t"\nscope = "session"\n'
        'severity = "warning"\ncondition = "{condition}"\nmessage = "m"\nfix = "f"\nwhy = "w"\n')


@pytest.mark.parametrize("args", [
    ["--gpu-report=report.json"],
    ["--gpu-facts-out=facts.json"],
    ["--gpu-fail-on=warning"],
    ["--gpu-select=GT001"],
    ["--gpu-probe=off"],
])
def test_a_diagnosis_option_on_the_command_line_turns_the_diagnosis_on(
    pytester: pytest.Pytester, use_facts: Callable[..., Any], args: list[str]
) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest(*args)
    result.stdout.fnmatch_lines(["gputrain: no NVIDIA GPU visible*", "*= gputrain diagnosis =*",
                                 "*WARNING*GT001*"])
    for name in ("report.json", "facts.json"):
        if any(name in arg for arg in args):
            assert json.loads((pytester.path / name).read_text())
    # GT001 is a warning: only --gpu-fail-on=warning makes it fail the run.
    assert result.ret == (1 if "--gpu-fail-on=warning" in args else 0)


def test_outputs_in_the_ini_file_turn_it_on_settings_alone_do_not(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile("def test_ok(): pass")
    pytester.makeini("[pytest]\ngpu_report = gpu-report.md\n")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*= gputrain diagnosis =*"])
    assert (pytester.path / "gpu-report.md").read_text().startswith("## GPU diagnosis")
    pytester.makeini("[pytest]\ngpu_fail_on = never\ngpu_ignore = GT014\ngpu_probe = off\n")
    result = pytester.runpytest()
    assert result.ret == 0
    assert "gputrain diagnosis" not in result.stdout.str()


@pytest.mark.parametrize(("ini", "message"), [
    ("gpu_fail_on = sometimes",
     "*gpu_fail_on*'sometimes' is not a severity that fails the session; expected one of error, "
     "warning*"),
    ("gpu_select = G!", "*gpu_select in tox.ini: 'G!' is not a rule code or code prefix*"),
    ("gpu_ignore = XY0", "*gpu_ignore in tox.ini: 'XY0' is not a rule code or code prefix*"),
    ("gpu_severity = GT016=fatal", "*gpu_severity*'GT016=fatal' must be CODE=LEVEL*"),
    ("gpu_rule_param = GT016.min_shm",
     "*gpu_rule_param in tox.ini: 'GT016.min_shm' must be CODE.PARAM*"),
    ("gpu_probe = maybe", "*gpu_probe in tox.ini: 'maybe' must be on or off*"),
    ("gpu_profile_steps = 1-3", "*gpu_profile_steps*'1-3': the window must start at step 2*"),
])
def test_a_bad_ini_value_is_an_error_without_the_diagnosis(
    pytester: pytest.Pytester, ini: str, message: str
) -> None:
    pytester.makepyfile("def test_ok(): pass")
    pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu-select=GT999"], "*--gpu-select: the code GT999 matches no rule (the rules are GT001 "
                             "to GT*: `python -m pytest_gputrain rules` lists them)*"),
    (["--gpu-ignore=GT999"], "*--gpu-ignore: the code GT999 matches no rule*"),
    (["--gpu-select=GT4"], "*--gpu-select: the code prefix GT4 matches no rule*"),
    (["--gpu-select=GT0", "--gpu-ignore=GT0"],
     "*gpu_select / gpu_ignore: the two leave no rule to run (select GT0, ignore GT0)*"),
    (["--gpu-probe=maybe"], "*: --gpu-probe: 'maybe' must be on or off*"),
    (["--gpu-profile-steps=x"], "*--gpu-profile-steps*'x' is not a step range*"),
    (["--gpu-report=~no-such-user-here/r.md"],
     "*: --gpu-report: '~no-such-user-here/r.md': cannot expand '~'*"),
    (["--gpu-facts-out=~no-such-user-here/f.json"],
     "*: --gpu-facts-out: '~no-such-user-here/f.json': cannot expand '~'*"),
    (["--gpu-store=~no-such-user-here/s.db", "--gpu-save=main"],
     "*: --gpu-store: '~no-such-user-here/s.db': cannot expand '~'*"),
])
def test_rule_codes_that_select_nothing_and_bad_values_are_usage_errors(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_project_rule_code_must_start_with_gt(pytester: pytest.Pytester) -> None:
    rules = pytester.mkdir("gpu-rules")
    (rules / "AB901-probe-rule.toml").write_text(
        RULE.format(code="AB901", condition="host.cpu_count_logical > 0"))
    result = pytester.runpytest("--gpu-rules-dir=gpu-rules")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*AB901-probe-rule.toml: field 'code' must be GT and three "
                                 "digits (GT001; a project's own rules use GT900 to GT999)*"])


@pytest.mark.parametrize("condition", ["host.cpu_count_logical * 2", "len(devices.names)",
                                       "'yes'", "max(host.cpu_count_logical, 4) - 1"])
def test_a_condition_that_cannot_give_true_or_false_is_a_usage_error(
    pytester: pytest.Pytester, condition: str
) -> None:
    rules = pytester.mkdir("gpu-rules")
    (rules / "GT901-probe-rule.toml").write_text(RULE.format(code="GT901", condition=condition))
    result = pytester.runpytest("--gpu-rules-dir=gpu-rules")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*GT901-probe-rule.toml: field 'condition': * gives a value, "
                                 "not true or false, so it would never hold; compare it*"])


def test_a_fact_that_is_not_boolean_makes_the_rule_a_broken_rule(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("cpu_laptop")
    rules = pytester.mkdir("gpu-rules")
    (rules / "GT901-probe-rule.toml").write_text(
        RULE.format(code="GT901", condition="host.cpu_count_logical"))
    result = pytester.runpytest("--gpu-rules-dir=gpu-rules", "--gpu-select=GT901")
    result.stdout.fnmatch_lines([
        "WARNING GT901 probe-rule: rule GT901 could not be evaluated",
        "    where: session",
        "*GT901-probe-rule.toml: the condition gave 2 (int), not true or false*"])
    assert "looks healthy" not in result.stdout.str()
