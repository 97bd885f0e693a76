"""Rule conditions and message templates: a small expression language that is safe by design.

Rule files come from users' projects, so nothing here hands user text to Python: a hand-written
tokenizer and Pratt parser build a tree, and a tree walker evaluates it over *facts* (dotted
names such as ``device.memory_used``). Bad input raises :class:`ConditionError` with a column
and a caret line; type errors while evaluating raise :class:`EvaluationError`.

Grammar, lowest precedence first::

    expr     := or
    or       := and ("or" and)*
    and      := not ("and" not)*
    not      := "not" not | compare
    compare  := sum (("==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "not" "in") sum)*
    sum      := product (("+" | "-") product)*
    product  := unary (("*" | "/" | "//" | "%") unary)*
    unary    := "-" unary | primary
    primary  := number [unit] | string | "true" | "false" | "none" | "null"
              | name | function "(" [expr ("," expr)* [","]] ")"
              | "[" [expr ("," expr)* [","]] "]" | "(" expr ")"

Unknown facts follow three-valued (Kleene) logic: see :data:`UNKNOWN`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Final, Literal, TypeGuard

from pytest_gputrain.units import BYTE_UNIT_NAMES, BYTE_UNITS

__all__ = [
    "FUNCTIONS",
    "MAX_DEPTH",
    "MAX_LENGTH",
    "MAX_STRING",
    "UNKNOWN",
    "ConditionError",
    "EvaluationError",
    "Expr",
    "FunctionSpec",
    "Template",
    "Version",
    "parse",
    "parse_template",
]

MAX_LENGTH: Final = 4000  # characters in one condition or placeholder
MAX_DEPTH: Final = 64  # nesting levels; bounds recursion in the parser and the evaluator alike
MAX_DIGITS: Final = 400  # digits in one number literal (and in round()'s ndigits)
MAX_ITEMS: Final = 1000  # elements of a list literal / arguments of a call
_MAX_BITS: Final = 1400  # integer results: a little over MAX_DIGITS decimal digits
MAX_STRING: Final = 100_000  # characters in a string result ('+' is the only op that grows one)

_DIGITS: Final = frozenset("0123456789")
_IDENT_START: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_IDENT_CHARS: Final = _IDENT_START | _DIGITS
_SPACE: Final = frozenset(" \t\r\n")

_UNITS: Final[Mapping[str, int]] = MappingProxyType(BYTE_UNITS)
_UNIT_NAMES: Final = BYTE_UNIT_NAMES

_KEYWORDS: Final = frozenset(
    {"and", "or", "not", "in", "true", "false", "True", "False", "none", "null", "None"}
)
_CONSTANTS: Final[Mapping[str, object]] = MappingProxyType({
    "true": True, "True": True, "false": False, "False": False,
})
_NONE_WORDS: Final = frozenset({"none", "null", "None"})


# --------------------------------------------------------------------------------------------
# Values


class _Unknown:
    """The value of a fact nobody could measure. Use ``value is UNKNOWN`` to test for it."""

    __slots__ = ()
    _instance: ClassVar[_Unknown | None] = None

    def __new__(cls) -> _Unknown:
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

    def __copy__(self) -> _Unknown:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> _Unknown:
        return self


UNKNOWN: Final = _Unknown()


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


def _is_number(value: object) -> TypeGuard[int | float]:
    # bool is an int to Python, but true + 1 in a rule is a mistake, not arithmetic.
    return isinstance(value, int | float) and not isinstance(value, bool)


def _type_name(value: object) -> str:
    if value is UNKNOWN or value is None:
        return "unknown"
    if isinstance(value, Version):
        return "version"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


def _short_repr(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        return f"<int of about {int(value.bit_length() * 0.30103)} digits>"
    try:
        text = repr(value)
    except ValueError:  # e.g. a list holding an int too large to print
        return f"<{_type_name(value)}>"
    return text if len(text) <= 40 else text[:37] + "..."


def _describe(value: object) -> str:
    if value is UNKNOWN or value is None:
        return "unknown"
    return f"{_type_name(value)} ({_short_repr(value)})"


def _normalize(value: object) -> object:
    """A looked-up fact as the evaluator sees it: None is UNKNOWN, sequences are lists."""
    if value is None:
        return UNKNOWN
    if isinstance(value, list | tuple) and not isinstance(value, Version):
        return [UNKNOWN if item is None else item for item in value]
    return value


def _plain(value: object) -> object:
    """A result as ``format_value`` expects it: None for unknown, versions as text."""
    if value is UNKNOWN:
        return None
    if isinstance(value, Version):
        return str(value)
    if isinstance(value, list):
        return [_plain(item) if item is UNKNOWN or isinstance(item, Version) else item
                for item in value]
    return value


# --------------------------------------------------------------------------------------------
# Errors


def _line_col(text: str, position: int) -> tuple[int, int]:
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    return line, column


def _where(text: str, position: int) -> str:
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
        return f"{_where(self.text, self.position)}: {self.message}\n" + _caret(
            self.text, self.position
        )


class EvaluationError(ValueError):
    """A condition that is valid but cannot be evaluated on these facts (e.g. ``"a" < 3``)."""


class _Problem(Exception):
    """Raised by operators and functions; nodes add where it happened."""


# --------------------------------------------------------------------------------------------
# Functions


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
    if _is_number(value):
        return value
    raise _Problem(f"expected {what}, got {_describe(value)}")


def _int_arg(value: object, what: str = "an integer") -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _Problem(f"expected {what}, got {_describe(value)}")


def _str_arg(value: object, what: str = "a string") -> str:
    if isinstance(value, str):
        return value
    raise _Problem(f"expected {what}, got {_describe(value)}")


def _list_arg(value: object) -> list[object]:
    if isinstance(value, list):
        return value
    raise _Problem(f"expected a list, got {_describe(value)}")


def _parse_version(value: object) -> Version:
    if isinstance(value, Version):
        return value
    if isinstance(value, bool):
        raise _Problem(f"cannot read a version from {_describe(value)}")
    if isinstance(value, int):
        if value < 0:
            raise _Problem(f"cannot read a version from {_describe(value)}")
        return Version((value,))
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise _Problem(f"cannot read a version from {_describe(value)}")
        text = repr(value)
    elif isinstance(value, str):
        text = value
    else:
        raise _Problem(f"cannot read a version from {_describe(value)}")
    text = text.strip()
    if text[:1] in ("v", "V"):
        text = text[1:]
    parts: list[int] = []
    index = 0
    # Leading dot-separated runs of digits; anything after ('+cu130', 'a0', '-rc1') is dropped.
    while True:
        end = index
        while end < len(text) and text[end] in _DIGITS:
            end += 1
        if end == index:
            break
        if end - index > MAX_DIGITS:
            raise _Problem(f"version component too long in {_short_repr(value)}")
        parts.append(int(text[index:end]))
        if end + 1 < len(text) and text[end] == "." and text[end + 1] in _DIGITS:
            index = end + 1
        else:
            break
    if not parts:
        raise _Problem(f"cannot read a version from {_describe(value)}")
    return Version(parts)


def _fn_known(args: Sequence[object]) -> object:
    return args[0] is not UNKNOWN


def _fn_coalesce(args: Sequence[object]) -> object:
    return next((arg for arg in args if arg is not UNKNOWN), UNKNOWN)


def _fn_len(args: Sequence[object]) -> object:
    value = args[0]
    if isinstance(value, str | list | tuple | dict):
        return len(value)
    raise _Problem(f"expected a string, list or mapping, got {_describe(value)}")


def _comparable_kind(value: object) -> str:
    if _is_number(value):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, Version):
        return "version"
    raise _Problem(f"cannot order {_describe(value)}")


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
        raise _Problem(f"cannot compare {' with '.join(sorted(kinds))}")
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
            raise _Problem(f"number of digits must lie within ±{MAX_DIGITS}, got {ndigits}")
        return round(number, ndigits)
    except (OverflowError, ValueError) as exc:  # round(inf), round(nan)
        raise _Problem(f"cannot round {_describe(number)}: {exc}") from None


def _fn_sum(args: Sequence[object]) -> object:
    items = _list_arg(args[0])
    total: int | float = 0
    unknown = False
    for item in items:
        if item is UNKNOWN:
            unknown = True
            continue
        try:
            total = _bounded(total + _number_arg(item, "a list of numbers"))
        except OverflowError as exc:
            raise _Problem(str(exc)) from None
    return UNKNOWN if unknown else total


def _fn_any(args: Sequence[object]) -> object:
    unknown = False
    for item in _list_arg(args[0]):
        truth = _truth(item)
        if truth is True:
            return True
        unknown = unknown or truth is UNKNOWN
    return UNKNOWN if unknown else False


def _fn_all(args: Sequence[object]) -> object:
    unknown = False
    for item in _list_arg(args[0]):
        truth = _truth(item)
        if truth is False:
            return False
        unknown = unknown or truth is UNKNOWN
    return UNKNOWN if unknown else True


def _fn_lower(args: Sequence[object]) -> object:
    return _str_arg(args[0]).lower()


def _fn_contains(args: Sequence[object]) -> object:
    return _membership(args[0], args[1])


def _fn_startswith(args: Sequence[object]) -> object:
    text = _str_arg(args[0])
    prefix = args[1]
    if isinstance(prefix, list):
        prefixes = [_str_arg(item, "a string or a list of strings") for item in prefix]
        return any(text.startswith(item) for item in prefixes)
    return text.startswith(_str_arg(prefix, "a string or a list of strings"))


def _fn_version(args: Sequence[object]) -> object:
    return _parse_version(args[0])


def _fn_major(args: Sequence[object]) -> object:
    value = args[0]
    if _is_number(value):
        try:
            return int(value)
        except (OverflowError, ValueError) as exc:  # inf, nan
            raise _Problem(f"no major version in {_describe(value)}: {exc}") from None
    return _parse_version(value)[0]


def _fn_minor(args: Sequence[object]) -> object:
    parts = _parse_version(args[0])
    return parts[1] if len(parts) > 1 else 0


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
    if len(rest) < 2 or len(rest) > 4 or not all(ch in _DIGITS for ch in rest):
        return None
    return kind, int(rest[:-1]), int(rest[-1]), suffix


def _fn_arch_supported(args: Sequence[object]) -> object:
    capability = _parse_version(args[0])
    cap = (capability[0], capability[1] if len(capability) > 1 else 0)
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
                     "a comparable version: version('2.11.0+cu130') == version('2.11')",
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


# --------------------------------------------------------------------------------------------
# Operators


def _truth(value: object) -> bool | _Unknown:
    if value is UNKNOWN or value is None:
        return UNKNOWN
    if isinstance(value, bool):
        return value
    try:
        return bool(value)
    except Exception as exc:  # an exotic fact value whose __bool__ fails
        raise _Problem(f"{_describe(value)} has no truth value: {exc}") from None


def _equal(left: object, right: object) -> bool:
    if isinstance(left, bool) != isinstance(right, bool):
        return False  # true == 1 is a type confusion in a rule, never a match
    try:
        return bool(left == right)
    except (TypeError, ValueError):
        return False


def _membership(container: object, item: object) -> object:
    if container is UNKNOWN or item is UNKNOWN:
        return UNKNOWN
    if isinstance(container, str):
        if not isinstance(item, str):
            raise _Problem(
                f"a string contains only strings, got {_describe(item)} in {_describe(container)}"
            )
        return item in container
    if isinstance(container, list):
        unknown = False
        for element in container:
            if element is UNKNOWN or element is None:
                unknown = True
            elif _equal(item, element):
                return True
        return UNKNOWN if unknown else False
    if isinstance(container, dict):
        try:
            return item in container
        except TypeError:  # unhashable item: cannot be a key
            return False
    raise _Problem(f"expected a string, list or mapping to look in, got {_describe(container)}")


_VERSION_HINT: Final = (
    "; to compare version strings use version(x) >= version('12.4'), major(x) or minor(x)"
)


def _compare(op: str, left: object, right: object) -> object:
    if op in ("in", "not in"):
        found = _membership(right, left)
        if found is UNKNOWN or op == "in":
            return found
        return found is False
    if left is UNKNOWN or right is UNKNOWN:
        return UNKNOWN
    if op == "==":
        return _equal(left, right)
    if op == "!=":
        return not _equal(left, right)
    both_numbers = _is_number(left) and _is_number(right)
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
            raise _Problem(f"cannot compare with '{op}': {exc}") from None
    kinds = {_type_name(left), _type_name(right)}
    versionish = kinds & {"str", "version"} and (
        _is_number(left) or _is_number(right) or kinds == {"str", "version"}
    )
    hint = _VERSION_HINT if versionish else ""
    raise _Problem(
        f"'{op}' is not supported between {_describe(left)} and {_describe(right)}{hint}"
    )


def _bounded(value: int | float) -> int | float:
    # Without a bound, x * x * x ... over a large fact builds integers too big to print or
    # to compute with in reasonable time.
    if isinstance(value, int) and value.bit_length() > _MAX_BITS:
        raise _Problem(f"integer result has more than {MAX_DIGITS} digits")
    return value


def _arith(op: str, left: object, right: object) -> object:
    if left is UNKNOWN or right is UNKNOWN:
        return UNKNOWN
    if op == "+" and isinstance(left, str) and isinstance(right, str):
        # As for integers: without a bound, s + s + s ... over a large fact copies gigabytes
        # (each '+' copies the whole result so far) and never finishes.
        if len(left) + len(right) > MAX_STRING:
            raise _Problem(f"string result would be longer than {MAX_STRING} characters "
                           f"({len(left)} + {len(right)})")
        return left + right
    if _is_number(left) and _is_number(right):
        try:
            if op == "+":
                return _bounded(left + right)
            if op == "-":
                return _bounded(left - right)
            if op == "*":
                return _bounded(left * right)
            if op == "/":
                return left / right
            if op == "//":
                return left // right
            return left % right
        except ZeroDivisionError:
            return UNKNOWN  # a ratio over an empty quantity says nothing either way
        except (OverflowError, ValueError) as exc:
            raise _Problem(
                f"'{op}' failed for {_describe(left)} and {_describe(right)}: {exc}"
            ) from None
    raise _Problem(f"'{op}' is not supported between {_describe(left)} and {_describe(right)}")


# --------------------------------------------------------------------------------------------
# Syntax tree


class _Context:
    __slots__ = ("lookup", "text")

    def __init__(self, lookup: Callable[[str], object], text: str) -> None:
        self.lookup = lookup
        self.text = text

    def error(self, problem: _Problem | str, position: int, prefix: str = "") -> EvaluationError:
        return EvaluationError(f"{prefix}{problem} ({_where(self.text, position)})")


class _Node:
    __slots__ = ()

    def compute(self, ctx: _Context) -> object:
        raise NotImplementedError

    def collect(self, names: set[str]) -> None:
        pass


@dataclass(frozen=True, slots=True)
class _Literal(_Node):
    value: object

    def compute(self, ctx: _Context) -> object:
        return self.value


@dataclass(frozen=True, slots=True)
class _Name(_Node):
    name: str
    position: int

    def compute(self, ctx: _Context) -> object:
        try:
            value = ctx.lookup(self.name)
        except KeyError:
            raise ctx.error(f"unknown fact '{self.name}'", self.position) from None
        return _normalize(value)

    def collect(self, names: set[str]) -> None:
        names.add(self.name)


@dataclass(frozen=True, slots=True)
class _List(_Node):
    items: tuple[_Node, ...]

    def compute(self, ctx: _Context) -> object:
        return [item.compute(ctx) for item in self.items]

    def collect(self, names: set[str]) -> None:
        for item in self.items:
            item.collect(names)


@dataclass(frozen=True, slots=True)
class _Not(_Node):
    operand: _Node
    position: int

    def compute(self, ctx: _Context) -> object:
        try:
            truth = _truth(self.operand.compute(ctx))
        except _Problem as problem:
            raise ctx.error(problem, self.position, "'not': ") from None
        return UNKNOWN if truth is UNKNOWN else not truth

    def collect(self, names: set[str]) -> None:
        self.operand.collect(names)


@dataclass(frozen=True, slots=True)
class _Negate(_Node):
    operand: _Node
    position: int

    def compute(self, ctx: _Context) -> object:
        value = self.operand.compute(ctx)
        if value is UNKNOWN:
            return UNKNOWN
        if _is_number(value):
            return -value
        raise ctx.error(f"unary '-' is not supported for {_describe(value)}", self.position)

    def collect(self, names: set[str]) -> None:
        self.operand.collect(names)


@dataclass(frozen=True, slots=True)
class _Logic(_Node):
    """``a and b and c`` / ``a or b or c`` as one node: Kleene logic, short-circuit."""

    op: str
    operands: tuple[_Node, ...]
    positions: tuple[int, ...]  # per operand, the operator before it (the first: after it)

    def compute(self, ctx: _Context) -> object:
        decisive = self.op == "or"  # the value that settles the result: True for or
        unknown = False
        for operand, position in zip(self.operands, self.positions, strict=True):
            try:
                truth = _truth(operand.compute(ctx))
            except _Problem as problem:
                raise ctx.error(problem, position, f"'{self.op}': ") from None
            if truth is UNKNOWN:
                unknown = True
            elif truth is decisive:
                return decisive
        return UNKNOWN if unknown else not decisive

    def collect(self, names: set[str]) -> None:
        for operand in self.operands:
            operand.collect(names)


@dataclass(frozen=True, slots=True)
class _Compare(_Node):
    """A comparison chain: ``a < b < c`` is ``a < b and b < c`` with b evaluated once."""

    first: _Node
    rest: tuple[tuple[str, _Node, int], ...]

    def compute(self, ctx: _Context) -> object:
        left = self.first.compute(ctx)
        unknown = False
        for op, node, position in self.rest:
            right = node.compute(ctx)
            try:
                result = _compare(op, left, right)
            except _Problem as problem:
                raise ctx.error(problem, position) from None
            if result is False:
                return False
            unknown = unknown or result is UNKNOWN
            left = right
        return UNKNOWN if unknown else True

    def collect(self, names: set[str]) -> None:
        self.first.collect(names)
        for _, node, _ in self.rest:
            node.collect(names)


@dataclass(frozen=True, slots=True)
class _Arith(_Node):
    """A left-associative run of one precedence level, evaluated in a loop (not recursion)."""

    first: _Node
    rest: tuple[tuple[str, _Node, int], ...]

    def compute(self, ctx: _Context) -> object:
        value = self.first.compute(ctx)
        for op, node, position in self.rest:
            right = node.compute(ctx)
            try:
                value = _arith(op, value, right)
            except _Problem as problem:
                raise ctx.error(problem, position) from None
        return value

    def collect(self, names: set[str]) -> None:
        self.first.collect(names)
        for _, node, _ in self.rest:
            node.collect(names)


@dataclass(frozen=True, slots=True)
class _Call(_Node):
    function: FunctionSpec
    args: tuple[_Node, ...]
    position: int

    def compute(self, ctx: _Context) -> object:
        spec = self.function
        if spec.name == "coalesce":  # lazy: later arguments are not evaluated once one is known
            for arg in self.args:
                value = arg.compute(ctx)
                if value is not UNKNOWN:
                    return value
            return UNKNOWN
        values = [arg.compute(ctx) for arg in self.args]
        if spec.propagates_unknown and any(value is UNKNOWN for value in values):
            return UNKNOWN
        try:
            return spec.impl(values)
        except _Problem as problem:
            raise ctx.error(problem, self.position, f"{spec.name}(): ") from None

    def collect(self, names: set[str]) -> None:
        for arg in self.args:
            arg.collect(names)


# What a node gives, known before any fact is read: a rule's condition must give true or false
# (or unknown), and one that can only give a number, a string or a list never fires.
def _gives_truth(node: _Node) -> bool | None:
    """True: always true, false or unknown; False: never; None: it depends on the facts."""
    if isinstance(node, _Logic | _Not | _Compare):
        return True
    if isinstance(node, _Literal):
        return isinstance(node.value, bool) or node.value is None
    if isinstance(node, _Call):
        if node.function.gives == "truth":
            return True
        if node.function.gives == "argument":
            kinds = {_gives_truth(arg) for arg in node.args}
            return kinds.pop() if len(kinds) == 1 else None
        return False
    if isinstance(node, _Arith | _Negate | _List):
        return False
    return None  # a fact: its value decides


# --------------------------------------------------------------------------------------------
# Tokenizer

_NUM, _STR, _NAME, _KW, _OP, _END = "number", "string", "name", "keyword", "operator", "end"


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str  # as written
    value: object  # numbers and strings: the value
    position: int

    def describe(self) -> str:
        if self.kind == _END:
            return "the end of the text"
        shown = self.text if len(self.text) <= 30 else self.text[:27] + "..."
        if self.kind == _STR:
            return f"string {shown}"  # already quoted
        return f"{self.kind} '{shown}'" if self.kind in (_NAME, _NUM) else f"'{shown}'"


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


class _Tokenizer:
    def __init__(self, text: str, start: int, end: int) -> None:
        self.text = text
        self.end = end
        self.index = start

    def fail(self, message: str, position: int) -> ConditionError:
        return ConditionError(message, self.text, position)

    def tokens(self) -> list[_Token]:
        result: list[_Token] = []
        text, end = self.text, self.end
        while True:
            while self.index < end and text[self.index] in _SPACE:
                self.index += 1
            if self.index >= end:
                result.append(_Token(_END, "", None, end))
                return result
            char = text[self.index]
            nxt = text[self.index + 1] if self.index + 1 < end else ""
            if char in _DIGITS or (char == "." and nxt in _DIGITS):
                result.append(self.number())
            elif char in _IDENT_START:
                result.append(self.word())
            elif char in ("'", '"'):
                result.append(self.string())
            else:
                result.append(self.operator())

    def number(self) -> _Token:
        text, end, start = self.text, self.end, self.index
        pos = start
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        is_float = False
        if pos + 1 < end and text[pos] == "." and text[pos + 1] in _DIGITS:
            pos += 1
            while pos < end and text[pos] in _DIGITS:
                pos += 1
            is_float = True
        if pos < end and text[pos] in "eE":
            exp = pos + 1
            if exp < end and text[exp] in "+-":
                exp += 1
            if exp < end and text[exp] in _DIGITS:
                pos = exp
                while pos < end and text[pos] in _DIGITS:
                    pos += 1
                is_float = True
        literal = text[start:pos]
        if pos + 1 < end and text[pos] == "." and text[pos + 1] in _DIGITS:
            # '580.159.04' is a version, not a number; say so rather than "unexpected number".
            stop = pos
            while stop < end and (text[stop] in _DIGITS or text[stop] == "."):
                stop += 1
            shown = text[start:stop]
            raise self.fail(
                f"'{shown}' is not a number; to compare versions write version('{shown}')", start
            )
        if sum(ch in _DIGITS for ch in literal) > MAX_DIGITS:
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
                return _Token(_NUM, text[start:stop], value, start)
            if glued:
                raise self.fail(
                    f"unknown unit '{word}' after the number {literal} (units: {_UNIT_NAMES})",
                    pos,
                )
        return _Token(_NUM, literal, value, start)

    def word(self) -> _Token:
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
            return _Token(_KW, name, None, start)
        if parts[0][0] in _KEYWORDS:
            raise self.fail(f"'{parts[0][0]}' is a keyword and cannot start a fact name", start)
        return _Token(_NAME, name, name, start)

    def string(self) -> _Token:
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
        return _Token(_STR, text[start:pos], "".join(chars), start)

    def operator(self) -> _Token:
        text, start = self.text, self.index
        two = text[start:min(start + 2, self.end)]
        one = text[start]
        if two in _OPERATORS_2:
            self.index += 2
            return _Token(_OP, two, None, start)
        if two in _BAD_OPERATORS:
            raise self.fail(_BAD_OPERATORS[two], start)
        if one in _OPERATORS_1:
            self.index += 1
            return _Token(_OP, one, None, start)
        if one in _BAD_OPERATORS:
            raise self.fail(_BAD_OPERATORS[one], start)
        raise self.fail(f"unexpected character {one!r}", start)


# --------------------------------------------------------------------------------------------
# Parser (Pratt): binding powers, lowest first

_BP_OR, _BP_AND, _BP_NOT, _BP_CMP, _BP_ADD, _BP_MUL, _BP_UNARY = 10, 20, 30, 40, 50, 60, 70
_CMP_OPS: Final = frozenset({"==", "!=", "<", "<=", ">", ">="})
_ADD_OPS: Final = frozenset({"+", "-"})
_MUL_OPS: Final = frozenset({"*", "/", "//", "%"})


def _arity(spec: FunctionSpec) -> str:
    if spec.max_args is None:
        return f"at least {spec.min_args} argument{'s' if spec.min_args != 1 else ''}"
    if spec.min_args == spec.max_args:
        return f"{spec.min_args} argument{'s' if spec.min_args != 1 else ''}"
    return f"{spec.min_args} to {spec.max_args} arguments"


class _Parser:
    def __init__(self, text: str, start: int, end: int) -> None:
        self.text = text
        self.tokens = _Tokenizer(text, start, end).tokens()
        self.index = 0
        self.depth = 0

    def fail(self, message: str, position: int) -> ConditionError:
        return ConditionError(message, self.text, position)

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.index + ahead, len(self.tokens) - 1)]

    def advance(self) -> _Token:
        token = self.tokens[self.index]
        if token.kind != _END:
            self.index += 1
        return token

    def is_op(self, token: _Token, *texts: str) -> bool:
        return token.kind == _OP and token.text in texts

    def parse(self) -> _Node:
        if self.peek().kind == _END:
            raise self.fail("empty condition", 0)
        node = self.expression(0)
        token = self.peek()
        if token.kind != _END:
            raise self.unexpected(token, "the end of the condition")
        return node

    def unexpected(self, token: _Token, expected: str) -> ConditionError:
        """``token`` follows a complete expression where ``expected`` should."""
        if self.is_op(token, "("):
            return self.fail("only the built-in functions can be called (by their bare name)",
                             token.position)
        if self.is_op(token, "["):
            return self.fail("subscripts ('x[...]') are not supported", token.position)
        if token.kind == _NAME and token.text == "is":
            return self.fail("'is' is not supported; use '==' or '!=' (and known(x) to test "
                             "whether x has a value)", token.position)
        if token.kind in (_NAME, _NUM, _STR) or token.text in _CONSTANTS or (
            token.text in _NONE_WORDS
        ):
            return self.fail(f"unexpected {token.describe()}: is an operator missing before it?",
                             token.position)
        if token.kind == _END:
            return self.fail(f"unexpected end of the text: expected {expected}", token.position)
        return self.fail(f"unexpected {token.describe()}: expected {expected}", token.position)

    def binding_power(self, token: _Token) -> int:
        if token.kind == _OP:
            if token.text in _CMP_OPS:
                return _BP_CMP
            if token.text in _ADD_OPS:
                return _BP_ADD
            if token.text in _MUL_OPS:
                return _BP_MUL
        elif token.kind == _KW:
            if token.text == "or":
                return _BP_OR
            if token.text == "and":
                return _BP_AND
            if token.text in ("in", "not"):
                return _BP_CMP
        return 0

    def expression(self, rbp: int) -> _Node:
        # Every subtree is parsed through here, so this count bounds the depth of the tree, and
        # with it the recursion of the parser, the evaluator and names().
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise self.fail(f"condition is nested too deeply (more than {MAX_DEPTH} levels)",
                                self.peek().position)
            left = self.prefix(rbp)
            while True:
                token = self.peek()
                bp = self.binding_power(token)
                if bp <= rbp:
                    return left
                left = self.infix(left, token, bp)
        finally:
            self.depth -= 1

    def prefix(self, rbp: int) -> _Node:
        token = self.advance()
        if token.kind in (_NUM, _STR):
            return _Literal(token.value)
        if token.kind == _KW:
            if token.text in _CONSTANTS:
                return _Literal(_CONSTANTS[token.text])
            if token.text in _NONE_WORDS:
                return _Literal(UNKNOWN)
            if token.text == "not":
                if rbp > _BP_NOT:  # Python rejects 'a == not b' too
                    raise self.fail("'not' must be in parentheses here: (not ...)",
                                    token.position)
                return _Not(self.expression(_BP_NOT), token.position)
        elif token.kind == _NAME:
            if self.is_op(self.peek(), "("):
                return self.call(token)
            return _Name(token.text, token.position)
        elif token.kind == _OP:
            if token.text == "-":
                return _Negate(self.expression(_BP_UNARY), token.position)
            if token.text == "(":
                node = self.expression(0)
                if not self.is_op(self.peek(), ")"):
                    raise self.unexpected(self.peek(), f"')' to close the '(' at "
                                          f"{_where(self.text, token.position)}")
                self.advance()
                return node
            if token.text == "[":
                return _List(self.items(token, "]"))
        if token.kind == _END:
            raise self.fail("unexpected end of the text: expected an expression", token.position)
        raise self.fail(f"expected an expression, found {token.describe()}", token.position)

    def infix(self, left: _Node, token: _Token, bp: int) -> _Node:
        if token.kind == _KW and token.text in ("and", "or"):
            operands, positions = [left], [token.position]
            while self.peek().kind == _KW and self.peek().text == token.text:
                positions.append(self.advance().position)
                operands.append(self.expression(bp))
            return _Logic(token.text, tuple(operands), tuple(positions))
        if bp == _BP_CMP:
            rest: list[tuple[str, _Node, int]] = []
            while self.binding_power(self.peek()) == _BP_CMP:
                op_token = self.advance()
                op = op_token.text
                if op == "not":
                    after = self.peek()
                    if not (after.kind == _KW and after.text == "in"):
                        raise self.fail("'not' here must be followed by 'in'", after.position)
                    self.advance()
                    op = "not in"
                rest.append((op, self.expression(bp), op_token.position))
            return _Compare(left, tuple(rest))
        ops = _ADD_OPS if bp == _BP_ADD else _MUL_OPS
        rest = []
        while self.peek().kind == _OP and self.peek().text in ops:
            op_token = self.advance()
            rest.append((op_token.text, self.expression(bp), op_token.position))
        return _Arith(left, tuple(rest))

    def items(self, opener: _Token, closer: str) -> tuple[_Node, ...]:
        """Comma-separated expressions up to ``closer``; a trailing comma is allowed."""
        items: list[_Node] = []
        expected = f"',' or '{closer}' (to close the '{opener.text}' at " \
                   f"{_where(self.text, opener.position)})"
        while True:
            if self.is_op(self.peek(), closer):
                self.advance()
                return tuple(items)
            if len(items) >= MAX_ITEMS:
                raise self.fail(f"more than {MAX_ITEMS} elements", self.peek().position)
            items.append(self.expression(0))
            token = self.peek()
            if self.is_op(token, ","):
                self.advance()
            elif not self.is_op(token, closer):
                raise self.unexpected(token, expected)

    def call(self, name: _Token) -> _Node:
        available = ", ".join(sorted(FUNCTIONS))
        if "." in name.text:
            raise self.fail(f"'{name.text}' cannot be called; the functions are: {available}",
                            name.position)
        spec = FUNCTIONS.get(name.text)
        if spec is None:
            raise self.fail(f"unknown function '{name.text}'; available: {available}",
                            name.position)
        opener = self.advance()
        args = self.items(opener, ")")
        too_many = spec.max_args is not None and len(args) > spec.max_args
        if len(args) < spec.min_args or too_many:
            raise self.fail(f"{spec.name}() takes {_arity(spec)} ({len(args)} given); usage: "
                            f"{spec.signature}", name.position)
        return _Call(spec, args, name.position)


# --------------------------------------------------------------------------------------------
# Public API


class Expr:
    """A parsed condition. Immutable; evaluate it as often as needed."""

    __slots__ = ("_names", "_root", "_text", "source")

    def __init__(self, source: str, root: _Node, text: str | None = None) -> None:
        self.source = source
        self._root = root
        self._text = source if text is None else text  # what error positions refer to
        names: set[str] = set()
        root.collect(names)
        self._names = frozenset(names)

    def __repr__(self) -> str:
        return f"Expr({self.source!r})"

    def names(self) -> frozenset[str]:
        """Every dotted fact name the condition refers to."""
        return self._names

    def gives_truth(self) -> bool | None:
        """True when it always gives true, false or unknown (a comparison, ``and``, ...);
        False when it never can (arithmetic, a number, ``len()``); None when that depends on
        the facts (a fact's name, ``coalesce()`` of facts)."""
        return _gives_truth(self._root)

    def evaluate(self, lookup: Callable[[str], object]) -> object:
        """The value over ``lookup``: True, False, UNKNOWN, or another value.

        ``lookup(name)`` returns a fact's value (None or UNKNOWN when unknown) and raises
        KeyError for a name that does not exist.
        """
        return self._root.compute(_Context(lookup, self._text))


def parse(text: str) -> Expr:
    """Parse a condition; raises ConditionError for anything that is not valid."""
    if not isinstance(text, str):
        raise ConditionError(f"a condition must be a string, not {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ConditionError(
            f"condition is too long ({len(text)} characters; the limit is {MAX_LENGTH})",
            text, MAX_LENGTH,
        )
    return Expr(text, _Parser(text, 0, len(text)).parse())


@dataclass(frozen=True, slots=True)
class _Placeholder:
    expr: Expr
    name: str | None  # the fact name when the placeholder is just a name (it has a unit)


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
            unit = unit_of(part.name) if part.name is not None else None
            out.append(format_value(_plain(value), unit))
        return "".join(out)


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
            root = _Parser(text, index + 1, end).parse()
        except ConditionError as exc:
            raise ConditionError(f"in placeholder {{{shown}}}: {exc.message}", text,
                                 exc.position) from None
        expr = Expr(body, root, text)
        if literal:
            parts.append("".join(literal))
            literal = []
        parts.append(_Placeholder(expr, root.name if isinstance(root, _Name) else None))
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
