"""What the gate shows: a terminal table, Markdown for CI summaries, and a JSON document."""

from __future__ import annotations

import datetime
from typing import Any

from tabulate import tabulate

from pytest_gputrain.regression.benchmark import BenchmarkResult
from pytest_gputrain.regression.compare import GateReport, MetricComparison
from pytest_gputrain.units import format_bytes

JSON_KIND = "pytest-gputrain-benchmarks"
JSON_SCHEMA_VERSION = 1
COMPARE_HEADERS = ("test", "metric", "baseline", "current", "change", "p-value", "verdict",
                   "rounds (base/cur)")
BENCH_HEADERS = ("test", "device", "rounds", "median", "IQR", "min", "peak VRAM", "util",
                 "throttled")


def format_seconds(value: float | None) -> str:
    if value is None:
        return "–"
    if abs(value) >= 1:
        return f"{value:.3f} s"
    if abs(value) >= 1e-3:
        return f"{value * 1e3:.3f} ms"
    return f"{value * 1e6:.1f} µs"


def format_metric(metric: str, value: float | None) -> str:
    if value is None:
        return "–"
    if metric == "peak_vram":
        return format_bytes(value)
    return format_seconds(value)


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
    if comparison.forced:
        label += " (forced)"
    return label


def _rounds(comparison: MetricComparison) -> str:
    if comparison.verdict in ("new", "not_comparable"):
        return "–"
    text = f"{comparison.baseline_rounds}/{comparison.current_rounds}"
    dropped = comparison.baseline_throttled + comparison.current_throttled
    if dropped:
        text += (f" ({comparison.baseline_throttled}/{comparison.current_throttled} "
                 "throttled left out)")
    return text


def comparison_rows(report: GateReport) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for c in report.comparisons:
        comparable = c.verdict not in ("new", "not_comparable")
        rows.append((c.nodeid, c.metric, format_metric(c.metric, c.baseline_median),
                     format_metric(c.metric, c.current_median),
                     format_change(c.change, comparable and c.verdict != "insufficient_data"),
                     format_p(c.p_value), _verdict(c), _rounds(c)))
    return rows


def benchmark_rows(report: GateReport) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for b in sorted(report.benchmarks, key=lambda r: r.nodeid):
        util = b.utilization_mean
        rows.append((b.nodeid, b.device, str(b.rounds), format_seconds(b.median),
                     format_seconds(b.iqr), format_seconds(b.min),
                     format_bytes(b.peak_vram_max) if b.peak_vram else "–",
                     "–" if util is None else f"{util:.0f} %",
                     f"{b.throttled_count}/{b.rounds}" if b.throttled_count else "0"))
    return rows


def headline(report: GateReport) -> str:
    parts = [f"{report.count(v)} {name}" for v, name in (
        ("regression", "regression(s)"), ("improvement", "improvement(s)"), ("ok", "ok"),
        ("not_comparable", "not comparable"), ("insufficient_data", "insufficient data"),
        ("new", "new")) if report.count(v)]
    return ", ".join(parts) or "nothing compared"


def terminal_lines(report: GateReport) -> list[tuple[str, dict[str, bool]]]:
    """Lines for the terminal summary, each with tabulate-free markup flags (red, green...)."""
    lines: list[tuple[str, dict[str, bool]]] = []
    if report.benchmarks:
        lines.append((tabulate(benchmark_rows(report), headers=BENCH_HEADERS,
                               disable_numparse=True), {}))
    if report.compare_spec:
        lines.append(("", {}))
        if report.baseline is None:
            lines.append((f"gpu_compare={report.compare_spec}: no saved run to compare with",
                          {"yellow": True}))
        else:
            settings = report.settings
            gate = ", ".join(f"{m} > {t * 100:g} %" for m, t in settings.thresholds.items())
            lines.append((f"compared with {report.baseline.label()}; a regression needs "
                          f"p < {settings.alpha:g} (Mann-Whitney, one-sided) and {gate or '–'}",
                          {"bold": True}))
            if report.comparisons:
                lines.append((tabulate(comparison_rows(report), headers=COMPARE_HEADERS,
                                       disable_numparse=True), {}))
            for nodeid, found in report.mismatches().items():
                described = "; ".join(d.describe() for d in found if d.strict)
                lines.append((f"not comparable: {nodeid}: environment differs: {described}",
                              {"yellow": True}))
            if report.failed:
                names = ", ".join(f"{c.nodeid} {c.metric} {format_change(c.change)}"
                                  for c in report.regressions)
                lines.append((f"performance regression: {names}", {"red": True, "bold": True}))
            else:
                lines.append((f"gate passed: {headline(report)}", {"green": True}))
    for note in report.notes:
        lines.append((note, {"yellow": True}))
    if report.saved_run is not None:
        lines.append((f"saved {report.saved_run.label()} with "
                      f"{report.saved_run.result_count} result(s)", {}))
    return lines


def markdown(report: GateReport) -> str:
    out = ["## GPU performance gate", ""]
    if report.compare_spec and report.baseline is not None:
        status = ("**Regression** :x:" if report.failed else "Passed :white_check_mark:")
        out.append(f"{status}: {headline(report)}. Baseline: {report.baseline.label()}.")
        out.append("")
        if report.comparisons:
            out.append(tabulate(comparison_rows(report), headers=COMPARE_HEADERS,
                                tablefmt="github", disable_numparse=True))
            out.append("")
        for nodeid, found in report.mismatches().items():
            described = "; ".join(d.describe() for d in found if d.strict)
            out.append(f"- not comparable: `{nodeid}`: {described}")
    elif report.compare_spec:
        out.append(f"No saved run matches `{report.compare_spec}`: nothing compared.")
    if report.benchmarks:
        out.extend(["", "### Benchmarks", "",
                    tabulate(benchmark_rows(report), headers=BENCH_HEADERS, tablefmt="github",
                             disable_numparse=True)])
    for note in report.notes:
        out.append(f"- {note}")
    if report.saved_run is not None:
        out.append(f"- saved {report.saved_run.label()}")
    return "\n".join(out).rstrip() + "\n\n"


def _benchmark_json(result: BenchmarkResult) -> dict[str, Any]:
    record = result.to_record()
    return {"nodeid": record["nodeid"], "device": record["device"], "timer": record["timer"],
            "fingerprint": record["fingerprint"], "summary": record["summary"],
            "metrics": record["metrics"]}


def report_json(report: GateReport) -> dict[str, Any]:
    """The ``--gpu-benchmark-json`` document (``kind``/``schema_version`` identify it)."""
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
                     "force": report.settings.force, "compare": report.compare_spec},
        "baseline": report.baseline.to_json() if report.baseline else None,
        "benchmarks": [_benchmark_json(b) for b in sorted(report.benchmarks,
                                                            key=lambda r: r.nodeid)],
        "comparisons": [c.to_json() for c in report.comparisons],
        "summary": {v: report.count(v) for v in ("regression", "improvement", "ok",
                                                 "not_comparable", "insufficient_data", "new")},
        "notes": list(report.notes),
        "failed": report.failed,
    }
