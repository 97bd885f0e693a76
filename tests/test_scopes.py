"""The scope registry, and the diagnosis's one door for records and report sections.

A scope added by a feature (``serving`` here) plugs into the rules, the facts file and the
diagnosis without a change to the engine; unknown scopes are errors that name the known ones.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_gputrain import scopes
from pytest_gputrain.diagnosis import Diagnosis
from pytest_gputrain.engine.evaluate import RuleEngine
from pytest_gputrain.engine.rules import RuleFileError
from pytest_gputrain.engine.vocabulary import scope_names
from pytest_gputrain.facts import (
    EnvironmentFacts,
    FactGroup,
    FactsFile,
    fact,
    group_namespace,
    session_namespace,
)
from pytest_gputrain.probe.facts import RunFacts

FACTS = Path(__file__).parent / "facts"


class ServingFacts(FactGroup):
    test: str = fact(doc="test node id", default="")
    latency_p99: float | None = fact("s", "99th percentile request latency")


SERVING = scopes.Scope(
    name="serving",
    model=ServingFacts,
    namespace=lambda env, facts, related: {**session_namespace(env),
                                           **group_namespace("serving", facts)},
    subject=lambda facts: f"{facts.test} [serving]",
    records_key="serving",
)

RULE = """\
code = "GT901"
name = "slow-serving"
title = "Requests are slow"
scope = "serving"
severity = "warning"
condition = "serving.latency_p99 > params.max_latency"
message = "p99 latency is {serving.latency_p99}."
fix = "Batch requests."
why = "Users wait."
evidence = ["serving.latency_p99"]

[params]
max_latency = 0.5
"""


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A registry this test may change; the real one is restored after it."""
    scopes.names()  # the declared features' scopes, before copying
    monkeypatch.setattr(scopes, "_scopes", dict(scopes._scopes))
    monkeypatch.setattr(scopes, "_registered_by", dict(scopes._registered_by))
    monkeypatch.setattr(scopes, "_declared", list(scopes._declared))
    monkeypatch.setattr(scopes, "_loaded", set(scopes._loaded))
    yield


def _rules_dir(tmp_path: Path, text: str = RULE) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "GT901-slow-serving.toml").write_text(text)
    return folder


def _engine(folder: Path) -> RuleEngine:
    from pytest_gputrain.engine.rule_settings import build_config

    return RuleEngine.load(build_config(rules_dirs=[str(folder)]))


def test_the_core_and_the_features_register_their_scopes_in_a_stable_order() -> None:
    assert scopes.names() == ["session", "device", "run", "failure", "distributed"]
    assert [s.records_key for s in scopes.recorded()] == ["runs", "failures", "distributed"]


def test_an_unknown_scope_is_an_error_that_names_the_known_ones() -> None:
    with pytest.raises(scopes.UnknownScopeError, match="unknown scope 'serving'; registered "
                       "scopes: session, device, run, failure, distributed"):
        scope_names("serving")


def test_a_rule_of_an_unregistered_scope_does_not_load(tmp_path: Path) -> None:
    with pytest.raises(RuleFileError, match="field 'scope' must be one of session, device, run, "
                       "failure, distributed, got 'serving'"):
        _engine(_rules_dir(tmp_path))


def test_a_scope_registered_by_a_feature_is_judged_recorded_and_replayed(
        registry: None, tmp_path: Path) -> None:
    scopes.register(SERVING)
    engine = _engine(_rules_dir(tmp_path))
    assert "serving.latency_p99" in scope_names("serving")
    env = EnvironmentFacts()
    (finding,) = engine.evaluate_record("serving", env, ServingFacts(test="t.py::a",
                                                                     latency_p99=0.9))
    assert (finding.code, finding.scope) == ("GT901", "serving")
    assert finding.subject == "t.py::a [serving]"
    assert finding.message == "p99 latency is 900.0 ms."  # with the fact's unit
    # In the facts file under its own key, next to the others; a replay gives the same finding.
    data = json.loads(FactsFile(environment=env, records={
        "serving": [ServingFacts(test="t.py::a", latency_p99=0.9).model_dump(mode="json")],
    }).model_dump_json())
    assert data["serving"][0]["latency_p99"] == 0.9 and data["runs"] == []
    replayed = engine.evaluate_records(FactsFile.model_validate(data))
    assert [(f.code, f.subject) for f in replayed] == [("GT901", "t.py::a [serving]")]


def test_a_rule_naming_a_fact_its_scope_lacks_does_not_load(registry: None,
                                                            tmp_path: Path) -> None:
    scopes.register(SERVING)
    folder = _rules_dir(tmp_path, RULE.replace("serving.latency_p99 >", "serving.latency >"))
    with pytest.raises(RuleFileError,
                       match=r"unknown fact\(s\) serving\.latency for scope 'serving'"):
        _engine(folder)


