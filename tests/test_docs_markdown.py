"""README.md and docs/*.md render as written: parsed with a CommonMark parser (markdown-it-py,
as GitHub renders Markdown), no fence is left open or pairs with the wrong one (which turns
prose into code and code into prose), and no line of ``=`` turns the paragraph above it into a
heading. The shell commands a reader is told to run name files that exist.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
# A block of commands for the reader's own project, not this repository, says so first.
OWN_PROJECT = re.compile(r"#.*\byour (?:own )?project\b", re.I)
# The repository's own top-level names: a path under one of them must exist. ``tests/`` is
# left out (a reader's project has one too: ``pytest tests/perf``), its recorded facts are not.
REPOSITORY = tuple(sorted({path.name for path in ROOT.iterdir()
                           if not path.name.startswith(".") or path.name == ".ci"}
                          - {"LICENSE", "tests"}))


def tokens(path: Path) -> list[Token]:
    return MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8"))


def fence_problems(path: Path) -> Iterator[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    for token in tokens(path):
        if token.type == "heading_open" and token.markup == "=":
            assert token.map is not None
            above = token.map[1] - 1 - token.map[0]
            yield (f"{path.name}:{token.map[1]}: a line of '=' makes the {above} line(s) above "
                   "it a heading (a leftover merge marker?)")
        if token.type != "fence" or token.map is None:
            continue
        start, end = token.map
        closing = lines[end - 1].strip() if end - 1 > start else ""
        if not (closing.startswith(token.markup) and set(closing) == {token.markup[0]}):
            yield f"{path.name}:{start + 1}: the fence opened here is never closed"
        # Written the usual way, a fence has a blank line, the document's edge or an HTML comment
        # (a sample's marker) on each side; one that does not is an opening fence taken for a
        # closing one, or the reverse.
        elif _touches(lines, start - 1) or _touches(lines, end):
            yield (f"{path.name}:{start + 1}: the fence opened here touches the text around it "
                   f"(lines {start}-{end + 1}): a fence pairs with the wrong one, so prose shows "
                   "as code")


def _touches(lines: list[str], index: int) -> bool:
    return 0 <= index < len(lines) and bool(lines[index].strip()) \
        and not lines[index].startswith("<!--")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_fences_pair_up_and_no_heading_is_made_of_equals_signs(path: Path) -> None:
    problems = list(fence_problems(path))
    assert not problems, "\n".join(problems)


def test_the_checks_catch_what_broke_the_readme(tmp_path: Path) -> None:
    broken = tmp_path / "broken.md"
    broken.write_text("## Output\n\nThe facts recorded\nprint the same\n=======\n\n"
                      "platform linux\n...\n```\n\nOn a GPU machine:\n\n```\ngputrain: GPU 0\n\n"
                      "```bash\npytest\n", encoding="utf-8")
    problems = "\n".join(fence_problems(broken))
    assert "touches the text around it" in problems
    assert "a line of '='" in problems
    assert "never closed" in problems


def commands(path: Path) -> Iterator[tuple[int, list[str], list[str]]]:
    """(line, words, the block's words before it) of each command in the shell blocks a reader
    runs in this repository (a block for their own project says so in its first comment)."""
    for token in tokens(path):
        if token.type != "fence" or token.info.strip() not in SHELL or token.map is None:
            continue
        text = token.content
        if OWN_PROJECT.match(text.lstrip()):
            continue
        before: list[str] = []
        for offset, line in enumerate(text.replace("\\\n", " ").splitlines()):
            line = line.strip().removeprefix("$ ")
            for part in re.split(r"&&|;|\|\|", line):
                try:
                    words = shlex.split(part, comments=True)
                except ValueError:
                    continue
                if words:
                    yield token.map[0] + 2 + offset, words, before
                    before = before + words


def _paths(words: list[str]) -> list[str]:
    return [word for word in words if not word.startswith("-") and "$" not in word
            and "://" not in word and (word.split("/")[0] in REPOSITORY
                                       or word.startswith("tests/facts/"))]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shell_commands_name_files_of_this_repository_that_exist(path: Path) -> None:
    missing = [f"{path.name}:{line}: {word}" for line, words, before in commands(path)
               for word in _paths(words) if not (ROOT / word).exists()
               and not any(word in earlier for earlier in before)]  # written by a command above
    assert not missing, "commands that name files this repository does not have:\n" + \
        "\n".join(missing)


def test_each_diagnosis_command_of_the_readme_names_what_it_runs() -> None:
    """Run from the repository root, ``pytest --gpu-diagnose`` with no path runs every test of
    the project, one after another: a README command names the tests it means."""
    bare = [f"README.md:{line}: {' '.join(words)}"
            for line, words, _ in commands(ROOT / "README.md")
            if "pytest" in words and "--gpu-diagnose" in words
            and not [word for word in words[words.index("pytest") + 1:]
                     if not word.startswith("-") and (ROOT / word).exists()]]
    assert not bare, "README commands that would run the whole suite:\n" + "\n".join(bare)


def quick_start() -> list[str]:
    """The README's two commands for a fresh machine: the main job, then the tests."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [token.content.strip() for token in MarkdownIt("commonmark").parse(section)
            if token.type == "fence" and token.info.strip() == "bash"]


def test_the_quick_start_runs_the_main_job_then_the_tests_and_ci_runs_the_same() -> None:
    main_job, tests = quick_start()
    assert "--gpu-diagnose sample_projects/product_classifier" in main_job
    assert tests.endswith("-m pytest -n auto")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert tests in ci, ".ci/run must run the README's test command as written"
    import configparser

    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini", encoding="utf-8")
    pytest_part = tests[tests.index("-m pytest"):]
    assert tox.get("testenv:tests", "commands").strip() == f"python {pytest_part} {{posargs}}"
