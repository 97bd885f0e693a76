"""The rule expression language: parsing, evaluation, templates, and hostile input."""

from __future__ import annotations

import ast
import builtins
import copy
import os
import pickle
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_gputrain.engine import expr as expr_module
from pytest_gputrain.engine.expr import (
    FUNCTIONS,
    MAX_DEPTH,
    MAX_LENGTH,
    MAX_STRING,
    UNKNOWN,
    ConditionError,
    EvaluationError,
    Expr,
    Version,
    parse,
    parse_template,
)
from pytest_gputrain.units import format_value

GiB = 2**30

FACTS: dict[str, Any] = {
    "device.memory_used": 6 * GiB,
    "device.memory_total": 80 * GiB,
    "device.name": "NVIDIA H200",
    "device.compute_capability": "9.0",
    "device.throttle_hw_slowdown": False,
    "device.clock_event_reasons": 8,
    "device.temperature": 71.5,
    "device.processes": [{"pid": 1, "used_memory": 10}],
    "torch.cuda_version": "13.0",
    "torch.version": "2.11.0+cu130",
    "torch.arch_list": ["sm_80", "sm_90", "compute_90"],
    "nvml.driver_version": "580.159.04",
    "env.variables": {"NCCL_DEBUG": "INFO"},
    "host.shm_free": None,
    "params.min_free": 1024,
    "t": True,
    "f": False,
    "u": None,
    "x": 5,
    "s": "abc",
}
UNITS = {
    "device.memory_used": "bytes",
    "device.memory_total": "bytes",
    "device.temperature": "°C",
    "params.min_free": "bytes",
}


def lookup(name: str) -> object:
    return FACTS[name]


def ev(text: str, facts: dict[str, Any] | None = None) -> object:
    return parse(text).evaluate((FACTS if facts is None else facts).__getitem__)


def condition_error(text: str) -> ConditionError:
    with pytest.raises(ConditionError) as info:
        parse(text)
    return info.value


def evaluation_error(text: str) -> str:
    with pytest.raises(EvaluationError) as info:
        ev(text)
    return str(info.value)


# --------------------------------------------------------------------------------------------
# Literals


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", 42),
        ("0", 0),
        ("007", 7),
        ("1.5", 1.5),
        (".5", 0.5),
        ("1e9", 1e9),
        ("2.5E-3", 0.0025),
        ("1e+2", 100.0),
        ("'single'", "single"),
        ('"double"', "double"),
        (r"'it\'s'", "it's"),
        (r'"say \"hi\""', 'say "hi"'),
        (r"'back\\slash'", "back\\slash"),
        (r"'tab\tnew\n'", "tab\tnew\n"),
        ("'\"'", '"'),
        ("''", ""),
        ("true", True),
        ("True", True),
        ("false", False),
        ("False", False),
        ("[1, 2, 'a']", [1, 2, "a"]),
        ("[]", []),
        ("[1, 2,]", [1, 2]),
        ("[[1], []]", [[1], []]),
    ],
)
def test_literals(text: str, expected: object) -> None:
    value = ev(text)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize("text", ["none", "null", "None"])
def test_none_literal_is_unknown(text: str) -> None:
    assert ev(text) is UNKNOWN


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512MiB", 512 * 2**20),
        ("512 MiB", 512 * 2**20),
        ("1.5 GiB", 3 * 2**29),
        ("1.5GiB", 3 * 2**29),
        ("6GB", 6 * 10**9),
        ("6 gb", 6 * 10**9),
        ("1kb", 1000),
        ("1KB", 1000),
        ("1 KiB", 1024),
        ("2 TiB", 2 * 2**40),
        ("3TB", 3 * 10**12),
        ("7 MB", 7 * 10**6),
        ("10b", 10),
        ("10 B", 10),
        ("1e3 KiB", 1024000),
        ("0.5 kib", 512),
        ("-1GiB", -GiB),
        ("1 GiB + 512 MiB", GiB + 512 * 2**20),
        ("2 * 1GiB", 2 * GiB),
        ("[1 GiB, 2GiB]", [GiB, 2 * GiB]),
    ],
)
def test_size_literals(text: str, expected: object) -> None:
    value = ev(text)
    assert value == expected
    if isinstance(expected, int):
        assert type(value) is int


def test_size_literal_compares_with_fact() -> None:
    assert ev("device.memory_used >= 6 GiB") is True
    assert ev("device.memory_used > 6GiB") is False
    assert ev("device.memory_total - device.memory_used > 70 GiB") is True


def test_spaced_unit_then_dotted_name_is_not_a_unit() -> None:
    # 'b.x' is a fact name, not a unit, so a number before it is a syntax error.
    err = condition_error("3 b.x")
    assert "name 'b.x'" in err.message


# --------------------------------------------------------------------------------------------
# Names


def test_names_are_collected() -> None:
    expr = parse(
        "device.memory_used > params.min_free and known(host.shm_free) "
        "and max(x, device.memory_total) > 0"
    )
    assert expr.names() == frozenset(
        {"device.memory_used", "params.min_free", "host.shm_free", "x", "device.memory_total"}
    )
    assert parse("1 + len('abc')").names() == frozenset()


def test_source_and_repr() -> None:
    expr = parse("x > 1")
    assert isinstance(expr, Expr)
    assert expr.source == "x > 1"
    assert "x > 1" in repr(expr)


def test_fact_values() -> None:
    assert ev("device.name") == "NVIDIA H200"
    assert ev("device.throttle_hw_slowdown") is False
    assert ev("host.shm_free") is UNKNOWN
    assert ev("env.variables") == {"NCCL_DEBUG": "INFO"}


def test_lookup_may_return_unknown_itself() -> None:
    assert parse("a + 1").evaluate(lambda name: UNKNOWN) is UNKNOWN
    assert parse("known(a)").evaluate(lambda name: UNKNOWN) is False


def test_unknown_fact_is_an_evaluation_error() -> None:
    message = evaluation_error("x > 1 and missing.fact > 3")
    assert "unknown fact 'missing.fact'" in message
    assert "column 11" in message


