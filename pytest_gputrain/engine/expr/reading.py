"""A template as a person reads it in a rule's documentation (``explain``): its text with
each fact as ``{name}``, and each ``pick(x, a, ra, b, rb, ..., otherwise)`` as the list of its
cases, one line each ("Under Lightning: ...", 'When failure.driver_problem is "too_old": ...'),
instead of the placeholder's source.

May import :mod:`.templates`, :mod:`.tree`, :mod:`.values` and the modules below them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from pytest_gputrain.engine.expr.templates import Template
from pytest_gputrain.engine.expr.tree import (
    Arith,
    Call,
    Compare,
    List,
    Literal,
    Logic,
    Name,
    Negate,
    Node,
    Not,
)
from pytest_gputrain.engine.expr.values import UNKNOWN

# The label of a case, from the chooser's text (``run.framework``) and the case's value
# (``"lightning"``); None for the plain 'When run.framework is "lightning"'.
CaseLabel = Callable[[str, object], str | None]


@dataclass(frozen=True)
class Case:
    label: str
    text: str


@dataclass(frozen=True)
class TemplateReading:
    """``text``: the template with its choices left out; ``choices``: per ``pick``, its cases
    (an empty ``otherwise`` left out)."""

    text: str
    choices: tuple[tuple[Case, ...], ...]


def read_template(template: Template, case_label: CaseLabel | None = None) -> TemplateReading:
    text: list[str] = []
    choices: list[tuple[Case, ...]] = []
    for piece in template.pieces():
        if isinstance(piece, str):
            text.append(piece)
            continue
        cases = _cases(piece.root, case_label)
        if cases is None:
            text.append(_as_text(piece.root))
        elif cases:
            choices.append(cases)
    return TemplateReading("".join(text).strip(), tuple(choices))


def _cases(node: Node, case_label: CaseLabel | None) -> tuple[Case, ...] | None:
    """A ``pick`` call's cases; None for any other node."""
    if not (isinstance(node, Call) and node.function.name == "pick"):
        return None
    chooser, *rest = node.args
    subject = unparse(chooser, fallbacks=False)
    cases = []
    for value_node, result in zip(rest[0::2], rest[1::2], strict=False):
        value = value_node.value if isinstance(value_node, Literal) else UNKNOWN
        label = (case_label(subject, value) if case_label and value is not UNKNOWN else None) \
            or _plain_label(subject, value_node)
        cases.append(Case(label, _after_label(label, _as_text(result).strip())))
    if len(rest) % 2:
        otherwise = _as_text(rest[-1]).strip()
        if otherwise:
            cases.append(Case("Otherwise", otherwise))
    return tuple(cases)


def _plain_label(subject: str, value: Node) -> str:
    if isinstance(value, Literal) and value.value is True:
        return f"When {subject}"
    if isinstance(value, Literal) and value.value is False:
        return f"When not {subject}"
    if isinstance(value, List):
        return f"When {subject} is one of {', '.join(unparse(item) for item in value.items)}"
    return f"When {subject} is {unparse(value)}"


def _after_label(label: str, text: str) -> str:
    """The case's text without the words its label already says ("Under Lightning the loader"
    reads "Under Lightning: the loader")."""
    if text.startswith(label) and text[len(label):len(label) + 1] in (" ", ","):
        text = text[len(label):].lstrip(" ,")
    return text


def _known_part(node: Node) -> Node:
    """``coalesce(run.framework, "")`` reads as ``run.framework``: the fallback only says what
    an unknown fact counts as."""
    if isinstance(node, Call) and node.function.name == "coalesce" and node.args \
            and all(isinstance(arg, Literal) for arg in node.args[1:]):
        return node.args[0]
    return node


def _as_text(node: Node) -> str:
    """What a placeholder shows: a string as itself, a sum of strings and facts as the strings
    with ``{fact}`` between them, anything else as ``{its source}``."""
    if isinstance(node, Literal):
        if isinstance(node.value, str):
            return node.value
        return "" if node.value is None or node.value is UNKNOWN else unparse(node)
    if isinstance(node, Arith) and all(op == "+" for op, _, _ in node.rest):
        return "".join(_as_text(part) for part in (node.first, *(n for _, n, _ in node.rest)))
    return "{" + unparse(node, fallbacks=False) + "}"


def unparse(node: Node, *, fallbacks: bool = True) -> str:
    """The expression's text as a rule file would write it (compound operands in brackets);
    without ``fallbacks``, every ``coalesce(fact, literal)`` reads as its fact."""
    if not fallbacks and _known_part(node) is not node:
        return unparse(_known_part(node), fallbacks=False)
    if isinstance(node, Literal):
        value = node.value
        if value is True or value is False:
            return str(value).lower()
        if value is None or value is UNKNOWN:
            return "none"
        return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)
    if isinstance(node, Name):
        return node.name
    if isinstance(node, List):
        return "[" + ", ".join(unparse(item, fallbacks=fallbacks) for item in node.items) + "]"
    if isinstance(node, Call):
        args = ", ".join(unparse(arg, fallbacks=fallbacks) for arg in node.args)
        return f"{node.function.name}({args})"
    if isinstance(node, Not):
        return "not " + _operand(node.operand, fallbacks)
    if isinstance(node, Negate):
        return "-" + _operand(node.operand, fallbacks)
    if isinstance(node, Logic):
        return f" {node.op} ".join(_operand(operand, fallbacks) for operand in node.operands)
    if isinstance(node, Compare | Arith):
        return " ".join([_operand(node.first, fallbacks),
                         *(f"{op} {_operand(right, fallbacks)}" for op, right, _ in node.rest)])
    return "?"


def _operand(node: Node, fallbacks: bool = True) -> str:
    text = unparse(node, fallbacks=fallbacks)
    return f"({text})" if isinstance(node, Logic | Compare | Arith | Not) else text
