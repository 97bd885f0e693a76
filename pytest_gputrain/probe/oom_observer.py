"""The moment of a CUDA out-of-memory error, seen from inside the caching allocator.

By the time pytest sees an out-of-memory error the test has unwound: its ``finally:`` blocks have
restored the memory fraction and stopped the helper process that held the GPU. PyTorch's
allocator calls its out-of-memory observers at the failure itself, after releasing its lock and
before raising, with the device, the request, the limit in force (``total x fraction`` once a
fraction was set, else the device's total) and the free memory. The probe reads NVML's process
list there too, so other processes' memory is the memory they held at the failure.

Observers cannot be detached, so one observer is attached per process, the first time a probe
runs on an initialised CUDA context (attaching never initialises CUDA itself), and it forwards
to the probe of the running test, if any. It is unavailable under
``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync`` and in torch builds without the binding;
the failure is then described from the message and the probe's last readings. The callback
never raises: an exception there would replace the user's out-of-memory error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

Target = Callable[[int, int, int, int], None]

_target: Target | None = None
_attached = False
_unavailable: str | None = None


def _observe(device: int, requested: int, limit: int, free: int) -> None:
    target = _target
    if target is None:
        return
    with contextlib.suppress(Exception):  # never turn the user's OOM into the probe's error
        target(int(device), int(requested), int(limit), int(free))


def attach(torch: Any) -> str | None:
    """Attach the process's observer if CUDA is initialised; returns why it is not attached
    (None once attached). Cheap after the first call."""
    global _attached, _unavailable
    if _attached:
        return None
    if _unavailable is not None:
        return _unavailable
    binding = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if binding is None:
        _unavailable = "this torch build has no out-of-memory observer binding"
        return _unavailable
    try:
        if not torch.cuda.is_initialized():
            return "CUDA is not initialised yet"
        binding(_observe)
    except Exception as exc:  # e.g. cudaMallocAsync: "does not yet support ..."
        _unavailable = f"out-of-memory observer not available: {exc}"
        return _unavailable
    _attached = True
    return None


def set_target(target: Target | None) -> None:
    """Forward out-of-memory moments to ``target`` (the running test's probe), or to nobody."""
    global _target
    _target = target


def target() -> Target | None:
    return _target
