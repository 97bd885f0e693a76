"""A test's recorded facts -> the data of its timeline charts (the HTML report draws them).

Works on the records as the facts file keeps them (plain JSON), so that the report needs no
feature's models and a replay draws what the session drew. Each chart is a list of tables, one
per clock the values were read on (NVML samples, optimizer steps, allocator readings); a table
is ``{"x": [...], "series": [{"label", "unit", "scale", "values"}]}`` and the page joins the
tables of a chart on one time axis. Every series is thinned to ``limit`` points keeping each
bucket's extremes (``series.keep_extremes``), so a report of many tests stays small.

A series that was not recorded is left out, and the chart says why in ``notes``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from pytest_gputrain.series import gaps, keep_extremes, take
from pytest_gputrain.units import format_bytes

GiB = 2**30
MiB = 2**20
BUDGET_SHOWN = 0.25  # the budget line is drawn when the run used at least this share of it
Table = dict[str, Any]


def _round(values: Sequence[float | int | bool | None], digits: int) -> list[Any]:
    return [None if v is None else round(float(v), digits) for v in values]


def _series(label: str, unit: str, scale: str, values: Sequence[Any], digits: int = 3,
            divide: float = 1.0, **style: Any) -> dict[str, Any]:
    """A series of raw ``values``, shown divided by ``divide`` and rounded to ``digits``."""
    return {"label": label, "unit": unit, "scale": scale, "values": list(values),
            "digits": digits, "divide": divide, **style}


def _table(x: Sequence[float], columns: list[dict[str, Any]], limit: int) -> Table | None:
    """One clock's series, thinned together to ``limit`` points; None with nothing to draw."""
    columns = [c for c in columns if any(v is not None for v in c["values"])]
    if not x or not columns:
        return None
    kept = keep_extremes([c["values"] for c in columns], max(2, limit))
    series = []
    for column in columns:
        digits, divide = column.pop("digits"), column.pop("divide")
        values = [None if v is None else v / divide for v in take(column["values"], kept)]
        series.append({**column, "values": _round(values, digits)})
    return {"x": _round(take(x, kept), 3), "series": series}


def _memory_unit(values: Sequence[int | float | None]) -> tuple[str, int]:
    peak = max((v for v in values if v is not None), default=0)
    return ("GiB", GiB) if peak >= GiB else ("MiB", MiB)


def _steps(run: dict[str, Any]) -> tuple[list[float], list[float], list[float]]:
    """Step ends, step times and loader waits: the timeline's, or for facts recorded before it
    existed, the end of each step summed from ``step_times`` (when none were thinned)."""
    timeline = run.get("timeline") or {}
    if timeline.get("step_end"):
        return (list(timeline["step_end"]), list(timeline.get("step_time") or []),
                list(timeline.get("loader_wait") or []))
    times = run.get("step_times") or []
    if times and len(times) == run.get("steps"):
        return list(itertools.accumulate(times)), list(times), []
    return [], [], []


