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

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_gputrain.ladder.allocation_forecast import AllocationForecast
from pytest_gputrain.ladder.allocator_history import AllocatorHistory
from pytest_gputrain.ladder.allocator_model import Recording
from pytest_gputrain.ladder.headroom import (
    MARGIN,
    Probe,
    StepPeaks,
    margin,
    predict,
    predict_by_forecast,
    step_down,
    take_probes,
)
from pytest_gputrain.ladder.peaks import PeaksAroundOptimizerStep
from pytest_gputrain.units import format_bytes

Batch = Any  # whatever the project's step function takes
# What the probes may leave without a note: the libraries' small state. cuBLAS's workspaces
# (32 MiB a handle on Hopper) are dropped between runs (_drop_library_workspaces); where a torch
# cannot drop them, two of them stay, which a fresh process makes too.
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
    # Bytes the allocator still held, once the probes' models and optimizers were dropped and
    # its cache emptied, beyond what it held when the rung began (None: not measured).
    left_by_probes: int | None = None
    # Each probe's least memory limit, its allocations replayed through the caching allocator's
    # policy (fragmentation included; None: not replayed), and the verification's.
    probe_rooms: list[int | None] = field(default_factory=list)
    verified_room: int | None = None
    replay_note: str = ""  # why a probe's allocations were not replayed ("": all were)
    # How the allocator's waste entered the prediction: "forecast" (the predicted batch's own
    # allocations, forecast from the probes' and replayed), "waste line" (a line through the
    # probes' replayed waste), "fixed margin" (nothing replayed); "" where nothing was predicted.
    waste_by: str = ""


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
        where small batches' peaks are flat), each a new model's first two steps with the
        allocator's history replayed, then verify it with one more such run.
        ``budget`` defaults to what this process may really use (memory_budget())."""
        torch = _torch()
        dev = self._device(device)
        budget = budget if budget is not None else memory_budget(dev)
        held_before = _settled_reserved(torch, dev)
        probes, not_replayed, recordings = self._probes(dev, precision, start_batch, budget)
        left_by_probes = max(0, _settled_reserved(torch, dev) - held_before)
        # What this process still has: the prediction is verified here, in what is left.
        room = budget - left_by_probes
        forecast = AllocationForecast.of(recordings) if not not_replayed else None
        del recordings  # a few MB of events each: not kept past the prediction
        by_forecast = predict_by_forecast(probes, room, forecast.fits) if forecast else None
        predicted = by_forecast if by_forecast is not None else predict(probes, room)
        waste_by = ("forecast" if by_forecast is not None else
                    "waste line" if margin(probes) == MARGIN else "fixed margin")
        record = HeadroomRecord(
            precision=precision, budget=budget,
            probes=[(batch, peaks.outside) for batch, peaks in probes],
            optimizer_peaks=[peaks.optimizer for _, peaks in probes],
            predicted=predicted, verified=False, verified_peak=None,
            left_by_probes=left_by_probes, probe_rooms=[peaks.room for _, peaks in probes],
            replay_note=not_replayed[0] if not_replayed else "",
            waste_by=waste_by if predicted is not None else "")
        missed: list[str] = []
        if left_by_probes > max(budget * MARGIN, LIBRARY_WORKSPACES):
            missed.append(
                f"the probes left {format_bytes(left_by_probes)} that emptying the cache could "
                f"not free (something outside the rung keeps their tensors): predicted for the "
                f"room left, that much less than a fresh process has")
        # A batch that runs out of memory on verification, or needs more than the budget (one
        # smaller than the GPU, passed in), gets one retry, lower by what it lacked. Where the
        # allocator itself holds the process to the budget, a run that fitted proves it; where
        # it does not, the replayed room must fit the budget too.
        limit = _allocator_limit(torch, dev)
        enforced = limit is not None and limit <= budget
        attempt = record.predicted
        for last in (False, True):
            if not attempt:
                break
            record.predicted = attempt
            run = self._fresh_run(dev, precision, attempt, budget)
            if run.peaks is None:
                lacked = f" ({format_bytes(run.short_by)} short)" if run.short_by else ""
                missed.append(f"batch {attempt} ran out of memory on verification{lacked}")
                short_by = run.short_by
            else:
                record.verified_peak, record.verified_room = run.peaks.whole, run.peaks.room
                needed = max(run.peaks.whole, 0 if enforced else run.peaks.room or 0)
                record.verified = needed <= budget
                if record.verified:
                    break
                how = ("peaked at" if needed == run.peaks.whole
                       else "needs, with the allocator's fragmentation,")
                missed.append(f"batch {attempt} {how} {format_bytes(needed)}, over the budget "
                              f"of {format_bytes(budget)}")
                short_by = needed - budget
            attempt = None if last else step_down(probes, room, attempt, short_by)
        record.note = "; ".join(missed)
        self.results.headroom.append(record)
        _release(torch, dev)
        return record

    def _probes(self, device: Any, precision: str, start_batch: int, budget: int
                ) -> tuple[list[Probe], list[str], list[tuple[int, Recording]]]:
        """The probes, each a new model's and optimizer's first two steps in an emptied
        allocator (nothing here outlives the call), why any was not replayed, and the
        recordings of those that were."""
        runs: list[_Run] = []

        def peaks_of(batch: int) -> StepPeaks:
            run = self._fresh_run(device, precision, batch, budget)
            if run.peaks is None:
                raise LadderError(
                    f"batch {batch} ran out of memory while probing the budget of "
                    f"{format_bytes(budget)}: start the probes at a smaller batch (start_batch)")
            runs.append(run)
            return run.peaks

        first = peaks_of(start_batch)
        probes = take_probes(start_batch, first, runs[0].held, budget, peaks_of)
        recordings = [(batch, run.recording) for (batch, _), run in zip(probes, runs, strict=True)
                      if run.recording is not None]
        return probes, [run.why_not_replayed for run in runs if run.why_not_replayed], recordings

    def _fresh_run(self, device: Any, precision: str, batch: int, budget: int) -> _Run:
        """Two steps at ``batch`` of a new model and optimizer, in an allocator emptied first,
        its history recorded: what a fresh process at that batch would do.

        Optimizer state is made at the first step among the segments of that step; a model or
        optimizer of another run left alive pins those segments after ``empty_cache()``, and
        their free pieces are the wrong sizes for another batch's blocks (a batch that fits a
        fresh process then runs out of memory here). So the cache is emptied, and the
        libraries' workspaces dropped, *before* the model is made, or its parameters would
        land in the segments cached before and pin them in turn."""
        torch = _torch()
        _release(torch, device)
        history = AllocatorHistory(torch, device, _allocator_limit(torch, device), budget)
        peaks, held = None, 0
        try:
            with history:
                model, optimizer = self._fresh(device)
                try:
                    peaks = self._peaks(model, optimizer, device, precision, batch)
                    held = _settled_allocated(torch, device)
                finally:
                    del model, optimizer  # an out-of-memory error's traceback keeps this frame
        except torch.OutOfMemoryError:
            pass  # the run's frames go with the error, here; history.short_by says by how much
        if peaks is not None and history.room is not None:
            peaks = dataclasses.replace(peaks, room=history.room)
        replayed = history.recording if history.room is not None else None
        return _Run(peaks=peaks, held=held, short_by=history.short_by,
                    why_not_replayed=history.why_not, recording=replayed)

    def _peaks(self, model: Any, optimizer: Any, device: Any, precision: str,
               batch: int) -> StepPeaks:
        """Two steps at ``batch``; their peaks outside and inside ``optimizer.step``."""
        torch = _torch()
        batches = self.spec.batches(batch)
        # Peak *allocated*: what the step's live tensors take. What the segments they pin take
        # besides is the replay's (allocator_model.py); reserved overstates both, as the
        # allocator keeps freed blocks cached until it needs the room (~50 % more).
        with PeaksAroundOptimizerStep(
                optimizer, read_peak=lambda: int(torch.cuda.max_memory_allocated(device)),
                reset_peak=lambda: torch.cuda.reset_peak_memory_stats(device)) as peaks:
            self._run_steps(model, optimizer, device, precision, batches, 2)
            torch.cuda.synchronize(device)
        return peaks.result()


@dataclass
class _Run:
    """One run of ``Ladder._fresh_run``."""

    peaks: StepPeaks | None  # None: it ran out of memory
    held: int  # bytes allocated after its steps, with its model and optimizer alive
    short_by: int | None  # where it ran out of memory: the bytes it lacked, if measured
    why_not_replayed: str  # "" where its allocations were replayed
    recording: Recording | None = None  # its allocator history, where replayed


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
        _drop_library_workspaces(torch)
        torch.cuda.empty_cache()


def _drop_library_workspaces(torch: Any) -> None:
    """cuBLAS keeps a workspace per handle and stream (32 MiB on Hopper; the autograd engine's
    thread has a handle of its own) in the caching allocator, made at its first use and kept for
    the process. Made in a step, one can land in a large block the step had freed and pin that
    segment for good: on the H200 the GPT-style model's probes left 290 MiB, one workspace in a
    256 MiB segment (the first probe's logits in fp32), the other in its own, and 2 MiB. Dropped,
    the next run makes its own, as a fresh process does."""
    clear = getattr(getattr(torch, "_C", None), "_cuda_clearCublasWorkspaces", None)
    if callable(clear):
        clear()


def _allocator_limit(torch: Any, device: Any) -> int | None:
    """What the caching allocator itself lets this process hold: the GPU's memory times the
    per-process fraction where one under 1 is set; None where none is (the GPU bounds it)."""
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if not callable(getter):
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    fraction = float(getter(index))
    if fraction >= 1.0:
        return None
    return int(fraction * int(torch.cuda.get_device_properties(index).total_memory))


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
