"""The tokenizer: hand-written (no regular expressions), it turns text into numbers (with byte
units), strings, names, keywords and operators, and names the mistake when it cannot.

May import :mod:`.values`, :mod:`.limits`, :mod:`.errors` and :mod:`pytest_gputrain.units`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from pytest_gputrain.engine.expr.errors import ConditionError
from pytest_gputrain.engine.expr.limits import MAX_DIGITS
from pytest_gputrain.engine.expr.values import DIGITS
from pytest_gputrain.units import BYTE_UNIT_NAMES, BYTE_UNITS

_IDENT_START: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_IDENT_CHARS: Final = _IDENT_START | DIGITS
_SPACE: Final = frozenset(" \t\r\n")

_UNITS: Final[Mapping[str, int]] = MappingProxyType(BYTE_UNITS)
_UNIT_NAMES: Final = BYTE_UNIT_NAMES

_KEYWORDS: Final = frozenset(
    {"and", "or", "not", "in", "true", "false", "True", "False", "none", "null", "None"}
)
CONSTANTS: Final[Mapping[str, object]] = MappingProxyType({
    "true": True, "True": True, "false": False, "False": False,
})
NONE_WORDS: Final = frozenset({"none", "null", "None"})

# Token kinds, named as error messages show them
NUM, STR, NAME, KW, OP, END = "number", "string", "name", "keyword", "operator", "end"


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str  # as written
    value: object  # numbers and strings: the value
    position: int

    def describe(self) -> str:
        if self.kind == END:
            return "the end of the text"
        shown = self.text if len(self.text) <= 30 else self.text[:27] + "..."
        if self.kind == STR:
            return f"string {shown}"  # already quoted
        return f"{self.kind} '{shown}'" if self.kind in (NAME, NUM) else f"'{shown}'"


_OPERATORS_2: Final = frozenset({"==", "!=", "<=", ">=", "//"})
_OPERATORS_1: Final = frozenset("<>+-*/%()[],")
_BAD_OPERATORS: Final[Mapping[str, str]] = MappingProxyType({
    "**": "there is no exponent operator",
    "&&": "use 'and' instead of '&&'",
    "||": "use 'or' instead of '||'",
    "=": "'=' is not a comparison; use '=='",
    "!": "use 'not' (or '!=' for inequality)",
    "&": "bitwise operators are not supported; use bit(x, mask)",
    "|": "bitwise operators are not supported; use bit(x, mask)",
    "^": "bitwise operators are not supported; use bit(x, mask)",
    "~": "bitwise operators are not supported; use bit(x, mask)",
    ".": "unexpected '.': dots only join the parts of a fact name (no attribute access)",
    ":": "unexpected ':' (there are no slices, lambdas or format specifications)",
})
_ESCAPES: Final[Mapping[str, str]] = MappingProxyType(
    {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t"}
)


class Tokenizer:
    """The tokens of ``text[start:end]``; positions count from the start of ``text``."""

    def __init__(self, text: str, start: int, end: int) -> None:
        self.text = text
        self.end = end
        self.index = start

    def fail(self, message: str, position: int) -> ConditionError:
        return ConditionError(message, self.text, position)

    def tokens(self) -> list[Token]:
        result: list[Token] = []
        text, end = self.text, self.end
        while True:
            while self.index < end and text[self.index] in _SPACE:
                self.index += 1
            if self.index >= end:
                result.append(Token(END, "", None, end))
                return result
            char = text[self.index]
            nxt = text[self.index + 1] if self.index + 1 < end else ""
            if char in DIGITS or (char == "." and nxt in DIGITS):
                result.append(self.number())
            elif char in _IDENT_START:
                result.append(self.word())
            elif char in ("'", '"'):
                result.append(self.string())
            else:
                result.append(self.operator())

    def number(self) -> Token:
        text, end, start = self.text, self.end, self.index
        pos = start
        while pos < end and text[pos] in DIGITS:
            pos += 1
        is_float = False
        if pos + 1 < end and text[pos] == "." and text[pos + 1] in DIGITS:
            pos += 1
            while pos < end and text[pos] in DIGITS:
                pos += 1
            is_float = True
        if pos < end and text[pos] in "eE":
            exp = pos + 1
            if exp < end and text[exp] in "+-":
                exp += 1
            if exp < end and text[exp] in DIGITS:
                pos = exp
                while pos < end and text[pos] in DIGITS:
                    pos += 1
                is_float = True
        literal = text[start:pos]
        if pos + 1 < end and text[pos] == "." and text[pos + 1] in DIGITS:
            # '580.159.04' is a version, not a number; say so rather than "unexpected number".
            stop = pos
            while stop < end and (text[stop] in DIGITS or text[stop] == "."):
                stop += 1
            shown = text[start:stop]
            raise self.fail(
                f"'{shown}' is not a number; to compare versions write version('{shown}')", start
            )
        if sum(ch in DIGITS for ch in literal) > MAX_DIGITS:
            raise self.fail(f"number has more than {MAX_DIGITS} digits", start)
        value: int | float
        if is_float:
            value = float(literal)
            if not math.isfinite(value):
                raise self.fail(f"number out of range: {literal}", start)
        else:
            value = int(literal)
        self.index = pos
        # A unit may follow, glued ('512MiB') or spaced ('1.5 GiB'): a number followed by a
        # name is otherwise never valid, so this cannot change the meaning of a valid text.
        glued = pos < end and text[pos] in _IDENT_CHARS
        while pos < end and text[pos] in _SPACE:
            pos += 1
        if pos < end and text[pos] in _IDENT_START:
            stop = pos
            while stop < end and text[stop] in _IDENT_CHARS:
                stop += 1
            word = text[pos:stop]
            dotted = stop < end and text[stop] == "."
            if word.lower() in _UNITS and (glued or not dotted):
                factor = _UNITS[word.lower()]
                if isinstance(value, int):
                    value = value * factor
                else:
                    scaled = value * factor
                    if not math.isfinite(scaled):
                        raise self.fail(f"size out of range: {text[start:stop]}", start)
                    value = round(scaled)
                self.index = stop
                return Token(NUM, text[start:stop], value, start)
            if glued:
                raise self.fail(
                    f"unknown unit '{word}' after the number {literal} (units: {_UNIT_NAMES})",
                    pos,
                )
        return Token(NUM, literal, value, start)

    def word(self) -> Token:
        text, end, start = self.text, self.end, self.index
        parts: list[tuple[str, int]] = []
        pos = start
        while True:
            part_start = pos
            while pos < end and text[pos] in _IDENT_CHARS:
                pos += 1
            parts.append((text[part_start:pos], part_start))
            if pos < end and text[pos] == ".":
                if pos + 1 < end and text[pos + 1] in _IDENT_START:
                    pos += 1
                    continue
                raise self.fail(f"expected a name after '{text[start:pos + 1]}'", pos + 1)
            break
        for part, part_start in parts:
            if part.startswith("__"):
                raise self.fail(f"names starting with '__' are not allowed: '{part}'", part_start)
        self.index = pos
        name = text[start:pos]
        if len(parts) == 1 and name in _KEYWORDS:
            return Token(KW, name, None, start)
        if parts[0][0] in _KEYWORDS:
            raise self.fail(f"'{parts[0][0]}' is a keyword and cannot start a fact name", start)
        return Token(NAME, name, name, start)

    def string(self) -> Token:
        text, end, start = self.text, self.end, self.index
        quote = text[start]
        chars: list[str] = []
        pos = start + 1
        while True:
            if pos >= end or text[pos] == "\n":
                raise self.fail(f"unterminated string: no closing {quote}", start)
            char = text[pos]
            if char == quote:
                pos += 1
                break
            if char == "\\":
                escaped = text[pos + 1] if pos + 1 < end else ""
                if escaped not in _ESCAPES:
                    raise self.fail(
                        "unknown escape in string; use \\\\ for a backslash, \\' or \\\" for a "
                        "quote, \\n or \\t",
                        pos,
                    )
                chars.append(_ESCAPES[escaped])
                pos += 2
                continue
            chars.append(char)
            pos += 1
        self.index = pos
        return Token(STR, text[start:pos], "".join(chars), start)

    def operator(self) -> Token:
        text, start = self.text, self.index
        two = text[start:min(start + 2, self.end)]
        one = text[start]
        if two in _OPERATORS_2:
            self.index += 2
            return Token(OP, two, None, start)
        if two in _BAD_OPERATORS:
            raise self.fail(_BAD_OPERATORS[two], start)
        if one in _OPERATORS_1:
            self.index += 1
            return Token(OP, one, None, start)
        if one in _BAD_OPERATORS:
            raise self.fail(_BAD_OPERATORS[one], start)
        raise self.fail(f"unexpected character {one!r}", start)
