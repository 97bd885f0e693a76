"""Pure functions that turn what the ranks recorded into evidence. No torch, no processes.

Each rank records, on one clock shared by every process of the host (``time.monotonic``):

* ``step_ends``: when each optimizer step returned (the rank's step clock);
* ``arrivals``: per step index, when the rank reached the step's synchronisation point: the end of
  the last DistributedDataParallel forward before the step (its backward all-reduces the gradients)
  or, without DDP, its first collective call. Under ``--gpu-diagnose`` the rank synchronises CUDA
  first, so the time is when the GPU got there, not when the host queued the work;
* batch sizes seen by DDP forwards and DataLoader iterators, and collective calls per operation.

In synchronous data parallel training every rank runs at the pace of the slowest: a rank that
arrives early at the all-reduce waits there for the last one, so raw step times are all alike.
The straggler shows in the *busy* time: a rank's step time minus the time it waited at the
synchronisation point for the last rank to arrive.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_gputrain.units import format_duration

# The first step includes start-up (CUDA context, NCCL communicator, allocator warm-up).
WARMUP_STEPS = 1


def median(values: Sequence[float]) -> float | None:
    """The median, or None for no values (a rank that recorded no step)."""
    return float(statistics.median(values)) if values else None


def _arrivals(probe: Mapping[str, Any]) -> dict[int, float]:
    raw = probe.get("arrivals") or {}
    return {int(k): float(v) for k, v in raw.items()}


def step_analysis(probes: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Per-rank step counts, median step times and median busy times, and the straggler."""
    ranks = sorted(probes)
    step_ends = {r: [float(t) for t in probes[r].get("step_ends") or []] for r in ranks}
    arrivals = {r: _arrivals(probes[r]) for r in ranks}
    steps = {r: len(step_ends[r]) for r in ranks}
    step_medians: dict[int, float | None] = {}
    busy_medians: dict[int, float | None] = {}
    wait_fractions: dict[int, float | None] = {}
    # Seconds each step waited at the synchronisation point (0 for the first, start-up step).
    step_waits: dict[int, list[float]] = {}
    for r in ranks:
        ends = step_ends[r]
        intervals = {k: ends[k] - ends[k - 1] for k in range(max(1, WARMUP_STEPS), len(ends))}
        step_medians[r] = median(list(intervals.values()))
        busy: list[float] = []
        waits: list[float] = []
        step_waits[r] = [0.0] * (len(ends) - len(intervals))
        for k, interval in intervals.items():
            # Arrivals in interval k (after step k-1 ended) are keyed k by the ranks.
            moments = [arrivals[other].get(k) for other in ranks]
            if len(ranks) > 1 and all(m is not None for m in moments):
                last = max(m for m in moments if m is not None)
                wait = max(0.0, last - arrivals[r][k])
            else:
                wait = 0.0
            wait = min(wait, interval)
            step_waits[r].append(wait)
            busy.append(interval - wait)
            waits.append(wait / interval if interval > 0 else 0.0)
        busy_medians[r] = median(busy)
        wait_fractions[r] = median(waits)
    known = {r: v for r, v in busy_medians.items() if v is not None}
    events = [t for r in ranks for t in (*step_ends[r], *arrivals[r].values())]
    origin = min(events) if events else 0.0
    result: dict[str, Any] = {
        "steps": [steps[r] for r in ranks],
        # On one clock for every rank: seconds since the first moment any rank recorded.
        "step_ends": [[t - origin for t in step_ends[r]] for r in ranks],
        "step_waits": [step_waits[r] for r in ranks],
        "step_time_medians": [step_medians[r] for r in ranks],
        "busy_time_medians": [busy_medians[r] for r in ranks],
        "wait_fractions": [wait_fractions[r] for r in ranks],
        "min_steps": min(steps.values()) if steps else None,
        "step_count_spread": (max(steps.values()) - min(steps.values())) if steps else None,
        "straggler_rank": None,
        "fastest_rank": None,
        "straggler_ratio": None,
        "straggler_excess": None,
    }
    if len(known) == len(ranks) and len(ranks) > 1:
        slow = max(known, key=lambda r: (known[r], -r))
        fast = min(known, key=lambda r: (known[r], r))
        result["straggler_rank"] = slow
        result["fastest_rank"] = fast
        result["straggler_excess"] = known[slow] - known[fast]
        result["straggler_ratio"] = known[slow] / known[fast] if known[fast] > 0 else None
    return result


