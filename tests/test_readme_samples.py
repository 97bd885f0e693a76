"""The README's sample outputs are the tool's own: each printed by ``docs/sample_outputs.py``,
captioned with its date, commit and machine, and still of the form the tool prints today."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from terminal_width import too_wide

from pytest_gputrain import cli

ROOT = Path(__file__).resolve().parents[1]
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
COMMIT = re.compile(r"\bcommit [0-9a-f]{7,40}\b")
NVML_MISSING = "NVML Shared Library Not Found"


def samples_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sample_outputs", ROOT / "docs" /
                                                  "sample_outputs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sample_outputs", module)
    spec.loader.exec_module(module)
    return module


SCRIPT = samples_script()
README = (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(SCRIPT.SAMPLES))
def test_each_sample_is_in_the_readme_with_its_date_commit_and_machine(name: str) -> None:
    sample = SCRIPT.readme_sample(name, README)
    assert sample is not None, f"README.md has no sample {name!r} between its markers"
    caption, lines = sample
    caption = " ".join(caption.split())
    assert DATE.search(caption) and COMMIT.search(caption), caption
    assert "H200" in caption or re.search(r"\d+-core machine", caption), caption
    assert "sample_outputs.py" in caption or "replay" in caption
    assert lines and not too_wide("\n".join(lines)), too_wide("\n".join(lines))


def test_the_replayed_sample_is_what_replay_prints_today(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(ROOT)
    cli.main(["replay", SCRIPT.HIDDEN_FACTS])
    printed = capsys.readouterr().out.rstrip("\n").splitlines()
    sample = SCRIPT.readme_sample("hidden-gpus", README)
    assert sample is not None
    assert sample[1] == printed


def test_the_form_of_a_sample_ignores_figures_and_lines_beyond_the_readme() -> None:
    readme = ["gputrain: 6 GPU tests: 0 ran, 6 skipped, 0 failed",
              "== 29 passed, 6 skipped in 104.20s (0:01:44) =="]
    printed = ["gputrain: 6 GPU tests: 0 ran, 6 skipped, 0 failed", "WARNING GT118 busy host",
               "== 29 passed, 6 skipped in 99.01s (0:01:39) =="]
    assert SCRIPT.same_form(readme, printed)
    assert not SCRIPT.same_form(readme, ["gputrain: 6 GPU tests: 0 ran, 6 skipped",
                                         printed[-1]])  # a changed layout


def test_the_runs_table_keeps_its_first_and_last_test() -> None:
    lines = ["gputrain: 3 training run(s) probed", "test", "  device  steps",
             "  ------  -----", "a/test_x.py", "::test_a", "  cpu  2", "a/test_x.py::test_b",
             "  cpu  3", "a/test_x.py::test_c", "  cpu  4", "==== 3 passed ===="]
    assert SCRIPT._runs_trimmed(lines) == [
        *lines[:4], "a/test_x.py", "::test_a", "  cpu  2", "…", "a/test_x.py::test_c",
        "  cpu  4", "==== 3 passed ===="]


@pytest.mark.slow
def test_the_main_job_fits_80_columns_says_a_cause_once_and_keeps_the_readme_form() -> None:
    """The README's main job, run as a newcomer runs it (a minute or two of CPU training)."""
    _, output = SCRIPT.run_main_job()
    lines = SCRIPT.main_job_excerpt(output)
    assert not too_wide(output), too_wide(output)
    if "no NVIDIA GPU visible" in output:
        assert output.count(NVML_MISSING) <= 1, output
    sample = SCRIPT.readme_sample("main-job", README)
    assert sample is not None
    assert SCRIPT.same_form(sample[1], lines), (
        "README.md's main-job sample is no longer what the tool prints: run "
        "`python docs/sample_outputs.py --only main-job`\n" + output)
