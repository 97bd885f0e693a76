"""Every measured figure in README.md and docs/*.md says when and with which version it was
measured: a figure without them reads as true of the code beside it, and goes stale silently.

A *measurement* is a paragraph that names a machine something ran on (the lent H200, an N-core
machine) and quotes a figure with a unit (ms, µs, s, min, %, ×, MiB, GB, ...) or a count of
passed tests. A table, a fenced output block or a list item is read with the blocks before it
up to the paragraph that introduces it: it shares that paragraph's machine, date and version.
A measurement must name a date (YYYY-MM-DD) and a commit (``commit 1a2b3c4``); each commit
named must be in the repository's history when that history is at hand.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

MACHINE = re.compile(r"\bH200\b|\b\d+-core\b|\blent\b")
FIGURE = re.compile(r"\d(?:[.,]\d+)?\s?(?:ms|µs|s|min|%|×|[KMG]i?B)(?!\w)|\b\d+ passed\b")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
COMMIT = re.compile(r"\bcommits?\s+([0-9a-f]{7,40})\b")


def blocks(text: str) -> Iterator[tuple[int, str, str]]:
    """(first line, kind, text) of each block: a heading, a fenced block, a table, a list item
    or a paragraph."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        start = index
        if not line.strip():
            index += 1
            continue
        if line.startswith("```"):
            index += 1
            while index < len(lines) and not lines[index].startswith("```"):
                index += 1
            index += 1
            kind = "fenced"
        elif line.startswith("#"):
            index += 1
            kind = "heading"
        elif line.startswith("|"):
            while index < len(lines) and lines[index].startswith("|"):
                index += 1
            kind = "table"
        else:
            kind = "item" if re.match(r"\s*(?:[-*]|\d+\.) ", line) else "paragraph"
            index += 1
            while (index < len(lines) and lines[index].strip()
                   and not lines[index].startswith(("```", "#", "|"))
                   and not re.match(r"\s*(?:[-*]|\d+\.) ", lines[index])):
                index += 1
        yield start + 1, kind, "\n".join(lines[start:index])


def measurements(markdown: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each measurement in a Markdown text, with the blocks that introduce it."""
    context: list[str] = []
    for line, kind, text in blocks(markdown):
        if kind == "heading":
            context = []
            continue
        context = [*context, text] if kind in ("fenced", "table", "item") else [text]
        unit = "\n".join(context)
        if MACHINE.search(unit) and FIGURE.search(text):
            yield line, unit


def test_the_reader_finds_measurements_and_their_context() -> None:
    sample = "\n".join([
        "## Section", "",
        "On the lent H200 (2026-11-30, commit 1234567) it took:", "",
        "| run | time |", "|---|---|", "| H200 | 7.9 ms |", "",
        "- **An H200 bullet** that ran 12 %.", "",
        "## Next", "",
        "A bare claim: on an H200 a step took 9.9 ms.",
        "",
        "A rule: warn above 5 % (no machine named).",
    ])
    found = list(measurements(sample))
    assert [line for line, _ in found] == [5, 9, 13]  # the table, the bullet, the bare claim
    assert all(DATE.search(unit) and COMMIT.search(unit) for _, unit in found[:2])
    assert not DATE.search(found[2][1])  # its own paragraph, after a new heading


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_measurement_names_its_date_and_commit(path: Path) -> None:
    missing = [f"{path.name}:{line}: {unit.splitlines()[-1][:100]!r}"
               for line, unit in measurements(path.read_text(encoding="utf-8"))
               if not (DATE.search(unit) and COMMIT.search(unit))]
    assert not missing, ("a measured figure without a date (YYYY-MM-DD) and a commit "
                         "('commit 1a2b3c4'):\n" + "\n".join(missing))


def _history_at_hand() -> bool:
    """A full git history of this checkout (not a shallow clone, not an unpacked sdist)."""
    try:
        shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT,
                                 capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return False
    return shallow.returncode == 0 and shallow.stdout.strip() == "false"


def test_each_commit_named_is_in_the_history() -> None:
    if not _history_at_hand():
        pytest.skip("no full git history here")
    named = {match for path in DOCS for _, kind, text in blocks(path.read_text("utf-8"))
             if kind != "fenced"  # sample output may show a made-up commit
             for match in COMMIT.findall(text)}
    unknown = sorted(name for name in named if subprocess.run(
        ["git", "cat-file", "-e", f"{name}^{{commit}}"], cwd=ROOT, capture_output=True,
        timeout=30, check=False).returncode != 0)
    assert not unknown, f"commits named in the docs that the history does not hold: {unknown}"
