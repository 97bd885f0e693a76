"""Ranks started here, one process each, through torch elastic (the engine of ``torchrun``).

``start_processes`` runs each rank as ``python -c`` (``_rank.main``) in its own process group,
with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1`` and a free
``MASTER_PORT`` added to the caller's environment, its output in files, and an error file that
elastic's ``record`` fills when the rank raises (read back with elastic's ``ProcessFailure``);
``PContext.close`` reaps the ranks.

What elastic lacks is here:

* a hang becomes a failure: ranks still running after the timeout get their stacks dumped
  (SIGUSR1, faulthandler) before they are killed, and their heartbeat status says which
  collective each was in;
* after a rank fails, the others get ``FAILURE_GRACE_S`` to finish or fail (elastic closes them
  at once), so that the failure reported is the rank that failed on its own, not the peer that
  lost it;
* ranks are watched without being reaped (``waitid(WNOWAIT)``): until the launch ends, a rank's
  PID and process group stay ours, so what it leaves in its group is killed with it;
* the function and its result travel pickled through files (elastic returns no values from
  command launches).

This module imports no torch at import time.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gputrain.distributed import analysis
from pytest_gputrain.distributed.errors import DistributedSetupError
from pytest_gputrain.distributed.record import (
    LaunchRecord,
    LaunchSettings,
    RankError,
    RankRecord,
    conclude,
    describe_activity,
)

HOST = "127.0.0.1"
POLL_S = 0.05
FAILURE_GRACE_S = 2.0  # after a rank fails, how long the others may take to finish or fail
EXIT_GRACE_S = 15.0  # after a rank returned its result, how long it may take to exit
# After SIGUSR1, the longest wait for faulthandler's stack dumps: a rank writes its dump as soon
# as it is scheduled, which on a loaded host can take seconds. The wait ends as soon as every
# dump is written: a file that grew and then stayed the same size for STACK_SETTLE_S.
STACK_WAIT_S = 10.0
STACK_SETTLE_S = 0.2
REAP_WAIT_S = 10  # how long to wait for killed ranks to end (a D-state rank is left)
PORT_ATTEMPTS = 3
RANK_ENV = "GPUTRAIN_DIST_RANK"  # set in every rank started here
# Kept in step with rank_main.py, which imports torch and so is not imported here.
ERROR_KEY = "gputrain"
STATUS_FILE = "status.json"
STACK_FILE = "stack.txt"
RESULT_FILE = "result.pkl"


@dataclass
class _RankProcess:
    """What the launcher knows of one rank process while it runs."""

    rank: int
    handler: Any  # elastic's SubprocessHandler: the process, never reaped before the launch ends
    dir: Path  # the rank's log directory: elastic's logs and error file, our status and stacks
    exit_code: int | None = None
    exited_at: float | None = None
    result: dict[str, Any] | None = None
    result_seen_at: float | None = None
    error: dict[str, Any] | None = None  # our part of the rank's error file
    killed: bool = False
    stuck_at_exit: bool = False

    @property
    def process(self) -> subprocess.Popen[bytes]:
        process: subprocess.Popen[bytes] = self.handler.proc
        return process

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @property
    def finished(self) -> bool:
        return self.exit_code is not None or self.stuck_at_exit

    @property
    def failed(self) -> bool:
        if self.error is not None:
            return not self.error.get("skipped", False)
        if self.result is not None:
            return False  # returned its result, then died in teardown
        return self.exit_code is not None and self.exit_code != 0


def run(settings: LaunchSettings, payload: bytes) -> tuple[LaunchRecord, list[Any]]:
    """Run the pickled ``(fn, args, kwargs)`` on ``settings.world_size`` new processes; a port
    taken between choosing it and binding it is chosen again."""
    for attempt in range(PORT_ATTEMPTS):
        record, results = _run_once(settings, payload)
        if not _port_taken(record):
            return record, results
        if attempt == PORT_ATTEMPTS - 1:
            raise DistributedSetupError(
                f"could not bind a free port on {HOST} in {PORT_ATTEMPTS} attempts")
    raise AssertionError("unreachable")


def _run_once(settings: LaunchSettings, payload: bytes) -> tuple[LaunchRecord, list[Any]]:
    run_dir = Path(tempfile.mkdtemp(prefix="gputrain-ranks-"))
    ranks: list[_RankProcess] = []
    timed_out = False
    started = time.monotonic()
    try:
        store = _launch_store(settings)
        port = int(store.port) if store is not None else _free_port()
        context = _start(settings, payload, run_dir, port)
        try:
            for rank in range(settings.world_size):
                ranks.append(_RankProcess(rank, context.subprocess_handlers[rank],
                                          Path(context.error_files[rank]).parent))
            deadline = None if settings.timeout is None else started + settings.timeout
            timed_out = _watch(ranks, deadline)
        finally:
            _stop(context, ranks)
            del store  # after every rank ended: none is left reading from it
        ended = time.monotonic()
        logs = {s.rank: (Path(context.stderrs[s.rank]), Path(context.stdouts[s.rank]))
                for s in ranks}
        record = _record(settings, ranks, started, ended, timed_out, logs)
    finally:
        if not os.environ.get("GPUTRAIN_DIST_KEEP"):
            shutil.rmtree(run_dir, ignore_errors=True)
    return record, [(s.result or {}).get("value") for s in ranks]


def _launch_store(settings: LaunchSettings) -> Any:
    """The group's rendezvous store, hosted here for the whole launch when the ranks' group is
    ours to make. Hosted by rank 0 (``tcp://`` init), it went with rank 0's process: a rank 0
    that skipped or returned at once left rank 1 reading "Connection reset by peer" in
    ``init_process_group``. Port 0: the store binds a free port itself, with no race."""
    if not settings.init:
        return None  # the function makes its own group (env://): rank 0 hosts MASTER_PORT
    import datetime
    import importlib

    dist: Any = importlib.import_module("torch.distributed")
    return dist.TCPStore(HOST, 0, None, True,
                         datetime.timedelta(seconds=settings.collective_timeout),
                         wait_for_workers=False)


def _free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """Elastic's start installs torchrun's handlers (SIGTERM, SIGINT... raise SignalException)
    in the calling process; a test session keeps its own."""
    saved: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"):
            number = getattr(signal, name, None)
            if number is not None:
                saved[number] = signal.getsignal(number)
    try:
        yield
    finally:
        for number, handler in saved.items():
            if handler is not None:
                signal.signal(number, handler)


def _boot_code() -> str:
    root = str(Path(__file__).resolve().parent.parent.parent)
    return (f"import sys; sys.path.insert(0, {root!r}); "
            "from pytest_gputrain.distributed.rank_main import main; main()")


def _start(settings: LaunchSettings, payload: bytes, run_dir: Path, port: int) -> Any:
    """Elastic's ``start_processes``: one ``python -c`` per rank, in its own process group."""
    import multiprocessing.spawn

    try:
        from torch.distributed.elastic.multiprocessing import (
            DefaultLogsSpecs,
            Std,
            start_processes,
        )
    except ImportError as exc:
        import torch

        raise DistributedSetupError(
            f"run_ranks needs torch >= 2.3 (torch.distributed.elastic's LogsSpecs); this is "
            f"torch {torch.__version__}: {exc}") from None
    preparation = multiprocessing.spawn.get_preparation_data("gputrain-rank")
    # An AuthenticationString refuses pickling; the rank needs no key to talk to us.
    preparation.pop("authkey", None)
    main_path = preparation.get("init_main_from_path")
    if main_path and not os.path.isfile(main_path):
        preparation.pop("init_main_from_path")  # python -c, stdin, a notebook
    spec_path = run_dir / "spec.pkl"
    spec_path.write_bytes(pickle.dumps({
        "payload": payload, "preparation": preparation, "backend": settings.backend,
        "init": settings.init, "host": HOST, "port": port, "world_size": settings.world_size,
        "collective_timeout": settings.collective_timeout, "probe": settings.probe,
    }))
    boot = _boot_code()
    size = str(settings.world_size)
    envs = {rank: {**settings.env, "RANK": str(rank), "LOCAL_RANK": str(rank),
                   "WORLD_SIZE": size, "LOCAL_WORLD_SIZE": size, "GROUP_RANK": "0",
                   "MASTER_ADDR": HOST, "MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1",
                   RANK_ENV: str(rank)}
            for rank in range(settings.world_size)}
    with _signal_handlers_kept():
        return start_processes(
            name="gputrain-rank", entrypoint=sys.executable,
            args={rank: ("-c", boot, str(spec_path), str(rank), str(os.getpid()))
                  for rank in range(settings.world_size)},
            envs=envs, logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "logs"),
                                                   redirects=Std.ALL))


