"""The public record of one launch: what each rank did, how the launch ended, and why.

A launch (``processes`` for ranks started here, ``torchrun`` for ranks torchrun started) ends
with a :class:`LaunchRecord` made by :func:`conclude` from what its ranks left (exit codes,
errors, results, heartbeat status, stacks, output). The launcher raises its errors with the texts
written here and hands the record on: ``Launch.record``, ``RankFailure.record``, and the
diagnosis (``report.build_facts``), which reads nothing else. Plain dataclasses: no torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_gputrain.distributed import analysis

NCCL_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_DEBUG")

# Where in the rank's life an exception happened, as the failure's headline says it.
_PHASE_WORDS = {"import": " while loading the function", "init": " in init_process_group",
                "result": " returning its result", "destroy": " in destroy_process_group"}
_PHASE_ACTIVITY = {
    "starting": "starting (Python, torch and the launcher loading)",
    "import": "importing the function's module",
    "init": "in init_process_group (waiting for the other ranks to join)",
    "destroy": "in destroy_process_group",
    "done": "finished",
    "failed": "failed",
}
# Under torchrun a stuck rank cannot be killed from another process: it ends its own this long
# after the launch's timeout (torchrun.py), so that the job fails instead of hanging.
TORCHRUN_HANG_EXIT_S = 30.0
HANG_ADVICE = ("A rank that waits in a collective its peers never enter hangs; set "
               "collective_timeout below timeout to get the backend's own error.")


@dataclass(frozen=True)
class LaunchSettings:
    """What a launch was asked to do (checked by the launcher before any rank starts)."""

    world_size: int
    backend: str
    timeout: float | None
    collective_timeout: float
    init: bool  # the launcher calls init_process_group
    probe: bool  # record per-rank steps and batches
    env: Mapping[str, str] = field(default_factory=dict)  # added to the ranks' environment


@dataclass(frozen=True)
class RankError:
    """A Python exception raised in a rank, as its error file tells it."""

    type: str
    message: str
    traceback: str  # without the launcher's own frames
    phase: str  # import, init, running, result or destroy
    skipped: bool = False  # pytest.skip() in the rank

    def one_line(self) -> str:
        return f"{self.type}: {one_line(self.message)}"


@dataclass(frozen=True)
class RankRecord:
    """One rank at the end of the launch."""

    rank: int
    pid: int
    outcome: str  # ok, failed, skipped, crashed, killed, stuck_at_exit; running (torchrun)
    exit_code: int | None  # negative: the signal that ended it
    error: RankError | None = None
    failure_kind: str | None = None  # failed and crashed ranks: analysis.classify_failure
    activity: str = ""  # what it was doing when the launch ended
    status: Mapping[str, Any] = field(default_factory=dict)  # its last heartbeat
    # Killed, crashed or (torchrun) still running: its main thread's innermost user frames.
    stack: list[str] = field(default_factory=list)
    output: str = ""  # stdout and stderr, in order
    probe: Mapping[str, Any] | None = None  # steps, arrivals, batches (instrument.probe_data)

    @property
    def exit(self) -> str:
        return analysis.describe_exit(self.exit_code)

    @property
    def failed(self) -> bool:
        """Failed on its own: raised, crashed or was aborted (not killed by the launcher)."""
        return self.outcome in ("failed", "crashed")

    @property
    def stuck(self) -> bool:
        """Still running when the launch ended: killed, or (torchrun) left running."""
        return self.outcome in ("killed", "running")


@dataclass(frozen=True)
class LaunchRecord:
    """One launch of ``run_ranks``: its settings, each rank, and the evidence of a failure."""

    world_size: int
    backend: str
    timeout: float | None
    collective_timeout: float
    probe: bool
    duration: float  # seconds, first rank started to last rank ended
    nccl_env: Mapping[str, str]  # NCCL_*/TORCH_NCCL_* the ranks ran with, others' values redacted
    ranks: list[RankRecord]
    timed_out: bool = False
    failed_rank: int | None = None  # the rank whose failure the launch reports
    stuck_ranks: list[int] = field(default_factory=list)  # still running when it ended
    watchdog: Mapping[str, Any] | None = None  # the NCCL watchdog's timeout line, parsed
    desync: str | None = None  # "rank 1 (0 call(s)) never entered all_reduce #1 while ..."
    step_desync: str | None = None  # "optimizer steps finished: rank 0 5, rank 1 4"
    launcher: str = "run_ranks"  # run_ranks: ranks started here; torchrun: ranks torchrun started

    @property
    def pids(self) -> list[int]:
        return [r.pid for r in self.ranks]

    @property
    def passed(self) -> bool:
        return self.failed_rank is None and not self.stuck_ranks

    def evidence_lines(self) -> list[str]:
        lines = []
        if self.desync:
            lines.append(f"  collectives: {self.desync}")
        if self.step_desync:
            lines.append(f"  {self.step_desync}")
        if self.watchdog:
            lines.append(f"  NCCL watchdog: {self.watchdog['line']}")
        return lines


def conclude(settings: LaunchSettings, ranks: list[RankRecord], *, duration: float,
             ended: float, failed_at: Mapping[int, float], timed_out: bool,
             launcher: str = "run_ranks") -> LaunchRecord:
    """The record of a launch from its ranks: which failure it reports, and the evidence.

    ``failed_at`` holds when each rank that failed on its own failed; ``ended`` is the time, on
    the clock of the ranks' status, at which the launch ended (for "waited 30.0 s in it").
    """
    statuses = {rank.rank: rank.status for rank in ranks}
    watchdog = None
    for rank in ranks:
        watchdog = analysis.parse_watchdog(rank.output)
        if watchdog:
            if watchdog.get("rank") is None:
                watchdog["rank"] = rank.rank
            break
    failed_rank = None
    if failed_at:
        kinds = {rank.rank: rank.failure_kind for rank in ranks}
        # A rank that failed on its own comes before ranks that lost their peer.
        failed_rank = min(failed_at, key=lambda r: (kinds.get(r) == "peer_failure",
                                                    failed_at[r], r))
    return LaunchRecord(
        world_size=settings.world_size, backend=settings.backend, timeout=settings.timeout,
        collective_timeout=settings.collective_timeout, probe=settings.probe, duration=duration,
        nccl_env=nccl_environment({**os.environ, **settings.env}), ranks=ranks,
        timed_out=timed_out, failed_rank=failed_rank,
        stuck_ranks=[rank.rank for rank in ranks if rank.stuck],
        watchdog=watchdog, desync=analysis.collective_desync(statuses, ended, watchdog),
        step_desync=analysis.step_desync(statuses), launcher=launcher)


def nccl_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The NCCL and torch-NCCL variables, through the collector's filter: values of settings
    it does not know are ``<redacted>``."""
    from pytest_gputrain.collect.environment_variables import relevant_variables

    return relevant_variables(environ, NCCL_PREFIXES)


