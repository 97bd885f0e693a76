"""What the run probe reads of the top-level modules a test calls: ``ModuleWatch``, which
keeps the per-forward state of the probe's module hooks, and the plain reads it makes of a
module once, when it is first called (``adopt``), and of the DistributedDataParallel modules and
optimizers the probe meets.

- Mode layers: layers whose behaviour depends on ``module.training`` (dropout with p > 0, batch
  norm and other norms that track running statistics, RNN dropout, attention dropout).
- Wrappers: DistributedDataParallel, DataParallel and torch.compile's OptimizedModule; the
  wrapped module's ``training`` flag is the one ``model.eval()`` sets.
- DDP's own logging data (``DistributedDataParallel._get_ddp_logging_data()``): whether
  ``find_unused_parameters`` is on and how many bytes of parameters it found unused.

Classes are recognised by name where importing them would pull in torch.distributed.

Per top-level forward (hot path): grad mode, autocast (and its dtype, under autocast; and, where
CUDA's autocast is off, whether another device's is on: ``torch.autocast("cpu")`` around a CUDA
model) and the device of the first input; per model forward a look at its output's autograd
node (below); nothing for a module without mode layers that is not DDP, else a few attribute
reads.

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
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_gputrain.probe import oom_observer
from pytest_gputrain.probe.cuda_readings import (
    any_autocast_check,
    autocast_check,
    autocast_dtype,
    note_other_autocast,
)
from pytest_gputrain.probe.layer_scan import scan_layers
from pytest_gputrain.probe.loader import first_tensor, token_count
from pytest_gputrain.probe.run_record import (
    MAX_SHAPES_SEEN,
    ModuleChecks,
    ModuleState,
    RunRecord,
    WatchMode,
)
from pytest_gputrain.probe.torch_hooks import is_compiling, is_tracing

if TYPE_CHECKING:
    from pytest_gputrain.probe.callbacks import ProbeCallbacks
    from pytest_gputrain.probe.torch_hooks import Installation

MAX_MODULES = 32  # top-level modules given their own hooks per test
MAX_GRAPH_OUTPUTS = 100_000
WATCH_FIRST = 8  # grad-mode forwards of each model watched before its watch mode is chosen
DDP_NAMES = ("DistributedDataParallel",)
SHARDED_NAMES = ("FullyShardedDataParallel", "FSDPModule")
COMPILED_NAME = "OptimizedModule"
MAX_WRAPPERS = 4  # wrappers unwrapped around one model (compile(DDP(model)) is two)


def wrapped_module(module: Any) -> Any:
    """The module a DDP, DataParallel or compiled wrapper holds, else None."""
    name = type(module).__name__
    if name == COMPILED_NAME:
        return getattr(module, "_orig_mod", None)
    if name in DDP_NAMES or name == "DataParallel":
        return getattr(module, "module", None)
    return None


def innermost(module: Any) -> Any:
    for _ in range(MAX_WRAPPERS):
        inner = wrapped_module(module)
        if inner is None:
            break
        module = inner
    return module


def ddp_module(module: Any) -> Any:
    """The DistributedDataParallel module among ``module`` and the wrappers inside it."""
    for _ in range(MAX_WRAPPERS):
        if type(module).__name__ in DDP_NAMES:
            return module
        module = wrapped_module(module)
        if module is None:
            break
    return None


def mode_layers(torch: Any, module: Any) -> tuple[int, Any]:
    """(layers that act differently in train and eval mode, the first batch norm among them)."""
    nn = torch.nn
    dropout = nn.modules.dropout._DropoutNd
    norm = getattr(nn.modules.batchnorm, "_NormBase", nn.modules.batchnorm._BatchNorm)
    rnn = nn.RNNBase
    attention = nn.MultiheadAttention
    count = 0
    first_norm = None
    for sub in module.modules():
        if isinstance(sub, dropout):
            active = float(getattr(sub, "p", 0.0)) > 0.0
        elif isinstance(sub, norm):
            active = bool(getattr(sub, "track_running_stats", False))
            if active and first_norm is None:
                first_norm = sub
        elif isinstance(sub, rnn):
            active = float(getattr(sub, "dropout", 0.0)) > 0.0 and sub.num_layers > 1
        elif isinstance(sub, attention):
            active = float(getattr(sub, "dropout", 0.0)) > 0.0
        else:
            continue
        count += int(active)
    return count, first_norm


def compiled_wrapper_target(module: Any) -> str | None:
    """The class torch.compile wrapped, for an OptimizedModule; else None."""
    if type(module).__name__ != COMPILED_NAME:
        return None
    inner = getattr(module, "_orig_mod", None)
    return type(inner).__name__ if inner is not None else None


def wraps_data_parallel(class_name: str | None) -> bool:
    return class_name in DDP_NAMES or class_name in SHARDED_NAMES


def ddp_world_size(ddp: Any) -> int | None:
    group = getattr(ddp, "process_group", None)
    try:
        return int(group.size()) if group is not None else None
    except Exception:
        return None


def ddp_logging(ddp: Any) -> dict[str, Any]:
    """The DDP logging data the facts use; {} where this torch has none."""
    reader = getattr(ddp, "_get_ddp_logging_data", None)
    if reader is None:
        return {}
    data = reader()
    keys = ("find_unused_parameters", "unused_parameter_size", "iteration", "world_size",
            "avg_backward_comm_time", "avg_backward_compute_comm_overlap_time")
    return {key: data[key] for key in keys if key in data}


def is_evaluation(checks: ModuleChecks, state: ModuleState) -> bool:
    """A no-grad forward in training mode evaluates the model, except for a frozen model
    (an EMA or teacher copy: parameters without requires_grad) and batch-norm
    recalibration (``update_bn`` sets momentum None on purpose)."""
    first = state.first_param
    if first is not None and not first.requires_grad:
        return False
    norm = checks.batch_norm() if checks.batch_norm is not None else None
    return norm is None or norm.momentum is not None


def graph_nodes(output: Any, tensor_type: Any) -> list[Any]:
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


def adopt(torch: Any, record: RunRecord, module: Any, args: Any,
          on_post: Callable[..., None]) -> ModuleState:
    """A top-level module called for the first time: read it once (parameters, convolutions,
    mode layers, wrappers, layers), give it ``on_post`` as its forward hook unless it is a leaf
    or the test already has MAX_MODULES, and keep its state."""
    modules = record.forwards.modules
    state = ModuleState(module)
    state.scan(module)
    try:
        conv = torch.nn.modules.conv._ConvNd
        state.conv_layers = sum(1 for sub in module.modules() if isinstance(sub, conv))
    except Exception:
        state.conv_layers = None
    state.checks = _module_checks(torch, record, module)
    try:
        state.layers = scan_layers(torch, module, args)
    except Exception as exc:  # an exotic module: its layers stay unknown
        record.errors.append(f"reading the layers of {state.name}: {exc}")
    # A leaf without parameters (a loss, an activation) gets no hooks of its own: the
    # global hook stays armed through its call, as nothing inside it is a module call.
    state.leaf = not state.parameters and next(iter(module.children()), None) is None
    if len(modules) < MAX_MODULES and not state.leaf:
        try:
            _hook_module(module, state, on_post)
        except Exception:  # e.g. a ScriptModule refuses hooks: re-armed at the next step
            for handle in state.handles:
                handle.remove()
            state.handles.clear()
    modules[id(module)] = state
    return state


def _hook_module(module: Any, state: ModuleState, on_post: Callable[..., None]) -> None:
    try:
        handle = module.register_forward_hook(on_post, with_kwargs=True, always_call=True)
    except TypeError:  # torch < 2.1: no always_call; re-armed at the next step/batch
        handle = module.register_forward_hook(on_post, with_kwargs=True)
    state.handles.append(handle)


def _module_checks(torch: Any, record: RunRecord, module: Any) -> ModuleChecks | None:
    wrapped = compiled_wrapper_target(module)
    if wrapped is not None:
        if wrapped not in record.compile.wrapped:
            record.compile.wrapped.append(wrapped)
        record.compile.wraps_ddp |= wraps_data_parallel(wrapped)
    try:
        layers, batch_norm = mode_layers(torch, module)
    except Exception as exc:
        record.errors.append(f"counting mode layers: {exc}")
        layers, batch_norm = 0, None
    ddp = ddp_module(module)
    if ddp is not None and record.ddp.world_size is None:
        record.ddp.world_size = ddp_world_size(ddp)
    if not layers and ddp is None:
        return None
    return ModuleChecks(layers, innermost(module), ddp, batch_norm)


def count_ddp_forward(record: RunRecord, ddp: Any) -> None:
    """A grad-mode forward of a DDP module: counted by step, with those that will all-reduce;
    DDP's logging data read at its first forward in steps 2, 4, 8, ..."""
    readings = record.ddp
    index = len(record.steps.times)
    counts = readings.steps.get(index)
    if counts is None:
        counts = readings.steps[index] = [0, 0]
        if index >= readings.next_read:  # a few reads per test: log2(steps)
            readings.next_read = 2 * index
            try:
                readings.logging = ddp_logging(ddp)
            except Exception as exc:
                readings.next_read = 1 << 62
                record.errors.append(f"reading DDP's logging data: {exc}")
    counts[0] += 1
    if getattr(ddp, "require_backward_grad_sync", True):
        counts[1] += 1


