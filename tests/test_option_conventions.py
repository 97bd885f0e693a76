"""What every option shares: an ini name that is its flag's, an off flag for each switch, numbers
typed as numbers in the ini file; and the old ini names that broke the naming rule, still read
with a deprecation warning."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pytest_gputrain import options
from pytest_gputrain.assertions.options import OPTIONS as ASSERTION_OPTIONS
from pytest_gputrain.cli import main as cli_main
from pytest_gputrain.plugin import read_rule_config
from pytest_gputrain.probe.options import OPTIONS as PROBE_OPTIONS
from pytest_gputrain.regression import settings as regression_settings
from pytest_gputrain.regression.options import OPTIONS as REGRESSION_OPTIONS

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

EVERY_OPTION = options.OPTIONS + PROBE_OPTIONS + ASSERTION_OPTIONS + REGRESSION_OPTIONS
SWITCHES = [option for option in EVERY_OPTION if option.kind == "bool"]
NUMBERS = [option for option in EVERY_OPTION if option.kind in ("int", "float")]
TYPED_INI = pytest.mark.skipif(pytest.version_tuple[:2] < (9, 2),
                               reason="ini types of numbers need pytest 9.2")


# -- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize("option", EVERY_OPTION, ids=lambda option: option.flag)
def test_an_ini_name_is_its_flag_without_dashes(option: options.Option) -> None:
    assert option.ini == option.flag.removeprefix("--").replace("-", "_")


def test_the_renamed_settings_are_the_ones_the_issue_names() -> None:
    assert options.RENAMED_INI == {"gpu_rule_params": "gpu_rule_param",
                                   "gpu_rules_dirs": "gpu_rules_dir"}
    assert set(options.RENAMED_INI.values()) <= {option.ini for option in options.OPTIONS}


def test_an_old_ini_name_still_works_with_a_warning_naming_the_new_one(
    pytester: pytest.Pytester
) -> None:
    pytester.makeini("[pytest]\ngpu_rule_params = GT016.min_shm=2GiB\n"
                     "gpu_rules_dirs = my-rules\n")
    (pytester.path / "my-rules").mkdir()
    config = pytester.parseconfigure()
    rules = read_rule_config(config)
    assert rules is not None
    assert rules.params == {"GT016": {"min_shm": "2GiB"}}
    assert rules.extra_dirs == [pytester.path / "my-rules"]
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*PytestDeprecationWarning: gputrain: the ini setting gpu_rule_params is now "
        "gpu_rule_param (named as its flag, --gpu-rule-param); rename it: the old name will "
        "stop working",
        "*PytestDeprecationWarning: gputrain: the ini setting gpu_rules_dirs is now "
        "gpu_rules_dir (named as its flag, --gpu-rules-dir)*"])


def test_an_old_name_is_checked_as_the_new_one(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngpu_rule_params = GT016.min_shm\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*gpu_rule_params in tox.ini: 'GT016.min_shm' must be "
                                 "CODE.PARAM=VALUE*"])


def test_both_names_of_one_setting_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngpu_rule_params = GT016.min_shm=2GiB\n"
                     "gpu_rule_param = GT016.min_shm=1GiB\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*gpu_rule_params is the old name of gpu_rule_param, and both "
                                 "are set: keep gpu_rule_param only"])


def test_the_command_line_tool_reads_an_old_name_and_says_so(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    pytester.makeini("[pytest]\ngpu_rule_params = GT016.min_shm=3GiB\n")
    monkeypatch.chdir(pytester.path)
    assert cli_main(["explain", "GT016"]) == 0
    out, err = capsys.readouterr()
    assert "min_shm = 3221225472" in out  # 3 GiB
    assert ("warning: gputrain: the ini setting gpu_rule_params is now gpu_rule_param"
            in err)


# -- switches --------------------------------------------------------------------------------


def test_every_switch_has_an_off_flag(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    for option in SWITCHES:
        result.stdout.fnmatch_lines([f"  {option.off_flag}*"])
        assert f"turn {option.flag} off, whatever the ini file's {option.ini} says" in \
            " ".join(result.stdout.str().split())


@pytest.mark.parametrize("option", [option for option in SWITCHES if option.ini != "gpu_diagnose"],
                         ids=lambda option: option.off_flag)
def test_an_off_flag_turns_off_what_the_ini_file_turns_on(pytester: pytest.Pytester,
                                                          option: options.Option) -> None:
    pytester.makeini(f"[pytest]\n{option.ini} = true\n")
    assert options.read(pytester.parseconfigure(), option.ini) is True
    assert options.read(pytester.parseconfigure(option.off_flag), option.ini) is False


def test_no_gpu_diagnose_turns_off_a_diagnosis_the_ini_file_turns_on(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile("def test_ok(): pass")
    pytester.makeini("[pytest]\ngpu_diagnose = true\ngpu_report = report.json\n")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*= gputrain diagnosis =*"])
    (pytester.path / "report.json").unlink()
    result = pytester.runpytest("--no-gpu-diagnose")
    result.assert_outcomes(passed=1)
    assert "gputrain diagnosis" not in result.stdout.str()
    assert not (pytester.path / "report.json").exists()


def test_no_gpu_diagnose_and_an_option_that_asks_for_it_is_a_usage_error(
    pytester: pytest.Pytester
) -> None:
    result = pytester.runpytest("--no-gpu-diagnose", "--gpu-report=report.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--no-gpu-diagnose turns the diagnosis off, and --gpu-report "
                                 "asks for it: give one or the other"])


# -- numbers ---------------------------------------------------------------------------------


def test_the_numeric_settings_are_typed() -> None:
    assert {option.ini for option in NUMBERS} == {
        "gpu_vram_history", "gpu_per_worker", "gpu_alpha", "gpu_benchmark_warmup",
        "gpu_benchmark_min_rounds", "gpu_benchmark_max_rounds", "gpu_benchmark_max_time",
        "gpu_lookback"}


NUMBERS_TOML = """
gpu_vram_history = 100
gpu_alpha = 0.05
gpu_benchmark_warmup = 2
gpu_benchmark_min_rounds = 3
gpu_benchmark_max_rounds = 4
gpu_benchmark_max_time = 1
"""


@TYPED_INI
@pytest.mark.parametrize("table", ["tool.pytest", "tool.pytest.ini_options"])
def test_numbers_in_pyproject_are_taken_as_numbers(pytester: pytest.Pytester,
                                                   table: str) -> None:
    # pytest refuses a number for a string setting in [tool.pytest], and deprecates it in
    # [tool.pytest.ini_options]: "-W error" turns that into a failure.
    pytester.makepyprojecttoml(f"[{table}]\n{NUMBERS_TOML}")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("-W", "error")
    result.assert_outcomes(passed=1)
    config = pytester.parseconfigure()
    settings = regression_settings.read_settings(config)
    assert (settings.alpha, settings.warmup, settings.min_rounds, settings.max_rounds,
            settings.max_time) == (0.05, 2, 3, 4, 1.0)
    assert options.read(config, "gpu_vram_history") == 100


@TYPED_INI
@pytest.mark.parametrize("setting, value, message", [
    ("gpu_benchmark_warmup", "-1", "gpu_benchmark_warmup in pyproject.toml: -1 must lie "
     "between 0 and 10000; e.g. 5"),
    ("gpu_benchmark_warmup", "2.5", "*config option 'gpu_benchmark_warmup' expects one of "
     "int | string, got float: 2.5"),
    ("gpu_benchmark_warmup", "true", "*config option 'gpu_benchmark_warmup' expects one of "
     "int | string, got bool: True"),
    ("gpu_benchmark_max_time", "0", "gpu_benchmark_max_time in pyproject.toml: 0 must "
     "lie between 1e-06 and 3600; e.g. 5"),
    ("gpu_alpha", "0.7", "gpu_alpha in pyproject.toml: 0.7 must lie strictly between 0 and 0.5; "
     "e.g. 0.01"),
    ("gpu_vram_history", "-3", "gpu_vram_history in pyproject.toml: '-3' is not a whole number "
     "of entries from 0 to 999999999*"),
    ("gpu_per_worker", "0", "gpu_per_worker in pyproject.toml: 0 is not a whole number >= 1*"),
])
def test_a_bad_number_in_pyproject_names_the_setting_and_the_value(
    pytester: pytest.Pytester, setting: str, value: str, message: str
) -> None:
    pytester.makepyprojecttoml(f"[tool.pytest]\n{setting} = {value}\n")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


@pytest.mark.parametrize("setting, message", [
    ("gpu_benchmark_min_rounds", "gpu_benchmark_min_rounds in tox.ini: 'lots' "
     "is not a number; e.g. 30"),
    ("gpu_vram_history", "gpu_vram_history in tox.ini: 'lots' is not a whole number "
     "of entries*"),
    ("gpu_alpha", "gpu_alpha in tox.ini: 'lots' is not a number*"),
])
def test_a_word_where_a_number_belongs_names_the_setting_and_the_value(
    pytester: pytest.Pytester, setting: str, message: str
) -> None:
    pytester.makeini(f"[pytest]\n{setting} = lots\n")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
