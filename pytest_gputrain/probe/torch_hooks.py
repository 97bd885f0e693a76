"""Install and remove the probe's global torch hooks, exactly, around one test call.

What is installed (and only while a diagnosed test's call phase runs):

- an optimizer step post hook (``torch.optim.optimizer.register_optimizer_step_post_hook``):
  the step boundary;
- a global module forward pre hook, *armed only between top-level forwards*: it sees the first
  module called outside any other module's forward, then disarms itself so that submodules keep
  PyTorch's hook-free fast path; a forward hook on that top-level module (with its keyword
  arguments, called also when the forward raises) re-arms it. A leaf module without parameters
  (a loss, an activation) gets no hook of its own: the global hook stays armed through it;
- wrappers of ``torch.autograd.backward`` / ``torch.autograd.grad`` (backward counting, one
  started inside another passed over); the former also hands the loss it starts from to the probe
  (``loss_readings.py``: its device, and at every few backwards a finiteness check queued on
  the GPU, never a sync);
- wrappers of ``torch.cuda.reset_peak_memory_stats`` (the probe keeps the test's peaks so far
  before a reset inside the test, e.g. by ``gpu_benchmark``) and of
  ``torch.autograd.gradcheck`` / ``gradgradcheck`` (counted: debugging APIs while training)
  and of ``torch.profiler.profile.start`` / ``stop`` / ``step`` (the time a profiler of the
  test's own took to start and to process its events, ``instrument_readings.ProfilerTimes``),
  and of ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_`` (the clipping in force
  when a loss diverges, GT146);
- wrappers of the Python-level syncing calls (``collect/sync_calls.py``: the tensor methods
  ``item``, ``tolist``, ``cpu``, ``__bool__``, ``__float__``, ``__int__`` on CUDA tensors, and
  ``torch.cuda.synchronize``, ``Stream.synchronize``, ``Event.synchronize``), counted by kind and
  call site, and those a framework's own code made (the Hugging Face Trainer's NaN/Inf loss
  filter, ``frameworks.py``);
- a wrapper of ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__`` (loader.py);
- an optimizer step pre hook (``register_optimizer_step_pre_hook``): the host time of each step;
- wrappers of ``Optimizer.zero_grad`` and ``Module.zero_grad`` that count ``set_to_none=False``
  (subclasses that override ``zero_grad`` are not seen);
- a wrapper of ``torch._C._cuda_emptyCache``, which ``torch.cuda.empty_cache()`` looks up at
  each call (so calls through a name bound before the test are seen too);
- a dynamo compile-start callback (``torch._dynamo.callback``), where dynamo is imported: the
  step in which each compilation began;
- a wrapper of ``torch.save`` that notes the step each checkpoint falls in and the time it took
  (a long step that saved one is no stall; a checkpoint every step costs its share, GT140), and
  of the Hugging Face Trainer's and Lightning's checkpoint methods where they are imported (they
  write the weights through safetensors or their own I/O too; their torch.save calls count
  inside them);
- a wrapper of ``torch.amp.GradScaler.scale`` that counts loss scaling (fp16 autocast without
  it underflows gradients, GT141);
- for ``torch.compile``d modules, a wrapper of ``OptimizedModule.__call__`` that records the call
  and disarms the global hook *before* dynamo looks for global hooks (it warns whenever one is
  installed, which would reach the user's warnings summary, or fail a ``-W error`` run); it is
  installed when dynamo is already imported, or by a wrapper of ``torch.compile`` right after
  the test compiles its model.

Why wrap the syncing calls instead of ``torch.cuda.set_sync_debug_mode("warn")``: see
``collect/sync_calls.py``. The wrappers see only syncs asked for from Python (the usual
culprits: ``loss.item()``, ``print(t)``, ``t.cpu()``, ``if t:``, ``torch.cuda.synchronize()``);
the profiler window also counts every ``cuda*Synchronize`` the runtime saw, C++ ones
(``nonzero``, boolean masks) included.

Every hook body is guarded: an exception in the probe disables it for the rest of the test and
is recorded in ``run.probe_errors``; it never reaches user code. The hooks call the probe through
``callbacks.ProbeCallbacks`` only.
"""

from __future__ import annotations

import gc
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from pytest_gputrain.collect.sync_calls import SyncTally, sync_wrappers
from pytest_gputrain.probe.instrument_readings import PROFILER_METHODS, ProfilerTimes
from pytest_gputrain.probe.wrapping import probe_wrapper

