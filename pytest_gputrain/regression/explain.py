"""Each compared test explained: its counters per step, baseline beside current, and what
changed in the kernel-name histogram, the ATen operators, the call sites of syncs and copies,
and the Python functions' bytecodes.

``explain_sides`` makes one plain dict per test (JSON-ready: the ``--gpu-benchmark-json`` and
``compare --format json`` documents hold them, and the diagnosis's ``benchmarks`` section hands
them to the HTML report, whose ``benchmark_explanation.html.j2`` draws one); ``markdown`` writes
them for a CI summary, each test in a ``<details>`` block, open where something changed.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_gputrain.regression import counters, policy
from pytest_gputrain.regression.store import ResultRecord
from pytest_gputrain.units import printable


def _value(records: Sequence[ResultRecord], name: str) -> float | None:
    """A side's count per step (its newest counted session), or for the host counters the
    median over its sessions of each one's fastest round."""
    if name in counters.EXACT:
        record = counters.representative(records)
        return counters.exact_value(record, name) if record is not None else None
    fastest = [min(rounds) for rounds in (counters.rounds_of(r, name) for r in records)
               if rounds]
    return statistics.median(fastest) if fastest else None


def _rows(name: str, before: Mapping[str, float], after: Mapping[str, float]
          ) -> list[dict[str, Any]]:
    diff = counters.histogram_diff(before, after)
    rows = [{"name": key, "baseline": b, "current": a, "change": a - b}
            for key, b, a in diff[:counters.DIFF_ROWS]]
    if len(diff) > counters.DIFF_ROWS:
        rest = diff[counters.DIFF_ROWS:]
        rows.append({"name": f"{len(rest)} more {name}", "baseline": sum(r[1] for r in rest),
                     "current": sum(r[2] for r in rest),
                     "change": sum(r[2] - r[1] for r in rest)})
    return rows


def explain(nodeid: str, baseline: Sequence[ResultRecord], current: Sequence[ResultRecord]
            ) -> dict[str, Any] | None:
    """One test's explanation, or None when neither side was counted."""
    before, after = counters.representative(baseline), counters.representative(current)
    if before is None and after is None:
        return None
    table = []
    for name in counters.COUNTERS:
        base, cur = _value(baseline, name), _value(current, name)
        if base is None and cur is None:
            continue
        difference = cur - base if base is not None and cur is not None else None
        table.append({
            "metric": name, "label": counters.LABELS[name], "exact": name in counters.EXACT,
            "baseline": base, "current": cur, "change": difference,
            "baseline_text": counters.amount(name, base),
            "current_text": counters.amount(name, cur),
            "change_text": ("–" if difference is None else
                            "0" if difference == 0 else
                            counters.amount(name, difference, signed=True)),
            "changed": name in counters.EXACT and difference not in (None, 0),
            "varies": any(counters.varies(r, name) for r in (*baseline, *current))})
    ends = (counters.counters_of(before) if before else {},
            counters.counters_of(after) if after else {})
    histograms = {
        "kernels": _rows("kernels", *(e.get("kernel_names") or {} for e in ends)),
        "ops": _rows("operators", *(e.get("ops_by_name") or {} for e in ends)),
        "syncs": _rows("call sites", *(counters.sites(r, "sync_sites") if r else {}
                                        for r in (before, after))),
        "copies": _rows("call sites", *(counters.sites(r, "copy_sites") if r else {}
                                         for r in (before, after))),
        "functions": _rows("functions", *(e.get("bytecodes_by_function") or {} for e in ends)),
    }
    return {
        "nodeid": nodeid,
        "bound": {"baseline": policy.KIND_WORDS.get(counters.bound_of(before) if before else None),
                  "current": policy.KIND_WORDS.get(counters.bound_of(after) if after else None),
                  "why": str((ends[1].get("bound") or {}).get("why") or "")},
        "changes": counters.changed(baseline, current),
        "counters": table, **histograms,
        "unavailable": dict(ends[1].get("unavailable") or {}),
    }


def explain_sides(baseline: Mapping[str, Sequence[ResultRecord]],
                  current: Mapping[str, Sequence[ResultRecord]]) -> list[dict[str, Any]]:
    """Every test of the current side that either side counted, in node id order."""
    found = []
    for nodeid in sorted(current):
        explanation = explain(nodeid, baseline.get(nodeid, []), current[nodeid])
        if explanation is not None:
            found.append(explanation)
    return found


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _number(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def _histogram(title: str, rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    out = ["", f"{title}:", "", "| | baseline | current | change |", "|---|---|---|---|"]
    out.extend(f"| `{_cell(r['name'])}` | {_number(r['baseline'])} | {_number(r['current'])} "
               f"| {'+' if r['change'] > 0 else ''}{_number(r['change'])} |" for r in rows)
    return out


def markdown(explanations: Sequence[Mapping[str, Any]], heading: str = "####") -> list[str]:
    """The explanations as Markdown lines, under ``heading``."""
    if not explanations:
        return []
    out = ["", f"{heading} What each test does per step", ""]
    for x in explanations:
        changes = x.get("changes") or []
        summary = "; ".join(changes) if changes else "no exact counter changed"
        bound = x.get("bound") or {}
        out.append(f"<details{' open' if changes else ''}><summary><code>{_cell(x['nodeid'])}"
                   f"</code>: {_cell(summary)}</summary>")
        out.append("")
        out.append(f"Step: {bound.get('current') or '–'}"
                   + (f" ({_cell(bound['why'])})" if bound.get("why") else "")
                   + (f"; the baseline's: {bound.get('baseline')}"
                      if bound.get("baseline") != bound.get("current") else ""))
        out.extend(["", "| per step | baseline | current | change |", "|---|---|---|---|"])
        for row in x.get("counters") or []:
            mark = " (varies)" if row.get("varies") else ""
            change = f"**{row['change_text']}**" if row.get("changed") else row["change_text"]
            out.append(f"| {row['label']}{mark} | {row['baseline_text']} | "
                       f"{row['current_text']} | {change} |")
        out.extend(_histogram("Kernels whose count changed", x.get("kernels") or []))
        out.extend(_histogram("ATen operators whose count changed", x.get("ops") or []))
        out.extend(_histogram("Syncs whose call sites changed", x.get("syncs") or []))
        out.extend(_histogram("Copies whose call sites changed", x.get("copies") or []))
        out.extend(_histogram("Python functions whose bytecodes changed",
                              x.get("functions") or []))
        missing = x.get("unavailable") or {}
        if missing:
            reasons: dict[str, list[str]] = {}
            for name, why in missing.items():
                reasons.setdefault(str(why), []).append(name)
            out.append("")
            out.extend(f"- not counted: {', '.join(names)}: {_cell(why)}"
                       for why, names in reasons.items())
        out.extend(["", "</details>", ""])
    return [printable(line) for line in out]
