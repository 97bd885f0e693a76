"""The sample project's README commands work as written, from the repository root."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_README = ROOT / "sample_projects" / "product_classifier" / "README.md"


def documented_command(comment: str) -> list[str]:
    """The README's command line that ends in ``# comment``, as arguments."""
    for line in SAMPLE_README.read_text(encoding="utf-8").splitlines():
        command, sep, note = line.partition("#")
        if sep and note.strip() == comment:
            return shlex.split(command)
    raise AssertionError(f"no command marked '# {comment}' in {SAMPLE_README}")


def test_the_plain_pytest_command_collects_and_sets_up_without_the_plugin() -> None:
    """`pytest sample_projects/product_classifier -p no:gputrain` under the repository's
    configuration (``--strict-markers``). ``--setup-plan`` resolves every test's fixtures
    without running them, so a marker or fixture that only the plugin provides fails here."""
    command = documented_command("plain pytest")
    assert command[0] == "pytest" and "no:gputrain" in command
    result = subprocess.run([sys.executable, "-m", *command, "--setup-plan", "-q",
                             "-p", "no:cacheprovider"],
                            cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not re.search(r"\b\d+ errors?\b", result.stdout), result.stdout[-2000:]
    assert "test_product_model.py::test_unknown_arch" in result.stdout
    assert "test_product_gpu_ladder.py" not in result.stdout  # needs the plugin: left out


def test_with_the_plugin_the_gpu_ladder_is_collected() -> None:
    command = documented_command("with the pytest-gputrain plugin")
    result = subprocess.run([sys.executable, "-m", *command, "--collect-only", "-q",
                             "-p", "no:cacheprovider"],
                            cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_product_gpu_ladder.py::test_one_batch_on_cpu" in result.stdout


def test_every_file_the_readme_names_exists() -> None:
    """The layout table and the text point at real files (a rung that moved is a stale pointer)."""
    text = SAMPLE_README.read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w/.-]+\.py)`", text))
    assert "test_product_gpu_ladder.py" in named  # the GPU rungs, in the layout table
    project = SAMPLE_README.parent
    missing = [name for name in sorted(named)
               if not (project / name).exists() and not list(project.rglob(Path(name).name))]
    assert not missing, missing
