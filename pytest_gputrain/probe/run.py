"""``RunProbe``: what one test's training did, filled by the global hooks, turned into RunFacts.

Hot path (per optimizer step, outside the profiler window): a clock read, a few list appends
and, on CUDA, one read of the allocator's host-side counter (no synchronisation). Per top-level
forward: a grad-mode/autocast check and the device of the first input. No CUDA call is made on
a device the test did not initialise, and nothing here ever raises into the user's code: a probe
error disables the probe for the rest of the test and is reported in ``run.probe_errors``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import statistics
import time
import weakref
from typing import Any

from pytest_gputrain.probe.loader import LoaderTracker, cpu_count, first_tensor, processes_per_host
from pytest_gputrain.probe.profiler_window import ProfilerWindow
from pytest_gputrain.probe.torch_hooks import Installation, is_compiling
from pytest_gputrain.run_facts import (
    ForwardRecord,
    LoaderFacts,
    LoaderRecord,
    MemoryFacts,
    ModuleRecord,
    NvmlRunFacts,
    ProfileFacts,
    RunFacts,
    SyncFacts,
)

_perf = time.perf_counter
MAX_MODULES = 32  # top-level modules given their own hooks per test
MAX_GRAPH_OUTPUTS = 100_000
MAX_SERIES = 4096  # per-step series are thinned beyond this
NVML_INTERVAL = 0.25  # seconds between NVML samples, read at step boundaries
THROTTLE_BITS = 0x8 | 0x20 | 0x40 | 0x80  # HW slowdown, SW/HW thermal, HW power brake
POWER_CAP_BIT = 0x4


class ModuleState:
    __slots__ = ("autocast_calls", "calls", "conv_layers", "first_device", "first_param",
                 "grad_calls", "handles", "inference_calls", "input_devices", "input_shapes",
                 "last_device", "last_device_name", "last_shape", "name", "param_devices",
                 "param_dtypes", "parameters", "ref", "training_calls")

    def __init__(self, module: Any) -> None:
        self.name = type(module).__name__
        self.ref = weakref.ref(module)
        self.handles: list[Any] = []
        self.calls = self.grad_calls = self.inference_calls = 0
        self.autocast_calls = self.training_calls = 0
        self.param_devices: list[str] = []
        self.param_dtypes: list[str] = []
        self.first_param: Any = None
        self.first_device: Any = None
        self.input_devices: set[str] = set()
        self.input_shapes: list[tuple[int, ...]] = []
        self.last_device: Any = None
        self.last_device_name = ""
        self.last_shape: Any = None
        self.parameters: int | None = None
        self.conv_layers: int | None = None

    def scan(self, module: Any) -> None:
        devices: list[str] = []
        dtypes: list[str] = []
        count = 0
        first = None
        for param in module.parameters():
            if first is None:
                first = param
            device, dtype = str(param.device), str(param.dtype).removeprefix("torch.")
            if device not in devices:
                devices.append(device)
            if dtype not in dtypes:
                dtypes.append(dtype)
            count += param.numel()
        self.param_devices, self.param_dtypes, self.parameters = devices, dtypes, count
        self.first_param = first
        self.first_device = first.device if first is not None else None


class RunProbe:
    """One test call's probe. ``start()`` installs the hooks, ``stop()`` removes them."""

    def __init__(self, torch: Any, nodeid: str, profile_steps: tuple[int, int] | None = (3, 6),
                 warmup: int = 2, sampler: bool = True, reset_peak: bool = True) -> None:
        self.torch = torch
        self.nodeid = nodeid
        self.profile_steps = profile_steps
        self.warmup = warmup
        self.use_sampler = sampler
        self.reset_peak = reset_peak
        self.install = Installation(torch, self)
        self._compiling = is_compiling(torch)
        self.disabled = False
        self.closed = False
        self.errors: list[str] = []
        # steps
        self.t_start = self.last_t = _perf()
        self.duration: float | None = None
        self.primary: Any = None
        self.optimizer_ids: set[int] = set()
        self.optimizer_names: list[str] = []
        self.optimizer_steps = 0
        self.step_times: list[float] = []
        self.step_waits: list[float] = []
        self.step_syncs: list[int] = []
        self.step_alloc: list[int] = []
        # 0 steady, 1 in the profiler window, 2 right after it, 3 started a later epoch
        # (worker start-up: reported as run.loader.epoch_start_*, not as steady loader wait)
        self.step_flags: list[int] = []
        self.after_window = False
        self.epoch_start = False
        # accumulators between step boundaries
        self.wait_acc = 0.0
        self.sync_acc = 0
        self.sync_total = 0
        self.sync_by_call: dict[str, int] = {}
        # forwards and backwards
        self.modules: dict[int, ModuleState] = {}
        self.active: Any = None
        self.kwargs_pending = False
        self.forwards = self.grad_forwards = self.no_grad_forwards = self.autocast_forwards = 0
        self.backwards = 0
        self.in_backward = 0
        self.graph_outputs: list[list[bool]] = []
        self.without_backward = 0
        self.input_devices: list[str] = []
        self.input_batch: int | None = None
        # (module name, its parameter devices, this call's input devices, grad mode)
        self._last_forward: tuple[str, list[str], list[str], bool] | None = None
        # device and memory
        self.param_devices: list[str] = []
        self.param_dtypes: list[str] = []
        self.cuda_index: int | None = None
        self.device: str | None = None
        self.device_name: str | None = None
        self.compute_capability: str | None = None
        self.backend_flags: dict[str, Any] = {}
        self._read_allocated: Any = None
        self.start_stats: dict[int, dict[str, Any]] = {}
        self.window_stats: dict[str, Any] = {}
        self.end_stats: dict[str, Any] = {}
        self.cuda_was_initialized = False
        self.cuda_available: bool | None = None
        # loader, window, sampler
        self.loader = LoaderTracker(cuda_initialized=self._cuda_initialized)
        self.window: ProfilerWindow | None = None
        self.window_facts: dict[str, Any] = {}
        self.nvml_index: int | None = None
        self.nvml_samples: list[Any] = []
        self.nvml_last = 0.0
        self.nvml_started = 0.0

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        torch = self.torch
        try:  # before the test runs: no CUDA context is created, none can be broken yet
            self.cuda_available = bool(torch.cuda.is_available())
        except Exception as exc:
            self.errors.append(f"torch.cuda.is_available(): {exc}")
        try:
            self.cuda_was_initialized = self._cuda_initialized()
            if self.cuda_was_initialized:
                index = int(torch.cuda.current_device())
                if self.reset_peak:
                    torch.cuda.reset_peak_memory_stats(index)
                self.start_stats = {index: self._memory_stats(index)}
        except Exception as exc:  # e.g. an earlier test left the context broken
            self.errors.append(f"reading the allocator at the start: {exc}")
        try:
            self.install.install()
        except Exception as exc:
            self._fail("installing the probe", exc)
            self.errors.extend(self.install.remove())
        self.t_start = self.last_t = _perf()

    def stop(self, cuda_ok: bool = True) -> None:
        """Remove every hook; with ``cuda_ok`` False (a sticky CUDA error) make no CUDA call."""
        if self.closed:
            return
        self.duration = _perf() - self.t_start
        self.closed = True
        try:
            self.errors.extend(self.install.remove())
        except Exception as exc:  # pragma: no cover - remove() guards each step
            self.errors.append(f"removing the probe's hooks: {exc}")
        for state in self.modules.values():
            for handle in state.handles:
                with contextlib.suppress(Exception):
                    handle.remove()
            state.handles.clear()
        if self.window is not None:
            self._stop_window(len(self.step_times), cuda_ok=cuda_ok)
        self._count_graph_outputs()
        if self.nvml_index is not None:
            try:
                self._nvml_sample(_perf())
            except Exception as exc:
                self.errors.append(f"NVML sample: {exc}")
        if cuda_ok and self.cuda_index is not None:
            try:
                self.end_stats = self._memory_stats(self.cuda_index)
                self._read_device_budget()
            except Exception as exc:
                self.errors.append(f"reading the allocator at the end: {exc}")
        self.primary = None

    # -- hook callbacks (all guarded) -----------------------------------------------------------

    def _fail(self, where: str, exc: BaseException) -> None:
        self.disabled = True
        self.errors.append(f"{where}: {type(exc).__name__}: {exc}")
        with contextlib.suppress(Exception):
            self.install.disarm()

    def on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.disabled or self._compiling():
            return
        try:
            self.optimizer_steps += 1
            if self.primary is None:
                self._first_step(optimizer)
            elif optimizer is not self.primary:
                if id(optimizer) not in self.optimizer_ids:
                    self.optimizer_ids.add(id(optimizer))
                    self.optimizer_names.append(type(optimizer).__name__)
                return
            now = _perf()
            self.step_times.append(now - self.last_t)
            self.last_t = now
            self.step_waits.append(self.wait_acc)
            self.wait_acc = 0.0
            self.step_syncs.append(self.sync_acc)
            self.sync_acc = 0
            if self._read_allocated is not None:
                self.step_alloc.append(self._read_allocated())
                if self.nvml_index is not None and now - self.nvml_last >= NVML_INTERVAL:
                    self._nvml_sample(now)
            self.step_flags.append(1 if self.window is not None else
                                   2 if self.after_window else 3 if self.epoch_start else 0)
            self.after_window = self.epoch_start = False
            steps = len(self.step_times)
            if self.window is not None:
                if steps >= self.window_last:
                    self._stop_window(steps - self.window.first_step + 1)
                    self.after_window = True
                    self.last_t = _perf()
            elif self.profile_steps is not None and steps == self.profile_steps[0] - 1 \
                    and self.cuda_index is not None and not self.window_facts:
                self._start_window(steps + 1)
                self.last_t = _perf()
            if self.active is not None and not self.in_backward:
                self.active = None
                self.install.arm()
        except Exception as exc:
            self._fail("optimizer step hook", exc)

    def on_global_forward(self, module: Any, args: Any) -> None:
        if self.disabled or self._compiling():
            return None
        try:
            self.install.disarm()
            self.active = module
            state = self.modules.get(id(module))
            if state is None or state.ref() is not module:
                state = self._adopt(module)
            self._record_call(state, module, args)
            self.kwargs_pending = bool(state.handles)
        except Exception as exc:
            self._fail("forward pre hook", exc)
        return None

    def _on_module_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        if self.disabled or not self.kwargs_pending or self.active is not module:
            return None
        try:
            self.kwargs_pending = False
            if kwargs:
                tensor = first_tensor(kwargs)
                if tensor is not None:
                    self._note_input(self.modules[id(module)], tensor)
        except Exception as exc:
            self._fail("module forward pre hook", exc)
        return None

    def _on_module_post(self, module: Any, args: Any, output: Any) -> None:
        if self.disabled or self.active is not module:
            return None
        try:
            self.active = None
            self.kwargs_pending = False
            state = self.modules.get(id(module))
            if state is not None and state.parameters and self.torch.is_grad_enabled() \
                    and len(self.graph_outputs) < MAX_GRAPH_OUTPUTS:
                self._watch_graph(output)  # models only: a loss module's graph is its input's
            if not self.in_backward:
                self.install.arm()
        except Exception as exc:
            self._fail("module forward hook", exc)
        return None

    def _watch_graph(self, output: Any) -> None:
        """Hook the autograd nodes of a grad-mode forward's outputs: a backward that runs
        through any of them marks the forward as trained on (the hook holds no probe)."""
        nodes = [tensor.grad_fn for tensor in _graph_tensors(output)]
        if not nodes:
            return
        record = [False]

        def reached(*_: Any, record: list[bool] = record) -> None:
            record[0] = True

        for node in nodes:
            register = getattr(node, "register_prehook", None) or node.register_hook
            register(reached)
        self.graph_outputs.append(record)

    def on_backward_start(self) -> None:
        if self.disabled:
            return
        try:
            self.backwards += 1
            self.in_backward += 1
            self.active = None
            self.install.disarm()
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
            self.wait_acc += wait
            if self.loader.on_batch(iterator, batch, wait):
                self.epoch_start = True
            if self.active is not None and not self.in_backward:
                self.active = None
                self.install.arm()
        except Exception as exc:
            self._fail("DataLoader wrapper", exc)

    # -- helpers --------------------------------------------------------------------------------

    def _cuda_initialized(self) -> bool:
        try:
            return bool(self.torch.cuda.is_initialized())
        except Exception:
            return False

    def _adopt(self, module: Any) -> ModuleState:
        state = ModuleState(module)
        state.scan(module)
        try:
            conv = self.torch.nn.modules.conv._ConvNd
            state.conv_layers = sum(1 for sub in module.modules() if isinstance(sub, conv))
        except Exception:
            state.conv_layers = None
        if len(self.modules) < MAX_MODULES:
            try:
                self._hook_module(module, state)
            except Exception:  # e.g. a ScriptModule refuses hooks: re-armed at the next step
                for handle in state.handles:
                    handle.remove()
                state.handles.clear()
        self.modules[id(module)] = state
        return state

    def _hook_module(self, module: Any, state: ModuleState) -> None:
        state.handles.append(module.register_forward_pre_hook(self._on_module_pre,
                                                              with_kwargs=True))
        try:
            handle = module.register_forward_hook(self._on_module_post, always_call=True)
        except TypeError:  # torch < 2.1: no always_call; re-armed at the next step/batch
            handle = module.register_forward_hook(self._on_module_post)
        state.handles.append(handle)

    def _record_call(self, state: ModuleState, module: Any, args: Any) -> None:
        torch = self.torch
        state.calls += 1
        self.forwards += 1
        grad = torch.is_grad_enabled()
        if grad:
            state.grad_calls += 1
            self.grad_forwards += 1
        else:
            self.no_grad_forwards += 1
        if torch.is_inference_mode_enabled():
            state.inference_calls += 1
        if _autocast_cuda(torch):
            state.autocast_calls += 1
            self.autocast_forwards += 1
        if getattr(module, "training", False):
            state.training_calls += 1
        if state.first_param is not None and state.first_param.device != state.first_device:
            state.scan(module)  # the model moved since its last forward
        inputs: list[str] = []
        self._last_forward = (state.name, state.param_devices, inputs, grad)
        first = args[0] if args else None
        tensor = first if isinstance(first, torch.Tensor) else first_tensor(args)
        if tensor is not None:
            self._note_input(state, tensor)

    def _note_input(self, state: ModuleState, tensor: Any) -> None:
        device = tensor.device
        if device != state.last_device:
            state.last_device = device
            state.last_device_name = str(device)
            state.input_devices.add(state.last_device_name)
            if state.last_device_name not in self.input_devices:
                self.input_devices.append(state.last_device_name)
        name = state.last_device_name
        shape = tensor.shape
        if shape != state.last_shape:
            state.last_shape = shape
            key = tuple(int(n) for n in shape)
            if key not in state.input_shapes and len(state.input_shapes) < 8:
                state.input_shapes.append(key)
            if self.input_batch is None and key:
                self.input_batch = key[0]
        last = self._last_forward
        if last is not None and name not in last[2]:
            last[2].append(name)

    @property
    def last_forward(self) -> ForwardRecord | None:
        """The last top-level forward (failures name its module and devices)."""
        if self._last_forward is None:
            return None
        name, params, inputs, grad = self._last_forward
        return ForwardRecord(module=name, param_devices=list(params), input_devices=list(inputs),
                             grad_enabled=grad)

    def _first_step(self, optimizer: Any) -> None:
        torch = self.torch
        self.primary = optimizer
        self.optimizer_ids.add(id(optimizer))
        self.optimizer_names.append(type(optimizer).__name__)
        first = None
        for group in optimizer.param_groups:
            for param in group.get("params", ()):
                if first is None:
                    first = param
                device = str(param.device)
                dtype = str(param.dtype).removeprefix("torch.")
                if device not in self.param_devices:
                    self.param_devices.append(device)
                if dtype not in self.param_dtypes:
                    self.param_dtypes.append(dtype)
        self.backend_flags = _backend_flags(torch)
        if first is None:
            return
        self.device = str(first.device)
        if first.device.type == "cuda":
            index = first.device.index
            self.cuda_index = int(torch.cuda.current_device()) if index is None else int(index)
            self.device = f"cuda:{self.cuda_index}"
            self._setup_cuda(self.cuda_index)

    def _setup_cuda(self, index: int) -> None:
        torch = self.torch
        try:
            self.device_name = str(torch.cuda.get_device_name(index))
            major, minor = torch.cuda.get_device_capability(index)
            self.compute_capability = f"{major}.{minor}"
        except Exception as exc:
            self.errors.append(f"device properties: {exc}")
        if index not in self.start_stats:
            self.start_stats[index] = {}
        raw = getattr(torch._C, "_cuda_memoryStats", None)
        reader: Any = None
        if raw is not None:
            def reader() -> int:
                return int(raw(index)["allocated_bytes"]["all"]["current"])
            try:
                reader()
            except Exception:
                reader = None
        if reader is None:
            def reader() -> int:
                return int(torch.cuda.memory_allocated(index))
        self._read_allocated = reader
        if self.use_sampler:
            self._start_nvml(index)

    def _start_nvml(self, cuda_index: int) -> None:
        """Sample NVML at step boundaries, at most every NVML_INTERVAL seconds.

        No background thread: with a thread running, every DataLoader worker fork makes
        Python 3.12+ warn "This process is multi-threaded, use of fork() may lead to
        deadlocks" into the user's warnings summary (an error under -W error)."""
        try:
            from pytest_gputrain.collect import nvml

            if not nvml.shared().available:
                return
            index = nvml.index_for_cuda_device(cuda_index)
            if index is None:
                return
            self.nvml_index = index
            self.nvml_started = _perf()
            self._nvml_sample(self.nvml_started)
        except Exception as exc:
            self.nvml_index = None
            self.errors.append(f"NVML sampling not started: {exc}")

    def _nvml_sample(self, now: float) -> None:
        from pytest_gputrain.collect import nvml

        self.nvml_last = now
        if self.nvml_index is None:
            return
        sample = nvml.read_sample(self.nvml_index, pids=[os.getpid()])
        if sample is not None:
            sample.t = now - self.nvml_started
            self.nvml_samples.append(sample)

    @property
    def window_last(self) -> int:
        return self.profile_steps[1] if self.profile_steps is not None else 0

    def _start_window(self, first_step: int) -> None:
        busy = ProfilerWindow.busy_reason(self.torch)
        if busy is not None:
            self.window_facts = {"captured": False, "reason": busy}
            return
        window = ProfilerWindow(self.torch, self.cuda_index or 0)
        try:
            window.start(first_step)
        except Exception as exc:
            self.window_facts = {"captured": False,
                                 "reason": f"torch.profiler did not start: {exc}"}
            return
        self.window = window

    def _stop_window(self, steps: int, cuda_ok: bool = True) -> None:
        window, self.window = self.window, None
        if window is None:
            return
        try:
            self.window_facts = window.stop(max(1, steps), cuda_ok=cuda_ok)
            if cuda_ok and self.cuda_index is not None:
                self.window_stats = self._memory_stats(self.cuda_index)
        except Exception as exc:
            self.window_facts = {"captured": False,
                                 "reason": f"profiler window failed: {type(exc).__name__}: {exc}"}

    def _memory_stats(self, index: int) -> dict[str, Any]:
        stats = self.torch.cuda.memory_stats(index)
        keys = ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                "reserved_bytes.all.current", "reserved_bytes.all.peak", "num_alloc_retries",
                "num_ooms", "inactive_split_bytes.all.current")
        return {key: int(stats.get(key, 0)) for key in keys}

    def _read_device_budget(self) -> None:
        from pytest_gputrain.probe.failures import memory_fraction, other_process_memory

        torch = self.torch
        index = self.cuda_index if self.cuda_index is not None else 0
        self.end_stats["total"] = int(torch.cuda.get_device_properties(index).total_memory)
        try:
            fraction = memory_fraction(torch, index)
        except Exception:
            fraction = None
        if fraction is not None:
            self.end_stats["fraction"] = fraction
        others = other_process_memory(index)
        if others is not None:
            self.end_stats["other_processes"] = others

    def _count_graph_outputs(self) -> None:
        self.without_backward = sum(1 for record in self.graph_outputs if not record[0])
        self.graph_outputs.clear()

    @property
    def batch_size(self) -> int | None:
        main = _main_loader(self.loader)
        if main is not None and main.batch_size is not None:
            return int(main.batch_size)
        return self.input_batch

    # -- facts ----------------------------------------------------------------------------------

    def trained(self) -> bool:
        """Worth recording: the test stepped an optimizer, ran a module, loaded or used CUDA."""
        return bool(self.step_times or self.forwards or self.loader.loaders
                    or self.cuda_index is not None or self.errors)

    def facts(self) -> RunFacts:
        torch = self.torch
        run = RunFacts(nodeid=self.nodeid)
        run.duration = round(self.duration, 6) if self.duration is not None else None
        if self.cuda_available is None:
            run.mark_unknown("cuda_available", "not readable when the test started")
        else:
            run.cuda_available = self.cuda_available
        run.cuda_used = self.cuda_index is not None or any(
            d.startswith("cuda") for d in self.input_devices)
        run.device = self.device
        run.device_name = self.device_name
        run.compute_capability = self.compute_capability
        steps = len(self.step_times)
        run.steps = steps
        run.optimizer_steps = self.optimizer_steps
        run.optimizers = list(self.optimizer_names)
        run.warmup_steps = self.warmup
        steady = self._steady_indices()
        run.steady_steps = len(steady)
        if steady:
            times = [self.step_times[i] for i in steady]
            run.step_time = statistics.median(times)
            run.step_time_mean = statistics.fmean(times)
        else:
            run.mark_unknown("step_time", f"{steps} optimizer step(s): no steady steps")
        run.step_times = [round(t, 6) for t in _thin(self.step_times)]
        run.forwards = self.forwards
        run.grad_forwards = self.grad_forwards
        run.no_grad_forwards = self.no_grad_forwards
        run.autocast_forwards = self.autocast_forwards
        run.backwards = self.backwards
        run.forwards_without_backward = self.without_backward
        run.param_devices = list(self.param_devices)
        run.param_dtypes = list(self.param_dtypes)
        run.input_devices = list(self.input_devices)
        run.modules = [self._module_record(state) for state in self.modules.values()]
        last = self.last_forward
        if last is not None:
            run.last_forward = last
        if self.modules:
            convs = [s.conv_layers for s in self.modules.values() if s.conv_layers is not None]
            run.conv_layers = sum(convs) if convs else None
            main = max(self.modules.values(), key=lambda s: s.calls)
            if main.input_shapes:
                run.input_shape_count = len(main.input_shapes)
        flags = self.backend_flags or _backend_flags(torch)
        for key, value in flags.items():
            setattr(run, key, value)
        run.loader = self._loader_facts(steady)
        run.sync = self._sync_facts(steady)
        run.memory = self._memory_facts()
        run.profile = self._profile_facts(steps)
        run.nvml = self._nvml_facts()
        run.probe_errors = list(self.errors)
        return run

    def _steady_indices(self) -> list[int]:
        steps = len(self.step_times)
        steady = [i for i in range(self.warmup, steps) if self.step_flags[i] == 0]
        if not steady and steps > 1:
            steady = [i for i in range(1, steps) if self.step_flags[i] in (0, 3)] or \
                list(range(1, steps))
        if not steady and steps == 1:
            steady = [0]
        return steady

    @staticmethod
    def _module_record(state: ModuleState) -> ModuleRecord:
        return ModuleRecord(
            name=state.name, calls=state.calls, grad_calls=state.grad_calls,
            inference_calls=state.inference_calls, autocast_calls=state.autocast_calls,
            training_calls=state.training_calls, param_devices=list(state.param_devices),
            param_dtypes=list(state.param_dtypes), input_devices=sorted(state.input_devices),
            input_shapes=[list(shape) for shape in state.input_shapes],
            parameters=state.parameters, conv_layers=state.conv_layers)

    def _loader_facts(self, steady: list[int]) -> LoaderFacts:
        facts = LoaderFacts()
        loaders = list(self.loader.loaders.values())
        facts.count = len(loaders)
        facts.cpus = cpu_count()
        facts.processes_per_host = processes_per_host()
        if facts.cpus is not None:
            facts.cpus_per_process = max(1, facts.cpus // facts.processes_per_host)
        facts.batches = sum(loader.batches for loader in loaders)
        facts.wait_total = round(sum(loader.wait for loader in loaders), 6)
        facts.loaders = [LoaderRecord(
            dataset=loader.dataset, num_workers=loader.num_workers, pin_memory=loader.pin_memory,
            persistent_workers=loader.persistent_workers, prefetch_factor=loader.prefetch_factor,
            batch_size=loader.batch_size, iterators=loader.iterators, batches=loader.batches,
            wait=round(loader.wait, 6), first_batch_wait=round(loader.first_batch_wait, 6),
            batch_pinned=loader.batch_pinned, batch_device=loader.batch_device)
            for loader in loaders]
        main = _main_loader(self.loader)
        if main is not None:
            facts.dataset = main.dataset
            facts.num_workers = main.num_workers
            facts.pin_memory = main.pin_memory
            facts.persistent_workers = main.persistent_workers
            facts.prefetch_factor = main.prefetch_factor
            facts.batch_size = main.batch_size
            facts.batch_pinned = main.batch_pinned
            facts.epochs = main.iterators
            facts.wait_max = round(max(loader.wait_max for loader in loaders), 6)
            later = sum(loader.later_first_batch_wait for loader in loaders)
            facts.epoch_start_wait = round(later, 6)
            if self.duration:
                facts.epoch_start_percent = round(100.0 * later / self.duration, 2)
        else:
            for name in ("dataset", "num_workers", "pin_memory", "persistent_workers",
                         "batch_size", "epochs"):
                facts.mark_unknown(name, "the test used no DataLoader")
        if steady:
            waits = [self.step_waits[i] for i in steady]
            times = [self.step_times[i] for i in steady]
            facts.wait_per_step = round(statistics.median(waits), 6)
            total = sum(times)
            facts.wait_percent = round(100.0 * sum(waits) / total, 2) if total > 0 else None
        elif facts.batches and self.duration:
            facts.wait_percent = round(100.0 * facts.wait_total / self.duration, 2)
        return facts

    def _sync_facts(self, steady: list[int]) -> SyncFacts:
        facts = SyncFacts()
        facts.by_call = [f"{name}: {count}" for name, count in
                         sorted(self.sync_by_call.items(), key=lambda item: (-item[1], item[0]))]
        facts.total = sum(self.sync_by_call.values())
        if steady:
            counts = [self.step_syncs[i] for i in steady]
            facts.per_step = float(statistics.median(counts))
            facts.max_per_step = max(counts)
        else:
            facts.mark_unknown("per_step", "no optimizer steps")
        profiled = self.window_facts.get("syncs_per_step")
        if profiled is not None:
            facts.profiled_per_step = profiled
        return facts

    def _memory_facts(self) -> MemoryFacts:
        facts = MemoryFacts()
        index = self.cuda_index
        if index is None:
            for name in ("total", "budget", "peak_allocated", "peak_reserved"):
                facts.mark_unknown(name, "the run did not train on CUDA")
            return facts
        facts.device = f"cuda:{index}"
        start = self.start_stats.get(index, {})
        end = self.end_stats
        steady = self.window_stats or end
        facts.expandable_segments = _expandable()
        facts.total = end.get("total")
        facts.fraction = end.get("fraction")
        if facts.fraction is None:
            facts.unknown["fraction"] = "torch cannot read set_per_process_memory_fraction back"
        facts.other_processes = end.get("other_processes")
        if facts.total is not None:
            limit = int(facts.total * (facts.fraction if facts.fraction is not None else 1.0))
            facts.budget = min(limit, facts.total - (facts.other_processes or 0))
        facts.allocated_start = start.get("allocated_bytes.all.current")
        facts.allocated_end = self.step_alloc[-1] if self.step_alloc else \
            end.get("allocated_bytes.all.current")
        if self.step_alloc:
            facts.steady_allocated = int(statistics.median(self.step_alloc[self.warmup:]
                                                           or self.step_alloc))
        facts.peak_allocated = end.get("allocated_bytes.all.peak")
        facts.peak_reserved = end.get("reserved_bytes.all.peak")
        facts.reserved_end = steady.get("reserved_bytes.all.current")
        reserved_start = start.get("reserved_bytes.all.current", 0)
        demand = facts.peak_reserved
        if demand is not None and demand <= reserved_start and facts.peak_allocated is not None:
            # The cache held this much before the test: the test's own demand is what it
            # allocated, not what earlier tests left reserved.
            demand = facts.peak_allocated
        if demand is not None and facts.budget:
            facts.peak_reserved_percent = round(100.0 * demand / facts.budget, 2)
        for key, name in (("num_alloc_retries", "num_alloc_retries"), ("num_ooms", "num_ooms")):
            if key in end:
                setattr(facts, name, max(0, end[key] - start.get(key, 0)))
        facts.inactive_split = steady.get("inactive_split_bytes.all.current")
        if facts.inactive_split is not None and facts.reserved_end:
            facts.inactive_split_percent = round(
                100.0 * facts.inactive_split / facts.reserved_end, 2)
        facts.allocated_per_step = _thin(self.step_alloc)
        self._growth(facts, demand)
        self._batch_model(facts, demand)
        return facts

    def _growth(self, facts: MemoryFacts, demand: int | None) -> None:
        skip = self.warmup + 1
        points = self.step_alloc[skip:]
        facts.growth_steps = len(points)
        if len(points) < 3:
            facts.unknown["growth_per_step"] = f"{len(self.step_alloc)} step(s): too few to fit"
            return
        n = len(points)
        mean_x = (n - 1) / 2
        mean_y = statistics.fmean(points)
        sxx = sum((i - mean_x) ** 2 for i in range(n))
        sxy = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(points))
        slope = sxy / sxx
        facts.growth_per_step = round(slope, 1)
        facts.growth_total = points[-1] - points[0]
        rises = sum(1 for a, b in itertools.pairwise(points) if b > a)
        facts.growth_rising_percent = round(100.0 * rises / (n - 1), 2)
        if slope > 0 and facts.budget:
            used = max(demand or 0, facts.reserved_end or 0, points[-1])
            facts.steps_to_exhaust = round(max(0.0, (facts.budget - used) / slope), 1)

    def _batch_model(self, facts: MemoryFacts, demand: int | None) -> None:
        batch = self.batch_size
        facts.batch_size = batch
        if not batch or demand is None or facts.steady_allocated is None or not facts.budget:
            return
        per_sample = (demand - facts.steady_allocated) / batch
        if per_sample <= 0:
            return
        facts.per_sample = round(per_sample, 1)
        facts.oom_batch_estimate = int((facts.budget - facts.steady_allocated) / per_sample)

    def _profile_facts(self, steps: int) -> ProfileFacts:
        facts = ProfileFacts(enabled=self.profile_steps is not None)
        if self.profile_steps is None:
            facts.reason = "the profiler window is off (gpu_profile_steps = off)"
        elif self.window_facts:
            for key, value in self.window_facts.items():
                if key in ProfileFacts.model_fields:
                    setattr(facts, key, value)
        elif self.cuda_index is None:
            facts.reason = "the run did not train on CUDA"
        elif steps < self.profile_steps[0]:
            facts.reason = (f"the test ran {steps} optimizer step(s); the window starts at "
                            f"step {self.profile_steps[0]}")
        else:
            facts.reason = "the window did not run"
        if not facts.captured:
            for name in ("busy_percent", "kernel_mean", "tensor_core_percent",
                         "h2d_pageable_bytes_per_step"):
                facts.unknown[name] = facts.reason or "no profiler window"
        return facts

    def _nvml_facts(self) -> NvmlRunFacts:
        from pytest_gputrain.collect.sampler import summarise

        facts = NvmlRunFacts(index=self.nvml_index)
        samples = self.nvml_samples
        facts.samples = len(samples)
        if not samples:
            facts.unknown["utilization_mean"] = (
                "no NVML timeline (CPU run, NVML unavailable or no sample answered)")
            return facts

        def stats(metric: str) -> Any:
            return summarise(float(v) for s in samples if (v := getattr(s, metric)) is not None)

        util = stats("utilization_gpu")
        if util is not None:
            facts.utilization_mean = round(util.mean, 2)
            facts.utilization_p50 = round(util.p50, 2)
        for metric, name in (("memory_used", "memory_used_max"),
                             ("process_memory", "process_memory_max")):
            found = stats(metric)
            if found is not None:
                setattr(facts, name, int(found.max))
        for metric, name in (("temperature", "temperature_max"), ("power_draw", "power_max")):
            found = stats(metric)
            if found is not None:
                setattr(facts, name, round(found.max, 2))
        clock = stats("sm_clock")
        if clock is not None:
            facts.sm_clock_min, facts.sm_clock_max = clock.min, clock.max
        masks = [s.clock_event_reasons for s in samples if s.clock_event_reasons is not None]
        if masks:
            from pytest_gputrain.collect.nvml import decode_clock_events

            seen = 0
            for mask in masks:
                seen |= mask
            facts.throttle_reasons = decode_clock_events(seen)
            facts.throttle_percent = round(
                100.0 * sum(1 for m in masks if m & THROTTLE_BITS) / len(masks), 2)
            facts.power_cap_percent = round(
                100.0 * sum(1 for m in masks if m & POWER_CAP_BIT) / len(masks), 2)
        return facts


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


