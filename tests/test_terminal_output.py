"""What --gpu-diagnose prints, through pytester: it fits an 80-column terminal, says each
finding once, and reports the user's environment as the session found it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

HIDDEN = {"env.cuda_visible_devices": "", "env.variables": {"CUDA_VISIBLE_DEVICES": ""},
          "torch.cuda_available": False, "torch.device_count": 0}
TESTS = """
    import pytest
    import torch


    @pytest.mark.parametrize("config", ["resnet18-bf16-batch64"])
    def test_a_training_step_whose_name_is_longer_than_any_column_of_a_table(config):
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()


    def test_moves_its_model_to_a_gpu_that_cannot_be_used():
        raise RuntimeError("No CUDA GPUs are available")
"""
FAILING = "test_moves_its_model_to_a_gpu_that_cannot_be_used"
GT216_SEEN = "The test needed CUDA and this process could not use it"
GT003_SEEN = 'CUDA_VISIBLE_DEVICES="" hides every GPU'


def _plugin_lines(lines: list[str]) -> list[str]:
    """What the plugin printed: its header, the diagnosis section of a failed test's report,
    and the summary from its "gputrain diagnosis" line to pytest's short summary."""
    mine: list[str] = []
    where = None
    for line in lines:
        if line.startswith("gputrain: ") and where is None:
            where = "header"
        elif where == "header" and not line.startswith(" "):
            where = None
        if line.startswith("-") and "gputrain diagnosis" in line:
            where = "section"
        elif where == "section" and line.startswith(("=", "_")):
            where = None
        if line.startswith("=") and "gputrain diagnosis" in line:
            where = "summary"
        elif where == "summary" and "short test summary info" in line:
            where = None
        if where is not None:
            mine.append(line)
    return mine


@pytest.fixture
def diagnosed(pytester: pytest.Pytester, use_facts: Callable[..., Any],
              monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("COLUMNS", "80")
    use_facts("h200_healthy", HIDDEN)
    pytester.makepyfile(test_training=TESTS)
    return pytester


def test_everything_the_plugin_prints_fits_80_columns(diagnosed: pytest.Pytester) -> None:
    result = diagnosed.runpytest("--gpu-diagnose", "--gpu-fail-on=never", "-p",
                                 "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    mine = _plugin_lines(result.outlines)
    assert any("GT216" in line for line in mine) and any("GT003" in line for line in mine)
    assert any(line.startswith("gputrain: 1 training run(s) probed") for line in mine)
    too_wide = [line for line in mine if len(line) > 80]
    assert not too_wide, "\n".join(too_wide)
    # the long test id is wrapped between its segments (and its parameters' ids), never
    # inside a word
    start = next(index for index, line in enumerate(mine) if line == "test_training.py")
    assert mine[start + 1:start + 3] == [
        "::test_a_training_step_whose_name_is_longer_than_any_column_of_a_table[resnet18-",
        "bf16-batch64]"]


def test_a_failure_diagnosis_is_printed_once_and_the_summary_points_to_it(
        diagnosed: pytest.Pytester) -> None:
    result = diagnosed.runpytest("--gpu-diagnose", "--gpu-fail-on=never", "-p",
                                 "no:cacheprovider")
    output = result.stdout.str()
    assert output.count(GT216_SEEN) == 1  # under the failure, not again in the summary
    assert output.count(GT003_SEEN) == 1  # a session finding: once, in the summary
    assert output.count("ERROR GT216 cuda-unavailable-at-use") == 2  # its headline, twice
    summary = output[output.index("= gputrain diagnosis ="):]
    flat = " ".join(summary.split())
    assert f"see the failure report of test_training.py::{FAILING} above" in flat
    assert GT216_SEEN not in summary
    assert summary.count("details: python -m pytest_gputrain explain CODE") == 1


def test_without_failure_reports_the_summary_says_it_all(diagnosed: pytest.Pytester) -> None:
    result = diagnosed.runpytest("--gpu-diagnose", "--gpu-fail-on=never", "--tb=no", "-p",
                                 "no:cacheprovider")
    output = result.stdout.str()
    assert output.count(GT216_SEEN) == 1  # pytest printed no report: the summary has it
    assert "see the failure report" not in output


def test_with_rp_a_passed_test_s_findings_are_pointed_to_as_well(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    use_facts("h200_healthy")
    pytester.makepyfile(test_eval="""
        import torch

        def test_evaluates_with_autograd_on():
            model = torch.nn.Linear(4, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                optimizer.zero_grad()
                model(torch.randn(8, 4)).sum().backward()
                optimizer.step()
            for _ in range(4):  # evaluation, without no_grad
                model(torch.randn(8, 4))
        """)
    plain = pytester.runpytest("--gpu-diagnose", "--gpu-fail-on=never", "-p",
                               "no:cacheprovider").stdout.str()
    assert plain.count("forward pass(es) ran with autograd enabled") == 1  # in the summary
    shown = pytester.runpytest("--gpu-diagnose", "--gpu-fail-on=never", "-rP", "-p",
                               "no:cacheprovider").stdout.str()
    assert shown.count("forward pass(es) ran with autograd enabled") == 1  # under PASSES
    assert "see the report of test_eval.py::test_evaluates_with_autograd_on above" in \
        " ".join(shown.split())


def test_the_markdown_report_has_the_runs_table_and_the_environment_as_it_began(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's profiler sets TORCHINDUCTOR_CACHE_DIR inside the probe's window: a variable set
    while the tests ran is not the user's (the real collector, read at the end: --no-header)."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # and removed again after
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    pytester.makepyfile(test_training=TESTS + """

    def test_sets_a_variable_of_the_gpu_stack():
        import os
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/torchinductor_cache"
""")
    result = pytester.runpytest("--gpu-diagnose", "--gpu-fail-on=never", "--no-header",
                                "--gpu-report=report.md", "--gpu-report=report.json",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    variables = json.loads((pytester.path / "report.json").read_text()
                           )["environment"]["env"]["variables"]
    assert variables.get("NCCL_DEBUG") == "WARN"
    assert "TORCHINDUCTOR_CACHE_DIR" not in variables
    markdown = (pytester.path / "report.md").read_text()
    assert "TORCHINDUCTOR_CACHE_DIR" not in markdown
    runs = markdown[markdown.index("### runs"):].splitlines()
    assert runs[2] == "1 training run(s) probed"
    assert runs[4].startswith("| test | device | steps | step |")
    assert runs[6].startswith("| test_training.py::test_a_training_step_whose_name_is_longer_"
                              "than_any_column_of_a_table[resnet18-bf16-batch64] | cpu | 4 |")
