"""Run a function on N ranks, one process each, and never hang the test run.

    from pytest_gputrain.distributed import run_ranks

    def train(steps):                      # module level: each rank imports it by name
        model = DDP(Net().to(rank_device()))
        ...
        return loss.item()

    losses = run_ranks(train, world_size=2, args=(20,))   # [loss of rank 0, loss of rank 1]

The ranks are started and ended by torch elastic, the engine of ``torchrun``:
``start_processes`` runs each rank as ``python -c`` (``_rank``) in its own process group with
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1`` and a free ``MASTER_PORT``
added to the caller's environment, sends its output to files, and hands it an error file that
elastic's ``record`` fills with the rank's traceback; ``PContext.close`` reaps them.

What elastic lacks is here:

* a hang becomes a failure: ranks still running after ``timeout`` get their stacks dumped
  (SIGUSR1, faulthandler) and the :class:`RankTimeout` names each one's collective in progress
  and stack (the heartbeat status of ``instrument``);
* after a rank fails, the others get ``FAILURE_GRACE_S`` to finish or fail before they are killed
  (elastic closes them at once), so that the rank reported is the one that failed on its own,
  not the peer that lost it;
* the function goes by reference and its result comes back pickled through files, tensors on
  the CPU (elastic returns no values from ranks it starts as commands; see ``docs/multi-gpu.md``
  for why the ranks are not elastic's function launches);
* ranks never outlive the launcher (parent-death signal, heartbeat), and what a rank leaves in
  its process group is killed with it, before the rank is reaped.

Every launch ends with a :class:`~pytest_gputrain.distributed.record.LaunchRecord`, the public
account of what each rank did; the errors and the diagnosis are written from it.

This module imports no torch at import time.
"""

from __future__ import annotations

import contextlib
import contextvars
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
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_gputrain.distributed import analysis
from pytest_gputrain.distributed.errors import (
    DistributedSetupError,
    RankFailure,
    RankFunctionNotPicklable,
    RankTimeout,
)
from pytest_gputrain.distributed.record import (
    LaunchRecord,
    RankError,
    RankRecord,
    describe_activity,
    failure_text,
    hang_text,
)

HOST = "127.0.0.1"
POLL_S = 0.05
FAILURE_GRACE_S = 2.0  # after a rank fails, how long the others may take to finish or fail
EXIT_GRACE_S = 15.0  # after a rank returned its result, how long it may take to exit
STACK_WAIT_S = 1.0  # after SIGUSR1, how long to wait for faulthandler's stack dump
REAP_WAIT_S = 10  # how long elastic's close waits for killed ranks (a D-state rank is left)
PORT_ATTEMPTS = 3
LOG_ECHO_LINES = 200
RANK_ENV = "GPUTRAIN_DIST_RANK"
NCCL_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_DEBUG")
# Kept in step with _rank.py, which imports torch and so is not imported here.
ERROR_KEY = "gputrain"
STATUS_FILE = "status.json"
STACK_FILE = "stack.txt"
RESULT_FILE = "result.pkl"


class LaunchRecorder(Protocol):
    """Receives the facts of each launch made while a test runs (set by the pytest plugin)."""

    probe: bool

    def record(self, facts: Any) -> None: ...


_recorder: contextvars.ContextVar[LaunchRecorder | None] = contextvars.ContextVar(
    "gputrain_launch_recorder", default=None)


def set_recorder(recorder: LaunchRecorder | None) -> contextvars.Token[LaunchRecorder | None]:
    return _recorder.set(recorder)


def reset_recorder(token: contextvars.Token[LaunchRecorder | None]) -> None:
    _recorder.reset(token)


# ------------------------------------------------------------------------------------------
# Helpers for rank functions


def in_rank() -> bool:
    """True inside a rank process started by the launcher."""
    return RANK_ENV in os.environ


