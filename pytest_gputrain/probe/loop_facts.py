"""What the training loop itself does at each step, as groups of ``RunFacts`` (``facts.py``):
checkpoints written with ``torch.save`` (``run.checkpoint.*``, GT140), the loss each backward
starts from (``run.loss.*``: its device, whether it stayed finite and how it grew, GT142, GT143,
GT146), mixed precision (``run.amp.*``: fp16 autocast and a GradScaler's loss scaling, GT141)
and the gradients the backward computes that no optimizer uses (``run.grads.*``, GT145). Built
by ``habit_facts_builder.py``.
"""

from __future__ import annotations

from pydantic import Field

from pytest_gputrain.facts import FactGroup, fact


class CheckpointFacts(FactGroup):
    """Checkpoints written during training (timed by the probe's wrappers; GT140): ``torch.save``
    calls, or a framework's whole checkpoint (the Hugging Face Trainer's ``_save_checkpoint``,
    Lightning's ``Trainer.save_checkpoint``), whose ``torch.save`` calls count inside it."""

    saves: int = fact(doc="checkpoint saves during the test", default=0)
    writers: list[str] = Field(
        default_factory=list, description="what wrote them: torch.save, "
        "transformers Trainer._save_checkpoint, lightning Trainer.save_checkpoint")
    save_steps: int | None = fact(doc="steps after warm-up in which a checkpoint was saved")
    steps_percent: float | None = fact("%", "save_steps / steps after warm-up")
    time_per_save: float | None = fact("s", "median time inside one checkpoint save")
    time_percent: float | None = fact(
        "%", "time inside checkpoint saves during the steps after warm-up / those steps' wall "
        "time")


class LossFacts(FactGroup):
    """The tensor each backward started from (the loss): its device and whether it stayed
    finite (``probe/loss_readings.py``)."""

    backwards: int = fact(doc="torch.autograd.backward calls seen with their loss", default=0)
    cpu_backwards: int = fact(doc="of those, started from a tensor on the CPU", default=0)
    cpu_percent: float | None = fact("%", "cpu_backwards / backwards")
    checks: int | None = fact(
        doc="finiteness checks of the loss read (every few backwards, and the last loss)")
    nonfinite_checks: int | None = fact(doc="checks that found NaN or Inf in the loss")
    first_nonfinite_step: int | None = fact(
        doc="1-based optimizer step of the first check that found NaN or Inf")
    last_finite: bool | None = fact(doc="the last loss checked was finite")
    first_value: float | None = fact(
        doc="the loss at the first check (a loss of many elements: their mean)", signed=True)
    first_value_step: int | None = fact(doc="1-based optimizer step of that check")
    last_value: float | None = fact(doc="the loss at the last finite check", signed=True)
    last_value_step: int | None = fact(doc="1-based optimizer step of that check")
    max_value: float | None = fact(doc="the largest loss of the finite checks", signed=True)
    growth: float | None = fact(
        doc="last_value / first_value, for a loss that starts positive: how many times the "
            "loss grew over the test (below 1 it fell)", signed=True)
    growth_orders: float | None = fact(
        doc="log10 of growth: the orders of magnitude the loss grew (negative: it fell)",
        signed=True)
    values: list[str] = Field(
        default_factory=list, description="the finite checks as 'step: loss', at most 8 evenly "
        "spaced, first and last kept")


class AmpFacts(FactGroup):
    """Mixed precision: fp16 autocast in training forwards and a GradScaler's loss scaling."""

    fp16_forwards: int = fact(
        doc="grad-mode top-level forwards under CUDA autocast with dtype float16", default=0)
    fp16_percent: float | None = fact("%", "fp16_forwards / grad-mode top-level forwards")
    scaler_scales: int = fact(
        doc="GradScaler.scale calls with the scaler enabled (loss scaling)", default=0)
    clip_scaled: int = fact(
        doc="gradient clipping calls (clip_grad_norm_ / clip_grad_value_) made after a "
            "GradScaler scaled the loss and before scaler.unscale_: the gradients clipped were "
            "still multiplied by the loss scale", default=0)
    clip_scaled_percent: float | None = fact("%", "clip_scaled / run.optimizer.clip_calls")
    init_scale: float | None = fact(
        doc="the GradScaler's starting loss scale (init_scale; 65536 unless set)")
    clip_effective_limit: float | None = fact(
        doc="the clipping limit the unscaled gradients got at the starting scale: "
            "run.optimizer.clip_limit / init_scale")


class GradFacts(FactGroup):
    """Parameters that get a gradient at every backward although no optimizer updates them
    (``probe/gradient_readings.py``; read once after the warm-up, checked again at the end
    against every optimizer stepped)."""

    read_at_step: int | None = fact(doc="optimizer steps done when the gradients were read")
    model_params: int | None = fact(
        doc="parameter elements of the top-level modules an optimizer trains")
    trained_params: int | None = fact(doc="of those, the elements an optimizer holds")
    unused_params: int | None = fact(
        doc="elements with requires_grad and a gradient that no optimizer holds")
    unused_tensors: int | None = fact(doc="parameter tensors among them")
    unused_percent: float | None = fact("%", "unused_params / model_params")
    unused_bytes: int | None = fact(
        "bytes", "memory of their gradients (each .grad's elements x element size): exact")
    unused_modules: list[str] = Field(
        default_factory=list, description="the modules they belong to (the first part of "
        "their names), most parameters first, at most 8: 'backbone: 11,176,512 parameters, "
        "42.6 MiB of gradients'")
    unused_ahead: bool | None = fact(
        doc="all of them are registered before every trained parameter of their module (a "
            "backbone before its head): freezing them spares their whole backward")
    backward_time_estimate: float | None = fact(
        "s", "estimated GPU time per step their gradients cost: the GPU's kernel time per step "
             "x their share of the parameters x 2/3 (their backward, input and weight "
             "gradients, when they are ahead of every trained parameter) or x 1/3 (the weight "
             "gradients only); an estimate for layers whose work grows with their parameters")
    step_percent_estimate: float | None = fact(
        "%", "backward_time_estimate / run.step_time")
