"""Rule files: one TOML file per rule, loaded and validated into ``Rule`` objects.

A malformed rule file is a ``RuleFileError`` naming the file, the field and the problem.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

from pytest_gputrain import scopes
from pytest_gputrain.engine.codes import CODE_RE
from pytest_gputrain.engine.expr import ConditionError, Expr, Template, parse, parse_template
from pytest_gputrain.jsonfile import InputFileError, read_limited
from pytest_gputrain.severity import SEVERITY_RANK
from pytest_gputrain.units import shown

NAME_RE = re.compile(r"^[a-z][a-z0-9-]*$")

# What a finding's cost is spent on, in words a cause can name (docs/architecture.md, "Causes
# and the findings they explain"): a rule whose findings measure such a cost says ``cost = ...``;
# a rule whose findings are a cause of it says ``explains = [...]``. A finding whose cost a cause
# of the same recording explains defers to it (``evaluate.defer``).
COST_KINDS: Final = {
    "host-overhead": "host time spent per kernel launch, operator or allocation, which leaves "
                     "the GPU waiting for the host (launch-bound and host-bound steps)",
    "allocator-calls": "calls into the CUDA driver's allocator (cudaMalloc/cudaFree) while "
                       "training",
}


class RuleFileError(ValueError):
    """A rule file (or a rule setting) is malformed."""


def text_block(text: str) -> str:
    """A multi-line TOML string as a block: its blank first and last lines and each line's
    trailing spaces removed, the indentation kept: an indented line is code, which ``explain``
    shows as written while it re-flows the prose (``report/rule_docs.py``). A one-line value
    is stripped unless indented as code (four spaces)."""
    lines = text.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) == 1 and not lines[0].startswith("    "):
        return lines[0].strip()
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
    # Severity by measured cost: an info rule whose finding is a warning where this holds.
    warning_when: Expr | None = None
    # The cost its findings measure, and the costs its findings explain (COST_KINDS).
    cost: str | None = None
    explains: tuple[str, ...] = ()
    # The message of a finding whose cost a cause explains (default: ``message``).
    explained_message: Template | None = None

    def names(self) -> frozenset[str]:
        names = (self.condition.names() | self.message.names() | self.fix.names()
                 | frozenset(self.evidence))
        if self.warning_when is not None:
            names |= self.warning_when.names()
        if self.explained_message is not None:
            names |= self.explained_message.names()
        return names

    def severity_of(self, lookup: Any) -> str:
        """The finding's severity on these facts: ``severity``, or warning where
        ``warning_when`` holds (only true counts: an unknown cost is no large cost)."""
        if self.warning_when is not None and self.warning_when.evaluate(lookup) is True:
            return "warning"
        return self.severity


# -- the structure of a rule file ------------------------------------------------------------------
# Strict: TOML has its own types, and a number where text belongs is a mistake in the file, not
# something to convert. Each field's description is what its error message says it must be.

def _registered_scope(scope: str) -> str:
    known = scopes.names()  # features register scopes at run time: no fixed list here
    if scope not in known:
        raise ValueError(f"must be one of {', '.join(known)}")
    return scope


def _severity(severity: str) -> str:
    if severity not in SEVERITY_RANK:
        raise ValueError(f"must be one of {', '.join(SEVERITY_RANK)}")
    return severity


def _cost_kind(kind: str) -> str:
    if kind not in COST_KINDS:
        raise ValueError(f"must be one of {', '.join(COST_KINDS)}")
    return kind


_STRICT: Final = ConfigDict(extra="forbid", strict=True)
_TEXT: Final = "a string"


class _Docs(BaseModel):
    """The [docs] table: the sections of the rule's documentation (``explain``)."""

    model_config = _STRICT
    example: str | None = None
    use_instead: str | None = None
    options: str | None = None
    notes: str | None = None


DOC_SECTIONS: Final = tuple(_Docs.model_fields)


class _RuleFile(BaseModel):
    model_config = _STRICT
    code: str = Field(pattern=CODE_RE.pattern, description=(
        "GT and three digits (GT001; a project's own rules use GT900 to GT999)"))
    name: str = Field(pattern=NAME_RE.pattern, description="lower-case words joined by '-'")
    title: str = Field(description=_TEXT)
    scope: Annotated[str, AfterValidator(_registered_scope)] = Field(description=_TEXT)
    severity: Annotated[str, AfterValidator(_severity)] = Field(description=_TEXT)
    condition: str = Field(description=_TEXT)
    message: str = Field(description=_TEXT)
    fix: str = Field(description=_TEXT)
    why: str = Field(description=_TEXT)
    evidence: list[str] = Field(default_factory=list, description="a list of strings")
    references: list[str] = Field(default_factory=list, description="a list of strings")
    params: dict[str, StrictBool | StrictInt | StrictFloat | StrictStr] = Field(
        default_factory=dict, description="a table of numbers, strings and booleans")
    docs: _Docs = Field(default_factory=_Docs, description="a table of strings")
    warning_when: str | None = Field(default=None, description=_TEXT)
    cost: Annotated[str, AfterValidator(_cost_kind)] | None = Field(
        default=None, description=_TEXT)
    explains: list[Annotated[str, AfterValidator(_cost_kind)]] = Field(
        default_factory=list, description="a list of strings")
    explained_message: str | None = Field(default=None, description=_TEXT)


