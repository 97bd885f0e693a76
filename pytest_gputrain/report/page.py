"""What the HTML report shows, worked out from the report and the facts, before any HTML.

``build_page`` takes what the JSON report holds (the environment, the findings, the sections)
and the records of the facts file, and gives the session (environment, GPUs with their health,
findings by code, the slowest and most memory-hungry tests), each test (outcome, findings,
timeline data), the ladders and the benchmark comparisons. A pytest session also passes each
test's outcome; a replay of a facts file derives it from the records (a test with a failure
record failed). Records are read as the facts file keeps them (plain JSON).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_gputrain.facts import DeviceFacts, FactsFile, device_subject
from pytest_gputrain.findings import Finding
from pytest_gputrain.report.model import Report
from pytest_gputrain.report.terminal import header_lines
from pytest_gputrain.report.timeline import launch_lanes, run_timeline
from pytest_gputrain.severity import SEVERITY_RANK
from pytest_gputrain.units import format_bytes

if TYPE_CHECKING:
    from pytest_gputrain.report.test_outputs import TestResult

# Points per series in the page: as many as the facts keep for a few tests, fewer for many, so
# that a report of hundreds of tests stays a few MB (every series keeps its extremes).
POINT_BUDGET = 300_000
MAX_POINTS, MIN_POINTS = 600, 60
TOP_TESTS = 10  # rows of the slowest and the most memory-hungry tests
SESSION_SCOPES = ("session", "device")
SEVERITY_WORDS = {"error": "ERROR", "warning": "WARNING", "info": "INFO"}


@dataclass
class TestView:
    __test__ = False  # not a test class, whatever pytest collects

    nodeid: str
    anchor: str
    outcome: str
    duration: float | None = None
    findings: list[Finding] = field(default_factory=list)
    facts: list[tuple[str, str]] = field(default_factory=list)  # (name, value) one-liners
    failure: dict[str, Any] | None = None
    timelines: list[dict[str, Any]] = field(default_factory=list)  # run charts, rank lanes
    notes: list[str] = field(default_factory=list)
    peak_memory: int | None = None

    @property
    def worst(self) -> str:
        """The most severe finding's severity, or "none"."""
        return max((f.severity for f in self.findings), key=SEVERITY_RANK.__getitem__,
                   default="none")

    @property
    def codes(self) -> list[str]:
        return sorted({f.code for f in self.findings})


@dataclass
class DeviceView:
    device: DeviceFacts
    subject: str
    findings: list[Finding]
    figures: list[tuple[str, str]]

    @property
    def health(self) -> str:
        worst = max((f.severity for f in self.findings), key=SEVERITY_RANK.__getitem__,
                    default=None)
        return {None: "healthy", "info": "healthy (notes)", "warning": "needs attention",
                "error": "unhealthy"}[worst]


@dataclass
class CodeSummary:
    code: str
    name: str
    title: str
    severity: str
    count: int
    subjects: list[str]


@dataclass
class Page:
    report: Report
    header: list[str]
    session_findings: list[Finding]
    devices: list[DeviceView]
    codes: list[CodeSummary]
    tests: list[TestView]
    slowest: list[TestView]
    hungriest: list[TestView]
    ladders: list[dict[str, Any]]
    benchmarks: dict[str, Any] | None
    other_sections: list[tuple[str, str]]  # (name, Markdown) of sections drawn as text
    outcomes_derived: bool
    outcome_counts: dict[str, int]

    def data(self) -> dict[str, Any]:
        """What the page's script draws: each test's timelines, the ladders' fits and the
        benchmark points, by anchor."""
        return {
            "tests": {t.anchor: t.timelines for t in self.tests if t.timelines},
            "ladders": [ladder["fit"] for ladder in self.ladders],
            "benchmarks": [c["points"] for c in (self.benchmarks or {}).get("comparisons", [])],
        }


def anchor_of(nodeid: str) -> str:
    """A permalink id that stays the same for the same test in every report."""
    readable = re.sub(r"[^A-Za-z0-9_-]+", "-", nodeid).strip("-")[-60:]
    digest = hashlib.sha1(nodeid.encode("utf-8")).hexdigest()[:8]
    return f"test-{readable}-{digest}"


def _test_of(subject: str, known: Mapping[str, Any]) -> str:
    """The test a finding is about: its subject, or a launch's ('test [2 ranks, nccl]')."""
    if subject in known:
        return subject
    head = subject.split(" [", 1)[0]
    return head if head in known else subject


