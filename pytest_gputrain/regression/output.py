"""What the gate shows: a terminal table, Markdown for CI summaries, and a JSON document."""

from __future__ import annotations

import datetime
from typing import Any

from tabulate import tabulate

from pytest_gputrain.regression import counters, explain, policy, stats
from pytest_gputrain.regression.benchmark import BenchmarkResult
from pytest_gputrain.regression.compare import VERDICTS, GateReport, MetricComparison
from pytest_gputrain.regression.store import runs_label
from pytest_gputrain.units import format_bytes, format_duration, printable

JSON_KIND = "pytest-gputrain-benchmarks"
JSON_SCHEMA_VERSION = 3  # 3: benchmarks' counters, comparisons' cause/exact/bound, explanations
COMPARE_HEADERS = ("test", "metric", "sessions (base/cur)", "baseline", "current", "change",
                   "detectable", "p", "verdict")
BENCH_HEADERS = ("test", "device", "rounds", "median", "IQR", "min", "peak VRAM", "util",
                 "throttled")
Line = tuple[str, dict[str, bool]]


def format_metric(metric: str, value: float | None) -> str:
    if value is None:
        return "–"
    if metric in counters.COUNTERS:
        return counters.amount(metric, value)
    if metric == "peak_vram":
        return format_bytes(value)
    return format_duration(value, precise=True)


def format_change(change: float | None, comparable: bool = True) -> str:
    if not comparable:
        return "–"
    if change is None:
        return "+inf"
    return f"{change * 100:+.2f} %"


def format_p(p: float | None) -> str:
    if p is None:
        return "–"
    if p < 1e-4:
        return "<1e-4"
    return f"{p:.2g}" if p < 0.01 else f"{p:.3f}"


def _verdict(comparison: MetricComparison) -> str:
    label = comparison.label
    if comparison.verdict == "regression" and comparison.threshold is not None:
        label += f" (> {comparison.threshold * 100:g} %)"
    if comparison.verdict == "cannot_tell" and comparison.spread is not None:
        needed = comparison.sessions_to_decide
        label += f" ({needed} a side)" if needed is not None else " (no number a side)"
    if comparison.unlike:
        label += " (unlike)"
    if comparison.forced:
        label += " (forced)"
    return label


def _sessions(comparison: MetricComparison) -> str:
    text = f"{comparison.baseline_sessions}/{comparison.current_sessions}"
    left_out = comparison.baseline_left_out + comparison.current_left_out
    if left_out:
        text += f" ({comparison.baseline_left_out}/{comparison.current_left_out} left out)"
    return text


def _change(c: MetricComparison, compared: bool) -> str:
    """The change: relative, and for an exact counter the difference per step too (a count
    that was 0 has no relative change)."""
    if (not compared or c.metric not in counters.EXACT or c.baseline_value is None
            or c.current_value is None):
        return format_change(c.change, compared)
    difference = counters.amount(c.metric, c.current_value - c.baseline_value, signed=True)
    if c.change is None:
        return difference
    return f"{difference} ({format_change(c.change)})" if c.change else "0"


def comparison_rows(report: GateReport) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for c in report.comparisons:
        compared = c.verdict not in ("new", "not_comparable", "insufficient_data")
        detectable = ("exact" if c.exact else
                      "–" if c.detectable is None else f"{c.detectable * 100:.1f} %")
        rows.append((c.nodeid, c.metric, _sessions(c),
                     format_metric(c.metric, c.baseline_value),
                     format_metric(c.metric, c.current_value),
                     _change(c, compared), detectable, format_p(c.p_value), _verdict(c)))
    return rows


def _gpu_time(result: BenchmarkResult) -> str:
    """The median GPU time per step, and how many queued rounds it comes from."""
    if result.gpu_time is None:
        return "–"
    queued = result.gpu_times
    if not queued:
        return f"– (0/{len(result.gpu_time)} queued)"
    text = format_duration(stats.median(queued), precise=True)
    return text if len(queued) == len(result.gpu_time) else \
        f"{text} ({len(queued)}/{len(result.gpu_time)} queued)"


