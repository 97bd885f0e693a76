"""The operators: truth (Kleene logic over :data:`UNKNOWN`), equality, membership, comparison
and bounded arithmetic. They raise :class:`Problem`; the tree says where.

May import :mod:`.values`, :mod:`.limits` and :mod:`.errors`.
"""

from __future__ import annotations

from typing import Final

from pytest_gputrain.engine.expr.errors import Problem
from pytest_gputrain.engine.expr.limits import MAX_BITS, MAX_DIGITS, MAX_STRING
from pytest_gputrain.engine.expr.values import (
    UNKNOWN,
    Unknown,
    Version,
    describe,
    is_number,
    type_name,
)


def truth_of(value: object) -> bool | Unknown:
    if value is UNKNOWN or value is None:
        return UNKNOWN
    if isinstance(value, bool):
        return value
    try:
        return bool(value)
    except Exception as exc:  # an exotic fact value whose __bool__ fails
        raise Problem(f"{describe(value)} has no truth value: {exc}") from None


def equal(left: object, right: object) -> bool:
    """``==`` as rules mean it: a boolean never equals a number; incomparable values differ."""
    if isinstance(left, bool) != isinstance(right, bool):
        return False  # true == 1 is a type confusion in a rule, never a match
    try:
        return bool(left == right)
    except (TypeError, ValueError):
        return False


def membership(container: object, item: object) -> object:
    if container is UNKNOWN or item is UNKNOWN:
        return UNKNOWN
    if isinstance(container, str):
        if not isinstance(item, str):
            raise Problem(
                f"a string contains only strings, got {describe(item)} in {describe(container)}"
            )
        return item in container
    if isinstance(container, list):
        unknown = False
        for element in container:
            if element is UNKNOWN or element is None:
                unknown = True
            elif equal(item, element):
                return True
        return UNKNOWN if unknown else False
    if isinstance(container, dict):
        try:
            return item in container
        except TypeError:  # unhashable item: cannot be a key
            return False
    raise Problem(f"expected a string, list or mapping to look in, got {describe(container)}")


_VERSION_HINT: Final = (
    "; to compare version strings use version(x) >= version('12.4'), major(x) or minor(x)"
)


def compare(op: str, left: object, right: object) -> object:
    if op in ("in", "not in"):
        found = membership(right, left)
        if found is UNKNOWN or op == "in":
            return found
        return found is False
    if left is UNKNOWN or right is UNKNOWN:
        return UNKNOWN
    if op == "==":
        return equal(left, right)
    if op == "!=":
        return not equal(left, right)
    both_numbers = is_number(left) and is_number(right)
    if both_numbers or (type(left), type(right)) in ((str, str), (Version, Version)):
        try:
            if op == "<":
                return bool(left < right)  # type: ignore[operator]
            if op == "<=":
                return bool(left <= right)  # type: ignore[operator]
            if op == ">":
                return bool(left > right)  # type: ignore[operator]
            return bool(left >= right)  # type: ignore[operator]
        except (TypeError, OverflowError) as exc:
            raise Problem(f"cannot compare with '{op}': {exc}") from None
    kinds = {type_name(left), type_name(right)}
    versionish = kinds & {"str", "version"} and (
        is_number(left) or is_number(right) or kinds == {"str", "version"}
    )
    hint = _VERSION_HINT if versionish else ""
    raise Problem(
        f"'{op}' is not supported between {describe(left)} and {describe(right)}{hint}"
    )


def bounded(value: int | float) -> int | float:
    # Without a bound, x * x * x ... over a large fact builds integers too big to print or
    # to compute with in reasonable time.
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise Problem(f"integer result has more than {MAX_DIGITS} digits")
    return value


def arith(op: str, left: object, right: object) -> object:
    if left is UNKNOWN or right is UNKNOWN:
        return UNKNOWN
    if op == "+" and isinstance(left, str) and isinstance(right, str):
        # As for integers: without a bound, s + s + s ... over a large fact copies gigabytes
        # (each '+' copies the whole result so far) and never finishes.
        if len(left) + len(right) > MAX_STRING:
            raise Problem(f"string result would be longer than {MAX_STRING} characters "
                          f"({len(left)} + {len(right)})")
        return left + right
    if is_number(left) and is_number(right):
        try:
            if op == "+":
                return bounded(left + right)
            if op == "-":
                return bounded(left - right)
            if op == "*":
                return bounded(left * right)
            if op == "/":
                return left / right
            if op == "//":
                return left // right
            return left % right
        except ZeroDivisionError:
            return UNKNOWN  # a ratio over an empty quantity says nothing either way
        except (OverflowError, ValueError) as exc:
            raise Problem(
                f"'{op}' failed for {describe(left)} and {describe(right)}: {exc}"
            ) from None
    raise Problem(f"'{op}' is not supported between {describe(left)} and {describe(right)}")
