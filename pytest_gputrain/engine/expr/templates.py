"""Message templates: text with ``{expression}`` placeholders, each parsed as a condition and
rendered with the fact's unit.

May import :mod:`.parser`, :mod:`.tree`, :mod:`.values`, :mod:`.limits` and :mod:`.errors`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pytest_gputrain.engine.expr.errors import ConditionError, EvaluationError
from pytest_gputrain.engine.expr.limits import MAX_LENGTH
from pytest_gputrain.engine.expr.parser import Parser
from pytest_gputrain.engine.expr.tree import Call, Expr, Name, Node
from pytest_gputrain.engine.expr.values import plain


@dataclass(frozen=True, slots=True)
class _Placeholder:
    expr: Expr
    # The facts whose unit the value takes: the placeholder's one name, or every name of a
    # ``coalesce`` of names (their unit where they share one: a measured time, else an estimate)
    names: tuple[str, ...]


class Template:
    """A message with ``{expression}`` placeholders; ``{{`` and ``}}`` are literal braces."""

    __slots__ = ("_names", "_parts", "source")

    def __init__(self, source: str, parts: Sequence[str | _Placeholder]) -> None:
        self.source = source
        self._parts = tuple(parts)
        self._names = frozenset(
            name for part in self._parts if isinstance(part, _Placeholder)
            for name in part.expr.names()
        )

    def __repr__(self) -> str:
        return f"Template({self.source!r})"

    def names(self) -> frozenset[str]:
        return self._names

    def pieces(self) -> tuple[str | Expr, ...]:
        """The template in order: literal text, and each placeholder's expression."""
        return tuple(part if isinstance(part, str) else part.expr for part in self._parts)

    def render(
        self,
        lookup: Callable[[str], object],
        format_value: Callable[[object, str | None], str],
        unit_of: Callable[[str], str | None],
    ) -> str:
        out: list[str] = []
        for part in self._parts:
            if isinstance(part, str):
                out.append(part)
                continue
            try:
                value = part.expr.evaluate(lookup)
            except EvaluationError as exc:
                # A message must still be shown when one placeholder cannot be computed.
                out.append(f"<error: {exc}>")
                continue
            units = {unit_of(name) for name in part.names}
            unit = units.pop() if len(units) == 1 else None
            out.append(format_value(plain(value), unit))
        return "".join(out)


def _unit_names(root: Node) -> tuple[str, ...]:
    if isinstance(root, Name):
        return (root.name,)
    if isinstance(root, Call) and root.function.name == "coalesce" and root.args and all(
            isinstance(arg, Name) for arg in root.args):
        return tuple(arg.name for arg in root.args if isinstance(arg, Name))
    return ()


def parse_template(text: str) -> Template:
    """Parse a message template; raises ConditionError naming a bad placeholder."""
    if not isinstance(text, str):
        raise ConditionError(f"a template must be a string, not {type(text).__name__}")
    parts: list[str | _Placeholder] = []
    literal: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "}":
            if text[index + 1:index + 2] == "}":
                literal.append("}")
                index += 2
                continue
            raise ConditionError("single '}' in template; write '}}' for a literal brace",
                                 text, index)
        if char != "{":
            literal.append(char)
            index += 1
            continue
        if text[index + 1:index + 2] == "{":
            literal.append("{")
            index += 2
            continue
        end = _placeholder_end(text, index)
        body = text[index + 1:end]
        shown = body if len(body) <= 40 else body[:37] + "..."
        if not body.strip():
            raise ConditionError("empty placeholder {}; write '{{' for a literal brace",
                                 text, index)
        if len(body) > MAX_LENGTH:
            raise ConditionError(f"placeholder {{{shown}}} is too long (limit {MAX_LENGTH})",
                                 text, index)
        try:
            root = Parser(text, index + 1, end).parse()
        except ConditionError as exc:
            raise ConditionError(f"in placeholder {{{shown}}}: {exc.message}", text,
                                 exc.position) from None
        expr = Expr(body, root, text)
        if literal:
            parts.append("".join(literal))
            literal = []
        parts.append(_Placeholder(expr, _unit_names(root)))
        index = end + 1
    if literal:
        parts.append("".join(literal))
    return Template(text, parts)


def _placeholder_end(text: str, start: int) -> int:
    """Index of the '}' closing the placeholder opened at ``start`` (braces in strings skip)."""
    quote = ""
    index = start + 1
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\":
                index += 2
                continue
            if char == quote:
                quote = ""
        elif char in ("'", '"'):
            quote = char
        elif char == "}":
            return index
        index += 1
    raise ConditionError("unterminated placeholder: '{' has no matching '}' (write '{{' for a "
                         "literal brace)", text, start)
