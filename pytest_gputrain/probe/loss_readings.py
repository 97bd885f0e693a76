"""``LossWatch``: what the run probe reads of the tensor each backward starts from, the loss.

Per backward (hot path): the device of the loss, one attribute read (GT143: a loss computed on
the CPU while the model trains on the GPU).

Whether the loss stayed finite (GT142) and how it moved (GT146: a loss that grows by orders of
magnitude without ever becoming NaN), without a sync per step: every ``check_every``-th
backward (the first one included) queues ``torch.isfinite`` of the loss and a copy of its value
on the loss's own device, into the next column of ``slots``, a float tensor of 2 x
``MAX_CHECKS`` (row 0: finite, row 1: the value) allocated once at the first check on that
device, so the checks add no allocation the memory facts would see after it (their temporaries
are freed within the step). Nothing is read back while the test trains. The last loss is kept
(a reference, no copy) and checked when the test ends. When the slots fill, every second check
is dropped and ``check_every`` doubles, so a long run pays a few small kernels per doubling of
its length and its checks stay evenly spaced. At
the end (``read_end``, after the hooks are gone) the slots are read back in one copy: one sync,
after training. A loss on another device than the first checked one is not checked (moving the
result would sync); no check is queued while a CUDA graph is being captured (it would join the
graph), nor while torch.compile traces (fake tensors); after a CUDA error that left the context
unusable the checks are not read (``unread`` says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
        # The backwards the module watch counted (``on_backward_start`` runs first): not those
        # torch.compile traces on fake tensors, none once the probe is disabled.
        self._forwards = probe.record.forwards
        self._seen = 0
        self._tensor_type = torch.Tensor
        capturing = getattr(getattr(torch, "cuda", None), "is_current_stream_capturing", None)
        self._capturing = capturing if callable(capturing) else (lambda: False)

    def on_loss(self, tensors: Any) -> None:
        """``torch.autograd.backward(tensors, ...)`` is about to run (``Tensor.backward`` calls
        it), and the module watch has counted it: the first tensor is the loss."""
        counted = self._forwards.backwards
        if counted == self._seen:
            return
        self._seen = counted
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
        """Queue ``isfinite`` of ``loss`` into the next slot of ``flags``; read nothing."""
        torch = self.torch
        readings = self.readings
        if loss.is_cuda and self._capturing():
            return
        slots = readings.slots
        if slots is None:
            slots = readings.slots = torch.ones(2, MAX_CHECKS, dtype=torch.float32,
                                                device=loss.device)
        elif slots.device != loss.device:
            return
        detached = loss.detach()
        finite = torch.isfinite(detached)
        steps = readings.checked_steps
        column = len(steps)
        slots[0, column] = finite.all() if finite.dim() else finite
        # The value of a scalar loss (a loss of many elements: their mean), as float32.
        slots[1, column] = detached if detached.dim() == 0 else detached.float().mean()
        steps.append(step)
        if len(steps) == MAX_CHECKS:  # keep every second check, evenly spaced
            slots[:, :MAX_CHECKS // 2] = slots[:, 0::2].clone()
            del steps[1::2]
            readings.check_every *= 2

    def read_end(self, cuda_ok: bool) -> None:
        """Check the last loss and read every check back in one copy. With the CUDA context
        unusable (``cuda_ok`` False) checks on CUDA are dropped unread."""
        readings = self.readings
        last, readings.last = readings.last, None
        try:
            if readings.slots is not None and readings.slots.device.type != "cpu" \
                    and not cuda_ok:
                readings.unread = "the CUDA context was unusable when the test ended"
                return
            checked = readings.checked_steps
            if last is not None and not self.probe.disabled and (cuda_ok or not last.is_cuda) \
                    and (not checked or checked[-1] != readings.last_step):
                self._check(last, readings.last_step)
            steps, slots = readings.checked_steps, readings.slots
            if slots is not None and steps:
                finite, values = slots[:, :len(steps)].tolist()  # one copy, after training
                readings.finite = [(step, bool(flag)) for step, flag in zip(
                    steps, finite, strict=True)]
                readings.values = [(step, float(value)) for step, value, flag in zip(
                    steps, values, finite, strict=True) if flag]
        except Exception as exc:
            readings.unread = f"reading the loss checks: {type(exc).__name__}: {exc}"
        finally:
            readings.slots = None
            readings.checked_steps = []
