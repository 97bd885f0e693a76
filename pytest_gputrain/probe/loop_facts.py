"""What the training loop itself does at each step, as groups of ``RunFacts`` (``facts.py``):
checkpoints written with ``torch.save`` (``run.checkpoint.*``, GT140), the loss each backward
starts from (``run.loss.*``: its device and whether it stayed finite, GT142, GT143) and mixed
precision (``run.amp.*``: fp16 autocast and a GradScaler's loss scaling, GT141). Built by
``habit_facts_builder.py``.
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


class AmpFacts(FactGroup):
    """Mixed precision: fp16 autocast in training forwards and a GradScaler's loss scaling."""

    fp16_forwards: int = fact(
        doc="grad-mode top-level forwards under CUDA autocast with dtype float16", default=0)
    fp16_percent: float | None = fact("%", "fp16_forwards / grad-mode top-level forwards")
    scaler_scales: int = fact(
        doc="GradScaler.scale calls with the scaler enabled (loss scaling)", default=0)
