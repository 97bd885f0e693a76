"""``RunProbe``: the hook callbacks that fill one test's ``RunRecord``, and its lifecycle.

Hot path (per optimizer step, outside the profiler window): a clock read and one append to each
step series (``_record_step``), then the per-step readings (``_read_step``: the one place for
them; the allocator's counters are read at evenly spaced steps, see ``StepSeries.allocated``).
Per top-level forward: grad mode, autocast and the device of the first input; per model forward
a look at its output's autograd node (see "Forwards without a backward" below). NVML is sampled
on a thread (``collect.sampler.NvmlSampler``), never on the training thread. No CUDA call is
made on a device the test did not initialise, and nothing here ever raises into the user's
code: a probe error disables the probe for the rest of the test and is reported in
``run.probe_errors``.

Forwards without a backward: a grad-mode forward of a model (a top-level module with parameters)
is *watched* by a hook on its output's autograd node, which a backward through its graph calls.
Registering and calling that hook costs more than the rest of the forward's bookkeeping, so
only the forwards that can be unreached are watched: every grad-mode forward of a model's first
``WATCH_FIRST``; after them, for a model whose first forwards were all backpropagated, only the
forwards that follow another forward of it with no backward in between (an evaluation loop
without ``no_grad``, several forwards per backward). The output node of a model's last forward
is held until the next backward, batch, step, start of a model's forward or the end of the test,
so that the first forward of such a run is watched too; a backward that follows it is taken to
go through it. (Holding it keeps that forward's graph alive a little longer than the test does,
never into the next forward or batch.) A model whose first forwards were not all backpropagated
(an EMA or teacher model run under grad mode) has every grad-mode forward watched.

What is recorded lives in ``run_record.py``; how it becomes ``RunFacts`` in
``run_facts_builder.py``. This module keeps only what steers the hooks.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from typing import Any

from pytest_gputrain.facts import DeviceSample
from pytest_gputrain.probe import compile_readings, module_readings, oom_observer, settings
from pytest_gputrain.probe import run_facts_builder as builder
from pytest_gputrain.probe.cuda_readings import (
    allocated_reader,
    allocator_backend,
    device_budget,
    device_calls,
    memory_stats,
    read_backend_flags,
)
from pytest_gputrain.probe.cupti import NO_TEARDOWN, ask_for_teardown
from pytest_gputrain.probe.facts import ForwardRecord, RunFacts
from pytest_gputrain.probe.layer_scan import scan_layers
from pytest_gputrain.probe.loader import LoaderTracker, cpu_count, first_tensor, processes_per_host
from pytest_gputrain.probe.profiler_window import ProfilerWindow
from pytest_gputrain.probe.run_record import (
    MAX_OOM_MOMENTS,
    MAX_SHAPES_SEEN,
    LoaderWaits,
    ModuleChecks,
    ModuleState,
    OomMoment,
    RunRecord,
    StepFlag,
    StepSeries,
    WatchMode,
)
from pytest_gputrain.probe.torch_hooks import Installation, is_compiling, is_tracing

_perf = time.perf_counter
MAX_MODULES = 32  # top-level modules given their own hooks per test
MAX_GRAPH_OUTPUTS = 100_000
WATCH_FIRST = 8  # grad-mode forwards of each model watched before its watch mode is chosen
NVML_INTERVAL = 0.1  # seconds between NVML samples (on the sampler thread)
PIDS_REFRESH = 2.0  # seconds between re-reads of the session's PIDs while others show up
_SETTINGS_EVERY = settings.EVERY
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
            nodeid=nodeid, warmup=warmup, profile_steps=profile_steps,
            steps=StepSeries(last_t=now),
            loader=LoaderWaits(LoaderTracker(cuda_initialized=self._cuda_initialized)))
        self.install = Installation(torch, self)
        self._compiling = is_compiling(torch)
        self._tracing = is_tracing(torch)
        # What steers the hooks (not recorded).
        self.disabled = False
        self.closed = False
        self.active: Any = None  # the top-level module whose forward is running
        self.in_backward = 0
        self.window: ProfilerWindow | None = None  # open between two step boundaries
        self._window_start = profile_steps[0] - 1 if profile_steps is not None else -1
        self._window_last = profile_steps[1] if profile_steps is not None else 0
        self._read_allocated: Callable[[], int] | None = None  # set at the first step on CUDA
        self._sampler: Any = None  # the NVML sampler thread, on CUDA runs
        self._teardown = NO_TEARDOWN  # what the open window leaves of CUPTI when it closes
        # Models with a grad-mode forward since the last backward (their ``pending`` is set),
        # and models still in their first WATCH_FIRST forwards' probation (see the docstring).
        self._pending: list[ModuleState] = []
        self._undecided: list[ModuleState] = []
        # torch's mode checks, looked up once (they run at every top-level forward).
        self._grad_enabled = torch.is_grad_enabled
        self._inference_mode = torch.is_inference_mode_enabled
        self._autocast = autocast_check(torch)
        self._tensor_type = torch.Tensor
        self._read_fraction: Callable[[], float] | None = None  # set at the first step on CUDA
        self._anomaly_enabled = torch.is_anomaly_enabled
        self._profiler_enabled = _profiler_probe(torch)
        # Steps after which a one-off reading is taken: dynamo's counters once the warm-up is
        # over, the allocator's cudaMalloc/cudaFree counters once the profiler window is too.
        self.record.cache.mark_step = max(warmup, self._window_last) + 1
        self._milestones = sorted(step for step in {warmup, self.record.cache.mark_step}
                                  if step >= 1)
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
        try:
            record.compile.start = compile_readings.read_counters()
        except Exception as exc:
            record.errors.append(f"reading dynamo's counters at the start: {exc}")
        try:
            self.install.install()
        except Exception as exc:
            self._fail("installing the probe", exc)
            record.errors.extend(self.install.remove())
        self._t_start = record.steps.last_t = _perf()

    def stop(self, cuda_ok: bool = True) -> None:
        """Remove every hook; with ``cuda_ok`` False (a sticky CUDA error) make no CUDA call."""
        if self.closed:
            return
        record = self.record
        record.duration = _perf() - self._t_start
        self.closed = True
        if oom_observer.target() == self.on_oom:
            oom_observer.set_target(None)
        try:
            record.errors.extend(self.install.remove())
        except Exception as exc:  # pragma: no cover - remove() guards each step
            record.errors.append(f"removing the probe's hooks: {exc}")
        for state in record.forwards.modules.values():
            for handle in state.handles:
                with contextlib.suppress(Exception):
                    handle.remove()
            state.handles.clear()
        if self.window is not None:
            self._stop_window(len(record.steps.times), cuda_ok=cuda_ok)
        self._count_graph_outputs()
        self._final_readings(cuda_ok)
        self._stop_nvml()
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

    # -- hook callbacks (all guarded) -----------------------------------------------------------

    def _fail(self, where: str, exc: BaseException) -> None:
        self.disabled = True
        self.record.errors.append(f"{where}: {type(exc).__name__}: {exc}")
        with contextlib.suppress(Exception):
            self.install.disarm()

    def on_optimizer_pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.record.optimizer.step_started = _perf()

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
                        optimizers.names.append(type(optimizer).__name__)
                    return
                self._first_step(optimizer)
            count = self._record_step(_perf())
            self._read_step(count)
            self._steer_window(count)
            if self._pending:
                self._settle_pending()
            if self._undecided:
                self._choose_watch_modes()
            if self.active is not None and not self.in_backward:
                self.active = None
                self.install.arm()
        except Exception as exc:
            self._fail("optimizer step hook", exc)

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
        steps.sync_waits.append(syncs.pending_wait)
        syncs.pending = 0
        syncs.pending_wait = 0.0
        steps.flags.append(_IN_WINDOW if self.window is not None else
                           _AFTER_WINDOW if steps.after_window else
                           _EPOCH_START if loader.epoch_start else _STEADY)
        steps.after_window = loader.epoch_start = False
        steps.forwards.append(record.forwards.calls)
        return len(steps.times)

    def _read_step(self, count: int) -> None:
        """The readings taken at each step boundary (``count`` steps so far): the one place
        for them. Each must cost a few attribute reads; anything dearer is taken at evenly
        spaced steps like the allocator's counters (``torch.cuda.memory_stats`` builds a dict
        of some 200 entries in C++ and takes the allocator's lock: tens of µs), or every
        ``settings.EVERY`` steps like the settings a test may change inside itself."""
        record = self.record
        steps = record.steps
        read_allocated = self._read_allocated
        if read_allocated is not None and steps.allocated_due(count - 1):
            steps.add_allocated(read_allocated())
        window = self.window
        if window is None and self._profiler_enabled():
            record.settings.user_profiler_steps += 1
        if count <= 2 or window is not None or count % _SETTINGS_EVERY == 0:
            self._read_settings(count)  # the first steps, the window, every EVERY-th
        if count == self._next_milestone:
            self._milestone(count)

    def _steer_window(self, count: int) -> None:
        """Open the profiler window at its first step's boundary, close it after its last."""
        record = self.record
        steps = record.steps
        window = self.window
        if window is not None:
            if count >= self._window_last:
                self._stop_window(count - window.first_step + 1)
                steps.after_window = True
                steps.last_t = _perf()
        elif count == self._window_start and record.devices.cuda_index is not None \
                and not record.window_facts:
            self._start_window(count + 1)
            steps.last_t = _perf()

    def on_global_forward(self, module: Any, args: Any) -> None:
        if self.disabled or self._compiling():
            return None
        try:
            state = self.record.forwards.modules.get(id(module))
            if state is None or state.ref() is not module:
                state = self._adopt(module, args)
            if not state.leaf:  # a leaf calls no module: the hook may stay armed through it
                self.install.disarm()
                self.active = module
                if self._pending and state.parameters:
                    # A model's forward comes before any backward: the held forwards are
                    # watched now, and let go before this forward allocates anything.
                    self._settle_pending()
            self._record_call(state, module, args)
        except Exception as exc:
            self._fail("forward pre hook", exc)
        return None

    def _on_module_post(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        """After a top-level forward, also when it raised (``always_call``): its inputs given
        as keyword arguments (unseen by the global hook) and its output; re-arms the hook."""
        if self.disabled or self.active is not module:
            return None
        try:
            self.active = None
            state = self.record.forwards.modules.get(id(module))
            if kwargs and state is not None:
                tensor = first_tensor(kwargs)
                if tensor is not None:
                    self._note_input(state, tensor)
            # Models only: a loss module's graph is its input's.
            if state is not None and state.parameters and self._grad_enabled():
                self._after_model_forward(state, id(module), output)
            if not self.in_backward:
                self.install.arm()
        except Exception as exc:
            self._fail("module forward hook", exc)
        return None

    def on_backward_start(self) -> None:
        # torch.compile's AOTAutograd traces the backward with autograd.grad on fake tensors,
        # under detect_anomaly(check_nan=False) for the stack traces: not the code's backward.
        if self.disabled or self._tracing():
            return
        try:
            self.record.forwards.backwards += 1
            if self._anomaly_enabled():
                self.record.settings.anomaly_backwards += 1
            self.in_backward += 1
            self.active = None
            self.install.disarm()
            if self._pending:  # the forwards this backward is taken to go through
                for state in self._pending:
                    state.pending = False
                    state.held = None
                self._pending.clear()
        except Exception as exc:
            self._fail("backward wrapper", exc)

    def on_backward_end(self) -> None:
        if self.disabled or self._tracing():
            return
        try:
            self.in_backward = max(0, self.in_backward - 1)
            if not self.in_backward and self.install.installed:
                self.install.arm()
        except Exception as exc:
            self._fail("backward wrapper", exc)

    def on_save(self) -> None:
        """A torch.save call (through ``wrap_before``, which guards it): the step it falls in
        saved a checkpoint (GT118)."""
        steps = self.record.steps
        steps.saves.append(len(steps.times))

    def on_batch(self, iterator: Any, batch: Any, wait: float) -> None:
        if self.disabled:
            return
        try:
            loader = self.record.loader
            loader.pending += wait
            if loader.tracker.on_batch(iterator, batch, wait):
                loader.epoch_start = True
            if self._pending:
                self._settle_pending()
            if self.active is not None and not self.in_backward:
                self.active = None
                self.install.arm()
        except Exception as exc:
            self._fail("DataLoader wrapper", exc)

    # -- settings in force, the moment of a failure, the test's own peaks -----------------------

    def _read_settings(self, step: int) -> None:
        """Snapshot the settings a test may change inside itself (``settings.py``)."""
        timeline = self.record.settings
        timeline.reads += 1
        now = settings.read_settings(self.torch, self._read_fraction)
        if not timeline.snapshots or timeline.snapshots[-1][1] != now:
            timeline.snapshots.append((step, now))

    def on_oom(self, device: int, requested: int, limit: int, free: int) -> None:
        """The allocator's out-of-memory observer (``oom_observer.py``), at the failure itself:
        on the failing thread, before the test's ``finally:`` blocks run. Reads NVML only."""
        record = self.record
        moment = OomMoment(t=_perf(), step=len(record.steps.times), device_index=device,
                           requested=requested, limit=limit, free=free)
        try:
            from pytest_gputrain.collect import nvml
            from pytest_gputrain.probe.failures import read_other_processes

            index = record.nvml.index if device == record.devices.cuda_index else None
            if index is None:
                index = nvml.index_for_cuda_device(device)
            pids = record.nvml.session_pids or nvml.session_process_ids()
            others = read_other_processes(index, pids) if index is not None else None
            if others is not None:
                moment.other_processes, moment.other_process_count = others
        except Exception as exc:
            record.errors.append(f"NVML at the out-of-memory error: {exc}")
        del record.oom_moments[:-MAX_OOM_MOMENTS + 1]
        record.oom_moments.append(moment)

    def on_reset_peak(self, device: Any) -> None:
        """Before the test resets the allocator's peak statistics itself: keep the peaks so far
        (the test's own, since the probe reset them when it started)."""
        index = self.record.devices.cuda_index
        torch = self.torch
        if index is None or not torch.cuda.is_initialized():
            return
        wanted = torch.cuda.current_device() if device is None else \
            torch.cuda._utils._get_device_index(device, optional=True)
        if int(wanted) != index:
            return
        stats = memory_stats(torch, index)
        kept = self.record.allocator.peaks_before_reset
        for key in ("allocated_bytes.all.peak", "reserved_bytes.all.peak"):
            kept[key] = max(kept.get(key, 0), int(stats.get(key, 0)))

    def on_gradcheck(self) -> None:
        if self.record.steps.times:
            self.record.settings.gradcheck_calls += 1

    def failure_context(self) -> dict[str, Any]:
        """What the probe saw up to a failure, for ``failures.build_failure``: the last
        out-of-memory moment, the last settings read, other processes' memory in the last
        samples taken while the test ran, and the allocator when the test started."""
        record = self.record
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

    # -- per top-level forward ------------------------------------------------------------------

    def _record_call(self, state: ModuleState, module: Any, args: Any) -> None:
        forwards = self.record.forwards
        state.calls += 1
        forwards.calls += 1
        grad = self._grad_enabled()
        if grad:
            state.grad_calls += 1
            forwards.grad += 1
        else:
            forwards.no_grad += 1
        if self._inference_mode():
            state.inference_calls += 1
        if self._autocast():
            state.autocast_calls += 1
            forwards.autocast += 1
        if getattr(module, "training", False):
            state.training_calls += 1
        checks = state.checks
        if checks is not None:
            self._check_forward(checks, state, module, grad)
        if state.first_param is not None and state.first_param.device != state.first_device:
            state.scan(module)  # the model moved since its last forward
        forwards.last = (state.name, state.param_devices, [], grad)
        first = args[0] if args else None
        tensor = first if isinstance(first, self._tensor_type) else first_tensor(args)
        if tensor is not None:
            self._note_input(state, tensor)

    def _note_input(self, state: ModuleState, tensor: Any) -> None:
        forwards = self.record.forwards
        device = tensor.device
        if device != state.last_device:
            state.last_device = device
            state.last_device_name = str(device)
            state.input_devices.add(state.last_device_name)
            if state.last_device_name not in forwards.input_devices:
                forwards.input_devices.append(state.last_device_name)
            if device.type == "cuda":
                oom_observer.attach(self.torch)  # an OOM may come before the first step
        name = state.last_device_name
        shape = tensor.shape
        if shape != state.last_shape:
            state.last_shape = shape
            key = tuple(int(n) for n in shape)
            if key not in state.input_shapes and len(state.input_shapes) < 8:
                state.input_shapes.append(key)
            self._note_shape(state, key)
            if forwards.input_batch is None and key:
                forwards.input_batch = key[0]
        last = forwards.last
        if last is not None and name not in last[2]:
            last[2].append(name)

    def _note_shape(self, state: ModuleState, key: tuple[int, ...]) -> None:
        """Count a distinct input shape; date the first sight of each one after step 1."""
        if key in state.shapes_seen or len(state.shapes_seen) >= MAX_SHAPES_SEEN:
            return
        state.shapes_seen.add(key)
        step = len(self.record.steps.times)  # index of the step this forward belongs to
        if step >= 1 and (not state.new_shape_steps or state.new_shape_steps[-1] != step):
            state.new_shape_steps.append(step)

    # -- forwards without a backward (see the module docstring) ------------------------------

    def _after_model_forward(self, state: ModuleState, module_id: int, output: Any) -> None:
        """A grad-mode forward of a model ended: hold its output node, or watch it."""
        nodes = _graph_nodes(output, self._tensor_type)
        modes = self.record.modes
        in_eval_mode = modes.graph_pending == module_id  # set by _check_forward for this call
        modes.graph_pending = 0
        if not nodes:
            return
        if in_eval_mode:  # a grad-mode forward in eval mode: always watched (GT121)
            cell = self._watch(nodes)
            if cell is not None:
                modes.eval_graph_outputs.append(cell)
        elif state.watch_mode is WatchMode.STREAKS and not state.pending:
            state.held = nodes  # watched only if no backward comes first
        else:
            cell = self._watch(nodes)
            if state.watch_mode is WatchMode.PROBATION and cell is not None \
                    and len(state.first_cells) < WATCH_FIRST:
                state.first_cells.append(cell)
                if len(state.first_cells) == WATCH_FIRST:
                    self._undecided.append(state)
        if not state.pending:
            state.pending = True
            self._pending.append(state)

    def _settle_pending(self) -> None:
        """Something other than a backward came after the held forwards: watch them now."""
        for state in self._pending:
            if state.held is not None:
                self._watch(state.held)
                state.held = None

    def _choose_watch_modes(self) -> None:
        """At the step after a model's first WATCH_FIRST grad-mode forwards (their backwards
        have run): streaks only if every one of them was backpropagated, else every forward."""
        for state in self._undecided:
            reached = all(cell[0] for cell in state.first_cells)
            state.watch_mode = WatchMode.STREAKS if reached else WatchMode.EVERY
            state.first_cells.clear()
        self._undecided.clear()

    def _watch(self, nodes: list[Any]) -> list[bool] | None:
        """Hook autograd nodes of one forward's outputs: a backward that runs through any of
        them marks the forward as trained on (the hook holds no probe)."""
        outputs = self.record.forwards.graph_outputs
        if len(outputs) >= MAX_GRAPH_OUTPUTS:
            return None
        cell = [False]

        def reached(*_: Any, cell: list[bool] = cell) -> None:
            cell[0] = True

        for node in nodes:
            register = getattr(node, "register_prehook", None) or node.register_hook
            register(reached)
        outputs.append(cell)
        return cell

    # -- once per module, optimizer or device ---------------------------------------------------

    def _cuda_initialized(self) -> bool:
        try:
            return bool(self.torch.cuda.is_initialized())
        except Exception:
            return False

    def _adopt(self, module: Any, args: Any = ()) -> ModuleState:
        modules = self.record.forwards.modules
        state = ModuleState(module)
        state.scan(module)
        try:
            conv = self.torch.nn.modules.conv._ConvNd
            state.conv_layers = sum(1 for sub in module.modules() if isinstance(sub, conv))
        except Exception:
            state.conv_layers = None
        state.checks = self._module_checks(module)
        try:
            state.layers = scan_layers(self.torch, module, args)
        except Exception as exc:  # an exotic module: its layers stay unknown
            self.record.errors.append(f"reading the layers of {state.name}: {exc}")
        # A leaf without parameters (a loss, an activation) gets no hooks of its own: the
        # global hook stays armed through its call, as nothing inside it is a module call.
        state.leaf = not state.parameters and next(iter(module.children()), None) is None
        if len(modules) < MAX_MODULES and not state.leaf:
            try:
                self._hook_module(module, state)
            except Exception:  # e.g. a ScriptModule refuses hooks: re-armed at the next step
                for handle in state.handles:
                    handle.remove()
                state.handles.clear()
        modules[id(module)] = state
        return state

    def _hook_module(self, module: Any, state: ModuleState) -> None:
        try:
            handle = module.register_forward_hook(self._on_module_post, with_kwargs=True,
                                                  always_call=True)
        except TypeError:  # torch < 2.1: no always_call; re-armed at the next step/batch
            handle = module.register_forward_hook(self._on_module_post, with_kwargs=True)
        state.handles.append(handle)

    def _first_step(self, optimizer: Any) -> None:
        torch = self.torch
        optimizers, devices = self.record.optimizers, self.record.devices
        optimizers.primary = optimizer
        optimizers.ids.add(id(optimizer))
        optimizers.names.append(type(optimizer).__name__)
        readings = self.record.optimizer
        readings.name = type(optimizer).__name__
        readings.foreach, readings.fused, readings.param_tensors = \
            module_readings.optimizer_setup(optimizer)
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
            return
        devices.device = str(first.device)
        if first.device.type == "cuda":
            index = first.device.index
            devices.cuda_index = int(torch.cuda.current_device()) if index is None else int(index)
            devices.device = f"cuda:{devices.cuda_index}"
            self._setup_cuda(devices.cuda_index)

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
        self._read_allocated = allocated_reader(torch, index)
        self._read_fraction = settings.fraction_reader(torch, index)
        oom_observer.attach(torch)
        if self.use_sampler:
            self._start_nvml(index)

    # -- NVML timeline and profiler window ------------------------------------------------------

    def _start_nvml(self, cuda_index: int) -> None:
        """Sample NVML every NVML_INTERVAL seconds on a thread, off the training thread.

        The thread does not change what Python 3.12+ says when a DataLoader forks its
        workers: torch's own threads (CUDA's, the intra-op pool's) already make the process
        multi-threaded, and that warning already comes without the probe."""
        timeline = self.record.nvml
        try:
            from pytest_gputrain.collect import nvml
            from pytest_gputrain.collect.sampler import NvmlSampler

            if not nvml.shared().available:
                return
            index = nvml.index_for_cuda_device(cuda_index)
            if index is None:
                return
            timeline.index = index
            timeline.power_limit, timeline.power_limit_default = (
                reading.value if reading.ok else None
                for reading in nvml.read_power_limits(index))
            timeline.session_pids = nvml.session_process_ids()
            timeline.pids_read = _perf()
            self._sampler = NvmlSampler(index, NVML_INTERVAL, read=self._nvml_read).start()
        except Exception as exc:
            timeline.index = None
            self.record.errors.append(f"NVML sampling not started: {exc}")

    def _stop_nvml(self) -> None:
        """Stop the sampler (it takes a last sample) and keep its timeline."""
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return
        try:
            timeline = self.record.nvml
            timeline.before_stop = len(sampler.samples)
            sampler.stop()  # and one last sample, after the test
            timeline.samples = sampler.samples
        except Exception as exc:
            self.record.errors.append(f"NVML sampling: {exc}")

    def _nvml_read(self, index: int) -> DeviceSample | None:
        """One sample, on the sampler thread: this process's memory and other processes'
        (``session_pids`` re-read while others show up: a sibling started since is no other)."""
        from pytest_gputrain.collect import nvml

        timeline = self.record.nvml
        now = _perf()
        if timeline.other_seen and now - timeline.pids_read >= PIDS_REFRESH:
            timeline.session_pids = nvml.session_process_ids()
            timeline.pids_read = now
        sample = nvml.read_sample(index, pids=[os.getpid()], session_pids=timeline.session_pids)
        timeline.other_seen = bool(sample is not None and sample.other_process_count)
        return sample

    def _start_window(self, first_step: int) -> None:
        busy = ProfilerWindow.busy_reason(self.torch)
        if busy is not None:
            self.record.window_facts = {"captured": False, "reason": busy}
            return
        teardown = ask_for_teardown(self.torch)
        window = ProfilerWindow(self.torch, self.record.devices.cuda_index or 0)
        try:
            window.start(first_step)
        except Exception as exc:
            self.record.window_facts = {"captured": False,
                                  "reason": f"torch.profiler did not start: {exc}"}
            return
        self.window = window
        self._teardown = teardown

    def _stop_window(self, steps: int, cuda_ok: bool = True) -> None:
        window, self.window = self.window, None
        if window is None:
            return
        record = self.record
        try:
            record.window_facts = window.stop(max(1, steps), cuda_ok=cuda_ok)
            record.window_facts["cupti_teardown"] = self._teardown.on
            record.window_facts["cupti_teardown_reason"] = self._teardown.reason
            if cuda_ok and record.devices.cuda_index is not None:
                record.allocator.window = memory_stats(self.torch, record.devices.cuda_index)
        except Exception as exc:
            record.window_facts = {"captured": False,
                             "reason": f"profiler window failed: {type(exc).__name__}: {exc}"}

    def _count_graph_outputs(self) -> None:
        forwards = self.record.forwards
        # A held forward had no backward up to the test's end: none can reach it now.
        held = sum(1 for state in self._pending if state.held is not None)
        for state in self._pending:
            state.held = None
        self._pending.clear()
        self._undecided.clear()
        forwards.without_backward = held + sum(
            1 for cell in forwards.graph_outputs if not cell[0])
        forwards.graph_outputs.clear()
        modes = self.record.modes
        modes.trained_in_eval = sum(1 for cell in modes.eval_graph_outputs if cell[0])
        modes.eval_graph_outputs.clear()

    # -- habits: train/eval mode, DDP sync, torch.compile, empty_cache --------------------------
    # Per top-level forward: nothing for a module without mode layers that is not DDP; else a
    # few attribute reads. Per step: one comparison (the milestones). The rest runs once.

    def _module_checks(self, module: Any) -> ModuleChecks | None:
        record = self.record
        wrapped = module_readings.compiled_wrapper_target(module)
        if wrapped is not None:
            if wrapped not in record.compile.wrapped:
                record.compile.wrapped.append(wrapped)
            record.compile.wraps_ddp |= module_readings.wraps_data_parallel(wrapped)
        try:
            layers, batch_norm = module_readings.mode_layers(self.torch, module)
        except Exception as exc:
            record.errors.append(f"counting mode layers: {exc}")
            layers, batch_norm = 0, None
        ddp = module_readings.ddp_module(module)
        if ddp is not None and record.ddp.world_size is None:
            record.ddp.world_size = module_readings.ddp_world_size(ddp)
        if not layers and ddp is None:
            return None
        return ModuleChecks(layers, module_readings.innermost(module), ddp, batch_norm)

    def _check_forward(self, checks: ModuleChecks, state: ModuleState, module: Any,
                       grad: bool) -> None:
        record = self.record
        if checks.mode_layers:
            target = checks.target()
            training = bool(getattr(target, "training", False))
            if grad and not training:
                record.modes.graph_pending = id(module)
            elif training and not grad and self._is_evaluation(checks, state):
                record.modes.eval_in_train += 1
        if checks.ddp is not None and grad:
            ddp = checks.ddp()
            if ddp is not None:
                self._ddp_forward(ddp)

    @staticmethod
    def _is_evaluation(checks: ModuleChecks, state: ModuleState) -> bool:
        """A no-grad forward in training mode evaluates the model, except for a frozen model
        (an EMA or teacher copy: parameters without requires_grad) and batch-norm
        recalibration (``update_bn`` sets momentum None on purpose)."""
        first = state.first_param
        if first is not None and not first.requires_grad:
            return False
        norm = checks.batch_norm() if checks.batch_norm is not None else None
        return norm is None or norm.momentum is not None

    def _ddp_forward(self, ddp: Any) -> None:
        readings = self.record.ddp
        index = len(self.record.steps.times)
        counts = readings.steps.get(index)
        if counts is None:
            counts = readings.steps[index] = [0, 0]
            if index >= readings.next_read:  # a few reads per test: log2(steps)
                readings.next_read = 2 * index
                try:
                    readings.logging = module_readings.ddp_logging(ddp)
                except Exception as exc:
                    readings.next_read = 1 << 62
                    self.record.errors.append(f"reading DDP's logging data: {exc}")
        counts[0] += 1
        if getattr(ddp, "require_backward_grad_sync", True):
            counts[1] += 1

    def _milestone(self, count: int) -> None:
        record = self.record
        if count == record.warmup:
            record.compile.warm = compile_readings.read_counters()
        if count == record.cache.mark_step and record.devices.cuda_index is not None:
            record.cache.mark = device_calls(self.torch, record.devices.cuda_index)
        later = [step for step in self._milestones if step > count]
        self._next_milestone = later[0] if later else -1

    def _final_readings(self, cuda_ok: bool) -> None:
        record = self.record
        try:
            record.compile.end = compile_readings.read_counters()
            record.compile.new_recompile_reasons = compile_readings.new_guard_failures(
                None if record.compile.reset_steps else record.compile.start)
        except Exception as exc:
            record.errors.append(f"reading dynamo's counters at the end: {exc}")
        cache = record.cache
        if cuda_ok and cache.mark is not None and record.devices.cuda_index is not None:
            try:
                cache.end = device_calls(self.torch, record.devices.cuda_index)
            except Exception as exc:
                record.errors.append(f"reading the allocator's call counters: {exc}")
        for state in record.forwards.modules.values():  # DDP's logging data, if still alive
            ddp = state.checks.ddp() if state.checks and state.checks.ddp else None
            if ddp is not None:
                try:
                    record.ddp.logging = module_readings.ddp_logging(ddp) or record.ddp.logging
                except Exception as exc:
                    record.errors.append(f"reading DDP's logging data: {exc}")

    def on_dynamo_reset(self) -> None:
        """``torch._dynamo.reset()`` ran (its wrapper guards this)."""
        self.record.compile.reset_steps.append(len(self.record.steps.times))

    def on_compile_start(self, *_: Any) -> None:
        """Dynamo is about to compile a frame (called by dynamo, with the compile's arguments
        in recent torch and none in some earlier versions; must never raise). The sync
        wrappers go even when the probe disabled itself: dynamo would trace into them."""
        try:
            steps = len(self.record.steps.times)
            if not self.disabled:
                self.record.compile.compile_steps.append(steps)
            if self.record.syncs.stopped_at is None:
                self.record.syncs.stopped_at = steps
                self.record.errors.extend(self.install.drop_sync_wrappers())
        except Exception:
            pass

    def on_empty_cache_start(self) -> dict[str, int] | None:
        """``torch.cuda.empty_cache()`` is about to free the cache; returns the allocator's call
        counters when the frees it makes must be told apart from the allocator's own."""
        if self.disabled:
            return None
        try:
            cache = self.record.cache
            cache.empty_cache_calls += 1
            cache.empty_cache_steps.append(len(self.record.steps.times))
            index = self.record.devices.cuda_index
            if cache.mark is not None and index is not None:
                return device_calls(self.torch, index)
        except Exception as exc:
            self._fail("empty_cache wrapper", exc)
        return None

    def on_empty_cache_end(self, before: dict[str, int] | None) -> None:
        if before is None or self.disabled:
            return
        try:
            index = self.record.devices.cuda_index
            after = device_calls(self.torch, index) if index is not None else None
            if after is not None:
                self.record.cache.frees_by_empty_cache += max(
                    0, after["num_device_free"] - before["num_device_free"])
        except Exception as exc:
            self._fail("empty_cache wrapper", exc)


def _graph_nodes(output: Any, tensor_type: Any) -> list[Any]:
    """The autograd nodes of up to 4 outputs of a forward (the common case, one tensor, first)."""
    if isinstance(output, tensor_type):
        node = output.grad_fn
        return [node] if node is not None else []
    return [tensor.grad_fn for tensor in _graph_tensors(output)]


def _graph_tensors(value: Any, depth: int = 0, found: list[Any] | None = None) -> list[Any]:
    """Up to 4 tensors with an autograd graph in a module's output (tensor, tuple, dict...)."""
    found = [] if found is None else found
    if len(found) >= 4:
        return found
    if hasattr(value, "requires_grad") and hasattr(value, "grad_fn"):
        if value.grad_fn is not None:
            found.append(value)
        return found
    if depth >= 2:
        return found
    items: list[Any] = []
    if isinstance(value, dict) or (hasattr(value, "values") and hasattr(value, "keys")):
        try:
            items = list(value.values())
        except Exception:
            return found
    elif isinstance(value, list | tuple):
        items = list(value)
    for item in items[:8]:
        _graph_tensors(item, depth + 1, found)
    return found


def _profiler_probe(torch: Any) -> Callable[[], bool]:
    """``torch.autograd`` profiler state: True while a profiler records on this thread
    (``torch.profiler.profile`` in an active phase, ``emit_nvtx``, the legacy profiler)."""
    function = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
    if callable(function):
        return function  # type: ignore[no-any-return]
    return lambda: False


def autocast_check(torch: Any) -> Callable[[], bool]:
    """A call that tells whether CUDA autocast is on (torch < 2.4 takes no device)."""
    try:
        torch.is_autocast_enabled("cuda")
    except TypeError:
        return torch.is_autocast_enabled  # type: ignore[no-any-return]
    return functools.partial(torch.is_autocast_enabled, "cuda")
