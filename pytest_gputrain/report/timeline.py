"""A test's recorded facts -> the lanes of its timeline (the HTML report draws them).

Works on the records as the facts file keeps them (plain JSON), so that the report needs no
feature's models and a replay draws what the session drew. A run is a stack of lanes on one
time axis (seconds since the test's call began), one quantity each, on an honest fixed range:

- ``util``: GPU utilisation, 0-100 %;
- ``memory``: the allocator's allocated and reserved bytes, the device's memory in use and this
  process's (NVML), with the limits that matter: the budget, the device's memory, another
  process's share, and at an out-of-memory failure the allocation that was refused;
- ``clock``: SM clock from 0 to the GPU's highest; ``power``: from 0 to the power limit;
  ``temperature``: from 20 °C to the slowdown temperature, so a wobble of a degree stays flat;
- ``steps``: one bar per step, split into where its time went (DataLoader wait, syncs, GPU
  busy, host work with the GPU idle), on a range set by the typical step (a long first step is
  cut and labelled, not allowed to flatten the others), with the baseline's steps overlaid when
  the run was compared with one.

A lane is ``{"id", "title", "unit", "range": [low, high], "tables": [...], "lines": [...],
"bands": [...]}``; a table is ``{"x": [...], "series": [{"label", "unit", "values", "style"}]}``
(``"x": "nvml"``: the NVML samples' times, held once in the timeline's ``x``) and the page joins a
lane's tables on its time axis. Every series is thinned to ``limit``
points keeping each bucket's extremes (``series.keep_extremes``), so a report of many tests
stays small. A lane that was not recorded is left out and the timeline says why in ``notes``.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gputrain.series import gaps, keep_extremes, take
from pytest_gputrain.units import format_bytes

GiB = 2**30
MiB = 2**20
BUDGET_SHOWN = 0.25  # the budget is drawn when the run used at least this share of it
Table = dict[str, Any]
Lane = dict[str, Any]


@dataclass(frozen=True)
class DeviceLimits:
    """What the GPU's own facts say about the ranges of its lanes (None: not known)."""

    memory_total: int | None = None
    sm_clock_max: float | None = None
    power_limit: float | None = None
    temperature_slowdown: float | None = None


def _round(values: Sequence[float | int | bool | None], digits: int) -> list[Any]:
    """Rounded to ``digits`` decimals; a whole number as an int (``30``, not ``30.0``: the
    page's JSON is a few MB for hundreds of tests)."""
    rounded = [None if v is None else round(float(v), digits) for v in values]
    return [int(v) if v is not None and v.is_integer() else v for v in rounded]


def _series(label: str, unit: str, values: Sequence[Any], digits: int = 3,
            divide: float = 1.0, style: str = "line") -> dict[str, Any]:
    """A series of raw ``values``, shown divided by ``divide`` and rounded to ``digits``;
    ``style``: line, dash, dot, area (filled below), point."""
    return {"label": label, "unit": unit, "values": list(values), "digits": digits,
            "divide": divide, "style": style}


def _table(x: Sequence[float], columns: list[dict[str, Any]], limit: int) -> Table | None:
    """One clock's series, thinned together to ``limit`` points; None with nothing to draw."""
    columns = [c for c in columns if len(c["values"]) == len(x)
               and any(v is not None for v in c["values"])]
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


def _steps(run: dict[str, Any]) -> tuple[list[float], list[float], list[float], list[float]]:
    """Step ends, step times, loader waits and sync waits: the timeline's, or for facts
    recorded before it existed, each step's end summed from ``step_times`` (when none were
    thinned)."""
    timeline = run.get("timeline") or {}
    if timeline.get("step_end"):
        ends = list(timeline["step_end"])
        waits = list(timeline.get("loader_wait") or [])
        syncs = list(timeline.get("sync_wait") or [])
        return (ends, list(timeline.get("step_time") or []),
                waits if len(waits) == len(ends) else [],
                syncs if len(syncs) == len(ends) else [])
    times = run.get("step_times") or []
    if times and len(times) == run.get("steps"):
        return list(itertools.accumulate(times)), list(times), [], []
    return [], [], [], []


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


def _span(values: Sequence[float | None]) -> tuple[float, float] | None:
    found = [v for v in values if v is not None]
    return (min(found), max(found)) if found else None


