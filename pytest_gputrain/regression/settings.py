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

from pytest_gputrain.options import parse_choice, read, read_with_base, resolve_path
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

# DEFAULT_REGRESSION parsed, so that a run that sets no threshold loads no parser (a test checks
# that the two agree).
DEFAULT_THRESHOLDS = {"step_time": 0.05, "peak_vram": 0.02}
REGRESSION_EXAMPLE = '--gpu-regression="step_time:5%,peak_vram:2%" (a metric may be "off")'
# How one session's step time is summarised: its fastest clean round (interference from the host
# or a neighbour only ever adds time, so the fastest round is the step's own cost), or the median.
STEP_SUMMARIES = ("min", "median")
DEFAULT_STEP_SUMMARY = "min"
RESERVED_NAMES = ("latest",)
LOOKBACK_HINT = ("gpu_lookback needs ruptures: pip install 'pytest-gputrain[changes]' (or pip "
                 "install ruptures)")


@dataclass(frozen=True)
class RegressionSettings:
    save: str | None = None
    compare: str | None = None
    thresholds: dict[str, float] = field(
        default_factory=lambda: {"step_time": 0.05, "peak_vram": 0.02})
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


def _usage(ini: str, flag: str, message: str) -> pytest.UsageError:
    return pytest.UsageError(f"{ini} / {flag}: {message}")


def parse_thresholds(text: str) -> dict[str, float]:
    """``"step_time:5%,peak_vram:2%"`` -> ``{"step_time": 0.05, "peak_vram": 0.02}``.

    Only the metrics named are gated (``METRIC:off`` is accepted and gates nothing).
    Raises ``ValueError`` naming the bad part.
    """
    thresholds: dict[str, float] = {}
    seen: set[str] = set()
    items = [item.strip() for item in str(text).split(",")]
    if not any(items):
        raise ValueError(f"{text!r} names no metric; expected e.g. {REGRESSION_EXAMPLE}")
    if len(items) == 1 and items[0].lower() in ("off", "none"):
        return thresholds
    for item in items:
        if not item:
            continue
        metric, sep, value = item.partition(":")
        metric, value = metric.strip(), value.strip()
        if not sep or not metric or not value:
            raise ValueError(f"{item!r} in {text!r} is not METRIC:PERCENT; expected e.g. "
                             f"{REGRESSION_EXAMPLE}")
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r} in {text!r} (known: "
                             f"{', '.join(METRICS)}); expected e.g. {REGRESSION_EXAMPLE}")
        if metric in seen:
            raise ValueError(f"metric {metric!r} appears twice in {text!r}")
        seen.add(metric)
        if value.lower() in ("off", "none", "ignore"):
            thresholds.pop(metric, None)
            continue
        try:
            from pytest_gputrain.units import parse_percent

            thresholds[metric] = parse_percent(value) / 100
        except ValueError as exc:
            raise ValueError(f"{item!r} in {text!r}: {exc}; expected e.g. "
                             f"{REGRESSION_EXAMPLE}") from None
    return thresholds


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