def _autocast_cuda(torch: Any) -> bool:
    try:
        return bool(torch.is_autocast_enabled("cuda"))
    except TypeError:  # torch < 2.4
        return bool(torch.is_autocast_enabled())


def _backend_flags(torch: Any) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    try:
        backends = torch.backends
        flags["cudnn_benchmark"] = bool(backends.cudnn.benchmark)
        flags["cudnn_deterministic"] = bool(backends.cudnn.deterministic)
        flags["deterministic_algorithms"] = bool(torch.are_deterministic_algorithms_enabled())
        precision = str(torch.get_float32_matmul_precision())
        flags["float32_matmul_precision"] = precision
        matmul = backends.cuda.matmul
        new_api = getattr(matmul, "fp32_precision", None)
        flags["tf32_matmul"] = bool(matmul.allow_tf32) or precision != "highest" or \
            new_api == "tf32"
        conv_api = getattr(getattr(backends.cudnn, "conv", None), "fp32_precision", None)
        flags["tf32_cudnn"] = bool(backends.cudnn.allow_tf32) if conv_api in (None, "none") \
            else conv_api == "tf32"
    except Exception:
        pass
    return flags


def _expandable() -> bool:
    from pytest_gputrain.probe.failures import expandable_segments

    return expandable_segments()


def _main_loader(tracker: LoaderTracker) -> Any:
    loaders = list(tracker.loaders.values())
    return max(loaders, key=lambda loader: loader.batches) if loaders else None


def _thin(values: list[Any]) -> list[Any]:
    """At most MAX_SERIES values, evenly spaced (first and last kept)."""
    if len(values) <= MAX_SERIES:
        return list(values)
    step = len(values) / MAX_SERIES
    picked = [values[int(i * step)] for i in range(MAX_SERIES - 1)]
    picked.append(values[-1])
    return picked
