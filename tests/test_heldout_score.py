"""benchmarks/heldout_score.py: the held-out samples' score from facts files, on the CPU.

The facts are a recorded healthy H200 run (tests/facts/run_healthy_h200.json) with its step
count changed, and a project rule of the test's own (GT951, in a ``--rules-dir``) that warns
from 50 steps on and names a made-up cause in its message or its fix: so each verdict (NAMED,
MISSED, quiet, LOUD, not run) is known whatever the built-in rules say about the run.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from recorded_facts import FACTS_DIR as FACTS
from recorded_facts import load_fact_set

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

RULE = '''code = "GT951"
name = "synthetic-frobnicator"
title = "A made-up fault for the scorer's test"
scope = "run"
severity = "warning"
condition = "run.steps >= 50"
message = "The frobnicator ran in all {run.steps} steps."
fix = "Turn the {pick(run.steps >= 70, true, 'whirligig', 'frobnicator')} off."
why = "Only the held-out scorer's test uses this rule."
'''

EXPECTED = '''
[fault_named_in_message]
fault = "a fault the rule names in its message"
cause = "the frobnicator"
names = 'FROBNICATOR'
source = "https://example.org/a"

[fault_named_in_fix]
fault = "a fault the rule names only in its fix"
cause = "the whirligig"
names = 'whirligig'
source = "https://example.org/b"

[fault_missed]
fault = "a fault the rule fires on without naming it"
cause = "the gizmo"
names = 'gizmo'
source = "https://example.org/c"

[healthy_quiet]
fault = "none"
expect = []

[healthy_loud]
fault = "none, but the rule fires"
expect = []

[fault_not_run]
fault = "a sample whose facts file is missing"
cause = "the widget"
names = 'widget'
source = "https://example.org/d"
'''

STEPS = {"fault_named_in_message": 60, "fault_named_in_fix": 80, "fault_missed": 60,
         "healthy_quiet": 10, "healthy_loud": 60}


def _scorer() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import heldout_score
    finally:
        sys.path.remove(str(BENCHMARKS))
    return heldout_score


def _facts(steps: int) -> dict[str, Any]:
    facts = load_fact_set("run_healthy_h200")
    run = copy.deepcopy(facts["runs"][0])
    run["steps"] = steps
    facts["runs"] = [run]
    return facts


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "GT951-synthetic-frobnicator.toml").write_text(RULE, encoding="utf-8")
    facts_dir = tmp_path / "facts"
    facts_dir.mkdir()
    for sample, steps in STEPS.items():
        (facts_dir / f"{sample}.json").write_text(json.dumps(_facts(steps)), encoding="utf-8")
    expected = tmp_path / "EXPECTED.toml"
    expected.write_text(EXPECTED, encoding="utf-8")
    return {"rules": rules, "facts": facts_dir, "expected": expected}


def _run(layout: dict[str, Path], capsys: pytest.CaptureFixture[str], fmt: str,
         *extra: str) -> tuple[int, str, str]:
    code = _scorer().main([str(layout["facts"]), "--expected", str(layout["expected"]),
                           "--rules-dir", str(layout["rules"]), "--format", fmt, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_every_verdict_and_the_totals(layout: dict[str, Path],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(layout, capsys, "json")
    assert code == 0
    report = json.loads(out)
    by_sample = {row["sample"]: row for row in report["samples"]}
    assert {name: row["outcome"] for name, row in by_sample.items()} == {
        "fault_named_in_message": "NAMED", "fault_named_in_fix": "NAMED",
        "fault_missed": "MISSED", "healthy_quiet": "quiet", "healthy_loud": "LOUD",
        "fault_not_run": "not run"}
    assert by_sample["fault_named_in_message"]["named_by"] == ["GT951"]
    assert "GT951" in by_sample["fault_missed"]["loud"]  # loud, yet not naming the gizmo
    assert "GT951" not in by_sample["healthy_quiet"]["loud"]
    assert report["totals"] == ("named 2 of 3 faults; 1 of 2 healthy quiet "
                                "(not run: fault_not_run)")


def test_text_and_markdown_views(layout: dict[str, Path],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _ = _run(layout, capsys, "text")
    assert code == 0
    assert text.splitlines()[-1] == ("named 2 of 3 faults; 1 of 2 healthy quiet "
                                     "(not run: fault_not_run)")
    line = next(row for row in text.splitlines() if row.startswith("fault_missed "))
    assert "GT951" in line and "MISSED" in line and "the gizmo" in line
    code, markdown, _ = _run(layout, capsys, "md")
    assert code == 0
    assert "| fault_named_in_fix | fault |" in markdown
    assert "NAMED (GT951)" in markdown
    assert markdown.rstrip().endswith("healthy quiet (not run: fault_not_run)**")


def test_without_the_rule_nothing_is_named(layout: dict[str, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The built-in rules alone (no --rules-dir) name none of the made-up causes: the score is
    recomputed with the rules given, not read from anywhere."""
    code = _scorer().main([str(layout["facts"]), "--expected", str(layout["expected"]),
                           "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [row["outcome"] for row in report["samples"] if row["faulty"] and row["ran"]] == [
        "MISSED", "MISSED", "MISSED"]


def test_judge_counts_only_loud_pipeline_findings_that_match() -> None:
    judge = _scorer().judge
    spec = {"cause": "x", "names": r"set_to_none|zero_grad\(\) never"}
    finding = {"code": "GT999", "severity": "warning", "scope": "run",
               "message": "The step was slow.", "fix": "Call zero_grad() never... rather always."}
    assert judge("s", spec, [finding]).named_by == ["GT999"]  # the fix names it
    assert not judge("s", spec, [{**finding, "severity": "info"}]).named  # info does not count
    assert not judge("s", spec, [{**finding, "scope": "session"}]).named  # the machine's
    assert judge("s", spec, [{**finding, "fix": "Raise the batch."}]).outcome == "MISSED"
    assert judge("s", spec, None).outcome == "not run"
    healthy = judge("h", {"expect": []}, [{**finding, "severity": "error", "scope": "failure"}])
    assert healthy.outcome == "LOUD" and healthy.loud == ["GT999"]


@pytest.mark.parametrize(("table", "error"), [
    ("[a]\ncause = 'x'\n", "needs both cause and names"),
    ("[a]\ncause = 'x'\nnames = '(unclosed'\n", "is not a regular expression"),
    ("[a]\nexpect = ['GT104']\n", "is healthy (no cause): expect must be []"),
    ("[a\n", "cannot read the EXPECTED table"),
])
def test_a_bad_expected_table_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          table: str, error: str) -> None:
    (tmp_path / "EXPECTED.toml").write_text(table, encoding="utf-8")
    code = _scorer().main([str(tmp_path), "--expected", str(tmp_path / "EXPECTED.toml")])
    assert code == 2
    assert error in capsys.readouterr().err


