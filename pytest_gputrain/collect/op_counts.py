"""The ATen operators a step dispatches, and where in the user's code its copies and
synchronisations come from.

``count_ops`` runs a few steps, each under a ``TorchDispatchMode`` of its own (torch's Python
dispatch key: every operator that reaches a backend, forward, backward and optimizer alike; the
autograd engine carries the mode to the threads it runs a backward on). Per step it counts:

- **operators** by name (``aten::mm``), each once however it is implemented below (the mode
  sees an operator before its kernels, not the operators it calls itself);
- **copies** between host and device made by ``_to_copy`` and ``copy_`` (``.to()``, ``.cuda()``,
  ``.cpu()``, ``copy_``): direction, bytes, pageable or pinned host memory, and the call site;
- **synchronisations** with their call sites: on CUDA, ``torch.cuda.set_sync_debug_mode("warn")``
  makes torch warn at every synchronising call it makes (``.item()``, ``.cpu()``, ``nonzero``,
  boolean masks, ``Stream.synchronize``), and the warning is taken as it is raised, with the
  operator running then and the user's frame calling it; ``torch.cuda.synchronize()`` and
  ``Event.synchronize()``, which torch does not warn about, are wrapped while the steps run.
  The warnings never reach the user (nor a ``-W error`` filter); other warnings of the step
  pass through as they would have.

The **call site** is the innermost frame outside torch and this package: ``train.py:42`` with
its line of code. A call the autograd engine makes on its own thread has none ("backward").
The counts of copies and synchronisations that ``cuda_activity`` reads from the CUDA runtime
are the exact ones (torch builds some tensors below the Python dispatch key); the sites here
say where the ones the code asked for come from.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

SYNC_WARNING = "called a synchronizing CUDA operation"  # c10::cuda::warn_or_error_on_sync
SKIPPED_NAMESPACES = ("profiler",)  # record_function's own operators: marks, not work
CODE_LENGTH = 100
# Devices whose memory a copy from the host crosses a bus to reach (a meta tensor holds none).
ACCELERATORS = frozenset({"cuda", "xpu", "mps", "hpu", "npu", "privateuseone"})


@dataclass(frozen=True)
class Site:
    """Where in the user's code: ``path:line`` and the line itself."""

    where: str
    code: str = ""


BACKWARD = Site("backward", "(the autograd engine's thread)")
UNKNOWN = Site("unknown", "")


@dataclass
class StepOps:
    """One step's operators, copies and synchronisations (see the module docstring)."""

    ops: Counter[str] = field(default_factory=Counter)
    # (direction, memory, bytes, operator, site) -> count
    copies: Counter[tuple[str, str, int, str, Site]] = field(default_factory=Counter)
    # (kind, operator or call, site) -> count
    syncs: Counter[tuple[str, str, Site]] = field(default_factory=Counter)


def op_name(func: Any) -> str | None:
    """``aten::mm`` for ``torch.ops.aten.mm.default``; None for the profiler's own marks."""
    namespace = getattr(func, "namespace", None) or "aten"
    if namespace in SKIPPED_NAMESPACES:
        return None
    packet = getattr(func, "overloadpacket", None)
    name = getattr(packet, "__name__", None) or str(func)
    return f"{namespace}::{name}"


_skipped_roots: tuple[str, ...] | None = None


def _skipped() -> tuple[str, ...]:
    """Folders whose frames are not the user's: torch's, this package's, the standard
    library's warnings and contextlib."""
    global _skipped_roots
    if _skipped_roots is None:
        roots = [str(Path(__file__).resolve().parents[1])]
        torch_file = getattr(sys.modules.get("torch"), "__file__", None)
        if torch_file:
            roots.append(str(Path(torch_file).resolve().parent))
        roots.extend(str(Path(path).resolve()) for path in (warnings.__file__,
                                                             contextlib.__file__) if path)
        _skipped_roots = tuple(roots)
    return _skipped_roots


def call_site(frame: FrameType | None) -> Site:
    """The innermost frame of ``frame``'s stack outside torch and this package."""
    skipped = _skipped()
    while frame is not None:
        filename = frame.f_code.co_filename
        try:
            resolved = str(Path(filename).resolve()) if not filename.startswith("<") else filename
        except OSError:
            resolved = filename
        if not resolved.startswith(skipped):
            return Site(_shown(resolved, frame.f_lineno),
                        linecache.getline(filename, frame.f_lineno).strip()[:CODE_LENGTH])
        frame = frame.f_back
    return BACKWARD if threading.current_thread() is not threading.main_thread() else UNKNOWN


def _shown(path: str, line: int) -> str:
    """``path:line``, the path relative to the current folder when it lies below it."""
    with contextlib.suppress(ValueError):
        path = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
    return f"{path}:{line}"


