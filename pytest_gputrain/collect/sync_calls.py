"""Host-device synchronisations asked for from Python, counted by kind and by call site.

A sync is a call that makes the host wait for the GPU: a value read back to Python from a CUDA
tensor (``Tensor.item``, ``tolist``, ``cpu``, ``bool(t)``, ``float(t)``, ``int(t)``) or an
explicit wait (``torch.cuda.synchronize()``, ``Stream.synchronize()``,
``Event.synchronize()``, ``torch.accelerator.synchronize()``). Each is counted under its kind
("Tensor.item", "torch.cuda.synchronize", ...) and under its call site: the first frame outside
torch that asked for it ("train.py:42 in train_step"), so a finding can name the line to
change. Syncs that pytest-gputrain's own code asks for (the probe's profiler window, the gate's
timing events) are not the test's and are not counted.

This module is the mechanism; a feature owns a ``SyncTally`` and installs the wrappers from
``sync_wrappers`` with its own patching (the run probe: ``probe/torch_hooks.py``, per optimizer
step, GT104). The interface, for any feature that counts what a step does:

    tally = SyncTally()
    for owner, name, wrapper in sync_wrappers(torch, tally):
        patches.set(owner, name, wrapper)          # undone exactly when the feature is done
    ...                                            # the code under test runs
    tally.pending, tally.pending_wait              # syncs and seconds waited since the last take
    tally.take()                                   # -> (count, seconds); starts a new interval
    tally.by_kind, tally.by_site                   # totals: {"Tensor.item": 3}, {Site: 3}

A subclass may override ``attribute(kind, module)`` to sort the syncs by the package that asked
for them (the probe tells a framework's own syncs from the test's).

Why wrappers and not ``torch.cuda.set_sync_debug_mode("warn")``: the debug mode reports each sync
as a Python warning, which would land in the user's warnings summary, turn into an exception
under ``-W error``, and be caught by the user's own ``pytest.warns`` blocks. The wrappers see the
syncs asked for from Python; those made inside C++ (boolean-mask indexing, ``nonzero``) are seen
by a profiler only (the probe's window counts them).

Cost: a wrapped method called on a CPU tensor costs one attribute read more than torch's own
(the common case in optimizers, which call ``item()`` on CPU step counters); a counted sync
costs a walk of a few frames, beside a wait of tens of microseconds at least.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Final, NamedTuple

# Tensor methods that read a CUDA tensor's value back to the host.
TENSOR_METHODS: Final = ("item", "tolist", "cpu", "__bool__", "__float__", "__int__")
# Those that take no argument get a wrapper without *args/**kwargs: a quarter of the cost per
# call, which matters for ``item``: torch's (foreach, non-capturable) Adam and AdamW call it on
# each parameter's CPU step counter, twice per parameter and step.
NO_ARGUMENT_METHODS: Final = frozenset({"item", "tolist", "__bool__", "__float__", "__int__"})
# Explicit waits: (owner's path under torch, attribute, kind).
EXPLICIT_WAITS: Final = (
    ("cuda", "synchronize", "torch.cuda.synchronize"),
    ("cuda.Stream", "synchronize", "Stream.synchronize"),
    ("cuda.Event", "synchronize", "Event.synchronize"),
    ("accelerator", "synchronize", "torch.accelerator.synchronize"),
)
MAX_SITES: Final = 32  # distinct call sites kept; later ones are counted as OTHER_SITE
MAX_FRAMES: Final = 12  # frames walked up from a sync to find its caller outside torch
OTHER_SITE: Final = "other call sites"
_TORCH: Final = ("torch",)
_OWN: Final = "pytest_gputrain"  # this plugin's own syncs are not the test's


def tensor_kind(name: str) -> str:
    """The kind a tensor method's syncs are counted under: ``Tensor.item``, ..."""
    return f"Tensor.{name}"


class Site(NamedTuple):
    """Where a sync was asked for: the first frame outside torch."""

    kind: str
    file: str  # the file's name (no directory: facts are read on other machines)
    line: int
    function: str

    def text(self) -> str:
        return f"{self.kind} at {self.file}:{self.line} in {self.function}"