def test_underscore_names_are_allowed_but_not_dunders() -> None:
    assert parse("_x.y_1 > 0").names() == {"_x.y_1"}
    err = condition_error("device.__class__")
    assert "'__class__'" in err.message
    assert err.column == 8


# --------------------------------------------------------------------------------------------
# Operators and precedence


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("10 - 4 - 3", 3),
        ("100 / 10 / 5", 2.0),
        ("2 * 3 % 4", 2),
        ("7 // 2 * 2", 6),
        ("-2 * 3", -6),
        ("- -2", 2),
        ("2 - -2", 4),
        ("-x + 1", -4),
        ("1 + 2 * 3 - 4 / 2", 5.0),
        ("10 % 3", 1),
        ("7 / 2", 3.5),
        ("-7 // 2", -4),
        ("1 + 2 == 3", True),
        ("2 * 3 > 5", True),
        ("not 1 == 2", True),
        ("not true and false", False),
        ("not true or true", True),
        ("true or false and false", True),
        ("(true or false) and false", False),
        ("false and false or true", True),
        ("not not true", True),
        ("3 in [1, 2] or 2 in [1, 2]", True),
        ("1 + 1 in [2]", True),
        ("not 3 in [1, 2]", True),
        ("3 not in [1, 2]", True),
        ("'a' + 'b' == 'ab'", True),
        ("x > 1 and x < 10", True),
        ("x > 1 and not x < 10", False),
        ("1 < 2 and 2 < 3 or false", True),
    ],
)
def test_precedence(text: str, expected: object) -> None:
    value = ev(text)
    assert value == expected
    assert type(value) is type(expected)


def test_newlines_and_tabs_are_whitespace() -> None:
    assert ev("x > 1\n  and\tx < 10\r\n") is True


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 < 2 < 3", True),
        ("1 < 3 < 2", False),
        ("3 > 2 > 1 >= 1", True),
        ("1 == 1 != 2", True),
        ("1 <= 1 < 1", False),
        ("'a' < 'b' < 'c'", True),
        ("u < 1 < 2", UNKNOWN),
        ("u < 1 < 0", False),
        ("0 < x < 10", True),
    ],
)
def test_comparison_chains(text: str, expected: object) -> None:
    assert ev(text) is expected


def test_chain_evaluates_middle_operand_once_and_short_circuits() -> None:
    calls: list[str] = []

    def counting(name: str) -> object:
        calls.append(name)
        return FACTS[name]

    assert parse("1 < x < 10").evaluate(counting) is True
    assert calls == ["x"]
    # Like Python, a false link stops the chain: 'missing' is never looked up.
    assert ev("2 < 1 < missing") is False


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 == 1.0", True),
        ("true == 1", False),
        ("false == 0", False),
        ("'1' == 1", False),
        ("[1, 2] == [1, 2]", True),
        ("'a' != 'b'", True),
        ("true != 1", True),
        ("device.name == 'NVIDIA H200'", True),
        ("'b' in 'abc'", True),
        ("'z' not in 'abc'", True),
        ("'NCCL_DEBUG' in env.variables", True),
        ("'NCCL_X' in env.variables", False),
        ("'sm_90' in torch.arch_list", True),
        ("1 in [true]", False),
        ("[1] in env.variables", False),
        ("version('12.4') == version('12.4.0')", True),
        ("version('12.4') < version('12.10')", True),
        ("version('2.11.0+cu130') >= version('2.11')", True),
        ("version('13.0') > version('12.9.1')", True),
        ("version('1') < version('1.0.1')", True),
        # Pre-releases come before their release (PEP 440); local tags do not count.
        ("version('2.6.0rc1') < version('2.6')", True),
        ("version('2.6.0rc1') > version('2.6.0b3')", True),
        ("version('2.6.0rc1') >= version('2.5.1')", True),
        ("version('2.11.0.dev20260101+cu130') < version('2.11')", True),
        ("version('2.11.0.dev20260101+cu130') > version('2.11.0.dev20251231')", True),
        ("version('2.11.0+cu130') == version('2.11')", True),
        ("version('2.11.0+cu130') <= version('2.11.0')", True),
        ("version('2.1.0a0+git1234') < version('2.1')", True),
        ("version('12.8') < version('12.10')", True),
        ("version('580.159.04') > version('580.65.06')", True),
        ("version('580.159.04') == version('580.159.4')", True),
    ],
)
def test_comparisons(text: str, expected: object) -> None:
    assert ev(text) is expected


@pytest.mark.parametrize("text", ["1 / 0", "1 // 0", "1 % 0", "1.0 / 0", "x / (x - 5)"])
def test_division_by_zero_is_unknown(text: str) -> None:
    assert ev(text) is UNKNOWN


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("'a' < 3", ["'<'", "str ('a')", "int (3)", "version("]),
        ("torch.cuda_version >= 12.4", ["'>='", "str ('13.0')", "float (12.4)", "version("]),
        ("'a' + 1", ["'+'", "str", "int"]),
        ("1 - 'a'", ["'-'", "int", "str"]),
        ("true + 1", ["'+'", "bool", "int"]),
        ("true < false", ["'<'", "bool"]),
        ("'ab' * 3", ["'*'", "str", "int"]),
        ("'%s' % x", ["'%'", "str", "int"]),
        ("[1] + [2]", ["'+'", "list"]),
        ("-'a'", ["unary '-'", "str"]),
        ("-true", ["unary '-'", "bool"]),
        ("[1] < [2]", ["'<'", "list"]),
        ("version('1.2') < 3", ["'<'", "version", "int"]),
        ("3 in 5", ["expected a string, list or mapping", "int (5)"]),
        ("3 in 'abc'", ["a string contains only strings", "int (3)"]),
        ("env.variables < 1", ["mapping"]),
        ("9" * 400 + " * " + "9" * 400, ["more than 400 digits"]),
    ],
)
def test_type_errors(text: str, fragments: list[str]) -> None:
    message = evaluation_error(text)
    for fragment in fragments:
        assert fragment in message


def test_type_error_names_the_column() -> None:
    message = evaluation_error("x > 1 and device.memory_used > 'x'")
    assert "column 30" in message


def test_evaluation_error_is_a_value_error() -> None:
    assert issubclass(EvaluationError, ValueError)
    assert issubclass(ConditionError, ValueError)


