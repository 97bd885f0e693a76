"""The values a condition computes with: :data:`UNKNOWN` (three-valued logic), :class:`Version`,
how facts come in (:func:`normalize`) and go out (:func:`plain`), and how values are described
in error messages.

May import :mod:`.limits` and :mod:`.errors`.
"""

from __future__ import annotations

import math
from typing import ClassVar, Final, TypeGuard

from pytest_gputrain.engine.expr.errors import Problem
from pytest_gputrain.engine.expr.limits import MAX_DIGITS

DIGITS: Final = frozenset("0123456789")  # ASCII only: str.isdigit() also takes "²"


class Unknown:
    """The value of a fact nobody could measure. Use ``value is UNKNOWN`` to test for it."""

    __slots__ = ()
    _instance: ClassVar[Unknown | None] = None

    def __new__(cls) -> Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "unknown"

    def __bool__(self) -> bool:
        # "Unknown" is neither true nor false; a silent False would make rules pass by accident.
        raise TypeError("the unknown value has no truth value; test it with `is UNKNOWN`")

    def __reduce__(self) -> str:
        return "UNKNOWN"  # pickles (e.g. to xdist workers) as the module-level singleton

    def __copy__(self) -> Unknown:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Unknown:
        return self


UNKNOWN: Final = Unknown()


class Version(tuple[int, ...]):
    """What ``version()`` returns: comparable like a release number (``12.4 == 12.4.0``)."""

    __slots__ = ()

    def _key(self) -> tuple[int, ...]:
        # Trailing zeros do not change a version; stripping them makes (12, 4) == (12, 4, 0)
        # and keeps the order of zero-padded comparison.
        parts = tuple(self)
        while parts and parts[-1] == 0:
            parts = parts[:-1]
        return parts

    def __str__(self) -> str:
        return ".".join(str(part) for part in self)

    def __repr__(self) -> str:
        return f"version('{self}')"

    def __hash__(self) -> int:
        return hash(("version", self._key()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() >= other._key()


def is_number(value: object) -> TypeGuard[int | float]:
    # bool is an int to Python, but true + 1 in a rule is a mistake, not arithmetic.
    return isinstance(value, int | float) and not isinstance(value, bool)


def type_name(value: object) -> str:
    if value is UNKNOWN or value is None:
        return "unknown"
    if isinstance(value, Version):
        return "version"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


def short_repr(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        return f"<int of about {int(value.bit_length() * 0.30103)} digits>"
    try:
        text = repr(value)
    except ValueError:  # e.g. a list holding an int too large to print
        return f"<{type_name(value)}>"
    return text if len(text) <= 40 else text[:37] + "..."


def describe(value: object) -> str:
    if value is UNKNOWN or value is None:
        return "unknown"
    return f"{type_name(value)} ({short_repr(value)})"


def normalize(value: object) -> object:
    """A looked-up fact as the evaluator sees it: None is UNKNOWN, sequences are lists."""
    if value is None:
        return UNKNOWN
    if isinstance(value, list | tuple) and not isinstance(value, Version):
        return [UNKNOWN if item is None else item for item in value]
    return value


def plain(value: object) -> object:
    """A result as ``format_value`` expects it: None for unknown, versions as text."""
    if value is UNKNOWN:
        return None
    if isinstance(value, Version):
        return str(value)
    if isinstance(value, list):
        return [plain(item) if item is UNKNOWN or isinstance(item, Version) else item
                for item in value]
    return value


def parse_version(value: object) -> Version:
    """A version read from a version, a non-negative number or text ('v2.11.0+cu130')."""
    if isinstance(value, Version):
        return value
    if isinstance(value, bool):
        raise Problem(f"cannot read a version from {describe(value)}")
    if isinstance(value, int):
        if value < 0:
            raise Problem(f"cannot read a version from {describe(value)}")
        return Version((value,))
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise Problem(f"cannot read a version from {describe(value)}")
        text = repr(value)
    elif isinstance(value, str):
        text = value
    else:
        raise Problem(f"cannot read a version from {describe(value)}")
    text = text.strip()
    if text[:1] in ("v", "V"):
        text = text[1:]
    parts: list[int] = []
    index = 0
    # Leading dot-separated runs of digits; anything after ('+cu130', 'a0', '-rc1') is dropped.
    while True:
        end = index
        while end < len(text) and text[end] in DIGITS:
            end += 1
        if end == index:
            break
        if end - index > MAX_DIGITS:
            raise Problem(f"version component too long in {short_repr(value)}")
        parts.append(int(text[index:end]))
        if end + 1 < len(text) and text[end] == "." and text[end + 1] in DIGITS:
            index = end + 1
        else:
            break
    if not parts:
        raise Problem(f"cannot read a version from {describe(value)}")
    return Version(parts)
