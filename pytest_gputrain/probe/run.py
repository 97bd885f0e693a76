"""``RunProbe``: one test call's probe. It keeps the lifecycle (start, stop, the facts, the
context of a failure) and counts the optimizer steps; its readers do the rest, each in its own
module and each writing its groups of the ``RunRecord``:

- ``module_readings.ModuleWatch``: the top-level modules (adopted and hooked at their first
  call, each forward recorded and checked, the graphs of forwards that may go without a
  backward, DDP's forwards), and the arming of the global forward hook between them;
- ``profiler_window.WindowSteering``: the profiler window, opened and closed at step boundaries;
- ``nvml_timeline.NvmlTimelineReader``: the NVML samples, taken on a thread;
- ``compile_readings.CompileWatch``: dynamo's counters, resets and compilations;
- ``cuda_readings.CallReadings``: the test's calls that the probe wraps (empty_cache,
  reset_peak_memory_stats, gradcheck, torch.save, GradScaler.scale) and the allocator's
  out-of-memory moments;
- ``loss_readings.LossWatch``: the loss each backward starts from (its device, and finiteness
  checks queued on the GPU and read once when the test ends);
- ``host_stacks.HostWatch``: where the training thread spends host time (its stack sampled in
  the profiler window and in long steps, on a thread; garbage collections timed);
- ``warning_readings.WarningWatch``: the warnings torch and the frameworks raise meanwhile;
- ``update_readings.UpdateWatch``: the learning rate at each scheduler step, and at a few steps
  the weights an optimizer step left unchanged;
- ``attention_readings.AttentionWatch``: the ``scaled_dot_product_attention`` calls, and whether
  their masks were just the causal pattern;
- ``recompute_readings.RecomputeWatch``: activation checkpointing's segments and their
  recomputation in the backward, timed at a few steps with the activations it rebuilds;
- ``evaluation_readings.EvaluationWatch``: a framework's evaluation runs while it trains, timed,
  and the setting that schedules them.

The torch hooks (``torch_hooks.py``) call the probe through ``callbacks.ProbeCallbacks``; the
callbacks a reader answers are that reader's bound methods, handed to the hooks as the probe's
own, so a hook reaches the reader with no call in between.

Hot path (per optimizer step, outside the profiler window): a clock read and one append to each
step series (``_record_step``), then the per-step readings (``_read_step``: the one place for
them; the allocator's counters are read at evenly spaced steps, see ``StepSeries.allocated``).
Per top-level forward: see ``module_readings.py``. NVML is sampled on a thread, never on the
training thread. No CUDA call is made on a device the test did not initialise, and nothing here
ever raises into the user's code: a probe error disables the probe for the rest of the test and
is reported in ``run.probe_errors``.

What is recorded lives in ``run_record.py``; how it becomes ``RunFacts`` in
``run_facts_builder.py``.
"""

from __future__ import annotations

import contextlib
import sys
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_gputrain.probe import oom_observer, settings_timeline
from pytest_gputrain.probe import run_facts_builder as builder
from pytest_gputrain.probe.attention_readings import AttentionWatch
from pytest_gputrain.probe.compile_readings import CompileWatch
from pytest_gputrain.probe.cuda_readings import (
    CallReadings,
    allocator_backend,
    device_budget,
    memory_reader,
    memory_stats,
    read_backend_flags,
)
from pytest_gputrain.probe.evaluation_readings import EvaluationWatch
from pytest_gputrain.probe.facts import ForwardRecord, RunFacts
from pytest_gputrain.probe.frameworks import driving_framework
from pytest_gputrain.probe.gradient_readings import check_at_end, read_gradients
from pytest_gputrain.probe.host_stacks import HostWatch
from pytest_gputrain.probe.instrument_readings import note_user_profiler, profiler_kind_reader
from pytest_gputrain.probe.loader import LoaderTracker, cpu_count, processes_per_host
from pytest_gputrain.probe.loss_readings import LossWatch
from pytest_gputrain.probe.module_readings import (
    ModuleWatch,
    read_last_ddp_logging,
)
from pytest_gputrain.probe.nvml_timeline import NvmlTimelineReader
from pytest_gputrain.probe.optimizer_readings import largest_lr, optimizer_setup
from pytest_gputrain.probe.profiler_window import WindowSteering
from pytest_gputrain.probe.recompute_readings import RecomputeWatch
from pytest_gputrain.probe.run_record import LoaderWaits, RunRecord, StepFlag, StepSeries
from pytest_gputrain.probe.torch_hooks import Installation, is_compiling
from pytest_gputrain.probe.update_readings import UpdateWatch
from pytest_gputrain.probe.warning_readings import WarningWatch

