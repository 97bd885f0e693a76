"""``LossWatch``: what the run probe reads of the tensor each backward starts from, the loss.

Per backward (hot path): the device of the loss, one attribute read (GT143: a loss computed on
the CPU while the model trains on the GPU).

Whether the loss stayed finite (GT142), without a sync per step: every ``check_every``-th
backward (the first one included) queues ``torch.isfinite`` of the loss on the loss's own device
and keeps the 0-d result, a tensor the GPU fills when it gets there; nothing is read back while
the test trains. The last loss is kept (a reference, no copy) and checked when the test ends.
At most ``MAX_CHECKS`` checks are kept: when the list fills, every second one is dropped and
``check_every`` doubles, so a long run pays a few small kernels per doubling of its length and
its checks stay evenly spaced. At the end (``read_end``, after the hooks are gone) the checks
of each device are stacked and read back in one copy: one sync per device, after training.
No check is queued while a CUDA graph is being captured (it would join the graph), nor while
torch.compile traces (fake tensors), and after a CUDA error that left the context unusable the
checks are not read (``unread`` says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_gputrain.probe.torch_hooks import is_tracing

if TYPE_CHECKING:
    from pytest_gputrain.probe.callbacks import ProbeCallbacks

MAX_CHECKS = 64


class LossWatch:
    """The loss of each backward: its device, and finiteness checks queued on its device."""

    def __init__(self, torch: Any, probe: ProbeCallbacks) -> None:
        self.torch = torch
        self.probe = probe
        self.readings = probe.record.loss
        self._steps = probe.record.steps.times  # its length: the index of the step under way
        self._tracing = is_tracing(torch)
        self._tensor_type = torch.Tensor
        capturing = getattr(getattr(torch, "cuda", None), "is_current_stream_capturing", None)
        self._capturing = capturing if callable(capturing) else (lambda: False)

    def on_loss(self, tensors: Any) -> None:
        """``torch.autograd.backward(tensors, ...)`` is about to run (``Tensor.backward`` calls
        it): the first tensor is the loss."""
        if self.probe.disabled or self._tracing():
            return
        try:
            loss = tensors
            if not isinstance(loss, self._tensor_type):
                loss = next(iter(loss), None) if isinstance(loss, list | tuple) else None
                if not isinstance(loss, self._tensor_type):
                    return
            readings = self.readings
            readings.backwards += 1
            if not loss.is_cuda:
                readings.cpu += 1
            readings.last = loss
            readings.last_step = len(self._steps)
            if readings.backwards % readings.check_every == 1:
                self._check(loss, readings.last_step)
        except Exception as exc:
            self.probe.fail("backward wrapper (loss)", exc)

    def _check(self, loss: Any, step: int) -> None:
        """Queue ``isfinite`` of ``loss`` on its device; keep the result unread."""
        if loss.is_cuda and self._capturing():
            return
        finite = self.torch.isfinite(loss.detach())
        if finite.dim():
            finite = finite.all()
        checks = self.readings.checks
        checks.append((step, finite))
        if len(checks) >= MAX_CHECKS:
            del checks[1::2]
            self.readings.check_every *= 2

    def read_end(self, cuda_ok: bool) -> None:
        """Check the last loss and read every check back: one copy per device. With the CUDA
        context unusable (``cuda_ok`` False) the checks on CUDA are dropped unread."""
        readings = self.readings
        last, readings.last = readings.last, None
        try:
            if last is not None and (cuda_ok or not last.is_cuda) and not self.probe.disabled:
                step = readings.checks[-1][0] if readings.checks else -1
                if step != readings.last_step:
                    self._check(last, readings.last_step)
            by_device: dict[str, list[tuple[int, Any]]] = {}
            for step, finite in readings.checks:
                by_device.setdefault(str(finite.device), []).append((step, finite))
            found: list[tuple[int, bool]] = []
            for device, checks in by_device.items():
                if device != "cpu" and not cuda_ok:
                    readings.unread = "the CUDA context was unusable when the test ended"
                    continue
                values = self.torch.stack([finite for _, finite in checks]).tolist()
                found.extend((step, bool(value)) for (step, _), value in zip(
                    checks, values, strict=True))
            readings.finite = sorted(found)
        except Exception as exc:
            readings.unread = f"reading the loss checks: {type(exc).__name__}: {exc}"
        readings.checks = []
