"""Run a function on N ranks, one process each, and never hang the test run.

    from pytest_gputrain.distributed import run_ranks

    def train(steps):                      # module level: each rank imports it by name
        model = DDP(Net().to(rank_device()))
        ...
        return loss.item()

    losses = run_ranks(train, world_size=2, args=(20,))   # [loss of rank 0, loss of rank 1]

Each rank is a fresh Python process (``sys.executable``, the parent's ``sys.path`` and working
directory, multiprocessing's spawn preparation) in its own process group, with ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1`` and a free ``MASTER_PORT`` set. The
launcher calls ``init_process_group`` (``tcp://127.0.0.1:PORT``, ``timeout=collective_timeout``)
and ``torch.cuda.set_device(LOCAL_RANK)`` when the rank has a GPU, runs the function, and
destroys the group. Results come back through files, pickled, tensors moved to the CPU.

A rank that raises or crashes fails the launch with :class:`RankFailure` (its rank, traceback,
output tail, backend and NCCL variables); ranks still running after ``timeout`` seconds get their
stacks dumped and are killed with everything they started (:class:`RankTimeout`). Ranks never
outlive the launcher (parent-death signal, heartbeat check), and the launcher kills every rank's
process group before it returns or raises.

This module imports no torch at import time.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
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

HOST = "127.0.0.1"
POLL_S = 0.05
FAILURE_GRACE_S = 2.0  # after a rank fails, how long the others may take to finish or fail
EXIT_GRACE_S = 15.0  # after a rank returned its result, how long it may take to exit
STACK_WAIT_S = 1.0  # after SIGUSR1, how long to wait for faulthandler's stack dump
PORT_ATTEMPTS = 3
TRACK_S = 0.5  # how often the processes each rank started are looked up
LOG_ECHO_LINES = 200
RANK_ENV = "GPUTRAIN_DIST_RANK"
NCCL_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_DEBUG")


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
# The launch


@dataclass
class _Rank:
    rank: int
    process: subprocess.Popen[bytes]
    run_dir: Path
    started: float
    exit_code: int | None = None
    exited_at: float | None = None
    result: dict[str, Any] | None = None
    result_seen_at: float | None = None
    killed: bool = False
    stuck_at_exit: bool = False
    descendants: dict[int, Any] = field(default_factory=dict)
    tracked_at: float = 0.0

    def path(self, suffix: str) -> Path:
        return self.run_dir / f"rank{self.rank}.{suffix}"

    @property
    def failed(self) -> bool:
        if self.result is not None:
            return not self.result.get("ok", False) and self.result.get("kind") != "skipped"
        return self.exit_code is not None and self.exit_code != 0

    @property
    def finished(self) -> bool:
        return self.exit_code is not None

    def status(self) -> dict[str, Any]:
        try:
            import json

            data: dict[str, Any] = json.loads(self.path("status.json").read_text("utf-8"))
            return data
        except (OSError, ValueError):
            return {}

    def log(self) -> str:
        try:
            return self.path("log").read_bytes().decode("utf-8", "replace")
        except OSError:
            return ""

    def stack(self) -> str:
        try:
            return self.path("stack.txt").read_text("utf-8", "replace")
        except OSError:
            return ""


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


def _boot_command(run_dir: Path, rank: int) -> list[str]:
    root = str(Path(__file__).resolve().parent.parent.parent)
    boot = (f"import sys; sys.path.insert(0, {root!r}); "
            "from pytest_gputrain.distributed._rank import main; main()")
    return [sys.executable, "-c", boot, str(run_dir), str(rank), str(os.getpid())]


def _track_descendants(state: _Rank) -> None:
    """Remember the processes a live rank started (psutil objects survive PID reuse checks)."""
    if state.process.returncode is not None:
        return  # reaped: its PID may belong to someone else by now
    try:
        import psutil

        for child in psutil.Process(state.process.pid).children(recursive=True):
            state.descendants.setdefault(child.pid, child)
    except Exception:
        pass


def _has_exited(state: _Rank) -> bool:
    """Whether the rank ended, without reaping it: an unreaped rank's PID and group stay ours."""
    if state.process.returncode is not None:
        return True
    if hasattr(os, "waitid") and hasattr(os, "WNOWAIT"):
        try:
            info = os.waitid(os.P_PID, state.process.pid,
                             os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return state.process.poll() is not None
        return info is not None
    return state.process.poll() is not None


def _kill_group(state: _Rank) -> None:
    """SIGKILL the rank, its process group and every descendant it started.

    The rank's PID and group are signalled only while the rank is unreaped (so they are still
    ours); descendants seen earlier are signalled only if psutil confirms they are the same
    processes (PID and start time).
    """
    _track_descendants(state)
    kill = getattr(signal, "SIGKILL", signal.SIGTERM)
    if state.process.returncode is None:  # unreaped (running or a zombie): the group is ours
        if hasattr(os, "killpg"):
            with contextlib.suppress(OSError):  # ProcessLookupError, PermissionError
                os.killpg(state.process.pid, kill)
        with contextlib.suppress(OSError):
            state.process.kill()
    for child in state.descendants.values():
        with contextlib.suppress(Exception):
            if child.is_running():
                child.send_signal(kill)
    # An unkillable (D-state) process is left to the OS rather than blocking the run.
    with contextlib.suppress(subprocess.TimeoutExpired):
        state.process.wait(timeout=10)


def _dump_stacks(states: Sequence[_Rank]) -> None:
    if not hasattr(signal, "SIGUSR1") or not states:
        return
    for state in states:
        with contextlib.suppress(OSError):
            os.kill(state.process.pid, signal.SIGUSR1)
    time.sleep(STACK_WAIT_S)


def _read_result(state: _Rank) -> None:
    path = state.path("result.pkl")
    if state.result is not None or not path.exists():
        return
    try:
        state.result = pickle.loads(path.read_bytes())
    except Exception as exc:
        state.result = {"ok": False, "kind": "error", "phase": "result",
                        "type": type(exc).__name__,
                        "message": f"the rank's result could not be unpickled in the launcher: "
                                   f"{type(exc).__name__}: {exc}",
                        "traceback": "", "probe": None, "failed_at": time.monotonic()}


def _nccl_env(environ: Mapping[str, str]) -> dict[str, str]:
    from pytest_gputrain.collect.environment_variables import matching_variables

    return matching_variables(environ, NCCL_PREFIXES)


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

    runner = _Runner(fn, world_size, backend, timeout, payload, dict(env or {}),
                     float(collective_timeout), init_process_group, probe, echo_output)
    error: RankFailure | None = None
    try:
        for attempt in range(PORT_ATTEMPTS):
            try:
                result = runner.run()
                break
            except _PortTaken:
                if attempt == PORT_ATTEMPTS - 1:
                    raise DistributedSetupError(
                        f"could not bind a free port on {HOST} in {PORT_ATTEMPTS} attempts"
                    ) from None
    except RankFailure as exc:
        error = exc
    facts = None
    if recorder is not None or probe:
        facts = runner.facts(test, error)
        if recorder is not None:
            recorder.record(facts)
    if error is not None:
        error.facts = facts
        raise error
    result.facts = facts
    return result


class _PortTaken(Exception):
    pass


class _Runner:
    def __init__(self, fn: Callable[..., Any], world_size: int, backend: str,
                 timeout: float | None, payload: bytes, env: dict[str, str],
                 collective_timeout: float, init: bool, probe: bool, echo: bool) -> None:
        self.fn = fn
        self.world_size = world_size
        self.backend = backend
        self.timeout = timeout
        self.payload = payload
        self.env = env
        self.collective_timeout = collective_timeout
        self.init = init
        self.probe = probe
        self.echo = echo
        self.states: list[_Rank] = []
        self.statuses: dict[int, dict[str, Any]] = {}
        self.started = 0.0
        self.ended = 0.0
        self.timed_out = False
        self.child_env: dict[str, str] = {}

    # -- running -----------------------------------------------------------------------------

    def run(self) -> Launch:
        import multiprocessing.spawn

        run_dir = Path(tempfile.mkdtemp(prefix="gputrain-ranks-"))
        port = _free_port()
        preparation = multiprocessing.spawn.get_preparation_data("gputrain-rank")
        # An AuthenticationString refuses pickling; the rank needs no key to talk to us.
        preparation.pop("authkey", None)
        main_path = preparation.get("init_main_from_path")
        if main_path and not os.path.isfile(main_path):
            preparation.pop("init_main_from_path")  # python -c, stdin, a notebook
        spec = {
            "payload": self.payload,
            "preparation": preparation,
            "backend": self.backend, "init": self.init, "host": HOST, "port": port,
            "world_size": self.world_size, "collective_timeout": self.collective_timeout,
            "probe": self.probe,
        }
        (run_dir / "spec.pkl").write_bytes(pickle.dumps(spec))
        base_env = dict(os.environ)
        base_env.update(self.env)
        self.child_env = base_env
        self.states = []
        self.statuses = {}
        self.timed_out = False
        self.started = time.monotonic()
        try:
            for rank in range(self.world_size):
                rank_env = dict(base_env)
                rank_env.update({
                    "RANK": str(rank), "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(self.world_size),
                    "LOCAL_WORLD_SIZE": str(self.world_size), "GROUP_RANK": "0",
                    "MASTER_ADDR": HOST, "MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1",
                    RANK_ENV: str(rank),
                })
                with open(run_dir / f"rank{rank}.log", "wb") as log:
                    process = subprocess.Popen(
                        _boot_command(run_dir, rank), stdin=subprocess.DEVNULL, stdout=log,
                        stderr=subprocess.STDOUT, env=rank_env, start_new_session=True,
                        close_fds=True)
                self.states.append(_Rank(rank, process, run_dir, time.monotonic()))
            self._monitor()
        finally:
            stuck = [s for s in self.states if not s.finished]
            if stuck:
                _dump_stacks(stuck)
            for state in self.states:
                self.statuses[state.rank] = state.status()
                if not state.finished:
                    state.killed = True
                _kill_group(state)
                state.exit_code = state.process.returncode
                _read_result(state)
            self.ended = time.monotonic()
            self.logs = {s.rank: s.log() for s in self.states}
            self.stacks = {s.rank: s.stack() for s in self.states}
            if self.echo:
                self._echo()
            if not os.environ.get("GPUTRAIN_DIST_KEEP"):
                shutil.rmtree(run_dir, ignore_errors=True)
        if self._port_taken():
            raise _PortTaken()
        return self._outcome()

    def _monitor(self) -> None:
        deadline = None if self.timeout is None else self.started + self.timeout
        first_failure: float | None = None
        while True:
            now = time.monotonic()
            for state in self.states:
                if state.finished:
                    continue
                if now - state.tracked_at > TRACK_S:
                    _track_descendants(state)
                    state.tracked_at = now
                if _has_exited(state):
                    # Whatever the rank left in its process group goes with it, before the
                    # rank is reaped and its PID can be reused.
                    _kill_group(state)
                if state.process.returncode is not None:
                    state.exit_code = state.process.returncode
                    state.exited_at = now
                    _read_result(state)
                elif state.result_seen_at is None and state.path("result.pkl").exists():
                    state.result_seen_at = now
                elif state.result_seen_at is not None and now - state.result_seen_at > EXIT_GRACE_S:
                    _read_result(state)
                    if state.result is not None and state.result.get("ok"):
                        state.stuck_at_exit = True
                        _kill_group(state)
                        state.exit_code = state.process.returncode
                        state.exited_at = now
            if all(s.finished for s in self.states):
                return
            if any(s.failed for s in self.states if s.finished):
                first_failure = first_failure or now
                if now - first_failure > FAILURE_GRACE_S:
                    return
            if deadline is not None and now > deadline:
                self.timed_out = True
                return
            time.sleep(POLL_S)

    def _port_taken(self) -> bool:
        for state in self.states:
            result = state.result or {}
            text = f"{result.get('message', '')} {self.logs.get(state.rank, '')}".lower()
            if (result.get("phase") == "init" and
                    ("address already in use" in text or f"errno {errno.EADDRINUSE}" in text)):
                return True
        return False

    def _echo(self) -> None:
        for state in self.states:
            lines = self.logs.get(state.rank, "").rstrip().splitlines()
            if not lines:
                continue
            if len(lines) > LOG_ECHO_LINES:
                skipped = len(lines) - LOG_ECHO_LINES
                lines = [f"... {skipped} earlier line(s) left out ...", *lines[-LOG_ECHO_LINES:]]
            sys.stdout.write("".join(f"[rank {state.rank}] {line}\n" for line in lines))
        sys.stdout.flush()

    # -- outcome -----------------------------------------------------------------------------

    def _activity(self, rank: int, now: float) -> str:
        status = self.statuses.get(rank, {})
        phase = status.get("phase") or "starting"
        step = status.get("step") or 0
        total = sum((status.get("collectives") or {}).values())
        steps = f"{step} optimizer step(s), {total} collective call(s)"
        if status.get("op"):
            since = status.get("op_since")
            held = f" for {now - float(since):.1f} s" if since is not None else ""
            return f"in {status['op']} #{status.get('op_index')}{held} ({steps})"
        last = f", last {status['last_op']}" if status.get("last_op") else ""
        return {
            "starting": "starting (importing the launcher)",
            "import": "importing torch and the function's module",
            "init": "in init_process_group (waiting for the other ranks to join)",
            "running": f"running the function, not in a collective ({steps}{last})",
            "destroy": "in destroy_process_group",
            "done": "finished",
            "failed": "failed",
        }.get(phase, phase)

    def _frames(self, rank: int) -> list[str]:
        status = self.statuses.get(rank, {})
        main = status.get("main_thread")
        frames = analysis.main_thread_frames(self.stacks.get(rank, ""),
                                             int(main) if main is not None else None)
        return analysis.user_frames(frames)

    def _failure_kind(self, state: _Rank) -> str:
        result = state.result or {}
        text = " ".join([str(result.get("message", "")), str(result.get("traceback", "")),
                         self.logs.get(state.rank, "")])
        return analysis.classify_failure(text, result.get("phase"), state.exit_code,
                                         has_exception=bool(result))

    def _first_failed(self) -> _Rank | None:
        failed = [s for s in self.states if s.failed and not s.killed]
        if not failed:
            return None

        def when(state: _Rank) -> float:
            result = state.result or {}
            return float(result.get("failed_at") or state.exited_at or self.ended)

        # A rank that failed on its own comes before ranks that lost their peer.
        return min(failed, key=lambda s: (self._failure_kind(s) == "peer_failure", when(s),
                                          s.rank))

    def _watchdog(self) -> dict[str, Any] | None:
        for rank in sorted(self.logs):
            found = analysis.parse_watchdog(self.logs[rank])
            if found:
                if found.get("rank") is None:
                    found["rank"] = rank
                return found
        return None

    def _others_lines(self, exclude: int) -> list[str]:
        lines = []
        for state in self.states:
            if state.rank == exclude:
                continue
            if state.killed:
                what = f"was still running, killed: {self._activity(state.rank, self.ended)}"
                frames = self._frames(state.rank)
                if frames:
                    what += "; stack (innermost first): " + " <- ".join(frames[:3])
            elif state.failed:
                result = state.result or {}
                what = (f"also failed: {result.get('type', 'crash')}: "
                        f"{_one_line(result.get('message', ''))}" if result else
                        f"also failed ({analysis.describe_exit(state.exit_code)})")
            elif state.stuck_at_exit:
                what = "returned, then hung on exit (killed)"
            else:
                what = "finished"
            lines.append(f"  rank {state.rank}: {what}")
        return lines

    def _evidence(self) -> list[str]:
        watchdog = self._watchdog()
        lines = []
        desync = analysis.collective_desync(self.statuses, self.ended, watchdog)
        if desync:
            lines.append(f"  collectives: {desync}")
        steps = analysis.step_desync(self.statuses)
        if steps:
            lines.append(f"  {steps}")
        if watchdog:
            lines.append(f"  NCCL watchdog: {watchdog['line']}")
        return lines

    def _outcome(self) -> Launch:
        env_nccl = _nccl_env(self.child_env)
        pids = [s.process.pid for s in self.states]
        failed = self._first_failed()
        if failed is not None:
            result = failed.result or {}
            kind = self._failure_kind(failed)
            log = self.logs.get(failed.rank, "")
            head = (f"rank {failed.rank} of {self.world_size} (backend {self.backend}) failed")
            if result:
                where = {"import": " while loading the function",
                         "init": " in init_process_group",
                         "result": " returning its result",
                         "destroy": " in destroy_process_group"}.get(result.get("phase", ""), "")
                head += f"{where}: {result.get('type')}: {_one_line(result.get('message', ''))}"
            else:
                head += f" without a Python exception ({analysis.describe_exit(failed.exit_code)})"
            parts = [head]
            if result.get("traceback"):
                parts += ["", f"rank {failed.rank} traceback:", result["traceback"].rstrip()]
            elif not result:
                frames = self._frames(failed.rank)
                if frames:
                    parts += ["", f"rank {failed.rank} stack when it died (innermost first):",
                              *(f"  {frame}" for frame in frames)]
            if (kind != "exception" or not result) and log.strip():
                parts += ["", f"rank {failed.rank} output (last lines):", analysis.tail(log)]
            others = self._others_lines(failed.rank)
            evidence = self._evidence()
            if others or evidence:
                parts += ["", "other ranks:" if others else "evidence:", *others, *evidence]
            if env_nccl:
                parts += ["", "NCCL environment: " + " ".join(f"{k}={v}"
                                                               for k, v in env_nccl.items())]
            raise RankFailure("\n".join(parts), rank=failed.rank, kind=kind,
                              exc_type=result.get("type"), exc_message=result.get("message"),
                              traceback_text=result.get("traceback"),
                              exit_code=failed.exit_code, log_tail=analysis.tail(log),
                              world_size=self.world_size, backend=self.backend,
                              nccl_env=env_nccl, pids=pids)
        stuck = [s.rank for s in self.states if s.killed]
        if stuck:
            why = (f"still running after the {self.timeout:g} s timeout"
                   if self.timed_out else "still running after another rank ended")
            parts = [f"{len(stuck)} of {self.world_size} rank(s) {why} (backend "
                     f"{self.backend}); killed with their process groups. What each was doing:"]
            for state in self.states:
                activity = ("killed: " if state.killed else "") + self._activity(
                    state.rank, self.ended)
                parts.append(f"  rank {state.rank}: {activity}")
                frames = self._frames(state.rank) if state.killed else []
                parts += [f"      {frame}" for frame in frames]
            parts += self._evidence()
            parts.append("A rank that waits in a collective its peers never enter hangs; set "
                         "collective_timeout below timeout to get the backend's own error.")
            raise RankTimeout("\n".join(parts), stuck_ranks=stuck, timeout=self.timeout or 0.0,
                              rank=stuck[0], kind="hang",
                              log_tail=analysis.tail(self.logs.get(stuck[0], "")),
                              world_size=self.world_size, backend=self.backend,
                              nccl_env=env_nccl, pids=pids)
        skipped = [s for s in self.states if (s.result or {}).get("kind") == "skipped"]
        if skipped:
            import pytest

            pytest.skip(f"rank {skipped[0].rank}: {skipped[0].result.get('message')}"
                        if skipped[0].result else "skipped in a rank")
        for state in self.states:
            if state.stuck_at_exit:
                warnings.warn(f"rank {state.rank} returned its result but did not exit within "
                              f"{EXIT_GRACE_S:g} s (hung in interpreter or NCCL teardown); "
                              "it was killed", RuntimeWarning, stacklevel=4)
        results = [(s.result or {}).get("value") for s in self.states]
        return Launch(world_size=self.world_size, backend=self.backend, results=results,
                      duration=self.ended - self.started, pids=pids,
                      outputs=[self.logs.get(s.rank, "") for s in self.states])

    # -- facts -------------------------------------------------------------------------------

    def facts(self, test: str | None, error: RankFailure | None) -> Any:
        from pytest_gputrain.distributed.report import build_facts

        return build_facts(self, test, error)


def _one_line(text: object, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


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
