"""The syntax tree: one node class per construct, each computing its value over the facts, and
:class:`Expr`, a parsed condition.

May import :mod:`.functions`, :mod:`.operations`, :mod:`.values` and :mod:`.errors`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pytest_gputrain.engine.expr.errors import EvaluationError, Problem, where
from pytest_gputrain.engine.expr.functions import FunctionSpec
from pytest_gputrain.engine.expr.operations import arith, compare, truth_of
from pytest_gputrain.engine.expr.values import UNKNOWN, describe, is_number, normalize


class _Context:
    """What one evaluation reads: the facts, and the text that error positions refer to."""

    __slots__ = ("lookup", "text")

    def __init__(self, lookup: Callable[[str], object], text: str) -> None:
        self.lookup = lookup
        self.text = text

    def error(self, problem: Problem | str, position: int, prefix: str = "") -> EvaluationError:
        return EvaluationError(f"{prefix}{problem} ({where(self.text, position)})")


class Node:
    """A node computes its value over the facts and collects the fact names it reads."""

    __slots__ = ()

    def compute(self, ctx: _Context) -> object:
        raise NotImplementedError

    def collect(self, names: set[str]) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Literal(Node):
    value: object

    def compute(self, ctx: _Context) -> object:
        return self.value


@dataclass(frozen=True, slots=True)
class Name(Node):
    name: str
    position: int

    def compute(self, ctx: _Context) -> object:
        try:
            value = ctx.lookup(self.name)
        except KeyError:
            raise ctx.error(f"unknown fact '{self.name}'", self.position) from None
        return normalize(value)

    def collect(self, names: set[str]) -> None:
        names.add(self.name)


@dataclass(frozen=True, slots=True)
class List(Node):
    items: tuple[Node, ...]

    def compute(self, ctx: _Context) -> object:
        return [item.compute(ctx) for item in self.items]

    def collect(self, names: set[str]) -> None:
        for item in self.items:
            item.collect(names)


@dataclass(frozen=True, slots=True)
class Not(Node):
    operand: Node
    position: int

    def compute(self, ctx: _Context) -> object:
        try:
            truth = truth_of(self.operand.compute(ctx))
        except Problem as problem:
            raise ctx.error(problem, self.position, "'not': ") from None
        return UNKNOWN if truth is UNKNOWN else not truth

    def collect(self, names: set[str]) -> None:
        self.operand.collect(names)


@dataclass(frozen=True, slots=True)
class Negate(Node):
    operand: Node
    position: int

    def compute(self, ctx: _Context) -> object:
        value = self.operand.compute(ctx)
        if value is UNKNOWN:
            return UNKNOWN
        if is_number(value):
            return -value
        raise ctx.error(f"unary '-' is not supported for {describe(value)}", self.position)

    def collect(self, names: set[str]) -> None:
        self.operand.collect(names)


@dataclass(frozen=True, slots=True)
class Logic(Node):
    """``a and b and c`` / ``a or b or c`` as one node: Kleene logic, short-circuit."""

    op: str
    operands: tuple[Node, ...]
    positions: tuple[int, ...]  # per operand, the operator before it (the first: after it)

    def compute(self, ctx: _Context) -> object:
        decisive = self.op == "or"  # the value that settles the result: True for or
        unknown = False
        for operand, position in zip(self.operands, self.positions, strict=True):
            try:
                truth = truth_of(operand.compute(ctx))
            except Problem as problem:
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
class Compare(Node):
    """A comparison chain: ``a < b < c`` is ``a < b and b < c`` with b evaluated once."""

    first: Node
    rest: tuple[tuple[str, Node, int], ...]

    def compute(self, ctx: _Context) -> object:
        left = self.first.compute(ctx)
        unknown = False
        for op, node, position in self.rest:
            right = node.compute(ctx)
            try:
                result = compare(op, left, right)
            except Problem as problem:
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
class Arith(Node):
    """A left-associative run of one precedence level, evaluated in a loop (not recursion)."""

    first: Node
    rest: tuple[tuple[str, Node, int], ...]

    def compute(self, ctx: _Context) -> object:
        value = self.first.compute(ctx)
        for op, node, position in self.rest:
            right = node.compute(ctx)
            try:
                value = arith(op, value, right)
            except Problem as problem:
                raise ctx.error(problem, position) from None
        return value

    def collect(self, names: set[str]) -> None:
        self.first.collect(names)
        for _, node, _ in self.rest:
            node.collect(names)


@dataclass(frozen=True, slots=True)
class Call(Node):
    function: FunctionSpec
    args: tuple[Node, ...]
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
        except Problem as problem:
            raise ctx.error(problem, self.position, f"{spec.name}(): ") from None

    def collect(self, names: set[str]) -> None:
        for arg in self.args:
            arg.collect(names)


# What a node gives, known before any fact is read: a rule's condition must give true or false
# (or unknown), and one that can only give a number, a string or a list never fires.
def _gives_truth(node: Node) -> bool | None:
    """True: always true, false or unknown; False: never; None: it depends on the facts."""
    if isinstance(node, Logic | Not | Compare):
        return True
    if isinstance(node, Literal):
        return isinstance(node.value, bool) or node.value is None
    if isinstance(node, Call):
        if node.function.gives == "truth":
            return True
        if node.function.gives == "argument":
            kinds = {_gives_truth(arg) for arg in node.args}
            return kinds.pop() if len(kinds) == 1 else None
        return False
    if isinstance(node, Arith | Negate | List):
        return False
    return None  # a fact: its value decides


class Expr:
    """A parsed condition. Immutable; evaluate it as often as needed."""

    __slots__ = ("_names", "_root", "_text", "source")

    def __init__(self, source: str, root: Node, text: str | None = None) -> None:
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

    @property
    def root(self) -> Node:
        """The syntax tree (for reading it back as text: ``reading.py``)."""
        return self._root

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
