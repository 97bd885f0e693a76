"""The functions rules may call (:data:`FUNCTIONS`), each described by a :class:`FunctionSpec`.

May import :mod:`.operations`, :mod:`.values`, :mod:`.limits` and :mod:`.errors`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

from pytest_gputrain.engine.expr.errors import Problem
from pytest_gputrain.engine.expr.limits import MAX_DIGITS
from pytest_gputrain.engine.expr.operations import bounded, equal, membership, truth_of
from pytest_gputrain.engine.expr.values import (
    DIGITS,
    UNKNOWN,
    Version,
    describe,
    is_number,
    parse_version,
)


@dataclass(frozen=True)
class FunctionSpec:
    """A function rules may call. Functions with ``propagates_unknown`` return UNKNOWN as soon
    as one argument is unknown, without calling ``impl``. ``gives`` says what a call gives,
    known before any fact is read: ``truth`` (true, false or unknown), ``argument`` (one of its
    arguments) or ``value`` (a number, a string or a list; a condition that is only such a call
    never fires)."""

    name: str
    signature: str
    doc: str
    min_args: int
    max_args: int | None
    impl: Callable[[Sequence[object]], object] = field(repr=False)
    propagates_unknown: bool = True
    gives: Literal["truth", "argument", "value"] = "value"


def _number_arg(value: object, what: str = "a number") -> int | float:
    if is_number(value):
        return value
    raise Problem(f"expected {what}, got {describe(value)}")


def _int_arg(value: object, what: str = "an integer") -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise Problem(f"expected {what}, got {describe(value)}")


def _str_arg(value: object, what: str = "a string") -> str:
    if isinstance(value, str):
        return value
    raise Problem(f"expected {what}, got {describe(value)}")


def _list_arg(value: object) -> list[object]:
    if isinstance(value, list):
        return value
    raise Problem(f"expected a list, got {describe(value)}")


def _fn_known(args: Sequence[object]) -> object:
    return args[0] is not UNKNOWN


def _fn_coalesce(args: Sequence[object]) -> object:
    return next((arg for arg in args if arg is not UNKNOWN), UNKNOWN)


def _fn_pick(args: Sequence[object]) -> object:
    value, choices = args[0], args[1:]
    if value is not UNKNOWN:
        for index in range(0, len(choices) - 1, 2):
            match = choices[index]
            if isinstance(match, list) and not isinstance(value, list):
                if any(equal(value, item) for item in match):
                    return choices[index + 1]
            elif equal(value, match):
                return choices[index + 1]
    return choices[-1] if len(choices) % 2 else UNKNOWN


def _fn_plural(args: Sequence[object]) -> object:
    count = _number_arg(args[0], "a count")
    one, many = _str_arg(args[1]), _str_arg(args[2])
    shown = str(int(count)) if float(count).is_integer() else f"{count:g}"
    return f"{shown} {one if count == 1 else many}"


def _fn_len(args: Sequence[object]) -> object:
    value = args[0]
    if isinstance(value, str | list | tuple | dict):
        return len(value)
    raise Problem(f"expected a string, list or mapping, got {describe(value)}")


def _comparable_kind(value: object) -> str:
    if is_number(value):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, Version):
        return "version"
    raise Problem(f"cannot order {describe(value)}")


def _extreme(args: Sequence[object], largest: bool) -> object:
    items: Sequence[object] = args
    if len(args) == 1 and isinstance(args[0], list):
        items = args[0]
    if not items:
        return UNKNOWN  # no values to choose from: a rule cannot conclude anything
    if any(item is UNKNOWN for item in items):
        return UNKNOWN
    kinds = {_comparable_kind(item) for item in items}
    if len(kinds) > 1:
        raise Problem(f"cannot compare {' with '.join(sorted(kinds))}")
    best = items[0]
    for item in items[1:]:
        if (item > best) if largest else (item < best):  # type: ignore[operator]
            best = item
    return best


def _fn_min(args: Sequence[object]) -> object:
    return _extreme(args, largest=False)


def _fn_max(args: Sequence[object]) -> object:
    return _extreme(args, largest=True)


def _fn_abs(args: Sequence[object]) -> object:
    return abs(_number_arg(args[0]))


def _fn_round(args: Sequence[object]) -> object:
    number = _number_arg(args[0])
    try:
        if len(args) == 1:
            return round(number)
        ndigits = _int_arg(args[1], "an integer number of digits")
        if abs(ndigits) > MAX_DIGITS:  # round(x, -10**9) would compute 10**(10**9)
            raise Problem(f"number of digits must lie within ±{MAX_DIGITS}, got {ndigits}")
        return round(number, ndigits)
    except (OverflowError, ValueError) as exc:  # round(inf), round(nan)
        raise Problem(f"cannot round {describe(number)}: {exc}") from None


def _fn_sum(args: Sequence[object]) -> object:
    items = _list_arg(args[0])
    total: int | float = 0
    unknown = False
    for item in items:
        if item is UNKNOWN:
            unknown = True
            continue
        try:
            total = bounded(total + _number_arg(item, "a list of numbers"))
        except OverflowError as exc:
            raise Problem(str(exc)) from None
    return UNKNOWN if unknown else total


def _fn_any(args: Sequence[object]) -> object:
    unknown = False
    for item in _list_arg(args[0]):
        truth = truth_of(item)
        if truth is True:
            return True
        unknown = unknown or truth is UNKNOWN
    return UNKNOWN if unknown else False


def _fn_all(args: Sequence[object]) -> object:
    unknown = False
    for item in _list_arg(args[0]):
        truth = truth_of(item)
        if truth is False:
            return False
        unknown = unknown or truth is UNKNOWN
    return UNKNOWN if unknown else True


def _fn_lower(args: Sequence[object]) -> object:
    return _str_arg(args[0]).lower()


def _fn_contains(args: Sequence[object]) -> object:
    return membership(args[0], args[1])


def _fn_startswith(args: Sequence[object]) -> object:
    text = _str_arg(args[0])
    prefix = args[1]
    if isinstance(prefix, list):
        prefixes = [_str_arg(item, "a string or a list of strings") for item in prefix]
        return any(text.startswith(item) for item in prefixes)
    return text.startswith(_str_arg(prefix, "a string or a list of strings"))


def _fn_version(args: Sequence[object]) -> object:
    return parse_version(args[0])


def _fn_major(args: Sequence[object]) -> object:
    value = args[0]
    if is_number(value):
        try:
            return int(value)
        except (OverflowError, ValueError) as exc:  # inf, nan
            raise Problem(f"no major version in {describe(value)}: {exc}") from None
    return parse_version(value).major


def _fn_minor(args: Sequence[object]) -> object:
    return parse_version(args[0]).minor


def _parse_arch(entry: str) -> tuple[str, int, int, str] | None:
    """'sm_86' -> ('sm', 8, 6, ''); 'compute_90a' -> ('compute', 9, 0, 'a'); else None."""
    text = entry.strip().lower()
    for kind in ("sm", "compute"):
        if text.startswith(kind + "_"):
            rest = text[len(kind) + 1:]
            break
    else:
        return None  # e.g. ROCm's 'gfx90a': not a CUDA architecture
    suffix = ""
    if rest[-1:] in ("a", "f"):
        rest, suffix = rest[:-1], rest[-1]
    if len(rest) < 2 or len(rest) > 4 or not all(ch in DIGITS for ch in rest):
        return None
    return kind, int(rest[:-1]), int(rest[-1]), suffix


def _fn_arch_supported(args: Sequence[object]) -> object:
    capability = parse_version(args[0])
    cap = (capability.major, capability.minor)
    for entry in _list_arg(args[1]):
        if not isinstance(entry, str):
            continue
        parsed = _parse_arch(entry)
        if parsed is None:
            continue
        kind, major, minor, suffix = parsed
        if suffix == "a":
            # Architecture-specific code ('sm_90a') runs on exactly that architecture.
            ok = (major, minor) == cap
        elif kind == "sm":
            # Cubins run on later minors of the same major (sm_80 on 8.6), never across majors.
            ok = major == cap[0] and minor <= cap[1]
        else:
            # PTX is compiled just in time for any equal or newer GPU.
            ok = (major, minor) <= cap
        if ok:
            return True
    return False


def _fn_bit(args: Sequence[object]) -> object:
    return (_int_arg(args[0]) & _int_arg(args[1], "an integer mask")) != 0


FUNCTIONS: Final[Mapping[str, FunctionSpec]] = MappingProxyType({
    spec.name: spec
    for spec in (
        FunctionSpec("known", "known(x)", "true when x has a value; never unknown itself",
                     1, 1, _fn_known, propagates_unknown=False, gives="truth"),
        FunctionSpec("coalesce", "coalesce(a, b, ...)",
                     "the first argument that is known (unknown if none is)",
                     1, None, _fn_coalesce, propagates_unknown=False, gives="argument"),
        FunctionSpec("pick", "pick(x, a, ra, b, rb, ..., otherwise)",
                     "ra when x == a (or x in a, a list), rb when x == b, ...; otherwise "
                     "(unknown if not given) when x matches none or is unknown: a message's "
                     "text for the value of a fact", 3, None, _fn_pick,
                     propagates_unknown=False),
        FunctionSpec("plural", "plural(n, one, many)",
                     "n and the word for it: plural(1, 'step', 'steps') == '1 step', "
                     "plural(25, 'step', 'steps') == '25 steps'", 3, 3, _fn_plural),
        FunctionSpec("len", "len(x)", "length of a string, list or mapping", 1, 1, _fn_len),
        FunctionSpec("min", "min(a, b, ...) or min(list)",
                     "smallest value (unknown for an empty list)", 1, None, _fn_min,
                     gives="argument"),
        FunctionSpec("max", "max(a, b, ...) or max(list)",
                     "largest value (unknown for an empty list)", 1, None, _fn_max,
                     gives="argument"),
        FunctionSpec("abs", "abs(x)", "absolute value", 1, 1, _fn_abs),
        FunctionSpec("round", "round(x[, n])", "x rounded to n digits (to an integer without n)",
                     1, 2, _fn_round),
        FunctionSpec("sum", "sum(list)", "sum of a list of numbers", 1, 1, _fn_sum),
        FunctionSpec("any", "any(list)", "true if any element is true (three-valued)",
                     1, 1, _fn_any, gives="truth"),
        FunctionSpec("all", "all(list)", "true if every element is true (three-valued)",
                     1, 1, _fn_all, gives="truth"),
        FunctionSpec("lower", "lower(s)", "s in lower case", 1, 1, _fn_lower),
        FunctionSpec("contains", "contains(haystack, needle)",
                     "substring of a string, element of a list or key of a mapping",
                     2, 2, _fn_contains, gives="truth"),
        FunctionSpec("startswith", "startswith(s, prefix)",
                     "s starts with prefix (or with one of a list of prefixes)",
                     2, 2, _fn_startswith, gives="truth"),
        FunctionSpec("version", "version(s)",
                     "a comparable version (PEP 440, local tag dropped): "
                     "version('2.11.0+cu130') == version('2.11') > version('2.11.0rc1')",
                     1, 1, _fn_version),
        FunctionSpec("major", "major(s)", "major version: major('13.0') == 13", 1, 1, _fn_major),
        FunctionSpec("minor", "minor(s)", "minor version: minor('12.4') == 4 (0 if absent)",
                     1, 1, _fn_minor),
        FunctionSpec("arch_supported", "arch_supported(capability, arch_list)",
                     "a GPU of this compute capability ('8.6') can run a build for arch_list "
                     "(['sm_80', 'compute_90']): same-major cubin or older-or-equal PTX",
                     2, 2, _fn_arch_supported, gives="truth"),
        FunctionSpec("bit", "bit(x, mask)", "x & mask != 0", 2, 2, _fn_bit, gives="truth"),
    )
})