def read_last_ddp_logging(record: RunRecord) -> None:
    """DDP's logging data once more at the end of the test, from the DDP modules still alive."""
    for state in record.forwards.modules.values():
        ddp = state.checks.ddp() if state.checks and state.checks.ddp else None
        if ddp is not None:
            try:
                record.ddp.logging = ddp_logging(ddp) or record.ddp.logging
            except Exception as exc:
                record.errors.append(f"reading DDP's logging data: {exc}")


class ModuleWatch:
    """The top-level modules of one test: adopted (hooked and read) at their first call, each
    forward recorded, the global forward hook armed between top-level forwards, the graphs of
    the forwards that may go without a backward watched (the module docstring's "Forwards
    without a backward"), and DDP's forwards counted.

    ``on_global_forward``, ``on_backward_start`` and ``on_backward_end`` are hook callbacks of
    ``ProbeCallbacks`` (the probe hands them to the hooks as its own); the probe calls
    ``at_step`` / ``at_batch`` at its boundaries when something is left open between forwards
    (``pending``, ``undecided``, ``active``), and ``remove_hooks`` / ``count_graph_outputs``
    when the test ends."""

    def __init__(self, torch: Any, probe: ProbeCallbacks, install: Installation) -> None:
        self.torch = torch
        self.probe = probe
        self.record = probe.record
        self.install = install
        # Set together with the probe's by RunProbe.fail(): a flag of its own spares each
        # forward a read through the probe.
        self.disabled = False
        self._states = probe.record.forwards.modules  # ModuleState by id(module)
        self.active: Any = None  # the top-level module whose forward is running
        self.in_backward = 0
        # Models with a grad-mode forward since the last backward (their ``pending`` is set),
        # and models still in their first WATCH_FIRST forwards' probation.
        self.pending: list[ModuleState] = []
        self.undecided: list[ModuleState] = []
        # torch's mode checks, looked up once (they run at every top-level forward).
        self._compiling = is_compiling(torch)
        self._tracing = is_tracing(torch)
        self._grad_enabled = torch.is_grad_enabled
        self._inference_mode = torch.is_inference_mode_enabled
        self._autocast = autocast_check(torch)
        self._any_autocast = any_autocast_check(torch)
        self._autocast_dtype = autocast_dtype(torch)
        self._float16 = torch.float16
        self._anomaly_enabled = torch.is_anomaly_enabled
        self._tensor_type = torch.Tensor

    # -- hook callbacks (all guarded) -----------------------------------------------------------

    def on_global_forward(self, module: Any, args: Any) -> None:
        if self.disabled or self._compiling():
            return None
        try:
            state = self._states.get(id(module))
            if state is None or state.ref() is not module:
                state = adopt(self.torch, self.record, module, args, self._on_module_post)
            if not state.leaf:  # a leaf calls no module: the hook may stay armed through it
                self.install.disarm()
                self.active = module
                if self.pending and state.parameters:
                    # A model's forward comes before any backward: the held forwards are
                    # watched now, and let go before this forward allocates anything.
                    self.settle_pending()
            self._record_call(state, module, args)
        except Exception as exc:
            self.probe.fail("forward pre hook", exc)
        return None

    def _on_module_post(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        """After a top-level forward, also when it raised (``always_call``): its inputs given
        as keyword arguments (unseen by the global hook) and its output; re-arms the hook."""
        if self.disabled or self.active is not module:
            return None
        try:
            self.active = None
            state = self._states.get(id(module))
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
            self.probe.fail("module forward hook", exc)
        return None

    def on_backward_start(self) -> None:
        # torch.compile's AOTAutograd traces the backward with autograd.grad on fake tensors,
        # under detect_anomaly(check_nan=False) for the stack traces: not the code's backward.
        if self.disabled or self._tracing():
            return
        try:
            record = self.record
            record.forwards.backwards += 1
            if self._anomaly_enabled():  # the step of each backward under anomaly detection
                record.settings.anomaly_steps.append(len(record.steps.times))
            self.in_backward += 1
            self.active = None
            self.install.disarm()
            if self.pending:  # the forwards this backward is taken to go through
                for state in self.pending:
                    state.pending = False
                    state.held = None
                self.pending.clear()
        except Exception as exc:
            self.probe.fail("backward wrapper", exc)

    def on_backward_end(self) -> None:
        if self.disabled or self._tracing():
            return
        try:
            self.in_backward = max(0, self.in_backward - 1)
            if not self.in_backward and self.install.installed:
                self.install.arm()
        except Exception as exc:
            self.probe.fail("backward wrapper", exc)

    # -- boundaries: an optimizer step, a batch -------------------------------------------------

    def at_step(self) -> None:
        """An optimizer step ended with something open: watch the held forwards, choose the
        watch modes of the models past their first forwards, end a forward left running."""
        if self.pending:
            self.settle_pending()
        if self.undecided:
            self._choose_watch_modes()
        if self.active is not None and not self.in_backward:
            self.active = None
            self.install.arm()

    def at_batch(self) -> None:
        """A batch came with something open: as ``at_step``, but models stay undecided."""
        if self.pending:
            self.settle_pending()
        if self.active is not None and not self.in_backward:
            self.active = None
            self.install.arm()

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
            if grad and self._autocast_dtype() is self._float16:
                forwards.autocast_fp16 += 1  # fp16 needs loss scaling (GT141); bf16 does not
        elif self._any_autocast():  # another device's autocast only: torch.autocast("cpu")
            note_other_autocast(self.torch, forwards)
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
                forwards.input_tokens = token_count(tensor)
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

    def _check_forward(self, checks: ModuleChecks, state: ModuleState, module: Any,
                       grad: bool) -> None:
        record = self.record
        if checks.mode_layers:
            target = checks.target()
            training = bool(getattr(target, "training", False))
            if grad and not training:
                record.modes.graph_pending = id(module)
            elif training and not grad and is_evaluation(checks, state):
                record.modes.eval_in_train += 1
        if checks.ddp is not None and grad:
            ddp = checks.ddp()
            if ddp is not None:
                count_ddp_forward(record, ddp)

    # -- forwards without a backward (see the module docstring) ---------------------------------

    def _after_model_forward(self, state: ModuleState, module_id: int, output: Any) -> None:
        """A grad-mode forward of a model ended: hold its output node, or watch it."""
        nodes = graph_nodes(output, self._tensor_type)
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
                    self.undecided.append(state)
        if not state.pending:
            state.pending = True
            self.pending.append(state)

    def settle_pending(self) -> None:
        """Something other than a backward came after the held forwards: watch them now."""
        for state in self.pending:
            if state.held is not None:
                self._watch(state.held)
                state.held = None

    def _choose_watch_modes(self) -> None:
        """At the step after a model's first WATCH_FIRST grad-mode forwards (their backwards
        have run): streaks only if every one of them was backpropagated, else every forward."""
        for state in self.undecided:
            reached = all(cell[0] for cell in state.first_cells)
            state.watch_mode = WatchMode.STREAKS if reached else WatchMode.EVERY
            state.first_cells.clear()
        self.undecided.clear()

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

    # -- at the end of the test -----------------------------------------------------------------

    def remove_hooks(self) -> None:
        for state in self.record.forwards.modules.values():
            for handle in state.handles:
                with contextlib.suppress(Exception):
                    handle.remove()
            state.handles.clear()

    def count_graph_outputs(self) -> None:
        forwards = self.record.forwards
        # A held forward had no backward up to the test's end: none can reach it now.
        held = sum(1 for state in self.pending if state.held is not None)
        for state in self.pending:
            state.held = None
        self.pending.clear()
        self.undecided.clear()
        forwards.without_backward = held + sum(
            1 for cell in forwards.graph_outputs if not cell[0])
        forwards.graph_outputs.clear()
        modes = self.record.modes
        modes.trained_in_eval = sum(1 for cell in modes.eval_graph_outputs if cell[0])
        modes.eval_graph_outputs.clear()
