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
from pytest_gputrain.report.model import build_report
from pytest_gputrain.report.page import anchor_of, build_page
from pytest_gputrain.report.prose import linked, markdown_html
from pytest_gputrain.report.timeline import DeviceLimits, run_timeline
from pytest_gputrain.series import gaps, keep_extremes
from pytest_gputrain.severity import SEVERITY_RANK

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
    """Each lane's series by label (a bars lane: its stack)."""
    return {lane["id"]: [s["label"] for s in lane["stack"]] if lane.get("kind") == "bars"
            else [s["label"] for t in lane["tables"] for s in t["series"]]
            for lane in timeline["lanes"]}


def _lane(timeline: dict[str, Any], name: str) -> dict[str, Any]:
    lane: dict[str, Any] = next(lane for lane in timeline["lanes"] if lane["id"] == name)
    return lane


def test_a_gpu_run_is_a_stack_of_lanes_on_honest_ranges() -> None:
    """Utilisation on 0-100 %, each quantity in a lane of its own (no twin axes), clocks and
    power from 0, temperature from 20 °C to the slowdown temperature, steps as stacked bars."""
    case = report_cases.out_of_memory()
    run, failure = case.facts.records["run"][0], case.facts.records["failure"][0]
    limits = DeviceLimits(memory_total=150 * GiB, sm_clock_max=1980.0, power_limit=700.0,
                          temperature_slowdown=87.0)
    timeline = run_timeline(run, failure, 600, limits)
    assert _series(timeline) == {
        "util": ["GPU utilisation"], "clock": ["SM clock"], "power": ["power"],
        "memory": ["allocated", "reserved", "device in use (all processes)",
                   "this process (NVML)"],
        "temperature": ["temperature"],
        "steps": ["DataLoader wait", "GPU busy", "host, GPU idle",
                  "host and GPU (no NVML sample)"],
    }
    ranges = {lane["id"]: lane["range"] for lane in timeline["lanes"]}
    assert ranges["util"] == [0, 100] and ranges["clock"][0] == 0 and ranges["power"][0] == 0
    assert ranges["clock"][1] >= 1980 and ranges["power"][1] >= 700
    assert ranges["temperature"][0] == 20 and ranges["temperature"][1] >= 87
    steps = _lane(timeline, "steps")
    assert len(steps["x"]) == 40 and steps["numbers"] == list(range(1, 41))
    # Each bar adds up to its step (ms), the loader wait first.
    totals = [sum(s["values"][i] for s in steps["stack"]) for i in range(40)]
    assert totals == pytest.approx([w * 1000 for w in steps["width"]], abs=0.05)
    # The 900 ms first step does not flatten the others: it is cut at the top.
    assert steps["range"][1] < 200 and max(totals) > 800
    markers = timeline["markers"]
    assert markers["window"] == pytest.approx([steps["x"][1], steps["x"][5]])
    assert markers["failure"]["label"] == "oom"
    assert markers["failure"]["t"] == pytest.approx(markers["oom"][-1], abs=1e-3)


def test_a_small_temperature_wobble_stays_flat_and_ticks_are_honest() -> None:
    run = report_cases.throttled().facts.records["run"][0]
    run["timeline"]["temperature"] = [39.0 + (i % 2) for i in range(len(
        run["timeline"]["nvml_time"]))]
    lane = _lane(run_timeline(run, None, 600), "temperature")
    low, high = lane["range"]
    assert low <= 20 and high - low >= 60  # a degree is a sliver, not a spike


