"""What the HTML report shows, worked out from the report and the facts, before any HTML.

``build_page`` takes what the JSON report holds (the environment, the findings, the sections)
and the records of the facts file, and gives the verdict (``triage.headline``), the session
(environment, GPUs with their health, findings by code, the slowest and most memory-hungry
tests), each test (outcome, its row of the summary table, findings with where on the timeline
each happened, the timeline's lanes), what the rules say once for every test they fire on, the
ladders and the benchmark comparisons. A pytest session also passes each
test's outcome; a replay of a facts file derives it from the records (a test with a failure
record failed). Records are read as the facts file keeps them (plain JSON).
"""

from __future__ import annotations

import hashlib
import re
import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_gputrain.facts import DeviceFacts, FactsFile, device_subject
from pytest_gputrain.findings import Finding
from pytest_gputrain.report.model import Report
from pytest_gputrain.report.moments import finding_moments
from pytest_gputrain.report.sparkline import series_svg
from pytest_gputrain.report.terminal import header_lines
from pytest_gputrain.report.timeline import DeviceLimits, launch_lanes, run_timeline
from pytest_gputrain.report.triage import (
    COSTLY_PERCENT,
    FAILING,
    Figures,
    Headline,
    finding_cost,
    headline,
    no_timeline_words,
    test_figures,
)
from pytest_gputrain.series import keep_extremes
from pytest_gputrain.severity import SEVERITY_RANK
from pytest_gputrain.units import format_bytes

if TYPE_CHECKING:
    from pytest_gputrain.report.test_outputs import TestResult

# Points per series in the page: as many as the facts keep for a few tests, fewer for many, so
# that a report of hundreds of tests stays a few MB (every series keeps its extremes); a test
# that failed or has a warning gets FLAGGED_SHARE times a healthy one's, as its timeline is the
# one a reader zooms into.
POINT_BUDGET = 200_000
MAX_POINTS, MIN_POINTS = 600, 24
SERIES_PER_RUN = 12
FLAGGED_SHARE = 3
TOP_TESTS = 10  # rows of the slowest and the most memory-hungry tests
SESSION_SCOPES = ("session", "device")
SEVERITY_WORDS = {"error": "ERROR", "warning": "WARNING", "info": "INFO"}
SPARK_POINTS = 24  # points of a summary row's sparkline
COMMON_NOTE_TESTS = 3  # a note on this many tests is said once, above the tests


@dataclass
class FindingView:
    """A finding as a test shows it: the finding, its id on the page, where on the timeline it
    happened, and whether it starts open (its cost is large whatever its severity)."""

    finding: Finding
    id: str
    cost: float | None = None
    moment: dict[str, Any] = field(default_factory=dict)

    @property
    def costly(self) -> bool:
        return self.cost is not None and self.cost >= COSTLY_PERCENT


@dataclass
class TestView:
    __test__ = False  # not a test class, whatever pytest collects

    nodeid: str
    anchor: str
    outcome: str
    duration: float | None = None
    findings: list[FindingView] = field(default_factory=list)
    facts: list[tuple[str, str]] = field(default_factory=list)  # (name, value) one-liners
    failure: dict[str, Any] | None = None
    traceback: str | None = None
    timelines: list[dict[str, Any]] = field(default_factory=list)  # run charts, rank lanes
    notes: list[str] = field(default_factory=list)
    figures: Figures = field(default_factory=Figures)
    sparkline: str = ""

    @property
    def worst(self) -> str:
        """The most severe finding's severity, or "none"."""
        return max((f.finding.severity for f in self.findings),
                   key=SEVERITY_RANK.__getitem__, default="none")

    @property
    def codes(self) -> list[str]:
        return sorted({f.finding.code for f in self.findings})

    @property
    def titles(self) -> list[str]:
        """The findings' titles, most severe first, each once."""
        ordered = sorted(self.findings, key=lambda f: -f.finding.rank)
        return list(dict.fromkeys(f.finding.title for f in ordered))

    @property
    def peak_memory(self) -> int | None:
        return self.figures.peak_memory

    @property
    def failing(self) -> bool:
        return self.outcome in FAILING

    @property
    def starts_open(self) -> bool:
        """Failed, a warning or an error, or a finding whose cost is large."""
        return self.failing or self.worst in ("error", "warning") or \
            any(f.costly for f in self.findings)

    @property
    def data(self) -> dict[str, Any] | None:
        """What the page's script draws for this test (its timelines and its findings'
        moments), or None: the page keeps it in a block of its own, parsed when the test is
        first drawn, so that opening a page of hundreds of tests parses none of it."""
        if not self.timelines:
            return None
        return {"timelines": self.timelines,
                "moments": {f.id: f.moment for f in self.findings if f.moment}}

    @property
    def order(self) -> tuple[Any, ...]:
        """The summary's first order: failed first, then by worst severity, then by id."""
        return (not self.failing, -SEVERITY_RANK.get(self.worst, -1),
                not any(f.costly for f in self.findings), self.nodeid)


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
    subjects: list[tuple[str, str]]  # (subject, the page's anchor for it)
    outcomes: set[str] = field(default_factory=set)  # of the tests it was found on