def _seconds(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _run_facts(run: dict[str, Any]) -> list[tuple[str, str]]:
    memory, loader, nvml = run.get("memory") or {}, run.get("loader") or {}, run.get("nvml") or {}
    figures = [("device", str(run.get("device_name") or run.get("device") or "–")),
               ("steps", str(run.get("steps", 0))),
               ("median step", _seconds(run.get("step_time")))]
    if loader.get("wait_percent") is not None:
        figures.append(("DataLoader wait", f"{loader['wait_percent']:.1f} % of steps"))
    if memory.get("peak_memory") is not None:
        figures.append(("peak memory", format_bytes(memory["peak_memory"])))
    if memory.get("budget") is not None:
        figures.append(("budget", format_bytes(memory["budget"])))
    if nvml.get("utilization_mean") is not None:
        figures.append(("mean GPU utilisation", f"{nvml['utilization_mean']:.0f} %"))
    if nvml.get("throttle_percent"):
        figures.append(("throttled", f"{nvml['throttle_percent']:.0f} % of samples"))
    return figures


def _device_figures(device: DeviceFacts) -> list[tuple[str, str]]:
    figures: list[tuple[str, str]] = []
    if device.lost:
        return [("state", "LOST: fell off the bus or stopped answering")]
    if device.memory_total is not None:
        figures.append(("memory", f"{format_bytes(device.memory_used)} used of "
                                  f"{format_bytes(device.memory_total)}"))
    if device.temperature is not None:
        slowdown = (f" (slows down at {device.temperature_slowdown:.0f} °C)"
                    if device.temperature_slowdown is not None else "")
        figures.append(("temperature", f"{device.temperature:.0f} °C{slowdown}"))
    if device.power_draw is not None:
        limit = f" of {device.power_limit:.0f} W" if device.power_limit is not None else ""
        figures.append(("power", f"{device.power_draw:.0f} W{limit}"))
    if device.utilization_gpu is not None:
        figures.append(("utilisation", f"{device.utilization_gpu:.0f} %"))
    if device.sm_clock is not None:
        top = f" of {device.sm_clock_max:.0f}" if device.sm_clock_max is not None else ""
        figures.append(("SM clock", f"{device.sm_clock:.0f}{top} MHz"))
    if device.throttle_reasons:
        figures.append(("clock events", ", ".join(device.throttle_reasons)))
    if device.ecc_uncorrected_volatile:
        figures.append(("uncorrected ECC errors", str(device.ecc_uncorrected_volatile)))
    if device.other_process_count:
        figures.append(("other processes", f"{device.other_process_count} holding "
                                           f"{format_bytes(device.other_process_memory)}"))
    return figures


def _outcome(nodeid: str, failures: dict[str, list[dict[str, Any]]],
             launches: dict[str, list[dict[str, Any]]]) -> str:
    if failures.get(nodeid):
        return "failed"
    if any(launch.get("outcome") in ("failed", "timeout") for launch in launches.get(nodeid, [])):
        return "failed"
    return "passed"


def _points_per_series(records: int) -> int:
    return max(MIN_POINTS, min(MAX_POINTS, POINT_BUDGET // max(1, 10 * records)))


def build_page(report: Report, facts: FactsFile,
               results: Mapping[str, TestResult] | None = None) -> Page:
    records = facts.records
    runs: dict[str, list[dict[str, Any]]] = {}
    failures: dict[str, list[dict[str, Any]]] = {}
    launches: dict[str, list[dict[str, Any]]] = {}
    for run in records.get("run", []):
        runs.setdefault(str(run.get("nodeid", "")), []).append(run)
    for record in records.get("failure", []):
        failures.setdefault(str(record.get("nodeid", "")), []).append(record)
    for launch in records.get("distributed", []):
        launches.setdefault(str(launch.get("test") or "session"), []).append(launch)
    known: dict[str, None] = dict.fromkeys([*(results or {}), *runs, *failures, *launches])
    findings_by_test: dict[str, list[Finding]] = {}
    session_findings: list[Finding] = []
    for finding in report.findings:
        if finding.scope in SESSION_SCOPES:
            session_findings.append(finding)
        else:
            nodeid = _test_of(finding.subject, known)
            known.setdefault(nodeid, None)
            findings_by_test.setdefault(nodeid, []).append(finding)
    limit = _points_per_series(len(records.get("run", [])) + len(records.get("distributed", [])))

    tests = []
    for nodeid in known:
        result = (results or {}).get(nodeid)
        test = TestView(nodeid=nodeid, anchor=anchor_of(nodeid),
                        outcome=result.outcome if result else _outcome(nodeid, failures, launches),
                        findings=findings_by_test.get(nodeid, []))
        failure = failures[nodeid][-1] if failures.get(nodeid) else None
        test.failure = failure
        for run in runs.get(nodeid, []):
            test.facts = _run_facts(run)
            test.timelines.append(run_timeline(run, failure, limit))
            test.duration = run.get("duration")
            peak = (run.get("memory") or {}).get("peak_memory") or \
                (run.get("nvml") or {}).get("process_memory_max")
            test.peak_memory = peak if isinstance(peak, int) else test.peak_memory
        for launch in launches.get(nodeid, []):
            lanes = launch_lanes(launch, limit)
            if lanes is not None:
                lanes["title"] = (f"{launch.get('world_size')} ranks ({launch.get('backend')}), "
                                  f"{launch.get('outcome')}")
                test.timelines.append(lanes)
            else:
                why = (launch.get("unknown") or {}).get("steps") or "not recorded"
                test.notes.append(f"launch of {launch.get('world_size')} ranks: no per-rank "
                                  f"steps ({why})")
        if result is not None and result.duration is not None:
            test.duration = result.duration
        if not runs.get(nodeid) and not launches.get(nodeid):
            test.notes.append("no training recorded: the test stepped no optimizer, called no "
                              "module, iterated no DataLoader and used no CUDA"
                              if failure is None else
                              "no training recorded before the failure")
        tests.append(test)
    tests.sort(key=lambda t: (-SEVERITY_RANK.get(t.worst, -1), t.outcome == "passed", t.nodeid))

    devices = []
    for device in report.environment.devices:
        subject = device_subject(device)
        devices.append(DeviceView(device, subject,
                                  [f for f in session_findings if f.subject == subject],
                                  _device_figures(device)))
    codes: dict[str, CodeSummary] = {}
    for finding in report.findings:
        summary = codes.setdefault(finding.code, CodeSummary(
            finding.code, finding.name, finding.title, finding.severity, 0, []))
        summary.count += 1
        if finding.subject not in summary.subjects:
            summary.subjects.append(finding.subject)
    timed = [t for t in tests if t.duration is not None]
    sections = dict(report.sections)
    ladders = [_ladder(section) for name, section in sections.items()
               if name.startswith("ladder") and isinstance(section, dict)]
    benchmarks = sections.get("benchmarks")
    shown = {"runs", "distributed", "benchmarks"} | {n for n in sections if n.startswith("ladder")}
    others = [(name, str(section["markdown"])) for name, section in sections.items()
              if name not in shown and isinstance(section, dict) and "markdown" in section]
    return Page(
        report=report,
        header=[line.removeprefix("gputrain: ") for line in header_lines(report.environment)],
        session_findings=session_findings,
        devices=devices,
        codes=sorted(codes.values(), key=lambda c: (-SEVERITY_RANK[c.severity], c.code)),
        tests=tests,
        slowest=sorted(timed, key=lambda t: -(t.duration or 0.0))[:TOP_TESTS],
        hungriest=sorted((t for t in tests if t.peak_memory), key=lambda t: -(t.peak_memory or 0)
                         )[:TOP_TESTS],
        ladders=ladders,
        benchmarks=_benchmarks(benchmarks) if isinstance(benchmarks, dict) else None,
        other_sections=others,
        outcomes_derived=results is None,
        outcome_counts=dict(Counter(t.outcome for t in tests)),
    )


def _ladder(section: dict[str, Any]) -> dict[str, Any]:
    """A ladder's rungs and, for each largest-batch search, its memory-per-batch line."""
    fits = []
    for item in section.get("headroom") or []:
        probes = [(int(batch), int(peak)) for batch, peak in item.get("probes") or []]
        slope, intercept = _line(probes)
        predicted = item.get("predicted")
        top = max([b for b, _ in probes] + ([predicted] if predicted else []), default=1)
        fits.append({
            "precision": item.get("precision"), "budget": item.get("budget"),
            "predicted": predicted, "verified": item.get("verified"),
            "verified_peak": item.get("verified_peak"), "note": item.get("note") or "",
            "probes": probes,
            "line": [[0, intercept], [top, intercept + slope * top]] if slope is not None
            else [],
        })
    return {"name": section.get("name", ""), "rungs": section.get("rungs") or [],
            "fit": fits}


def _line(points: list[tuple[int, int]]) -> tuple[float | None, float]:
    """Least squares through (batch, bytes): bytes per sample and the fixed part."""
    if len(points) < 2:
        return None, float(points[0][1]) if points else 0.0
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return None, mean_y
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    return slope, mean_y - slope * mean_x


def _benchmarks(section: dict[str, Any]) -> dict[str, Any]:
    """The gate's comparisons with each side's session values (the spread behind a verdict)."""
    comparisons = []
    for item in section.get("comparisons") or []:
        baseline = (item.get("baseline") or {}).get("values") or []
        current = (item.get("current") or {}).get("values") or []
        # Times in milliseconds, as the gate's tables print them.
        unit, scale = ("ms", 1000.0) if str(item.get("metric", "")).endswith("time") else ("", 1.0)
        comparisons.append({**item, "points": {
            "label": f"{item.get('nodeid')} {item.get('metric')}", "unit": unit,
            "baseline": [float(v) * scale for v in baseline],
            "current": [float(v) * scale for v in current],
            "stray": [(item.get("baseline") or {}).get("stray"),
                      (item.get("current") or {}).get("stray")]}})
    return {**section, "comparisons": comparisons}