def test_huge_numbers_do_not_crash() -> None:
    big = "9" * 400
    assert ev(f"{big} > 1") is True
    message = evaluation_error(f"{big} * 1.5")
    assert "'*'" in message
    message = evaluation_error(f"{big} / 3")
    assert "'/'" in message


# --------------------------------------------------------------------------------------------
# Three-valued logic

T, F, U = "true", "false", "none"
TRUTH = {T: True, F: False, U: UNKNOWN}


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        (T, T, T), (T, F, F), (T, U, U),
        (F, T, F), (F, F, F), (F, U, F),
        (U, T, U), (U, F, F), (U, U, U),
    ],
)
def test_and_truth_table(left: str, right: str, expected: str) -> None:
    assert ev(f"{left} and {right}") is TRUTH[expected]


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        (T, T, T), (T, F, T), (T, U, T),
        (F, T, T), (F, F, F), (F, U, U),
        (U, T, T), (U, F, U), (U, U, U),
    ],
)
def test_or_truth_table(left: str, right: str, expected: str) -> None:
    assert ev(f"{left} or {right}") is TRUTH[expected]


@pytest.mark.parametrize(("operand", "expected"), [(T, F), (F, T), (U, U)])
def test_not_truth_table(operand: str, expected: str) -> None:
    assert ev(f"not {operand}") is TRUTH[expected]


def test_truth_tables_with_facts() -> None:
    assert ev("t and u") is UNKNOWN
    assert ev("f and u") is False
    assert ev("t or u") is True
    assert ev("f or u") is UNKNOWN
    assert ev("not u") is UNKNOWN
    assert ev("u and u and f") is False
    assert ev("u or t or u") is True


def test_logic_short_circuits() -> None:
    assert ev("false and missing") is False
    assert ev("true or missing") is True
    assert ev("x > 9 and missing > 1") is False
    # Unknown does not settle 'and': the right side must be evaluated (and here fails).
    assert "unknown fact 'missing'" in evaluation_error("u and missing")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 and 'x'", True),
        ("0 or ''", False),
        ("[] or 0", False),
        ("[0] and 1", True),
        ("not ''", True),
        ("not [1]", False),
        ("env.variables and true", True),
    ],
)
def test_logic_returns_booleans(text: str, expected: bool) -> None:
    assert ev(text) is expected


@pytest.mark.parametrize(
    "text",
    [
        "u + 1", "1 - u", "u * 2", "u / 2", "-u", "u == none", "u == 1", "u != 1", "u < 1",
        "none == none", "u in [1]", "1 in u", "'a' in u", "1 in [u]", "1 not in [u]",
        "len(u)", "abs(u)", "version(u)", "major(u)", "bit(u, 1)", "arch_supported(u, [])",
        "arch_supported('9.0', u)", "min(1, u)", "max([1, u])", "sum([1, u])", "any([u])",
        "all([true, u])", "coalesce(u, none)", "lower(u)", "contains(u, 'a')",
        "startswith(u, 'a')", "round(u)", "round(1.5, u)",
    ],
)
def test_unknown_propagates(text: str) -> None:
    assert ev(text) is UNKNOWN


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("known(u)", False),
        ("known(none)", False),
        ("known(x)", True),
        ("known(0)", True),
        ("known(false)", True),
        ("known(u + 1)", False),
        ("not known(u)", True),
        ("known(u) and u > 3", False),
        ("not known(u) or u > 3", True),
        ("1 in [u, 1]", True),
        ("2 not in [u, 1]", UNKNOWN),
        ("coalesce(u, 5)", 5),
        ("coalesce(u, none, 'x')", "x"),
        ("coalesce(x, missing)", 5),
        ("coalesce(u, 1) + 1", 2),
    ],
)
def test_known_and_coalesce(text: str, expected: object) -> None:
    value = ev(text)
    if isinstance(expected, bool) or expected is UNKNOWN:
        assert value is expected
    else:
        assert value == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pick('b', 'a', 'first', 'b', 'second', 'neither')", "second"),
        ("pick('c', 'a', 'first', 'b', 'second', 'neither')", "neither"),
        ("pick(u, 'a', 'first', 'neither')", "neither"),
        ("pick(x, 5, 'five', 'other')", "five"),
        ("pick('b', ['a', 'b'], 'a or b', 'other')", "a or b"),
        ("pick([1], [1], 'a list is compared whole', 'other')", "a list is compared whole"),
        ("pick(true, 1, 'one', 'a boolean is never a number')", "a boolean is never a number"),
        ("pick('c', 'a', 'first', 'b', 'second')", UNKNOWN),
        ("pick(u, 'a', 'first')", UNKNOWN),
        ("plural(1, 'step', 'steps')", "1 step"),
        ("plural(25, 'step', 'steps')", "25 steps"),
        ("plural(0, 'GPU', 'GPUs')", "0 GPUs"),
        ("plural(2.5, 'second', 'seconds')", "2.5 seconds"),
        ("'about one every ' + plural(x, 'step', 'steps')", "about one every 5 steps"),
        ("plural(u, 'step', 'steps')", UNKNOWN),
    ],
)
def test_pick_and_plural(text: str, expected: object) -> None:
    value = ev(text)
    assert value is expected if expected is UNKNOWN else value == expected


def test_plural_needs_a_count_and_words() -> None:
    assert "plural(): expected a count" in evaluation_error("plural('x', 'a', 'b')")
    assert "expected a string" in evaluation_error("plural(1, 2, 'b')")
    assert "pick() takes at least 3 arguments" in str(condition_error("pick(x, 1)"))


def test_unknown_value_behaviour() -> None:
    assert repr(UNKNOWN) == "unknown"
    assert type(UNKNOWN)() is UNKNOWN
    assert copy.copy(UNKNOWN) is UNKNOWN
    assert copy.deepcopy([UNKNOWN])[0] is UNKNOWN
    assert pickle.loads(pickle.dumps(UNKNOWN)) is UNKNOWN
    # Neither true nor false: code that asks for its truth has a bug, and should hear of it.
    with pytest.raises(TypeError, match="no truth value"):
        bool(UNKNOWN)


