"""The values a condition computes with: :data:`UNKNOWN` (three-valued logic), :class:`Version`
(the project's one version type, from :mod:`pytest_gputrain.versions`), how facts come in
(:func:`normalize`) and go out (:func:`plain`), and how values are described in error messages.

May import :mod:`.limits` and :mod:`.errors`.
"""

from __future__ import annotations

import math
from typing import ClassVar, Final, TypeGuard

from pytest_gputrain import versions
from pytest_gputrain.engine.expr.errors import Problem
from pytest_gputrain.versions import Version as Version  # the rule language's version values

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
    if isinstance(value, list | tuple):
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
    """A version read from a version, a non-negative number or text ('v2.11.0+cu130').

    Text is read as far as it forms a version (see :func:`pytest_gputrain.versions.read_version`).
    """
    if isinstance(value, Version):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise Problem(f"cannot read a version from {describe(value)}")
    if isinstance(value, int | float) and not (math.isfinite(value) and value >= 0):
        raise Problem(f"cannot read a version from {describe(value)}")
    try:
        return versions.read_version(value if isinstance(value, str) else repr(value))
    except ValueError as exc:
        raise Problem(f"cannot read a version from {describe(value)}: {exc}") from None