def test_a_missing_folder_or_a_broken_facts_file_is_an_error(
        layout: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = _scorer().main([str(tmp_path / "nowhere"), "--expected", str(layout["expected"])])
    assert code == 2 and "no such folder" in capsys.readouterr().err
    (layout["facts"] / "healthy_quiet.json").write_text('{"kind": "something else"}')
    code, _, err = _run(layout, capsys, "text")
    assert code == 2 and "healthy_quiet.json: not a pytest-gputrain facts file" in err


def test_the_heldout_table_loads() -> None:
    scorer = _scorer()
    table = scorer.load_expected(scorer.HELDOUT / "EXPECTED.toml")
    faulty = [name for name, spec in table.items() if "cause" in spec]
    assert len(faulty) >= 10 and len(table) - len(faulty) >= 4


def test_the_recorded_after_run_keeps_its_score() -> None:
    """The held-out samples as the H200 ran them (tests/facts/h200_heldout/), judged by today's
    rules: all 10 faults named, all 4 healthy neighbours quiet. Thirteen were recorded at
    commit f578340; the gradient checkpointing sample again on 2026-12-02 once the probe read
    activation checkpointing (``run.recompute.*``), and GT158 names it."""
    scorer = _scorer()
    table = scorer.load_expected(scorer.HELDOUT / "EXPECTED.toml")
    verdicts = {v.sample: v for v in scorer.score(FACTS / "h200_heldout", table)}
    assert all(v.ran for v in verdicts.values()), [s for s, v in verdicts.items() if not v.ran]
    missed = {s for s, v in verdicts.items() if v.faulty and not v.named}
    loud = {s for s, v in verdicts.items() if not v.faulty and not v.quiet}
    assert not missed and not loud, (missed, loud)
    assert verdicts["hf_trainer_gradient_checkpointing_unneeded"].named_by == ["GT158"]
    assert scorer.totals(list(verdicts.values())) == "named 10 of 10 faults; 4 of 4 healthy quiet"