def test_declared_modules_register_on_the_first_look_up(
        registry: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "serving_scope.py").write_text(textwrap.dedent("""
        from pytest_gputrain import scopes
        from tests_serving_model import SERVING
        scopes.register(SERVING)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "tests_serving_model", sys.modules[__name__])
    scopes.declare("serving_scope")
    assert "serving_scope" not in sys.modules  # declaring imports nothing
    try:
        assert scopes.get("serving") is SERVING
        assert scopes.names()[-1] == "serving"  # after the scopes declared before it
    finally:
        sys.modules.pop("serving_scope", None)


def test_registration_conflicts_are_errors(registry: None) -> None:
    with pytest.raises(ValueError, match="scope 'run' is already registered"):
        scopes.register(scopes.Scope("run", ServingFacts, SERVING.namespace, SERVING.subject,
                                     records_key="other"))
    with pytest.raises(ValueError, match="records key 'runs' is already used by scope 'run'"):
        scopes.register(scopes.Scope("serving", ServingFacts, SERVING.namespace,
                                     SERVING.subject, records_key="runs"))
    with pytest.raises(ValueError, match="give either records_key"):
        scopes.Scope("serving", ServingFacts, SERVING.namespace, SERVING.subject)
    # The same module registering again (imported anew) replaces its scope.
    scopes.register(SERVING)
    again = scopes.Scope("serving", ServingFacts, SERVING.namespace, lambda facts: facts.test,
                         records_key="serving")
    scopes.register(again)
    assert scopes.get("serving") is again


def test_facts_files_keep_their_layout() -> None:
    """Files written before the registry load, and write back key for key."""
    data = json.loads((FACTS / "run_failure_h200.json").read_text())
    facts = FactsFile.model_validate(data)
    assert [len(facts.records[name]) for name in ("run", "failure")] == [1, 1]
    again = json.loads(facts.model_dump_json())
    assert list(again) == ["schema_version", "kind", "environment", "runs", "failures",
                           "distributed"]
    assert again["runs"] == data["runs"] and again["failures"] == data["failures"]
    assert again["distributed"] == []


@pytest.mark.parametrize(("records", "message"), [
    ({"serving": []}, "unknown scope 'serving'"),
    ({"device": []}, "scope 'device' records nothing: its facts come from the environment"),
])
def test_facts_file_records_must_be_of_recording_scopes(records: dict[str, Any],
                                                         message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FactsFile(environment=EnvironmentFacts(), records=records)


# -- the diagnosis: one door for records and sections ---------------------------------------------


@pytest.fixture
def diagnosis(pytestconfig: pytest.Config) -> Diagnosis:
    return Diagnosis(pytestconfig, RuleEngine.load())


def test_a_record_is_kept_as_json_and_returned_as_a_replay_reads_it(
        diagnosis: Diagnosis) -> None:
    run = RunFacts(nodeid="t.py::a", steps=3, step_times=[0.1, 0.2, 0.3])
    kept = diagnosis.add_record("run", run)
    assert kept == RunFacts.model_validate(run.model_dump(mode="json")) and kept is not run
    assert diagnosis.records("run") == [run.model_dump(mode="json")]
    assert diagnosis.facts_file().records == {"run": [run.model_dump(mode="json")]}


@pytest.mark.parametrize(("scope", "record", "error", "message"), [
    ("session", EnvironmentFacts(), ValueError, "scope 'session' takes no records"),
    ("failure", RunFacts(), TypeError, "a 'failure' record must be a FailureFacts, got RunFacts"),
    ("serving", RunFacts(), scopes.UnknownScopeError, "unknown scope 'serving'"),
])
def test_a_record_of_the_wrong_scope_or_model_is_refused(
        diagnosis: Diagnosis, scope: str, record: Any, error: type[Exception],
        message: str) -> None:
    with pytest.raises(error, match=message):
        diagnosis.add_record(scope, record)
    assert diagnosis.facts_file().records == {}


def test_sections_are_computed_when_reported(diagnosis: Diagnosis) -> None:
    diagnosis.add_section("fixed", {"rows": 1})
    diagnosis.add_section("runs", lambda: [r["nodeid"] for r in diagnosis.records("run")] or None,
                          terminal=lambda width: [f"{len(diagnosis.records('run'))} run(s)"])
    assert diagnosis.sections() == {"fixed": {"rows": 1}}  # an empty section is left out
    diagnosis.add_record("run", RunFacts(nodeid="t.py::a"))
    assert diagnosis.sections() == {"fixed": {"rows": 1}, "runs": ["t.py::a"]}
    assert diagnosis.terminal_lines(80) == [["1 run(s)"]]
