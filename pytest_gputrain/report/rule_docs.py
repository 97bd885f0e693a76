"""A rule's documentation as ``python -m pytest_gputrain explain CODE`` prints it, and the rule
catalogue as ``rules`` lists it, both fitted to the terminal's width.

A rule file's prose is written at the rule author's width: here each paragraph is re-flowed to
the terminal's, a list item (``- ...``, ``1. ...``, and in the options a line that opens with a
backquoted name after a sentence ends) keeps its own lines, and code (an indented line, the
condition) keeps its lines, a line longer than the width continuing further indented. The fix
is shown as a reader reads it: the text, then each case of a ``pick`` on its own line ("Under
Lightning: ...") instead of the template's source. A URL is never broken: one longer than the
width has a line of its own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from pytest_gputrain.engine.expr import CaseLabel, read_template
from pytest_gputrain.engine.rules import COST_KINDS, Rule
from pytest_gputrain.report.text import wrap

_ITEM = re.compile(r"(?:[-*]|\d+\.) ")
_COMMENT = re.compile(r"(\s*\S.*?)\s{2,}(#.*)$")  # code, then a comment after two spaces
CONTINUATION = "    "  # a code line longer than the width goes on with this much more indent


def rule_doc_lines(rule: Rule, width: int, case_label: CaseLabel | None = None,
                   cwd: Path | None = None) -> list[str]:
    """``explain``'s text of ``rule``, every line at most ``width`` wide (a URL excepted)."""
    out = [*wrap(f"{rule.code} {rule.name}: {rule.title}", width, CONTINUATION, first=""),
           f"scope: {rule.scope}, severity: {severity_text(rule)}",
           *wrap(f"file: {_shown_path(rule.path, cwd)}", width, CONTINUATION, first=""), ""]

    def section(title: str, lines: Sequence[str]) -> None:
        out.extend([f"## {title}", *lines, ""])

    section("What it checks", block_lines(rule.condition.source, width, code=True))
    if rule.warning_when is not None:
        section("A warning when its measured cost is large",
                block_lines(rule.warning_when.source, width, code=True))
    if rule.cost is not None:
        section("Its cost, which a cause may explain", block_lines(
            f"{rule.cost}: {COST_KINDS[rule.cost]}. Where a finding of the session or of the "
            "same test explains it, this finding defers to that one: it names it, offers its "
            "fix and is information.", width))
    if rule.explains:
        section("The costs it explains", block_lines("\n".join(
            f"- {kind}: {COST_KINDS[kind]}" for kind in rule.explains), width, items=True))
    section("Why is this bad", block_lines(rule.why, width))
    if "example" in rule.docs:
        section("Example", block_lines(rule.docs["example"], width))
    if "use_instead" in rule.docs:
        section("Use instead", block_lines(rule.docs["use_instead"], width))
    section("Fix", fix_lines(rule, width, case_label))
    if rule.params:
        lines = [line for name, value in rule.params.items()
                 for line in fit(f"{name} = {value!r}", width, CONTINUATION)]
        lines += wrap(f"Change one with --gpu-rule-param={rule.code}.NAME=VALUE, or in the ini "
                      f"file: gpu_rule_param = {rule.code}.NAME=VALUE.", width)
        if "options" in rule.docs:
            lines += ["", *block_lines(rule.docs["options"], width, items=True)]
        section("Options", lines)
    if "notes" in rule.docs:
        section("Notes", block_lines(rule.docs["notes"], width))
    if rule.references:
        section("References", [line for ref in rule.references
                               for line in wrap(ref, width, indent="  ", first="- ")])
    while out and not out[-1]:
        out.pop()
    return out


def severity_text(rule: Rule) -> str:
    """A rule's severity, and the warning its measured cost can make of an info finding."""
    if rule.warning_when is not None:
        return f"{rule.severity} (warning by measured cost)"
    return rule.severity


def fix_lines(rule: Rule, width: int, case_label: CaseLabel | None = None) -> list[str]:
    """The fix's text, then each case of each choice in it on its own line."""
    reading = read_template(rule.fix, case_label)
    lines = block_lines(reading.text, width) if reading.text else []
    for cases in reading.choices:
        if lines:
            lines.append("")
        for case in cases:
            lines += wrap(f"{case.label}: {case.text}", width, "  ", first="- ")
    return lines


def block_lines(text: str, width: int, *, code: bool = False, items: bool = False
                ) -> list[str]:
    """A rule file's text block fitted to ``width``: prose re-flowed, code kept (``code``: all
    of it is code). ``items``: a line opening with a backquoted name after a sentence's end
    starts an item of its own (the options' ```name` (default ...): ...``)."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    out: list[str] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            item = _ITEM.match(paragraph[0])
            hang = " " * len(item.group()) if item else ""
            out.extend(wrap(" ".join(paragraph), width, indent=hang))
            paragraph.clear()

    for line in lines:
        if not line.strip():
            flush()
            out.append("")
        elif code or line[0].isspace():
            flush()
            out.extend(code_line(line, width))
        else:
            if paragraph and (_ITEM.match(line) or (
                    items and line.startswith("`") and paragraph[-1].endswith("."))):
                flush()
            paragraph.append(line)
    flush()
    return out


def code_line(line: str, width: int) -> list[str]:
    """A line of code as written; longer than ``width``, its trailing comment goes on a line
    of its own above it, and what is still too long is broken at spaces, the rest further
    indented."""
    if len(line) <= width:
        return [line]
    lead = line[:len(line) - len(line.lstrip())]
    if len(lead) > width // 2:  # a comment aligned far right: brought back to the block's left
        lead = CONTINUATION
    comment = _COMMENT.match(line)
    if comment and not comment.group(1).lstrip().startswith("#"):
        return [*wrap(comment.group(2), width, lead + "  ", first=lead),
                *code_line(comment.group(1), width)]
    return wrap(line.strip(), width, lead + CONTINUATION, first=lead)


def fit(line: str, width: int, indent: str) -> list[str]:
    """``line`` as it is where it fits, its spacing kept; else wrapped."""
    return [line] if len(line) <= width else wrap(line, width, indent, first="")


def catalogue_lines(rules: Sequence[Rule], width: int) -> list[str]:
    """``rules``' listing: a table of code, name, scope, severity and title where it fits in
    ``width``; else per rule a line of code, severity, scope and name, and its title below,
    indented, wrapped to ``width``."""
    from tabulate import tabulate

    table = tabulate([(r.code, r.name, r.scope, severity_text(r), r.title) for r in rules],
                     headers=("code", "name", "scope", "severity", "title")).splitlines()
    if all(len(line) <= width for line in table):
        return table
    out = []
    for rule in rules:
        out += fit(f"{rule.code}  {severity_text(rule):<7}  {rule.scope:<11}  {rule.name}", width,
                   " " * 7)
        out += wrap(rule.title, width, indent=" " * 7)
    return out


def _shown_path(path: Path, cwd: Path | None) -> str:
    """A rule file's path relative to the current directory when it is under it."""
    if cwd is not None:
        try:
            return str(path.resolve().relative_to(cwd.resolve()))
        except ValueError:
            pass
    return str(path)