# -- the lanes -----------------------------------------------------------------------------------


class _Run:
    """One run's series, read once."""

    def __init__(self, run: dict[str, Any], failure: dict[str, Any] | None,
                 limits: DeviceLimits) -> None:
        self.run, self.failure, self.limits = run, failure, limits
        self.timeline = run.get("timeline") or {}
        self.nvml_time = list(self.timeline.get("nvml_time") or [])
        self.ends, self.step_times, self.waits, self.syncs = _steps(run)
        self.oom = list(self.timeline.get("oom_times") or [])
        self.end = max([run.get("duration") or 0.0, *self.ends[-1:], *self.nvml_time[-1:],
                        *self.oom[-1:]])
        self.notes: list[str] = []
        self.nvml_kept: list[int] | None = None
        self.x: dict[str, list[Any]] = {}  # time axes shared by several tables, by name

    def column(self, name: str) -> list[Any]:
        values = list(self.timeline.get(name) or [])
        return values if len(values) == len(self.nvml_time) else [None] * len(self.nvml_time)

    def nvml_table(self, columns: list[dict[str, Any]], limit: int) -> Table | None:
        """NVML series on the samples every NVML lane keeps (thinned once, over all their
        columns): the page holds their times once (``x["nvml"]``)."""
        if self.nvml_kept is None:
            names = ("utilization", "memory_used", "process_memory", "sm_clock", "power",
                     "temperature")
            self.nvml_kept = keep_extremes([self.column(n) for n in names], max(2, limit)) \
                if self.nvml_time else []
            self.x["nvml"] = _round(take(self.nvml_time, self.nvml_kept), 3)
        kept = self.nvml_kept
        columns = [c for c in columns if any(v is not None for v in c["values"])]
        if not kept or not columns:
            return None
        series = []
        for column in columns:
            digits, divide = column.pop("digits"), column.pop("divide")
            values = [None if v is None else v / divide for v in take(column["values"], kept)]
            series.append({**column, "values": _round(values, digits)})
        return {"x": "nvml", "series": series}

    def failed_at(self) -> float | None:
        if self.failure is None:
            return None
        return float(self.oom[-1]) if self.oom else float(self.end)


def _utilisation(r: _Run, limit: int) -> Lane | None:
    table = r.nvml_table([_series("GPU utilisation", "%", r.column("utilization"), 0,
                                         style="area")], limit)
    if table is None:
        return None
    return {"id": "util", "title": "GPU utilisation", "unit": "%", "range": [0, 100],
            "tables": [table], "lines": [], "bands": []}