def _measured_gpu_time(report: GateReport) -> bool:
    return any(b.gpu_time is not None for b in report.benchmarks)


def _counted(report: GateReport) -> bool:
    return any(b.counters for b in report.benchmarks)


def per_step(counted: dict[str, Any] | None) -> str:
    """A benchmark's main counters in one cell: ``612 kernels, 0 syncs, host 6.412 ms
    (launch-bound)``."""
    if not counted:
        return "–"
    found = counted.get("per_step") or {}
    parts = [f"{counters.amount(name, found[name])} {counters.WORDS[name][1]}"
             for name in ("kernels", "syncs") if isinstance(found.get(name), int | float)]
    copies = [found.get(name) for name in ("h2d_copies", "d2h_copies")]
    if any(isinstance(v, int | float) and v for v in copies):
        parts.append(f"{counters.amount('h2d_copies', copies[0] or 0)} H2D / "
                     f"{counters.amount('d2h_copies', copies[1] or 0)} D2H copies")
    if not parts and isinstance(found.get("ops"), int | float):
        parts.append(f"{counters.amount('ops', found['ops'])} ATen ops")
    host = counted.get("host_cpu") or []
    if host:
        parts.append(f"host {counters.amount('host_cpu', min(host))}")
    kind = (counted.get("bound") or {}).get("kind")
    text = ", ".join(parts) or "–"
    return f"{text} ({policy.KIND_WORDS.get(kind)})" if kind else text


def bench_headers(report: GateReport) -> tuple[str, ...]:
    """The benchmarks table's columns; "GPU time" where some benchmark measured it, "per step"
    where some was counted."""
    headers: tuple[str, ...] = BENCH_HEADERS
    if _measured_gpu_time(report):
        headers = (*headers[:6], "GPU time", *headers[6:])
    if _counted(report):
        headers = (*headers, "per step")
    return headers


def benchmark_rows(report: GateReport) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    gpu_time = _measured_gpu_time(report)
    counted = _counted(report)
    for b in sorted(report.benchmarks, key=lambda r: r.nodeid):
        util = b.utilization_mean
        row = [b.nodeid, b.device, str(b.rounds), format_duration(b.median, precise=True),
               format_duration(b.iqr, precise=True), format_duration(b.min, precise=True),
               format_bytes(b.peak_vram_max) if b.peak_vram else "–",
               "–" if util is None else f"{util:.0f} %",
               f"{b.throttled_count}/{b.rounds}" if b.throttled_count else "0"]
        if gpu_time:
            row.insert(6, _gpu_time(b))
        if counted:
            row.append(per_step(b.counters))
        rows.append(tuple(row))
    return rows


def headline(report: GateReport) -> str:
    names = {"regression": "regression(s)", "improvement": "improvement(s)", "ok": "ok",
             "cannot_tell": "cannot tell", "not_comparable": "not comparable",
             "insufficient_data": "insufficient data", "new": "new"}
    parts = [f"{report.count(v)} {names[v]}" for v in VERDICTS if report.count(v)]
    return ", ".join(parts) or "nothing compared"


def _threshold(metric: str, threshold: float) -> str:
    if metric in counters.EXACT and threshold == 0:
        return f"{metric} any rise"
    return f"{metric} {threshold * 100:g} %"


