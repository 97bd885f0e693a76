"""An option's error names the option as the user gave it (the pytest flag, the ini name in its
file, ``-o``, or the command-line tool's own flag) in one clause, not every name it has."""

from __future__ import annotations

import pytest

from pytest_gputrain import cli

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

CASES = [  # (ini name, a bad value, what the error says about it)
    ("gpu_fail_on", "sometimes", "'sometimes' is not a severity that fails the session*"),
    ("gpu_regression", "step_time:banana",
     "'banana' in 'step_time:banana' is not a percentage from 0 to 100; e.g. "
     "\"auto,step_time:2%\" or *"),
    ("gpu_select", "G!", "'G!' is not a rule code or code prefix*"),
    ("gpu_per_worker", "0", "*0* is not a whole number >= 1*"),
]


@pytest.mark.parametrize("how", ["flag", "ini", "pyproject", "-o"])
@pytest.mark.parametrize(("ini", "value", "problem"), CASES, ids=[case[0] for case in CASES])
def test_the_error_names_the_option_as_it_was_given(
        pytester: pytest.Pytester, how: str, ini: str, value: str, problem: str) -> None:
    pytester.makepyfile("def test_ok(): pass")
    flag = "--" + ini.replace("_", "-")
    args = ["-p", "no:cacheprovider"]
    if how == "flag":
        pytester.makeini("[pytest]\n")
        args.append(f"{flag}={value}")
        named = flag
    elif how == "ini":
        pytester.makeini(f"[pytest]\n{ini} = {value}\n")
        named = f"{ini} in tox.ini"
    elif how == "pyproject":
        pytester.makepyprojecttoml(f'[tool.pytest.ini_options]\n{ini} = "{value}"\n')
        named = f"{ini} in pyproject.toml"
    else:
        pytester.makeini("[pytest]\n")
        args += ["-o", f"{ini}={value}"]
        named = f"-o {ini}"
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: *{named}: {problem}"])
    error = result.stderr.str()
    others = {flag, ini} - {named.split()[-1] if how == "-o" else named.split()[0]}
    assert not any(f"{other}:" in error or f"{other} /" in error for other in others), error


def test_compare_names_its_own_option_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compare", "a", "b", "--regression", "step_time:banana"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == ("pytest_gputrain: error: --regression: 'banana' in 'step_time:banana' is "
                     "not a percentage from 0 to 100; e.g. \"auto,step_time:2%\" or "
                     "\"step_time:5%,kernels:0,syncs:0,host_cpu:2%\" (a metric may be \"off\")")
    assert "--gpu-regression" not in error


def test_the_rules_command_names_its_own_flag_or_the_ini_file(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    pytester.makeini("[pytest]\ngpu_select = G!\n")
    monkeypatch.chdir(pytester.path)
    assert cli.main(["rules"]) == 2
    assert "error: gpu_select in tox.ini: 'G!' is not a rule code" in capsys.readouterr().err
    assert cli.main(["rules", "--select", "X!"]) == 2
    assert "error: --select: 'X!' is not a rule code" in capsys.readouterr().err
