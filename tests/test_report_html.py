"""The HTML report without a browser: its series, its page, its size, and where it is written
(``--gpu-report=html:PATH``, ``replay --report``). tests/test_report_browser.py opens it."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import report_cases
import torch
from torch.utils.data import DataLoader, TensorDataset

from pytest_gputrain.diagnosis_settings import parse_report_target
from pytest_gputrain.distributed import analysis
from pytest_gputrain.facts import FactsFile
from pytest_gputrain.probe.run import RunProbe
from pytest_gputrain.report.html import assets, report_html
from pytest_gputrain.report.page import anchor_of, build_page
from pytest_gputrain.report.timeline import run_timeline
from pytest_gputrain.series import gaps, keep_extremes

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

GiB = 2**30
# A report of this many tests, each with ten minutes of NVML samples and 3,000 steps, must stay
# small enough to attach to a CI run.
MANY = 500
MANY_MAX_BYTES = 6_000_000


# -- thinning series ---------------------------------------------------------------------------


def test_thinning_keeps_the_extremes_of_every_column_within_the_limit() -> None:
    size = 10_000
    flat = [50.0] * size
    flat[1234] = 99.0  # a one-sample peak
    dips = [1.0] * size
    dips[7777] = -5.0  # and a one-sample dip in another column
    kept = keep_extremes([flat, dips], 600)
    assert len(kept) <= 600 and kept == sorted(kept)
    assert {0, size - 1, 1234, 7777} <= set(kept)


def test_short_series_are_kept_whole_and_gaps_measure_from_the_moment_before() -> None:
    assert keep_extremes([[1, 2, 3]], 600) == [0, 1, 2]
    assert keep_extremes([[None] * 5000], 100)[:1] == [0] and len(
        keep_extremes([[None] * 5000], 100)) <= 100
    assert gaps([1.0, 1.5, 3.0]) == [0.0, 0.5, 1.5]
    with pytest.raises(ValueError, match="same length"):
        keep_extremes([[1, 2], [1]], 10)


# -- the probe's timeline ----------------------------------------------------------------------


def test_a_cpu_training_run_records_its_steps_on_the_test_s_clock() -> None:
    probe = RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for (x,) in DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    probe.stop()
    timeline = probe.facts().timeline
    assert timeline.steps == 4 and timeline.step_number == [1, 2, 3, 4]
    assert timeline.step_end == sorted(timeline.step_end)
    assert math.isclose(timeline.step_end[-1], sum(timeline.step_time), abs_tol=1e-3)
    assert len(timeline.loader_wait) == 4 and all(w >= 0 for w in timeline.loader_wait)
    assert timeline.nvml_time == [] and "trained on cpu, not CUDA" in timeline.unknown["nvml_time"]
    assert timeline.window_start is None and timeline.memory_time == []


def test_the_timeline_keeps_the_steps_of_saves_and_syncs_for_the_findings_about_them(
        tmp_path: Path) -> None:
    """A checkpoint saved in the third step: its step is kept for the picture of GT140; each
    kept step has its time inside syncs (none on the CPU)."""
    probe = RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x,) in enumerate(DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16)):
        optimizer.zero_grad()
        model(x).sum().backward()
        if step == 2:
            torch.save(model.state_dict(), tmp_path / "checkpoint.pt")
        optimizer.step()
    probe.stop()
    timeline = probe.facts().timeline
    assert timeline.save_steps == [3]
    assert timeline.sync_wait == [0.0] * 4 and timeline.compile_steps == []


def test_the_timeline_puts_every_reading_on_one_clock() -> None:
    timeline = report_cases.recorded_timeline(
        [0.5, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1], [0.0, 0.05] + [0.0] * 5,
        allocated=[GiB * n for n in range(1, 8)], util=lambda t: 80.0,
        throttled=lambda t: t > 0.95, oom_at=1.2, window=(3, 5), nvml_start=0.5)
    assert timeline["step_end"] == pytest.approx([0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1])
    assert timeline["memory_time"] == timeline["step_end"]  # read after each step
    assert timeline["reserved"] == [a + GiB for a in timeline["allocated"]]
    # The window opens at the end of step 2 and closes at the end of step 5.
    assert (timeline["window_start"], timeline["window_end"]) == pytest.approx((0.6, 0.9))
    assert timeline["nvml_time"][0] == pytest.approx(0.5)  # the sampler started 0.5 s in
    assert timeline["throttled"][-1] is True and timeline["throttled"][0] is False
    assert timeline["oom_times"] == pytest.approx([1.2])


def test_long_runs_are_thinned_to_600_points_a_series() -> None:
    timeline = report_cases.recorded_timeline([0.01] * 5000, allocated=[GiB] * 5000,
                                              util=lambda t: 50.0 + (t > 25) * 40,
                                              interval=0.005)
    assert timeline["steps"] == 5000 and len(timeline["step_end"]) <= 600
    assert 600 >= len(timeline["nvml_time"]) > 100
    assert max(timeline["utilization"]) == 90.0 and min(timeline["utilization"]) == 50.0


def test_each_rank_s_steps_are_on_the_clock_of_the_first_event() -> None:
    probes = {0: {"step_ends": [10.0, 10.1, 10.2], "arrivals": {"1": 10.05, "2": 10.15}},
              1: {"step_ends": [10.0, 10.1, 10.2], "arrivals": {"1": 10.09, "2": 10.19}}}
    result = analysis.step_analysis(probes)
    assert result["step_ends"][0] == pytest.approx([0.0, 0.1, 0.2])
    assert result["step_waits"][0] == pytest.approx([0.0, 0.04, 0.04])  # waited for rank 1
    assert result["step_waits"][1] == pytest.approx([0.0, 0.0, 0.0])


# -- the page's data ---------------------------------------------------------------------------


def _series(timeline: dict[str, Any]) -> dict[str, list[str]]:
    return {chart["title"]: [s["label"] for t in chart["tables"] for s in t["series"]]
            for chart in timeline["charts"]}


def test_a_gpu_run_draws_utilisation_memory_power_and_steps() -> None:
    run = report_cases.out_of_memory().facts.records["run"][0]
    failure = report_cases.out_of_memory().facts.records["failure"][0]
    timeline = run_timeline(run, failure, 600)
    assert _series(timeline) == {
        "GPU utilisation and SM clock": ["GPU utilisation", "SM clock"],
        "Memory": ["allocated", "reserved", "device used (all processes)",
                   "this process (NVML)", "budget"],
        "Power and temperature": ["power", "temperature"],
        "Steps and DataLoader waits": ["step time", "DataLoader wait"],
    }
    markers = timeline["markers"]
    steps = markers["steps"]  # the window of steps 3-6: from the end of step 2 to that of 6
    assert len(steps) == 40 and markers["window"] == pytest.approx([steps[1], steps[5]])
    assert markers["failure"]["label"] == "oom"
    assert markers["failure"]["t"] == pytest.approx(markers["oom"][-1], abs=1e-3)


def test_series_that_were_not_recorded_are_left_out_with_the_reason() -> None:
    data = report_cases.load_fact_set("run_healthy_h200")  # recorded before the timeline
    timeline = run_timeline(data["runs"][0], None, 600)
    assert list(_series(timeline)) == ["Steps and DataLoader waits"]  # from step_times
    assert _series(timeline)["Steps and DataLoader waits"] == ["step time"]
    assert any(note.startswith("no GPU timeline") for note in timeline["notes"])
    assert any(note.startswith("no memory timeline") for note in timeline["notes"])
    assert len(timeline["markers"]["steps"]) == 200 and "failure" not in timeline["markers"]


def test_the_budget_line_is_drawn_only_where_the_run_came_near_it() -> None:
    timeline = run_timeline(report_cases.healthy().facts.records["run"][0], None, 600)
    assert "budget" not in _series(timeline)["Memory"]
    assert any("memory budget 140.4 GiB not drawn" in note for note in timeline["notes"])


def test_a_throttled_run_marks_when_the_clocks_were_held() -> None:
    timeline = run_timeline(report_cases.throttled().facts.records["run"][0], None, 600)
    (start, end), = timeline["markers"]["throttled"]
    assert start == pytest.approx(5.0, abs=0.11) and end == pytest.approx(timeline["end"])


def test_permalinks_are_stable_and_safe_as_ids() -> None:
    anchor = anchor_of("tests/test_x.py::test_a[cuda:0-bf16]")
    assert anchor == anchor_of("tests/test_x.py::test_a[cuda:0-bf16]")
    assert re.fullmatch(r"test-[A-Za-z0-9_-]+", anchor)
    assert anchor != anchor_of("tests/test_x.py::test_a[cuda:0-bf16 ]")


def test_findings_belong_to_their_test_and_outcomes_come_from_the_records() -> None:
    case = report_cases.straggler()
    page = build_page(case.report(), case.facts)
    test, = page.tests
    assert test.nodeid == "tests/test_ddp.py::test_ddp_train" and test.outcome == "passed"
    assert [f.code for f in test.findings] == ["GT301"] and test.worst == "warning"
    assert test.timelines[0]["kind"] == "lanes" and test.timelines[0]["straggler"] == 1
    failed = build_page(report_cases.out_of_memory().report(),
                        report_cases.out_of_memory().facts)
    assert [t.outcome for t in failed.tests] == ["failed"] and failed.outcomes_derived


# -- the page ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(report_cases.CASES))
def test_the_page_holds_every_finding_and_requests_nothing(name: str) -> None:
    case = report_cases.CASES[name]()
    findings = case.findings()
    page = report_html(case.report(), case.facts)
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    # Nothing is fetched: no element loads a file, no stylesheet is linked.
    assert not re.search(r"<(script|img|link|iframe)[^>]+(src|href)=", page)
    for finding in findings:
        assert f"<code>{finding.code}</code> {finding.name}" in page
    assert page.count('class="finding ') == len(findings) + sum(
        1 for f in findings if f.scope == "device")  # device findings also under their GPU
    assert "uPlot" in page and json.loads(re.search(
        r'<script type="application/json" id="gputrain-data">(.*?)</script>', page, re.S
    ).group(1))  # type: ignore[union-attr]


def test_the_inlined_scripts_cannot_close_their_element() -> None:
    for name, text in assets().items():
        assert "</script" not in text.lower() and "</style" not in text.lower(), name


def test_text_from_the_facts_is_escaped() -> None:
    data = report_cases.patch_facts(report_cases.load_fact_set("run_failure_h200"), {
        "failure.message": "<img src=x onerror=alert(1)></script>"})
    page = report_html(report_cases.Case("x", FactsFile.model_validate(data)).report(),
                       FactsFile.model_validate(data))
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_a_500_test_report_stays_a_few_megabytes(tmp_path: Path) -> None:
    case = report_cases.many_tests(MANY)
    page = report_html(case.report(), case.facts)
    size = len(page.encode("utf-8"))
    print(f"\n{MANY}-test report: {size / 1e6:.2f} MB")
    assert size < MANY_MAX_BYTES
    assert page.count('<details class="test"') == MANY


# -- where it is written -----------------------------------------------------------------------


def test_html_is_a_report_format(tmp_path: Path) -> None:
    assert parse_report_target("html:out/r", tmp_path, {}).format == "html"
    assert parse_report_target("r.HTML", tmp_path, {}).format == "html"
    with pytest.raises(ValueError, match=r"\.json, \.md or \.html"):
        parse_report_target("r.htm", tmp_path, {})


def _replay(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_gputrain", "replay", *args],
                          capture_output=True, text=True, cwd=cwd, check=False)


def test_replay_rebuilds_the_page_from_a_facts_file(tmp_path: Path) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text(report_cases.out_of_memory().facts.model_dump_json())
    done = _replay(str(facts), "--report", "html:out/report.html", "--report", "r.json",
                   cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # GT201 is an error
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "<code>GT201</code> cuda-out-of-memory" in page
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["error"] == 1
    bad = _replay(str(facts), "--report", "r.txt", cwd=tmp_path)
    assert bad.returncode == 2 and "--report: 'r.txt' must end in .json, .md or .html" in \
        bad.stderr


TRAIN = """
    import torch

    def test_train():
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()

    def test_plain():
        pass

    def test_skipped():
        import pytest
        pytest.skip("not here")
