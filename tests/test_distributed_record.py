"""The public record of a launch: its texts and the facts built from it, without processes."""

from __future__ import annotations

from typing import Any

from pytest_gputrain.distributed.errors import RankFailure, RankTimeout
from pytest_gputrain.distributed.record import (
    LaunchRecord,
    RankError,
    RankRecord,
    describe_activity,
    failure_text,
    hang_text,
)


def _hung_record() -> LaunchRecord:
    """Rank 0 waits in all_reduce #3; rank 1 never got there. Both killed at the 30 s timeout."""
    waiting = {"phase": "running", "op": "all_reduce", "op_index": 3, "op_since": 70.0,
               "collectives": {"all_reduce": 3}, "step": 2}
    behind = {"phase": "running", "op": None, "collectives": {"all_reduce": 2}, "step": 2,
              "last_op": "all_reduce #2"}
    return LaunchRecord(
        world_size=2, backend="gloo", timeout=30.0, collective_timeout=300.0, probe=False,
        duration=30.4, nccl_env={"NCCL_DEBUG": "WARN"},
        ranks=[
            RankRecord(rank=0, pid=101, outcome="killed", exit_code=-9,
                       activity=describe_activity(waiting, 100.0), status=waiting,
                       stack=["torch/distributed/distributed_c10d.py:3252 in all_reduce",
                              "train.py:19 in step"]),
            RankRecord(rank=1, pid=102, outcome="killed", exit_code=-9,
                       activity=describe_activity(behind, 100.0), status=behind,
                       stack=["train.py:17 in load_batch"]),
        ],
        timed_out=True, stuck_ranks=[0, 1],
        desync="rank 1 (2 call(s)) never entered all_reduce #3 while rank 0 waited 30.0 s in it",
    )


def test_activity_names_the_collective_in_progress_and_for_how_long() -> None:
    status = {"phase": "running", "op": "broadcast", "op_index": 2, "op_since": 10.0,
              "collectives": {"broadcast": 2, "all_reduce": 5}, "step": 4}
    assert describe_activity(status, 30.5) == (
        "in broadcast #2 for 20.5 s (4 optimizer step(s), 7 collective call(s))")
    assert describe_activity({"phase": "running", "collectives": {}, "last_op": "barrier #1"},
                             0.0) == ("running the function, not in a collective (0 optimizer "
                                      "step(s), 0 collective call(s), last barrier #1)")
    assert describe_activity({}, 0.0).startswith("starting")
    assert describe_activity({"phase": "init"}, 0.0).startswith("in init_process_group")


def test_hang_text_names_each_stuck_rank_its_collective_and_stack() -> None:
    text = hang_text(_hung_record())
    assert text.startswith("2 of 2 rank(s) still running after the 30 s timeout (backend gloo)")
    assert "  rank 0: killed: in all_reduce #3 for 30.0 s (2 optimizer step(s)" in text
    assert "      train.py:19 in step" in text
    assert "  rank 1: killed: running the function, not in a collective" in text
    assert "      train.py:17 in load_batch" in text
    assert "collectives: rank 1 (2 call(s)) never entered all_reduce #3" in text
    assert "set collective_timeout below timeout" in text


