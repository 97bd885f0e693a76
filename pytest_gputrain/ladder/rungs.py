"""The readiness ladder: prove each layer before scaling (driver, CUDA, one batch, a short run,
mixed precision, then batch size), on any project's own model, data and step function.

    spec = LadderSpec(name="my-model", make_model=..., make_optimizer=..., batches=...,
                      step=..., evaluate=...)
    ladder = gpu_ladder(spec)                # the fixture; rows collect across tests
    ladder.one_batch("cpu")
    ladder.short_run("cuda", precision="fp32", batch_size=32, steps=200)
    ladder.largest_batch(precision="bf16")

Every rung records a row; the session prints the table and puts it in the reports.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_gputrain.ladder.headroom import (
    FALLBACK_MARGIN,
    MARGIN,
    Probe,
    StepPeaks,
    predict,
    take_probes,
)
from pytest_gputrain.ladder.peaks import PeaksAroundOptimizerStep
from pytest_gputrain.units import format_bytes

Batch = Any  # whatever the project's step function takes
# What the libraries keep from their first use for the process's life, in the caching
# allocator: cuBLAS's workspace (32 MiB a stream on Hopper) and cuBLASLt's. A fresh process
# makes them too, so probes that made them left nothing that matters.
LIBRARY_WORKSPACES = 64 * 2**20
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class LadderSpec:
    """What a project hands the ladder. Batches are produced on the CPU; ``step`` moves them."""

    name: str
    make_model: Callable[[], Any]
    make_optimizer: Callable[[Any], Any]
    batches: Callable[[int], Iterator[Batch]]
    step: Callable[[Any, Batch, Any, Any, str], Any]  # (model, batch, optimizer, device, prec)
    evaluate: Callable[[Any, Any, str], float] | None = None  # (model, device, precision) -> acc


@dataclass
class RungRecord:
    rung: str
    device: str
    precision: str = "fp32"
    batch_size: int | None = None
    steps: int | None = None
    seconds_per_step: float | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    memory_before: int | None = None
    memory_after: int | None = None
    utilization_p10: float | None = None
    utilization_p90: float | None = None
    temperature_min: float | None = None
    temperature_max: float | None = None
    val_accuracy: float | None = None
    loss_first: float | None = None
    loss_last: float | None = None


@dataclass
class HeadroomRecord:
    precision: str
    budget: int
    # (batch size, peak allocated bytes outside optimizer.step: the forward and backward)
    probes: list[tuple[int, int]]
    predicted: int | None
    verified: bool
    verified_peak: int | None  # the whole step's
    note: str = ""
    # Each probe's peak inside optimizer.step (None where the step never ran it).
    optimizer_peaks: list[int | None] = field(default_factory=list)
    # Bytes the allocator still held, once the probes' model and optimizer were dropped and its
    # cache emptied, beyond what it held when the rung began (None: not measured).
    left_by_probes: int | None = None


@dataclass
class LadderResults:
    name: str
    rungs: list[RungRecord] = field(default_factory=list)
    headroom: list[HeadroomRecord] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rungs": [asdict(r) for r in self.rungs],
                "headroom": [asdict(h) for h in self.headroom]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LadderResults:
        """The results ``as_dict`` gave (a pytest-xdist worker's, on the controller)."""
        return cls(
            name=str(data["name"]),
            rungs=[RungRecord(**rung) for rung in data.get("rungs", [])],
            headroom=[HeadroomRecord(**{**item, "probes": [tuple(p) for p in item["probes"]]})
                      for item in data.get("headroom", [])])


class LadderError(RuntimeError):
    """A rung could not run (no CUDA, an unknown precision, ...), with the reason."""


def _torch() -> Any:
    from pytest_gputrain.collect.torch_import import import_torch

    return import_torch()


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise LadderError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")


class Ladder:
    """The rungs for one project; each call appends its record to ``results``."""

    def __init__(self, spec: LadderSpec, results: LadderResults | None = None) -> None:
        self.spec = spec
        self.results = results or LadderResults(spec.name)

    # -- helpers ---------------------------------------------------------------------------------

    def _device(self, name: str) -> Any:
        torch = _torch()
        device = torch.device(name)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise LadderError("CUDA is not available: the GPU rungs cannot run here")
        return device

    def _fresh(self, device: Any) -> tuple[Any, Any]:
        model = self.spec.make_model().to(device)
        return model, self.spec.make_optimizer(model)

    def _run_steps(self, model: Any, optimizer: Any, device: Any, precision: str,
                   batches: Iterator[Batch], steps: int) -> list[float]:
        _check_precision(precision)
        losses = []
        for _ in range(steps):
            loss = self.spec.step(model, next(batches), optimizer, device, precision)
            losses.append(_detached(loss))
        return [_scalar(loss) for loss in losses]  # one sync at the end, not one per step

    # -- rungs -----------------------------------------------------------------------------------

    def one_batch(self, device: str = "cpu", batch_size: int = 32,
                  precision: str = "fp32") -> RungRecord:
        """One forward and backward pass on one batch: the stack works end to end."""
        torch = _torch()
        dev = self._device(device)
        batch = next(self.spec.batches(batch_size))
        memory_before = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None
        model, optimizer = self._fresh(dev)
        started = time.perf_counter()
        losses = self._run_steps(model, optimizer, dev, precision, iter([batch, batch]), 2)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        elapsed = (time.perf_counter() - started) / 2
        record = RungRecord(
            rung="one batch", device=dev.type, precision=precision, batch_size=batch_size,
            steps=2, seconds_per_step=elapsed, loss_first=losses[0], loss_last=losses[-1],
            memory_before=memory_before,
            memory_after=torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None,
        )
        self.results.rungs.append(record)
        del model, optimizer
        _release(torch, dev)
        return record

    def short_run(self, device: str = "cuda", precision: str = "fp32", batch_size: int = 32,
                  steps: int = 200, warmup: int = 10, evaluate: bool = True) -> RungRecord:
        """A short training run: step time (median after warm-up), peak VRAM, utilization and
        temperature ranges (NVML, p10-p90), and validation accuracy."""
        torch = _torch()
        _check_precision(precision)
        dev = self._device(device)
        torch.manual_seed(0)
        model, optimizer = self._fresh(dev)
        batches = self.spec.batches(batch_size)
        sampler = _start_sampler(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        times: list[float] = []
        losses: list[Any] = []
        if dev.type == "cuda":
            events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
            events[0].record()
            for index in range(steps):
                losses.append(_detached(
                    self.spec.step(model, next(batches), optimizer, dev, precision)))
                events[index + 1].record()
            torch.cuda.synchronize(dev)
            times = [events[i].elapsed_time(events[i + 1]) / 1000 for i in range(steps)]
        else:
            for _ in range(steps):
                started = time.perf_counter()
                losses.append(_detached(
                    self.spec.step(model, next(batches), optimizer, dev, precision)))
                times.append(time.perf_counter() - started)
        summary = sampler.stop().summary() if sampler is not None else {}
        kept = times[warmup:] if len(times) > warmup else times
        accuracy = (_scalar(self.spec.evaluate(model, dev, precision))
                    if evaluate and self.spec.evaluate else None)
        util, temp = summary.get("utilization_gpu"), summary.get("temperature")
        record = RungRecord(
            rung="short run", device=dev.type, precision=precision, batch_size=batch_size,
            steps=steps, seconds_per_step=statistics.median(kept),
            peak_allocated=torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None,
            peak_reserved=torch.cuda.max_memory_reserved(dev) if dev.type == "cuda" else None,
            utilization_p10=util.p10 if util else None, utilization_p90=util.p90 if util else None,
            temperature_min=temp.min if temp else None, temperature_max=temp.max if temp else None,
            val_accuracy=accuracy, loss_first=_scalar(losses[0]), loss_last=_scalar(losses[-1]),
        )
        self.results.rungs.append(record)
        del model, optimizer
        _release(torch, dev)
        return record

    def largest_batch(self, precision: str = "fp32", start_batch: int = 32,
                      budget: int | None = None, device: str = "cuda") -> HeadroomRecord:
        """Predict the largest batch that fits the real budget from three probes (up to six
        where small batches' peaks are flat), then verify it with one run of a new model.
        ``budget`` defaults to what this process may really use (memory_budget())."""
        torch = _torch()
        dev = self._device(device)
        budget = budget if budget is not None else memory_budget(dev)
        held_before = _settled_reserved(torch, dev)
        probes = self._probes(dev, precision, start_batch, budget)
        left_by_probes = max(0, _settled_reserved(torch, dev) - held_before)
        record = HeadroomRecord(
            precision=precision, budget=budget,
            probes=[(batch, peaks.outside) for batch, peaks in probes],
            optimizer_peaks=[peaks.optimizer for _, peaks in probes],
            predicted=predict(probes, budget, MARGIN), verified=False, verified_peak=None,
            left_by_probes=left_by_probes)
        missed: list[str] = []
        if left_by_probes > max(budget * MARGIN, LIBRARY_WORKSPACES):
            missed.append(
                f"the probes left {format_bytes(left_by_probes)} that emptying the cache could "
                f"not free (something outside the rung keeps their tensors): the verification "
                f"had that much less room than a fresh process")
        # A batch that runs out of memory on verification, or peaks over a budget smaller than
        # the GPU (one passed in), gets one retry at a wider margin.
        fallback = predict(probes, budget, FALLBACK_MARGIN)
        for attempt in dict.fromkeys((record.predicted, fallback)):
            if not attempt:
                break
            record.predicted = attempt
            try:
                record.verified_peak = self._fresh_peaks(dev, precision, attempt).whole
            except torch.OutOfMemoryError:
                missed.append(f"batch {attempt} ran out of memory on verification")
                continue
            record.verified = record.verified_peak <= budget
            if record.verified:
                break
            missed.append(f"batch {attempt} peaked at {format_bytes(record.verified_peak)}, "
                          f"over the budget of {format_bytes(budget)}")
        record.note = "; ".join(missed)
        self.results.headroom.append(record)
        _release(torch, dev)
        return record

    def _probes(self, device: Any, precision: str, start_batch: int,
                budget: int) -> list[Probe]:
        """The probes, on one model and optimizer that are gone when this returns (nothing here
        outlives the call: the model, the optimizer and the partial that holds them)."""
        torch = _torch()
        model, optimizer = self._fresh(device)
        # One step first, so optimizer state and workspaces exist in every probe's baseline.
        self._run_steps(model, optimizer, device, precision, self.spec.batches(start_batch), 1)
        peaks_of = functools.partial(self._peaks, model, optimizer, device, precision)
        return take_probes(start_batch, peaks_of(start_batch),
                           _settled_allocated(torch, device), budget, peaks_of)

    def _fresh_peaks(self, device: Any, precision: str, batch: int) -> StepPeaks:
        """Peak allocated bytes over two steps at ``batch`` of a new model and optimizer, in an
        allocator emptied first: what a fresh process at that batch would need.

        The probes' optimizer state was made at their first batch size, among the segments of
        that step; left alive, it pins those segments after ``empty_cache()``, and their free
        pieces are the wrong sizes for another batch's blocks. A batch that fits a fresh process
        then runs out of memory here. The cache is emptied *before* the model is made, or its
        parameters would land in the segments the probes cached and pin them in turn."""
        torch = _torch()
        _release(torch, device)
        model, optimizer = self._fresh(device)
        try:
            return self._peaks(model, optimizer, device, precision, batch)
        finally:
            del model, optimizer  # an out-of-memory error's traceback keeps this frame

    def _peaks(self, model: Any, optimizer: Any, device: Any, precision: str,
               batch: int) -> StepPeaks:
        """Two steps at ``batch``; their peaks outside and inside ``optimizer.step``."""
        torch = _torch()
        batches = self.spec.batches(batch)
        _release(torch, device)
        # Peak *allocated*, not reserved: near the budget the caching allocator frees its cache
        # and retries, so what must fit is the live memory (reserved overstates it by ~50 %).
        with PeaksAroundOptimizerStep(
                optimizer, read_peak=lambda: int(torch.cuda.max_memory_allocated(device)),
                reset_peak=lambda: torch.cuda.reset_peak_memory_stats(device)) as peaks:
            self._run_steps(model, optimizer, device, precision, batches, 2)
            torch.cuda.synchronize(device)
        return peaks.result()


def _detached(value: Any) -> Any:
    """A tensor the step returned, cut from its autograd graph (a float stays a float).

    Done as each step returns: a kept loss that requires grad holds on to its graph, and
    ``float()`` of it makes torch warn from our code (an error under ``-W error``)."""
    detach = getattr(value, "detach", None)
    return detach() if callable(detach) else value


def _scalar(value: Any) -> float:
    """A loss or accuracy as a float, whether the project returned a tensor or a number."""
    return float(_detached(value))


def _release(torch: Any, device: Any) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _settled_allocated(torch: Any, device: Any) -> int:
    _release(torch, device)
    return int(torch.cuda.memory_allocated(device))


def _settled_reserved(torch: Any, device: Any) -> int:
    """What the allocator holds once the unreachable is collected and its cache emptied: the
    live tensors and the segments they pin."""
    _release(torch, device)
    return int(torch.cuda.memory_reserved(device))


def memory_budget(device: Any) -> int:
    """Bytes this process's allocator may hold on ``device``: total x the per-process fraction,
    and no more than is free now plus what this process already holds (other processes)."""
    torch = _torch()
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = int(torch.cuda.get_device_properties(index).total_memory)
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    fraction = float(getter(index)) if getter is not None else 1.0
    free, _ = torch.cuda.mem_get_info(index)
    return int(min(total * fraction, free + torch.cuda.memory_reserved(index)))


def _start_sampler(device: Any) -> Any:
    if device.type != "cuda":
        return None
    try:
        from pytest_gputrain.collect import nvml
        from pytest_gputrain.collect.sampler import NvmlSampler

        index = nvml.index_for_cuda_device(device.index or 0)
        if index is None or not nvml.shared().available:
            return None
        return NvmlSampler(index, interval=0.05).start()
    except Exception:
        return None  # the ladder still reports time, memory and accuracy without NVML