def _memory(r: _Run, limit: int) -> Lane | None:
    """The memory lane, with the limit a failure hit: the budget (the device's memory, a
    per-process fraction of it, or what other processes left), the device's memory, the other
    processes' share, and the refused allocation."""
    allocated_t, allocated, reserved = _memory_readings(r.run, r.ends)
    used, own = r.column("memory_used"), r.column("process_memory")
    memory = r.run.get("memory") or {}
    # An out-of-memory failure: the probe read what was asked for (the others have no limit).
    failure = r.failure if r.failure and r.failure.get("requested") else None
    failed_at = r.failed_at()
    # At an out-of-memory failure: the allocator's bytes then (from the error's own words,
    # where the probe could not read them at the moment itself).
    if failure is not None and failed_at is not None and failure.get("allocated") is not None \
            and (not allocated_t or allocated_t[-1] < failed_at - 1e-3):
        allocated_t = [*allocated_t, round(failed_at, 4)]
        allocated = [*allocated, int(failure["allocated"])]
        if len(reserved) == len(allocated) - 1 and failure.get("reserved") is not None:
            reserved = [*reserved, int(failure["reserved"])]
    source = failure or memory
    total = source.get("total") or memory.get("total") or r.limits.memory_total
    budget = source.get("budget") or memory.get("budget")
    others = source.get("other_processes") or memory.get("other_processes") or 0
    fraction = source.get("fraction") or memory.get("fraction")
    requested = failure.get("requested") if failure else None
    at_failure = failure.get("allocated") if failure else None
    peak = max((v for v in [*allocated, *reserved, *used, *own] if v is not None), default=0)
    unit, scale = _memory_unit([peak, *([budget] if failure else [])])
    tables = [
        _table(allocated_t, [
            _series("allocated", unit, allocated, divide=scale,
                    style="point" if len(allocated) < 4 else "line"),
            _series("reserved", unit, reserved if len(reserved) == len(allocated) else [],
                    divide=scale, style="dash"),
        ], limit),
        r.nvml_table([
            _series("device in use (all processes)", unit, used, divide=scale, style="dot"),
            _series("this process (NVML)", unit, own, divide=scale, style="dash"),
        ], limit),
    ]
    drawn = [t for t in tables if t]
    if not drawn:
        return None
    lines: list[dict[str, Any]] = []
    bands: list[dict[str, Any]] = []
    notes: list[str] = []

    def shown(value: float) -> float:
        return round(value / scale, 3)

    near = bool(budget) and peak >= BUDGET_SHOWN * float(budget or 1)
    if failure is not None and budget:
        top = float(budget) * 1.25
    elif near and budget:
        top = max(float(budget) * 1.08, peak * 1.1)
    else:
        top = max(peak * 1.25, scale * 0.1)
        if budget:
            notes.append(f"budget {format_bytes(budget)}, at most {100 * peak / budget:.0f} % "
                         "used: not drawn")
    if budget and (failure is not None or near):
        why = ("the device's memory" if total and budget >= total * 0.999 else
               f"set_per_process_memory_fraction({fraction:g}) of {format_bytes(total)}"
               if fraction and fraction < 0.999 and total else
               "the device's memory less other processes'")
        lines.append({"label": f"budget {format_bytes(budget)} ({why})", "value": shown(budget),
                      "style": "limit"})
    if total and total <= top and not (budget and budget >= total * 0.999):
        lines.append({"label": f"device memory {format_bytes(total)}", "value": shown(total),
                      "style": "device"})
    elif total and (failure is not None or near) and not (budget and budget >= total * 0.999):
        notes.append(f"device memory {format_bytes(total)}: above the top")
    if others and total and (failure is not None or near):
        low = max(0.0, float(total) - float(others))
        if low < top:
            bands.append({"label": f"other processes held {format_bytes(others)}",
                          "from": shown(low), "to": shown(min(float(total), top))})
    lane: Lane = {"id": "memory", "title": "Memory", "unit": unit, "range": [0, shown(top)],
                  "tables": drawn, "lines": lines, "bands": bands, "note": "; ".join(notes)}
    if failure is not None and failed_at is not None and requested:
        base = float(at_failure or (allocated[-1] if allocated else 0))
        lane["request"] = {"t": round(failed_at, 4), "from": shown(base),
                           "to": shown(base + float(requested)),
                           "label": f"refused: {format_bytes(requested)} more"}
    return lane


def _honest(values: Sequence[float | None], low: float, high: float | None,
            minimum_span: float) -> list[float] | None:
    """A range from ``low`` to ``high`` (or the data's top), never narrower than
    ``minimum_span``, that holds every value."""
    found = _span(values)
    if found is None:
        return None
    top = max(high or 0.0, found[1], low + minimum_span)
    return [min(low, found[0]), round(top * 1.04, 1)]


def _clock(r: _Run, limit: int) -> Lane | None:
    values = r.column("sm_clock")
    table = r.nvml_table([_series("SM clock", "MHz", values, 0)], limit)
    rng = _honest(values, 0.0, r.limits.sm_clock_max, 500.0)
    if table is None or rng is None:
        return None
    lines = []
    if r.limits.sm_clock_max:
        lines.append({"label": f"highest {r.limits.sm_clock_max:.0f} MHz",
                      "value": r.limits.sm_clock_max, "style": "device"})
    return {"id": "clock", "title": "SM clock", "unit": "MHz", "range": rng,
            "tables": [table], "lines": lines, "bands": []}


def _power(r: _Run, limit: int) -> Lane | None:
    values = r.column("power")
    table = r.nvml_table([_series("power", "W", values, 0)], limit)
    cap = (r.run.get("nvml") or {}).get("power_limit") or r.limits.power_limit
    rng = _honest(values, 0.0, cap, 100.0)
    if table is None or rng is None:
        return None
    lines = [{"label": f"power limit {cap:.0f} W", "value": cap, "style": "limit"}] \
        if cap else []
    return {"id": "power", "title": "Power", "unit": "W", "range": rng, "tables": [table],
            "lines": lines, "bands": []}


