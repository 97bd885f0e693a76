"""Under torchrun this process is already one rank of the world: a launch runs here.

When pytest itself is started by ``torchrun`` (``TORCHELASTIC_RUN_ID`` set, ``WORLD_SIZE`` > 1,
on one host or several), every worker runs the same test session, and ``run_ranks``, the
``distributed`` fixture and the marker run the function in this process, as this rank, instead
of starting processes. A test reads the same as with ranks started here: every rank's result in
rank order, a ``RankFailure`` naming the rank that failed, a ``RankTimeout`` naming the stuck
rank, its collective and its stack.

* The group: ``init_process_group`` on a store prefix of its own for each launch (torchrun's
  store keeps a group's keys for the whole run, so a second group on the same keys would meet
  the first one's addresses), destroyed after, as in a rank started here. A default group the
  session already has is used as it is, and left.
* Outcomes: each rank posts its result or its error to torchrun's store and reads the others', so
  that every rank returns the same list, or raises for the same failure.
* Hangs: the heartbeat posts this rank's status to the store, and its main thread's stack when a
  peer asks; a rank whose outcome is missing at the deadline is named with both. A rank still
  inside the launch ``TORCHRUN_HANG_EXIT_S`` after its deadline writes its stacks to stderr and
  ends its process (as pytest-timeout's thread method does): nothing else can free a rank stuck
  in a collective, and torchrun then ends the job instead of waiting forever.

Every rank must make the same launches in the same order: a launch's store prefix is its count.
Importing this module imports no torch (the launcher asks ``under_torchrun`` on every launch).
"""

from __future__ import annotations

import datetime
import faulthandler
import importlib
import itertools
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pytest_gputrain.distributed import analysis
from pytest_gputrain.distributed.instrument import RankRecorder
from pytest_gputrain.distributed.record import (
    TORCHRUN_HANG_EXIT_S,
    LaunchRecord,
    LaunchSettings,
    RankError,
    RankRecord,
    conclude,
    describe_activity,
)

TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"  # set by torchrun's agent in every worker
HUNG_EXIT = 3  # the exit code of a rank that ends its own process, stuck past its time
POLL_S = 0.05
FAILURE_GRACE_S = 2.0  # after a rank failed, how long the others may take to post theirs
# After asking for stacks, the longest wait for them: a rank's heartbeat posts its stack within a
# beat, later on a loaded host; the wait ends as soon as every missing rank answered.
STACK_WAIT_S = 10.0
STORE_TIMEOUT_S = 300.0
_launches = itertools.count()
_store: list[Any] = []  # torchrun's rendezvous store, connected once per process


def under_torchrun() -> bool:
    """True in a worker of a torchrun with more than one rank."""
    try:
        return bool(os.environ.get(TORCHRUN_ENV)) and int(os.environ["WORLD_SIZE"]) > 1
    except (KeyError, ValueError):
        return False


def ranks_on_this_host() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ["WORLD_SIZE"])


def _dist() -> Any:
    return importlib.import_module("torch.distributed")


def _base_store() -> Any:
    if not _store:
        dist = _dist()
        store, _, _ = next(dist.rendezvous(
            "env://", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S)))
        _store.append(store)
    return _store[0]


def _main_thread_stack() -> str:
    """The main thread's stack inside the launch, read from another thread, in faulthandler's
    format (what called the launch, the test and pytest, is left out)."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    lines = ["Current thread 0x0 (most recent call first):"]
    while frame is not None and frame.f_code.co_filename != __file__:
        lines.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno} in '
                     f"{frame.f_code.co_name}")
        frame = frame.f_back
    return "\n".join(lines)


class _Beat:
    """Called by the heartbeat: stacks on request, and the end of a rank stuck past its time."""

    def __init__(self, store: Any, rank: int, deadline: float | None) -> None:
        self.store = store
        self.rank = rank
        self.deadline = deadline
        self.stack_posted = False

    def __call__(self) -> None:
        try:
            if not self.stack_posted and self.store.check(["dump"]):
                self.store.set(f"stack/{self.rank}", _main_thread_stack())
                self.stack_posted = True
        except Exception:
            pass  # the store went with its host: the deadline below still holds
        if self.deadline is not None and time.monotonic() > (self.deadline
                                                            + TORCHRUN_HANG_EXIT_S):
            sys.stderr.write(
                f"gputrain: rank {self.rank} is still in run_ranks {TORCHRUN_HANG_EXIT_S:g} s "
                "after its timeout; ending this process so that torchrun ends the job. "
                "Its stacks:\n")
            sys.stderr.flush()
            faulthandler.dump_traceback(all_threads=True)
            os._exit(HUNG_EXIT)


def run_here(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
             settings: LaunchSettings) -> tuple[LaunchRecord, list[Any]]:
    """Run ``fn`` on this rank; return the record of the launch and every rank's result."""
    dist = _dist()
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.PrefixStore(f"gputrain/launch{next(_launches)}/", _base_store())
    recorder = RankRecorder(rank, lambda text: store.set(f"status/{rank}", text),
                            settings.probe)
    started = time.monotonic()
    deadline = None if settings.timeout is None else started + settings.timeout
    recorder.flush()
    recorder.start_heartbeat(on_beat=_Beat(store, rank, deadline))
    try:
        outcome = _run(fn, args, kwargs, settings, recorder, store, rank, size)
        store.set(f"outcome/{rank}", pickle.dumps(outcome))
        outcomes, timed_out = _gather(store, size, deadline)
        missing = [r for r in range(size) if r not in outcomes]
        if missing:
            store.set("dump", "1")
            _await_stacks(store, missing)
        ended = time.monotonic()
        record = _record(settings, store, outcomes, missing, started, ended, timed_out)
    finally:
        recorder.stop()
        recorder.uninstall()
    results = []
    for r in range(size):
        payload = outcomes.get(r, {}).get("result")
        results.append(pickle.loads(payload)["value"] if payload is not None else None)
    return record, results