def test_failure_text_shows_the_failed_rank_first_and_what_the_others_did() -> None:
    error = RankError(type="ValueError", message="bad batch\non rank 1",
                      traceback="Traceback ...\nValueError: bad batch", phase="running")
    record = LaunchRecord(
        world_size=3, backend="nccl", timeout=60.0, collective_timeout=30.0, probe=False,
        duration=4.0, nccl_env={"NCCL_P2P_DISABLE": "1"},
        ranks=[RankRecord(rank=0, pid=1, outcome="ok", exit_code=0),
               RankRecord(rank=1, pid=2, outcome="failed", exit_code=3, error=error,
                          failure_kind="exception", output="loading\n"),
               RankRecord(rank=2, pid=3, outcome="killed", exit_code=-9,
                          activity="in barrier #1 for 2.0 s (0 optimizer step(s), 1 "
                                   "collective call(s))",
                          stack=["a.py:1 in f", "b.py:2 in g", "c.py:3 in h", "d.py:4 in i"])],
        failed_rank=1, stuck_ranks=[2])
    lines = failure_text(record).splitlines()
    assert lines[0] == "rank 1 of 3 (backend nccl) failed: ValueError: bad batch on rank 1"
    assert "rank 1 traceback:" in lines
    assert "rank 1 output (last lines):" not in lines  # a plain exception: the traceback says it
    assert "  rank 0: finished" in lines
    assert ("  rank 2: was still running, killed: in barrier #1 for 2.0 s (0 optimizer step(s), "
            "1 collective call(s)); stack (innermost first): a.py:1 in f <- b.py:2 in g <- "
            "c.py:3 in h") in lines
    assert lines[-1] == "NCCL environment: NCCL_P2P_DISABLE=1"


def test_a_crash_shows_its_signal_stack_and_output() -> None:
    record = LaunchRecord(
        world_size=2, backend="gloo", timeout=60.0, collective_timeout=30.0, probe=False,
        duration=2.0, nccl_env={},
        ranks=[RankRecord(rank=0, pid=1, outcome="crashed", exit_code=-6, failure_kind="crash",
                          stack=["train.py:9 in step"], output="Fatal Python error: Aborted\n"),
               RankRecord(rank=1, pid=2, outcome="failed", exit_code=3, failure_kind="peer_failure",
                          error=RankError("RuntimeError", "Connection closed by peer", "",
                                          "running"))],
        failed_rank=0)
    text = failure_text(record)
    assert text.startswith("rank 0 of 2 (backend gloo) failed without a Python exception "
                           "(killed by SIGABRT)")
    assert "rank 0 stack when it died (innermost first):\n  train.py:9 in step" in text
    assert "rank 0 output (last lines):\nFatal Python error: Aborted" in text
    assert "  rank 1: also failed: RuntimeError: Connection closed by peer" in text
    assert "NCCL environment" not in text


def _facts(record: LaunchRecord, error: RankFailure | None) -> Any:
    from pytest_gputrain.distributed.launch_facts import build_facts

    return build_facts(record, "test_x.py::test_y", error)


def test_facts_of_a_hang_come_from_the_record() -> None:
    record = _hung_record()
    error = RankTimeout(hang_text(record), stuck_ranks=[0, 1], timeout=30.0, rank=0,
                        kind="hang", world_size=2, backend="gloo", record=record)
    facts = _facts(record, error)
    assert facts.outcome == "timeout" and facts.failure_kind == "hang"
    assert facts.stuck_ranks == [0, 1]
    assert facts.desync == record.desync
    assert [r.outcome for r in facts.ranks] == ["killed", "killed"]
    assert facts.ranks[0].last_activity.startswith("in all_reduce #3 for 30.0 s")
    assert facts.ranks[0].stack[-1] == "train.py:19 in step"
    assert facts.ranks[0].collectives == {"all_reduce": 3}
    assert facts.nccl_variables == {"NCCL_DEBUG": "WARN"}
    assert "rank 0 was in all_reduce #3" in (facts.failure_summary or "")
    assert facts.unknown["straggler_ratio"].startswith("per-rank steps are recorded")


def test_facts_of_a_passed_launch_keep_stacks_only_for_killed_ranks() -> None:
    record = LaunchRecord(
        world_size=1, backend="gloo", timeout=None, collective_timeout=1800.0, probe=True,
        duration=1.23456, nccl_env={},
        ranks=[RankRecord(rank=0, pid=7, outcome="ok", exit_code=0, stack=["x.py:1 in f"],
                          probe={"device": "cpu", "device_name": "cpu", "backend": "gloo",
                                 "step_ends": [], "arrivals": {}})])
    facts = _facts(record, None)
    assert facts.outcome == "passed" and facts.duration == 1.235
    assert facts.ranks[0].stack == [] and facts.ranks[0].device == "cpu"
    assert facts.failed_rank is None