def test_lookup_lists_hold_unknown_for_none() -> None:
    facts = {"l": [1, None], "tup": (1, 2)}
    assert ev("l", facts) == [1, UNKNOWN]
    assert ev("2 in l", facts) is UNKNOWN
    assert ev("1 in l", facts) is True
    assert ev("tup == [1, 2]", facts) is True
    assert ev("sum(l)", facts) is UNKNOWN


# --------------------------------------------------------------------------------------------
# Functions


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("len('abc')", 3),
        ("len([1, 2])", 2),
        ("len(env.variables)", 1),
        ("len(device.processes)", 1),
        ("len('')", 0),
        ("min(3, 1, 2)", 1),
        ("max(3, 1, 2)", 3),
        ("min([4, 5])", 4),
        ("max([4, 5.5])", 5.5),
        ("max('a', 'b')", "b"),
        ("max(['a', 'b'])", "b"),
        ("min(7)", 7),
        ("min([])", UNKNOWN),
        ("max(version('1.2'), version('1.10'))", Version("1.10")),
        ("abs(-3)", 3),
        ("abs(-2.5)", 2.5),
        ("round(2.567, 2)", 2.57),
        ("round(2.5)", 2),
        ("round(3.7)", 4),
        ("round(1234, -2)", 1200),
        ("sum([1, 2, 3])", 6),
        ("sum([1.5, 2])", 3.5),
        ("sum([])", 0),
        ("any([false, true])", True),
        ("any([false, u])", UNKNOWN),
        ("any([false])", False),
        ("any([])", False),
        ("any([u, true])", True),
        ("all([true, 1])", True),
        ("all([true, u])", UNKNOWN),
        ("all([u, false])", False),
        ("all([])", True),
        ("lower('ABC')", "abc"),
        ("lower(device.name)", "nvidia h200"),
        ("contains('hello', 'ell')", True),
        ("contains([1, 2], 2)", True),
        ("contains([1, 2], 3)", False),
        ("contains(env.variables, 'NCCL_DEBUG')", True),
        ("contains(torch.arch_list, 'sm_90')", True),
        ("startswith(device.name, 'NVIDIA')", True),
        ("startswith('abc', 'b')", False),
        ("startswith('abc', ['x', 'a'])", True),
        ("startswith('abc', [])", False),
        ("version('12.4')", Version("12.4")),
        ("version('580.159.04')", Version("580.159.4")),
        ("version('2.11.0+cu130')", Version("2.11.0")),
        ("version('2.1.0a0+git1234')", Version("2.1.0a0")),
        ("version('2.6.0rc1')", Version("2.6.0rc1")),
        ("version('2.11.0.dev20260101+cu130')", Version("2.11.0.dev20260101")),
        ("version('12.8')", Version("12.8")),
        ("version('v1.2')", Version("1.2")),
        ("version(' 3.1 ')", Version("3.1")),
        ("version('12.4.x')", Version("12.4")),
        ("version(91002)", Version("91002")),
        ("version(12.4)", Version("12.4")),
        ("version(version('1.2'))", Version("1.2")),
        ("major('13.0')", 13),
        ("major(13.7)", 13),
        ("major(12)", 12),
        ("major('2.11.0+cu130')", 2),
        ("major(torch.cuda_version) >= 13", True),
        ("minor('12.4')", 4),
        ("minor('13')", 0),
        ("minor('580.159.04')", 159),
        ("minor(12.4)", 4),
        ("major('2.6.0rc1')", 2),
        ("minor('2.11.0.dev20260101+cu130')", 11),
        ("bit(8, 8)", True),
        ("bit(8, 4)", False),
        ("bit(12, 4)", True),
        ("bit(device.clock_event_reasons, 8)", True),
        ("bit(0, 255)", False),
        ("known(1)", True),
        ("coalesce(1, 2)", 1),
    ],
)
def test_functions(text: str, expected: object) -> None:
    value = ev(text)
    if isinstance(expected, bool) or expected is UNKNOWN:
        assert value is expected
    else:
        assert value == expected
        assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("capability", "arch_list", "expected"),
    [
        ("9.0", ["sm_80", "sm_90"], True),
        ("8.6", ["sm_80"], True),  # binary compatible within a major
        ("8.9", ["sm_86"], True),
        ("8.0", ["sm_86"], False),  # not backwards
        ("9.0", ["sm_80", "sm_86"], False),  # never across majors
        ("9.0", ["sm_80", "compute_80"], True),  # PTX is JIT-compiled forward
        ("7.5", ["compute_80"], False),
        ("12.0", ["sm_90", "compute_90"], True),
        ("12.0", ["sm_90", "sm_100"], False),
        ("10.0", ["sm_100"], True),
        ("12.0", ["sm_120"], True),
        ("9.0", ["sm_90a"], True),
        ("10.0", ["sm_90a", "sm_80"], False),  # arch-specific code runs on that arch only
        ("10.3", ["sm_100f"], True),
        ("9.0", [], False),
        ("9.0", ["gfx90a", "nonsense", "sm_", "sm_9x"], False),
        ("9", ["sm_90"], True),
        ("8.6", ["SM_86"], True),
    ],
)
def test_arch_supported(capability: str, arch_list: list[str], expected: bool) -> None:
    facts = {"cap": capability, "archs": arch_list}
    assert ev("arch_supported(cap, archs)", facts) is expected


