"""``UpdateWatch``: whether the optimizer steps of a test change the weights as the code means.

Three readings, none a sync while the test trains and none on the per-step path:

- **the learning rate**: a wrapper of ``torch.optim.lr_scheduler.LRScheduler.step`` (and of
  ``ReduceLROnPlateau.step`` where it has its own) notes, at each scheduler step, the scheduler's
  class, the optimizer steps done so far and the largest learning rate of its optimizer's groups
  after it. A learning rate only changes there (or where the test sets it itself: the rate at
  the first optimizer step and at the end, ``OptimizerReadings.lr_first``/``lr_last``, are read
  by the probe), so the schedule is exact at no per-step
  cost. A rate that is a tensor on a GPU is not read (reading it would synchronise).
- **zero_grad's cadence**: the probe's ``zero_grad`` wrappers note the step under way at each
  call (``OptimizerReadings.zero_grad_steps``); an optimizer step with no call since the one
  before adds its gradients to the previous step's.
- **weights an optimizer step left unchanged**: at a few steps (``CHECK_STEPS``, then every
  doubling), the main optimizer's parameters (a slice of each, ``CHECK_ELEMENTS`` in all) are
  copied before the step, and after it the elements that had a non-zero gradient and kept their
  exact value are counted, on the parameters' device, into a small tensor read once when the test
  ends. Weights stored in bfloat16 (or float16) without a float32 master copy lose every update
  smaller than half the spacing between neighbouring values; a learning rate decayed to nothing
  does the same.

Built into ``run.updates.*`` by ``update_facts_builder.py``.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Final

from pytest_gputrain.probe.optimizer_readings import largest_lr
from pytest_gputrain.probe.run_record import RunRecord, SchedulerStep, UpdateCheck
from pytest_gputrain.probe.wrapping import probe_wrapper

if TYPE_CHECKING:
    from pytest_gputrain.probe.callbacks import ProbeCallbacks
    from pytest_gputrain.probe.torch_hooks import Patches

CHECK_STEPS: Final = 4  # the first check; then 8, 16, 32, ... (0-based step indices)
MAX_CHECKS: Final = 16
CHECK_ELEMENTS: Final = 1 << 20  # parameter elements compared at a check, at most
MAX_SCHEDULER_STEPS: Final = 8192


class UpdateWatch:
    """The learning rate at each scheduler step, and the unchanged-weight checks."""

    def __init__(self, torch: Any, probe: ProbeCallbacks) -> None:
        self.torch = torch
        self.probe = probe
        self.record: RunRecord = probe.record
        self.readings = probe.record.updates
        self.due = CHECK_STEPS  # the step index of the next check
        self._before: list[tuple[Any, Any, Any]] = []  # (param slice, its copy, grad slice)
        self._counts: Any = None  # int64 tensor: [unchanged, with a gradient] per check
        capturing = getattr(getattr(torch, "cuda", None), "is_current_stream_capturing", None)
        self._capturing = capturing if callable(capturing) else (lambda: False)

    # -- the learning rate ------------------------------------------------------------------

    def start(self, patches: Patches) -> None:
        scheduler_module = getattr(getattr(self.torch, "optim", None), "lr_scheduler", None)
        for name in ("LRScheduler", "_LRScheduler", "ReduceLROnPlateau"):
            owner = getattr(scheduler_module, name, None)
            step = vars(owner).get("step") if isinstance(owner, type) else None
            if callable(step) and not getattr(step, "_gputrain_probe", False):
                patches.set(owner, "step", self._wrap_step(step))

    def _wrap_step(self, original: Any) -> Any:
        readings = self.readings
        steps = self.record.steps.times

        def step(scheduler: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(scheduler, *args, **kwargs)
            if not self.probe.disabled and len(readings.schedulers) < MAX_SCHEDULER_STEPS:
                try:
                    optimizer = getattr(scheduler, "optimizer", None)
                    readings.schedulers.append(SchedulerStep(
                        scheduler=type(scheduler).__name__, optimizer=id(optimizer),
                        step=len(steps), lr=largest_lr(optimizer)))
                except Exception as exc:
                    self.probe.fail("learning-rate scheduler wrapper", exc)
            return result

        return probe_wrapper(step, original)

    def stop(self, cuda_ok: bool) -> None:
        """The main optimizer (which one, its learning rate now), and the checks read back in
        one copy."""
        readings = self.readings
        primary = self.record.optimizers.primary
        if primary is not None:
            readings.primary = id(primary)
            with contextlib.suppress(Exception):
                self.record.optimizer.lr_last = largest_lr(primary)
        self._before = []
        counts, self._counts = self._counts, None
        if counts is None or not readings.checks:
            return
        if counts.device.type != "cpu" and not cuda_ok:
            readings.unread = "the CUDA context was unusable when the test ended"
            readings.checks = []
            return
        try:
            values = counts[:2 * len(readings.checks)].tolist()
        except Exception as exc:
            readings.unread = f"reading the checks: {type(exc).__name__}: {exc}"
            readings.checks = []
            return
        for index, check in enumerate(readings.checks):
            check.unchanged, check.with_grad = int(values[2 * index]), int(values[2 * index + 1])

    # -- the unchanged-weight checks (at a few steps) ----------------------------------------

    def at_pre_step(self, done: int, optimizer: Any) -> None:
        """The optimizer's pre-step hook, ``done`` steps so far: a check's copies at a check
        step; the checks' counts allocated at a warm-up step."""
        if done == self.due:
            self.before_step(optimizer)
        elif done == 1:
            self.prepare(optimizer)

    def prepare(self, optimizer: Any) -> None:
        """Allocate the checks' counts on the main optimizer's device at a warm-up step: made
        at the first check, they would be a rise of the allocated bytes that the memory facts
        (GT108) see."""
        if optimizer is not self.record.optimizers.primary or self.probe.disabled:
            return
        try:
            param = next((p for group in optimizer.param_groups for p in group.get("params", ())
                          if p.is_floating_point()), None)
            if param is None or (param.is_cuda and self._capturing()):
                return
            self._counts = self.torch.zeros(2 * MAX_CHECKS, dtype=self.torch.int64,
                                            device=param.device)
        except Exception as exc:
            self.probe.fail("optimizer check preparation", exc)

    def before_step(self, optimizer: Any) -> None:
        """Copy a slice of each parameter that has a gradient (the pre-step hook, at a check)."""
        if optimizer is not self.record.optimizers.primary or self.probe.disabled:
            return
        try:
            self._before = []
            budget = CHECK_ELEMENTS
            for group in optimizer.param_groups:
                for param in group.get("params", ()):
                    grad = param.grad
                    if budget <= 0 or grad is None or grad.is_sparse or (
                            not param.is_floating_point()):
                        continue
                    if param.is_cuda and self._capturing():
                        return  # a CUDA graph is being captured: queue nothing into it
                    count = min(budget, param.numel())
                    flat = param.detach().reshape(-1)[:count]
                    self._before.append((flat, flat.clone(), grad.detach().reshape(-1)[:count]))
                    budget -= count
        except Exception as exc:
            self._before = []
            self.probe.fail("optimizer pre-step check", exc)

    def after_step(self, optimizer: Any) -> None:
        """Count, on the device, the elements with a gradient that kept their value, and plan
        the next check (the step post hook, at a check)."""
        before, self._before = self._before, []
        self.due *= 2
        readings = self.readings
        if not before or len(readings.checks) >= MAX_CHECKS or self.probe.disabled:
            return
        try:
            torch = self.torch
            device = before[0][0].device
            if any(flat.device != device for flat, _, _ in before):
                return
            if self._counts is None:
                self._counts = torch.zeros(2 * MAX_CHECKS, dtype=torch.int64, device=device)
            elif self._counts.device != device:
                return
            slot = 2 * len(readings.checks)
            for flat, copy, grad in before:
                moved = grad != 0
                self._counts[slot] += (moved & (flat == copy)).sum()
                self._counts[slot + 1] += moved.sum()
            first = before[0][0]
            readings.checks.append(UpdateCheck(
                step=len(self.record.steps.times), dtype=str(first.dtype).removeprefix("torch."),
                lr=largest_lr(optimizer)))
        except Exception as exc:
            self.probe.fail("optimizer post-step check", exc)