def _number(config: pytest.Config, ini: str, flag: str, kind: type, minimum: float,
            maximum: float, example: str) -> Any:
    raw = read(config, ini)
    if raw is None or str(raw).strip() == "":
        return None
    text = str(raw).strip()
    from pytest_gputrain.units import shown  # only where a value is set

    out_of_range = _usage(ini, flag, f"{shown(raw)} must lie between {minimum:g} and "
                          f"{maximum:g}; e.g. {example}")
    if kind is int and len(text.lstrip("+-")) > len(str(int(maximum))):
        raise out_of_range  # before int(), which refuses 4300 digits and is slow well before
    try:
        value = kind(text)
    except ValueError:
        raise _usage(ini, flag, f"{shown(raw)} is not a number; e.g. {example}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise _usage(ini, flag, f"{shown(raw)} is not a finite number; e.g. {example}")
    if not minimum <= value <= maximum:
        raise out_of_range
    return value


def _path(config: pytest.Config, ini: str, flag: str) -> Path | None:
    """A path option, relative to where its value came from (``options.read_with_base``)."""
    text, base = read_with_base(config, ini)
    if not text:
        return None
    try:
        return resolve_path(str(text), base)
    except ValueError as exc:
        raise _usage(ini, flag, str(exc)) from None


def read_settings(config: pytest.Config) -> RegressionSettings:
    save_raw, compare_raw = read(config, "gpu_save"), read(config, "gpu_compare")
    try:
        save = parse_run_name(save_raw, for_save=True) if save_raw else None
    except ValueError as exc:
        raise _usage("gpu_save", "--gpu-save", str(exc)) from None
    try:
        compare = parse_run_name(compare_raw, for_save=False) if compare_raw else None
    except ValueError as exc:
        raise _usage("gpu_compare", "--gpu-compare", str(exc)) from None
    spec = read(config, "gpu_regression")
    try:
        thresholds = parse_thresholds(spec) if spec not in (None, "") else \
            dict(DEFAULT_THRESHOLDS)
    except ValueError as exc:
        raise _usage("gpu_regression", "--gpu-regression", str(exc)) from None
    alpha_raw = read(config, "gpu_alpha")
    try:
        alpha = parse_alpha(alpha_raw) if alpha_raw not in (None, "") else DEFAULT_ALPHA
    except ValueError as exc:
        raise _usage("gpu_alpha", "--gpu-alpha", str(exc)) from None
    summary_raw = read(config, "gpu_step_summary")
    try:
        step_summary = (parse_step_summary(summary_raw) if summary_raw not in (None, "")
                        else DEFAULT_STEP_SUMMARY)
    except ValueError as exc:
        raise _usage("gpu_step_summary", "--gpu-step-summary", str(exc)) from None
    policy_raw = read(config, "gpu_cannot_tell")
    try:
        cannot_tell = (parse_cannot_tell(policy_raw) if policy_raw not in (None, "")
                       else DEFAULT_CANNOT_TELL)
    except ValueError as exc:
        raise _usage("gpu_cannot_tell", "--gpu-cannot-tell", str(exc)) from None
    store = _store(config)
    warmup = _number(config, "gpu_benchmark_warmup", "--gpu-benchmark-warmup", int, 0,
                     MAX_WARMUP, "5")
    min_rounds = _number(config, "gpu_benchmark_min_rounds", "--gpu-benchmark-min-rounds", int,
                         1, MAX_ROUNDS, "30")
    max_rounds = _number(config, "gpu_benchmark_max_rounds", "--gpu-benchmark-max-rounds", int,
                         1, MAX_ROUNDS, "100")
    max_time = _number(config, "gpu_benchmark_max_time", "--gpu-benchmark-max-time", float,
                       1e-6, MAX_TIME_S, "5")
    if min_rounds is not None and max_rounds is not None and max_rounds < min_rounds:
        raise _usage("gpu_benchmark_max_rounds", "--gpu-benchmark-max-rounds",
                     f"{max_rounds} is below gpu_benchmark_min_rounds {min_rounds}; e.g. "
                     "min 30, max 100")
    lookback = _number(config, "gpu_lookback", "--gpu-lookback", int, MIN_LOOKBACK,
                       MAX_LOOKBACK, "30")
    if lookback and compare:
        import importlib.util

        if importlib.util.find_spec("ruptures") is None:
            raise _usage("gpu_lookback", "--gpu-lookback", LOOKBACK_HINT)
    disable = bool(read(config, "gpu_benchmark_disable"))
    skip = bool(read(config, "gpu_benchmark_skip"))
    only = bool(read(config, "gpu_benchmark_only"))
    _check_untimed(disable, skip, save, compare)
    if skip and only:
        raise _usage("gpu_benchmark_only", "--gpu-benchmark-only",
                     "cannot be combined with gpu_benchmark_skip / --gpu-benchmark-skip (one "
                     "runs only the tests that use gpu_benchmark, the other skips them)")
    json_path = _path(config, "gpu_benchmark_json", "--gpu-benchmark-json")
    used_store = store if isinstance(store, Path) and (save or compare) else None
    if json_path or used_store:  # loaded only then: a plain run does not pay for it
        from pytest_gputrain import outputs

        outputs.claim(config, "gpu_benchmark_json / --gpu-benchmark-json",
                      [json_path] if json_path else [])
        # No output may take the store; the store's own checks (a regular file, in a folder
        # it can be made in) come when it is opened.
        outputs.keep(config, "gpu_store / --gpu-store", [used_store] if used_store else [],
                     "write" if save else "read")
    return RegressionSettings(
        save=save, compare=compare, thresholds=thresholds, alpha=alpha,
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
        raise _usage("gpu_store", "--gpu-store", str(exc)) from None


def _check_untimed(disable: bool, skip: bool, save: str | None, compare: str | None) -> None:
    """Untimed or skipped benchmarks give nothing to save or compare: say so up front."""
    if disable and skip:
        raise _usage("gpu_benchmark_disable", "--gpu-benchmark-disable",
                     "cannot be combined with gpu_benchmark_skip / --gpu-benchmark-skip (one "
                     "runs the benchmarked steps untimed, the other skips those tests)")
    for on, ini, flag in ((disable, "gpu_benchmark_disable", "--gpu-benchmark-disable"),
                          (skip, "gpu_benchmark_skip", "--gpu-benchmark-skip")):
        if on and (save or compare):
            used = "gpu_save / --gpu-save" if save else "gpu_compare / --gpu-compare"
            raise _usage(ini, flag, f"measures nothing, so {used} would have nothing to save "
                         "or compare; drop one of the two")