def test_an_oom_failure_draws_the_limit_that_was_hit() -> None:
    """Another process held the GPU (recorded on the H200, 2026-12-02): the test failed before
    any optimizer step, so the memory lane runs from the allocator at the test's start to the
    allocator at the failure, and shows the budget that was left, the other process's share
    and the refused allocation."""
    case = report_cases.h200_sample("other_process_oom")
    run, failure = case.facts.records["run"][0], case.facts.records["failure"][0]
    timeline = run_timeline(run, failure, 600)
    memory = _lane(timeline, "memory")
    assert [lane["id"] for lane in timeline["lanes"]] == ["memory"]
    (table,) = memory["tables"]
    assert table["x"] == [0, timeline["markers"]["failure"]["t"]]
    assert [round(v, 2) for v in table["series"][0]["values"]] == [0, 2.25]  # GiB allocated
    (budget,) = [line for line in memory["lines"] if line["style"] == "limit"]
    assert budget["label"].startswith("budget 8.3 GiB (the device's memory less other")
    (band,) = memory["bands"]
    assert band["label"] == "other processes held 131.5 GiB"
    assert memory["request"]["label"] == "refused: 8.0 GiB more"
    assert memory["request"]["to"] > budget["value"] > memory["request"]["from"]
    fraction = run_timeline(*(lambda c: (c.facts.records["run"][0], c.facts.records[
        "failure"][0]))(report_cases.h200_sample("fraction_restored_oom")), 600)
    (limit,) = [line for line in _lane(fraction, "memory")["lines"] if line["style"] == "limit"]
    assert "set_per_process_memory_fraction(0.0286)" in limit["label"]


def test_series_that_were_not_recorded_are_left_out_with_the_reason() -> None:
    data = report_cases.load_fact_set("run_healthy_h200")  # recorded before the timeline
    timeline = run_timeline(data["runs"][0], None, 600)
    assert list(_series(timeline)) == ["steps"]  # from step_times
    assert _series(timeline)["steps"] == ["host and GPU (no NVML sample)"]
    assert any(note.startswith("no utilisation, clock, power or temperature lanes")
               for note in timeline["notes"])
    assert any(note.startswith("no memory lane") for note in timeline["notes"])
    assert len(_lane(timeline, "steps")["x"]) == 200 and "failure" not in timeline["markers"]


def test_the_budget_is_drawn_only_where_the_run_came_near_it() -> None:
    timeline = run_timeline(report_cases.healthy().facts.records["run"][0], None, 600)
    memory = _lane(timeline, "memory")
    assert memory["lines"] == []
    assert "budget 140.4 GiB, at most 21 % used: not drawn" in memory["note"]


def test_findings_are_placed_where_they_happened() -> None:
    """GT140's saves, GT102's starved steps, GT142's NaN loss: spans on the lanes they are
    about; GT201's failure on the memory lane."""
    page = build_page(*(lambda c: (c.report(), c.facts))(report_cases.h200_suite()))
    moments = {f.finding.code: f.moment for t in page.tests for f in t.findings}
    assert moments["GT140"]["lanes"] == ["steps", "util"] and moments["GT140"]["spans"]
    assert moments["GT102"]["spans"] and "DataLoader" in moments["GT102"]["label"]
    start, end = moments["GT142"]["spans"][0]
    assert "from step 9 on" in moments["GT142"]["label"] and end > start > 0
    assert moments["GT201"]["lanes"] == ["memory"] and moments["GT201"]["spans"]
    assert moments["GT212"] == {}  # failed in a DataLoader worker: no timeline to mark
    assert moments["GT128"]["label"].endswith("the profiler window these figures were "
                                              "measured in")


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
    assert [f.finding.code for f in test.findings] == ["GT301"] and test.worst == "warning"
    assert test.timelines[0]["kind"] == "lanes" and test.timelines[0]["straggler"] == 1
    failed = build_page(report_cases.out_of_memory().report(),
                        report_cases.out_of_memory().facts)
    assert [t.outcome for t in failed.tests] == ["failed"] and failed.outcomes_derived


# -- triage: the verdict and the summary ---------------------------------------------------------


