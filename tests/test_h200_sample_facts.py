"""The sample pipelines' facts as the H200 recorded them, judged by today's rules.

tests/gpu/test_sample_pipelines_gpu.py runs each sample on a GPU and compares its codes with
EXPECTED.toml. Its facts files (``GPUTRAIN_SAMPLE_FACTS``) are kept here, under
tests/facts/h200_samples/, so that a change to a rule is checked against real runs on every
machine: each sample must still get exactly its expected warning- and error-level codes. A sample
whose probe facts changed since the recording (a new run fact a rule reads) is re-recorded on the
GPU; a fact missing from an old recording must leave a rule quiet, never make it fire.
"""

from __future__ import annotations

import itertools
import json
import shlex
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from recorded_facts import FACTS_DIR

from pytest_gputrain.engine.evaluate import RuleEngine
from pytest_gputrain.engine.rule_settings import build_config
from pytest_gputrain.facts import FactsFile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RECORDED = FACTS_DIR / "h200_samples"
PIPELINES = Path(__file__).resolve().parents[1] / "sample_projects" / "pipelines"
EXPECTED: dict[str, dict[str, Any]] = tomllib.loads(
    (PIPELINES / "EXPECTED.toml").read_text(encoding="utf-8"))
PIPELINE_SCOPES = {"run", "failure"}
LOUD = {"warning", "error"}
SAMPLES = sorted(path.stem for path in RECORDED.glob("*.json"))


def rule_params(args: list[str]) -> list[str]:
    """The ``gpu_rule_param`` a sample's ``args`` set (``-o gpu_rule_param=A.b=1 C.d=2``)."""
    params: list[str] = []
    for flag, value in itertools.pairwise(args):
        key, _, text = value.partition("=")
        if flag == "-o" and key in ("gpu_rule_param", "gpu_rule_params"):
            params.extend(shlex.split(text))
    return params


@cache
def engine(params: tuple[str, ...]) -> RuleEngine:
    return RuleEngine.load(build_config(params=list(params)) if params else None)


def test_every_recording_is_a_sample() -> None:
    assert SAMPLES, f"no recorded facts under {RECORDED}"
    assert not set(SAMPLES) - set(EXPECTED), "recordings of samples EXPECTED.toml no longer has"


def recorded_findings(name: str) -> list[Any]:
    """Today's rules (with the sample's own rule parameters) on the sample's H200 facts."""
    facts = FactsFile.model_validate(
        json.loads((RECORDED / f"{name}.json").read_text(encoding="utf-8")))
    rules = engine(tuple(rule_params(list(EXPECTED[name].get("args", [])))))
    return rules.evaluate_records(facts, rules.evaluate_environment(facts.environment))


@pytest.mark.parametrize("name", SAMPLES)
def test_recorded_sample_gets_its_expected_codes(name: str) -> None:
    spec = EXPECTED[name]
    findings = recorded_findings(name)
    found = sorted({f.code for f in findings
                    if f.scope in PIPELINE_SCOPES and f.severity in LOUD})
    info = {f.code for f in findings if f.scope in PIPELINE_SCOPES and f.severity == "info"}
    details = "\n".join(f"  {f.severity:7} {f.code} {f.subject}: {f.message[:200]}"
                        for f in findings if f.scope in PIPELINE_SCOPES)
    assert found == sorted(spec.get("expect", [])), f"{name} ({spec.get('fault')}):\n{details}"
    missing_info = set(spec.get("expect_info", [])) - info
    assert not missing_info, f"{name}: info codes {sorted(missing_info)} missing\n{details}"


# "Nothing is wrong with the batch; what is left is fewer launches" (GT137) and "bound by Python
# and kernel launch overhead" (GT105) blame the idle GPU on launches. Beside a finding that
# explains the same idle time otherwise, the run's findings would contradict each other: the
# launch-bound finding stands down (its condition) or defers to the cause (a rule that
# ``explains`` its cost: it then names the cause and offers the cause's fix).
LAUNCH_BOUND = {"GT105", "GT137"}
IDLE_EXPLAINED_BY = {"GT102", "GT103", "GT104", "GT117", "GT123", "GT140", "GT143"}


@pytest.mark.parametrize("name", SAMPLES)
def test_recorded_sample_findings_agree_about_the_idle_gpu(name: str) -> None:
    findings = recorded_findings(name)
    causes = {rule.code for rule in engine(()).rules if "host-overhead" in rule.explains}
    by_subject: dict[str, set[str]] = {}
    session = {f.code for f in findings if f.scope in ("session", "device")}
    for finding in findings:
        if finding.scope == "run":
            by_subject.setdefault(finding.subject, set()).add(finding.code)
    for subject, codes in by_subject.items():
        assert not (codes & LAUNCH_BOUND and codes & IDLE_EXPLAINED_BY), (
            f"{name}, {subject}: {sorted(codes)}")
        explained = (codes | session) & causes
        for finding in findings:
            if finding.subject == subject and finding.code in LAUNCH_BOUND and explained:
                assert finding.explained_by in explained and finding.severity == "info", (
                    f"{name}, {subject}: {finding.code} beside {sorted(explained)}")