@dataclass(slots=True)
class SyncTally:
    """Counts of the syncs the wrappers saw: per interval (``pending``, reset by ``take``) and
    in total, by kind and by call site."""

    pending: int = 0  # since the last take()
    pending_wait: float = 0.0  # seconds the host spent inside them since the last take()
    by_kind: dict[str, int] = field(default_factory=dict)
    by_site: dict[Site | str, int] = field(default_factory=dict)  # OTHER_SITE past MAX_SITES

    def take(self) -> tuple[int, float]:
        """The syncs and the seconds waited in them since the last call; starts anew."""
        taken = self.pending, self.pending_wait
        self.pending, self.pending_wait = 0, 0.0
        return taken

    def count(self, kind: str, frame: FrameType | None) -> bool:
        """A sync of ``kind`` asked for by the code at ``frame`` (the wrapper's caller):
        counted unless this plugin asked for it. Returns whether it was counted."""
        caller = frame
        for _ in range(MAX_FRAMES):
            if caller is None:
                break
            module = caller.f_globals.get("__name__")
            top = module.partition(".")[0] if isinstance(module, str) else ""
            if top == _OWN:
                return False
            if top not in _TORCH:
                break
            caller = caller.f_back
        else:
            caller = None  # deeper than MAX_FRAMES inside torch: the site is not known
        self.pending += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        if caller is not None:
            code = caller.f_code
            site: Site | str = Site(kind, os.path.basename(code.co_filename), caller.f_lineno,
                                    code.co_name)
            if site not in self.by_site and len(self.by_site) >= MAX_SITES:
                site = OTHER_SITE
            self.by_site[site] = self.by_site.get(site, 0) + 1
            self.attribute(kind, caller.f_globals.get("__name__"))
        else:
            self.attribute(kind, None)
        return True

    def attribute(self, kind: str, module: object) -> None:
        """A counted sync asked for by code of ``module`` (its ``__name__``; None when not
        known): subclasses sort syncs by who asked for them."""

    def sites(self) -> list[str]:
        """Every call site with its count, most frequent first: 'Tensor.item at train.py:42 in
        step: 200'."""
        ranked = sorted(self.by_site.items(),
                        key=lambda item: (-item[1], item[0] if isinstance(item[0], str)
                                          else item[0].text()))
        return [f"{site if isinstance(site, str) else site.text()}: {count}"
                for site, count in ranked]


def sync_wrappers(torch: Any, tally: SyncTally) -> list[tuple[Any, str, Callable[..., Any]]]:
    """(owner, attribute, wrapper) for every syncing call this torch has: the caller sets them
    (and undoes them). A wrapper counts into ``tally`` and times the wait."""
    found: list[tuple[Any, str, Callable[..., Any]]] = []
    for name in TENSOR_METHODS:
        original = getattr(torch.Tensor, name, None)
        if original is not None:
            found.append((torch.Tensor, name, wrap_tensor_method(name, original, tally)))
    for path, name, kind in EXPLICIT_WAITS:
        owner: Any = torch
        for part in path.split("."):
            owner = getattr(owner, part, None)
        original = getattr(owner, name, None) if owner is not None else None
        if callable(original):
            found.append((owner, name, wrap_wait(kind, original, tally)))
    return found


def wrap_tensor_method(name: str, original: Callable[..., Any], tally: SyncTally
                       ) -> Callable[..., Any]:
    """``Tensor.<name>`` counting its calls on CUDA tensors (a call on a CPU tensor is passed
    through after one attribute read)."""
    kind = tensor_kind(name)
    clock = time.perf_counter
    getframe = sys._getframe

    def is_cuda(tensor: Any) -> bool:
        try:
            return bool(tensor.is_cuda)
        except Exception:  # exotic tensor subclasses: count nothing, change nothing
            return False

    wrapper: Callable[..., Any]
    if name in NO_ARGUMENT_METHODS:
        def wrapper(self: Any) -> Any:
            try:
                cuda = self.is_cuda  # inline: the common CPU case is one attribute read
            except Exception:
                cuda = False
            if not cuda or not tally.count(kind, getframe(1)):
                return original(self)
            started = clock()
            try:
                return original(self)
            finally:
                tally.pending_wait += clock() - started
    else:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not is_cuda(self) or not tally.count(kind, getframe(1)):
                return original(self, *args, **kwargs)
            started = clock()
            try:
                return original(self, *args, **kwargs)
            finally:
                tally.pending_wait += clock() - started

    return dressed(wrapper, original)


def wrap_wait(kind: str, original: Callable[..., Any], tally: SyncTally) -> Callable[..., Any]:
    """An explicit wait for the GPU, counted once it returned (a call that raised, on a
    machine without CUDA, waited for nothing)."""
    clock = time.perf_counter
    getframe = sys._getframe

    def wait(*args: Any, **kwargs: Any) -> Any:
        caller = getframe(1)
        started = clock()
        result = original(*args, **kwargs)
        waited = clock() - started
        if tally.count(kind, caller):
            tally.pending_wait += waited
        return result

    return dressed(wait, original)


def dressed(wrapper: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``wrapper`` dressed as ``original`` (name, qualified name, doc, ``__wrapped__``) and
    marked as pytest-gputrain's (``_gputrain_probe``), so that the uninstall finds it and a
    second install does not wrap it again."""
    for attribute in ("__name__", "__qualname__", "__doc__"):
        value = getattr(original, attribute, None)
        if value is not None:
            setattr(wrapper, attribute, value)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper._gputrain_probe = True  # type: ignore[attr-defined]
    return wrapper


__all__ = ["EXPLICIT_WAITS", "MAX_SITES", "OTHER_SITE", "TENSOR_METHODS", "Site", "SyncTally",
           "dressed", "sync_wrappers", "tensor_kind"]