def _copy(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
          ) -> tuple[str, str, int] | None:
    """(direction, memory, bytes) of a host<->device copy operator, else None."""
    name = getattr(getattr(func, "overloadpacket", None), "__name__", "")
    try:
        if name == "_to_copy":
            source = args[0]
            target = kwargs.get("device")
            target_type = getattr(target, "type", None) or (str(target).split(":")[0]
                                                            if target else source.device.type)
            pinned_target = bool(kwargs.get("pin_memory"))
        elif name == "copy_":
            target_tensor, source = args[0], args[1]
            target_type = target_tensor.device.type
            pinned_target = target_type == "cpu" and bool(target_tensor.is_pinned())
        else:
            return None
        source_type = source.device.type
        size = int(source.numel()) * int(source.element_size())
        if source_type == "cpu" and target_type in ACCELERATORS:
            return "h2d", "pinned" if source.is_pinned() else "pageable", size
        if source_type in ACCELERATORS and target_type == "cpu":
            return "d2h", "pinned" if pinned_target else "pageable", size
    except Exception:
        return None
    return None


class _Tracker:
    """The counts of the step under way, the operators running now on each thread, and the
    kind of an explicit synchronisation under way (its warning, if any, is not a second one)."""

    def __init__(self) -> None:
        self.step = StepOps()
        self.running = threading.local()
        self.explicit = threading.local()

    def operator(self) -> str:
        """The operator running now on this thread; with none, the one that finished last
        (torch may hold an operator's sync warning until the Python call that led to it
        returns, as torch 2.11 does for ``Tensor.item()``), each such one named once."""
        stack = getattr(self.running, "stack", None)
        if stack:
            return stack[-1]
        finished, self.running.finished = getattr(self.running, "finished", ""), ""
        return str(finished)

    def sync(self, kind: str, frame: FrameType | None, what: str = "") -> None:
        self.step.syncs[(kind, what or self.operator(), call_site(frame))] += 1


def _mode(torch: Any, tracker: _Tracker) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    base: Any = TorchDispatchMode

    class CountingMode(base):  # type: ignore[misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            kwargs = kwargs or {}
            name = op_name(func)
            if name is not None:
                tracker.step.ops[name] += 1
                copy = _copy(func, args, kwargs)
                if copy is not None:
                    direction, memory, size = copy
                    site = call_site(sys._getframe(1))
                    tracker.step.copies[(direction, memory, size, name, site)] += 1
            stack = tracker.running.__dict__.setdefault("stack", [])
            stack.append(name or "")
            try:
                return func(*args, **kwargs)
            finally:
                stack.pop()
                if not stack:
                    tracker.running.finished = name or ""

    return CountingMode()


@contextlib.contextmanager
def _sync_sites(torch: Any, tracker: _Tracker) -> Iterator[None]:
    """Torch's sync debug mode, its warnings taken as call sites, and wrappers of the explicit
    synchronisations torch does not warn about; everything as it was afterwards."""
    cuda = torch.cuda
    previous_mode = cuda.get_sync_debug_mode()
    explicit = {(cuda, "synchronize"): ("device", "torch.cuda.synchronize"),
                (cuda.Event, "synchronize"): ("event", "Event.synchronize")}
    originals = {key: getattr(*key) for key in explicit}

    def wrapped(key: tuple[Any, str]) -> Callable[..., Any]:
        original = originals[key]
        kind, what = explicit[key]

        def synchronize(*args: Any, **kwargs: Any) -> Any:
            tracker.sync(kind, sys._getframe(1), what)
            tracker.explicit.kind = kind
            try:
                return original(*args, **kwargs)
            finally:
                tracker.explicit.kind = None
        return synchronize

    shown = warnings.showwarning
    show_impl = getattr(warnings, "_showwarnmsg_impl", None)

    def hook(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        if SYNC_WARNING in str(message):
            if getattr(tracker.explicit, "kind", None) is None:
                tracker.sync("stream", sys._getframe(1))
            return
        # Not ours: on to whoever would have shown it (pytest's recorder, the console).
        if show_impl is not None and shown is getattr(warnings, "_showwarning_orig", None):
            show_impl(warnings.WarningMessage(message, category, filename, lineno, file, line))
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.filterwarnings("always", message=f".*{SYNC_WARNING}", category=UserWarning)
        warnings.showwarning = hook
        for owner, name in explicit:
            setattr(owner, name, wrapped((owner, name)))
        cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            cuda.set_sync_debug_mode(previous_mode)
            for (owner, name), original in originals.items():
                setattr(owner, name, original)


def count_ops(torch: Any, step: Callable[[], Any], steps: int, cuda: bool
              ) -> list[StepOps] | str:
    """Run ``step`` ``steps`` times, each under the counting mode (and on CUDA with the
    synchronisations' sites); each step's counts, or why there are none. The step's own
    exceptions propagate."""
    try:
        tracker = _Tracker()
        mode = _mode(torch, tracker)
    except Exception as exc:
        return f"torch's dispatch modes cannot be used here: {exc}"
    found: list[StepOps] = []
    synchronize = torch.cuda.synchronize if cuda else None  # ours: before it is wrapped
    sites = _sync_sites(torch, tracker) if cuda else contextlib.nullcontext()
    with sites:
        for _ in range(steps):
            tracker.step = StepOps()
            with mode:
                step()
            found.append(tracker.step)
            tracker.step = StepOps()  # what follows is no step's
            if synchronize is not None:
                synchronize()  # the step's work is done before the next begins
    return found