@dataclass
class RuleText:
    """What a rule says the same way on every test it fires on: said once on the page."""

    code: str
    name: str
    title: str
    why: str
    references: list[str]


@dataclass
class Page:
    report: Report
    header: list[str]
    headline: Headline
    session_findings: list[Finding]
    devices: list[DeviceView]
    codes: list[CodeSummary]
    rules: list[RuleText]
    tests: list[TestView]
    slowest: list[TestView]
    hungriest: list[TestView]
    ladders: list[dict[str, Any]]
    benchmarks: dict[str, Any] | None
    other_sections: list[tuple[str, str]]  # (name, Markdown) of sections drawn as text
    outcomes_derived: bool
    outcome_counts: dict[str, int]
    common_notes: list[tuple[str, int]] = field(default_factory=list)  # said once, on n tests
    regression: dict[str, dict[str, Any]] = field(default_factory=dict)  # by test, see below

    def data(self) -> dict[str, Any]:
        """What the page's script draws besides the tests (``TestView.data``): the ladders'
        fits and the benchmark points."""
        return {
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


def _points_per_series(records: int, flagged: int) -> int:
    """A healthy run's points per series, with ``flagged`` of the ``records`` runs getting
    FLAGGED_SHARE times as many."""
    weight = records + (FLAGGED_SHARE - 1) * flagged
    return max(MIN_POINTS, min(MAX_POINTS, POINT_BUDGET // max(1, SERIES_PER_RUN * weight)))


def _limits(devices: list[DeviceFacts], run: dict[str, Any]) -> DeviceLimits:
    """The ranges of a run's lanes from its GPU's facts (by NVML index, else the one GPU)."""
    index = (run.get("nvml") or {}).get("index")
    found = [d for d in devices if d.index == index] or (devices if len(devices) == 1 else [])
    if not found:
        return DeviceLimits()
    device = found[0]
    return DeviceLimits(memory_total=device.memory_total, sm_clock_max=device.sm_clock_max,
                        power_limit=device.power_limit,
                        temperature_slowdown=device.temperature_slowdown)


def _sparkline(values: list[float] | None, nodeid: str) -> str:
    """The step times of a test as a sparkline of at most SPARK_POINTS points."""
    if not values or len(values) < 2:
        return ""
    kept = keep_extremes([values], SPARK_POINTS)
    return series_svg([round(values[i], 3) for i in kept], label=f"step times of {nodeid}",
                      width=120, height=24)


def _subject_anchor(subject: str, known: Mapping[str, Any],
                    devices: Mapping[str, str]) -> str:
    """Where on the page a finding's subject is: its test, its GPU, or the session."""
    if subject in devices:
        return devices[subject]
    test = _test_of(subject, known)
    return anchor_of(test) if test in known else "session"


def _common_notes(tests: list[TestView]) -> list[tuple[str, int]]:
    """Notes that several tests share, taken off them to be said once."""
    counts = Counter(note for test in tests for note in dict.fromkeys(test.notes))
    for timeline in (t for test in tests for t in test.timelines):
        counts.update(list(dict.fromkeys(timeline.get("notes") or [])))
    common = {note for note, count in counts.items() if count >= COMMON_NOTE_TESTS}
    for test in tests:
        test.notes = [note for note in test.notes if note not in common]
        for timeline in test.timelines:
            timeline["notes"] = [n for n in timeline.get("notes") or [] if n not in common]
    return sorted(((note, counts[note]) for note in common), key=lambda item: -item[1])


def baseline_steps(section: Any) -> dict[str, dict[str, Any]]:
    """Each compared test's baseline steps, from the regression gate's section
    (``sections["benchmarks"]["steps"]``): the label, median and quartiles in ms that its
    steps lane overlays."""
    found: dict[str, dict[str, Any]] = {}
    if not isinstance(section, dict):
        return found
    spec = section.get("compare") or "the baseline"
    for nodeid, item in (section.get("steps") or {}).items():
        sessions = [[float(v) for v in rounds if isinstance(v, int | float)]
                    for rounds in (item.get("baseline") or [])]
        values = sorted(v * 1e3 for rounds in sessions for v in rounds)
        if len(values) < 4:
            continue
        low, median, high = statistics.quantiles(values, n=4)
        found[str(nodeid)] = {
            "label": f"baseline {spec}: middle half of {len(values)} steps in "
                     f"{len(sessions)} session(s), {low:.3g}-{high:.3g} ms",
            "median": round(median, 4), "low": round(low, 4), "high": round(high, 4)}
    return found


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
    flagged = {nodeid for nodeid in known if failures.get(nodeid) or any(
        f.severity in ("error", "warning") for f in findings_by_test.get(nodeid, []))}
    base = _points_per_series(
        len(records.get("run", [])) + len(records.get("distributed", [])),
        sum(len(runs.get(n, [])) + len(launches.get(n, [])) for n in flagged))
    environment = report.environment
    gpu = bool(environment.devices)
    sections = dict(report.sections)
    baselines = baseline_steps(sections.get("benchmarks"))

    tests = []
    for nodeid in known:
        result = (results or {}).get(nodeid)
        anchor = anchor_of(nodeid)
        limit = min(MAX_POINTS, base * (FLAGGED_SHARE if nodeid in flagged else 1))
        test = TestView(nodeid=nodeid, anchor=anchor,
                        outcome=result.outcome if result else _outcome(nodeid, failures, launches),
                        findings=[FindingView(f, f"{anchor}-f{i}", finding_cost(f))
                                  for i, f in enumerate(findings_by_test.get(nodeid, []))])
        failure = failures[nodeid][-1] if failures.get(nodeid) else None
        test.failure = failure
        test.traceback = result.traceback if result else None
        last: dict[str, Any] | None = runs[nodeid][-1] if runs.get(nodeid) else None
        for run in runs.get(nodeid, []):
            test.facts = _run_facts(run)
            timeline = run_timeline(run, failure, limit, _limits(environment.devices, run),
                                    baselines.get(nodeid))
            if timeline["lanes"]:
                test.timelines.append(timeline)
                for view, moment in zip(test.findings, finding_moments(
                        [f.finding for f in test.findings], run, failure), strict=True):
                    view.moment = moment
            test.duration = run.get("duration")
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
        test.figures = test_figures(last, failure)
        test.sparkline = _sparkline(test.figures.step_times, nodeid)
        if not test.timelines and not launches.get(nodeid):
            test.notes.insert(0, no_timeline_words(last, failure, gpu))
        tests.append(test)
    tests.sort(key=lambda t: t.order)
    common = _common_notes(tests)

    devices = []
    device_anchors: dict[str, str] = {"session": "session"}
    for device in environment.devices:
        subject = device_subject(device)
        device_anchors[subject] = f"gpu-{device.index}"
        devices.append(DeviceView(device, subject,
                                  [f for f in session_findings if f.subject == subject],
                                  _device_figures(device)))
    outcome_of = {t.nodeid: t.outcome for t in tests}
    codes: dict[str, CodeSummary] = {}
    rules: dict[str, RuleText] = {}
    for finding in report.findings:
        summary = codes.setdefault(finding.code, CodeSummary(
            finding.code, finding.name, finding.title, finding.severity, 0, []))
        summary.count += 1
        target = _subject_anchor(finding.subject, known, device_anchors)
        if (finding.subject, target) not in summary.subjects:
            summary.subjects.append((finding.subject, target))
        outcome = outcome_of.get(_test_of(finding.subject, known))
        if outcome:
            summary.outcomes.add(outcome)
        rules.setdefault(finding.code, RuleText(finding.code, finding.name, finding.title,
                                                finding.why, list(finding.references)))
    timed = [t for t in tests if t.duration is not None]
    ladders = [_ladder(section) for name, section in sections.items()
               if name.startswith("ladder") and isinstance(section, dict)]
    benchmarks = sections.get("benchmarks")
    shown = {"runs", "distributed", "benchmarks"} | {n for n in sections if n.startswith("ladder")}
    others = [(name, str(section["markdown"])) for name, section in sections.items()
              if name not in shown and isinstance(section, dict) and "markdown" in section]
    outcome_counts = dict(Counter(t.outcome for t in tests))
    return Page(
        report=report,
        header=[line.removeprefix("gputrain: ") for line in header_lines(environment)],
        headline=headline(outcome_counts, report.summary, report.fail_on, report.failed,
                          results is None),
        session_findings=session_findings,
        devices=devices,
        codes=sorted(codes.values(), key=lambda c: (-SEVERITY_RANK[c.severity], c.code)),
        rules=sorted(rules.values(), key=lambda r: r.code),
        tests=tests,
        slowest=sorted(timed, key=lambda t: -(t.duration or 0.0))[:TOP_TESTS],
        hungriest=sorted((t for t in tests if t.peak_memory), key=lambda t: -(t.peak_memory or 0)
                         )[:TOP_TESTS],
        ladders=ladders,
        benchmarks=_benchmarks(benchmarks) if isinstance(benchmarks, dict) else None,
        other_sections=others,
        outcomes_derived=results is None,
        outcome_counts=outcome_counts,
        common_notes=common,
        regression=_regression_by_test(baselines, sections.get("benchmarks")),
    )


def _regression_by_test(baselines: dict[str, dict[str, Any]],
                        section: Any) -> dict[str, dict[str, Any]]:
    """What the gate compared for each test: the baseline its steps lane overlays, and the
    explanation of its per-step counters, base beside head (``regression.html.j2``)."""
    found: dict[str, dict[str, Any]] = {
        nodeid: {"baseline": baseline} for nodeid, baseline in baselines.items()}
    explanations = section.get("explanations") if isinstance(section, dict) else None
    for explanation in explanations or []:
        if isinstance(explanation, dict) and explanation.get("nodeid"):
            found.setdefault(str(explanation["nodeid"]), {})["explanation"] = explanation
    return found


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