def _rule(report: GateReport) -> str:
    settings = report.settings
    gate = ", ".join(_threshold(m, t) for m, t in settings.thresholds.items()) or "–"
    summary = ("fastest clean step" if settings.step_summary == "min"
               else "median clean step")
    text = (f"a regression needs a change past the threshold ({gate}) and p < "
            f"{settings.alpha:g} over sessions (t-test on each session's {summary}; spread "
            "between sessions from both sides' repeated sessions and the store's history)")
    if settings.auto:
        kinds = []
        for kind in ("launch", "gpu", "host"):
            extra = [_threshold(m, t) for m, t in policy.BY_KIND[kind].items()
                     if m not in settings.thresholds and m not in settings.off]
            if extra:
                kinds.append(f"{policy.KIND_WORDS[kind]}: {', '.join(extra)}")
        text += ("; by the kind of each test's step (the default policy): " + "; ".join(kinds)
                 + "; an exact counter that rose is a regression on its own evidence")
    return text


def _sides(report: GateReport) -> str:
    current = runs_label(report.current_runs) if report.current_runs else "this session"
    return f"{current} compared with {runs_label(report.baseline_runs)}"


def _findings(report: GateReport) -> list[tuple[str, str | None]]:
    """(text, kind) lines after the table: regressions with their reasons, sides that are not
    like for like, environments that differ, and why some tests cannot be told."""
    found: list[tuple[str, str | None]] = []
    for c in report.regressions:
        found.append((f"REGRESSION {c.nodeid} {c.metric}: {c.reason}", "red"))
    unlike: dict[str, tuple[str, ...]] = {}
    for c in report.comparisons:
        if c.unlike:
            unlike.setdefault(c.nodeid, c.unlike)
    for nodeid, differences in unlike.items():
        found.append((f"not like for like: {nodeid}: {'; '.join(differences)}", "yellow"))
    for nodeid, mismatch in report.mismatches().items():
        described = "; ".join(d.describe() for d in mismatch if d.strict)
        found.append((f"not comparable: {nodeid}: environment differs: {described}", "yellow"))
    for drift in report.drifts:
        found.append((f"DRIFT {drift.nodeid} {drift.metric}: {drift.describe()} (no single "
                      "comparison shows it; not a failure)", "yellow"))
    failing = {(c.nodeid, c.metric) for c in report.regressions}
    for x in report.explanations:
        gated_here = {m for n, m in failing if n == x["nodeid"]} & set(counters.EXACT)
        if x.get("changes") and not gated_here:
            found.append((f"counted per step in {x['nodeid']}: {'; '.join(x['changes'])} (not "
                          "gated for this test's kind of step; the clock judges it)", None))
    untold = report.undecided
    if untold:
        first = untold[0]
        found.append((f"cannot tell ({len(untold)} metric(s)): {first.nodeid} {first.metric} "
                      f"{first.reason}", "red" if report.failed else "yellow"))
    if report.session_budget is not None:
        found.append((_sequential(report, report.session_budget), None))
    return found


def _sequential(report: GateReport, budget: int) -> str:
    """The sequential recipe's next step: another pair of sessions, or stop."""
    needed = report.sessions_to_decide(budget)
    if needed is not None:
        return (f"more sessions would decide: {needed} a side (budget {budget}); run another "
                "pair of sessions and compare again (exit status 3)")
    if report.regressions:
        return "decided: a regression; no more sessions needed"
    if report.undecided:
        return (f"no more sessions within the budget of {budget} a side would decide; the "
                f"'cannot tell' policy ({report.settings.cannot_tell}) applies")
    return "decided: no more sessions needed"


def compare_lines(report: GateReport) -> list[Line]:
    """The comparison as terminal lines, each with markup flags (red, green...)."""
    lines: list[Line] = [(_sides(report), {"bold": True}), (_rule(report), {})]
    if report.comparisons:
        lines.append((tabulate(comparison_rows(report), headers=COMPARE_HEADERS,
                               disable_numparse=True), {}))
    for text, kind in _findings(report):
        lines.append((text, {kind: True} if kind else {}))
    lines.append(_outcome(report))
    return [(printable(text), markup) for text, markup in lines]  # names from the store


