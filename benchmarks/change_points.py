"""How well ``history --changes`` finds steps in a branch's history, on synthetic histories.

    python benchmarks/change_points.py                       # PELT (ruptures), the shipped method
    python benchmarks/change_points.py --method both         # and E-Divisive, to compare
    python benchmarks/change_points.py --series 20 --seed 3  # fewer histories, another draw

E-Divisive is MongoDB's ``signal-processing-algorithms`` (Daly et al., ICPE 2020); it pins
NumPy < 2 and setuptools < 71, so it is not in the project's environment: install it apart,
``pip install --no-deps --target /tmp/spa signal-processing-algorithms more-itertools structlog``,
and run with ``PYTHONPATH=/tmp/spa``.

Each history is one value per session: a session's summary as the gate makes it, with the
session-to-session spread measured on the H200 (docs/regression.md, "How well it works";
2026-11-30, commit 2e0c572): 0.31 % for the launch-bound ResNet-18 step, 0.07 % for the GPU-bound
conv step, log-normal. The busy host adds what the busier H200 run showed: 2 of 28 sessions ran
at the host's pace, their fastest step 5-40 % slower (7.4-10.4 ms against 7.4-7.5 ms).

Scenarios, for each kind of step:

- **unchanged**: ``--series`` histories of 100 sessions; every step found is a false change.
- **steps of 1, 2 and 5 %**: 20-40 sessions, a step (slower or faster, at random), then up to
  10 sessions; after each new session the history so far is searched, as ``history --changes``
  would be after each nightly run: found when a step lies within one session of the true place;
  the number of sessions after the step that it took.
- **mixed**: 100 sessions with three steps of random size (1, 2 or 5 %, either sign) at least 12
  sessions apart, one of them at an environment change (the driver upgraded): precision and
  recall of the steps found (within two sessions of a true step), and whether the step at the
  driver upgrade names it as the likely cause.
- **slow drift**: 40 sessions, then 0.1 % slower each session for 30 sessions (3 % in all), then
  30 more: the steps found inside the drift (pieces of it) and outside (false), and whether
  ``drift.find_drift`` over the last 80 sessions reports a drift past 2.5 % with the steps that
  made it.

Each method proposes places and the gate's decision (``change_points.decide``) keeps the steps
that hold, as ``history --changes`` does; "alone" counts what the library proposes by itself
(PELT at the shipped penalty, E-Divisive at p < 0.01 with 100 permutations) before the decision.

Goal: every step of >= 2 % found within 3 sessions, no false change in 100 unchanged sessions.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

try:
    import pytest_gputrain  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_gputrain.regression import change_points, drift
from pytest_gputrain.regression.branch_history import Series, Session, find_changes
from pytest_gputrain.regression.fingerprint import fingerprint_hash
from pytest_gputrain.regression.store import ResultRecord, RunInfo

KINDS = {"launch-bound (0.31 %)": (0.0031, 0.0), "GPU-bound (0.07 %)": (0.0007, 0.0),
         "launch-bound, busy host (0.31 %, 2/28 host-paced)": (0.0031, 2 / 28)}
SIZES = (0.01, 0.02, 0.05)
MAX_AFTER = 10
DRIFT_THRESHOLD = 0.025
FINGERPRINT = {"device_type": "cuda", "gpu_name": "NVIDIA H200", "driver_version": "570.86.15",
               "torch_version": "2.11.0+cu130", "torch_cuda": "13.0", "cudnn_version": "91200",
               "python": "CPython 3.12", "platform": "linux-x86_64"}
UPGRADED = {**FINGERPRINT, "driver_version": "580.159.04"}


def pelt(values: Sequence[float]) -> list[int]:
    return change_points.candidates(values)


def edivisive(values: Sequence[float]) -> list[int]:
    import numpy
    from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive

    return sorted(int(i) for i in e_divisive(numpy.log(numpy.asarray(values)), pvalue=0.01,
                                             permutations=100))


METHODS: dict[str, Callable[[Sequence[float]], list[int]]] = {"pelt": pelt,
                                                              "edivisive": edivisive}


def history(rng: random.Random, sd: float, stray: float, steps: dict[int, float], n: int,
            drift_at: tuple[int, int, float] | None = None) -> list[float]:
    """``n`` session values: log-normal noise, steps (index: relative size), host-paced
    sessions with probability ``stray``, and a slow drift (start, sessions, per session)."""
    level, values = 0.010, []
    for i in range(n):
        level *= 1 + steps.get(i, 0.0)
        if drift_at and drift_at[0] <= i < drift_at[0] + drift_at[1]:
            level *= 1 + drift_at[2]
        value = level * math.exp(rng.gauss(0, sd))
        if rng.random() < stray:
            value *= 1 + rng.uniform(0.05, 0.40)
        values.append(value)
    return values


@dataclass
class Tally:
    seconds: list[float] = field(default_factory=list)
    false_alone: int = 0
    false_decided: int = 0
    series_with_false: int = 0
    unchanged: int = 0
    found_after: dict[float, list[int | None]] = field(default_factory=dict)
    true_positive: int = 0
    detected: int = 0
    recall: dict[float, list[bool]] = field(default_factory=dict)
    cause_named: list[bool] = field(default_factory=list)
    drift_pieces: int = 0
    drift_false: int = 0
    drift_reported: list[bool] = field(default_factory=list)
    drift_commits: list[int] = field(default_factory=list)


def timed_steps(values: Sequence[float], method: Callable[[Sequence[float]], list[int]],
                tally: Tally) -> list[change_points.Step]:
    started = time.perf_counter()
    steps = change_points.find_steps(values, propose=method)
    tally.seconds.append(time.perf_counter() - started)
    return steps


def unchanged(rng: random.Random, sd: float, stray: float, method: Callable[..., list[int]],
              count: int, tally: Tally) -> None:
    for _ in range(count):
        values = history(rng, sd, stray, {}, 100)
        tally.false_alone += len(method(values))
        found = timed_steps(values, method, tally)
        tally.false_decided += len(found)
        tally.series_with_false += bool(found)
        tally.unchanged += 1


def steps(rng: random.Random, sd: float, stray: float, method: Callable[..., list[int]],
          count: int, tally: Tally) -> None:
    for size in SIZES:
        runs = tally.found_after.setdefault(size, [])
        for _ in range(count):
            at = rng.randrange(20, 41)
            sign = rng.choice((1, -1))
            values = history(rng, sd, stray, {at: sign * size}, at + MAX_AFTER)
            runs.append(next((k for k in range(1, MAX_AFTER + 1) if any(
                abs(s.index - at) <= 1 for s in timed_steps(values[:at + k], method, tally))),
                None))


def sessions_of(values: Sequence[float], upgrade_at: int | None) -> Series:
    """The history as the store would give it: one run and one result a session, the driver
    upgraded from ``upgrade_at`` on."""
    series = Series("main", "tests/perf/test_step.py::test_train_step", "step_time")
    for i, value in enumerate(values):
        fingerprint = UPGRADED if upgrade_at is not None and i >= upgrade_at else FINGERPRINT
        run = RunInfo(i + 1, "main", f"2026-11-{1 + i // 4:02d}", fingerprint,
                      fingerprint_hash(fingerprint), f"{i:040x}")
        rounds = [value * (1 + 0.02 * k / 30) for k in range(30)]
        result = ResultRecord(series.nodeid, fingerprint, fingerprint_hash(fingerprint), 30,
                              {"step_time": rounds}, {})
        series.sessions.append(Session(run, result, value))
    return series


def mixed(rng: random.Random, sd: float, stray: float, count: int, tally: Tally) -> None:
    for _ in range(count):
        places = sorted(rng.sample(range(12, 88, 12), 3))
        places = [p + rng.randrange(0, 4) for p in places]
        sizes = {p: rng.choice(SIZES) * rng.choice((1, -1)) for p in places}
        upgrade_at = rng.choice(places)
        series = sessions_of(history(rng, sd, stray, sizes, 100), upgrade_at)
        found = find_changes(series).changes
        tally.detected += len(found)
        tally.true_positive += sum(any(abs(c.step.index - p) <= 2 for p in places)
                                   for c in found)
        for place, size in sizes.items():
            tally.recall.setdefault(abs(size), []).append(
                any(abs(c.step.index - place) <= 2 for c in found))
        at_upgrade = [c for c in found if abs(c.step.index - upgrade_at) <= 2]
        if at_upgrade:
            tally.cause_named.append("driver_version" in (at_upgrade[0].cause or ""))


def drifting(rng: random.Random, sd: float, stray: float, count: int, tally: Tally) -> None:
    for _ in range(count):
        values = history(rng, sd, stray, {}, 100, drift_at=(40, 30, 0.001))
        found = change_points.find_steps(values)
        tally.drift_pieces += sum(38 <= s.index <= 73 for s in found)
        tally.drift_false += sum(not 38 <= s.index <= 73 for s in found)
        series = sessions_of(values[:-1], None)
        current = values[-1:]
        result = drift.find_drift(series.sessions[-80:], current, threshold=DRIFT_THRESHOLD,
                                  alpha=0.01)
        tally.drift_reported.append(result is not None)
        if result is not None:
            tally.drift_commits.append(len(result.changes))


def percent(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f} %)" if whole else "–"


def report(kind: str, method: str, tally: Tally, drift_checked: bool) -> None:
    print(f"\n{kind}, {method}: {statistics.median(tally.seconds) * 1e3:.1f} ms per search "
          f"(median of {len(tally.seconds)}; 100 sessions: see the unchanged row)")
    print(f"  unchanged, 100 sessions: {tally.false_decided} false change(s) in "
          f"{tally.unchanged} histories ({tally.series_with_false} with any); the library "
          f"alone proposed {tally.false_alone}")
    for size, runs in tally.found_after.items():
        found = [k for k in runs if k is not None]
        within = sum(k <= 3 for k in found)
        median = f"median {statistics.median(found):g}" if found else "never"
        print(f"  step of {size * 100:g} %: found within 3 sessions {percent(within, len(runs))}, "
              f"within {MAX_AFTER} {percent(len(found), len(runs))}; sessions after the step "
              f"to find it: {median}, most {max(found, default=0)}")
    if tally.detected or tally.recall:
        recall = ", ".join(f"{size * 100:g} % {percent(sum(hits), len(hits))}"
                           for size, hits in sorted(tally.recall.items()))
        precision = percent(tally.true_positive, tally.detected)
        named = percent(sum(tally.cause_named), len(tally.cause_named))
        print(f"  mixed, 3 steps in 100 sessions: precision {precision}; recall {recall}; "
              f"driver upgrade named as the likely cause of the step found there {named}")
    if drift_checked:
        reported = percent(sum(tally.drift_reported), len(tally.drift_reported))
        print(f"  slow drift, 3 % over 30 sessions: {tally.drift_pieces} step(s) found inside "
              f"it, {tally.drift_false} outside; drift past {DRIFT_THRESHOLD * 100:g} % over "
              f"the last 80 sessions reported {reported}"
              + (f", naming {statistics.median(tally.drift_commits):g} step(s) (median)"
                 if tally.drift_commits else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=50, help="histories per scenario")
    parser.add_argument("--method", choices=(*METHODS, "both"), default="pelt")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.series < 1:
        parser.error("--series must be at least 1")
    change_points.check_available()
    methods = list(METHODS) if args.method == "both" else [args.method]
    for kind, (sd, stray) in KINDS.items():
        for method in methods:
            rng = random.Random(f"{args.seed}-{kind}")
            tally = Tally()
            unchanged(rng, sd, stray, METHODS[method], args.series, tally)
            steps(rng, sd, stray, METHODS[method], args.series, tally)
            shipped = method == "pelt"
            if shipped:  # the whole pipeline: what history --changes and the drift check do
                mixed(rng, sd, stray, args.series, tally)
                drifting(rng, sd, stray, args.series, tally)
            report(kind, method, tally, shipped)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
