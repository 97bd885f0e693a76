"""The GitHub Actions workflow in docs/ci.md runs against the plugin's options as they are."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

DOC = Path(__file__).resolve().parent.parent / "docs" / "ci.md"


def pytest_commands() -> dict[str, list[str]]:
    """Each job's pytest command line in the workflow (folded ``run: >`` blocks joined)."""
    workflow = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert workflow, "docs/ci.md has no yaml block"
    commands: dict[str, list[str]] = {}
    job = ""
    lines = workflow.group(1).splitlines()
    for index, line in enumerate(lines):
        if re.match(r"^  [a-z]+:$", line):
            job = line.strip().rstrip(":")
        text = line.split("run:", 1)[1].strip() if "run:" in line else ""
        if text == ">":  # a folded block: the more-indented lines that follow
            indent = len(line) - len(line.lstrip())
            body = []
            for following in lines[index + 1:]:
                if len(following) - len(following.lstrip()) <= indent:
                    break
                body.append(following.strip())
            text = " ".join(body)
        if text.startswith("python -m pytest "):
            commands[job] = shlex.split(text)[3:]
    return commands


def test_the_workflow_has_a_cpu_job_and_a_gpu_job_with_reports() -> None:
    commands = pytest_commands()
    assert set(commands) == {"cpu", "gpu"}
    assert "--gpu-required" in commands["gpu"]
    assert "--gpu-report=md:$GITHUB_STEP_SUMMARY" in commands["gpu"]


@pytest.mark.parametrize("job", ["cpu", "gpu"])
def test_the_workflow_s_pytest_command_lines_run(
    pytester: pytest.Pytester, use_facts: Callable[..., Any], monkeypatch: pytest.MonkeyPatch,
    job: str,
) -> None:
    use_facts("h200_healthy")
    summary = pytester.path / "step_summary_1a2b"
    summary.write_text("## Build\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    pytester.makepyfile("""
        import pytest

        def test_cpu():
            pass

        @pytest.mark.requires_cuda
        def test_gpu():
            pass
    """)
    args = [arg.replace("$GITHUB_STEP_SUMMARY", str(summary)) for arg in pytest_commands()[job]]
    result = pytester.runpytest(*args, "--collect-only")
    assert result.ret == pytest.ExitCode.OK, result.stderr.str() + result.stdout.str()
    if job == "gpu":
        result.stdout.fnmatch_lines(["*test_gpu*", "*1/2 tests collected (1 deselected)*"])
        assert summary.read_text().startswith("## Build\n\n## GPU diagnosis (pytest-gputrain)")
        assert json.loads((pytester.path / "gpu-report.json").read_text())["failed"] is False
        assert (pytester.path / "gpu-facts.json").exists()
    else:
        assert summary.read_text() == "## Build\n"