def batch_analysis(probes: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Samples and batch sizes per rank: DDP forwards when there were any, else DataLoaders."""
    ranks = sorted(probes)
    per_rank: dict[int, list[int]] = {}
    source = None
    if any(probes[r].get("forward_batches") for r in ranks):
        source = "ddp_forward"
        per_rank = {r: [int(b) for b in probes[r].get("forward_batches") or []] for r in ranks}
    elif any(probes[r].get("loader_batches") for r in ranks):
        source = "dataloader"
        per_rank = {r: [int(b) for b in probes[r].get("loader_batches") or []] for r in ranks}
    result: dict[str, Any] = {"batch_source": source, "samples": None, "batch_size_medians": None,
                              "sample_ratio": None, "batch_size_ratio": None}
    if source is None:
        return result
    samples = [sum(per_rank[r]) for r in ranks]
    sizes = [median([float(b) for b in per_rank[r]]) for r in ranks]
    result["samples"] = samples
    result["batch_size_medians"] = sizes
    if samples and min(samples) > 0:
        result["sample_ratio"] = max(samples) / min(samples)
    known_sizes = [s for s in sizes if s is not None]
    if len(known_sizes) == len(sizes) and known_sizes and min(known_sizes) > 0:
        result["batch_size_ratio"] = max(known_sizes) / min(known_sizes)
    return result


def per_rank_summary(values: Sequence[Any], unit: str | None = None) -> str:
    """``rank 0 12.1 ms, rank 1 55.3 ms`` (unknown values as ``?``)."""
    parts = []
    for rank, value in enumerate(values):
        if value is None:
            text = "?"
        elif unit == "s":
            text = format_duration(value)
        elif isinstance(value, float) and not value.is_integer():
            text = f"{value:.3g}"
        else:
            text = str(int(value)) if isinstance(value, float) else str(value)
        parts.append(f"rank {rank} {text}")
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------
# Failures

_WATCHDOG = re.compile(
    r"(?:\[Rank (?P<rank>\d+)\]\s*)?Watchdog caught collective operation timeout:\s*"
    r"WorkNCCL\((?P<work>.*?)\)\s*ran for (?P<ran>\d+) milliseconds"
)
_WORK_FIELD = re.compile(r"(\w+(?:\(ms\))?)=([^,]+)")
_NCCL_ERROR = re.compile(
    r"nccl(?:UnhandledCudaError|SystemError|InternalError|InvalidArgument|InvalidUsage|"
    r"RemoteError|InProgress)|NCCL error|NCCL WARN|DistBackendError|ProcessGroupNCCL",
)
_COLLECTIVE_TIMEOUT = re.compile(
    r"Timed out waiting \d+ms for (?:send|recv) operation|DistTimeoutError|"
    r"(?:collective|operation) (?:has )?timed out|Timeout\(ms\)=\d+",
    re.IGNORECASE,
)
_PEER = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|"
    r"failed to recv, got 0 bytes|recvBytes|Socket Timeout",
    re.IGNORECASE,
)


def parse_watchdog(text: str) -> dict[str, Any] | None:
    """The NCCL watchdog's timeout line: operation, sequence number, timeout and time waited."""
    match = _WATCHDOG.search(text)
    if not match:
        return None
    fields = dict(_WORK_FIELD.findall(match.group("work")))
    op = fields.get("OpType", "").strip()
    try:
        seq: int | None = int(fields.get("SeqNum", "").strip())
    except ValueError:
        seq = None
    try:
        timeout_ms: int | None = int(fields.get("Timeout(ms)", "").strip())
    except ValueError:
        timeout_ms = None
    return {
        "rank": int(match.group("rank")) if match.group("rank") else None,
        "op": op or None,
        "seq": seq,
        "timeout_s": timeout_ms / 1000 if timeout_ms is not None else None,
        "ran_s": int(match.group("ran")) / 1000,
        "line": match.group(0),
    }


def classify_failure(text: str, phase: str | None = None, exit_code: int | None = None,
                     has_exception: bool = True) -> str:
    """One word for what went wrong, from the rank's error text and output."""
    if _WATCHDOG.search(text):
        return "nccl_timeout"
    if _NCCL_ERROR.search(text):
        return "nccl_error"
    if phase == "init":
        return "init_failure"
    if _COLLECTIVE_TIMEOUT.search(text):
        return "collective_timeout"
    if _PEER.search(text):
        return "peer_failure"
    if has_exception:
        return "exception"
    return "crash"


def describe_exit(exit_code: int | None) -> str:
    if exit_code is None:
        return "still running"
    if exit_code < 0:
        import signal

        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"killed by {name}"
    return f"exit code {exit_code}"


def collective_desync(statuses: Mapping[int, Mapping[str, Any]], now: float,
                      watchdog: Mapping[str, Any] | None = None) -> str | None:
    """``rank 1 never entered all_reduce #3 while rank 0 waited 30.0 s``, from per-rank counts.

    Compares, per collective operation, how many calls each rank made; the ranks behind the
    others never entered the call the others are waiting in.
    """
    counts: dict[int, dict[str, int]] = {
        r: {str(k): int(v) for k, v in (s.get("collectives") or {}).items()}
        for r, s in statuses.items()
    }
    if len(counts) < 2:
        return None
    ops = sorted({op for per in counts.values() for op in per})
    for op in ops:
        by_rank = {r: counts[r].get(op, 0) for r in counts}
        most = max(by_rank.values())
        behind = sorted(r for r, n in by_rank.items() if n < most)
        if not behind:
            continue
        ahead = sorted(r for r, n in by_rank.items() if n == most)
        waits = []
        for r in ahead:
            status = statuses[r]
            since = status.get("op_since")
            if status.get("op") == op and since is not None:
                waits.append(f"rank {r} waited {now - float(since):.1f} s in it")
            elif watchdog and watchdog.get("ran_s") is not None and (
                    watchdog.get("rank") in (None, r)):
                waits.append(f"rank {r} waited {watchdog['ran_s']:.1f} s for it "
                             "(NCCL watchdog)")
            else:
                waits.append(f"rank {r} entered it")
        missing = ", ".join(f"rank {r} ({by_rank[r]} call(s))" for r in behind)
        return (f"{missing} never entered {op} #{most} while "
                + "; ".join(waits))
    return None


def step_desync(statuses: Mapping[int, Mapping[str, Any]]) -> str | None:
    steps = {r: s.get("step") for r, s in statuses.items() if s.get("step") is not None}
    if len(steps) < 2 or len(set(steps.values())) == 1:
        return None
    return "optimizer steps finished: " + ", ".join(
        f"rank {r} {n}" for r, n in sorted(steps.items()))


# ------------------------------------------------------------------------------------------
# Stacks (faulthandler dumps)

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)", re.MULTILINE)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_OWN_FRAMES = ("pytest_gputrain/distributed/", "pytest_gputrain\\distributed\\",
               # elastic's record(), which runs the rank
               "torch/distributed/elastic/multiprocessing/errors/",
               "torch\\distributed\\elastic\\multiprocessing\\errors\\")


