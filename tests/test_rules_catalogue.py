"""The built-in rule catalogue: every rule fires on its bad cases and stays quiet on its good ones.

Each rule ``GTnnn`` has a case file ``tests/rule_cases/GTnnn.toml``. A case starts from a recorded
facts file in ``tests/facts/`` (``base``), changes it (``set``: dotted paths into ``environment``,
list indices numeric; ``unset``: paths made unknown), optionally overrides the rule's params, and
says whether the rule ``fires`` or stays ``quiet``. Cases set every fact they depend on, so that a
base file re-recorded on real hardware does not change their meaning.
"""

from __future__ import annotations

import copy
import re
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from recorded_facts import load_fact_set

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from pytest_gputrain.engine.evaluate import RuleEngine
from pytest_gputrain.engine.rule_settings import build_config
from pytest_gputrain.engine.rules import Rule
from pytest_gputrain.facts import EnvironmentFacts, FactsFile
from pytest_gputrain.findings import Finding

TESTS = Path(__file__).resolve().parent

CASES_DIR = TESTS / "rule_cases"
CASE_KEYS = {"name", "base", "expect", "set", "unset", "params", "dist", "says", "not_says",
             "severity", "explained_by"}
EXPECTATIONS = ("fires", "quiet")


@dataclass(frozen=True)
class Case:
    code: str
    name: str
    base: str
    expect: str
    set: dict[str, Any] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    # Rules of scope "distributed" (GT3xx): fields of one launch's DistributedRunFacts.
    dist: dict[str, Any] = field(default_factory=dict)
    # Text the finding's message or fix holds, and text neither holds (a fix aimed at the
    # cause the facts name; wording for the device the run trained on).
    says: tuple[str, ...] = ()
    not_says: tuple[str, ...] = ()
    # The finding's severity where it is not the rule's (severity by measured cost: an info
    # rule's warning_when), and the cause it defers to (a finding whose rule explains its cost).
    severity: str | None = None
    explained_by: str | None = None

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
        return f"{self.code}-{self.expect}-{slug}"


