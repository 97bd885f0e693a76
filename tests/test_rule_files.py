"""A malformed rule file is a RuleFileError that names the file, the field and what was wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gputrain.engine.rules import RuleFileError, load_rule_file
from pytest_gputrain.plugin import load_features

RULE = '''\
code = "GT901"
name = "few-cpus"
title = "Few CPUs"
scope = "session"
severity = "warning"
condition = "host.cpu_count_logical < params.min_cpus"
message = "{host.cpu_count_logical} CPUs."
fix = "Use a bigger machine."
why = "Loaders need CPUs."
evidence = ["host.cpu_count_logical"]
references = ["https://example.org"]
'''
TABLES = '''
[params]
min_cpus = 4
ratio = 0.5
label = "x"
strict = true

[docs]
example = " a machine with 2 CPUs "
use_instead = "8 CPUs"
'''


@pytest.fixture(autouse=True)
def _scopes() -> None:
    load_features()  # the scopes a rule file may name


def write(tmp_path: Path, text: str, name: str = "GT901-few-cpus.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def problem(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(RuleFileError) as caught:
        load_rule_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    return message.removeprefix(f"{path}: ")


def test_a_good_rule_file_keeps_its_values_and_types(tmp_path: Path) -> None:
    rule = load_rule_file(write(tmp_path, RULE + TABLES))
    assert (rule.code, rule.name, rule.scope, rule.severity) == (
        "GT901", "few-cpus", "session", "warning")
    assert rule.evidence == ("host.cpu_count_logical",)
    assert rule.references == ("https://example.org",)
    assert rule.params == {"min_cpus": 4, "ratio": 0.5, "label": "x", "strict": True}
    assert [type(value) for value in rule.params.values()] == [int, float, str, bool]
    assert rule.docs == {"example": "a machine with 2 CPUs", "use_instead": "8 CPUs"}
    bare = load_rule_file(write(tmp_path, RULE.replace('evidence = ["host.cpu_count_logical"]\n',
                                                       "")))
    assert (bare.evidence, bare.params, bare.docs) == ((), {}, {})


@pytest.mark.parametrize(("old", "new", "message"), [
    ('why = "Loaders need CPUs."\n', "", "missing required field 'why'"),
    ('title = "Few CPUs"\n', 'title = "Few CPUs"\ncolour = "red"\nsize = 2\n',
     "unknown field(s) colour, size; allowed: code, name, title, scope, severity, condition, "
     "message, fix, why, evidence, references, params, docs, warning_when, cost, explains, "
     "explained_message"),
    ('title = "Few CPUs"', "title = 5", "field 'title' must be a string, got int 5"),
    ('message = "{host.cpu_count_logical} CPUs."', "message = ['a']",
     "field 'message' must be a string, got list ['a']"),
    ('code = "GT901"', 'code = "GT9001"', "field 'code' must be GT and three digits (GT001; a "
     "project's own rules use GT900 to GT999), got 'GT9001'"),
    ('name = "few-cpus"', 'name = "Few_CPUs"',
     "field 'name' must be lower-case words joined by '-', got 'Few_CPUs'"),
    ('scope = "session"', 'scope = "serving"', "field 'scope' must be one of session, device, "
     "run, failure, distributed, got 'serving'"),
    ('severity = "warning"', 'severity = "fatal"',
     "field 'severity' must be one of info, warning, error, got 'fatal'"),
    ('severity = "warning"', "severity = 2", "field 'severity' must be a string, got int 2"),
    ('evidence = ["host.cpu_count_logical"]', 'evidence = "host.cpu_count_logical"',
     "field 'evidence' must be a list of strings, got str 'host.cpu_count_logical'"),
    ('references = ["https://example.org"]', 'references = ["https://example.org", 3]',
     "field 'references' must be a list of strings, got int 3 at references[1]"),
])
def test_a_malformed_field_is_named_with_what_was_wrong(
        tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in RULE
    assert problem(tmp_path, RULE.replace(old, new) + TABLES) == message


@pytest.mark.parametrize(("tables", "message"), [
    ('params = [1, 2]\n', "field 'params' must be a table of numbers, strings and booleans, "
     "got list [1, 2]"),
    ('[params]\nbatch = [1, 2]\n', "field 'params' must be a table of numbers, strings and "
     "booleans, got list [1, 2] at params.batch"),
    ('[params]\nwhen = 2026-01-01\n', "field 'params' must be a table of numbers, strings and "
     "booleans, got date datetime.date(2026, 1, 1) at params.when"),
    ('docs = "see the wiki"\n', "field 'docs' must be a table of strings, got str 'see the wiki'"),
    ('[docs]\nexample = 3\n', "field 'docs' must be a table of strings, got int 3 at "
     "docs.example"),
    ('[docs]\nexampel = "x"\nwhy = "y"\n', "unknown docs section(s) exampel, why; allowed: "
     "example, use_instead, options, notes"),
])
def test_a_malformed_table_is_named_down_to_the_entry(
        tmp_path: Path, tables: str, message: str) -> None:
    assert problem(tmp_path, RULE + tables) == message


def test_every_structural_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = (RULE.replace('why = "Loaders need CPUs."\n', "").replace('title = "Few CPUs"',
                                                                      "title = 5")
            + "colour = 1\n")
    assert problem(tmp_path, text) == (
        "unknown field(s) colour; allowed: code, name, title, scope, severity, condition, "
        "message, fix, why, evidence, references, params, docs, warning_when, cost, explains, "
        "explained_message; field 'title' must be a "
        "string, got int 5; missing required field 'why'")


def test_the_checks_pydantic_cannot_make_still_apply(tmp_path: Path) -> None:
    with pytest.raises(RuleFileError, match="file name must start with the rule's code GT901"):
        load_rule_file(write(tmp_path, RULE, name="few-cpus.toml"))
    assert problem(tmp_path, RULE.replace("params.min_cpus", "params.min_cpus +")).startswith(
        "field 'condition': ")
    assert "gives a value, not true or false" in problem(
        tmp_path, RULE.replace("< params.min_cpus", "* 2"))