if TYPE_CHECKING:
    from pytest_gputrain.probe.callbacks import ProbeCallbacks

DEBUG_APIS = ("gradcheck", "gradgradcheck")  # torch.autograd functions counted while training
# torch.nn.utils' gradient clipping (Lightning's gradient_clip_val and the Hugging Face Trainer's
# max_norm call it there), and the kind each clips by.
CLIPPING = (("clip_grad_norm_", "norm"), ("clip_grad_value_", "value"))


def _limit(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The max_norm / clip_value of a clipping call (its second argument)."""
    if len(args) > 1:
        return args[1]
    return kwargs.get("max_norm", kwargs.get("clip_value"))


class Patches:
    """Attribute replacements that are undone exactly: an attribute that was absent from the
    owner's own ``__dict__`` (inherited) is deleted again rather than set to the inherited one."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, bool, Any, Any]] = []

    def set(self, owner: Any, name: str, replacement: Any) -> None:
        own = vars(owner)
        had = name in own
        original = own.get(name)
        setattr(owner, name, replacement)
        self._saved.append((owner, name, had, original, replacement))

    def restore(self) -> list[str]:
        """Undo every patch, newest first; returns problems (a patch someone replaced since)."""
        problems = []
        while self._saved:
            problems.extend(_undo(*self._saved.pop()))
        return problems

    def restore_some(self, owner: Any, names: Iterable[str]) -> list[str]:
        """Undo the patches of ``names`` on ``owner`` only (the others stay)."""
        wanted = set(names)
        kept, problems = [], []
        for entry in self._saved:
            if entry[0] is owner and entry[1] in wanted:
                problems.extend(_undo(*entry))
            else:
                kept.append(entry)
        self._saved = kept
        return problems

    def __len__(self) -> int:
        return len(self._saved)


def _undo(owner: Any, name: str, had: bool, original: Any, replacement: Any) -> list[str]:
    if vars(owner).get(name) is not replacement:
        label = getattr(owner, "__name__", type(owner).__name__)
        return [f"{label}.{name} was replaced during the test; left as found"]
    if had:
        setattr(owner, name, original)
    else:
        delattr(owner, name)
    return []


def is_compiling(torch: Any) -> Callable[[], bool]:
    """``torch.compiler.is_compiling`` where it exists (hooks do nothing while dynamo traces)."""
    compiler = getattr(torch, "compiler", None)
    function = getattr(compiler, "is_compiling", None)
    if callable(function):
        return function  # type: ignore[no-any-return]
    return lambda: False


def is_tracing(torch: Any) -> Callable[[], bool]:
    """True while torch.compile traces or compiles: dynamo's tracing (``is_compiling``) and the
    AOTAutograd joint trace that follows it, which runs real autograd calls on fake tensors.
    Not every torch release answers ``is_compiling`` True during the latter (2.11 on the H200
    did not); the TracingContext that dynamo opens around the whole compilation says it."""
    compiling = is_compiling(torch)
    guards = getattr(torch, "_guards", None)
    context = getattr(getattr(guards, "TracingContext", None), "try_get", None)
    if not callable(context):
        return compiling
    return lambda: compiling() or context() is not None


def inside_backward(torch: Any) -> Callable[[], bool]:
    """True while an autograd node runs (reentrant checkpointing's backward per segment)."""
    current = getattr(getattr(torch, "_C", None), "_current_autograd_node", None)
    return (lambda: current() is not None) if callable(current) else (lambda: False)


def wrap_backward(original: Callable[..., Any], probe: ProbeCallbacks, loss: bool = False,
                  nested: Callable[[], bool] = lambda: False) -> Callable[..., Any]:
    """Tell the probe of each backward not started inside another (``nested``); with ``loss``,
    also of the tensors it starts from (``torch.autograd.backward(tensors, ...)``; not ``grad``,
    whose outputs may be anything), after ``on_backward_start`` counted it."""
    def backward(*args: Any, **kwargs: Any) -> Any:
        if nested():
            return original(*args, **kwargs)
        probe.on_backward_start()
        if loss:
            probe.on_loss(args[0] if args else kwargs.get("tensors"))
        try:
            return original(*args, **kwargs)
        finally:
            probe.on_backward_end()

    return probe_wrapper(backward, original)


def wrap_before(original: Callable[..., Any], before: Callable[..., None],
                probe: ProbeCallbacks) -> Callable[..., Any]:
    """Call ``before(*args, **kwargs)`` (guarded: a probe error disables the probe), then the
    original."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not probe.disabled:
            try:
                before(*args, **kwargs)
            except Exception as exc:
                probe.fail(f"{getattr(original, '__name__', 'wrapper')} wrapper", exc)
        return original(*args, **kwargs)

    return probe_wrapper(wrapper, original)


# A framework's whole checkpoint, wrapped where the framework is imported when the probe starts:
# it saves the weights through safetensors or its own I/O as well as torch.save, and its
# torch.save calls count inside it, once.
FRAMEWORK_CHECKPOINTS = (
    ("transformers.trainer", "Trainer", "_save_checkpoint",
     "transformers Trainer._save_checkpoint"),
    ("lightning.pytorch.trainer.trainer", "Trainer", "save_checkpoint",
     "lightning Trainer.save_checkpoint"),
    ("pytorch_lightning.trainer.trainer", "Trainer", "save_checkpoint",
     "lightning Trainer.save_checkpoint"),
)


# A framework's evaluation entry points, wrapped where the framework is imported when the probe
# starts (``evaluation_readings.EvaluationWatch``): (module, class, method, framework).
EVALUATIONS = (
    ("lightning.pytorch.loops.evaluation_loop", "_EvaluationLoop", "run", "lightning"),
    ("pytorch_lightning.loops.evaluation_loop", "_EvaluationLoop", "run", "lightning"),
    ("transformers.trainer", "Trainer", "evaluate", "transformers"),
)


def framework_checkpoint_methods() -> list[tuple[type, str, str]]:
    """(class, method name, writer) of the FRAMEWORK_CHECKPOINTS whose module is imported."""
    found = []
    for module_name, class_name, method, writer in FRAMEWORK_CHECKPOINTS:
        owner = getattr(sys.modules.get(module_name), class_name, None)
        if isinstance(owner, type):
            found.append((owner, method, writer))
    return found


class SaveNesting:
    """How deep the training is in checkpoint saves: only the outermost one is timed."""

    def __init__(self) -> None:
        self.depth = 0


def wrap_save(original: Callable[..., Any], probe: ProbeCallbacks, writer: str,
              nesting: SaveNesting) -> Callable[..., Any]:
    """Time each checkpoint save (``torch.save``, or a framework's checkpoint method) and tell
    the probe which step it fell in; saves inside another one are part of it."""
    clock = time.perf_counter

    def save(*args: Any, **kwargs: Any) -> Any:
        if nesting.depth:
            return original(*args, **kwargs)
        nesting.depth += 1
        started = clock()
        try:
            return original(*args, **kwargs)
        finally:
            nesting.depth -= 1
            if not probe.disabled:
                try:
                    probe.on_save(clock() - started, writer)
                except Exception as exc:
                    probe.fail("checkpoint save wrapper", exc)

    return probe_wrapper(save, original)


def grad_scaler_class(torch: Any) -> Any:
    """``torch.amp.GradScaler`` (torch >= 2.3; ``torch.cuda.amp.GradScaler`` subclasses it),
    else the older ``torch.cuda.amp.GradScaler``; None where neither exists."""
    scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler is None:
        scaler = getattr(getattr(getattr(torch, "cuda", None), "amp", None), "GradScaler", None)
    return scaler if isinstance(scaler, type) else None


def _reset_device(device: Any = None, *_: Any, **__: Any) -> Any:
    return device


def wrap_zero_grad(original: Callable[..., Any], readings: Any) -> Callable[..., Any]:
    """Count ``zero_grad`` calls into ``readings`` (the probe's ``OptimizerReadings``), and those
    that fill gradients with zeros (``set_to_none=False``, by keyword or position); note the
    step under way at each (a step without one adds to the previous step's gradients)."""
    steps, done = readings.zero_grad_steps, readings.host_times  # done: one entry per step

    def zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
        readings.zero_grad_calls += 1
        if not steps or steps[-1] != len(done):
            steps.append(len(done))
        set_to_none = args[0] if args else kwargs.get("set_to_none", True)
        if set_to_none is False or set_to_none == 0:
            readings.zero_grad_to_zeros += 1
        return original(self, *args, **kwargs)

    return probe_wrapper(zero_grad, original)


def wrap_empty_cache(original: Callable[..., Any], probe: ProbeCallbacks) -> Callable[..., Any]:
    def _cuda_emptyCache(*args: Any, **kwargs: Any) -> Any:
        before = probe.on_empty_cache_start()
        try:
            return original(*args, **kwargs)
        finally:
            probe.on_empty_cache_end(before)

    return probe_wrapper(_cuda_emptyCache, original)


def wrap_optimized_call(original: Callable[..., Any],
                        installation: Installation) -> Callable[..., Any]:
    probe = installation.probe

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if installation.armed and not probe.disabled:
            probe.on_global_forward(self, args)  # records the call and disarms the global hook
        return original(self, *args, **kwargs)

    return probe_wrapper(__call__, original)


def wrap_dynamo_reset(original: Callable[..., Any],
                      installation: Installation) -> Callable[..., Any]:
    """``torch._dynamo.reset()`` (``torch.compiler.reset()`` calls it) empties dynamo's
    compile-time metrics and guard failures, which the probe then counts from zero, and clears
    its compile-start callbacks: register the probe's again."""
    def reset(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        probe = installation.probe
        try:
            probe.on_dynamo_reset()
            handler = installation._compile_handler
            if handler is not None:
                from pytest_gputrain.probe.compile_readings import ensure_compile_callback

                ensure_compile_callback(handler, probe.on_compile_start)
        except Exception as exc:  # never let the probe break the reset
            probe.errors.append(f"torch._dynamo.reset wrapper: {exc}")
        return result

    return probe_wrapper(reset, original)


def wrap_compile(original: Callable[..., Any], installation: Installation) -> Callable[..., Any]:
    def compile(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            installation.patch_compiled_modules()
        except Exception as exc:  # never let the probe break torch.compile
            installation.probe.errors.append(f"torch.compile wrapper: {exc}")
        return result

    return probe_wrapper(compile, original)


class Installation:
    """The global hooks of one probe; ``remove()`` undoes all of them (idempotent)."""

    def __init__(self, torch: Any, probe: ProbeCallbacks) -> None:
        self.torch = torch
        self.probe = probe
        self.patches = Patches()
        self.handles: list[Any] = []
        self.installed = False
        self.armed = False
        # Arming happens several times per step, so it is a dictionary insert under one key
        # (what register_module_forward_pre_hook does, without a new handle object each time).
        self._hooks: Any = None
        self._key: Any = None
        self._hook: Any = None  # the probe's on_global_forward, once installed
        self._compile_handler: Any = None  # dynamo's callback handler, once registered
        self._sync_patches: list[tuple[Any, str]] = []  # (owner, name) of the sync wrappers

    # -- the armed/disarmed global forward pre hook ---------------------------------------------

    def arm(self) -> None:
        if not self.armed and self._hooks is not None:
            self._hooks[self._key] = self._hook
            self.armed = True

    def disarm(self) -> None:
        if self.armed:
            self.armed = False
            self._hooks.pop(self._key, None)

    # -- install / remove -----------------------------------------------------------------------

    def install(self) -> None:
        torch = self.torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from pytest_gputrain.probe.loader import wrap_next

        self.installed = True
        self._hook = self.probe.on_global_forward
        self.handles.append(register_optimizer_step_post_hook(self.probe.on_optimizer_step))
        from torch.nn.modules import module as module_module

        handle = module_module.register_module_forward_pre_hook(self._hook)
        self._hooks, self._key = module_module._global_forward_pre_hooks, handle.id
        self.armed = True
        self.handles.append(handle)
        autograd = torch.autograd
        nested = inside_backward(torch)
        self.patches.set(autograd, "backward",
                         wrap_backward(autograd.backward, self.probe, True, nested))
        self.patches.set(autograd, "grad", wrap_backward(autograd.grad, self.probe, False, nested))
        for owner, name, wrapper in sync_wrappers(torch, self.probe.record.syncs):
            self.patches.set(owner, name, wrapper)
            self._sync_patches.append((owner, name))
        from torch.utils.data import dataloader

        base = dataloader._BaseDataLoaderIter
        self.patches.set(base, "__next__", wrap_next(base.__next__, self.probe))
        self.wrap_checkpoints()
        if callable(getattr(torch, "compile", None)):
            self.patches.set(torch, "compile", wrap_compile(torch.compile, self))
        self.install_habit_hooks()
        self.patch_compiled_modules()
        self.install_truth_wrappers()

    def wrap_checkpoints(self) -> None:
        """``torch.save``, and the checkpoint methods of the frameworks already imported."""
        nesting = SaveNesting()
        if callable(getattr(self.torch, "save", None)):
            self.patches.set(self.torch, "save",
                             wrap_save(self.torch.save, self.probe, "torch.save", nesting))
        for owner, method, writer in framework_checkpoint_methods():
            original = vars(owner).get(method)
            if callable(original):
                self.patches.set(owner, method,
                                 wrap_save(original, self.probe, writer, nesting))

    def install_truth_wrappers(self) -> None:
        """Wrappers that keep the facts true to the test: its own memory peaks across a reset
        it makes, and the debugging APIs it calls while training (gradcheck, the start and
        stop of a profiler of its own)."""
        probe = self.probe
        memory = getattr(self.torch.cuda, "memory", None)
        reset = getattr(memory, "reset_peak_memory_stats", None)
        if reset is not None:
            wrapped = wrap_before(
                reset, lambda *a, **k: probe.on_reset_peak(_reset_device(*a, **k)), probe)
            self.patches.set(memory, "reset_peak_memory_stats", wrapped)
            if getattr(self.torch.cuda, "reset_peak_memory_stats", None) is reset:
                self.patches.set(self.torch.cuda, "reset_peak_memory_stats", wrapped)
        autograd = self.torch.autograd
        for name in DEBUG_APIS:
            original = getattr(autograd, name, None)
            if callable(original):
                self.patches.set(autograd, name,
                                 wrap_before(original, lambda *a, **k: probe.on_gradcheck(),
                                             probe))
        for owner, name, wrapper in ProfilerTimes(probe.record.settings).wrappers(self.torch):
            self.patches.set(owner, name, wrapper)
        utils = self.torch.nn.utils
        for name, kind in CLIPPING:
            original = getattr(utils, name, None)
            if callable(original):
                self.patches.set(utils, name, wrap_before(
                    original, lambda *a, _kind=kind, **k: probe.on_clip(_kind, _limit(a, k)),
                    probe))

    def install_habit_hooks(self) -> None:
        """Optimizer step timing, zero_grad, empty_cache and GradScaler.scale (the optimizer,
        allocator and mixed-precision habits the run rules judge)."""
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        torch = self.torch
        probe = self.probe
        self.handles.append(register_optimizer_step_pre_hook(probe.on_optimizer_pre_step))
        readings = probe.record.optimizer
        for owner in (torch.optim.Optimizer, torch.nn.Module):
            original = getattr(owner, "zero_grad", None)
            if original is not None:
                self.patches.set(owner, "zero_grad", wrap_zero_grad(original, readings))
        empty_cache = getattr(torch._C, "_cuda_emptyCache", None)
        if empty_cache is not None:  # CUDA builds only
            self.patches.set(torch._C, "_cuda_emptyCache", wrap_empty_cache(empty_cache, probe))
        scaler = grad_scaler_class(torch)
        scale = vars(scaler).get("scale") if scaler is not None else None
        if callable(scale):
            self.patches.set(scaler, "scale", wrap_before(
                scale, lambda self, *_, **__: probe.on_scale(self), probe))
        unscale = vars(scaler).get("unscale_") if scaler is not None else None
        if callable(unscale):
            self.patches.set(scaler, "unscale_", wrap_before(
                unscale, lambda self, *_, **__: probe.on_unscale(self), probe))

    def patch_compiled_modules(self) -> None:
        """Wrap OptimizedModule.__call__ and register the compile-start callback once dynamo is
        imported (never imports it)."""
        if not self.installed:
            return
        if self._compile_handler is None:
            from pytest_gputrain.probe.compile_readings import register_compile_callback

            self._compile_handler = register_compile_callback(self.probe.on_compile_start)
            if self._compile_handler is not None:
                self.probe.record.compile.callback = True
        dynamo = sys.modules.get("torch._dynamo")
        reset = getattr(dynamo, "reset", None)
        if reset is not None and not getattr(reset, "_gputrain_probe", False):
            self.patches.set(dynamo, "reset", wrap_dynamo_reset(reset, self))
        eval_frame = sys.modules.get("torch._dynamo.eval_frame")
        optimized = getattr(eval_frame, "OptimizedModule", None)
        if optimized is None:
            return
        if getattr(vars(optimized).get("__call__"), "_gputrain_probe", False):
            return
        self.patches.set(optimized, "__call__", wrap_optimized_call(optimized.__call__, self))

    def drop_sync_wrappers(self) -> list[str]:
        """Put torch's own syncing calls back for the rest of the test.

        Called when torch.compile starts compiling: dynamo would trace into the Python wrapper
        and meet the C method it wraps, which it cannot trace ("Dynamo does not know how to
        trace the builtin TensorBase.item"): a graph break and a warning that ``-W error`` turns
        into a failure of the user's test. Without the wrapper dynamo handles ``.item()`` as it
        always does; syncs are then counted by the profiler window only."""
        problems: list[str] = []
        owners: dict[int, tuple[Any, list[str]]] = {}
        for owner, name in self._sync_patches:
            owners.setdefault(id(owner), (owner, []))[1].append(name)
        for owner, names in owners.values():
            problems.extend(self.patches.restore_some(owner, names))
        self._sync_patches.clear()
        return problems

    def remove(self) -> list[str]:
        """Remove everything installed; returns problems found while doing so."""
        problems: list[str] = []
        self.disarm()
        self._hooks = None
        while self.handles:
            handle = self.handles.pop()
            try:
                handle.remove()
            except Exception as exc:  # pragma: no cover - RemovableHandle.remove never raises
                problems.append(f"hook removal failed: {exc}")
        problems.extend(self.patches.restore())
        handler, self._compile_handler = self._compile_handler, None
        if handler is not None:
            from pytest_gputrain.probe.compile_readings import remove_compile_callback

            try:
                remove_compile_callback(handler, self.probe.on_compile_start)
            except Exception as exc:
                problems.append(f"dynamo compile callback removal failed: {exc}")
        self.installed = False
        return problems


def global_hook_counts(torch: Any) -> dict[str, int]:
    """How many global hooks torch holds now (tests and the benchmark check for leftovers)."""
    from torch.nn.modules import module as module_module
    from torch.optim import optimizer as optimizer_module

    counts = {}
    for name in ("_global_forward_pre_hooks", "_global_forward_hooks",
                 "_global_backward_hooks", "_global_backward_pre_hooks"):
        counts[name] = len(getattr(module_module, name, {}) or {})
    for name in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"):
        counts[name] = len(getattr(optimizer_module, name, {}) or {})
    from torch.utils.data import dataloader

    owners: list[tuple[Any, str]] = [(torch.autograd, "backward"), (torch.autograd, "grad"),
                                     (dataloader._BaseDataLoaderIter, "__next__"),
                                     (torch, "compile"), (torch, "save")]
    owners += [(owner, method) for owner, method, _ in framework_checkpoint_methods()]
    owners += [(owner, method) for owner, method in (
        (getattr(sys.modules.get(module), name, None), method)
        for module, name, method, _ in EVALUATIONS) if isinstance(owner, type)]
    owners += [(owner, name) for owner, name, _ in sync_wrappers(torch, SyncTally())]
    owners += [(torch.autograd, name) for name in DEBUG_APIS]
    owners += [(torch.profiler.profile, name) for name in PROFILER_METHODS]
    owners += [(torch.nn.utils, name) for name, _ in CLIPPING]
    owners += [(torch.cuda, "reset_peak_memory_stats"),
               (torch.cuda.memory, "reset_peak_memory_stats")]
    owners += [(torch.optim.Optimizer, "zero_grad"), (torch.nn.Module, "zero_grad"),
               (torch._C, "_cuda_emptyCache")]
    scaler = grad_scaler_class(torch)
    if scaler is not None:
        owners += [(scaler, "scale"), (scaler, "unscale_")]
    optimized = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)
    if optimized is not None:
        owners.append((optimized, "__call__"))
    # host_stacks, warning/attention/recompute/update_readings (the schedulers' step)
    checkpoint = torch.utils.checkpoint
    owners += [(gc, "collect"), (warnings, "_showwarnmsg"),
               (torch.nn.functional, "scaled_dot_product_attention"),
               (checkpoint.CheckpointFunction, "forward"),
               (checkpoint, "_checkpoint_without_reentrant_generator")] + [
        (owner, "step") for owner in vars(torch.optim.lr_scheduler).values()
        if isinstance(owner, type) and "step" in vars(owner)]
    counts["patched_attributes"] = sum(
        1 for owner, name in owners if getattr(vars(owner).get(name), "_gputrain_probe", False))
    callback = sys.modules.get("torch._dynamo.callback")
    handler = getattr(callback, "callback_handler", None)
    counts["dynamo_compile_callbacks"] = sum(
        1 for function in getattr(handler, "start_callbacks", ())
        if getattr(function, "__qualname__", "") == "CompileWatch.on_compile_start")
    # host_stacks.HostWatch's garbage-collection timer
    counts["gc_callbacks"] = sum(1 for function in gc.callbacks
                                 if getattr(function, "__qualname__", "") == "HostWatch._on_gc")
    return counts