def rank_device() -> Any:
    """This rank's device: ``cuda:LOCAL_RANK`` when the rank has a GPU, else ``cpu``."""
    import torch

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


# ------------------------------------------------------------------------------------------
# Checks made before any process starts


@dataclass
class Launch:
    """The outcome of a launch that succeeded: per-rank results in rank order, and facts."""

    world_size: int
    backend: str
    results: list[Any]
    duration: float
    pids: list[int]
    facts: Any = None  # DistributedRunFacts when recorded
    outputs: list[str] = field(default_factory=list)
    record: LaunchRecord | None = None


def _free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _check_picklable(fn: Callable[..., Any], args: Sequence[Any],
                     kwargs: Mapping[str, Any]) -> bytes:
    name = getattr(fn, "__qualname__", repr(fn))
    module = getattr(fn, "__module__", None)
    main = sys.modules.get("__main__")
    if module == "__main__" and not os.path.isfile(str(getattr(main, "__file__", ""))):
        raise RankFunctionNotPicklable(
            f"run_ranks: {name} is defined in __main__ of an interactive session (python -c, "
            "stdin, a notebook), which rank processes cannot import. Put it in a module file.")
    if "<lambda>" in name or "<locals>" in name:
        raise RankFunctionNotPicklable(
            f"run_ranks: {module}.{name} cannot run in a rank process: each rank imports the "
            "function by its module and name, so it must be defined at module level (not a "
            "lambda, a nested function or a method of a local class). Move it to the top level "
            "of the test module or of a helper module."
        )
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise RankFunctionNotPicklable(
            f"run_ranks: the function {module}.{name} cannot be pickled for the rank processes "
            f"({type(exc).__name__}: {exc}). Define it at module level of an importable module."
        ) from None
    for label, value in [(f"args[{i}]", v) for i, v in enumerate(args)] + [
            (f"kwargs[{k!r}]", v) for k, v in kwargs.items()]:
        try:
            pickle.dumps(value)
        except Exception as exc:
            raise RankFunctionNotPicklable(
                f"run_ranks: {label} ({type(value).__name__}) cannot be pickled for the rank "
                f"processes ({type(exc).__name__}: {exc}). Pass plain data (numbers, strings, "
                "paths, CPU tensors, state_dict()s) and build models, process groups and "
                "loaders inside the rank function."
            ) from None
    return pickle.dumps((fn, tuple(args), dict(kwargs)))


