"""The regression gate's options (``options.py``) read into ``RegressionSettings``, every value
checked: a bad one is a ``pytest.UsageError`` that names the option and the value and shows a
valid example.

Loaded where an option of the gate is set or a test uses ``gpu_benchmark``, not by a plain run;
only the standard library and pytest (no sqlite3, no psycopg).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_gputrain.option_errors import given_as, parse_choice, usage_error
from pytest_gputrain.options import (
    read,
    read_with_base,
    resolve_path,
)
from pytest_gputrain.regression.options import (
    CANNOT_TELL,
    DEFAULT_ALPHA,
    DEFAULT_CANNOT_TELL,
    DEFAULT_STORE,
    MAX_LOOKBACK,
    MAX_ROUNDS,
    MAX_TIME_S,
    MAX_WARMUP,
    METRICS,
    MIN_LOOKBACK,
)
from pytest_gputrain.regression.store_location import Location, resolve_store

# DEFAULT_REGRESSION ("auto") parsed, so that a run that sets no threshold loads no parser (a
# test checks that the two agree): the thresholds every test keeps (policy.BASE).
DEFAULT_THRESHOLDS = {"step_time": 0.05, "peak_vram": 0.02}
# A value, not an option: the error names the option as it was given (a flag, an ini name, or
# the compare command's --regression) before it.
REGRESSION_EXAMPLE = ('"auto,step_time:2%" or "step_time:5%,kernels:0,syncs:0,host_cpu:2%" '
                      '(a metric may be "off")')
# How one session's step time is summarised: its fastest clean round (interference from the host
# or a neighbour only ever adds time, so the fastest round is the step's own cost), or the median.
STEP_SUMMARIES = ("min", "median")
DEFAULT_STEP_SUMMARY = "min"
RESERVED_NAMES = ("latest",)
LOOKBACK_HINT = ("gpu_lookback needs ruptures: pip install 'pytest-gputrain[changes]' (or pip "
                 "install ruptures)")


@dataclass(frozen=True)
class RegressionSpec:
    """``--gpu-regression`` read: the thresholds named (with ``auto``, the policy's base ones
    too), whether the default policy adds each test's own metrics (``policy.py``), and the
    metrics turned off."""

    thresholds: dict[str, float]
    auto: bool = False
    off: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RegressionSettings:
    save: str | None = None
    compare: str | None = None
    thresholds: dict[str, float] = field(
        default_factory=lambda: {"step_time": 0.05, "peak_vram": 0.02})
    auto: bool = True  # the default policy adds each test's metrics by the kind of its step
    off: frozenset[str] = frozenset()  # metrics the spec turned off
    counters: bool = True  # the counting pass after the timed rounds
    alpha: float = DEFAULT_ALPHA
    step_summary: str = DEFAULT_STEP_SUMMARY
    force: bool = False
    json_path: Path | None = None
    store: Location = Path(DEFAULT_STORE)  # an SQLite file, or a PostgreSQL URL
    disable: bool = False
    skip: bool = False
    only: bool = False  # --gpu-benchmark-only: the other tests are deselected
    cannot_tell: str = DEFAULT_CANNOT_TELL
    lookback: int | None = None  # sessions of the baseline's branch that set its level
    warmup: int | None = None
    min_rounds: int | None = None
    max_rounds: int | None = None
    max_time: float | None = None

    @property
    def uses_store(self) -> bool:
        return bool(self.save or self.compare)


def parse_thresholds(text: str) -> dict[str, float]:
    """``"step_time:5%,peak_vram:2%"`` -> ``{"step_time": 0.05, "peak_vram": 0.02}``: the
    thresholds of ``parse_spec``."""
    return parse_spec(text).thresholds


def parse_spec(text: str) -> RegressionSpec:
    """``"auto,step_time:2%,host_cpu:off"`` or ``"step_time:5%,kernels:0"``, read.

    Without ``auto`` only the metrics named are gated (``METRIC:off`` is accepted and gates
    nothing); with it, the default policy's too (``policy.py``), less those turned off.
    Raises ``ValueError`` naming the bad part.
    """
    from pytest_gputrain.regression.policy import AUTO, BASE

    thresholds: dict[str, float] = {}
    off: set[str] = set()
    seen: set[str] = set()
    auto = False
    items = [item.strip() for item in str(text).split(",")]
    if not any(items):
        raise ValueError(f"{text!r} names no metric; e.g. {REGRESSION_EXAMPLE}")
    if len(items) == 1 and items[0].lower() in ("off", "none"):
        return RegressionSpec({})
    for item in items:
        if not item:
            continue
        if item.lower() == AUTO:
            if auto:
                raise ValueError(f"'auto' appears twice in {text!r}")
            auto = True
            continue
        metric, sep, value = item.partition(":")
        metric, value = metric.strip(), value.strip()
        if not sep or not metric or not value:
            raise ValueError(f"{item!r} is not METRIC:PERCENT; e.g. {REGRESSION_EXAMPLE}")
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r} (known: {', '.join(METRICS)}); e.g. "
                             f"{REGRESSION_EXAMPLE}")
        if metric in seen:
            raise ValueError(f"metric {metric!r} appears twice in {text!r}; e.g. "
                             f"{REGRESSION_EXAMPLE}")
        seen.add(metric)
        if value.lower() in ("off", "none", "ignore"):
            off.add(metric)
            continue
        from pytest_gputrain.units import parse_percent

        try:
            thresholds[metric] = parse_percent(value) / 100
        except ValueError:  # one clause: the item, what it should be, an example
            raise ValueError(f"{value!r} in {item!r} is not a percentage from 0 to 100; e.g. "
                             f"{REGRESSION_EXAMPLE}") from None
    if auto:
        thresholds = {**{m: t for m, t in BASE.items() if m not in off}, **thresholds}
    return RegressionSpec(thresholds, auto, frozenset(off))


def parse_alpha(value: object) -> float:
    text = str(value).strip()
    try:
        alpha = float(text.removesuffix("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise ValueError(f"{value!r} is not a number; expected a significance level such as "
                         "0.01") from None
    if not math.isfinite(alpha) or not 0 < alpha < 0.5:
        raise ValueError(f"{value!r} must lie strictly between 0 and 0.5; e.g. 0.01")
    return alpha


def parse_step_summary(value: object) -> str:
    return parse_choice(value, STEP_SUMMARIES, "a step summary")


def parse_cannot_tell(value: object) -> str:
    return parse_choice(value, CANNOT_TELL, "a policy for 'cannot tell'")


def parse_run_name(value: object, *, for_save: bool) -> str:
    text = str(value).strip()
    example = "--gpu-save=main" if for_save else "--gpu-compare=main or --gpu-compare=latest"
    if not text:
        raise ValueError(f"empty run name; e.g. {example}")
    if len(text) > 200 or any(ord(ch) < 32 for ch in text):
        raise ValueError(f"{text!r} is not a usable run name (at most 200 printable "
                         f"characters); e.g. {example}")
    if for_save and (text in RESERVED_NAMES or text.startswith("#")):
        raise ValueError(f"{text!r} is reserved ('latest' and '#ID' select runs in "
                         f"--gpu-compare); e.g. {example}")
    return text


def _number(config: pytest.Config, ini: str, kind: type, minimum: float, maximum: float,
            example: str) -> Any:
    raw = read(config, ini)
    if raw is None or str(raw).strip() == "":
        return None
    text = str(raw).strip()
    from pytest_gputrain.units import shown  # only where a value is set

    out_of_range = usage_error(config, ini, f"{shown(raw)} must lie between {minimum:g} and "
                          f"{maximum:g}; e.g. {example}")
    if kind is int and len(text.lstrip("+-")) > len(str(int(maximum))):
        raise out_of_range  # before int(), which refuses 4300 digits and is slow well before
    try:
        value = kind(text)
    except ValueError:
        raise usage_error(config, ini, f"{shown(raw)} is not a number; e.g. {example}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise usage_error(config, ini, f"{shown(raw)} is not a finite number; e.g. {example}")
    if not minimum <= value <= maximum:
        raise out_of_range
    return value


def _path(config: pytest.Config, ini: str) -> Path | None:
    """A path option, relative to where its value came from (``options.read_with_base``)."""
    text, base = read_with_base(config, ini)
    if not text:
        return None
    try:
        return resolve_path(str(text), base)
    except ValueError as exc:
        raise usage_error(config, ini, str(exc)) from None


def read_settings(config: pytest.Config) -> RegressionSettings:
    save_raw, compare_raw = read(config, "gpu_save"), read(config, "gpu_compare")
    try:
        save = parse_run_name(save_raw, for_save=True) if save_raw else None
    except ValueError as exc:
        raise usage_error(config, "gpu_save", str(exc)) from None
    try:
        compare = parse_run_name(compare_raw, for_save=False) if compare_raw else None
    except ValueError as exc:
        raise usage_error(config, "gpu_compare", str(exc)) from None
    spec_text = read(config, "gpu_regression")
    try:
        spec = (parse_spec(spec_text) if spec_text not in (None, "") else
                RegressionSpec(dict(DEFAULT_THRESHOLDS), auto=True))
    except ValueError as exc:
        raise usage_error(config, "gpu_regression", str(exc)) from None
    alpha_raw = read(config, "gpu_alpha")
    try:
        alpha = parse_alpha(alpha_raw) if alpha_raw not in (None, "") else DEFAULT_ALPHA
    except ValueError as exc:
        raise usage_error(config, "gpu_alpha", str(exc)) from None
    summary_raw = read(config, "gpu_step_summary")
    try:
        step_summary = (parse_step_summary(summary_raw) if summary_raw not in (None, "")
                        else DEFAULT_STEP_SUMMARY)
    except ValueError as exc:
        raise usage_error(config, "gpu_step_summary", str(exc)) from None
    policy_raw = read(config, "gpu_cannot_tell")
    try:
        cannot_tell = (parse_cannot_tell(policy_raw) if policy_raw not in (None, "")
                       else DEFAULT_CANNOT_TELL)
    except ValueError as exc:
        raise usage_error(config, "gpu_cannot_tell", str(exc)) from None
    store = _store(config)
    warmup = _number(config, "gpu_benchmark_warmup", int, 0,
                     MAX_WARMUP, "5")
    min_rounds = _number(config, "gpu_benchmark_min_rounds", int, 1, MAX_ROUNDS, "30")
    max_rounds = _number(config, "gpu_benchmark_max_rounds", int, 1, MAX_ROUNDS, "100")
    max_time = _number(config, "gpu_benchmark_max_time", float, 1e-6, MAX_TIME_S, "5")
    if min_rounds is not None and max_rounds is not None and max_rounds < min_rounds:
        raise usage_error(config, "gpu_benchmark_max_rounds",
                          f"{max_rounds} is below {given_as(config, 'gpu_benchmark_min_rounds')}"
                          f" {min_rounds}; e.g. min 30, max 100")
    lookback = _number(config, "gpu_lookback", int, MIN_LOOKBACK, MAX_LOOKBACK, "30")
    if lookback and compare:
        import importlib.util

        if importlib.util.find_spec("ruptures") is None:
            raise usage_error(config, "gpu_lookback", LOOKBACK_HINT)
    disable = bool(read(config, "gpu_benchmark_disable"))
    skip = bool(read(config, "gpu_benchmark_skip"))
    only = bool(read(config, "gpu_benchmark_only"))
    _check_untimed(config, disable, skip, save, compare)
    if skip and only:
        raise usage_error(config, "gpu_benchmark_only",
                          f"cannot be combined with {given_as(config, 'gpu_benchmark_skip')} "
                          "(one runs only the tests that use gpu_benchmark, the other skips "
                          "them)")
    json_path = _path(config, "gpu_benchmark_json")
    used_store = store if isinstance(store, Path) and (save or compare) else None
    if json_path or used_store:  # loaded only then: a plain run does not pay for it
        from pytest_gputrain import outputs

        outputs.claim(config, given_as(config, "gpu_benchmark_json"),
                      [json_path] if json_path else [])
        # No output may take the store; the store's own checks (a regular file, in a folder
        # it can be made in) come when it is opened.
        outputs.keep(config, given_as(config, "gpu_store"), [used_store] if used_store else [],
                     "write" if save else "read")
    return RegressionSettings(
        save=save, compare=compare, thresholds=spec.thresholds, auto=spec.auto, off=spec.off,
        counters=read(config, "gpu_benchmark_counters") is not False, alpha=alpha,
        step_summary=step_summary, cannot_tell=cannot_tell,
        force=bool(read(config, "gpu_compare_force")), lookback=lookback,
        json_path=json_path, store=store,
        warmup=warmup, min_rounds=min_rounds, max_rounds=max_rounds, max_time=max_time,
        disable=disable, skip=skip, only=only,
    )


def _store(config: pytest.Config) -> Location:
    """The store, by ``store_location``'s rules (the commands ``history`` and ``compare`` use
    them too)."""
    value, base = read_with_base(config, "gpu_store")
    try:
        return resolve_store(value, base, Path(config.rootpath))
    except ValueError as exc:
        raise usage_error(config, "gpu_store", str(exc)) from None


def _check_untimed(config: pytest.Config, disable: bool, skip: bool, save: str | None,
                   compare: str | None) -> None:
    """Untimed or skipped benchmarks give nothing to save or compare: say so up front."""
    if disable and skip:
        raise usage_error(config, "gpu_benchmark_disable",
                          f"cannot be combined with {given_as(config, 'gpu_benchmark_skip')} "
                          "(one runs the benchmarked steps untimed, the other skips those "
                          "tests)")
    for on, ini in ((disable, "gpu_benchmark_disable"), (skip, "gpu_benchmark_skip")):
        if on and (save or compare):
            used = given_as(config, "gpu_save" if save else "gpu_compare")
            raise usage_error(config, ini, f"measures nothing, so {used} would have nothing to "
                              "save or compare; drop one of the two")