def _outcome(report: GateReport) -> Line:
    """The gate's last line: a regression, a "cannot tell" that the policy fails or warns of,
    or a pass; "cannot tell" is counted apart from "ok" in every case."""
    policy = f"cannot-tell policy: {report.settings.cannot_tell}"
    if report.regressions:
        names = ", ".join(f"{c.nodeid} {c.metric} {format_change(c.change)}"
                          for c in report.regressions)
        return f"performance regression: {names}", {"red": True, "bold": True}
    if report.failed:
        return f"gate failed: {headline(report)} ({policy})", {"red": True, "bold": True}
    if report.warned:
        return (f"gate passed with a warning: {headline(report)} ({policy})",
                {"yellow": True, "bold": True})
    return f"gate passed: {headline(report)}", {"green": True}


def has_content(report: GateReport) -> bool:
    """Whether the gate has anything to show (benchmarks, a comparison, notes, a saved run)."""
    return bool(report.benchmarks or report.compare_spec or report.notes
                or report.saved_run is not None)


def terminal_lines(report: GateReport) -> list[Line]:
    """Lines for the pytest terminal summary."""
    lines: list[Line] = []
    if report.benchmarks:
        lines.append((tabulate(benchmark_rows(report), headers=bench_headers(report),
                               disable_numparse=True), {}))
    if report.compare_spec:
        lines.append(("", {}))
        if not report.baseline_runs:
            lines.append((f"gpu_compare={report.compare_spec}: no saved run to compare with",
                          {"yellow": True}))
        else:
            lines.extend(compare_lines(report))
    for note in report.notes:
        lines.append((note, {"yellow": True}))
    if report.saved_run is not None:
        lines.append((f"saved {report.saved_run.label()} with "
                      f"{report.saved_run.result_count} result(s)", {}))
    return [(printable(text), markup) for text, markup in lines]


def markdown(report: GateReport) -> str:
    """The gate for a CI summary (``GITHUB_STEP_SUMMARY``), under its own heading: a document
    of its own, HTML escaped (``report.visible_text``)."""
    from pytest_gputrain.report.visible_text import markdown_document

    lines = ["## GPU performance gate", "", *_markdown_lines(report)]
    return markdown_document("\n".join(lines).rstrip() + "\n\n")


def markdown_body(report: GateReport) -> str:
    """The gate's verdict, comparisons, benchmarks and notes in Markdown, without a heading
    (for a section of the diagnosis's Markdown report, under its ``###`` heading)."""
    return printable("\n".join(_markdown_lines(report, "####")).strip() + "\n")


def _markdown_lines(report: GateReport, subheading: str = "###") -> list[str]:
    out: list[str] = []
    if report.baseline_runs:
        status = ("**Regression** :x:" if report.regressions else
                  "**Cannot tell** :x:" if report.failed else
                  "Passed, but **cannot tell** :warning:" if report.warned else
                  "Passed :white_check_mark:")
        out.append(f"{status}: {headline(report)}. {_sides(report)}; {_rule(report)}.")
        out.append("")
        if report.comparisons:
            out.append(tabulate(comparison_rows(report), headers=COMPARE_HEADERS,
                                tablefmt="github", disable_numparse=True))
            out.append("")
        for text, _ in _findings(report):
            out.append(f"- {text}")
    elif report.compare_spec:
        out.append(f"No saved run matches `{report.compare_spec}`: nothing compared.")
    out.extend(explain.markdown(report.explanations, subheading))
    if report.benchmarks:
        out.extend(["", f"{subheading} Benchmarks", "",
                    tabulate(benchmark_rows(report), headers=bench_headers(report),
                             tablefmt="github", disable_numparse=True)])
    for note in report.notes:
        out.append(f"- {note}")
    if report.saved_run is not None:
        out.append(f"- saved {report.saved_run.label()}")
    return out