if TYPE_CHECKING:
    from pytest_gputrain.probe.callbacks import ProbeCallbacks

_perf = time.perf_counter
_SETTINGS_EVERY = settings_timeline.EVERY
# The step flags as module globals: the step hook reads them without an enum lookup.
_STEADY, _IN_WINDOW, _AFTER_WINDOW, _EPOCH_START = (
    StepFlag.STEADY, StepFlag.IN_WINDOW, StepFlag.AFTER_WINDOW, StepFlag.EPOCH_START)


class RunProbe:
    """One test call's probe. ``start()`` installs the hooks, ``stop()`` removes them."""

    def __init__(self, torch: Any, nodeid: str, profile_steps: tuple[int, int] | None = (3, 6),
                 warmup: int = 2, sampler: bool = True, reset_peak: bool = True) -> None:
        self.torch = torch
        self.use_sampler = sampler
        self.reset_peak = reset_peak
        self._t_start = now = _perf()
        self.record = RunRecord(
            nodeid=nodeid, warmup=warmup, profile_steps=profile_steps, started=now,
            steps=StepSeries(last_t=now),
            loader=LoaderWaits(LoaderTracker(cuda_initialized=self._cuda_initialized)))
        self.disabled = self.closed = False
        self.install = Installation(torch, self)
        # The readers, one per job.
        self.modules = ModuleWatch(torch, self, self.install)
        self.window = WindowSteering(torch, self.record, profile_steps)
        self.nvml = NvmlTimelineReader(self.record)
        self.compile = CompileWatch(self, self.install)
        self.calls, self.loss = CallReadings(torch, self), LossWatch(torch, self)
        self.host, self.warnings = HostWatch(self.record), WarningWatch(self.record)
        self.updates, self.recompute = UpdateWatch(torch, self), RecomputeWatch(torch, self)
        self.attention, self.evaluation = AttentionWatch(torch, self), EvaluationWatch(self)
        # The hook callbacks the readers answer (ProbeCallbacks), as the probe's own.
        self.on_global_forward = self.modules.on_global_forward
        self.on_backward_start = self.modules.on_backward_start
        self.on_backward_end = self.modules.on_backward_end
        self.on_loss = self.loss.on_loss
        self.on_dynamo_reset = self.compile.on_dynamo_reset
        self.on_compile_start = self.compile.on_compile_start
        self.on_empty_cache_start = self.calls.on_empty_cache_start
        self.on_empty_cache_end = self.calls.on_empty_cache_end
        self.on_reset_peak, self.on_gradcheck = self.calls.on_reset_peak, self.calls.on_gradcheck
        self.on_save, self.on_scale = self.calls.on_save, self.calls.on_scale
        self.on_unscale, self.on_clip = self.calls.on_unscale, self.calls.on_clip
        self.on_oom = self.calls.on_oom  # the allocator's out-of-memory observer's target
        # What the step hook reads.
        self._compiling = is_compiling(torch)
        # (allocated, reserved bytes) and the memory fraction: set at the first step on CUDA
        self._read_memory: Callable[[], tuple[int, int]] | None = None
        self._read_fraction: Callable[[], float] | None = None
        self._profiler_enabled = _profiler_probe(torch)
        self._profiler_kind = profiler_kind_reader(torch)
        # Steps after which a one-off reading is taken: dynamo's counters once the warm-up is
        # over, the allocator's cudaMalloc/cudaFree counters once the profiler window is too.
        self.record.cache.mark_step = max(warmup, self.window.last_step) + 1
        self._milestones = sorted(s for s in {warmup, self.record.cache.mark_step} if s >= 1)
        self._next_milestone = self._milestones[0]

    @property
    def errors(self) -> list[str]:
        return self.record.errors

    @property
    def cuda_index(self) -> int | None:
        return self.record.devices.cuda_index

    @property
    def compute_capability(self) -> str | None:
        return self.record.devices.compute_capability

    @property
    def batch_size(self) -> int | None:
        return builder.batch_size(self.record)

    @property
    def last_forward(self) -> ForwardRecord | None:
        """The last top-level forward (failures name its module and devices)."""
        return builder.last_forward(self.record.forwards)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        torch = self.torch
        record = self.record
        try:  # before the test runs: no CUDA context is created, none can be broken yet
            record.devices.cuda_available = bool(torch.cuda.is_available())
        except Exception as exc:
            record.errors.append(f"torch.cuda.is_available(): {exc}")
        try:
            if self._cuda_initialized():
                index = int(torch.cuda.current_device())
                if self.reset_peak:
                    torch.cuda.reset_peak_memory_stats(index)
                record.allocator.start = {index: memory_stats(torch, index)}
                oom_observer.attach(torch)
        except Exception as exc:  # e.g. an earlier test left the context broken
            record.errors.append(f"reading the allocator at the start: {exc}")
        oom_observer.set_target(self.on_oom)
        self.compile.read_start()
        try:
            self.install.install()
            for reader in (self.host, self.warnings, self.updates, self.attention, self.evaluation,
                           self.recompute):
                reader.start(self.install.patches)
        except Exception as exc:
            self.fail("installing the probe", exc)
            record.errors.extend(self.install.remove())
        self._t_start = record.steps.last_t = record.started = _perf()

    def stop(self, cuda_ok: bool = True) -> None:
        """Remove every hook; with ``cuda_ok`` False (a sticky CUDA error) make no CUDA call."""
        if self.closed:
            return
        record = self.record
        record.duration = _perf() - self._t_start
        self.closed = True
        if oom_observer.target() == self.on_oom:
            oom_observer.set_target(None)
        self.host.stop()  # before the patches go: gc.collect is one of them
        try:
            record.errors.extend(self.install.remove())
        except Exception as exc:  # pragma: no cover - remove() guards each step
            record.errors.append(f"removing the probe's hooks: {exc}")
        self.modules.remove_hooks()
        self.window.stop(len(record.steps.times), cuda_ok=cuda_ok)
        self.modules.count_graph_outputs()
        if record.grads.read_at is None and record.steps.times:
            read_gradients(record)  # a short test: what the last step left
        check_at_end(record)
        self.compile.read_end()
        self.calls.read_end(cuda_ok)
        self.loss.read_end(cuda_ok)
        self.updates.stop(cuda_ok)  # reads the main optimizer's learning rate at the end
        self.attention.stop(cuda_ok)
        self.recompute.stop(cuda_ok)
        read_last_ddp_logging(record)
        self.nvml.stop()
        index = record.devices.cuda_index
        if cuda_ok and index is not None:
            try:
                record.allocator.end = memory_stats(self.torch, index)
                record.allocator.end.update(device_budget(self.torch, index))
            except Exception as exc:
                record.errors.append(f"reading the allocator at the end: {exc}")
        record.optimizers.primary = None

    def trained(self) -> bool:
        """Worth recording: the test stepped an optimizer, ran a module, loaded or used CUDA."""
        record = self.record
        return bool(record.steps.times or record.forwards.calls or record.loader.tracker.loaders
                    or record.devices.cuda_index is not None or record.errors)

    def facts(self) -> RunFacts:
        from pytest_gputrain.probe.failures import expandable_segments

        record = self.record
        process = builder.ProcessReadings(
            cpus=cpu_count(), processes_per_host=processes_per_host(),
            expandable_segments=expandable_segments(),
            backend_flags={} if record.devices.backend_flags else read_backend_flags(self.torch))
        return builder.build_run_facts(record, process)

    def failure_context(self) -> dict[str, Any]:
        """What the probe saw up to a failure (``failure_context``)."""
        return failure_context(self.record)

    def fail(self, where: str, exc: BaseException) -> None:
        """A hook raised: the probe does nothing more in this test (``ProbeCallbacks``)."""
        self.disabled = self.modules.disabled = True
        self.record.errors.append(f"{where}: {type(exc).__name__}: {exc}")
        with contextlib.suppress(Exception):
            self.install.disarm()

    # -- the step boundary (hook callbacks, guarded) --------------------------------------------

    def on_optimizer_pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.record.optimizer.step_started = _perf()
        self.updates.at_pre_step(len(self.record.steps.times), optimizer)

    def on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.disabled or self._compiling():
            return
        try:
            optimizers = self.record.optimizers
            optimizers.steps += 1
            if optimizer is not optimizers.primary:
                if optimizers.primary is not None:  # another optimizer: named, not timed
                    if id(optimizer) not in optimizers.ids:
                        optimizers.ids.add(id(optimizer))
                        optimizers.refs.append(weakref.ref(optimizer))
                        optimizers.names.append(type(optimizer).__name__)
                    return
                index = adopt_optimizer(self.torch, self.record, optimizer)
                if index is not None:
                    self._setup_cuda(index)
            count = self._record_step(_perf())
            self._read_step(count)
            self.window.at_step(count)
            modules = self.modules  # checked here: most steps leave nothing open, and call none
            if modules.pending or modules.undecided or modules.active is not None:
                modules.at_step()
        except Exception as exc:
            self.fail("optimizer step hook", exc)

    def on_batch(self, iterator: Any, batch: Any, wait: float) -> None:
        if self.disabled:
            return
        try:
            loader = self.record.loader
            loader.pending += wait
            if loader.tracker.on_batch(iterator, batch, wait):
                loader.epoch_start = True
            modules = self.modules
            if modules.pending or modules.active is not None:
                modules.at_batch()
        except Exception as exc:
            self.fail("DataLoader wrapper", exc)

    def _record_step(self, now: float) -> int:
        """Close the step that ends now: one entry in each per-step series (its time, the
        optimizer's host time, loader wait, syncs, forwards so far, flag). Returns the number
        of steps so far."""
        record = self.record
        steps, loader, syncs = record.steps, record.loader, record.syncs
        record.optimizer.host_times.append(now - record.optimizer.step_started)
        steps.times.append(now - steps.last_t)
        steps.last_t = now
        steps.waits.append(loader.pending)
        loader.pending = 0.0
        steps.syncs.append(syncs.pending)
        steps.framework_syncs.append(syncs.framework_pending)
        steps.sync_waits.append(syncs.pending_wait)
        syncs.pending = syncs.framework_pending = 0
        syncs.pending_wait = 0.0
        steps.flags.append(_IN_WINDOW if steps.in_window else
                           _AFTER_WINDOW if steps.after_window else
                           _EPOCH_START if loader.epoch_start else _STEADY)
        steps.after_window = loader.epoch_start = False
        steps.forwards.append(record.forwards.calls)
        return len(steps.times)

    def _read_step(self, count: int) -> None:
        """The readings at each step boundary (``count`` steps so far): the one place for
        them. Each must cost a few attribute reads; anything dearer is taken at evenly spaced
        steps like the allocator's counters (``torch.cuda.memory_stats`` builds a dict of ~200
        entries in C++ under the allocator's lock: tens of µs), or every settings_timeline.EVERY."""
        record = self.record
        steps = record.steps
        if count - 1 == self.updates.due:  # before the memory reading: its copies are freed
            self.updates.after_step(record.optimizers.primary)
        if self.recompute.step_clock:
            self.recompute.at_boundary(count)
        read_memory = self._read_memory
        if read_memory is not None and steps.allocated_due(count - 1):
            steps.add_allocated(*read_memory())
        in_window = steps.in_window
        if not in_window and self._profiler_enabled():
            note_user_profiler(record.settings, count - 1, self._profiler_kind)
        if count <= 2 or in_window or count % _SETTINGS_EVERY == 0:
            self._read_settings(count)  # the first steps, the window, every EVERY-th
        if count == self._next_milestone:
            self._milestone(count)

    def _read_settings(self, step: int) -> None:
        """Snapshot the settings a test may change inside itself (``settings.py``)."""
        timeline = self.record.settings
        timeline.reads += 1
        now = settings_timeline.read_settings(self.torch, self._read_fraction)
        if not timeline.snapshots or timeline.snapshots[-1][1] != now:
            timeline.snapshots.append((step, now))

    def _milestone(self, count: int) -> None:
        record = self.record
        if count == self._milestones[0]:  # the warm-up's end: the backward filled .grad
            read_gradients(record)
        if count == record.warmup:
            self.compile.read_warm()
        if count == record.cache.mark_step:
            self.calls.mark()
        later = [step for step in self._milestones if step > count]
        self._next_milestone = later[0] if later else -1

    # -- once per device ------------------------------------------------------------------------

    def _cuda_initialized(self) -> bool:
        try:
            return bool(self.torch.cuda.is_initialized())
        except Exception:
            return False

    def _setup_cuda(self, index: int) -> None:
        torch = self.torch
        record = self.record
        try:
            record.devices.device_name = str(torch.cuda.get_device_name(index))
            major, minor = torch.cuda.get_device_capability(index)
            record.devices.compute_capability = f"{major}.{minor}"
        except Exception as exc:
            record.errors.append(f"device properties: {exc}")
        if index not in record.allocator.start:
            record.allocator.start[index] = {}
        record.allocator.backend = allocator_backend(torch)
        self._read_memory = memory_reader(torch, index)
        self._read_fraction = settings_timeline.fraction_reader(torch, index)
        oom_observer.attach(torch)
        if self.use_sampler:
            self.nvml.start(index)
        self.host.start_sampler()