def _run(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
         settings: LaunchSettings, recorder: RankRecorder, store: Any, rank: int,
         size: int) -> dict[str, Any]:
    from _pytest.outcomes import OutcomeException

    from pytest_gputrain.distributed import rank_main

    dist = _dist()

    outcome: dict[str, Any] = {"pid": os.getpid()}
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    had_group = dist.is_initialized()
    recorder.set_phase("import")
    recorder.install()  # until the launch ends: run_here's caller uninstalls
    try:
        device = rank_main.select_device(local_rank)
        if settings.init and not had_group:
            recorder.set_phase("init")
            rank_main.init_group(settings.backend, rank, size, local_rank,
                             settings.collective_timeout, store=dist.PrefixStore("group/", store))
        outcome["result"] = rank_main.run_function(fn, args, kwargs, recorder, device,
                                               destroy_group=not had_group)
        recorder.set_phase("done")
    except (Exception, OutcomeException) as exc:  # pytest.skip()/fail() too; not Ctrl-C
        outcome["error"] = rank_main.error_data(exc, recorder, time.time())
        recorder.set_phase("failed")
        if not had_group and dist.is_initialized():
            dist.destroy_process_group()
    return outcome


def _gather(store: Any, size: int, deadline: float | None
            ) -> tuple[dict[int, dict[str, Any]], bool]:
    """Every rank's outcome; after a failure, those that come within FAILURE_GRACE_S; at the
    deadline, those there are. True when the deadline ended the wait."""
    outcomes: dict[int, dict[str, Any]] = {}
    first_failure: float | None = None
    while True:
        for r in range(size):
            if r not in outcomes and store.check([f"outcome/{r}"]):
                outcomes[r] = pickle.loads(store.get(f"outcome/{r}"))
        if len(outcomes) == size:
            return outcomes, False
        now = time.monotonic()
        if any("error" in o and not o["error"].get("skipped") for o in outcomes.values()):
            first_failure = first_failure or now
            if now - first_failure > FAILURE_GRACE_S:
                return outcomes, False
        if deadline is not None and now > deadline:
            return outcomes, True
        time.sleep(POLL_S)


def _await_stacks(store: Any, missing: list[int]) -> None:
    """Until each missing rank posted its stack, or its outcome after all (a late rank that
    finished posts none), or STACK_WAIT_S passed (a rank whose host is gone)."""
    deadline = time.monotonic() + STACK_WAIT_S
    waiting = list(missing)
    while True:
        waiting = [r for r in waiting
                   if not store.check([f"stack/{r}"]) and not store.check([f"outcome/{r}"])]
        if not waiting or time.monotonic() > deadline:
            return
        time.sleep(POLL_S)


def _on_our_clock(status: dict[str, Any], now: float) -> dict[str, Any]:
    """A peer's status with its times moved onto this process's clock (hosts' monotonic clocks
    differ): its last heartbeat counts as now, give or take one beat."""
    updated = status.get("updated")
    if updated is None:
        return status
    shift = now - float(updated)
    moved = dict(status)
    for key in ("op_since", "phase_since", "last_step_at", "updated"):
        if moved.get(key) is not None:
            moved[key] = float(moved[key]) + shift
    return moved


def _record(settings: LaunchSettings, store: Any, outcomes: Mapping[int, dict[str, Any]],
            missing: list[int], started: float, ended: float, timed_out: bool) -> LaunchRecord:
    import json

    several_hosts = ranks_on_this_host() != settings.world_size
    records = []
    failed_at: dict[int, float] = {}
    for r in range(settings.world_size):
        try:
            status = _on_our_clock(json.loads(store.get(f"status/{r}")), ended)
        except Exception:
            status = {}
        outcome = outcomes.get(r, {})
        data = outcome.get("error")
        error = None
        probe = None
        if data is not None:
            error = RankError(type=str(data.get("type") or "Error"),
                              message=str(data.get("message") or ""),
                              traceback=str(data.get("traceback") or ""),
                              phase=str(data.get("phase") or ""),
                              skipped=bool(data.get("skipped")))
            probe = data.get("probe")
            if not error.skipped:
                failed_at[r] = float(data.get("failed_at") or 0.0)
        elif outcome.get("result") is not None:
            probe = pickle.loads(outcome["result"]).get("probe")
        if isinstance(probe, dict) and several_hosts:
            # Arrival times compare clocks across ranks; hosts' monotonic clocks differ.
            probe = {**probe, "arrivals": {}}
        stack: list[str] = []
        if r in missing and store.check([f"stack/{r}"]):
            stack = analysis.user_frames(analysis.main_thread_frames(
                store.get(f"stack/{r}").decode("utf-8", "replace"), None))
        kind = None
        if error is not None and not error.skipped:
            kind = analysis.classify_failure(f"{error.message} {error.traceback}", error.phase)
        records.append(RankRecord(
            rank=r, pid=int(outcome.get("pid") or status.get("pid") or 0),
            outcome=("running" if r in missing else "ok" if error is None else
                     "skipped" if error.skipped else "failed"),
            exit_code=None, error=error, failure_kind=kind,
            activity=describe_activity(status, ended), status=status, stack=stack,
            probe=probe if isinstance(probe, dict) else None))
    return conclude(settings, records, duration=ended - started, ended=ended,
                    failed_at=failed_at, timed_out=timed_out, launcher="torchrun")