def resolve_backend(backend: str | None, world_size: int, init: bool = True) -> str:
    """``nccl`` when every rank can have its own GPU, else ``gloo`` (CPU); checks a given one."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise DistributedSetupError(f"run_ranks needs torch: {exc}") from None
    if not dist.is_available():
        raise DistributedSetupError("this torch build has no torch.distributed support")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:
        return "nccl" if gpus >= world_size and dist.is_nccl_available() else "gloo"
    if not init:
        return backend
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise DistributedSetupError(
                "backend 'nccl' is not available in this torch build (CPU-only or no NCCL); "
                "use backend='gloo' or backend=None (auto)")
        if gpus < world_size:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            raise DistributedSetupError(
                f"backend 'nccl' runs one rank per GPU: world_size={world_size} needs "
                f"{world_size} GPUs, torch sees {gpus}{hint}. Mark the test "
                f"@pytest.mark.requires_cuda(min_devices={world_size}) to skip it there.")
    elif backend == "gloo" and not dist.is_gloo_available():
        raise DistributedSetupError("backend 'gloo' is not available in this torch build")
    return backend


def _nccl_env(environ: Mapping[str, str]) -> dict[str, str]:
    from pytest_gputrain.collect.environment_variables import matching_variables

    return matching_variables(environ, NCCL_PREFIXES)


# ------------------------------------------------------------------------------------------
# Starting, watching and ending the ranks


@dataclass(frozen=True)
class _Settings:
    world_size: int
    backend: str
    timeout: float | None
    collective_timeout: float
    init: bool
    probe: bool
    env: dict[str, str]


@dataclass
class _RankProcess:
    """What the launcher knows of one rank process while it runs."""

    rank: int
    process: subprocess.Popen[bytes]  # elastic's, never reaped before the launch ends
    dir: Path  # the rank's log directory: elastic's logs and error file, our status and stacks
    exit_code: int | None = None
    exited_at: float | None = None
    result: dict[str, Any] | None = None
    result_seen_at: float | None = None
    error: dict[str, Any] | None = None  # our part of the rank's error file
    killed: bool = False
    stuck_at_exit: bool = False

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
            "from pytest_gputrain.distributed._rank import main; main()")


def _start(settings: _Settings, payload: bytes, run_dir: Path, port: int) -> Any:
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
    """SIGKILL the rank and everything in its process group (only while it is unreaped)."""
    if state.process.returncode is not None:
        return
    with contextlib.suppress(OSError):  # ProcessLookupError, PermissionError
        if hasattr(os, "killpg"):
            os.killpg(state.pid, getattr(signal, "SIGKILL", signal.SIGTERM))
        else:
            state.process.kill()


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
            if now - first_failure > FAILURE_GRACE_S:
                return False
        if deadline is not None and now > deadline:
            return True
        time.sleep(POLL_S)


def _stop(context: Any, ranks: list[_RankProcess]) -> None:
    """Dump the stacks of ranks still running, kill every rank's group, let elastic reap."""
    running = [s for s in ranks if not s.finished]
    if running and hasattr(signal, "SIGUSR1"):
        for state in running:
            with contextlib.suppress(OSError):
                os.kill(state.pid, signal.SIGUSR1)
        time.sleep(STACK_WAIT_S)
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


def _run_once(settings: _Settings, payload: bytes) -> tuple[LaunchRecord, list[Any]]:
    run_dir = Path(tempfile.mkdtemp(prefix="gputrain-ranks-"))
    ranks: list[_RankProcess] = []
    timed_out = False
    started = time.monotonic()
    try:
        context = _start(settings, payload, run_dir, _free_port())
        try:
            for rank in range(settings.world_size):
                ranks.append(_RankProcess(rank, context.subprocess_handlers[rank].proc,
                                          Path(context.error_files[rank]).parent))
            deadline = None if settings.timeout is None else started + settings.timeout
            timed_out = _watch(ranks, deadline)
        finally:
            _stop(context, ranks)
        ended = time.monotonic()
        record = _record(settings, ranks, started, ended, timed_out,
                         {s.rank: (Path(context.stderrs[s.rank]), Path(context.stdouts[s.rank]))
                          for s in ranks})
    finally:
        if not os.environ.get("GPUTRAIN_DIST_KEEP"):
            shutil.rmtree(run_dir, ignore_errors=True)
    return record, [(s.result or {}).get("value") for s in ranks]


# ------------------------------------------------------------------------------------------
# The record, and what it raises


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