def _where(data: object, loc: tuple[int | str, ...]) -> str:
    """The place in the file an error's location points to: 'params.batch', 'evidence[1]'.

    pydantic's locations go on past the data (union members, model names); the place ends
    where the data does.
    """
    place, node = "", data
    for part in loc:
        if isinstance(node, dict) and part in node:
            place += f".{part}" if place else str(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            place += f"[{part}]"
        else:
            break
        node = node[part]  # type: ignore[index]
    return place


def _structure_error(path: Path, data: dict[str, Any], error: ValidationError) -> RuleFileError:
    """pydantic's errors as one message in the project's form: the file, the field, the problem."""
    problems: list[str] = []
    unknown: dict[str, list[str]] = {}  # "" for the file's top level, "docs" for its sections
    places: set[str] = set()
    for detail in error.errors(include_url=False):
        loc, kind, value = detail["loc"], detail["type"], detail["input"]
        key = str(loc[0])
        if kind == "extra_forbidden":
            unknown.setdefault(str(loc[0]) if len(loc) > 1 else "", []).append(str(loc[-1]))
            continue
        if kind == "missing":
            problems.append(f"missing required field '{key}'")
            continue
        place = _where(data, loc)
        if place in places:
            continue  # a value that fits no member of a union gives one error per member
        places.add(place)
        if kind == "value_error":  # from a validator above: its text says what is allowed
            reason, got = str(detail.get("ctx", {}).get("error")), shown(value)
        else:
            reason = f"must be {_RuleFile.model_fields[key].description}"
            # The type is shown where it is what is wrong ('5' and 5 read alike otherwise).
            got = (f"{type(value).__name__} {shown(value)}" if kind.endswith("_type")
                   else shown(value))
        at = f" at {place}" if place != key else ""
        problems.append(f"field '{key}' {reason}, got {got}{at}")
    unknown_problems = [
        f"unknown {'docs section(s)' if section else 'field(s)'} {', '.join(sorted(names))}; "
        f"allowed: {', '.join(DOC_SECTIONS if section else _RuleFile.model_fields)}"
        for section, names in unknown.items()]
    problems = unknown_problems + problems
    return RuleFileError(f"{path}: {'; '.join(problems)}")


def builtin_rules_dir() -> Path:
    """Rules ship in the wheel as pytest_gputrain/rules; a source checkout has them at the top."""
    packaged = Path(__file__).resolve().parent.parent / "rules"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent.parent / "rules"


def load_rule_file(path: Path) -> Rule:
    if path.exists() and not path.is_file():  # a FIFO would wait for a writer forever
        raise RuleFileError(f"{path}: not a regular file")
    try:
        data = tomllib.loads(read_limited(path).decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise RuleFileError(f"{path}: not valid TOML: {exc}") from None
    except InputFileError as exc:
        raise RuleFileError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise RuleFileError(f"{path}: cannot be read: {exc}") from None
    try:
        values = _RuleFile.model_validate(data)
    except ValidationError as exc:
        raise _structure_error(path, data, exc) from None
    if not path.name.startswith(values.code):
        raise RuleFileError(
            f"{path}: file name must start with the rule's code {values.code} "
            f"(e.g. {values.code}-{values.name}.toml)"
        )
    for key, value in values.params.items():
        if isinstance(value, float) and not math.isfinite(value):
            # TOML has nan and inf; no threshold compares true with nan, so the rule would
            # never fire (--gpu-rule-param refuses them too).
            raise RuleFileError(
                f"{path}: rule {values.code}: params.{key} = {value!r} is not a finite "
                "number; give a threshold such as 0.5")
    _check_cost_fields(path, values)
    compiled: dict[str, Any] = {}
    for key, parser in (("condition", parse), ("message", parse_template), ("fix", parse_template),
                        ("warning_when", parse), ("explained_message", parse_template)):
        text = getattr(values, key)
        if text is None:
            continue
        try:
            compiled[key] = parser(text)
        except ConditionError as exc:
            raise RuleFileError(f"{path}: field '{key}': {exc}") from None
    for key in ("condition", "warning_when"):
        if key in compiled and compiled[key].gives_truth() is False:
            raise RuleFileError(
                f"{path}: field '{key}': {getattr(values, key).strip()!r} gives a value, not "
                "true or false, so it would never hold; compare it (e.g. `... > 0`)")
    return Rule(
        code=values.code,
        name=values.name,
        title=values.title,
        scope=values.scope,
        severity=values.severity,
        condition=compiled["condition"],
        message=compiled["message"],
        fix=compiled["fix"],
        why=values.why.strip(),
        evidence=tuple(values.evidence),
        references=tuple(values.references),
        params=dict(values.params),
        docs={k: text_block(v) for k, v in values.docs.model_dump(exclude_none=True).items()},
        path=path,
        warning_when=compiled.get("warning_when"),
        cost=values.cost,
        explains=tuple(values.explains),
        explained_message=compiled.get("explained_message"),
    )


def _check_cost_fields(path: Path, values: _RuleFile) -> None:
    """The severity and cause fields make sense together (docs/architecture.md)."""
    if values.warning_when is not None and values.severity != "info":
        raise RuleFileError(
            f"{path}: field 'warning_when' raises an info finding to a warning where its cost "
            f"is large; this rule's severity is already {values.severity!r}")
    if values.explained_message is not None and values.cost is None:
        raise RuleFileError(
            f"{path}: field 'explained_message' is the message of a finding whose cost a cause "
            "explains: give the rule's 'cost' too")
    if values.cost is not None and values.cost in values.explains:
        raise RuleFileError(
            f"{path}: the rule explains its own cost {values.cost!r}: a finding cannot be its "
            "own cause")


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
