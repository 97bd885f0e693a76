"""The program each rank process runs (``python -c ... main()``), started by ``launcher``.

Order matters here:

1. never outlive the launcher: parent-death signal (Linux) and a heartbeat thread that exits when
   the parent is gone;
2. stack dumps: faulthandler writes every thread's stack on SIGUSR1 (the launcher asks before it
   kills a hung rank) and on fatal signals (SIGSEGV, SIGABRT from the NCCL watchdog);
3. the parent's sys.path, working directory and ``__main__`` (multiprocessing's own spawn
   preparation), then the function, unpickled here so that an import error is reported as such;
4. instrumentation, ``init_process_group``, the function, ``destroy_process_group``;
5. the result file, written atomically; on failure the rank exits at once (``os._exit``) rather
   than risk hanging in NCCL teardown.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import pickle
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

FAILED_EXIT = 3


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass  # the heartbeat thread still checks the parent


class _CpuPickler(pickle.Pickler):
    """Results come back on the CPU: the launcher's process should not need a GPU context."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
            return obj.detach().cpu().__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        return NotImplemented


def _dumps(value: Any) -> bytes:
    import io

    buffer = io.BytesIO()
    _CpuPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def _write_result(run_dir: Path, rank: int, data: dict[str, Any]) -> None:
    path = run_dir / f"rank{rank}.result.pkl"
    tmp = path.with_suffix(".tmp")
    try:
        payload = _dumps(data)
    except Exception as exc:
        if not data.get("ok"):
            raise
        data = {
            "ok": False, "phase": "result", "type": type(exc).__name__,
            "message": (f"the function's return value could not be pickled to send it back "
                        f"to the launcher: {type(exc).__name__}: {exc}. Return plain data "
                        "(numbers, lists, dicts, CPU tensors, state_dict()s), not modules, "
                        "open files, locks or process groups."),
            "traceback": traceback.format_exc(), "probe": data.get("probe"),
            "failed_at": time.monotonic(),
        }
        payload = pickle.dumps(data)
    tmp.write_bytes(payload)
    os.replace(tmp, path)


_OWN_DIR = os.path.dirname(os.path.abspath(__file__))


def _format_exception(exc: BaseException) -> str:
    """The traceback without the launcher's own frames (bootstrap, collective wrappers)."""
    summary = traceback.TracebackException.from_exception(exc)
    kept = [frame for frame in summary.stack
            if os.path.dirname(os.path.abspath(frame.filename)) != _OWN_DIR]
    if kept:
        summary.stack = traceback.StackSummary.from_list(kept)
    return "".join(summary.format())


def _error_data(exc: BaseException, phase: str, probe: Any) -> dict[str, Any]:
    kind = "error"
    cls = type(exc)
    outcomes = sys.modules.get("_pytest.outcomes")
    skipped = getattr(outcomes, "Skipped", None)
    if skipped is not None and isinstance(exc, skipped):  # pytest.skip() in the rank
        kind = "skipped"
    text = _format_exception(exc)
    try:
        original = pickle.dumps(exc)
    except Exception:
        original = None
    return {
        "ok": False, "kind": kind, "phase": phase, "type": cls.__name__,
        "qualified_type": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(exc), "traceback": text, "exception": original, "probe": probe,
        "failed_at": time.monotonic(),
    }


def main() -> None:
    run_dir, rank, parent_pid = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    _set_parent_death_signal()
    if os.getppid() != parent_pid:
        os._exit(70)
    spec: dict[str, Any] = pickle.loads((run_dir / "spec.pkl").read_bytes())

    from pytest_gputrain.distributed.instrument import RankRecorder

    recorder = RankRecorder(rank, run_dir / f"rank{rank}.status.json", bool(spec["probe"]))
    recorder.flush()
    recorder.start_heartbeat(parent_pid)
    stack_file = open(run_dir / f"rank{rank}.stack.txt", "a", encoding="utf-8")  # noqa: SIM115
    faulthandler.enable(file=stack_file, all_threads=True)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)

    phase = "import"
    recorder.set_phase(phase)
    probe: dict[str, Any] | None = None
    try:
        torch: Any = importlib.import_module("torch")
        dist: Any = importlib.import_module("torch.distributed")
        # Before the function's module is imported: `from torch.distributed import all_reduce`
        # there must get the counting wrapper.
        recorder.install()
        import multiprocessing.spawn

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
            phase = "init"
            recorder.set_phase(phase)
            import datetime

            options: dict[str, Any] = {}
            if backend == "nccl":
                options["device_id"] = torch.device("cuda", local_rank)
            dist.init_process_group(
                backend=backend, init_method=f"tcp://{spec['host']}:{spec['port']}",
                world_size=spec["world_size"], rank=rank,
                timeout=datetime.timedelta(seconds=spec["collective_timeout"]), **options,
            )
        phase = "running"
        recorder.set_phase(phase)
        value = fn(*args, **kwargs)
        seen_backend = str(dist.get_backend()) if dist.is_initialized() else None
        cuda_used = bool(device.startswith("cuda") and torch.cuda.is_initialized()
                         and torch.cuda.max_memory_allocated() > 0)
        device_name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
        probe = recorder.probe_data(device, device_name, seen_backend, cuda_used)
        phase = "destroy"
        recorder.set_phase(phase)
        if dist.is_initialized():
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
            dist.destroy_process_group()
        _write_result(run_dir, rank, {"ok": True, "value": value, "probe": probe,
                                      "finished_at": time.monotonic()})
        recorder.set_phase("done")
    except BaseException as exc:
        if probe is None:
            try:
                probe = recorder.probe_data(None, None, None, False)
            except Exception:
                probe = None
        recorder.set_phase("failed")
        try:
            _write_result(run_dir, rank, _error_data(exc, phase, probe))
        except BaseException:
            traceback.print_exc()  # the launcher reads the output's tail instead
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(FAILED_EXIT)
    recorder.stop()
    sys.stdout.flush()
    sys.stderr.flush()
