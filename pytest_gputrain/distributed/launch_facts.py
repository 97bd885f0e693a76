"""From a finished launch to ``DistributedRunFacts``, and from facts to the lines that describe
the launch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_gputrain.distributed import analysis
from pytest_gputrain.distributed.facts import DistributedRunFacts, RankFacts
from pytest_gputrain.series import gaps, keep_extremes

LANE_POINTS = 600  # at most this many steps per rank in the facts

if TYPE_CHECKING:
    from pytest_gputrain.distributed.errors import RankFailure
    from pytest_gputrain.distributed.record import LaunchRecord


def build_facts(record: LaunchRecord, test: str | None,
                error: RankFailure | None) -> DistributedRunFacts:
    from pytest_gputrain.distributed.errors import RankTimeout

    probes: dict[int, dict[str, Any]] = {
        rank.rank: dict(rank.probe) for rank in record.ranks if rank.probe is not None}
    complete = len(probes) == len(record.ranks) and bool(probes)
    steps = analysis.step_analysis(probes) if complete else {}
    batches = analysis.batch_analysis(probes) if complete else {}
    ranks = []
    for index, rank in enumerate(record.ranks):
        probe = probes.get(rank.rank, {})
        step_count = rank.status.get("step")
        ranks.append(RankFacts(
            rank=rank.rank,
            pid=rank.pid,
            device=probe.get("device"),
            device_name=probe.get("device_name"),
            outcome=rank.outcome,
            exit=rank.exit,
            steps=int(step_count) if step_count is not None else None,
            step_time_median=(steps.get("step_time_medians") or [None] * (index + 1))[index],
            busy_time_median=(steps.get("busy_time_medians") or [None] * (index + 1))[index],
            wait_fraction=(steps.get("wait_fractions") or [None] * (index + 1))[index],
            samples=(batches.get("samples") or [None] * (index + 1))[index],
            batch_size_median=(batches.get("batch_size_medians") or [None] * (index + 1))[index],
            collectives={str(k): int(v)
                         for k, v in (rank.status.get("collectives") or {}).items()},
            last_activity=rank.activity,
            stack=list(rank.stack) if rank.stuck else [],
            error=(f"{rank.error.type}: {analysis.tail(rank.error.message, 1)}"
                   if rank.error is not None else None),
            **_lane(steps, index),
        ))
    names = [r.device_name for r in ranks if r.device_name]
    gpu_names = [r.device_name for r in ranks
                 if r.device_name and (r.device or "").startswith("cuda")]
    facts = DistributedRunFacts(
        test=test,
        launcher=record.launcher,
        world_size=record.world_size,
        backend=_seen_backend(probes) or record.backend,
        outcome=("timeout" if isinstance(error, RankTimeout) else
                 "failed" if error is not None else "passed"),
        duration=round(record.duration, 3),
        timeout=record.timeout,
        collective_timeout=record.collective_timeout,
        probe=record.probe,
        ranks=ranks,
        device_names=names if len(names) == len(ranks) else None,
        distinct_device_names=len(set(gpu_names)) if gpu_names else None,
        cuda_used=any(p.get("cuda_used") for p in probes.values()) if probes else None,
        ddp_used=any(p.get("ddp_used") for p in probes.values()) if probes else None,
        data_parallel_devices=(max(int(p.get("data_parallel_devices") or 0)
                                   for p in probes.values()) if probes else None),
        nccl_variables=dict(record.nccl_env),
    )
    if steps:
        facts.steps = steps["steps"]
        facts.min_steps = steps["min_steps"]
        facts.step_count_spread = steps["step_count_spread"]
        facts.step_time_medians = steps["step_time_medians"]
        facts.busy_time_medians = steps["busy_time_medians"]
        facts.step_time_summary = analysis.per_rank_summary(steps["step_time_medians"], "s")
        facts.busy_time_summary = analysis.per_rank_summary(steps["busy_time_medians"], "s")
        facts.wait_summary = ", ".join(
            f"rank {r} {w * 100:.0f} %" if w is not None else f"rank {r} ?"
            for r, w in enumerate(steps["wait_fractions"]))
        facts.steps_summary = analysis.per_rank_summary(steps["steps"])
        for key in ("straggler_rank", "fastest_rank", "straggler_ratio", "straggler_excess"):
            setattr(facts, key, steps[key])
        busy = steps["busy_time_medians"]
        if steps["straggler_rank"] is not None:
            facts.straggler_busy = busy[steps["straggler_rank"]]
            facts.fastest_busy = busy[steps["fastest_rank"]]
    else:
        why = "per-rank steps are recorded under --gpu-diagnose (or probe=True)" if not probes \
            else "not every rank returned its probe data"
        for name in ("steps", "step_time_medians", "busy_time_medians", "straggler_ratio",
                     "straggler_rank", "straggler_excess", "min_steps"):
            facts.unknown[name] = why
    if batches:
        facts.batch_source = batches["batch_source"]
        facts.samples = batches["samples"]
        facts.batch_size_medians = batches["batch_size_medians"]
        facts.sample_ratio = batches["sample_ratio"]
        facts.batch_size_ratio = batches["batch_size_ratio"]
        if batches["samples"] is not None:
            facts.samples_summary = analysis.per_rank_summary(batches["samples"])
            facts.batch_size_summary = analysis.per_rank_summary(batches["batch_size_medians"])
    if error is not None:
        _failure_facts(facts, record, error)
    return facts


def _lane(steps: dict[str, Any], index: int) -> dict[str, list[float]]:
    """The rank's step ends and waits, thinned to LANE_POINTS keeping the extremes."""
    if not steps:
        return {}
    ends, waits = steps["step_ends"][index], steps["step_waits"][index]
    kept = keep_extremes([gaps(ends), waits], LANE_POINTS) if ends else []
    return {"step_ends": [round(ends[i], 4) for i in kept],
            "step_waits": [round(waits[i], 4) for i in kept]}


