"""Run rules over facts and turn the ones that fire into findings.

The engine knows scopes through the registry (``pytest_gputrain.scopes``) only: each scope
gives the namespace a rule's condition reads and the subject its findings name.

Two policies act on the findings of a record after its rules fire (docs/architecture.md):

- **severity by measured cost**: an info rule with ``warning_when`` gives a warning where that
  condition, over the cost the finding measured, holds (``Rule.severity_of``);
- **causes first**: a finding whose ``cost`` a cause explains (a session finding, such as
  CUDA_LAUNCH_BLOCKING, or another finding of the same record, such as an instrument left on,
  whose rule ``explains`` that cost) defers to it: it says so, offers the cause's fix instead of
  its own, and is information, since the warning is the cause's (``defer``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_gputrain import scopes
from pytest_gputrain.engine.expr import UNKNOWN, EvaluationError
from pytest_gputrain.engine.rule_settings import RuleConfig, apply_config
from pytest_gputrain.engine.rules import Rule, RuleFileError, builtin_rules_dir, load_rules
from pytest_gputrain.engine.vocabulary import scope_names
from pytest_gputrain.facts import EnvironmentFacts, FactsFile, session_namespace_of
from pytest_gputrain.findings import Evidence, Finding, sort_findings
from pytest_gputrain.scopes import Namespace
from pytest_gputrain.units import format_value


@dataclass
class RuleEngine:
    rules: list[Rule]
    # The session's causes (findings of environment rules that explain a cost), for the last
    # environment judged: a replay judges thousands of records of one environment.
    _causes: tuple[EnvironmentFacts, list[Cause]] | None = field(
        default=None, init=False, repr=False, compare=False)

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

    def evaluate_scope(self, scope: str, namespace: Namespace, subject: str,
                       causes: list[Cause] | None = None) -> list[Finding]:
        """The findings of the rules of ``scope``, in rule order; those whose cost one of
        ``causes`` or a cause among them explains defer to it (``defer``)."""
        fired = []
        for rule in self.for_scope(scope):
            finding = evaluate_rule(rule, namespace, subject)
            if finding is not None:
                fired.append((rule, finding))
        if causes is None:
            return [finding for _, finding in fired]
        known = causes + [(rule, finding) for rule, finding in fired if rule.explains]
        return [defer(rule, finding, known, namespace) for rule, finding in fired]

    def evaluate_record(self, scope: str, env: EnvironmentFacts, record: Any,
                        related: scopes.Related | None = None) -> list[Finding]:
        """The findings of one record of ``scope``, in rule order.

        ``related``: the other records of the same recording, by scope (a failure's run). A
        record a feature recorded (a test's run) is judged knowing the session's causes.
        """
        spec = scopes.get(scope)
        namespace = spec.namespace(env, record, related or {})
        causes = self.session_causes(env) if spec.recorded else None
        return self.evaluate_scope(scope, namespace, spec.subject(record), causes)

    def session_causes(self, env: EnvironmentFacts) -> list[Cause]:
        """The findings of the environment's rules that explain a cost (GT015: every launch
        waits for its kernel), with their rules: what a test's findings defer to."""
        cached = self._causes
        if cached is not None and cached[0] is env:
            return cached[1]
        causes: list[Cause] = []
        explaining = {rule.code for rule in self.rules if rule.explains}
        if explaining:
            with session_namespace_of(env):
                for scope in scopes.registered():
                    if scope.from_environment is None:
                        continue
                    rules = [r for r in self.for_scope(scope.name) if r.code in explaining]
                    for record in scope.from_environment(env) if rules else ():
                        namespace = scope.namespace(env, record, {})
                        for rule in rules:
                            finding = evaluate_rule(rule, namespace, scope.subject(record))
                            if finding is not None and not _is_broken(rule, finding):
                                causes.append((rule, finding))
        self._causes = (env, causes)
        return causes

    def evaluate_environment(self, env: EnvironmentFacts) -> list[Finding]:
        """Every scope whose records the environment holds (the session, each GPU).

        The session's names are built once: each GPU's record then costs the same however
        many GPUs there are (they were rebuilt, over all GPUs, for every one of them).
        """
        findings: list[Finding] = []
        with session_namespace_of(env):
            for scope in scopes.registered():
                if scope.from_environment is not None:
                    for record in scope.from_environment(env):
                        findings.extend(self.evaluate_record(scope.name, env, record))
        return sort_findings(findings)

    def evaluate_records(self, facts: FactsFile,
                         findings: Iterable[Finding] = ()) -> list[Finding]:
        """``findings`` plus those of every record the features added (runs, failures, ...).

        Raises pydantic's ValidationError when a record does not fit its scope's model, read
        strictly (a facts file may have been edited): no ``true`` for a number, no number in a
        string, no negative size. Each record is loaded, judged and let go in turn, and the
        session's names are built once: time and memory grow linearly with the recording.
        """
        related: dict[str, scopes.Records] = {
            scope.name: scopes.Records(facts.records.get(scope.name, []),
                                       functools.partial(_load_strictly, scope.model))
            for scope in scopes.recorded()}
        result = list(findings)
        with session_namespace_of(facts.environment):
            for scope, records in related.items():
                for record in records:
                    result.extend(self.evaluate_record(scope, facts.environment, record,
                                                       related))
        return sort_findings(result)


Cause = tuple[Rule, Finding]


def defer(rule: Rule, finding: Finding, causes: list[Cause], namespace: Namespace) -> Finding:
    """``finding`` as it reads when a cause explains its cost: the most severe of ``causes``
    whose rule explains the finding's ``cost`` (another rule's finding). It then says which
    cause explains it, offers the cause's fix instead of its own, and is information: the cost
    is the cause's finding's to report. Unchanged where no cause explains it."""
    if rule.cost is None:
        return finding
    explaining = [cause for cause in causes
                  if rule.cost in cause[0].explains and cause[1].code != finding.code]
    if not explaining:
        return finding
    _, cause = min(explaining, key=lambda item: (-item[1].rank, item[1].code))
    where = ("found for this test" if cause.scope == finding.scope and
             cause.subject == finding.subject else f"found for the {cause.scope}")
    message = finding.message
    if rule.explained_message is not None:
        message = rule.explained_message.render(_lookup(rule, namespace), format_value,
                                                _unit_of(namespace))
    explained = f"Explained by {cause.code} ({cause.title}; {where}): "
    return finding.model_copy(update={
        "severity": "info",
        "message": f"{explained}{message}",
        "fix": f"Fix {cause.code} first, then judge this again: {cause.fix}",
        "explained_by": cause.code,
    })


def _is_broken(rule: Rule, finding: Finding) -> bool:
    return finding.title == f"rule {rule.code} could not be evaluated"


def _load_strictly(model: Any, data: Any) -> Any:
    return model.model_validate(data, strict=True)


def _check_names(rule: Rule) -> None:
    known = scope_names(rule.scope)  # load_rule_file accepted only registered scopes
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


def _broken(rule: Rule, subject: str, message: str) -> Finding:
    # A rule that cannot be evaluated on these facts is a defect of the rule, not of the
    # user's code: report it, never crash the session.
    return Finding(
        code=rule.code, name=rule.name, title=f"rule {rule.code} could not be evaluated",
        severity="warning", scope=rule.scope, subject=subject, message=message,
        fix="Fix the rule's condition.", why="",
    )


def evaluate_rule(rule: Rule, namespace: Namespace, subject: str) -> Finding | None:
    lookup = _lookup(rule, namespace)
    try:
        fired = rule.condition.evaluate(lookup)
    except EvaluationError as exc:
        return _broken(rule, subject, f"{rule.path.name}: {exc}")
    if fired is not True and fired is not False and fired is not UNKNOWN:
        # A condition over a fact that is not a boolean (``device.memory_used``): caught here,
        # since no rule file says what a fact holds.
        return _broken(rule, subject, f"{rule.path.name}: the condition gave "
                       f"{format_value(fired, None)} ({type(fired).__name__}), not true or "
                       "false; compare it (e.g. `... > 0`)")
    if fired is not True:
        return None  # false, or unknown: a rule fires only on facts that prove it
    unit_of = _unit_of(namespace)
    evidence = []
    for name in rule.evidence:
        value, unit, why = namespace.get(name, (None, None, "not collected"))
        evidence.append(Evidence(name=name, value=value, unit=unit,
                                 display=format_value(value, unit), why_unknown=why))
    try:
        severity = rule.severity_of(lookup)
    except EvaluationError as exc:
        return _broken(rule, subject, f"{rule.path.name}: warning_when: {exc}")
    return Finding(
        code=rule.code,
        name=rule.name,
        title=rule.title,
        severity=severity,  # type: ignore[arg-type]
        scope=rule.scope,
        subject=subject,
        message=rule.message.render(lookup, format_value, unit_of),
        fix=rule.fix.render(lookup, format_value, unit_of),
        why=rule.why,
        evidence=evidence,
        params=dict(rule.params),
        references=list(rule.references),
    )

