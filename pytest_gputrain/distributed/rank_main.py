"""What a rank does: the program each launched rank process runs (``python -c ... main()``),
and the steps it shares with a rank that torchrun started (``torchrun.py``).

torch elastic's ``start_processes`` starts ``main`` with the rank's environment, its stdout and
stderr redirected to files in the rank's log directory, and ``TORCHELASTIC_ERROR_FILE`` set.
``main``, in this order:

1. never outlive the launcher: parent-death signal (Linux) and a heartbeat thread that exits when
   the parent is gone (elastic's subprocesses have neither);
2. one log in the order a terminal shows it: stderr joins stdout (NCCL writes to stdout, c10d and
   Python to stderr); stdin is /dev/null;
3. elastic's ``record`` runs the rank with :class:`RankErrorHandler`: faulthandler writes every
   thread's stack to the rank's stack file on SIGUSR1 (the launcher asks before it kills a hung
   rank) and on fatal signals; an exception goes to the error file with the traceback less the
   launch's frames, the phase it happened in and the probe data;
4. the parent's sys.path, working directory and ``__main__`` (multiprocessing's spawn
   preparation), then the function, unpickled here so that an import error is reported as such;
5. instrumentation, ``init_process_group`` (then a wait, at the launcher's store, until every rank
   has initialised, so that no rank leaves while a peer still connects to it), the function,
   ``destroy_process_group``, and the result file (elastic returns no values from a process it
   started as a command); on failure the rank exits at once (``os._exit``) rather than risk
   hanging in NCCL teardown.
"""

from __future__ import annotations

import datetime
import faulthandler
import importlib
import io
import json
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

from pytest_gputrain.distributed.instrument import RankRecorder, status_file

FAILED_EXIT = 3
ORPHANED_EXIT = 70
ERROR_KEY = "gputrain"  # our part of elastic's error file
STATUS_FILE = "status.json"
STACK_FILE = "stack.txt"
RESULT_FILE = "result.pkl"
# Frames of the launch itself, left out of a rank's traceback: ours and elastic's record().
_LAUNCH_DIRS = (os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.abspath(sys.modules[record.__module__].__file__ or "")))


# ------------------------------------------------------------------------------------------
# Steps of any rank


def format_exception(exc: BaseException) -> str:
    """The traceback without the launch's own frames (bootstrap, record(), collective
    wrappers)."""
    summary = traceback.TracebackException.from_exception(exc)
    kept = [frame for frame in summary.stack
            if os.path.dirname(os.path.abspath(frame.filename)) not in _LAUNCH_DIRS]
    if kept:
        summary.stack = traceback.StackSummary.from_list(kept)
    return "".join(summary.format())


def error_data(exc: BaseException, recorder: RankRecorder, failed_at: float) -> dict[str, Any]:
    """What the launcher needs of a rank's exception: plain data, JSON-ready."""
    outcomes = sys.modules.get("_pytest.outcomes")
    skipped = getattr(outcomes, "Skipped", None)
    try:
        probe: dict[str, Any] | None = recorder.probe_data(None, None, None, False)
    except Exception:
        probe = None
    return {"type": type(exc).__name__, "message": str(exc), "traceback": format_exception(exc),
            "phase": recorder.status.get("phase"),
            "skipped": bool(skipped is not None and isinstance(exc, skipped)),
            "failed_at": failed_at, "probe": probe}


class _CpuPickler(pickle.Pickler):
    """Results come back on the CPU: the launcher's process should not need a GPU context."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
            return obj.detach().cpu().__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        return NotImplemented


def dumps_result(value: Any) -> bytes:
    buffer = io.BytesIO()
    try:
        _CpuPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except Exception as exc:
        raise TypeError(
            f"the function's return value could not be pickled to send it back to the "
            f"launcher: {type(exc).__name__}: {exc}. Return plain data (numbers, lists, dicts, "
            "CPU tensors, state_dict()s), not modules, open files, locks or process groups."
        ) from exc
    return buffer.getvalue()


def select_device(local_rank: int) -> str:
    """``cuda:LOCAL_RANK`` (made current) when this rank has a GPU, else ``cpu``."""
    torch: Any = importlib.import_module("torch")
    if torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        torch.cuda.set_device(local_rank)
        return f"cuda:{local_rank}"
    return "cpu"


def init_group(backend: str, rank: int, world_size: int, local_rank: int,
               collective_timeout: float, **where: Any) -> None:
    """``init_process_group`` (``where``: ``init_method=`` or ``store=``); NCCL with
    ``device_id``, so that the communicator exists before the function runs."""
    torch: Any = importlib.import_module("torch")
    dist: Any = importlib.import_module("torch.distributed")
    if backend == "nccl":
        where["device_id"] = torch.device("cuda", local_rank)
    dist.init_process_group(backend=backend, world_size=world_size, rank=rank,
                            timeout=datetime.timedelta(seconds=collective_timeout), **where)


def wait_for_every_rank(store: Any, rank: int, world_size: int) -> None:
    """Return once every rank's ``init_process_group`` has returned. A rank whose function
    returns at once must not exit while a peer is still connecting to it (gloo's
    ``connectFullMesh`` then fails with "Connection closed by peer")."""
    store.set(f"gputrain/initialized/{rank}", "1")
    store.wait([f"gputrain/initialized/{peer}" for peer in range(world_size)])


def dist_store_client(host: str, port: int, timeout_s: float) -> Any:
    """A client of the launcher's TCPStore."""
    dist: Any = importlib.import_module("torch.distributed")
    return dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=timeout_s))


