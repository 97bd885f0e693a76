"""Whether the optimizer steps change the weights as the code means (``run.updates.*``: GT151,
GT152), from ``update_readings.UpdateWatch`` and the probe's ``zero_grad`` wrappers; built by
``update_facts_builder.py``."""

from __future__ import annotations

from pydantic import Field

from pytest_gputrain.facts import FactGroup, fact


class UpdateFacts(FactGroup):
    """The main optimizer's learning-rate schedule, zero_grad cadence, and the weights its steps
    left unchanged."""

    optimizer: str | None = fact(doc="class of the main optimizer")
    lr_start: float | None = fact(doc="its largest learning rate at its first step")
    lr_peak: float | None = fact(doc="the highest learning rate in force at any of its steps")
    lr_end: float | None = fact(doc="its largest learning rate when the test ended")
    lr_low_percent: float | None = fact(
        "%", "optimizer steps after the peak whose learning rate was under 1 % of the peak / all "
             "optimizer steps")
    lr_low_from_step: int | None = fact(
        doc="1-based first step after the peak at under 1 % of it")
    scheduler: str | None = fact(doc="class of the scheduler that stepped the main optimizer's "
                                     "learning rate most")
    scheduler_steps: int | None = fact(
        doc="its step() calls after the main optimizer's first step")
    scheduler_steps_per_step: float | None = fact(doc="scheduler_steps / optimizer steps")
    steps_without_zero_grad: int | None = fact(
        doc="optimizer steps after the first with no zero_grad call since the step before: "
            "their backward added to the gradients of the steps before")
    steps_without_zero_grad_percent: float | None = fact(
        "%", "steps_without_zero_grad / optimizer steps after the first")
    steps_per_zero_grad: float | None = fact(
        doc="optimizer steps per zero_grad call: the steps whose gradients each update sums, "
            "on average")
    checks: int | None = fact(doc="steps at which the weights the step left unchanged were "
                                  "counted (skipped steps left out)")
    skipped_checks: int | None = fact(
        doc="checked steps that changed no weight at all (a GradScaler's skipped step)")
    unchanged_percent: float | None = fact(
        "%", "elements with a non-zero gradient that kept their exact value through the step, "
             "over the checks")
    check_dtype: str | None = fact(doc="dtype of the parameters checked")
    check_lr: float | None = fact(doc="the learning rate at the last check")
    checked: list[str] = Field(default_factory=list,
                               description="each check: step, unchanged share, dtype, lr")