def cannot_tell_json(report: GateReport) -> dict[str, Any]:
    """The "cannot tell" comparisons, the policy applied to them, and for the sequential
    recipe (``compare --max-sessions``) whether more sessions would decide."""
    budget = report.session_budget
    needed = report.sessions_to_decide(budget) if budget is not None else None
    return {"policy": report.settings.cannot_tell, "count": len(report.undecided),
            "warned": report.warned, "session_budget": budget,
            "more_sessions": needed is not None, "sessions_to_decide": needed}


def report_section(report: GateReport) -> dict[str, Any]:
    """The gate in the ``--gpu-report`` files: ``sections["benchmarks"]`` (docs/report-schema.md);
    each comparison as in ``--gpu-benchmark-json``, and the Markdown the Markdown report
    prints."""
    return {
        "compare": report.compare_spec,
        "baseline_runs": [{"id": run.id, "name": run.name, "created_at": run.created_at,
                           "commit": run.commit} for run in report.baseline_runs],
        "failed": report.failed,
        "summary": {v: report.count(v) for v in VERDICTS},
        "cannot_tell": cannot_tell_json(report),
        "comparisons": [c.to_json() for c in report.comparisons],
        "explanations": list(report.explanations),
        "drifts": [d.to_json() for d in report.drifts],
        "notes": list(report.notes),
        "saved_run_id": report.saved_run.id if report.saved_run else None,
        "steps": _steps_json(report),
        "markdown": markdown_body(report),
    }


def _steps_json(report: GateReport) -> dict[str, dict[str, Any]]:
    """Each compared test's step times per round (s): ``baseline``, one list per baseline
    session, and ``current``, this session's. The HTML report's steps lane overlays them."""
    current = {result.nodeid: list(result.step_time) for result in report.benchmarks}
    return {nodeid: {"metric": "step_time", "baseline": sessions,
                     "current": current.get(nodeid, [])}
            for nodeid, sessions in sorted(report.baseline_steps.items())}


def _benchmark_json(result: BenchmarkResult) -> dict[str, Any]:
    record = result.to_record()
    return {"nodeid": record["nodeid"], "device": record["device"], "timer": record["timer"],
            "fingerprint": record["fingerprint"], "summary": record["summary"],
            "metrics": record["metrics"], "counters": record["counters"]}


def report_json(report: GateReport) -> dict[str, Any]:
    """The ``--gpu-benchmark-json`` / ``compare --format json`` document (``kind`` and
    ``schema_version`` identify it)."""
    from pytest_gputrain.regression.compare import session_fingerprint
    from pytest_gputrain.regression.fingerprint import fingerprint_hash

    fingerprint = session_fingerprint(report.benchmarks)
    return {
        "kind": JSON_KIND,
        "schema_version": JSON_SCHEMA_VERSION,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"),
        "run": {
            "name": report.save_name,
            "saved_run_id": report.saved_run.id if report.saved_run else None,
            "commit": report.commit,
            "fingerprint": fingerprint,
            "fingerprint_hash": fingerprint_hash(fingerprint) if fingerprint else None,
        },
        "settings": {"alpha": report.settings.alpha,
                     "thresholds": report.settings.thresholds,
                     "policy": policy.AUTO if report.settings.auto else None,
                     "off": sorted(report.settings.off),
                     "step_summary": report.settings.step_summary,
                     "cannot_tell": report.settings.cannot_tell,
                     "force": report.settings.force, "compare": report.compare_spec},
        "baseline": {"spec": report.compare_spec,
                     "runs": [run.to_json() for run in report.baseline_runs]},
        "current": {"spec": report.current_spec,
                    "runs": [run.to_json() for run in report.current_runs]},
        "benchmarks": [_benchmark_json(b) for b in sorted(report.benchmarks,
                                                            key=lambda r: r.nodeid)],
        "comparisons": [c.to_json() for c in report.comparisons],
        "explanations": list(report.explanations),
        "drifts": [d.to_json() for d in report.drifts],
        "summary": {v: report.count(v) for v in VERDICTS},
        "cannot_tell": cannot_tell_json(report),
        "notes": list(report.notes),
        "failed": report.failed,
    }