def run_function(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
                 recorder: RankRecorder, device: str, destroy_group: bool) -> bytes:
    """Run ``fn``, pickle its result and the probe data, and destroy the group if asked."""
    torch: Any = importlib.import_module("torch")
    dist: Any = importlib.import_module("torch.distributed")
    recorder.set_phase("running")
    value = fn(*args, **kwargs)
    seen_backend = str(dist.get_backend()) if dist.is_initialized() else None
    cuda_used = bool(device.startswith("cuda") and torch.cuda.is_initialized()
                     and torch.cuda.max_memory_allocated() > 0)
    device_name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    probe = recorder.probe_data(device, device_name, seen_backend, cuda_used)
    recorder.set_phase("result")
    payload = dumps_result({"value": value, "probe": probe, "finished_at": time.monotonic()})
    recorder.set_phase("destroy")
    if destroy_group and dist.is_initialized():
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        dist.destroy_process_group()
    return payload


# ------------------------------------------------------------------------------------------
# A launched rank process


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass  # the heartbeat thread still checks the parent


def _one_log() -> None:
    sys.stderr.flush()
    os.dup2(1, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def _write_atomically(path: Path, payload: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(payload)
    os.replace(tmp, path)


class RankErrorHandler(ErrorHandler):
    """Elastic's error handler, writing our traceback, phase and probe data into the file."""

    def __init__(self, rank_dir: Path, recorder: RankRecorder) -> None:
        self.rank_dir = rank_dir
        self.recorder = recorder
        self.recorded = False
        self.stack_file: Any = None  # open for the rank's life: faulthandler keeps only its fd

    def initialize(self) -> None:
        self.stack_file = open(self.rank_dir / STACK_FILE, "a", encoding="utf-8")  # noqa: SIM115
        faulthandler.enable(file=self.stack_file, all_threads=True)
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, file=self.stack_file, all_threads=True)

    def record_exception(self, e: BaseException) -> None:
        if self.recorded:
            return
        self.recorded = True
        ours = error_data(e, self.recorder, time.monotonic())
        data = {
            # Elastic's format, so that its ProcessFailure (and torchrun) read the file.
            "message": {"message": f"{type(e).__name__}: {e}",
                        "extraInfo": {"py_callstack": ours["traceback"],
                                      "timestamp": str(int(time.time()))}},
            ERROR_KEY: ours,
        }
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if path:
            _write_atomically(Path(path), json.dumps(data).encode("utf-8"))


def _run(spec: dict[str, Any], rank: int, recorder: RankRecorder, rank_dir: Path) -> None:
    import multiprocessing.spawn

    recorder.set_phase("import")
    # Before the function's module is imported: `from torch.distributed import all_reduce`
    # there must get the counting wrapper.
    recorder.install()
    multiprocessing.spawn.prepare(spec["preparation"])
    try:
        fn, args, kwargs = pickle.loads(spec["payload"])
    except Exception as exc:
        raise ImportError(
            f"rank {rank} could not load the function to run: {type(exc).__name__}: {exc}. "
            "Each rank imports the function's module by name: it must be importable with "
            "the same sys.path (pytest's default 'prepend' import mode does this for test "
            "modules; with --import-mode=importlib, put rank functions in a helper module)."
        ) from exc
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = select_device(local_rank)
    if spec["init"]:
        recorder.set_phase("init")
        # The launcher hosts the store (processes._launch_store): it outlives every rank.
        store = dist_store_client(spec["host"], spec["port"], spec["collective_timeout"])
        init_group(spec["backend"], rank, spec["world_size"], local_rank,
                   spec["collective_timeout"], store=store)
        wait_for_every_rank(store, rank, spec["world_size"])
    payload = run_function(fn, args, kwargs, recorder, device, destroy_group=True)
    _write_atomically(rank_dir / RESULT_FILE, payload)
    recorder.set_phase("done")


def main() -> None:
    spec_path, rank, parent_pid = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    _set_parent_death_signal()
    if os.getppid() != parent_pid:
        os._exit(ORPHANED_EXIT)
    _one_log()
    rank_dir = Path(os.environ["TORCHELASTIC_ERROR_FILE"]).parent
    spec: dict[str, Any] = pickle.loads(spec_path.read_bytes())
    recorder = RankRecorder(rank, status_file(rank_dir / STATUS_FILE), bool(spec["probe"]))
    recorder.flush()
    recorder.start_heartbeat(parent_pid)
    handler = RankErrorHandler(rank_dir, recorder)
    try:
        record(_run, error_handler=handler)(spec, rank, recorder, rank_dir)
    except BaseException as exc:  # record() re-raises what it recorded; pytest.skip() too
        handler.record_exception(exc)
        recorder.set_phase("failed")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(FAILED_EXIT)
    recorder.stop()
    sys.stdout.flush()
    sys.stderr.flush()