if TYPE_CHECKING:
    # The probe answers every callback the hooks make: mypy checks it here, where the types of
    # the callbacks bound in __init__ are known (the Installation is built before them).
    def _answers_the_hooks(probe: RunProbe) -> ProbeCallbacks:
        return probe


def failure_context(record: RunRecord) -> dict[str, Any]:
    """What the probe saw up to a failure: the last out-of-memory moment, the last settings
    read, other processes' memory in the last samples taken while the test ran, and the
    allocator when the test started."""
    context: dict[str, Any] = {"oom_moments": list(record.oom_moments)}
    snapshots = record.settings.snapshots
    if snapshots:
        context["settings"] = dict(snapshots[-1][1])
    samples = record.nvml.samples[:record.nvml.before_stop]
    recent = [s.other_process_memory for s in samples[-2:]
              if s.other_process_memory is not None]
    if recent:
        context["other_processes_before"] = max(recent)
    index = record.devices.cuda_index
    start = record.allocator.start.get(index if index is not None else -1)
    if start is None and len(record.allocator.start) == 1:
        start = next(iter(record.allocator.start.values()))
    if start:
        context["allocator_start"] = dict(start)
    if record.allocator.peaks_before_reset:
        context["peaks_before_reset"] = dict(record.allocator.peaks_before_reset)
    return context


