"""Rule files: one TOML file per rule, loaded and validated into ``Rule`` objects.

A malformed rule file is a ``RuleFileError`` naming the file, the field and the problem.
"""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

from pytest_gputrain import scopes
from pytest_gputrain.engine.config import CODE_RE
from pytest_gputrain.engine.expr import ConditionError, Expr, Template, parse, parse_template
from pytest_gputrain.severity import SEVERITY_RANK

NAME_RE = re.compile(r"^[a-z][a-z0-9-]*$")
REQUIRED = ("code", "name", "title", "scope", "severity", "condition", "message", "fix", "why")
OPTIONAL = ("evidence", "references", "params", "docs")
DOC_SECTIONS = ("example", "use_instead", "options", "notes")


class RuleFileError(ValueError):
    """A rule file (or a rule setting) is malformed."""


def text_block(text: str) -> str:
    """A multi-line TOML string as a block: its common indentation and its blank first and last
    lines removed, every other line's indentation kept (a code example's first line included,
    which ``str.strip`` would flatten)."""
    lines = textwrap.dedent(text).splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(line.rstrip() for line in lines)


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    title: str
    scope: str
    severity: str
    condition: Expr
    message: Template
    fix: Template
    why: str
    evidence: tuple[str, ...]
    references: tuple[str, ...]
    params: dict[str, Any]
    docs: dict[str, str]
    path: Path

    def names(self) -> frozenset[str]:
        return (self.condition.names() | self.message.names() | self.fix.names()
                | frozenset(self.evidence))


def builtin_rules_dir() -> Path:
    """Rules ship in the wheel as pytest_gputrain/rules; a source checkout has them at the top."""
    packaged = Path(__file__).resolve().parent.parent / "rules"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent.parent / "rules"


def _require(data: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Path) -> Any:
    if key not in data:
        raise RuleFileError(f"{path}: missing required field '{key}'")
    value = data[key]
    if not isinstance(value, kind):
        expected = (kind.__name__ if isinstance(kind, type)
                    else " or ".join(k.__name__ for k in kind))
        raise RuleFileError(
            f"{path}: field '{key}' must be a {expected}, got {type(value).__name__} {value!r}"
        )
    return value


def load_rule_file(path: Path) -> Rule:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise RuleFileError(f"{path}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleFileError(f"{path}: cannot be read: {exc}") from None
    unknown = sorted(set(data) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise RuleFileError(
            f"{path}: unknown field(s) {', '.join(unknown)}; allowed: "
            f"{', '.join(REQUIRED + OPTIONAL)}"
        )
    values = {key: _require(data, key, str, path) for key in REQUIRED}
    if not CODE_RE.match(values["code"]):
        raise RuleFileError(f"{path}: field 'code' must be GT and three digits (GT001; a "
                            f"project's own rules use GT900 to GT999), got {values['code']!r}")
    if not path.name.startswith(values["code"]):
        raise RuleFileError(
            f"{path}: file name must start with the rule's code {values['code']} "
            f"(e.g. {values['code']}-{values['name']}.toml)"
        )
    if not NAME_RE.match(values["name"]):
        raise RuleFileError(
            f"{path}: field 'name' must be lower-case words joined by '-', got {values['name']!r}"
        )
    known_scopes = scopes.names()
    if values["scope"] not in known_scopes:
        raise RuleFileError(
            f"{path}: field 'scope' must be one of {', '.join(known_scopes)}, "
            f"got {values['scope']!r}"
        )
    if values["severity"] not in SEVERITY_RANK:
        raise RuleFileError(
            f"{path}: field 'severity' must be one of info, warning, error, "
            f"got {values['severity']!r}"
        )
    evidence = data.get("evidence", [])
    references = data.get("references", [])
    params = data.get("params", {})
    docs = data.get("docs", {})
    for key, value in (("evidence", evidence), ("references", references)):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise RuleFileError(f"{path}: field '{key}' must be a list of strings")
    if not isinstance(params, dict):
        raise RuleFileError(f"{path}: field 'params' must be a table")
    for key, value in params.items():
        if not isinstance(value, int | float | str | bool):
            raise RuleFileError(
                f"{path}: params.{key} must be a number, string or boolean, got {value!r}"
            )
    if not isinstance(docs, dict) or not all(isinstance(v, str) for v in docs.values()):
        raise RuleFileError(f"{path}: field 'docs' must be a table of strings")
    bad_docs = sorted(set(docs) - set(DOC_SECTIONS))
    if bad_docs:
        raise RuleFileError(
            f"{path}: unknown docs section(s) {', '.join(bad_docs)}; allowed: "
            f"{', '.join(DOC_SECTIONS)}"
        )
    compiled: dict[str, Any] = {}
    for key, parser in (("condition", parse), ("message", parse_template), ("fix", parse_template)):
        try:
            compiled[key] = parser(values[key])
        except ConditionError as exc:
            raise RuleFileError(f"{path}: field '{key}': {exc}") from None
    if compiled["condition"].gives_truth() is False:
        raise RuleFileError(
            f"{path}: field 'condition': {values['condition'].strip()!r} gives a value, not true "
            "or false, so the rule would never fire; compare it (e.g. `... > 0`)")
    return Rule(
        code=values["code"],
        name=values["name"],
        title=values["title"],
        scope=values["scope"],
        severity=values["severity"],
        condition=compiled["condition"],
        message=compiled["message"],
        fix=compiled["fix"],
        why=values["why"].strip(),
        evidence=tuple(evidence),
        references=tuple(references),
        params=dict(params),
        docs={k: text_block(v) for k, v in docs.items()},
        path=path,
    )


def load_rules(directories: Iterable[Path]) -> list[Rule]:
    """Load every ``*.toml`` in the directories; later directories may not reuse a code."""
    rules: dict[str, Rule] = {}
    for directory in directories:
        if not directory.is_dir():
            raise RuleFileError(f"{directory}: rule directory does not exist")
        for path in sorted(directory.glob("*.toml")):
            rule = load_rule_file(path)
            if rule.code in rules:
                raise RuleFileError(
                    f"{path}: code {rule.code} is already used by {rules[rule.code].path}"
                )
            rules[rule.code] = rule
    return [rules[code] for code in sorted(rules)]
