"""Trials of the regression gate on pools of recorded sessions: how often it catches a slowdown,
how often it raises a false alarm, and how often it says "cannot tell", for a fixed recipe (n
sessions a side) and for the sequential one (pairs until the gate decides, within a budget).

``benchmarks/regression_power.py`` runs the sessions (or replays saved ones) and prints what
these functions count. Every trial is decided by the gate's own code (``compare_test``, and for
the sequential recipe ``GateReport.sessions_to_decide``, the rule of ``compare
--max-sessions``), on the sessions' records as the store holds them.

A verdict on slowed code is "caught" (regression), "ok" (missed, and said so wrongly) or
"cannot tell" (missed, and said so); on unchanged code a false alarm is "regression" or
"improvement", and "cannot tell" is counted apart. The goal: >= 95 % caught and <= 5 % false
alarms; where the sessions cannot reach it, an honest "cannot tell" instead of "ok".
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gputrain.regression.compare import GateReport, GateSettings, compare_test
from pytest_gputrain.regression.stats import pooled_spread
from pytest_gputrain.regression.store import ResultRecord

Records = dict[int, ResultRecord]  # a pool's sessions as the gate reads them, by run id
Rows = dict[str, list[dict[str, Any]]]  # "slowed" and "unchanged" trials
# The session summaries regression_power.py compares: a metric and how a session is summarised.
ALTERNATIVES = (("step_time", "min"), ("step_time", "median"), ("gpu_time", "min"),
                ("gpu_time", "median"))
FALSE = ("regression", "improvement")


@dataclass(frozen=True)
class PoolIds:
    """The run ids of one step's pools, and the test node id its sessions were saved under."""

    nodeid: str
    unchanged: list[int]
    slowed: list[int]


def measured(records: Records, metric: str) -> bool:
    """Whether every session of the pools has this metric (the CPU has no GPU time)."""
    return all(record.metrics.get(metric) for record in records.values())


def _row(row: Any, base: Sequence[int], current: Sequence[int]) -> dict[str, Any]:
    return {"baseline_runs": list(base), "current_runs": list(current),
            "verdict": row.verdict, "change": row.change, "p_value": row.p_value,
            "detectable": row.detectable, "resolution": row.resolution,
            "sessions_to_decide": row.sessions_to_decide,
            "strays": (row.baseline_stray is not None) + (row.current_stray is not None)}


def _draws(rng: random.Random, pools: PoolIds, sessions: int, kind: str
           ) -> tuple[list[int], list[int]]:
    """A trial's sides: unchanged vs slowed, or two disjoint sets of unchanged sessions."""
    if kind == "slowed":
        return rng.sample(pools.unchanged, sessions), rng.sample(pools.slowed, sessions)
    drawn = rng.sample(pools.unchanged, 2 * sessions)
    return drawn[:sessions], drawn[sessions:]


def trials(records: Records, pools: PoolIds, sessions: int, count: int, seed: int,
           gate: GateSettings) -> Rows:
    """``count`` power trials and as many false-alarm trials, ``sessions`` a side each."""
    rng = random.Random(seed)
    rows: Rows = {"slowed": [], "unchanged": []}
    for _ in range(count):
        for kind in ("slowed", "unchanged"):
            base, current = _draws(rng, pools, sessions, kind)
            (row,) = compare_test(pools.nodeid, [records[i] for i in base],
                                  [records[i] for i in current], gate)
            rows[kind].append(_row(row, base, current))
    return rows


def sequential_trials(records: Records, pools: PoolIds, budget: int, count: int, seed: int,
                      gate: GateSettings) -> Rows:
    """The sequential recipe: each trial adds a pair of sessions at a time (from 2 a side:
    one pair alone has no spread) and compares, until the gate decides or more sessions
    within ``budget`` a side would not (``GateReport.sessions_to_decide``, the rule behind
    ``compare --max-sessions``). Each row also holds the sessions a side it used."""
    rng = random.Random(seed)
    rows: Rows = {"slowed": [], "unchanged": []}
    for _ in range(count):
        for kind in ("slowed", "unchanged"):
            base, current = _draws(rng, pools, budget, kind)
            for n in range(2, budget + 1):
                (row,) = compare_test(pools.nodeid, [records[i] for i in base[:n]],
                                      [records[i] for i in current[:n]], gate)
                report = GateReport(gate, comparisons=[row], session_budget=budget)
                if report.sessions_to_decide(budget) is None:
                    break
            rows[kind].append({**_row(row, base[:n], current[:n]), "sessions": n})
    return rows