def test_arch_supported_with_facts() -> None:
    assert ev("arch_supported(device.compute_capability, torch.arch_list)") is True
    assert ev("not arch_supported('7.0', torch.arch_list)") is True
    assert ev("arch_supported(version('9.0'), ['sm_90'])") is True


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("len(3)", ["len()", "int (3)"]),
        ("len(true)", ["len()", "bool"]),
        ("max(1, 'a')", ["max()", "number with str"]),
        ("min([1, [2]])", ["min()", "list"]),
        ("abs('x')", ["abs()", "str"]),
        ("abs(true)", ["abs()", "bool"]),
        ("round(1.5, 1000)", ["round()", "400"]),
        ("round(1, 'a')", ["round()", "str"]),
        ("round(1.5, 1.5)", ["round()", "float"]),
        ("round(1e308 * 10)", ["round()", "inf"]),
        ("sum(['a'])", ["sum()", "str"]),
        ("sum(3)", ["sum()", "list"]),
        ("any(1)", ["any()", "list"]),
        ("lower(1)", ["lower()", "int"]),
        ("contains(1, 1)", ["contains()", "int"]),
        ("startswith(1, 'a')", ["startswith()", "int"]),
        ("startswith('a', [1])", ["startswith()", "int"]),
        ("version('abc')", ["version()", "abc"]),
        ("version('')", ["version()"]),
        ("version(-1)", ["version()"]),
        ("version(true)", ["version()", "bool"]),
        ("version([1])", ["version()", "list"]),
        (f"version('1.{'9' * 65}')", ["version()", "more than 64 digits"]),
        ("major('x')", ["major()"]),
        ("minor([])", ["minor()"]),
        ("major(1e308 * 10)", ["major()", "inf"]),
        ("arch_supported('9.0', 'sm_90')", ["arch_supported()", "list"]),
        ("arch_supported('x', ['sm_90'])", ["arch_supported()", "version"]),
        ("bit(true, 1)", ["bit()", "bool"]),
        ("bit(1.5, 1)", ["bit()", "float"]),
        ("bit(1, 'a')", ["bit()", "mask"]),
    ],
)
def test_function_errors(text: str, fragments: list[str]) -> None:
    message = evaluation_error(text)
    for fragment in fragments:
        assert fragment in message


def test_function_whitelist_is_documented() -> None:
    assert set(FUNCTIONS) == {
        "known", "len", "min", "max", "abs", "round", "sum", "any", "all", "lower", "contains",
        "startswith", "version", "major", "minor", "arch_supported", "bit", "coalesce", "pick",
        "plural",
    }
    for name, spec in FUNCTIONS.items():
        assert spec.name == name
        assert spec.signature.startswith(name + "(")
        assert spec.doc
    with pytest.raises(TypeError):
        FUNCTIONS["eval"] = FUNCTIONS["len"]  # type: ignore[index]


def test_version_values() -> None:
    v = ev("version(torch.version)")
    assert isinstance(v, Version)
    assert str(v) == "2.11.0"
    assert repr(v) == "version('2.11.0')"
    assert v == Version("2.11")
    assert hash(v) == hash(Version("2.11.0.0"))
    assert Version("1.2") < Version("1.10") <= Version("1.10.0") < Version("2")
    assert Version("2") > Version("1.9") >= Version("1.9")
    assert Version("1") != (1,)
    # The local tag is dropped: a CUDA build of 2.11.0 is release 2.11.0.
    assert Version("2.11.0+cu130") == Version("2.11") and str(Version("2.11.0+cu130")) == "2.11.0"


# --------------------------------------------------------------------------------------------
# Syntax errors


@pytest.mark.parametrize(
    ("text", "fragment", "column"),
    [
        ("", "empty condition", 1),
        ("   ", "empty condition", 1),
        ("a >", "expected an expression", 4),
        ("a > > b", "expected an expression, found '>'", 5),
        ("(a", "')' to close the '(' at column 1", 3),
        ("(a b)", "name 'b'", 4),
        ("a b", "name 'b': is an operator missing", 3),
        ("a 'x'", "unexpected string 'x'", 3),
        ("a )", "unexpected ')'", 3),
        ("'abc", "unterminated string", 1),
        ("a = 1", "'=='", 3),
        ("a ** 2", "no exponent operator", 3),
        ("a && b", "'and'", 3),
        ("a || b", "'or'", 3),
        ("!a", "'not'", 1),
        ("a & 1", "bit(x, mask)", 3),
        ("a $ b", "'$'", 3),
        ("a ; b", "';'", 3),
        ("x.", "expected a name after 'x.'", 3),
        ("x.1", "expected a name after 'x.'", 3),
        ("x .y", "unexpected '.'", 3),
        ("x[0]", "subscripts", 2),
        ("(x)(1)", "only the built-in functions can be called", 4),
        ("5 xyz", "name 'xyz'", 3),
        ("5xyz", "unknown unit 'xyz'", 2),
        ("1e", "unknown unit 'e'", 2),
        ("0x10", "unknown unit 'x10'", 2),
        ("1_000", "unknown unit '_000'", 2),
        ("1.2.3 > x", "version('1.2.3')", 1),
        ("x > 580.159.04", "version('580.159.04')", 5),
        ("x is none", "'is' is not supported", 3),
        ("x is not none", "'is' is not supported", 3),
        ("'a\\qb'", "unknown escape", 3),
        ("true.x", "keyword", 1),
        ("[1, 2", "',' or ']'", 6),
        ("[1 2]", "number '2'", 4),
        ("a not b", "'not' here must be followed by 'in'", 7),
        ("a == not b", "must be in parentheses", 6),
        ("-not a", "must be in parentheses", 2),
        ("and a", "expected an expression, found 'and'", 1),
        ("a and", "expected an expression", 6),
        ("1" * 401, "more than 400 digits", 1),
        ("1e999", "out of range", 1),
        ("1e300 TiB", "size out of range", 1),
        ("foo(1)", "unknown function 'foo'; available: abs, all, any,", 1),
        ("x > 1 and eval('1')", "unknown function 'eval'", 11),
        ("device.foo(1)", "'device.foo' cannot be called", 1),
        ("len()", "len() takes 1 argument (0 given); usage: len(x)", 1),
        ("len(1, 2)", "len() takes 1 argument (2 given)", 1),
        ("round(1, 2, 3)", "round() takes 1 to 2 arguments (3 given)", 1),
        ("min()", "min() takes at least 1 argument (0 given)", 1),
        ("bit(1)", "bit() takes 2 arguments (1 given)", 1),
        ("len(1", "',' or ')'", 6),
        ("round(x, n=2)", "'=='", 11),
        ("café", "unexpected character 'é'", 4),
    ],
)
def test_syntax_errors(text: str, fragment: str, column: int) -> None:
    err = condition_error(text)
    assert fragment in err.message
    assert err.column == column
    rendered = str(err)
    assert rendered.startswith(f"column {column}: ")
    assert fragment in rendered
    lines = rendered.split("\n")
    if len(text) < 100:  # longer lines are windowed (see below)
        assert lines[-2] == "    " + text.split("\n")[0]
        assert lines[-1] == "    " + " " * (column - 1) + "^"


