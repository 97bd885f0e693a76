"""Option values that used to pass silently: an empty value on the command line, and integers
past any sensible size (a 400-digit warm-up)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gputrain import options
from pytest_gputrain.assertions.options import OPTIONS as ASSERTION_OPTIONS
from pytest_gputrain.cli import main as cli_main
from pytest_gputrain.probe.options import OPTIONS as PROBE_OPTIONS
from pytest_gputrain.regression.benchmark import BenchmarkOptions
from pytest_gputrain.regression.options import MAX_ROUNDS, MAX_TIME_S, MAX_WARMUP
from pytest_gputrain.regression.options import OPTIONS as REGRESSION_OPTIONS
from pytest_gputrain.regression.store_sqlite import SqliteStore

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

VALUED = [option.flag for option in (options.OPTIONS + PROBE_OPTIONS + ASSERTION_OPTIONS
                                     + REGRESSION_OPTIONS) if option.kind != "bool"]


def test_every_option_with_a_value_is_checked() -> None:
    # The ones the issue names, so that a table moving elsewhere does not empty this test.
    assert {"--gpu-fail-on", "--gpu-rule-param", "--gpu-rules-dir", "--gpu-facts-out",
            "--gpu-max-vram", "--gpu-save", "--gpu-regression"} <= set(VALUED)


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize("flag", VALUED)
def test_an_empty_value_on_the_command_line_is_a_usage_error_naming_the_option(
    pytester: pytest.Pytester, flag: str, value: str
) -> None:
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest(f"{flag}={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*error: argument {flag}: an empty value is not a setting: "
                                 "give a value, or leave the option out for its default"])


@pytest.mark.parametrize("ini", ["gpu_fail_on", "gpu_save", "gpu_regression"])
def test_an_empty_value_in_the_ini_file_is_a_usage_error(pytester: pytest.Pytester,
                                                         ini: str) -> None:
    # pytest gives "" for a key left empty and the default (never "") for one absent: an
    # empty one is a typo, as on the command line (issue 29).
    pytester.makeini(f"[pytest]\n{ini} =\n")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {ini} is set to an empty value in the ini file*"])


def test_an_empty_list_in_the_ini_file_is_an_empty_list(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngpu_rule_param =\ngpu_select =\n")
    pytester.makepyfile("def test_ok(): pass")
    assert pytester.runpytest().ret == 0


@pytest.mark.parametrize("option", ["--select=", "--rule-param=", "--rules-dir= "])
def test_an_empty_rule_option_of_the_command_line_tool_is_an_error(
    option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["rules", option])
    assert exit_.value.code == 2
    assert "an empty value is not a setting" in capsys.readouterr().err


HUGE = "9" * 400


@pytest.mark.parametrize("flag, value, bounds", [
    ("--gpu-benchmark-warmup", HUGE, f"0 and {MAX_WARMUP}"),
    ("--gpu-benchmark-warmup", "9" * 5000, f"0 and {MAX_WARMUP}"),
    ("--gpu-benchmark-warmup", str(MAX_WARMUP + 1), f"0 and {MAX_WARMUP}"),
    ("--gpu-benchmark-min-rounds", HUGE, f"1 and {MAX_ROUNDS}"),
    ("--gpu-benchmark-max-rounds", str(MAX_ROUNDS + 1), f"1 and {MAX_ROUNDS}"),
    ("--gpu-benchmark-max-time", "1e9", f"1e-06 and {MAX_TIME_S:g}"),
])
def test_numbers_past_the_documented_maximum_are_usage_errors(
    pytester: pytest.Pytester, flag: str, value: str, bounds: str
) -> None:
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest(f"{flag}={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {flag}: * must lie between {bounds}; e.g. *"])


def test_the_largest_values_are_accepted(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest(f"--gpu-benchmark-warmup={MAX_WARMUP}",
                                f"--gpu-benchmark-max-rounds={MAX_ROUNDS}",
                                f"--gpu-benchmark-max-time={MAX_TIME_S:g}")
    assert result.ret == 0


@pytest.mark.parametrize("field", ["warmup", "min_rounds", "max_rounds"])
def test_the_fixture_arguments_have_the_same_maxima(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field}=an integer of about 40[01] digits"):
        BenchmarkOptions().override(**{field: int(HUGE)})


def test_a_huge_history_limit_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "benchmarks.sqlite"
    SqliteStore.open(store).close()
    assert cli_main(["history", "--store", str(store), "--limit", "9" * 30]) == 2
    err = capsys.readouterr().err
    assert "--limit 9999" in err and "must lie between 1 and 1000000" in err
