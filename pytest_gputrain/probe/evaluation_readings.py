"""``EvaluationWatch``: the evaluation runs a training framework makes while it trains, timed,
with the framework's setting that schedules them.

Lightning validates from inside ``Trainer.fit`` on the schedule of ``val_check_interval`` (an
int counts training batches, a float is a share of the epoch) and ``check_val_every_n_epoch``;
the Hugging Face Trainer evaluates from inside ``train()`` on ``eval_strategy`` and
``eval_steps``. Validation run too often is a whole evaluation pass (its loader's start, every
batch's forward, its metrics) for every few training steps. The watch wraps the framework's
evaluation entry point where the framework is imported when the test starts (Lightning's
``_EvaluationLoop.run``, the Trainer's ``evaluate``), and for each run made while fitting (not
Lightning's sanity check, not a ``validate()``/``test()`` call of the test's own) notes the
training steps done and its time; at the first such run it reads the setting from the trainer.

Built into ``run.evaluation.*`` by ``evaluation_facts.py``.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Final

from pytest_gputrain.probe.run_record import EvaluationReadings
from pytest_gputrain.probe.torch_hooks import EVALUATIONS
from pytest_gputrain.probe.wrapping import probe_wrapper

if TYPE_CHECKING:
    from pytest_gputrain.probe.callbacks import ProbeCallbacks
    from pytest_gputrain.probe.torch_hooks import Patches

MAX_RUNS: Final = 4096


class EvaluationWatch:
    """Times the frameworks' evaluation runs made while fitting."""

    def __init__(self, probe: ProbeCallbacks) -> None:
        self.probe = probe
        self.readings: EvaluationReadings = probe.record.evaluation
        self._steps = probe.record.steps.times
        self._depth = 0  # an evaluation inside another is part of it

    def start(self, patches: Patches) -> None:
        for module, class_name, method, framework in EVALUATIONS:
            owner = getattr(sys.modules.get(module), class_name, None)
            original = vars(owner).get(method) if isinstance(owner, type) else None
            if callable(original) and not getattr(original, "_gputrain_probe", False):
                patches.set(owner, method, self._wrap(original, framework))

    def _wrap(self, original: Any, framework: str) -> Any:
        clock = time.perf_counter

        def evaluation(loop: Any, *args: Any, **kwargs: Any) -> Any:
            counted = self._depth == 0 and not self.probe.disabled and self._fitting(
                loop, framework)
            self._depth += 1
            started = clock()
            try:
                return original(loop, *args, **kwargs)
            finally:
                self._depth -= 1
                if counted:
                    try:
                        self._note(loop, framework, clock() - started)
                    except Exception as exc:
                        self.probe.fail("evaluation wrapper", exc)

        return probe_wrapper(evaluation, original)

    def _fitting(self, owner: Any, framework: str) -> bool:
        """An evaluation the training loop made (not a sanity check, not the test's own)."""
        if framework == "lightning":
            trainer = getattr(owner, "trainer", None)
            fn = getattr(getattr(trainer, "state", None), "fn", None)
            return (trainer is not None and not getattr(trainer, "sanity_checking", False)
                    and str(getattr(fn, "value", fn)) == "fit")
        return bool(self._steps)  # the Trainer's evaluate() after training steps began

    def _note(self, owner: Any, framework: str, seconds: float) -> None:
        readings = self.readings
        if len(readings.runs) >= MAX_RUNS:
            return
        readings.runs.append((len(self._steps), seconds))
        if readings.framework is None:
            readings.framework = framework
            readings.settings = (_lightning_settings(owner.trainer) if framework == "lightning"
                                 else _trainer_settings(owner))


def _lightning_settings(trainer: Any) -> dict[str, Any]:
    """The Lightning Trainer's validation schedule, as it was given and as it counts."""
    settings = {name: getattr(trainer, name, None) for name in (
        "val_check_interval", "val_check_batch", "check_val_every_n_epoch",
        "num_training_batches")}
    return {name: value for name, value in settings.items()
            if isinstance(value, int | float) and not isinstance(value, bool)}


def _trainer_settings(trainer: Any) -> dict[str, Any]:
    """The Hugging Face Trainer's evaluation schedule."""
    args = getattr(trainer, "args", None)
    strategy = getattr(args, "eval_strategy", getattr(args, "evaluation_strategy", None))
    settings: dict[str, Any] = {"eval_strategy": str(getattr(strategy, "value", strategy))}
    steps = getattr(args, "eval_steps", None)
    if isinstance(steps, int | float) and not isinstance(steps, bool):
        settings["eval_steps"] = steps
    return settings