def _temperature(r: _Run, limit: int) -> Lane | None:
    values = r.column("temperature")
    table = r.nvml_table([_series("temperature", "°C", values, 0)], limit)
    slowdown = r.limits.temperature_slowdown
    rng = _honest(values, 20.0, slowdown, 60.0)
    if table is None or rng is None:
        return None
    lines = [{"label": f"slows down at {slowdown:.0f} °C", "value": slowdown,
              "style": "limit"}] if slowdown else []
    return {"id": "temperature", "title": "Temperature", "unit": "°C", "range": rng,
            "tables": [table], "lines": lines, "bands": []}


def _busy_shares(r: _Run, steps: list[int]) -> list[float | None]:
    """The GPU's utilisation over each of ``steps`` (indices) as a share: the mean of the NVML
    samples inside it, or for a step shorter than the sampling period the sample that follows
    it (NVML's utilisation is the busy share of the period before the sample); None for a step
    the samples do not cover (before the sampler started, or no samples at all)."""
    util = r.column("utilization")
    times = [t for t, u in zip(r.nvml_time, util, strict=True) if u is not None]
    values = [float(u) for u in util if u is not None]
    if not times:
        return [None] * len(steps)
    period = statistics.median(gaps(times)[1:]) if len(times) > 2 else 0.1
    shares: list[float | None] = []
    for index in steps:
        end, length = r.ends[index], r.step_times[index]
        lo = bisect.bisect_left(times, end - length)
        hi = bisect.bisect_right(times, end)
        inside = values[lo:hi]
        if not inside and hi < len(times) and times[hi] - end <= period \
                and end - length >= times[0] - period:
            inside = [values[hi]]
        shares.append(min(1.0, max(0.0, sum(inside) / len(inside) / 100.0)) if inside
                      else None)
    return shares


def _steps_lane(r: _Run, limit: int, baseline: dict[str, Any] | None) -> Lane | None:
    """Each step's wall time as a stacked bar: the DataLoader wait, the syncs, then of what is
    left the GPU's busy share (its utilisation over the step) and the host's work with the GPU
    idle. In that order: time is counted once, where the host waited first."""
    if not r.ends or len(r.step_times) != len(r.ends):
        return None
    waits = r.waits or [0.0] * len(r.ends)
    syncs = r.syncs or [0.0] * len(r.ends)
    kept = keep_extremes([r.step_times, waits], max(2, limit))
    shares = _busy_shares(r, kept)
    split = any(share is not None for share in shares)
    wait_ms, sync_ms, busy_ms, host_ms, unsplit_ms = [], [], [], [], []
    for index, share in zip(kept, shares, strict=True):
        length = r.step_times[index]
        wait = min(waits[index], length)
        sync = min(syncs[index], length - wait)
        rest = length - wait - sync
        wait_ms.append(wait * 1e3)
        sync_ms.append(sync * 1e3)
        busy_ms.append(rest * share * 1e3 if share is not None else 0.0)
        host_ms.append(rest * (1 - share) * 1e3 if share is not None else 0.0)
        unsplit_ms.append(rest * 1e3 if share is None else 0.0)
    columns = [("DataLoader wait", wait_ms, bool(r.waits)),
               ("syncs", sync_ms, bool(r.syncs)),
               ("GPU busy", busy_ms, split),
               ("host, GPU idle", host_ms, split),
               ("host and GPU (no NVML sample)", unsplit_ms, any(unsplit_ms))]
    stack = [{"label": label, "unit": "ms", "values": _round(values, 2)}
             for label, values, recorded in columns if recorded]
    times_ms = [t * 1e3 for t in r.step_times]
    ordered = sorted(times_ms[min(2, len(times_ms) - 1):] or times_ms)
    typical = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    top = max(typical * 1.4, statistics.median(ordered) * 2.0, 1e-3)
    if max(times_ms) <= top * 1.15:
        top = max(times_ms) * 1.1
    lines: list[dict[str, Any]] = []
    bands: list[dict[str, Any]] = []
    if baseline:
        bands.append({"label": baseline["label"], "from": baseline["low"],
                      "to": baseline["high"], "style": "baseline"})
        lines.append({"label": f"baseline median {baseline['median']:.3g} ms",
                      "value": baseline["median"], "style": "baseline"})
        top = max(top, baseline["high"] * 1.2)
    notes = []
    if not r.waits:
        notes.append("DataLoader waits were not recorded")
    if not split:
        notes.append("no NVML samples: the GPU's busy share is not split out")
    numbers = list(r.timeline.get("step_number") or [])
    if len(numbers) != len(r.ends):
        numbers = list(range(1, len(r.ends) + 1))
    return {"id": "steps", "kind": "bars", "title": "Steps: where each step's time went",
            "unit": "ms", "range": [0, round(top, 3)],
            "x": _round(take(r.ends, kept), 4), "width": _round(take(r.step_times, kept), 5),
            "numbers": take(numbers, kept), "stack": stack, "lines": lines, "bands": bands,
            "notes": notes}


