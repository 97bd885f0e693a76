"""The engine's two policies over the findings of a record (docs/architecture.md):

- severity by measured cost: an info rule's ``warning_when`` makes its finding a warning where
  the cost it measured is large (and a project's ``gpu_severity`` for the code holds whatever
  the cost);
- causes first: a finding whose ``cost`` a cause of the same recording ``explains`` (a session
  finding, or another finding of the same test) defers to it, says so and offers its fix.

The rule files' own use of both is checked by their rule cases (tests/rule_cases/, keys
``severity`` and ``explained_by``); here, small rules of a project's own show the mechanism.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gputrain.engine.evaluate import RuleEngine
from pytest_gputrain.engine.rule_settings import build_config
from pytest_gputrain.engine.rules import RuleFileError, load_rule_file
from pytest_gputrain.facts import EnvironmentFacts, FactsFile
from pytest_gputrain.plugin import load_features
from pytest_gputrain.probe.facts import RunFacts

RULE = '''\
code = "{code}"
name = "{name}"
title = "{title}"
scope = "{scope}"
severity = "{severity}"
{extra}
condition = "{condition}"
message = "{message}"
fix = "{fix}"
why = "why"
'''


@pytest.fixture(autouse=True)
def _scopes() -> None:
    load_features()


def write(folder: Path, code: str, name: str, **fields: str) -> Path:
    values = {"code": code, "name": name, "title": name.replace("-", " "), "scope": "run",
              "severity": "warning", "extra": "", "condition": "run.steps > 0",
              "message": "msg", "fix": "fix"}
    values.update(fields)
    path = folder / f"{code}-{name}.toml"
    path.write_text(RULE.format(**values), encoding="utf-8")
    return path


def engine(folder: Path, **settings: list[str]) -> RuleEngine:
    return RuleEngine.load(build_config(rules_dirs=[str(folder)], select=["GT9"], **settings))


def judge(rules: RuleEngine, run: RunFacts, env: EnvironmentFacts | None = None
          ) -> dict[str, object]:
    facts = FactsFile(environment=env or EnvironmentFacts(),
                      records={"run": [run.model_dump(mode="json")]})
    return {finding.code: finding
            for finding in rules.evaluate_records(facts, rules.evaluate_environment(
                facts.environment))}


def test_an_info_finding_is_a_warning_where_its_measured_cost_is_large(tmp_path: Path) -> None:
    write(tmp_path, "GT901", "slow-instrument", severity="info",
          extra='warning_when = "run.step_time > 0.01"',
          message="step {run.step_time}")
    rules = engine(tmp_path)
    assert judge(rules, RunFacts(steps=10, step_time=0.02))["GT901"].severity == "warning"
    assert judge(rules, RunFacts(steps=10, step_time=0.002))["GT901"].severity == "info"
    # a cost that was not measured is no large cost
    assert judge(rules, RunFacts(steps=10))["GT901"].severity == "info"
    # the project's own severity for the code holds, whatever the cost
    pinned = engine(tmp_path, severity=["GT901=info"])
    assert judge(pinned, RunFacts(steps=10, step_time=0.02))["GT901"].severity == "info"


def test_a_finding_defers_to_a_session_cause_that_explains_its_cost(tmp_path: Path) -> None:
    write(tmp_path, "GT901", "blocking-launches", scope="session",
          extra='explains = ["host-overhead"]', condition="env.cuda_launch_blocking",
          fix="Unset CUDA_LAUNCH_BLOCKING.")
    write(tmp_path, "GT902", "launch-bound", extra='cost = "host-overhead"\n'
          'explained_message = "Busy {run.step_time} only."',
          message="The model is small.", fix="Use CUDA graphs.")
    rules = engine(tmp_path)
    env = EnvironmentFacts()
    env.env.cuda_launch_blocking = True
    deferred = judge(rules, RunFacts(steps=10, step_time=0.002), env)["GT902"]
    assert deferred.severity == "info" and deferred.explained_by == "GT901"
    assert deferred.message == ("Explained by GT901 (blocking launches; found for the session): "
                                "Busy 2.0 ms only.")
    assert deferred.fix == "Fix GT901 first, then judge this again: Unset CUDA_LAUNCH_BLOCKING."
    # without the cause the finding keeps its own severity, message and remedy
    plain = judge(rules, RunFacts(steps=10, step_time=0.002))["GT902"]
    assert (plain.severity, plain.message, plain.fix, plain.explained_by) == (
        "warning", "The model is small.", "Use CUDA graphs.", None)


def test_a_finding_defers_to_a_cause_of_the_same_test(tmp_path: Path) -> None:
    write(tmp_path, "GT901", "instrument-left-on", extra='explains = ["host-overhead"]',
          condition="run.anomaly_backwards > 0", fix="Turn it off.")
    write(tmp_path, "GT902", "launch-bound", extra='cost = "host-overhead"',
          message="The model is small.")
    write(tmp_path, "GT903", "churn", extra='cost = "allocator-calls"')
    found = judge(engine(tmp_path), RunFacts(steps=10, anomaly_backwards=10))
    assert found["GT901"].severity == "warning" and found["GT901"].explained_by is None
    assert found["GT902"].explained_by == "GT901" and found["GT902"].severity == "info"
    assert found["GT902"].message.startswith(
        "Explained by GT901 (instrument left on; found for this test): The model is small.")
    assert found["GT903"].explained_by is None  # another cost: not explained by this cause


@pytest.mark.parametrize(("extra", "severity", "problem"), [
    ('warning_when = "run.steps > 1"', "warning",
     "field 'warning_when' raises an info finding to a warning"),
    ('warning_when = "run.steps * 2"', "info",
     "field 'warning_when': 'run.steps * 2' gives a value"),
    ('cost = "time"', "warning", "field 'cost' must be one of host-overhead, allocator-calls"),
    ('explains = ["time"]', "warning",
     "field 'explains' must be one of host-overhead, allocator-calls, got 'time' at explains[0]"),
    ('explained_message = "x"', "warning", "field 'explained_message' is the message of a finding "
     "whose cost a cause explains: give the rule's 'cost' too"),
    ('cost = "host-overhead"\nexplains = ["host-overhead"]', "warning",
     "the rule explains its own cost 'host-overhead'"),
])
def test_the_policy_fields_are_checked_when_the_rule_loads(
        tmp_path: Path, extra: str, severity: str, problem: str) -> None:
    path = write(tmp_path, "GT901", "bad", extra=extra, severity=severity)
    with pytest.raises(RuleFileError) as caught:
        load_rule_file(path)
    assert problem in str(caught.value)


def test_a_policy_field_naming_an_unknown_fact_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "GT901", "typo", severity="info", extra='warning_when = "run.stpes > 1"')
    with pytest.raises(RuleFileError, match="unknown fact"):
        engine(tmp_path)
