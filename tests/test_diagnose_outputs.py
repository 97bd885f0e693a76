"""The diagnosis's output files: formats, the step summary, modes, failures and Ctrl-C."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")


@pytest.fixture
def diagnosed(pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> pytest.Pytester:
    use_facts("cpu_laptop")
    pytester.makepyfile("def test_ok(): pass")
    return pytester


def test_one_unwritable_report_leaves_the_other_outputs_and_the_summary(
    diagnosed: pytest.Pytester,
) -> None:
    # The file in the way appears while the tests run: at start-up the path was writable.
    diagnosed.makepyfile("from pathlib import Path\n\n\ndef test_ok():\n"
                         "    Path('afile').write_text('in the way')\n")
    result = diagnosed.runpytest("--gpu-report=afile/report.md", "--gpu-report=good.json",
                                 "--gpu-facts-out=facts.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "gputrain: could not write the report */afile/report.md: */afile is a file, not a folder",
        "gputrain: report written to */good.json",
        "gputrain: facts written to */facts.json",
        "*= 1 passed in *"])
    assert json.loads((diagnosed.path / "good.json").read_text())["schema_version"] == 1
    assert json.loads((diagnosed.path / "facts.json").read_text())["kind"] == (
        "pytest-gputrain-facts")
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux's /sys")
def test_a_report_in_a_folder_that_refuses_writes_is_refused_at_start_up(
    diagnosed: pytest.Pytester,
) -> None:
    # /sys refuses new folders even to root, where a chmod 555 folder would not: found before
    # the tests run, not after.
    result = diagnosed.runpytest("--gpu-report=/sys/gputrain-test/report.md",
                                 "--gpu-facts-out=facts.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpu-report: "
                                 "/sys/gputrain-test/report.md is under /sys*"])
    assert "passed" not in result.stdout.str()


def test_explicit_formats_and_the_step_summary_is_appended(
    diagnosed: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = diagnosed.path / "step_summary_abc123"  # GitHub's file has no suffix
    summary.write_text("## Tests\n\n42 passed\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = diagnosed.runpytest(f"--gpu-report=md:{summary}", "--gpu-report=json:report.data")
    assert result.ret == 0, result.stdout.str()
    text = summary.read_text()
    assert text.startswith("## Tests\n\n42 passed\n\n## GPU diagnosis (pytest-gputrain)\n")
    assert json.loads((diagnosed.path / "report.data").read_text())["schema_version"] == 1
    # A second run appends again, after the first.
    diagnosed.runpytest("--gpu-report=md:$GITHUB_STEP_SUMMARY".replace(
        "$GITHUB_STEP_SUMMARY", str(summary)))
    assert summary.read_text().count("## GPU diagnosis (pytest-gputrain)") == 2
    # Any other Markdown file is replaced.
    other = diagnosed.path / "other.md"
    other.write_text("old\n")
    diagnosed.runpytest(f"--gpu-report={other}")
    assert other.read_text().startswith("## GPU diagnosis")


def test_a_path_without_a_known_suffix_says_how_to_name_the_format(
    diagnosed: pytest.Pytester,
) -> None:
    result = diagnosed.runpytest("--gpu-report=step_summary_abc123")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*: --gpu-report: 'step_summary_abc123' must end in "
                                 ".json, .md or .html, or name its format: md:PATH, json:PATH "
                                 "or html:PATH*"])


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("umask_022")
def test_outputs_get_the_umask_mode_or_keep_the_mode_they_replace(
    diagnosed: pytest.Pytester,
) -> None:
    kept = diagnosed.path / "kept.json"
    kept.write_text("{}\n")
    kept.chmod(0o640)
    result = diagnosed.runpytest("--gpu-report=new.md", "--gpu-report=kept.json",
                                 "--gpu-facts-out=facts.json")
    assert result.ret == 0
    assert _mode(diagnosed.path / "new.md") == 0o644
    assert _mode(diagnosed.path / "facts.json") == 0o644
    assert _mode(kept) == 0o640
    assert json.loads(kept.read_text())["schema_version"] == 1
    # No temporary file is left beside the outputs.
    assert [p.name for p in diagnosed.path.iterdir() if p.name.startswith((".new", ".kept",
                                                                          ".facts"))] == []
    os.umask(0o077)
    (diagnosed.path / "new.md").unlink()
    diagnosed.runpytest("--gpu-report=new.md")
    assert _mode(diagnosed.path / "new.md") == 0o600


# -- Ctrl-C at the end of the session: in a subprocess, where the signal is real ---------------

INTERRUPT_CONFTEST = """
import os
import signal
import time

import {module}

def _interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as the terminal sends it
    time.sleep(5)  # the KeyboardInterrupt arrives here
    raise AssertionError("no interrupt")

{module}.{name} = _interrupted
"""


def test_ctrl_c_while_writing_a_report_writes_the_rest_and_exits_as_interrupted(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(INTERRUPT_CONFTEST.format(module="pytest_gputrain.report.markdown",
                                                    name="report_markdown"))
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest_subprocess("--gpu-fail-on=never", "--gpu-report=report.md",
                                           "--gpu-report=report.json",
                                           "--gpu-facts-out=facts.json")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([
        "*= gputrain diagnosis =*",
        "gputrain: could not write the report */report.md: not written: interrupted (Ctrl-C)",
        "gputrain: report written to */report.json",
        "gputrain: facts written to */facts.json",
        "gputrain: interrupted (Ctrl-C) while finishing the diagnosis*",
        "*1 passed*"])
    assert not (pytester.path / "report.md").exists()
    assert json.loads((pytester.path / "report.json").read_text())["schema_version"] == 1
    assert json.loads((pytester.path / "facts.json").read_text())["kind"] == (
        "pytest-gputrain-facts")
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert [p.name for p in pytester.path.iterdir() if p.name.startswith(".report")] == []


def test_ctrl_c_while_judging_still_writes_the_facts(pytester: pytest.Pytester) -> None:
    # The rules are judged once at the start (the environment, for the header) and again at the
    # end with the tests' records: Ctrl-C comes in that last judgement.
    pytester.makeconftest(INTERRUPT_CONFTEST.format(
        module="pytest_gputrain.diagnosis", name="DiagnosisSession.findings")
        .replace("= _interrupted", "= property(_interrupted)"))
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest_subprocess("--gpu-report=report.json",
                                           "--gpu-facts-out=facts.json")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([
        "gputrain: no findings to show: the session was interrupted before the rules were "
        "evaluated",
        "gputrain: could not write the report */report.json: not written: interrupted (Ctrl-C) "
        "before the rules were evaluated",
        "gputrain: facts written to */facts.json",
        "gputrain: interrupted (Ctrl-C)*"])
    assert json.loads((pytester.path / "facts.json").read_text())["kind"] == (
        "pytest-gputrain-facts")
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
