"""The program each rank process runs (``python -c ... main()``), started by the launcher.

torch elastic's ``start_processes`` starts it with the rank's environment, its stdout and stderr
redirected to files in the rank's log directory, and ``TORCHELASTIC_ERROR_FILE`` set. Here, in
this order:

1. never outlive the launcher: parent-death signal (Linux) and a heartbeat thread that exits when
   the parent is gone (elastic's subprocesses have neither);
2. one log in the order a terminal shows it: stderr joins stdout (NCCL writes to stdout, c10d and
   Python to stderr); stdin is /dev/null;
3. elastic's ``record`` runs the rank with :class:`RankErrorHandler`: faulthandler writes every
   thread's stack to the rank's stack file on SIGUSR1 (the launcher asks before it kills a hung
   rank) and on fatal signals; an exception goes to the error file with the traceback less the
   launcher's frames, the phase it happened in and the probe data;
4. the parent's sys.path, working directory and ``__main__`` (multiprocessing's spawn
   preparation), then the function, unpickled here so that an import error is reported as such;
5. instrumentation, ``init_process_group``, the function, ``destroy_process_group``, and the
   result file (elastic returns no values from a process it started as a command); on failure
   the rank exits at once (``os._exit``) rather than risk hanging in NCCL teardown.
"""

from __future__ import annotations

import faulthandler
import json
import os
import pickle
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

from pytest_gputrain.distributed.instrument import RankRecorder

FAILED_EXIT = 3
ORPHANED_EXIT = 70
ERROR_KEY = "gputrain"  # our part of elastic's error file
STATUS_FILE = "status.json"
STACK_FILE = "stack.txt"
RESULT_FILE = "result.pkl"
# Frames of the launch itself, left out of a rank's traceback: ours and elastic's record().
_LAUNCH_DIRS = (os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.abspath(sys.modules[record.__module__].__file__ or "")))


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


def _format_exception(exc: BaseException) -> str:
    """The traceback without the launch's own frames (bootstrap, record(), collective
    wrappers)."""
    summary = traceback.TracebackException.from_exception(exc)
    kept = [frame for frame in summary.stack
            if os.path.dirname(os.path.abspath(frame.filename)) not in _LAUNCH_DIRS]
    if kept:
        summary.stack = traceback.StackSummary.from_list(kept)
    return "".join(summary.format())


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
        outcomes = sys.modules.get("_pytest.outcomes")
        skipped = getattr(outcomes, "Skipped", None)
        text = _format_exception(e)
        try:
            probe: dict[str, Any] | None = self.recorder.probe_data(None, None, None, False)
        except Exception:
            probe = None
        data = {
            # Elastic's format, so that its ProcessFailure (and torchrun) read the file.
            "message": {"message": f"{type(e).__name__}: {e}",
                        "extraInfo": {"py_callstack": text,
                                      "timestamp": str(int(time.time()))}},
            ERROR_KEY: {
                "type": type(e).__name__, "message": str(e), "traceback": text,
                "phase": self.recorder.status.get("phase"),
                "skipped": bool(skipped is not None and isinstance(e, skipped)),
                "failed_at": time.monotonic(), "probe": probe,
            },
        }
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if path:
            _write_atomically(Path(path), json.dumps(data).encode("utf-8"))


class _CpuPickler(pickle.Pickler):
    """Results come back on the CPU: the launcher's process should not need a GPU context."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
            return obj.detach().cpu().__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        return NotImplemented


def _dumps_result(value: Any) -> bytes:
    import io

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


def _run(spec: dict[str, Any], rank: int, recorder: RankRecorder, rank_dir: Path) -> None:
    import datetime
    import importlib
    import multiprocessing.spawn

    torch: Any = importlib.import_module("torch")
    dist: Any = importlib.import_module("torch.distributed")

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

    device = "cpu"
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    backend = spec["backend"]
    if spec["init"]:
        recorder.set_phase("init")
        options: dict[str, Any] = {}
        if backend == "nccl":
            options["device_id"] = torch.device("cuda", local_rank)
        dist.init_process_group(
            backend=backend, init_method=f"tcp://{spec['host']}:{spec['port']}",
            world_size=spec["world_size"], rank=rank,
            timeout=datetime.timedelta(seconds=spec["collective_timeout"]), **options,
        )
    recorder.set_phase("running")
    value = fn(*args, **kwargs)
    seen_backend = str(dist.get_backend()) if dist.is_initialized() else None
    cuda_used = bool(device.startswith("cuda") and torch.cuda.is_initialized()
                     and torch.cuda.max_memory_allocated() > 0)
    device_name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    probe = recorder.probe_data(device, device_name, seen_backend, cuda_used)
    recorder.set_phase("result")
    payload = _dumps_result({"value": value, "probe": probe, "finished_at": time.monotonic()})
    recorder.set_phase("destroy")
    if dist.is_initialized():
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        dist.destroy_process_group()
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
    recorder = RankRecorder(rank, rank_dir / STATUS_FILE, bool(spec["probe"]))
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
