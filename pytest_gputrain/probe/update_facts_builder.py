"""``record.updates`` (and ``record.optimizer.zero_grad_steps``) -> ``run.updates.*``
(``update_facts.py``), as pure functions."""

from __future__ import annotations

from pytest_gputrain.probe.run_record import RunRecord, SchedulerStep
from pytest_gputrain.probe.update_facts import UpdateFacts

LOW_LR = 0.01  # a learning rate under this share of the run's peak moves the weights little


def update_facts(record: RunRecord) -> UpdateFacts:
    readings = record.updates
    steps = len(record.steps.times)
    facts = UpdateFacts(optimizer=record.optimizer.name, lr_start=record.optimizer.lr_first,
                        lr_end=record.optimizer.lr_last)
    _schedule(facts, readings.schedulers, readings.primary, record.optimizer.lr_first, steps)
    _zero_grad(facts, record, steps)
    _checks(facts, record)
    return facts


def learning_rates(events: list[SchedulerStep], lr_start: float | None,
                   steps: int) -> list[float] | None:
    """The learning rate in force at each optimizer step: the one at the first step, then
    after each scheduler step (a call when ``n`` steps were done sets the rate of step ``n``
    on). None when a rate could not be read."""
    if lr_start is None:
        return None
    rates, current = [], lr_start
    ordered = sorted(events, key=lambda event: event.step)
    position = 0
    for index in range(steps):
        while position < len(ordered) and max(ordered[position].step, 1) <= index:
            current = ordered[position].lr  # type: ignore[assignment]
            if current is None:
                return None
            position += 1
        rates.append(current)
    return rates


def _schedule(facts: UpdateFacts, events: list[SchedulerStep], primary: int | None,
              lr_start: float | None, steps: int) -> None:
    mine = [event for event in events if primary is not None and event.optimizer == primary]
    during = [event for event in mine if event.step >= 1]
    if during:
        names = [event.scheduler for event in during]
        facts.scheduler = max(set(names), key=lambda name: (names.count(name), name))
        facts.scheduler_steps = len(during)
        facts.scheduler_steps_per_step = round(len(during) / steps, 3) if steps else None
    else:
        facts.mark_unknown("scheduler", "no scheduler stepped the main optimizer's learning rate")
    rates = learning_rates(mine, lr_start, steps) if steps else None
    if not rates:
        why = ("no optimizer step" if not steps else
               "a learning rate was a tensor or not a number (not read)")
        facts.mark_unknown("lr_low_percent", why)
        return
    peak = max(rates)
    top = rates.index(peak)
    facts.lr_peak = peak
    low = [index for index in range(top, steps) if rates[index] < LOW_LR * peak]
    facts.lr_low_percent = round(100.0 * len(low) / steps, 2)
    if low:
        facts.lr_low_from_step = low[0] + 1


def _zero_grad(facts: UpdateFacts, record: RunRecord, steps: int) -> None:
    readings = record.optimizer
    if not readings.zero_grad_calls:
        facts.mark_unknown("steps_without_zero_grad",
                           "no Optimizer.zero_grad or Module.zero_grad call seen (gradients "
                           "cleared another way, or by an override the probe does not wrap)")
        return
    if steps < 2:
        facts.mark_unknown("steps_without_zero_grad", "fewer than 2 optimizer steps")
        return
    cleared = set(readings.zero_grad_steps)
    missing = sum(1 for index in range(1, steps) if index not in cleared)
    facts.steps_without_zero_grad = missing
    facts.steps_without_zero_grad_percent = round(100.0 * missing / (steps - 1), 2)
    facts.steps_per_zero_grad = round(steps / readings.zero_grad_calls, 2)


def _checks(facts: UpdateFacts, record: RunRecord) -> None:
    readings = record.updates
    if readings.unread is not None:
        facts.mark_unknown("unchanged_percent", readings.unread)
        return
    done = [check for check in readings.checks if check.with_grad]
    skipped = [check for check in done if check.unchanged == check.with_grad]
    counted = [check for check in done if check.unchanged != check.with_grad]
    facts.skipped_checks = len(skipped)
    facts.checks = len(counted)
    facts.checked = [f"step {check.step}: {100.0 * check.unchanged / check.with_grad:.1f} % "
                     f"unchanged ({check.dtype}, lr {check.lr:.3g})" if check.lr is not None
                     else f"step {check.step}: {100.0 * check.unchanged / check.with_grad:.1f} "
                     f"% unchanged ({check.dtype})" for check in done]
    if not counted:
        facts.mark_unknown("unchanged_percent", "no step checked (checks at steps 5, 9, 17, ...)"
                           if not done else "every checked step changed no weight (skipped)")
        return
    facts.unchanged_percent = round(
        100.0 * sum(check.unchanged for check in counted)
        / sum(check.with_grad for check in counted), 2)
    facts.check_dtype = counted[-1].dtype
    facts.check_lr = counted[-1].lr
    if facts.check_lr is None:
        facts.unknown["check_lr"] = "a tensor learning rate (not read)"