def _exit_code(state: _RankProcess) -> int | None:
    """The rank's exit code (negative: the signal), without reaping it: while a rank is
    unreaped its PID and process group cannot be reused, so signalling them stays safe."""
    if state.process.returncode is not None:
        return int(state.process.returncode)
    if not hasattr(os, "waitid"):
        return state.process.poll()
    try:
        info = os.waitid(os.P_PID, state.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return state.process.poll()
    if info is None:
        return None
    return int(info.si_status) if info.si_code == os.CLD_EXITED else -int(info.si_status)


def _kill_group(state: _RankProcess) -> None:
    """SIGKILL the rank and everything in its process group, only while it is unreaped, with
    elastic's handler, which also closes our copies of the rank's log files (its own close
    leaves them open for ranks that ended by themselves)."""
    if state.process.returncode is not None:
        return
    with contextlib.suppress(OSError):  # ProcessLookupError, PermissionError
        state.handler.close(death_sig=getattr(signal, "SIGKILL", signal.SIGTERM))


def _collect(state: _RankProcess) -> None:
    """Read what an ended rank left: its result, or the error elastic's ``record`` wrote."""
    result_path = state.dir / RESULT_FILE
    if state.result is None and result_path.exists():
        try:
            state.result = pickle.loads(result_path.read_bytes())
        except Exception as exc:
            state.error = {"type": type(exc).__name__, "phase": "result", "traceback": "",
                           "message": f"the rank's result could not be unpickled in the "
                                      f"launcher: {type(exc).__name__}: {exc}"}
    if state.error is None and state.exit_code not in (None, 0):
        state.error = _read_error_file(state)


def _read_error_file(state: _RankProcess) -> dict[str, Any] | None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    path = state.dir / "error.json"
    if not path.exists():
        return None
    try:
        failure = ProcessFailure(local_rank=state.rank, pid=state.pid,
                                 exitcode=int(state.exit_code or 0), error_file=str(path))
    except Exception:
        return None
    ours = failure.error_file_data.get(ERROR_KEY)
    if isinstance(ours, dict):
        return ours
    return {"type": "Error", "message": str(failure.message), "traceback": "", "phase": None}


def _watch(ranks: list[_RankProcess], deadline: float | None) -> bool:
    """Until every rank ended, a rank failed (plus grace), or the deadline: True on the last."""
    first_failure: float | None = None
    while True:
        now = time.monotonic()
        for state in ranks:
            if state.finished:
                continue
            code = _exit_code(state)
            if code is not None:
                state.exit_code, state.exited_at = code, now
                _kill_group(state)  # what the rank left in its process group goes with it
                _collect(state)
            elif state.result_seen_at is None:
                if (state.dir / RESULT_FILE).exists():
                    state.result_seen_at = now
            elif now - state.result_seen_at > EXIT_GRACE_S:
                _collect(state)
                state.stuck_at_exit = True  # returned, then hung in interpreter/NCCL teardown
                _kill_group(state)
        if all(s.finished for s in ranks):
            return False
        if any(s.failed for s in ranks):
            first_failure = first_failure or now
            # A rank that returned its result is only exiting: it keeps its EXIT_GRACE_S
            # (a loaded host can take seconds to tear a process down).
            exiting = any(not s.finished and s.result_seen_at is not None for s in ranks)
            if now - first_failure > FAILURE_GRACE_S and not exiting:
                return False
        if deadline is not None and now > deadline:
            return True
        time.sleep(POLL_S)


def _stop(context: Any, ranks: list[_RankProcess]) -> None:
    """Dump the stacks of ranks still running, kill every rank's group, let elastic reap."""
    running = [s for s in ranks if not s.finished]
    if running and hasattr(signal, "SIGUSR1"):
        _dump_stacks(running)
    for state in running:
        state.killed = True
    for state in ranks:
        _kill_group(state)
    # Elastic's close then finds them ended and only reaps them; one it still finds alive (an
    # uninterruptible wait in a driver) it signals again and, after REAP_WAIT_S, leaves.
    deadline = time.monotonic() + REAP_WAIT_S
    while any(_exit_code(s) is None for s in running) and time.monotonic() < deadline:
        time.sleep(POLL_S / 5)
    context.close(death_sig=getattr(signal, "SIGKILL", signal.SIGTERM), timeout=REAP_WAIT_S)
    for state in ranks:
        if state.exit_code is None:
            state.exit_code = state.process.returncode
        _collect(state)


def _dump_stacks(running: list[_RankProcess]) -> None:
    """Ask each running rank for its stacks (faulthandler writes them to its stack file on
    SIGUSR1) and wait until each dump is written, or its rank ended, or STACK_WAIT_S passed."""
    sizes = {state.rank: _size(state.dir / STACK_FILE) for state in running}
    for state in running:
        with contextlib.suppress(OSError):
            os.kill(state.pid, signal.SIGUSR1)
    grew_at: dict[int, float] = {}
    waiting = list(running)
    deadline = time.monotonic() + STACK_WAIT_S
    while waiting and time.monotonic() < deadline:
        time.sleep(POLL_S)
        now = time.monotonic()
        for state in list(waiting):
            size = _size(state.dir / STACK_FILE)
            if size != sizes[state.rank]:
                sizes[state.rank], grew_at[state.rank] = size, now
                continue
            written = state.rank in grew_at and now - grew_at[state.rank] >= STACK_SETTLE_S
            if written or _exit_code(state) is not None:
                waiting.remove(state)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""


def _read_status(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text("utf-8"))
        return data
    except (OSError, ValueError):
        return {}


def _outcome(state: _RankProcess) -> str:
    if state.stuck_at_exit:
        return "stuck_at_exit"
    if state.killed:
        return "killed"
    if state.result is not None:
        return "ok"
    if state.error is not None:
        return "skipped" if state.error.get("skipped") else "failed"
    return "ok" if state.exit_code == 0 else "crashed"


def _record(settings: LaunchSettings, ranks: list[_RankProcess], started: float, ended: float,
            timed_out: bool, logs: dict[int, tuple[Path, Path]]) -> LaunchRecord:
    records = []
    failed_at: dict[int, float] = {}
    for state in ranks:
        status = _read_status(state.dir / STATUS_FILE)
        # stderr.log holds only what came before the rank joined stderr to stdout.
        output = "".join(_read_text(path) for path in logs[state.rank])
        data = state.error or {}
        error = None
        if state.error is not None:
            error = RankError(type=str(data.get("type") or "Error"),
                              message=str(data.get("message") or ""),
                              traceback=str(data.get("traceback") or ""),
                              phase=str(data.get("phase") or ""),
                              skipped=bool(data.get("skipped")))
        outcome = _outcome(state)
        kind = None
        if outcome in ("failed", "crashed"):
            text = " ".join([error.message, error.traceback] if error else []) + " " + output
            kind = analysis.classify_failure(text, error.phase if error else None,
                                             state.exit_code, has_exception=error is not None)
            failed_at[state.rank] = float(data.get("failed_at") or state.exited_at or ended)
        main = status.get("main_thread")
        frames = analysis.main_thread_frames(_read_text(state.dir / STACK_FILE),
                                             int(main) if main is not None else None)
        probe = state.result.get("probe") if state.result else data.get("probe")
        records.append(RankRecord(
            rank=state.rank, pid=state.pid, outcome=outcome, exit_code=state.exit_code,
            error=error, failure_kind=kind, activity=describe_activity(status, ended),
            status=status, stack=analysis.user_frames(frames), output=output,
            probe=probe if isinstance(probe, dict) else None))
    return conclude(settings, records, duration=ended - started, ended=ended,
                    failed_at=failed_at, timed_out=timed_out)


def _port_taken(record: LaunchRecord) -> bool:
    for rank in record.ranks:
        error = rank.error
        text = f"{error.message if error else ''} {rank.output}".lower()
        if (error is not None and error.phase == "init" and
                ("address already in use" in text or f"errno {errno.EADDRINUSE}" in text)):
            return True
    return False