def test_the_headline_is_red_when_a_test_failed_whatever_the_diagnosis_gate() -> None:
    """A suite with failed tests whose diagnosis never fails the run (gpu_fail_on = never)
    still reads as failed, in the headline and the tab's title; outcomes and the diagnosis are
    said apart."""
    case = report_cases.h200_suite()
    report = build_report(case.facts.environment, case.findings(), "never", {})
    page = build_page(report, case.facts)
    line = page.headline
    assert line.failed and line.tests.startswith("5 of 14 tests failed")
    assert line.gate == "The diagnosis does not fail the run (gpu_fail_on = never)."
    assert line.title.startswith("FAILED: 5 of 14 tests failed")
    html = report_html(report, case.facts)
    assert '<h1 class="headline failed" id="headline">' in html
    assert re.search(r"<title>FAILED: 5 of 14 tests failed", html)
    healthy = report_cases.healthy()
    calm = build_page(healthy.report(), healthy.facts).headline
    assert not calm.failed and calm.tests.startswith("The test passed")


def test_the_summary_has_a_row_per_test_failed_and_most_severe_first() -> None:
    case = report_cases.h200_suite()
    page = build_page(case.report(), case.facts)
    assert len(page.tests) == 14
    outcomes = [t.outcome for t in page.tests]
    assert outcomes == ["failed"] * 5 + ["passed"] * 9
    ranks = [SEVERITY_RANK.get(t.worst, -1) for t in page.tests[5:]]
    assert ranks == sorted(ranks, reverse=True)
    starved = next(t for t in page.tests if "starved_loader" in t.nodeid)
    assert starved.titles == ["The GPU waits for the DataLoader"] or \
        "The GPU waits for the DataLoader" in starved.titles
    assert starved.figures.loader_wait is not None and starved.figures.loader_wait > 90
    assert starved.sparkline.startswith("<svg") and starved.starts_open
    # A forgotten profiler costs every step: a warning by its measured cost, the test open.
    profiler = next(t for t in page.tests if "profiler_left_on" in t.nodeid)
    assert profiler.worst == "warning" and profiler.starts_open
    healthy = next(t for t in page.tests if "healthy_resnet" in t.nodeid)
    assert not healthy.starts_open


def test_a_failed_test_without_a_timeline_says_why_in_words_that_fit_it() -> None:
    case = report_cases.h200_suite()
    page = build_page(case.report(), case.facts)
    words = {t.nodeid.split("/")[2]: " ".join(t.notes) for t in page.tests if t.failing}
    assert "in a DataLoader worker process" in words["cuda_in_dataset"]
    assert "failed with a device mismatch error after 1 forward" in words["device_mismatch"]
    assert all("CPU run" not in text for text in words.values())
    ooms = [t for t in page.tests if t.failing and "oom" in t.nodeid]
    assert len(ooms) == 3 and all(any(lane["id"] == "memory" for lane in t.timelines[0][
        "lanes"]) for t in ooms)


def test_what_a_rule_says_on_every_test_is_said_once() -> None:
    case = report_cases.many_tests(9)  # GT102 on three tests
    html = report_html(case.report(), case.facts)
    why = case.findings()[0].why
    assert len(case.findings()) == 3
    assert html.count("<code>GT102</code> dataloader-starvation") == 1  # the rule's heading
    assert html.count(str(markdown_html(why))) == 1
    assert html.count('href="#rule-GT102"') == 4  # three findings and the codes table


def test_rule_text_is_markdown_with_safe_links_only() -> None:
    html = str(markdown_html("Use `torch.no_grad()`; see [docs](https://docs.pytorch.org/x) "
                             "or [this](javascript:alert(1)) <script>alert(1)</script>"))
    assert "<code>torch.no_grad()</code>" in html
    assert '<a href="https://docs.pytorch.org/x" rel="noopener noreferrer">docs</a>' in html
    assert "javascript:" not in html.replace("[this](javascript:alert(1))", "") and \
        "<script>" not in html
    refs = str(linked("https://docs.pytorch.org/docs/stable/data.html#x). javascript:alert(1)"))
    assert refs.startswith('<a href="https://docs.pytorch.org/docs/stable/data.html#x" ')
    assert refs.endswith("). javascript:alert(1)")


