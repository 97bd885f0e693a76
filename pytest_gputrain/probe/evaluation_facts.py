"""``run.evaluation.*``: the evaluation runs a training framework made while fitting, their
time, and the framework's setting that scheduled them (``evaluation_readings.py``)."""

from __future__ import annotations

from pytest_gputrain.facts import FactGroup, fact
from pytest_gputrain.probe.run_record import EvaluationReadings


class EvaluationFacts(FactGroup):
    """Validation (Lightning) or evaluation (the Hugging Face Trainer) while fitting."""

    framework: str | None = fact(doc="the framework that evaluated: lightning, transformers")
    runs: int = fact(doc="evaluation runs made while fitting (no sanity check)", default=0,
                     count=True)
    steps_per_run: float | None = fact(doc="optimizer steps of the test per evaluation run")
    time: float | None = fact("s", "time inside the evaluation runs, in all")
    time_per_run: float | None = fact("s", "time / runs")
    time_percent: float | None = fact("%", "time / the test's duration")
    setting: str | None = fact(
        doc="the framework's setting that schedules evaluation, as given "
            "(val_check_interval, check_val_every_n_epoch; eval_strategy, eval_steps)")
    interval_batches: float | None = fact(
        doc="training batches between evaluations as the framework counts them "
            "(Lightning's val_check_batch, the Trainer's eval_steps)")
    epoch_batches: int | None = fact(doc="training batches per epoch (Lightning)")


def evaluation_facts(readings: EvaluationReadings, steps: int,
                     duration: float | None) -> EvaluationFacts:
    facts = EvaluationFacts(framework=readings.framework, runs=len(readings.runs))
    if not readings.runs:
        return facts
    total = sum(seconds for _, seconds in readings.runs)
    facts.time = round(total, 6)
    facts.time_per_run = round(total / len(readings.runs), 6)
    facts.steps_per_run = round(steps / len(readings.runs), 2)
    if duration:
        facts.time_percent = round(min(100.0, 100.0 * total / duration), 2)
    settings = readings.settings
    if readings.framework == "lightning":
        interval = settings.get("val_check_interval")
        kind = ("an int: training batches" if isinstance(interval, int)
                else "a share of the epoch")
        parts = [f"val_check_interval={interval} ({kind})"] if interval is not None else []
        if settings.get("check_val_every_n_epoch") is not None:
            parts.append(f"check_val_every_n_epoch={settings['check_val_every_n_epoch']}")
        facts.setting = ", ".join(parts) or None
        facts.interval_batches = settings.get("val_check_batch")
        batches = settings.get("num_training_batches")
        if isinstance(batches, int | float) and batches != float("inf"):
            facts.epoch_batches = int(batches)
    elif readings.framework == "transformers":
        facts.setting = f"eval_strategy='{settings.get('eval_strategy')}'" + (
            f", eval_steps={settings['eval_steps']}" if "eval_steps" in settings else "")
        facts.interval_batches = settings.get("eval_steps")
    return facts