def tally(rows: Rows) -> dict[str, int]:
    """Verdicts counted apart: caught, missed as "ok", "cannot tell" (slowed code); false
    alarms, "ok", "cannot tell" (unchanged code)."""
    slowed, unchanged = rows["slowed"], rows["unchanged"]
    return {
        "caught": sum(r["verdict"] == "regression" for r in slowed),
        "missed_ok": sum(r["verdict"] == "ok" for r in slowed),
        "cannot_tell": sum(r["verdict"] == "cannot_tell" for r in slowed),
        "false_alarms": sum(r["verdict"] in FALSE for r in unchanged),
        "improvements_on_unchanged": sum(r["verdict"] == "improvement" for r in unchanged),
        "ok_unchanged": sum(r["verdict"] == "ok" for r in unchanged),
        "cannot_tell_unchanged": sum(r["verdict"] == "cannot_tell" for r in unchanged),
    }


def goal_met(rows: Rows, count: int) -> bool:
    """>= 95 % of slowdowns caught and <= 5 % false alarms ("cannot tell" is no alarm)."""
    counts = tally(rows)
    return (counts["caught"] >= math.ceil(0.95 * count)
            and counts["false_alarms"] <= math.floor(0.05 * count))


def result(rows: Rows, count: int) -> str:
    """PASS: the goal met; HONEST: not met, but no slowdown was called "ok" and false alarms
    stayed within 5 %; MISS otherwise."""
    if goal_met(rows, count):
        return "PASS"
    counts = tally(rows)
    if counts["missed_ok"] == 0 and counts["false_alarms"] <= math.floor(0.05 * count):
        return "HONEST"
    return "MISS"


def fewest_sessions(records: Records, pools: PoolIds, count: int, seed: int,
                    gate: GateSettings) -> tuple[int | None, int]:
    """The fewest sessions a side whose trials reach the goal, and the most the pools allow
    (a false-alarm trial draws twice as many unchanged sessions); ``None``: none up to it."""
    most = min(len(pools.unchanged) // 2, len(pools.slowed))
    for n in range(2, most + 1):
        if goal_met(trials(records, pools, n, count, seed, gate), count):
            return n, most
    return None, most


def summaries(records: Records, ids: Sequence[int], metric: str,
              step_summary: str) -> list[float]:
    """Each session's summary as the gate takes it (sessions without one left out)."""
    from pytest_gputrain.regression.compare import session_value

    found = [session_value(records[i], metric, step_summary)[0] for i in ids]
    return [value for value in found if value is not None]


def alternative(records: Records, pools: PoolIds, metric: str, step_summary: str,
                sessions: int, count: int, seed: int, threshold: float, alpha: float
                ) -> dict[str, Any]:
    """One session summary's figures: the spread between unchanged sessions, the slowdown
    it measures, and the trials' verdicts counted apart."""
    gate = GateSettings({metric: threshold}, alpha=alpha, step_summary=step_summary)
    unchanged = summaries(records, pools.unchanged, metric, step_summary)
    slow = summaries(records, pools.slowed, metric, step_summary)
    spread = pooled_spread([unchanged]).sd
    seen = (statistics.geometric_mean(slow) / statistics.geometric_mean(unchanged) - 1
            if unchanged and slow else None)
    rows = trials(records, pools, sessions, count, seed, gate)
    return {"metric": metric, "step_summary": step_summary, "spread": spread,
            "measured_slowdown": seen, **tally(rows), "result": result(rows, count)}
