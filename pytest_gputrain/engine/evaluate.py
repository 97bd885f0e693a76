"""Run rules over facts and turn the ones that fire into findings."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gputrain.engine.config import RuleConfig, apply_config
from pytest_gputrain.engine.expr import UNKNOWN, EvaluationError
from pytest_gputrain.engine.rules import Rule, RuleFileError, builtin_rules_dir, load_rules
from pytest_gputrain.engine.vocabulary import scope_names
from pytest_gputrain.facts import EnvironmentFacts, FactsFile, device_namespace, session_namespace
from pytest_gputrain.findings import Evidence, Finding, sort_findings
from pytest_gputrain.run_facts import FailureFacts, RunFacts, failure_namespace, run_namespace
from pytest_gputrain.units import format_value

# name -> (value, unit, why unknown)
Namespace = Mapping[str, tuple[Any, str | None, str | None]]


@dataclass
class RuleEngine:
    rules: list[Rule]

    @classmethod
    def load(cls, config: RuleConfig | None = None, builtin: bool = True) -> RuleEngine:
        config = config or RuleConfig()
        directories: list[Path] = [builtin_rules_dir()] if builtin else []
        directories.extend(config.extra_dirs)
        rules = load_rules(directories)
        for rule in rules:
            _check_names(rule)
        return cls(apply_config(rules, config))

    def for_scope(self, scope: str) -> list[Rule]:
        return [rule for rule in self.rules if rule.scope == scope]

    def evaluate_scope(self, scope: str, namespace: Namespace, subject: str) -> list[Finding]:
        findings = []
        for rule in self.for_scope(scope):
            finding = evaluate_rule(rule, namespace, subject)
            if finding is not None:
                findings.append(finding)
        return findings

    def evaluate_environment(self, env: EnvironmentFacts) -> list[Finding]:
        findings = self.evaluate_scope("session", session_namespace(env), "session")
        for device in env.devices:
            subject = f"GPU {device.index}" + (f" {device.name}" if device.name else "")
            if device.torch_index is not None and device.torch_index != device.index:
                subject += f" (cuda:{device.torch_index})"
            findings.extend(self.evaluate_scope("device", device_namespace(env, device), subject))
        return sort_findings(findings)

    def evaluate_run(self, env: EnvironmentFacts, run: RunFacts) -> list[Finding]:
        """Run-scope rules over one test's run facts (subject: the test's node id)."""
        return sort_findings(self.evaluate_scope("run", run_namespace(env, run), run.nodeid))

    def evaluate_failure(self, env: EnvironmentFacts, failure: FailureFacts,
                         run: RunFacts | None = None) -> list[Finding]:
        """Failure-scope rules over one failed test (its run facts too, when recorded)."""
        namespace = failure_namespace(env, failure, run)
        return sort_findings(self.evaluate_scope("failure", namespace, failure.nodeid))

    def evaluate_recorded_runs(self, facts: FactsFile,
                               findings: Iterable[Finding] = ()) -> list[Finding]:
        """``findings`` plus those of every recorded run, failure and distributed launch.

        Raises pydantic's ValidationError when a recorded run or failure is malformed.
        """
        result = list(findings)
        runs: dict[str, RunFacts] = {}
        for data in facts.runs:
            run = RunFacts.model_validate(data)
            runs[run.nodeid] = run
            result.extend(self.evaluate_run(facts.environment, run))
        for data in facts.failures:
            failure = FailureFacts.model_validate(data)
            result.extend(self.evaluate_failure(facts.environment, failure,
                                                runs.get(failure.nodeid)))
        if facts.distributed:
            from pytest_gputrain.distributed.facts import DistributedRunFacts
            from pytest_gputrain.distributed.report import evaluate, subject_of

            for data in facts.distributed:
                launch = DistributedRunFacts.model_validate(data)
                result.extend(evaluate(self, facts.environment, launch, subject_of(launch)))
        return sort_findings(result)


def _check_names(rule: Rule) -> None:
    try:
        known = scope_names(rule.scope)
    except ImportError:
        return
    unknown = sorted(
        name for name in rule.names() if not name.startswith("params.") and name not in known
    )
    if unknown:
        raise RuleFileError(
            f"{rule.path}: unknown fact(s) {', '.join(unknown)} for scope '{rule.scope}' "
            f"(see `python -m pytest_gputrain facts --scope {rule.scope}`)"
        )
    missing_params = sorted(
        name.removeprefix("params.") for name in rule.names()
        if name.startswith("params.") and name.removeprefix("params.") not in rule.params
    )
    if missing_params:
        raise RuleFileError(
            f"{rule.path}: condition uses params {', '.join(missing_params)} that [params] "
            "does not define"
        )


def _lookup(rule: Rule, namespace: Namespace) -> Any:
    def lookup(name: str) -> Any:
        if name.startswith("params."):
            return rule.params[name.removeprefix("params.")]
        value = namespace[name][0]
        return UNKNOWN if value is None else value

    return lookup


def _unit_of(namespace: Namespace) -> Any:
    def unit_of(name: str) -> str | None:
        entry = namespace.get(name)
        return entry[1] if entry else None

    return unit_of


def evaluate_rule(rule: Rule, namespace: Namespace, subject: str) -> Finding | None:
    lookup = _lookup(rule, namespace)
    try:
        fired = rule.condition.evaluate(lookup)
    except EvaluationError as exc:
        # A rule that cannot be evaluated on these facts is a defect of the rule, not of the
        # user's code: report it, never crash the session.
        return Finding(
            code=rule.code, name=rule.name, title=f"rule {rule.code} could not be evaluated",
            severity="warning", scope=rule.scope, subject=subject,  # type: ignore[arg-type]
            message=f"{rule.path.name}: {exc}", fix="Fix the rule's condition.", why="",
        )
    if fired is not True:
        return None  # false, or unknown: a rule fires only on facts that prove it
    unit_of = _unit_of(namespace)
    evidence = []
    for name in rule.evidence:
        value, unit, why = namespace.get(name, (None, None, "not collected"))
        evidence.append(Evidence(name=name, value=value, unit=unit,
                                 display=format_value(value, unit), why_unknown=why))
    return Finding(
        code=rule.code,
        name=rule.name,
        title=rule.title,
        severity=rule.severity,  # type: ignore[arg-type]
        scope=rule.scope,  # type: ignore[arg-type]
        subject=subject,
        message=rule.message.render(lookup, format_value, unit_of),
        fix=rule.fix.render(lookup, format_value, unit_of),
        why=rule.why,
        evidence=evidence,
        params=dict(rule.params),
        references=list(rule.references),
    )


def worst(findings: Iterable[Finding]) -> str | None:
    ranked = sorted(findings, key=lambda f: -f.rank)
    return ranked[0].severity if ranked else None
