"""Rule conditions and message templates: a small expression language that is safe by design.

Rule files come from users' projects, so nothing here hands user text to Python: a hand-written
tokenizer and Pratt parser build a tree, and a tree walker evaluates it over *facts* (dotted
names such as ``device.memory_used``). Bad input raises :class:`ConditionError` with a column
and a caret line; type errors while evaluating raise :class:`EvaluationError`.

Unknown facts follow three-valued (Kleene) logic: see :data:`UNKNOWN`.

The modules are layered bottom-up, and each imports only the ones below it:

    limits, errors   the bounds on hostile input; the error types
    values           UNKNOWN, Version, how facts come in and results go out
    operations       truth, comparison, membership, arithmetic
    functions        the functions rules may call (FUNCTIONS)
    tree             the syntax tree and Expr, a parsed condition
    tokens           the tokenizer
    parser           the Pratt parser and parse() (the grammar is in its docstring)
    templates        message templates and parse_template()
    reading          a template as a person reads it (explain): read_template()

This package's public face is re-exported here; the rest of the engine imports only from it.
"""

from __future__ import annotations

from pytest_gputrain.engine.expr.errors import ConditionError, EvaluationError
from pytest_gputrain.engine.expr.functions import FUNCTIONS, FunctionSpec
from pytest_gputrain.engine.expr.limits import MAX_DEPTH, MAX_LENGTH, MAX_STRING
from pytest_gputrain.engine.expr.parser import parse
from pytest_gputrain.engine.expr.reading import Case, CaseLabel, TemplateReading, read_template
from pytest_gputrain.engine.expr.templates import Template, parse_template
from pytest_gputrain.engine.expr.tree import Expr
from pytest_gputrain.engine.expr.values import UNKNOWN, Version

__all__ = [
    "FUNCTIONS",
    "MAX_DEPTH",
    "MAX_LENGTH",
    "MAX_STRING",
    "UNKNOWN",
    "Case",
    "CaseLabel",
    "ConditionError",
    "EvaluationError",
    "Expr",
    "FunctionSpec",
    "Template",
    "TemplateReading",
    "Version",
    "parse",
    "parse_template",
    "read_template",
]