def adopt_optimizer(torch: Any, record: RunRecord, optimizer: Any) -> int | None:
    """The first step of the main optimizer: its configuration, the devices and dtypes of its
    parameters, the backend flags; returns the CUDA device it trains on, if any."""
    optimizers, devices = record.optimizers, record.devices
    optimizers.primary = optimizer
    optimizers.ids.add(id(optimizer))
    optimizers.refs.append(weakref.ref(optimizer))
    optimizers.names.append(type(optimizer).__name__)
    readings = record.optimizer
    readings.name = type(optimizer).__name__
    readings.foreach, readings.fused, readings.param_tensors = optimizer_setup(optimizer)
    readings.lr_first = largest_lr(optimizer)
    record.framework = driving_framework(sys._getframe())
    first = None
    for group in optimizer.param_groups:
        for param in group.get("params", ()):
            if first is None:
                first = param
            device = str(param.device)
            dtype = str(param.dtype).removeprefix("torch.")
            if device not in devices.param_devices:
                devices.param_devices.append(device)
            if dtype not in devices.param_dtypes:
                devices.param_dtypes.append(dtype)
    devices.backend_flags = read_backend_flags(torch)
    if first is None:
        return None
    devices.device = str(first.device)
    if first.device.type != "cuda":
        return None
    index = first.device.index
    devices.cuda_index = int(torch.cuda.current_device()) if index is None else int(index)
    devices.device = f"cuda:{devices.cuda_index}"
    return devices.cuda_index


def _profiler_probe(torch: Any) -> Callable[[], bool]:
    """``torch.autograd`` profiler state: True while a profiler records on this thread
    (``torch.profiler.profile`` in an active phase, ``emit_nvtx``, the legacy profiler)."""
    function = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
    if callable(function):
        return function  # type: ignore[no-any-return]
    return lambda: False
