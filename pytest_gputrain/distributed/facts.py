"""Facts of one multi-rank launch (or of one test that used ``nn.DataParallel``).

Rules of scope ``distributed`` see the session names (``env.*``, ``torch.*``, ``devices.*``, ...)
plus ``dist.<field>`` for every field of :class:`DistributedRunFacts`
(``python -m pytest_gputrain facts --scope distributed`` lists them). This module registers the
scope (the distributed plugin declares it).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pytest_gputrain import scopes
from pytest_gputrain.facts import (
    EnvironmentFacts,
    FactGroup,
    fact,
    group_namespace,
    session_namespace,
)

Namespace = dict[str, tuple[Any, str | None, str | None]]


class RankFacts(BaseModel):
    """What one rank did, as its launcher saw it."""

    model_config = ConfigDict(extra="forbid")

    rank: int
    pid: int | None = None
    device: str | None = fact(doc="cuda:N or cpu")
    device_name: str | None = fact(doc="GPU product name, or cpu")
    outcome: str | None = fact(doc="ok, failed, skipped, crashed, killed (after a timeout or a "
                                   "peer's failure), stuck_at_exit, running (under torchrun: "
                                   "still in the launch when the others reported)")
    exit: str | None = fact(doc="exit code or signal")
    steps: int | None = fact(doc="optimizer steps taken")
    step_time_median: float | None = fact("s", "median time between optimizer steps")
    busy_time_median: float | None = fact("s", "median step time minus waiting for other ranks")
    wait_fraction: float | None = fact(doc="median share of a step spent waiting for others")
    samples: int | None = fact(doc="samples through DDP forwards (or DataLoader batches)")
    batch_size_median: float | None = fact(doc="median batch size")
    collectives: dict[str, int] = Field(default_factory=dict,
                                        description="torch.distributed calls per operation")
    last_activity: str | None = fact(doc="what the rank was doing last (phase, collective)")
    stack: list[str] = Field(default_factory=list,
                             description="innermost frames of the main thread when killed "
                                         "(or, under torchrun, left running)")
    error: str | None = fact(doc="the rank's exception, one line")
    # For the pictures of the launch (the HTML report's lanes): every rank on one clock.
    step_ends: list[float] = Field(
        default_factory=list, description="s since the first moment any rank recorded: the end "
        "of each kept optimizer step (at most 600, thinned keeping the longest and shortest)")
    step_waits: list[float] = Field(
        default_factory=list, description="s each kept step waited for the other ranks")


class DistributedRunFacts(FactGroup):
    test: str | None = fact(doc="test node id")
    launcher: str = fact(doc="run_ranks (one process per rank), torchrun (ranks torchrun "
                             "started) or in_process (DataParallel)", default="run_ranks")
    world_size: int | None = fact(doc="number of ranks")
    backend: str | None = fact(doc="process group backend the ranks ran (nccl, gloo, ...)")
    outcome: str | None = fact(doc="passed, failed or timeout")
    duration: float | None = fact("s", "launch to last rank's end")
    timeout: float | None = fact("s", "the launch's timeout")
    collective_timeout: float | None = fact("s", "init_process_group timeout")
    probe: bool = fact(doc="per-rank steps and batches were recorded (--gpu-diagnose)",
                       default=False)
    ranks: list[RankFacts] = Field(default_factory=list, description="per-rank facts")
    device_names: list[str] | None = fact(doc="device name per rank")
    distinct_device_names: int | None = fact(doc="number of different GPU models used")
    cuda_used: bool | None = fact(doc="any rank put tensors on a GPU")
    ddp_used: bool | None = fact(doc="DistributedDataParallel wrapped a model")
    data_parallel_devices: int | None = fact(doc="GPUs an nn.DataParallel spread a model over")
    steps: list[int] | None = fact(doc="optimizer steps per rank")
    min_steps: int | None = fact(doc="fewest optimizer steps of any rank")
    step_count_spread: int | None = fact(doc="most minus fewest optimizer steps across ranks")
    step_time_medians: list[float | None] | None = fact("s", "median step time per rank")
    busy_time_medians: list[float | None] | None = fact(
        "s", "median step time minus waiting at the synchronisation point, per rank")
    step_time_summary: str | None = fact(doc="median step time per rank, for messages")
    busy_time_summary: str | None = fact(doc="median busy time per rank, for messages")
    wait_summary: str | None = fact(doc="median share of each step spent waiting, per rank")
    straggler_rank: int | None = fact(doc="rank with the longest median busy time")
    fastest_rank: int | None = fact(doc="rank with the shortest median busy time")
    straggler_ratio: float | None = fact(doc="slowest / fastest median busy time")
    straggler_excess: float | None = fact("s", "slowest minus fastest median busy time")
    straggler_busy: float | None = fact("s", "median busy time of the slowest rank")
    fastest_busy: float | None = fact("s", "median busy time of the fastest rank")
    batch_source: str | None = fact(doc="where batches were counted: ddp_forward or dataloader")
    samples: list[int] | None = fact(doc="samples per rank")
    samples_summary: str | None = fact(doc="samples per rank, for messages")
    batch_size_medians: list[float | None] | None = fact(doc="median batch size per rank")
    batch_size_summary: str | None = fact(doc="median batch size per rank, for messages")
    steps_summary: str | None = fact(doc="optimizer steps per rank, for messages")
    sample_ratio: float | None = fact(doc="most / fewest samples across ranks")
    batch_size_ratio: float | None = fact(doc="largest / smallest median batch size")
    nccl_variables: dict[str, str] = Field(default_factory=dict,
                                           description="NCCL_* and TORCH_NCCL_* the ranks saw")
    failed_rank: int | None = fact(doc="the first rank that failed (or first stuck rank)")
    failure_kind: str | None = fact(doc="exception, nccl_timeout, nccl_error, collective_timeout, "
                                        "peer_failure, init_failure, crash or hang")
    failure_message: str | None = fact(doc="the failing rank's error, one line")
    nccl_operation: str | None = fact(doc="operation the NCCL watchdog timed out, e.g. "
                                          "ALLREDUCE #3")
    nccl_waited: float | None = fact("s", "how long the NCCL watchdog saw the operation run")
    stuck_ranks: list[int] | None = fact(doc="ranks still running when killed")
    desync: str | None = fact(doc="which rank never entered which collective")
    failure_summary: str | None = fact(doc="rank-level account of the failure")


def distributed_namespace(env: EnvironmentFacts, facts: DistributedRunFacts) -> Namespace:
    names: Namespace = dict(session_namespace(env))
    names.update(group_namespace("dist", facts))
    return names


def subject_of(facts: DistributedRunFacts) -> str:
    """'tests/test_ddp.py::test_train [2 ranks, nccl]', or the test alone for DataParallel."""
    test = facts.test or "session"
    if facts.launcher == "in_process":
        return test
    return f"{test} [{facts.world_size} ranks, {facts.backend}]"


scopes.register(scopes.Scope(
    name="distributed",
    model=DistributedRunFacts,
    namespace=lambda env, facts, related: distributed_namespace(env, facts),
    subject=subject_of,
    records_key="distributed",
))
