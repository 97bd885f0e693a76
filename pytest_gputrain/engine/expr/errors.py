"""The language's errors: a bad condition or template, a failed evaluation, and the internal
:class:`Problem` that operations and functions raise for the tree to locate.

Imports nothing from the package.
"""

from __future__ import annotations


def _line_col(text: str, position: int) -> tuple[int, int]:
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    return line, column


def where(text: str, position: int) -> str:
    line, column = _line_col(text, position)
    return f"line {line}, column {column}" if "\n" in text else f"column {column}"


def _caret(text: str, position: int) -> str:
    """The line holding ``position`` and a caret under it (windowed when the line is long)."""
    start = text.rfind("\n", 0, position) + 1
    end = text.find("\n", position)
    end = len(text) if end < 0 else end
    line = "".join(ch if ch.isprintable() else " " if ch == "\t" else "?"
                   for ch in text[start:end])
    offset = position - start
    if len(line) > 100:
        first = max(0, offset - 50)
        last = min(len(line), first + 100)
        prefix = "..." if first > 0 else ""
        line = prefix + line[first:last] + ("..." if last < len(line) else "")
        offset = offset - first + len(prefix)
    return f"    {line}\n    {' ' * offset}^"


class ConditionError(ValueError):
    """A condition or template that is not valid; ``str()`` names the problem and the column."""

    def __init__(self, message: str, text: str | None = None, position: int = 0) -> None:
        super().__init__(message, text, position)  # args match __init__, so it pickles
        self.message = message
        self._located = text is not None  # None: the problem has no place in a text
        self.text = text or ""
        self.position = max(0, min(position, len(self.text)))
        self.line, self.column = _line_col(self.text, self.position)

    def __str__(self) -> str:
        if not self._located:
            return self.message
        return f"{where(self.text, self.position)}: {self.message}\n" + _caret(
            self.text, self.position
        )


class EvaluationError(ValueError):
    """A condition that is valid but cannot be evaluated on these facts (e.g. ``"a" < 3``)."""


class Problem(Exception):
    """Raised by operators and functions; nodes add where it happened."""
