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

from pytest_gputrain.probe import run_facts_builder as builder
from pytest_gputrain.probe.cuda_readings import (
    allocated_reader,
    device_budget,
    memory_stats,
    read_backend_flags,
)
from pytest_gputrain.probe.cupti import NO_TEARDOWN, ask_for_teardown
from pytest_gputrain.probe.loader import LoaderTracker, cpu_count, first_tensor, processes_per_host
from pytest_gputrain.probe.profiler_window import ProfilerWindow
from pytest_gputrain.probe.run_record import (
    LoaderWaits,
    ModuleState,
    RunRecord,
    StepFlag,
    StepSeries,
    WatchMode,
)
from pytest_gputrain.probe.torch_hooks import Installation, is_compiling
from pytest_gputrain.run_facts import ForwardRecord, RunFacts

_perf = time.perf_counter
MAX_MODULES = 32  # top-level modules given their own hooks per test
MAX_GRAPH_OUTPUTS = 100_000
WATCH_FIRST = 8  # grad-mode forwards of each model watched before its watch mode is chosen
NVML_INTERVAL = 0.1  # seconds between NVML samples (on the sampler thread)
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
        except Exception as exc:  # e.g. an earlier test left the context broken
            record.errors.append(f"reading the allocator at the start: {exc}")
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
        """Close the step that ends now: its time, loader wait, syncs and flag. Returns the
        number of steps so far."""
        record = self.record
        steps, loader, syncs = record.steps, record.loader, record.syncs
        steps.times.append(now - steps.last_t)
        steps.last_t = now
        steps.waits.append(loader.pending)
        loader.pending = 0.0
        steps.syncs.append(syncs.pending)
        syncs.pending = 0
        steps.flags.append(_IN_WINDOW if self.window is not None else
                           _AFTER_WINDOW if steps.after_window else
                           _EPOCH_START if loader.epoch_start else _STEADY)
        steps.after_window = loader.epoch_start = False
        return len(steps.times)

    def _read_step(self, count: int) -> None:
        """The readings taken at each step boundary (``count`` steps so far): the one place
        for them. Each must cost a few attribute reads; anything dearer is taken at evenly
        spaced steps like the allocator's counters (``torch.cuda.memory_stats`` builds a dict
        of some 200 entries in C++ and takes the allocator's lock: tens of µs)."""
        steps = self.record.steps
        read_allocated = self._read_allocated
        if read_allocated is not None and steps.allocated_due(count - 1):
            steps.add_allocated(read_allocated())

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
                state = self._adopt(module)
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
                self._after_model_forward(state, output)
            if not self.in_backward:
                self.install.arm()
        except Exception as exc:
            self._fail("module forward hook", exc)
        return None

    def on_backward_start(self) -> None:
        if self.disabled:
            return
        try:
            self.record.forwards.backwards += 1
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
        if self.disabled:
            return
        try:
            self.in_backward = max(0, self.in_backward - 1)
            if not self.in_backward and self.install.installed:
                self.install.arm()
        except Exception as exc:
            self._fail("backward wrapper", exc)

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
        name = state.last_device_name
        shape = tensor.shape
        if shape != state.last_shape:
            state.last_shape = shape
            key = tuple(int(n) for n in shape)
            if key not in state.input_shapes and len(state.input_shapes) < 8:
                state.input_shapes.append(key)
            if forwards.input_batch is None and key:
                forwards.input_batch = key[0]
        last = forwards.last
        if last is not None and name not in last[2]:
            last[2].append(name)

    # -- forwards without a backward (see the module docstring) ------------------------------

    def _after_model_forward(self, state: ModuleState, output: Any) -> None:
        """A grad-mode forward of a model ended: hold its output node, or watch it."""
        nodes = _graph_nodes(output, self._tensor_type)
        if not nodes:
            return
        if state.watch_mode is WatchMode.STREAKS and not state.pending:
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

    def _adopt(self, module: Any) -> ModuleState:
        modules = self.record.forwards.modules
        state = ModuleState(module)
        state.scan(module)
        try:
            conv = self.torch.nn.modules.conv._ConvNd
            state.conv_layers = sum(1 for sub in module.modules() if isinstance(sub, conv))
        except Exception:
            state.conv_layers = None
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
        self._read_allocated = allocated_reader(torch, index)
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
            self._sampler = NvmlSampler(index, NVML_INTERVAL, pids=[os.getpid()]).start()
        except Exception as exc:
            timeline.index = None
            self.record.errors.append(f"NVML sampling not started: {exc}")

    def _stop_nvml(self) -> None:
        """Stop the sampler (it takes a last sample) and keep its timeline."""
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return
        try:
            sampler.stop()
            self.record.nvml.samples = sampler.samples
        except Exception as exc:
            self.record.errors.append(f"NVML sampling: {exc}")

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


def autocast_check(torch: Any) -> Callable[[], bool]:
    """A call that tells whether CUDA autocast is on (torch < 2.4 takes no device)."""
    try:
        torch.is_autocast_enabled("cuda")
    except TypeError:
        return torch.is_autocast_enabled  # type: ignore[no-any-return]
    return functools.partial(torch.is_autocast_enabled, "cuda")

