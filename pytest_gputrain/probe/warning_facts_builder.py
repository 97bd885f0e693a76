"""``record.warnings`` -> ``run.warnings.*`` (``warning_facts.py``), as a pure function."""

from __future__ import annotations

from pytest_gputrain.probe.run_record import RaisedWarning, RunRecord
from pytest_gputrain.probe.warning_facts import WarningFacts

MAX_LISTED = 8


def warning_facts(record: RunRecord) -> WarningFacts:
    readings = record.warnings
    faults = [entry for entry in readings.raised if not entry.benign]
    benign = [entry for entry in readings.raised if entry.benign]
    facts = WarningFacts(count=len(faults), benign=len(benign))
    facts.listed = [_described(entry) for entry in faults[:MAX_LISTED]]
    facts.benign_listed = [_described(entry) for entry in benign[:MAX_LISTED]]
    if not faults:
        for name in ("first", "first_where", "first_caller", "first_step"):
            facts.mark_unknown(name, "no warning that may name a fault was shown")
        return facts
    first = faults[0]
    facts.first = f'{first.category}: "{first.message}"'
    facts.first_where = first.where
    if first.caller is not None:
        facts.first_caller = first.caller
    else:
        facts.mark_unknown("first_caller", "no line of the test's or a framework's on its stack")
    facts.first_step = first.step + 1
    return facts


def _described(entry: RaisedWarning) -> str:
    times = f", shown {entry.count} times" if entry.count > 1 else ""
    return f'{entry.category}: "{entry.message}" ({entry.where}{times})'
