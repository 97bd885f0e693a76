"""Install and remove the probe's global torch hooks, exactly, around one test call.

What is installed (and only while a diagnosed test's call phase runs):

- an optimizer step post hook (``torch.optim.optimizer.register_optimizer_step_post_hook``):
  the step boundary;
- a global module forward pre hook, *armed only between top-level forwards*: it sees the first
  module called outside any other module's forward, then disarms itself so that submodules keep
  PyTorch's hook-free fast path; a forward hook on that top-level module (with its keyword
  arguments, called also when the forward raises) re-arms it. A leaf module without parameters
  (a loss, an activation) gets no hook of its own: the global hook stays armed through it;
- wrappers of ``torch.autograd.backward`` / ``torch.autograd.grad`` (backward counting);
- wrappers of the Python-level syncing tensor methods (``item``, ``tolist``, ``cpu``,
  ``__bool__``, ``__float__``, ``__int__``) that count calls on CUDA tensors;
- a wrapper of ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__`` (loader.py);
- for ``torch.compile``d modules, a wrapper of ``OptimizedModule.__call__`` that records the call
  and disarms the global hook *before* dynamo looks for global hooks (it warns whenever one is
  installed, which would reach the user's warnings summary, or fail a ``-W error`` run); it is
  installed when dynamo is already imported, or by a wrapper of ``torch.compile`` right after
  the test compiles its model.

Why wrap methods instead of ``torch.cuda.set_sync_debug_mode("warn")``: the debug mode reports
each sync as a Python warning, so it would print into the user's warnings summary, turn into
exceptions under ``-W error`` / ``filterwarnings = error`` (common in test suites), and be caught
by the user's own ``pytest.warns`` blocks; and building a warning costs more than the counter.
The wrappers see only syncs asked for from Python (the usual culprits: ``loss.item()``,
``print(t)``, ``t.cpu()``, ``if t:``); the profiler window also counts every
``cuda*Synchronize`` the runtime saw, C++ ones (``nonzero``, boolean masks) included.

Every hook body is guarded: an exception in the probe disables it for the rest of the test and
is recorded in ``run.probe_errors``; it never reaches user code.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

SYNC_METHODS = ("item", "tolist", "cpu", "__bool__", "__float__", "__int__")
# Those that take no argument get a wrapper without *args/**kwargs: a quarter of the cost per
# call, which matters for ``item``: torch's (foreach, non-capturable) Adam and AdamW call it on
# each parameter's CPU step counter, twice per parameter and step.
NO_ARGUMENT_METHODS = frozenset({"item", "tolist", "__bool__", "__float__", "__int__"})


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
            owner, name, had, original, replacement = self._saved.pop()
            current = vars(owner).get(name)
            if current is not replacement:
                label = getattr(owner, "__name__", type(owner).__name__)
                problems.append(f"{label}.{name} was replaced during the test; left as found")
                continue
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        return problems

    def __len__(self) -> int:
        return len(self._saved)


def is_compiling(torch: Any) -> Callable[[], bool]:
    """``torch.compiler.is_compiling`` where it exists (hooks do nothing while dynamo traces)."""
    compiler = getattr(torch, "compiler", None)
    function = getattr(compiler, "is_compiling", None)
    if callable(function):
        return function  # type: ignore[no-any-return]
    return lambda: False


def wrap_sync_method(name: str, original: Callable[..., Any], counts: Any) -> Callable[..., Any]:
    """Count calls on CUDA tensors into ``counts`` (the probe's ``SyncCounts``)."""
    def is_cuda(tensor: Any) -> bool:
        try:
            return bool(tensor.is_cuda)
        except Exception:  # exotic tensor subclasses: count nothing, change nothing
            return False

    def count() -> None:
        counts.pending += 1
        counts.by_call[name] = counts.by_call.get(name, 0) + 1

    wrapper: Callable[..., Any]
    if name in NO_ARGUMENT_METHODS:
        def wrapper(self: Any) -> Any:
            try:
                cuda = self.is_cuda  # inline: the common CPU case is one attribute read
            except Exception:
                cuda = False
            if cuda:
                count()
            return original(self)
    else:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if is_cuda(self):
                count()
            return original(self, *args, **kwargs)

    wrapper.__name__ = getattr(original, "__name__", name)
    wrapper.__qualname__ = getattr(original, "__qualname__", name)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper._gputrain_probe = True  # type: ignore[attr-defined]
    return wrapper


def wrap_backward(original: Callable[..., Any], probe: Any) -> Callable[..., Any]:
    def backward(*args: Any, **kwargs: Any) -> Any:
        probe.on_backward_start()
        try:
            return original(*args, **kwargs)
        finally:
            probe.on_backward_end()

    backward.__name__ = getattr(original, "__name__", "backward")
    backward.__qualname__ = getattr(original, "__qualname__", "backward")
    backward.__doc__ = getattr(original, "__doc__", None)
    backward.__wrapped__ = original  # type: ignore[attr-defined]
    backward._gputrain_probe = True  # type: ignore[attr-defined]
    return backward


def wrap_optimized_call(original: Callable[..., Any], probe: Any) -> Callable[..., Any]:
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if probe.install.armed and not probe.disabled:
            probe.on_global_forward(self, args)  # records the call and disarms the global hook
        return original(self, *args, **kwargs)

    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    __call__._gputrain_probe = True  # type: ignore[attr-defined]
    return __call__


def wrap_compile(original: Callable[..., Any], installation: Installation) -> Callable[..., Any]:
    def compile(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            installation.patch_compiled_modules()
        except Exception as exc:  # never let the probe break torch.compile
            installation.probe.errors.append(f"torch.compile wrapper: {exc}")
        return result

    compile.__wrapped__ = original  # type: ignore[attr-defined]
    compile.__doc__ = getattr(original, "__doc__", None)
    compile._gputrain_probe = True  # type: ignore[attr-defined]
    return compile


class Installation:
    """The global hooks of one probe; ``remove()`` undoes all of them (idempotent)."""

    def __init__(self, torch: Any, probe: Any) -> None:
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
        self._hook = probe.on_global_forward

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
        self.handles.append(register_optimizer_step_post_hook(self.probe.on_optimizer_step))
        from torch.nn.modules import module as module_module

        handle = module_module.register_module_forward_pre_hook(self._hook)
        self._hooks, self._key = module_module._global_forward_pre_hooks, handle.id
        self.armed = True
        self.handles.append(handle)
        autograd = torch.autograd
        self.patches.set(autograd, "backward", wrap_backward(autograd.backward, self.probe))
        self.patches.set(autograd, "grad", wrap_backward(autograd.grad, self.probe))
        for name in SYNC_METHODS:
            original = getattr(torch.Tensor, name, None)
            if original is not None:
                self.patches.set(torch.Tensor, name,
                                 wrap_sync_method(name, original, self.probe.record.syncs))
        from torch.utils.data import dataloader

        base = dataloader._BaseDataLoaderIter
        self.patches.set(base, "__next__", wrap_next(base.__next__, self.probe))
        if callable(getattr(torch, "compile", None)):
            self.patches.set(torch, "compile", wrap_compile(torch.compile, self))
        self.patch_compiled_modules()

    def patch_compiled_modules(self) -> None:
        """Wrap OptimizedModule.__call__ once dynamo is imported (never imports it)."""
        eval_frame = sys.modules.get("torch._dynamo.eval_frame")
        optimized = getattr(eval_frame, "OptimizedModule", None)
        if optimized is None or not self.installed:
            return
        if getattr(vars(optimized).get("__call__"), "_gputrain_probe", False):
            return
        self.patches.set(optimized, "__call__",
                         wrap_optimized_call(optimized.__call__, self.probe))

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
                                     (torch, "compile")]
    owners += [(torch.Tensor, name) for name in SYNC_METHODS]
    optimized = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)
    if optimized is not None:
        owners.append((optimized, "__call__"))
    counts["patched_attributes"] = sum(
        1 for owner, name in owners if getattr(vars(owner).get(name), "_gputrain_probe", False))
    return counts