def test_the_steps_lane_overlays_the_baseline_the_gate_compared_with() -> None:
    case = report_cases.benchmark_comparison()
    page = build_page(case.report(), case.facts)
    (test,) = page.tests
    steps = _lane(test.timelines[0], "steps")
    (band,) = steps["bands"]
    assert band["style"] == "baseline" and band["label"].startswith("baseline base-17")
    assert steps["lines"][0]["label"].startswith("baseline median 43")
    assert page.regression[test.nodeid]["baseline"]["median"] == steps["lines"][0]["value"]
    html = report_html(case.report(), case.facts)
    assert 'class="regression"' in html and "The steps lane overlays the baseline" in html


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
    data = report_cases.page_data(page)  # every block parses
    assert "uPlot" in page and sorted(data) == ["benchmarks", "ladders", "tests"]


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

    def test_checks_the_loss():
        loss = 0.62
        assert loss >= 0.8, "the loss did not go down"
"""


def test_pytest_writes_the_page_with_every_test_s_outcome(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    """Each test's outcome, and a failed test's traceback preformatted; the headline is red
    although the diagnosis never fails the run."""
    use_facts("cpu_laptop")
    pytester.makepyfile(test_suite=TRAIN)
    # Its own process, as users run it: in-process, an earlier test's leftovers in this worker
    # dropped the plain tests from the page under pytest-xdist (not yet understood).
    result = pytester.runpytest_subprocess("--gpu-report=html:report.html",
                                           "--gpu-fail-on=never", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, skipped=1, failed=1)
    result.stdout.fnmatch_lines(["gputrain: report written to *report.html"])
    page = (pytester.path / "report.html").read_text(encoding="utf-8")
    found = re.findall(r'<details class="test"[^>]*data-outcome="(\w+)"[^>]*>\s*<summary>.*?'
                       r'<code class="nodeid">([^<]+)</code>', page, re.S)
    assert {nodeid: outcome for outcome, nodeid in found} == {
        "test_suite.py::test_train": "passed", "test_suite.py::test_plain": "passed",
        "test_suite.py::test_skipped": "skipped", "test_suite.py::test_checks_the_loss": "failed"}
    assert re.search(r"<title>FAILED: 1 of 4 tests failed", page)
    traceback = re.search(r'<details class="traceback" open><summary>Traceback.*?<pre>(.*?)</pre>',
                          page, re.S)
    assert traceback is not None
    assert "assert loss &gt;= 0.8" in traceback.group(1) and "\n" in traceback.group(1)
    assert "Steps: where each step" in json.dumps(report_cases.page_data(page))


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



def test_a_compared_test_shows_its_counters_base_beside_head() -> None:
    """The gate's explanation of a test's per-step counters (sections.benchmarks.explanations)
    sits in that test's own block, next to its timeline, opened where a counter rose."""
    from test_regression_counters import ITEM, counted, sides

    from pytest_gputrain.regression import explain

    case = report_cases.benchmark_comparison()
    (nodeid,) = case.sections["benchmarks"]["steps"]
    explanation = explain.explain(nodeid, *sides(counted(), counted(
        syncs=1, sync_sites=[{**ITEM, "code": "print(loss.item())"}])))
    assert explanation is not None and explanation["changes"]
    case.sections["benchmarks"]["explanations"] = [explanation]
    page = build_page(case.report(), case.facts)
    assert page.regression[nodeid]["explanation"] is explanation
    html = report_html(case.report(), case.facts)
    block = html[html.index('class="regression"'):]
    block = block[:block.index("</div>")]
    assert '<details class="explanation changed" open' in block
    assert "+1 sync per step" in block and "print(loss.item())" in block