def _record(settings: _Settings, ranks: list[_RankProcess], started: float, ended: float,
            timed_out: bool, logs: Mapping[int, tuple[Path, Path]]) -> LaunchRecord:
    statuses = {s.rank: _read_status(s.dir / STATUS_FILE) for s in ranks}
    outputs = {s.rank: "".join(_read_text(path) for path in logs[s.rank]) for s in ranks}
    records = []
    failed_at: dict[int, float] = {}
    for state in ranks:
        status, output = statuses[state.rank], outputs[state.rank]
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
            text = " ".join([error.message if error else "", error.traceback if error else "",
                             output])
            kind = analysis.classify_failure(text, error.phase if error else None,
                                             state.exit_code, has_exception=error is not None)
            failed_at[state.rank] = float(data.get("failed_at") or state.exited_at or ended)
        main = status.get("main_thread")
        frames = analysis.main_thread_frames(_read_text(state.dir / STACK_FILE),
                                             int(main) if main is not None else None)
        probe = (state.result or {}).get("probe") if state.result else data.get("probe")
        records.append(RankRecord(
            rank=state.rank, pid=state.pid, outcome=outcome,
            exit_code=state.exit_code, error=error, failure_kind=kind,
            activity=describe_activity(status, ended), status=status,
            stack=analysis.user_frames(frames), output=output,
            probe=probe if isinstance(probe, dict) else None))
    watchdog = None
    for rank in sorted(outputs):
        watchdog = analysis.parse_watchdog(outputs[rank])
        if watchdog:
            if watchdog.get("rank") is None:
                watchdog["rank"] = rank
            break
    failed_rank = None
    if failed_at:
        # A rank that failed on its own comes before ranks that lost their peer.
        failed_rank = min(failed_at, key=lambda r: (
            records[r].failure_kind == "peer_failure", failed_at[r], r))
    return LaunchRecord(
        world_size=settings.world_size, backend=settings.backend, timeout=settings.timeout,
        collective_timeout=settings.collective_timeout, probe=settings.probe,
        duration=ended - started, nccl_env=_nccl_env({**os.environ, **settings.env}),
        ranks=records, timed_out=timed_out, failed_rank=failed_rank,
        stuck_ranks=[s.rank for s in ranks if s.killed], watchdog=watchdog,
        desync=analysis.collective_desync(statuses, ended, watchdog),
        step_desync=analysis.step_desync(statuses))


def _port_taken(record: LaunchRecord) -> bool:
    for rank in record.ranks:
        error = rank.error
        text = f"{error.message if error else ''} {rank.output}".lower()
        if (error is not None and error.phase == "init" and
                ("address already in use" in text or f"errno {errno.EADDRINUSE}" in text)):
            return True
    return False


def _echo(record: LaunchRecord) -> None:
    for rank in record.ranks:
        lines = rank.output.rstrip().splitlines()
        if not lines:
            continue
        if len(lines) > LOG_ECHO_LINES:
            skipped = len(lines) - LOG_ECHO_LINES
            lines = [f"... {skipped} earlier line(s) left out ...", *lines[-LOG_ECHO_LINES:]]
        sys.stdout.write("".join(f"[rank {rank.rank}] {line}\n" for line in lines))
    sys.stdout.flush()


def _raise_for(record: LaunchRecord) -> None:
    """RankFailure, RankTimeout, pytest's skip, or a warning about a rank stuck at exit."""
    common: dict[str, Any] = {"world_size": record.world_size, "backend": record.backend,
                              "nccl_env": dict(record.nccl_env), "pids": record.pids,
                              "record": record}
    if record.failed_rank is not None:
        failed = record.ranks[record.failed_rank]
        error = failed.error
        raise RankFailure(failure_text(record), rank=failed.rank,
                          kind=failed.failure_kind or "crash",
                          exc_type=error.type if error else None,
                          exc_message=error.message if error else None,
                          traceback_text=error.traceback if error else None,
                          exit_code=failed.exit_code, log_tail=analysis.tail(failed.output),
                          **common)
    if record.stuck_ranks:
        first = record.stuck_ranks[0]
        raise RankTimeout(hang_text(record), stuck_ranks=list(record.stuck_ranks),
                          timeout=record.timeout or 0.0, rank=first, kind="hang",
                          log_tail=analysis.tail(record.ranks[first].output), **common)
    skipped = [r for r in record.ranks if r.outcome == "skipped"]
    if skipped:
        import pytest

        error = skipped[0].error
        pytest.skip(f"rank {skipped[0].rank}: {error.message if error else 'skipped'}")
    for rank in record.ranks:
        if rank.outcome == "stuck_at_exit":
            warnings.warn(f"rank {rank.rank} returned its result but did not exit within "
                          f"{EXIT_GRACE_S:g} s (hung in interpreter or NCCL teardown); "
                          "it was killed", RuntimeWarning, stacklevel=4)