def _seen_backend(probes: dict[int, dict[str, Any]]) -> str | None:
    seen = {str(p["backend"]) for p in probes.values() if p.get("backend")}
    return seen.pop() if len(seen) == 1 else None


def _failure_facts(facts: DistributedRunFacts, record: LaunchRecord,
                   error: RankFailure) -> None:
    from pytest_gputrain.distributed.errors import RankTimeout

    watchdog = record.watchdog
    facts.failed_rank = error.rank
    facts.failure_kind = error.kind
    message = error.exc_message or ""
    if isinstance(error, RankTimeout):
        facts.stuck_ranks = list(error.stuck_ranks)
        message = f"ranks {', '.join(map(str, error.stuck_ranks))} still running after " \
                  f"{error.timeout:g} s"
    elif not message:
        message = f"rank {error.rank} ended without a Python exception ({error.kind})"
    if watchdog:
        facts.nccl_operation = (f"{watchdog['op']} #{watchdog['seq']}"
                                if watchdog.get("seq") is not None else watchdog.get("op"))
        facts.nccl_waited = watchdog.get("ran_s")
        message = watchdog["line"]
    facts.failure_message = " ".join(message.split())[:300].rstrip(".")
    if record.stuck_ranks and facts.stuck_ranks is None:
        facts.stuck_ranks = list(record.stuck_ranks)
    facts.desync = record.desync
    parts = []
    if facts.desync:
        parts.append(facts.desync)
    if record.step_desync:
        parts.append(record.step_desync)
    if watchdog:
        parts.append(f"the NCCL watchdog on rank {watchdog['rank']} aborted {watchdog['op']} "
                     f"(sequence number {watchdog['seq']}) after {watchdog['ran_s']:.1f} s")
    for rank in facts.ranks:
        if rank.outcome == "killed":
            activity = rank.last_activity or "unknown"
            where = f" at {rank.stack[0]}" if rank.stack else ""
            parts.append(f"rank {rank.rank} was {activity}{where} when killed")
        elif rank.rank == error.rank and not isinstance(error, RankTimeout) and not rank.error:
            parts.append(f"rank {rank.rank} ended: {rank.exit}")
    facts.failure_summary = "; ".join(parts) or None


def in_process_facts(test: str, data_parallel_devices: int) -> DistributedRunFacts:
    """A test that used nn.DataParallel in its own process (no launcher)."""
    facts = DistributedRunFacts(test=test, launcher="in_process", world_size=1,
                                data_parallel_devices=data_parallel_devices)
    facts.unknown["backend"] = "no process group: single process"
    return facts


def launch_lines(facts: DistributedRunFacts) -> list[str]:
    """How one launch went, for the test's "gputrain diagnosis" section: the launch, then a
    line per rank (none for a test that used nn.DataParallel in its own process)."""
    if facts.launcher == "in_process":
        return []
    lines = [f"launch: {facts.world_size} rank(s), backend {facts.backend}, "
             f"{facts.outcome} in {facts.duration or 0:.1f} s"]
    for rank in facts.ranks:
        bits = [f"rank {rank.rank}", rank.device_name or rank.device or "?",
                rank.outcome or "?"]
        if rank.steps is not None:
            bits.append(f"{rank.steps} steps")
        if rank.step_time_median is not None:
            bits.append(f"step {rank.step_time_median * 1000:.1f} ms")
        if rank.busy_time_median is not None:
            bits.append(f"busy {rank.busy_time_median * 1000:.1f} ms")
        if rank.samples is not None:
            bits.append(f"{rank.samples} samples")
        lines.append("  " + " | ".join(bits))
    return lines