def main_thread_frames(stack_text: str, main_ident: int | None) -> list[str]:
    """The last dumped stack of the rank's main thread, innermost first, as 'file:line in f'."""
    if not stack_text:
        return []
    blocks: list[tuple[int, str]] = []
    positions = [(m.start(), int(m.group(2), 16)) for m in _THREAD.finditer(stack_text)]
    for index, (start, ident) in enumerate(positions):
        end = positions[index + 1][0] if index + 1 < len(positions) else len(stack_text)
        blocks.append((ident, stack_text[start:end]))
    chosen = None
    for ident, block in blocks:
        if main_ident is not None and ident == main_ident:
            chosen = block  # keep the last dump of the main thread
    if chosen is None:
        if not blocks:
            return []
        chosen = blocks[-1][1]
    frames = []
    for line in chosen.splitlines():
        match = _FRAME.match(line)
        if match:
            frames.append(f"{_short(match.group('file'))}:{match.group('line')} in "
                          f"{match.group('func')}")
    return frames


def _short(path: str) -> str:
    """A path relative to the working directory when it lies inside it."""
    import os

    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return path if relative.startswith("..") else relative


def user_frames(frames: Iterable[str], limit: int = 4) -> list[str]:
    """Innermost frames, skipping the launch's own (heartbeat, rank bootstrap, record())."""
    kept = [f for f in frames
            if not any(own in f for own in _OWN_FRAMES) and not f.startswith("<string>")]
    return kept[:limit]


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