def _no_samples(r: _Run) -> str:
    """Why a run has no NVML samples, fitting what it did (facts recorded before the probe said
    so in the run's words gave one reason for all: never "a CPU run" for a GPU test here)."""
    steps = int(r.run.get("steps") or 0)
    device = str(r.run.get("device") or "")
    if steps and device and not device.startswith("cuda"):
        return f"the test trained on {device}, not CUDA"
    if not steps:
        first = "failed before its first" if r.failure else "took none"
        return ("NVML is sampled from the first optimizer step on a CUDA device, and the test "
                + first)
    if not r.timeline.get("steps"):
        return "these facts were recorded before the probe kept a timeline"
    why = str((r.timeline.get("unknown") or {}).get("nvml_time") or "")
    return why.removeprefix("no NVML samples: ") if why.startswith("no NVML samples: ") else \
        "NVML is unavailable or no sample answered"


def run_timeline(run: dict[str, Any], failure: dict[str, Any] | None, limit: int,
                 limits: DeviceLimits | None = None,
                 baseline: dict[str, Any] | None = None) -> dict[str, Any]:
    """The lanes of one recorded run (and its failure, if the test failed); ``baseline``: the
    steps of the run it was compared with (``{"label", "median", "low", "high"}`` in ms)."""
    r = _Run(run, failure, limits or DeviceLimits())
    lanes = [lane for lane in (
        _utilisation(r, limit), _memory(r, limit), _clock(r, limit), _power(r, limit),
        _temperature(r, limit), _steps_lane(r, limit, baseline)) if lane is not None]
    notes = r.notes
    for lane in lanes:
        notes.extend(lane.pop("notes", []))
    ids = {lane["id"] for lane in lanes}
    if not r.nvml_time:
        notes.append("no utilisation, clock, power or temperature lanes: " + _no_samples(r))
    if "memory" not in ids:
        notes.append("no memory lane: the allocator is read at optimizer steps on a CUDA "
                     "device and at an out-of-memory error, and this run had neither")
    if "steps" not in ids:
        notes.append("no steps lane: the test stepped no optimizer")
    markers: dict[str, Any] = {}
    if r.timeline.get("window_start") is not None and r.timeline.get("window_end") is not None:
        markers["window"] = [r.timeline["window_start"], r.timeline["window_end"]]
    elif (run.get("profile") or {}).get("reason") and r.ends:
        notes.append(f"no profiler window: {run['profile']['reason']}")
    if r.oom:
        markers["oom"] = r.oom
    failed_at = r.failed_at()
    if failure is not None and failed_at is not None:
        kind = failure.get("kind")
        label = (kind if kind and kind != "not_gpu" else failure.get("exc_type")) or "failure"
        markers["failure"] = {"t": round(failed_at, 3), "label": str(label).replace("_", " ")}
    throttled = list(r.timeline.get("throttled") or [])
    if len(throttled) == len(r.nvml_time) and any(throttled):
        markers["throttled"] = _bands(r.nvml_time, throttled, r.end)
    return {"kind": "run", "end": round(max(r.end, 1e-3), 3), "lanes": lanes, "x": r.x,
            "markers": markers, "notes": notes}


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