# ------------------------------------------------------------------------------------------
# The launch


def launch(
    fn: Callable[..., Any],
    world_size: int = 2,
    backend: str | None = None,
    timeout: float | None = 120.0,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    collective_timeout: float | None = None,
    init_process_group: bool = True,
    probe: bool | None = None,
    echo_output: bool = True,
    test: str | None = None,
) -> Launch:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; see :func:`run_ranks`."""
    if in_rank():
        raise DistributedSetupError(
            "run_ranks was called inside a rank process. If the call is at module level of a "
            "script, guard it with `if __name__ == '__main__':`; nested launches are not "
            "supported.")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise DistributedSetupError(f"world_size must be a positive integer, got {world_size!r}")
    if timeout is not None and timeout <= 0:
        raise DistributedSetupError(f"timeout must be positive seconds or None, got {timeout!r}")
    kwargs = dict(kwargs or {})
    payload = _check_picklable(fn, args, kwargs)
    backend = resolve_backend(backend, world_size, init_process_group)
    if collective_timeout is None:
        collective_timeout = max(5.0, timeout / 2) if timeout is not None else 1800.0
    recorder = _recorder.get()
    if probe is None:
        probe = bool(recorder is not None and recorder.probe)
    settings = _Settings(world_size, backend, timeout, float(collective_timeout),
                         init_process_group, probe, {k: str(v) for k, v in (env or {}).items()})

    for attempt in range(PORT_ATTEMPTS):
        record, results = _run_once(settings, payload)
        if not _port_taken(record):
            break
        if attempt == PORT_ATTEMPTS - 1:
            raise DistributedSetupError(
                f"could not bind a free port on {HOST} in {PORT_ATTEMPTS} attempts")
    if echo_output:
        _echo(record)
    error: RankFailure | None = None
    try:
        _raise_for(record)
    except RankFailure as exc:
        error = exc
    facts = None
    if recorder is not None or probe:
        from pytest_gputrain.distributed.report import build_facts

        facts = build_facts(record, test, error)
        if recorder is not None:
            recorder.record(facts)
    if error is not None:
        error.facts = facts
        raise error
    return Launch(world_size=world_size, backend=backend, results=results,
                  duration=record.duration, pids=record.pids, facts=facts,
                  outputs=[r.output for r in record.ranks], record=record)


def run_ranks(
    fn: Callable[..., Any],
    world_size: int = 2,
    backend: str | None = None,
    timeout: float | None = 120.0,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    collective_timeout: float | None = None,
    init_process_group: bool = True,
    probe: bool | None = None,
    echo_output: bool = True,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks and return their results in rank order.

    ``fn`` must be importable by name (module level). ``backend`` None picks ``nccl`` when torch
    sees a GPU per rank, else ``gloo``. ``timeout`` (seconds, None for none) bounds the whole
    launch, start-up included; ``collective_timeout`` (default half of it) is given to
    ``init_process_group`` so that a stuck collective fails with the backend's own error first.
    ``env`` adds variables to the ranks' environment. ``init_process_group=False`` leaves the
    group to ``fn`` (``init_method="env://"`` works: MASTER_ADDR/PORT, RANK, WORLD_SIZE are set).
    ``probe`` records per-rank steps and batches (on by default under ``--gpu-diagnose``).
    Each rank's output is echoed, prefixed ``[rank N]``, when the launch ends.

    Raises :class:`RankFailure` when a rank fails, :class:`RankTimeout` when ranks hang,
    :class:`RankFunctionNotPicklable` / :class:`DistributedSetupError` before starting any rank.
    """
    return launch(fn, world_size, backend, timeout, args, kwargs, env,
                  collective_timeout=collective_timeout, init_process_group=init_process_group,
                  probe=probe, echo_output=echo_output).results