def test_string_cannot_span_lines() -> None:
    err = condition_error("'abc\ndef'")
    assert "unterminated string" in err.message
    assert str(err).startswith("line 1, column 1: ")


def test_error_on_second_line_names_line_and_column() -> None:
    err = condition_error("x > 1 and\n  y >")
    assert (err.line, err.column) == (2, 6)
    rendered = str(err)
    assert rendered.startswith("line 2, column 6: ")
    assert rendered.endswith("\n      y >\n         ^")


def test_caret_on_long_line_is_windowed() -> None:
    text = "x + " * 900 + "$"
    err = condition_error(text)
    assert err.column == len(text)
    shown, caret = str(err).split("\n")[-2:]
    assert len(shown) < 120
    assert shown.startswith("    ...")
    assert shown[caret.index("^")] == "$"


def test_caret_line_hides_control_characters() -> None:
    err = condition_error("x\x00 > 1")
    assert "'\\x00'" in err.message
    assert "\x00" not in str(err)


def test_condition_error_pickles() -> None:
    err = condition_error("a >")
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err)


def test_non_string_condition() -> None:
    with pytest.raises(ConditionError, match="must be a string, not int"):
        parse(3)  # type: ignore[arg-type]
    with pytest.raises(ConditionError, match="must be a string"):
        parse_template(None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Resource limits


def test_length_limit() -> None:
    text = "1" + " + 1" * ((MAX_LENGTH - 1) // 4)
    assert len(text) <= MAX_LENGTH
    assert isinstance(parse(text), Expr)
    err = condition_error(text + " + 1")
    assert "too long" in err.message


@pytest.mark.parametrize(
    "make",
    [
        lambda n: "(" * n + "1" + ")" * n,
        lambda n: "not " * n + "true",
        lambda n: "-" * n + "1",
        lambda n: "[" * n + "]" * n,
        lambda n: "abs(" * n + "1" + ")" * n,
    ],
)
def test_nesting_limit(make: Callable[[int], str]) -> None:
    # Deep but allowed: parses and evaluates without running into Python's recursion limit.
    expr = parse(make(MAX_DEPTH - 5))
    expr.evaluate(lookup)
    for depth in (MAX_DEPTH + 1, 500, 1500):
        err = condition_error(make(depth))
        assert "nested too deeply" in err.message or "too long" in err.message


def test_long_flat_expressions_stay_shallow() -> None:
    # 2000 operands make a flat run, not a 2000-deep tree: no recursion trouble.
    assert ev("x+" * 1999 + "x") == 5 * 2000
    assert ev(" and ".join(["t"] * 600)) is True
    assert ev(" < ".join(str(i) for i in range(500))) is True


def test_each_operator_level_counts_towards_the_depth() -> None:
    # Inside "1 + (...)" each level is an operand and a parenthesised expression: two levels.
    assert ev("1 + (" * 30 + "1" + ")" * 30) == 31
    assert "nested too deeply" in condition_error("1 + (" * 40 + "1" + ")" * 40).message


def test_list_and_argument_limits() -> None:
    assert ev("len([" + ",".join(["1"] * 1000) + "])") == 1000
    err = condition_error("[" + ",".join(["1"] * 1001) + "]")
    assert "more than 1000 elements" in err.message
    err = condition_error("max(" + ",".join(["1"] * 1001) + ")")
    assert "more than 1000 elements" in err.message


def test_number_digit_limit() -> None:
    assert ev("9" * 400) == int("9" * 400)
    assert "400 digits" in condition_error("9" * 401).message
    assert "400 digits" in condition_error("0." + "1" * 400).message


def test_integer_results_are_bounded() -> None:
    for text, n in (("n * n", 10**300), ("n + n", 10**425), ("sum([n, n])", 10**425)):
        with pytest.raises(EvaluationError, match="more than 400 digits"):
            parse(text).evaluate({"n": n}.__getitem__)


def test_string_results_are_bounded() -> None:
    assert len(parse("s + s").evaluate({"s": "x" * (MAX_STRING // 2)}.__getitem__)) == MAX_STRING
    with pytest.raises(EvaluationError, match=r"string result would be longer than 100000 "
                                              r"characters \(100000 \+ 1\) \(column 3\)"):
        parse("s + 'y'").evaluate({"s": "x" * MAX_STRING}.__getitem__)


@pytest.mark.parametrize("fact_size", [10_000, 100_000])
def test_many_concatenations_of_a_large_fact_stop_at_the_bound(fact_size: int) -> None:
    """1,300 concatenations of a 10 KB fact used to build 13 MB by copying ~8 GB (9 s); of a
    100 KB fact they did not finish. The bound stops them at the first result over it."""
    steps = 0

    def lookup(name: str) -> str:
        nonlocal steps
        steps += 1
        return "x" * fact_size

    condition = parse("s" + "+s" * 1300)
    with pytest.raises(EvaluationError, match="string result would be longer than 100000"):
        condition.evaluate(lookup)
    assert steps == MAX_STRING // fact_size + 1  # the operands it needed to cross the bound


# --------------------------------------------------------------------------------------------
# Templates


def render(text: str, facts: dict[str, Any] | None = None) -> str:
    values = FACTS if facts is None else facts
    return parse_template(text).render(values.__getitem__, format_value, UNITS.get)


def test_template_renders_with_units() -> None:
    assert render("GPU {device.name} uses {device.memory_used} of {device.memory_total}") == (
        "GPU NVIDIA H200 uses 6.0 GiB of 80.0 GiB"
    )
    assert render("{device.temperature}") == "71.5 °C"


def test_template_units_only_for_bare_names() -> None:
    seen: list[tuple[object, str | None]] = []

    def fmt(value: object, unit: str | None) -> str:
        seen.append((value, unit))
        return "#"

    template = parse_template(
        "{device.memory_used}|{device.memory_used // 2}|{host.shm_free}|{version('12.4')}"
        "|{[u, 1]}"
    )
    assert template.render(lookup, fmt, UNITS.get) == "#|#|#|#|#"
    assert seen == [
        (6 * GiB, "bytes"), (3 * GiB, None), (None, None), ("12.4", None), ([None, 1], None),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain text", "plain text"),
        ("", ""),
        ("{{literal}} and }}", "{literal} and }"),
        ("{{{x}}}", "{5}"),
        ("{x}{x}", "55"),
        ("{ x + 1 }", "6"),
        ("{lower('A}')}", "a}"),
        ('{"{" + "}"}', "{}"),
        ("{'it\\'s'}", "it's"),
        ("{known(u)}", "no"),
        ("{u}", "unknown"),
        ("{version(torch.version)}", "2.11.0"),
        ("{torch.arch_list}", "sm_80, sm_90, compute_90"),
        ("{device.throttle_hw_slowdown}", "no"),
        ("{params.min_free}", "1.0 KiB"),
    ],
)
def test_template_rendering(text: str, expected: str) -> None:
    assert render(text) == expected


def test_template_errors_render_inline() -> None:
    assert render("x={missing} y={x}") == "x=<error: unknown fact 'missing' (column 4)> y=5"
    rendered = render("{'a' < 1}")
    assert rendered.startswith("<error: '<' is not supported between str")


def test_template_names_and_source() -> None:
    template = parse_template("{device.memory_used} of {max(device.memory_total, x)} {{y}}")
    assert template.names() == {"device.memory_used", "device.memory_total", "x"}
    assert template.source == "{device.memory_used} of {max(device.memory_total, x)} {{y}}"
    assert parse_template("no placeholders").names() == frozenset()


@pytest.mark.parametrize(
    ("text", "fragment", "column"),
    [
        ("a { b", "unterminated placeholder", 3),
        ("a } b", "single '}'", 3),
        ("a {} b", "empty placeholder", 3),
        ("a {  } b", "empty placeholder", 3),
        ("abc {1 +} def", "in placeholder {1 +}: unexpected end of the text", 9),
        ("{foo(x)}", "in placeholder {foo(x)}: unknown function 'foo'", 2),
        ("{x:.1f}", "in placeholder {x:.1f}: unexpected ':' (there are no slices", 3),
        ("{x {y}}", "unexpected character '{'", 4),
        ("{'abc}", "unterminated placeholder", 1),
        ("{x.__class__}", "'__class__'", 4),
    ],
)
def test_template_syntax_errors(text: str, fragment: str, column: int) -> None:
    with pytest.raises(ConditionError) as info:
        parse_template(text)
    assert fragment in info.value.message
    assert info.value.column == column
    rendered = str(info.value)
    assert f"column {column}" in rendered
    assert rendered.endswith("    " + text + "\n    " + " " * (column - 1) + "^")


# --------------------------------------------------------------------------------------------
# Hostile input: nothing is ever executed


@contextmanager
def nothing_may_run() -> Iterator[list[str]]:
    """Replace the usual ways out of the sandbox with tripwires; yields what was attempted."""
    attempts: list[str] = []

    def tripwire(name: str) -> Callable[..., Any]:
        def called(*args: Any, **kwargs: Any) -> Any:
            attempts.append(name)
            raise AssertionError(f"{name} was called")

        return called

    with (
        mock.patch.object(os, "system", tripwire("os.system")),
        mock.patch.object(os, "popen", tripwire("os.popen")),
        mock.patch.object(subprocess, "Popen", tripwire("subprocess.Popen")),
        mock.patch.object(builtins, "eval", tripwire("eval")),
        mock.patch.object(builtins, "exec", tripwire("exec")),
        mock.patch.object(builtins, "compile", tripwire("compile")),
    ):
        yield attempts


ESCAPES = [
    "__import__('os').system('x')",
    "__import__",
    "().__class__",
    "().__class__.__bases__[0].__subclasses__()",
    "''.__class__.__mro__",
    "x.__dict__",
    "device.name.__class__",
    "len(x).real",
    "version('1').__class__",
    "(lambda: 1)()",
    "lambda x: x",
    "eval('1')",
    "exec('import os')",
    "compile('1', 'f', 'eval')",
    "open('/etc/passwd')",
    "getattr(device, 'name')",
    "globals()",
    "breakpoint()",
    "os.system('x')",
    "import os",
    "x; import os",
    "x if t else f",
    "[c for c in 'ab']",
    "{'a': 1}",
    "f'{x}'",
    "`id`",
    "x[0]",
    "len(s)[0]",
    "s[0:1]",
    "(x)(1)",
    "[1][0]",
    "a.b.c()",
    "\\x5f_import__",
    "x := 1",
    "x = 1",
    "*x",
    "@x",
]


@pytest.mark.parametrize("text", ESCAPES)
def test_python_escapes_are_syntax_errors(text: str) -> None:
    with nothing_may_run() as attempts:
        with pytest.raises(ConditionError):
            parse(text)
        with pytest.raises(ConditionError):
            parse_template("{ " + text + " }")  # spaces: "{{" would be an escaped brace
    assert attempts == []


def test_string_formatting_is_not_available() -> None:
    with nothing_may_run() as attempts:
        assert "'%'" in evaluation_error("'%s' % s")
        assert "'*'" in evaluation_error("'a' * 1000000000")
    assert attempts == []


@pytest.mark.parametrize("module", sorted(Path(expr_module.__file__).parent.glob("*.py")),
                         ids=lambda path: path.name)
def test_module_never_hands_text_to_python(module: Path) -> None:
    source = module.read_text()
    forbidden = {"eval", "exec", "compile", "__import__", "getattr", "setattr", "globals",
                 "locals", "vars", "import_module"}
    calls = {
        node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute)
    }
    assert not calls & forbidden
    assert "import re" not in source  # tokenizing is hand-written; no regex surprises


# --------------------------------------------------------------------------------------------
# Fuzzing

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FUZZ_VALUES: list[object] = [
    None, True, False, 0, 1, -3, 2.5, float("inf"), float("nan"), 10**300, "", "9.0",
    "2.11.0+cu130", "abc", [], [1, None], ["sm_80", "compute_90"], {"K": "v"}, [[1]],
    UNKNOWN, (1, 2),
]


def fuzz_lookup(name: str) -> object:
    """Any name resolves, to a value picked by the name; 'missing...' names do not exist."""
    if name.startswith("missing"):
        raise KeyError(name)
    return FUZZ_VALUES[sum(map(ord, name)) % len(FUZZ_VALUES)]


ALLOWED_RESULTS = (bool, int, float, str, list, dict, Version, type(UNKNOWN))


def check_evaluates(expr: Expr) -> None:
    try:
        value = expr.evaluate(fuzz_lookup)
    except EvaluationError as exc:
        assert str(exc)
        return
    assert isinstance(value, ALLOWED_RESULTS)


TOKENS = [
    "x", "y.z", "missing", "a.b.c", "1", "0", "2.5", "1e3", "512MiB", "1.5 GiB", "'s'", '"9.0"',
    "true", "false", "none", "null", "and", "or", "not", "in", "not in", "==", "!=", "<", "<=",
    ">", ">=", "+", "-", "*", "/", "//", "%", "(", ")", "[", "]", ",", ".", "=", "!", "**",
    "__x", "{", "}", "'", '"', "\\", "lambda", "is", "if", ":", ";",
    *(f"{name}(" for name in FUNCTIONS), "foo(",
]


@FUZZ
@given(st.one_of(
    st.text(max_size=120),
    st.lists(st.sampled_from(TOKENS), max_size=25).map(" ".join),
    st.lists(st.sampled_from(TOKENS), max_size=25).map("".join),
))
def test_fuzz_parse_never_crashes(text: str) -> None:
    try:
        expr = parse(text)
    except ConditionError as exc:
        assert str(exc)
        return
    check_evaluates(expr)


@FUZZ
@given(st.text(max_size=120))
def test_fuzz_template_never_crashes(text: str) -> None:
    try:
        template = parse_template(text)
    except ConditionError as exc:
        assert str(exc)
        return
    rendered = template.render(fuzz_lookup, lambda value, unit: repr(value), lambda name: None)
    assert isinstance(rendered, str)


NAMES = ["x", "device.memory_used", "torch.arch_list", "env.variables", "host.shm_free",
         "p.version", "q.list", "missing.fact", "r.big"]
LEAVES = st.one_of(
    st.sampled_from(NAMES),
    st.integers(-10**6, 10**6).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.text("abcXYZ09.'\"\\ ", max_size=6).map(
        lambda s: "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"
    ),
    st.sampled_from(["true", "false", "none", "512MiB", "1.5 GiB", "'9.0'", "'2.11.0+cu130'",
                     "[]", "['sm_80', 'compute_90']"]),
)
BINARY = ["and", "or", "==", "!=", "<", "<=", ">", ">=", "in", "not in", "+", "-", "*", "/",
          "//", "%"]


def call_of(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    def build(name: str) -> st.SearchStrategy[str]:
        spec = FUNCTIONS[name]
        most = spec.max_args if spec.max_args is not None else spec.min_args + 2
        return st.lists(children, min_size=spec.min_args, max_size=most).map(
            lambda args: f"{name}({', '.join(args)})"
        )

    return st.sampled_from(sorted(FUNCTIONS)).flatmap(build)


def extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, st.sampled_from(BINARY), children).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        st.tuples(children, children, children).map(lambda t: f"({t[0]} < {t[1]} <= {t[2]})"),
        children.map(lambda c: f"(not {c})"),
        children.map(lambda c: f"-{c}"),
        st.lists(children, max_size=3).map(lambda items: "[" + ", ".join(items) + "]"),
        call_of(children),
    )


VALID = st.recursive(LEAVES, extend, max_leaves=12)


@FUZZ
@given(VALID)
def test_fuzz_valid_expressions_evaluate_or_raise_evaluation_error(text: str) -> None:
    facts: dict[str, object] = {
        "x": 5, "device.memory_used": 6 * GiB, "torch.arch_list": ["sm_90"],
        "env.variables": {"A": "1"}, "host.shm_free": None, "p.version": "12.4",
        "q.list": [1, None, "a"], "r.big": 10**200,
    }
    try:
        expr = parse(text)
    except ConditionError as exc:
        # Generated texts are valid; only an unlucky, very deep one may exceed the limit.
        assert "nested too deeply" in exc.message or "too long" in exc.message
        return
    assert expr.names() <= set(NAMES)
    try:
        value = expr.evaluate(facts.__getitem__)
    except EvaluationError as exc:
        assert str(exc)
        return
    assert isinstance(value, ALLOWED_RESULTS)
    assert repr(expr.evaluate(facts.__getitem__)) == repr(value)  # deterministic


ESCAPE_FRAGMENTS = [
    "__import__", "(", ")", "'os'", ".", "system", "__class__", "__bases__", "[0]", "lambda",
    ":", "eval", "exec", "getattr", "x", " ", ",", "'", "__builtins__", "open", "()", "globals",
    "subprocess", "Popen", "import", ";", "{", "}", "=", "os", "__subclasses__",
]


@FUZZ
@given(st.lists(st.sampled_from(ESCAPE_FRAGMENTS), min_size=1, max_size=20).map("".join))
def test_fuzz_escape_attempts_execute_nothing(text: str) -> None:
    with nothing_may_run() as attempts:
        try:
            expr = parse(text)
        except ConditionError:
            pass
        else:
            check_evaluates(expr)
    assert attempts == []


@pytest.mark.parametrize(("condition", "gives"), [
    ("known(run.steps)", True), ("bit(run.x, 4)", True), ("any(run.xs)", True),
    ("coalesce(known(run.a), false)", True), ("coalesce(1, 2)", False), ("max(1, 2)", False),
    ("coalesce(run.a, 0)", None),
    ("len(run.xs)", False), ("version(run.v)", False), ("run.flag", None),
])
def test_what_a_call_gives_comes_from_its_function_spec(condition: str,
                                                        gives: bool | None) -> None:
    assert parse(condition).gives_truth() is gives


def test_every_function_says_what_it_gives() -> None:
    assert {spec.gives for spec in FUNCTIONS.values()} <= {"truth", "argument", "value"}
    assert {name for name, spec in FUNCTIONS.items() if spec.gives == "truth"} == {
        "known", "any", "all", "contains", "startswith", "arch_supported", "bit"}