"""


def test_pytest_writes_the_page_with_every_test_s_outcome(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile(test_suite=TRAIN)
    # Its own process, as users run it: in-process, an earlier test's leftovers in this worker
    # dropped the plain tests from the page under pytest-xdist (not yet understood).
    result = pytester.runpytest_subprocess("--gpu-report=html:report.html",
                                           "--gpu-fail-on=never", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["gputrain: report written to *report.html"])
    page = (pytester.path / "report.html").read_text(encoding="utf-8")
    found = re.findall(r'data-outcome="(\w+)"[^>]*>\s*<summary>.*?<code>([^<]+)</code>',
                       page, re.S)
    assert {nodeid: outcome for outcome, nodeid in found} == {
        "test_suite.py::test_train": "passed", "test_suite.py::test_plain": "passed",
        "test_suite.py::test_skipped": "skipped"}
    assert "Steps and DataLoader waits" in json.dumps(
        json.loads(re.search(r'id="gputrain-data">(.*?)</script>', page, re.S).group(1)))  # type: ignore[union-attr]


def test_the_benchmarks_section_counts_cannot_tell_apart_from_ok() -> None:
    """The gate's verdicts on the page: counted by kind, "cannot tell" beside "ok", with the
    policy that applied, and each comparison's verdict in words."""
    from dataclasses import replace

    case = report_cases.benchmark_comparison()
    page = report_html(case.report(), case.facts)
    assert "1 regression" in page and "step_time: REGRESSION" in page
    assert "cannot-tell policy" not in page

    from pytest_gputrain.regression.compare import GateReport, GateSettings, MetricComparison
    from pytest_gputrain.regression.output import report_json

    decided = MetricComparison(nodeid="t::a", metric="step_time", verdict="ok",
                               threshold=0.01, reason="resolved")
    untold = replace(decided, nodeid="t::b", verdict="cannot_tell", sessions_to_decide=12,
                     reason="12 session(s) a side would decide")
    gate = GateReport(GateSettings({"step_time": 0.01}), comparisons=[decided, untold],
                      compare_spec="base")
    section = report_json(gate)
    untold_page = report_html(report_cases.Case("x", case.facts, {"benchmarks": section})
                              .report(), case.facts)
    assert re.search(r"1 ok,\s*1 cannot tell\s*\(cannot-tell policy: warn\)", untold_page)
    assert "step_time: CANNOT TELL" in untold_page