def _load_cases() -> list[Case]:
    cases: list[Case] = []
    for path in sorted(CASES_DIR.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        extra = set(data) - {"case"}
        assert not extra, f"{path.name}: unknown top-level key(s) {sorted(extra)}"
        for index, raw in enumerate(data.get("case", [])):
            where = f"{path.name} case {index + 1}"
            unknown = set(raw) - CASE_KEYS
            assert not unknown, f"{where}: unknown key(s) {sorted(unknown)}"
            missing = {"name", "base", "expect"} - set(raw)
            assert not missing, f"{where}: missing key(s) {sorted(missing)}"
            assert raw["expect"] in EXPECTATIONS, f"{where}: expect must be fires or quiet"
            assert raw["expect"] == "fires" or not (
                {"says", "not_says", "severity", "explained_by"} & set(raw)), \
                f"{where}: says / not_says / severity / explained_by check a finding that fires"
            cases.append(
                Case(
                    code=path.stem,
                    name=raw["name"],
                    base=raw["base"],
                    expect=raw["expect"],
                    set=dict(raw.get("set", {})),
                    unset=tuple(raw.get("unset", [])),
                    params=dict(raw.get("params", {})),
                    dist=dict(raw.get("dist", {})),
                    says=tuple(raw.get("says", [])),
                    not_says=tuple(raw.get("not_says", [])),
                    severity=raw.get("severity"),
                    explained_by=raw.get("explained_by"),
                )
            )
    return cases


CASES = _load_cases()


@cache
def engine(params: tuple[str, ...] = ()) -> RuleEngine:
    return RuleEngine.load(build_config(params=list(params)) if params else None)


def engine_for(case: Case) -> RuleEngine:
    overrides = tuple(sorted(f"{case.code}.{key}={value}" for key, value in case.params.items()))
    return engine(overrides)


@cache
def _base_json(name: str) -> dict[str, Any]:
    return load_fact_set(name)


def load_facts(name: str) -> EnvironmentFacts:
    return FactsFile.model_validate(_base_json(name)).environment


def _assign(root: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node: Any = root
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            assert part.isdigit(), f"{path}: '{where}' indexes a list, use a number"
            index = int(part)
            assert index < len(node), f"{path}: '{where}' is out of range ({len(node)} items)"
            if last:
                node[index] = value
            else:
                node = node[index]
        elif isinstance(node, dict):
            if last:
                node[part] = value  # a new key is caught by validation unless the dict is free
            else:
                assert part in node, f"{path}: '{where}' does not exist in the base facts"
                node = node[part]
        else:
            raise AssertionError(f"{path}: '{where}' is inside a value, not a group or list")


def _target(data: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """Where a case path points: ``run.*`` / ``failure.*`` into the base's first recorded run or
    failure (run-scope and failure-scope rules, GT1xx/GT2xx), anything else into environment."""
    for prefix, key in (("run.", "runs"), ("failure.", "failures")):
        if path.startswith(prefix):
            assert data[key], f"{path}: the base facts file records no {key}"
            return data[key][0], path.removeprefix(prefix)
    return data["environment"], path


def case_facts_file(case: Case) -> FactsFile:
    data = copy.deepcopy(_base_json(case.base))
    for path, value in case.set.items():
        _assign(*_target(data, path), value)
    for path in case.unset:
        _assign(*_target(data, path), None)
    if case.dist:  # one recorded launch (distributed-scope rules, GT3xx)
        data["distributed"] = [case.dist]
    return FactsFile.model_validate(data)


def case_facts(case: Case) -> EnvironmentFacts:
    return case_facts_file(case).environment


def rules() -> list[Rule]:
    return engine().rules


def _broken(findings: list[Finding]) -> list[str]:
    """Findings whose rule could not be evaluated, or whose text kept an error or a brace."""
    problems = []
    for finding in findings:
        for label, text in (("message", finding.message), ("fix", finding.fix)):
            if "<error" in text or "{" in text or "}" in text:
                problems.append(f"{finding.code} {label}: {text}")
        if finding.title.endswith("could not be evaluated"):
            problems.append(f"{finding.code}: {finding.message}")
    return problems


# --------------------------------------------------------------------------------------------
# The cases


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_rule_case(case: Case) -> None:
    facts = case_facts_file(case)
    env = facts.environment
    findings = engine_for(case).evaluate_environment(env)
    findings = engine_for(case).evaluate_records(facts, findings)  # GT1xx, GT2xx, GT3xx
    assert not _broken(findings), "\n".join(_broken(findings))
    mine = [finding for finding in findings if finding.code == case.code]
    if case.expect == "fires":
        assert mine, f"{case.code} did not fire on '{case.name}'; findings: " + ", ".join(
            f.code for f in findings
        )
        rule = next(rule for rule in engine_for(case).rules if rule.code == case.code)
        for finding in mine:
            assert finding.severity == (case.severity or rule.severity), case.id
            assert finding.explained_by == case.explained_by, case.id
            assert finding.message.strip() and finding.fix.strip()
            text = f"{finding.message}\n{finding.fix}"
            missing = [words for words in case.says if words not in text]
            assert not missing, f"{case.id}: the finding does not say {missing}:\n{text}"
            present = [words for words in case.not_says if words in text]
            assert not present, f"{case.id}: the finding says {present}:\n{text}"
    else:
        assert not mine, f"{case.code} fired on '{case.name}': {mine[0].message}"


def test_every_rule_has_firing_and_quiet_cases() -> None:
    codes = {rule.code for rule in rules()}
    by_code: dict[str, set[str]] = {}
    for case in CASES:
        by_code.setdefault(case.code, set()).add(case.expect)
    orphans = sorted(set(by_code) - codes)
    assert not orphans, f"case files for rules that do not exist: {orphans}"
    lacking = {code: sorted(set(EXPECTATIONS) - by_code.get(code, set())) for code in codes}
    lacking = {code: missing for code, missing in lacking.items() if missing}
    assert not lacking, f"rules without a case that fires or one that stays quiet: {lacking}"


def test_case_params_exist() -> None:
    by_code = {rule.code: rule for rule in rules()}
    for case in CASES:
        unknown = set(case.params) - set(by_code[case.code].params)
        assert not unknown, f"{case.id}: {case.code} has no param(s) {sorted(unknown)}"


def test_case_names_are_unique() -> None:
    ids = [case.id for case in CASES]
    duplicates = sorted({case_id for case_id in ids if ids.count(case_id) > 1})
    assert not duplicates, f"duplicate case names: {duplicates}"


# --------------------------------------------------------------------------------------------
# Whole machines


def _by_severity(findings: list[Finding], severity: str) -> list[str]:
    return [
        f"{finding.code} ({finding.subject})"
        for finding in findings
        if finding.severity == severity
    ]


def test_healthy_h200_raises_nothing_at_warning_or_error() -> None:
    findings = engine().evaluate_environment(load_facts("h200_healthy"))
    assert not _broken(findings)
    assert _by_severity(findings, "error") == []
    assert _by_severity(findings, "warning") == []


def test_cpu_laptop_gets_one_warning_explaining_why_there_is_no_gpu() -> None:
    findings = engine().evaluate_environment(load_facts("cpu_laptop"))
    assert not _broken(findings)
    assert _by_severity(findings, "error") == []
    assert [finding.code for finding in findings if finding.severity == "warning"] == ["GT001"]
    (gt001,) = [finding for finding in findings if finding.code == "GT001"]
    assert "libnvidia-ml.so" in gt001.message  # quotes NVML's reason
    assert "CPU-only" in gt001.message  # names the torch build


def test_findings_are_deterministic() -> None:
    for name in ("h200_healthy", "cpu_laptop"):
        first = [f.model_dump() for f in engine().evaluate_environment(load_facts(name))]
        second = [f.model_dump() for f in engine().evaluate_environment(load_facts(name))]
        fresh = [f.model_dump() for f in RuleEngine.load().evaluate_environment(load_facts(name))]
        assert first == second == fresh
    for case in CASES:
        first = [f.model_dump() for f in engine_for(case).evaluate_environment(case_facts(case))]
        second = [f.model_dump() for f in engine_for(case).evaluate_environment(case_facts(case))]
        assert first == second, case.id


# --------------------------------------------------------------------------------------------
# Documentation


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule.code)
def test_rule_is_documented(rule: Rule) -> None:
    assert rule.path.name == f"{rule.code}-{rule.name}.toml"
    assert rule.title.strip()
    assert len(rule.why) >= 200, "why: explain the impact, with numbers and sources"
    assert rule.fix.source.strip()
    assert rule.message.source.strip()
    assert rule.references, "at least one reference"
    assert all(ref.startswith("https://") for ref in rule.references)
    assert rule.docs.get("example", "").strip(), "docs.example: what triggers the rule"
    assert rule.docs.get("use_instead", "").strip(), "docs.use_instead: the corrected practice"
    if rule.params:
        options = rule.docs.get("options", "")
        missing = [name for name in rule.params if f"`{name}`" not in options]
        assert not missing, f"docs.options must describe {missing}"
    assert rule.evidence, "evidence: the facts a reader needs to check the finding"


def test_rule_codes_are_environment_codes() -> None:
    for rule in rules():
        if rule.code.startswith("GT3"):  # multi-GPU rules: tests/test_distributed_rules.py
            continue
        if rule.code.startswith(("GT1", "GT2")):  # run and failure rules
            continue
        assert re.fullmatch(r"GT0\d\d", rule.code), rule.code
        assert rule.scope in ("session", "device"), rule.code


def test_run_and_failure_codes_match_their_scopes() -> None:
    for rule in rules():
        if rule.code.startswith("GT1"):
            assert re.fullmatch(r"GT1\d\d", rule.code) and rule.scope == "run", rule.code
        elif rule.code.startswith("GT2"):
            assert re.fullmatch(r"GT2\d\d", rule.code) and rule.scope == "failure", rule.code
        else:  # GT0xx session/device; GT3xx multi-GPU: per launch, or per rank's run
            assert rule.scope != "failure", rule.code
            assert rule.scope != "run" or rule.code.startswith("GT3"), rule.code


def test_healthy_recorded_run_raises_nothing_at_warning_or_error() -> None:
    """A well-written loop (pinned memory, workers, AMP, no_grad eval, big batch) on an H200."""
    for name in ("run_healthy_h200", "run_failure_h200"):
        facts = FactsFile.model_validate(_base_json(name))
        findings = engine().evaluate_records(facts)
        assert not _broken(findings)
        assert _by_severity(findings, "error") == [], name
        assert _by_severity(findings, "warning") == [], name
        assert {f.code for f in findings} <= {"GT111", "GT114"}, name


def test_recorded_run_findings_are_deterministic() -> None:
    for case in CASES:
        if not case.code.startswith(("GT1", "GT2")):
            continue
        facts = case_facts_file(case)
        first = [f.model_dump() for f in engine_for(case).evaluate_records(facts)]
        again = [f.model_dump() for f in engine_for(case).evaluate_records(
            FactsFile.model_validate_json(facts.model_dump_json()))]
        assert first == again, case.id


# --------------------------------------------------------------------------------------------
# Shipped text: what a user reads


ROOT = TESTS.parent
SHIPPED_TEXT = [ROOT / "README.md", *(ROOT / folder for folder in
                                      ("rules", "docs", "sample_projects", "pytest_gputrain"))]
TEXT_SUFFIXES = {".py", ".toml", ".md", ".txt", ".ini", ".cfg", ".json", ".yml", ".yaml"}


def _shipped_text_files() -> list[Path]:
    files = []
    for place in SHIPPED_TEXT:
        candidates = [place] if place.is_file() else sorted(place.rglob("*"))
        files.extend(path for path in candidates if path.suffix in TEXT_SUFFIXES)
    return files


def test_no_shipped_text_cites_a_brief_users_do_not_have() -> None:
    """A user has no project brief to look things up in: a rule's figures name their public
    source (PyTorch's docs, NVIDIA's, the TensorBoard profiler plugin, HolisticTraceAnalysis,
    DCGM, ...) or say where the project measured them. ("briefly" is fine.)"""
    files = _shipped_text_files()
    assert len(files) > 100, "the shipped text was not found"
    cited = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in files
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bbrief\b", line, re.IGNORECASE)]
    assert not cited, "\n".join(cited)


def test_the_readme_names_rule_families_and_only_rules_that_exist() -> None:
    """Ranges such as GT101-GT137 go stale as soon as a rule is added: the README names the
    families (GT1xx) and points at `python -m pytest_gputrain rules`."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    ranges = re.findall(r"GT\d{3}`?\s*(?:–|-|—|to)\s*`?GT\d{3}", text)
    assert not ranges, f"rule ranges in README.md: {ranges}"
    assert "python -m pytest_gputrain rules" in text
    codes = {rule.code for rule in rules()}
    named = set(re.findall(r"\bGT\d{3}\b", text))
    project_codes = {code for code in named if code.startswith("GT9")}  # a project's own
    assert named - project_codes <= codes, sorted(named - project_codes - codes)