def _memory_readings(run: dict[str, Any], ends: list[float]
                     ) -> tuple[list[float], list[int], list[int]]:
    timeline = run.get("timeline") or {}
    if timeline.get("memory_time"):
        return (list(timeline["memory_time"]), list(timeline.get("allocated") or []),
                list(timeline.get("reserved") or []))
    memory = run.get("memory") or {}
    allocated = memory.get("allocated_per_step") or []
    # Facts recorded before allocated_stride existed: placed only when each step was read.
    stride = memory.get("allocated_stride") or (1 if len(allocated) == len(ends) else None)
    if not allocated or not ends or stride is None:
        return [], [], []
    count = min(len(allocated), (len(ends) - 1) // stride + 1)
    return [ends[i * stride] for i in range(count)], list(allocated[:count]), []


def _bands(times: list[float], flags: list[bool | None], end: float) -> list[list[float]]:
    """Time spans where ``flags`` hold, from a flagged sample to the next sample."""
    bands: list[list[float]] = []
    for index, flag in enumerate(flags):
        if not flag:
            continue
        stop = times[index + 1] if index + 1 < len(times) else end
        if bands and bands[-1][1] >= times[index]:
            bands[-1][1] = stop
        else:
            bands.append([times[index], stop])
    return [[round(a, 3), round(b, 3)] for a, b in bands]


def run_timeline(run: dict[str, Any], failure: dict[str, Any] | None, limit: int
                 ) -> dict[str, Any]:
    """The charts of one recorded run (and its failure, if the test failed)."""
    timeline = run.get("timeline") or {}
    nvml_time = list(timeline.get("nvml_time") or [])
    ends, step_times, waits = _steps(run)
    end = max([run.get("duration") or 0.0, *ends[-1:], *nvml_time[-1:]])
    notes: list[str] = []
    charts: list[dict[str, Any]] = []

    def column(name: str) -> list[Any]:
        values = list(timeline.get(name) or [])
        return values if len(values) == len(nvml_time) else [None] * len(nvml_time)

    if not nvml_time:
        why = (timeline.get("unknown") or {}).get("nvml_time") or \
            (run.get("nvml") or {}).get("unknown", {}).get("utilization_mean") or \
            "no NVML samples were recorded"
        notes.append("no GPU timeline: utilisation, SM clock, power and temperature were not "
                     f"sampled — {why}")
    gpu = _table(nvml_time, [
        _series("GPU utilisation", "%", "%", column("utilization"), 0),
        _series("SM clock", "MHz", "MHz", column("sm_clock"), 0, dash=[6, 3]),
    ], limit)
    if gpu is not None:
        charts.append({"title": "GPU utilisation and SM clock", "tables": [gpu]})

    allocated_t, allocated, reserved = _memory_readings(run, ends)
    used, own = column("memory_used"), column("process_memory")
    budget = (run.get("memory") or {}).get("budget")
    unit, scale = _memory_unit([*allocated, *reserved, *used, *own])
    memory_tables = [
        _table(allocated_t, [
            _series("allocated", unit, unit, allocated, divide=scale),
            _series("reserved", unit, unit, reserved if len(reserved) == len(allocated)
                    else [], divide=scale, dash=[6, 3]),
        ], limit),
        _table(nvml_time, [
            _series("device used (all processes)", unit, unit, used, divide=scale,
                    dash=[2, 3]),
            _series("this process (NVML)", unit, unit, own, divide=scale,
                    dash=[10, 3, 2, 3]),
        ], limit),
    ]
    peak = max((v for v in [*allocated, *reserved, *used, *own] if v is not None), default=0)
    if budget and any(memory_tables) and peak >= BUDGET_SHOWN * budget:
        memory_tables.append(_table([0.0, end], [
            _series("budget", unit, unit, [budget, budget], divide=scale, dash=[12, 6])],
            2))
    elif budget and any(memory_tables):
        notes.append(f"memory budget {format_bytes(budget)} not drawn: the run used at most "
                     f"{100 * peak / budget:.0f} % of it")
    if any(memory_tables):
        charts.append({"title": "Memory", "tables": [t for t in memory_tables if t]})
    else:
        notes.append("no memory timeline: the allocator is read on CUDA runs only")

    power = _table(nvml_time, [
        _series("power", "W", "W", column("power"), 1),
        _series("temperature", "°C", "°C", column("temperature"), 0, dash=[6, 3]),
    ], limit)
    if power is not None:
        charts.append({"title": "Power and temperature", "tables": [power]})

    markers: dict[str, Any] = {"steps": []}
    if ends:
        steps = _table(ends, [
            # Each value holds from the step's start to its end, where it is recorded.
            _series("step time", "ms", "ms", step_times, divide=1e-3, stepped=True),
            _series("DataLoader wait", "ms", "ms", waits if len(waits) == len(ends) else [],
                    divide=1e-3, dash=[6, 3], stepped=True),
        ], limit)
        if steps is not None:
            charts.append({"title": "Steps and DataLoader waits", "tables": [steps]})
            markers["steps"] = steps["x"]
    else:
        notes.append("no steps: the test stepped no optimizer")
    if timeline.get("window_start") is not None and timeline.get("window_end") is not None:
        markers["window"] = [timeline["window_start"], timeline["window_end"]]
    else:
        profile = run.get("profile") or {}
        if profile.get("reason"):
            notes.append(f"no profiler window: {profile['reason']}")
    oom = list(timeline.get("oom_times") or [])
    if oom:
        markers["oom"] = oom
    if failure is not None:
        kind = failure.get("kind")
        label = (kind if kind and kind != "not_gpu" else failure.get("exc_type")) or "failure"
        markers["failure"] = {"t": round(oom[-1] if oom else end, 3), "label": label}
    throttled = list(timeline.get("throttled") or [])
    if len(throttled) == len(nvml_time) and any(throttled):
        markers["throttled"] = _bands(nvml_time, throttled, end)
    return {"kind": "run", "end": round(end, 3), "charts": charts, "markers": markers,
            "notes": notes}


def launch_lanes(launch: dict[str, Any], limit: int) -> dict[str, Any] | None:
    """One lane per rank: each step from the end of the one before, split into busy time and
    the wait for the other ranks. None when no rank's steps were recorded."""
    ranks = launch.get("ranks") or []
    lanes = []
    notes = []
    for rank in ranks:
        ends = list(rank.get("step_ends") or [])
        waits = list(rank.get("step_waits") or [])
        if len(waits) != len(ends):
            waits = [0.0] * len(ends)
        if len(ends) > limit:
            kept = keep_extremes([gaps(ends), waits], max(2, limit))
            ends, waits = take(ends, kept), take(waits, kept)
        lanes.append({"rank": rank.get("rank"), "outcome": rank.get("outcome"),
                      "steps": rank.get("steps"), "ends": _round(ends, 4),
                      "waits": _round(waits, 4)})
        if not ends:
            notes.append(f"rank {rank.get('rank')}: no step recorded"
                         + (f" ({rank.get('last_activity')})" if rank.get("last_activity")
                            else ""))
    if not any(lane["ends"] for lane in lanes):
        return None
    end = max(max(lane["ends"], default=0.0) for lane in lanes)
    return {"kind": "lanes", "end": round(end, 3), "lanes": lanes, "notes": notes,
            "straggler": launch.get("straggler_rank"),
            "stuck": list(launch.get("stuck_ranks") or [])}