def one_line(text: object, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def describe_activity(status: Mapping[str, Any], now: float) -> str:
    """``in all_reduce #3 for 20.1 s (4 optimizer step(s), 9 collective call(s))`` and the like."""
    phase = status.get("phase") or "starting"
    step = status.get("step") or 0
    total = sum((status.get("collectives") or {}).values())
    steps = f"{step} optimizer step(s), {total} collective call(s)"
    if status.get("op"):
        since = status.get("op_since")
        held = f" for {now - float(since):.1f} s" if since is not None else ""
        return f"in {status['op']} #{status.get('op_index')}{held} ({steps})"
    if phase == "running":
        last = f", last {status['last_op']}" if status.get("last_op") else ""
        return f"running the function, not in a collective ({steps}{last})"
    return _PHASE_ACTIVITY.get(phase, str(phase))


def failure_text(record: LaunchRecord) -> str:
    """The message of the ``RankFailure`` for ``record.failed_rank``."""
    assert record.failed_rank is not None
    failed = record.ranks[record.failed_rank]
    error = failed.error
    head = f"rank {failed.rank} of {record.world_size} (backend {record.backend}) failed"
    if error is not None:
        head += f"{_PHASE_WORDS.get(error.phase, '')}: {error.one_line()}"
    else:
        head += f" without a Python exception ({failed.exit})"
    parts = [head]
    if error is not None and error.traceback:
        parts += ["", f"rank {failed.rank} traceback:", error.traceback.rstrip()]
    elif error is None and failed.stack:
        parts += ["", f"rank {failed.rank} stack when it died (innermost first):",
                  *(f"  {frame}" for frame in failed.stack)]
    if (failed.failure_kind != "exception" or error is None) and failed.output.strip():
        parts += ["", f"rank {failed.rank} output (last lines):", analysis.tail(failed.output)]
    others = [_other_rank_line(rank) for rank in record.ranks if rank.rank != failed.rank]
    evidence = record.evidence_lines()
    if others or evidence:
        parts += ["", "other ranks:" if others else "evidence:", *others, *evidence]
    if record.nccl_env:
        parts += ["", "NCCL environment: " + " ".join(f"{k}={v}"
                                                       for k, v in record.nccl_env.items())]
    return "\n".join(parts)


def _other_rank_line(rank: RankRecord) -> str:
    if rank.stuck:
        state = "killed" if rank.outcome == "killed" else "in its own process"
        what = f"was still running, {state}: {rank.activity}"
        if rank.stack:
            what += "; stack (innermost first): " + " <- ".join(rank.stack[:3])
    elif rank.failed:
        what = (f"also failed: {rank.error.one_line()}" if rank.error is not None
                else f"also failed ({rank.exit})")
    elif rank.outcome == "stuck_at_exit":
        what = "returned, then hung on exit (killed)"
    else:
        what = "finished"
    return f"  rank {rank.rank}: {what}"


def hang_text(record: LaunchRecord) -> str:
    """The message of the ``RankTimeout`` for ranks still running at the end: where each was."""
    why = (f"still running after the {record.timeout:g} s timeout"
           if record.timed_out and record.timeout is not None
           else "still running after another rank ended")
    ended = ("killed with their process groups" if record.launcher == "run_ranks" else
             "each ends its own process if it is still in the launch "
             f"{TORCHRUN_HANG_EXIT_S:g} s later, and torchrun then ends the job")
    parts = [f"{len(record.stuck_ranks)} of {record.world_size} rank(s) {why} (backend "
             f"{record.backend}); {ended}. What each was doing:"]
    for rank in record.ranks:
        state = {"killed": "killed: ", "running": "still running: "}.get(rank.outcome, "")
        parts.append(f"  rank {rank.rank}: {state}{rank.activity}")
        if rank.stuck:
            parts += [f"      {frame}" for frame in rank.stack]
    parts += record.evidence_lines()
    parts.append(HANG_ADVICE)
    return "\n".join(parts)
