"""Inside a rank process: what the rank is doing now (status) and what it did (probe data).

Always on (cheap, needed to explain hangs): collective calls through ``torch.distributed`` are
counted per operation and the one in progress is recorded; optimizer steps are counted. A
heartbeat thread hands the status, as JSON, to a sink (a small file in a launched rank, torchrun's
store under torchrun), so the launcher can say "rank 1 is in all_reduce #3 since 30 s" even after
killing the rank.

Probe (``--gpu-diagnose``): step end times, arrival times at each step's synchronisation point
(see ``analysis``), batch sizes of DDP forwards and DataLoader batches, DataParallel use. When the
rank uses CUDA, the probe synchronises the device before reading the clock at those points, so
that times are the GPU's, not the host's queueing (a small cost, paid only when diagnosing).

Imported only inside rank processes, after torch, and under torchrun for the length of a launch
(``uninstall`` puts torch back as it was).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier",
    "monitored_barrier", "reduce", "gather", "gather_object", "scatter", "scatter_object_list",
    "all_to_all", "all_to_all_single", "send", "recv",
)
HEARTBEAT_S = 0.2


def _first_tensor(value: Any, torch: Any, depth: int = 0) -> Any:
    if isinstance(value, torch.Tensor):
        return value
    if depth > 3:
        return None
    if isinstance(value, list | tuple):
        for item in value:
            found = _first_tensor(item, torch, depth + 1)
            if found is not None:
                return found
    elif isinstance(value, dict):
        for item in value.values():
            found = _first_tensor(item, torch, depth + 1)
            if found is not None:
                return found
    return None


def status_file(path: Path) -> Callable[[str], None]:
    """A status sink that replaces ``path`` atomically, so that a reader never sees half a file."""

    def write(text: str) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)

    return write


class RankRecorder:
    """Status and probe data of one rank; ``install`` patches torch in this process only."""

    def __init__(self, rank: int, status_sink: Callable[[str], None], probe: bool) -> None:
        self.rank = rank
        self.status_sink = status_sink
        self.probe = probe
        self._lock = threading.Lock()
        self._version = 0
        self._written = -1
        self.status: dict[str, Any] = {
            "rank": rank, "pid": os.getpid(), "phase": "starting",
            "phase_since": time.monotonic(), "op": None, "op_index": None, "op_since": None,
            "last_op": None, "collectives": {}, "step": 0, "last_step_at": None,
            "main_thread": threading.main_thread().ident,
        }
        self.step_ends: list[float] = []
        self.arrivals: dict[int, float] = {}
        self.arrival_kind: str | None = None
        self.forward_batches: list[int] = []
        self.loader_batches: list[int] = []
        self.ddp_used = False
        self.ddp_device: str | None = None
        self.data_parallel_devices = 0
        self.cuda_collectives = False
        self._step_optimizer: int | None = None
        self._torch: Any = None
        self._stop = threading.Event()
        self._undo: list[Callable[[], None]] = []  # what install() changed, to put back

    # -- status ------------------------------------------------------------------------------

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self.status["phase"] = phase
            self.status["phase_since"] = time.monotonic()
            self._version += 1
        if phase in ("done", "failed"):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            if self._written == self._version:
                return
            data = dict(self.status, updated=time.monotonic())
            version = self._version
        try:
            self.status_sink(json.dumps(data))
            self._written = version
        except Exception:  # a full disk, a store gone with its host: the next beat tries again
            pass

    def start_heartbeat(self, parent_pid: int | None = None,
                        on_beat: Callable[[], None] | None = None) -> None:
        """Flush the status every HEARTBEAT_S; exit when ``parent_pid`` is no longer the parent
        (the launcher died: never outlive it); call ``on_beat`` each time."""

        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_S):
                if parent_pid is not None and os.getppid() != parent_pid:
                    os._exit(70)
                self.flush()
                if on_beat is not None:
                    on_beat()

        threading.Thread(target=beat, name="gputrain-heartbeat", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self.flush()

    # -- collectives -------------------------------------------------------------------------

    def _sync_cuda(self) -> None:
        torch = self._torch
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def enter_collective(self, op: str, tensor: Any) -> None:
        is_cuda = tensor is not None and getattr(tensor, "is_cuda", False)
        if is_cuda:
            self.cuda_collectives = True
        if self.probe and not self.ddp_used:
            step = len(self.step_ends)
            if step not in self.arrivals:
                if is_cuda:
                    self._sync_cuda()
                self.arrivals[step] = time.monotonic()
                self.arrival_kind = self.arrival_kind or "collective"
        with self._lock:
            counts = self.status["collectives"]
            counts[op] = counts.get(op, 0) + 1
            self.status["op"] = op
            self.status["op_index"] = counts[op]
            self.status["op_since"] = time.monotonic()
            self._version += 1

    def exit_collective(self, op: str) -> None:
        with self._lock:
            self.status["last_op"] = f"{op} #{self.status['collectives'].get(op, 0)}"
            self.status["op"] = None
            self.status["op_index"] = None
            self.status["op_since"] = None
            self._version += 1

    def _wrap_collective(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        torch = self._torch
        recorder = self

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            tensor = _first_tensor(args, torch) if args else _first_tensor(kwargs, torch)
            recorder.enter_collective(op, tensor)
            try:
                return original(*args, **kwargs)
            finally:
                recorder.exit_collective(op)

        wrapper.__gputrain_wrapped__ = original  # type: ignore[attr-defined]
        return wrapper

    # -- steps, forwards, batches ------------------------------------------------------------

    def on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._step_optimizer is None:
            self._step_optimizer = id(optimizer)
        elif id(optimizer) != self._step_optimizer:
            return  # the first optimizer that steps is the step clock (GANs have two)
        if self.probe:
            self._sync_cuda()
        now = time.monotonic()
        self.step_ends.append(now)
        with self._lock:
            self.status["step"] = len(self.step_ends)
            self.status["last_step_at"] = now
            self._version += 1

    def on_ddp_forward_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        torch = self._torch
        if not module.training or not torch.is_grad_enabled():
            return
        tensor = _first_tensor(args, torch)
        if tensor is None:
            tensor = _first_tensor(kwargs, torch)
        if tensor is not None and tensor.dim() > 0:
            self.forward_batches.append(int(tensor.shape[0]))

    def on_ddp_forward(self, module: Any, args: Any, output: Any) -> None:
        if not self.probe or not module.training or not self._torch.is_grad_enabled():
            return
        if self.ddp_device == "cuda":
            self._sync_cuda()
        # The last training forward before the step: its backward all-reduces the gradients.
        self.arrivals[len(self.step_ends)] = time.monotonic()
        self.arrival_kind = "ddp_forward"

    def on_loader_batch(self, batch: Any) -> None:
        tensor = _first_tensor(batch, self._torch)
        if tensor is not None and tensor.dim() > 0:
            self.loader_batches.append(int(tensor.shape[0]))

    # -- installation ------------------------------------------------------------------------

    def install(self) -> None:
        import torch
        import torch.distributed as dist

        self._torch = torch
        for op in COLLECTIVES:
            original = getattr(dist, op, None)
            if original is not None and not hasattr(original, "__gputrain_wrapped__"):
                self._replace(dist, op, self._wrap_collective(op, original))
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            handle = register_optimizer_step_post_hook(self.on_optimizer_step)
            self._undo.append(handle.remove)
        except ImportError:  # pragma: no cover - torch < 2.0
            pass
        self._patch_ddp(torch)
        self._patch_data_parallel(torch)
        if self.probe:
            self._patch_dataloader(torch)

    def uninstall(self) -> None:
        """Put back what ``install`` changed, last change first."""
        while self._undo:
            self._undo.pop()()

    def _replace(self, owner: Any, name: str, value: Any) -> None:
        original = owner.__dict__[name] if name in vars(owner) else getattr(owner, name)
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, original))

    def _patch_ddp(self, torch: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel

        recorder = self
        original = DistributedDataParallel.__init__

        @functools.wraps(original)
        def init(module: Any, *args: Any, **kwargs: Any) -> None:
            original(module, *args, **kwargs)
            recorder.ddp_used = True
            with contextlib.suppress(StopIteration, AttributeError):
                recorder.ddp_device = next(module.module.parameters()).device.type
            module.register_forward_pre_hook(recorder.on_ddp_forward_pre, with_kwargs=True)
            module.register_forward_hook(recorder.on_ddp_forward)

        self._replace(DistributedDataParallel, "__init__", init)

    def _patch_data_parallel(self, torch: Any) -> None:
        recorder = self
        original = torch.nn.DataParallel.__init__

        @functools.wraps(original)
        def init(module: Any, *args: Any, **kwargs: Any) -> None:
            original(module, *args, **kwargs)
            count = len(getattr(module, "device_ids", None) or [])
            recorder.data_parallel_devices = max(recorder.data_parallel_devices, count)

        self._replace(torch.nn.DataParallel, "__init__", init)

    def _patch_dataloader(self, torch: Any) -> None:
        from torch.utils.data import dataloader

        base = getattr(dataloader, "_BaseDataLoaderIter", None)
        if base is None:
            return
        recorder = self
        original = base.__next__

        @functools.wraps(original)
        def next_batch(iterator: Any) -> Any:
            batch = original(iterator)
            recorder.on_loader_batch(batch)
            return batch

        self._replace(base, "__next__", next_batch)

    # -- results -----------------------------------------------------------------------------

    def probe_data(self, device: str | None, device_name: str | None,
                   backend: str | None, cuda_used: bool) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "device": device,
            "device_name": device_name,
            "backend": backend,
            "step_ends": list(self.step_ends),
            "arrivals": {str(k): v for k, v in self.arrivals.items()},
            "arrival_kind": self.arrival_kind,
            "forward_batches": list(self.forward_batches),
            "loader_batches": list(self.loader_batches),
            "ddp_used": self.ddp_used,
            "ddp_device": self.ddp_device,
            "data_parallel_devices": self.data_parallel_devices,
            "cuda_used": cuda_used or self.cuda_collectives or self.ddp_device == "cuda",
            "collectives": dict(self.status["collectives"]),
            "probe": self.probe,
        }
