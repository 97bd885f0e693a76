"""The Pratt parser: tokens to a syntax tree, and :func:`parse`, which gives an :class:`Expr`.

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

May import :mod:`.tokens`, :mod:`.tree`, :mod:`.functions`, :mod:`.values`, :mod:`.limits`
and :mod:`.errors`.
"""

from __future__ import annotations

from typing import Final

from pytest_gputrain.engine.expr.errors import ConditionError, where
from pytest_gputrain.engine.expr.functions import FUNCTIONS, FunctionSpec
from pytest_gputrain.engine.expr.limits import MAX_DEPTH, MAX_ITEMS, MAX_LENGTH
from pytest_gputrain.engine.expr.tokens import (
    CONSTANTS,
    END,
    KW,
    NAME,
    NONE_WORDS,
    NUM,
    OP,
    STR,
    Token,
    Tokenizer,
)
from pytest_gputrain.engine.expr.tree import (
    Arith,
    Call,
    Compare,
    Expr,
    List,
    Literal,
    Logic,
    Name,
    Negate,
    Node,
    Not,
)
from pytest_gputrain.engine.expr.values import UNKNOWN

# Pratt binding powers, lowest first
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


class Parser:
    """A tree from ``text[start:end]`` (a template parses each placeholder in place)."""

    def __init__(self, text: str, start: int, end: int) -> None:
        self.text = text
        self.tokens = Tokenizer(text, start, end).tokens()
        self.index = 0
        self.depth = 0

    def fail(self, message: str, position: int) -> ConditionError:
        return ConditionError(message, self.text, position)

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.index + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.tokens[self.index]
        if token.kind != END:
            self.index += 1
        return token

    def is_op(self, token: Token, *texts: str) -> bool:
        return token.kind == OP and token.text in texts

    def parse(self) -> Node:
        if self.peek().kind == END:
            raise self.fail("empty condition", 0)
        node = self.expression(0)
        token = self.peek()
        if token.kind != END:
            raise self.unexpected(token, "the end of the condition")
        return node

    def unexpected(self, token: Token, expected: str) -> ConditionError:
        """``token`` follows a complete expression where ``expected`` should."""
        if self.is_op(token, "("):
            return self.fail("only the built-in functions can be called (by their bare name)",
                             token.position)
        if self.is_op(token, "["):
            return self.fail("subscripts ('x[...]') are not supported", token.position)
        if token.kind == NAME and token.text == "is":
            return self.fail("'is' is not supported; use '==' or '!=' (and known(x) to test "
                             "whether x has a value)", token.position)
        if token.kind in (NAME, NUM, STR) or token.text in CONSTANTS or (
            token.text in NONE_WORDS
        ):
            return self.fail(f"unexpected {token.describe()}: is an operator missing before it?",
                             token.position)
        if token.kind == END:
            return self.fail(f"unexpected end of the text: expected {expected}", token.position)
        return self.fail(f"unexpected {token.describe()}: expected {expected}", token.position)

    def binding_power(self, token: Token) -> int:
        if token.kind == OP:
            if token.text in _CMP_OPS:
                return _BP_CMP
            if token.text in _ADD_OPS:
                return _BP_ADD
            if token.text in _MUL_OPS:
                return _BP_MUL
        elif token.kind == KW:
            if token.text == "or":
                return _BP_OR
            if token.text == "and":
                return _BP_AND
            if token.text in ("in", "not"):
                return _BP_CMP
        return 0

    def expression(self, rbp: int) -> Node:
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

    def prefix(self, rbp: int) -> Node:
        token = self.advance()
        if token.kind in (NUM, STR):
            return Literal(token.value)
        if token.kind == KW:
            if token.text in CONSTANTS:
                return Literal(CONSTANTS[token.text])
            if token.text in NONE_WORDS:
                return Literal(UNKNOWN)
            if token.text == "not":
                if rbp > _BP_NOT:  # Python rejects 'a == not b' too
                    raise self.fail("'not' must be in parentheses here: (not ...)",
                                    token.position)
                return Not(self.expression(_BP_NOT), token.position)
        elif token.kind == NAME:
            if self.is_op(self.peek(), "("):
                return self.call(token)
            return Name(token.text, token.position)
        elif token.kind == OP:
            if token.text == "-":
                return Negate(self.expression(_BP_UNARY), token.position)
            if token.text == "(":
                node = self.expression(0)
                if not self.is_op(self.peek(), ")"):
                    raise self.unexpected(self.peek(), f"')' to close the '(' at "
                                          f"{where(self.text, token.position)}")
                self.advance()
                return node
            if token.text == "[":
                return List(self.items(token, "]"))
        if token.kind == END:
            raise self.fail("unexpected end of the text: expected an expression", token.position)
        raise self.fail(f"expected an expression, found {token.describe()}", token.position)

    def infix(self, left: Node, token: Token, bp: int) -> Node:
        if token.kind == KW and token.text in ("and", "or"):
            operands, positions = [left], [token.position]
            while self.peek().kind == KW and self.peek().text == token.text:
                positions.append(self.advance().position)
                operands.append(self.expression(bp))
            return Logic(token.text, tuple(operands), tuple(positions))
        if bp == _BP_CMP:
            rest: list[tuple[str, Node, int]] = []
            while self.binding_power(self.peek()) == _BP_CMP:
                op_token = self.advance()
                op = op_token.text
                if op == "not":
                    after = self.peek()
                    if not (after.kind == KW and after.text == "in"):
                        raise self.fail("'not' here must be followed by 'in'", after.position)
                    self.advance()
                    op = "not in"
                rest.append((op, self.expression(bp), op_token.position))
            return Compare(left, tuple(rest))
        ops = _ADD_OPS if bp == _BP_ADD else _MUL_OPS
        rest = []
        while self.peek().kind == OP and self.peek().text in ops:
            op_token = self.advance()
            rest.append((op_token.text, self.expression(bp), op_token.position))
        return Arith(left, tuple(rest))

    def items(self, opener: Token, closer: str) -> tuple[Node, ...]:
        """Comma-separated expressions up to ``closer``; a trailing comma is allowed."""
        items: list[Node] = []
        expected = f"',' or '{closer}' (to close the '{opener.text}' at " \
                   f"{where(self.text, opener.position)})"
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

    def call(self, name: Token) -> Node:
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
        return Call(spec, args, name.position)


def parse(text: str) -> Expr:
    """Parse a condition; raises ConditionError for anything that is not valid."""
    if not isinstance(text, str):
        raise ConditionError(f"a condition must be a string, not {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ConditionError(
            f"condition is too long ({len(text)} characters; the limit is {MAX_LENGTH})",
            text, MAX_LENGTH,
        )
    return Expr(text, Parser(text, 0, len(text)).parse())
