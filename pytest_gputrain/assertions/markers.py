"""The GPU markers' arguments, parsed and validated into typed specs at collection.

Import-light (stdlib and ``units`` only): this runs for every collected test that carries a GPU
marker or fixture, and is imported when collection finds the first (the names and help lines
pytest needs at start-up are in ``marker_names``). A bad argument raises ``MarkerError``
whose message names the marker, the value and a valid example; the plugin prefixes the test id
and turns it into a usage error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_gputrain.assertions.marker_names import GPU as GPU
from pytest_gputrain.assertions.marker_names import GPU_FIXTURES as GPU_FIXTURES
from pytest_gputrain.assertions.marker_names import GPU_MARKERS as GPU_MARKERS
from pytest_gputrain.assertions.marker_names import MAX_VRAM as MAX_VRAM
from pytest_gputrain.assertions.marker_names import MIN_UTILIZATION as MIN_UTILIZATION
from pytest_gputrain.assertions.marker_names import REQUIRES_CUDA as REQUIRES_CUDA
from pytest_gputrain.units import (
    NUMBER_PATTERN,
    format_bytes,
    parse_percent,
    parse_size,
    shown,
)

MEASURES = ("allocated", "reserved", "device")
DEFAULT_INTERVAL = 0.05


class MarkerError(ValueError):
    """A marker argument that cannot be used."""


@dataclass(frozen=True)
class RequiresCuda:
    """``@pytest.mark.requires_cuda(...)``: every condition must hold, else the test skips."""

    min_devices: int = 1
    min_capability: tuple[int, int] | None = None
    min_total_vram: int | None = None
    min_free_vram: int | None = None
    bf16: bool = False
    min_torch: str | None = None
    min_driver: str | None = None


@dataclass(frozen=True)
class MaxVram:
    """``@pytest.mark.max_vram(limit, measure=...)`` or the ``gpu_max_vram`` default."""

    limit: int
    measure: str = "allocated"
    origin: str = "marker"  # "marker", or "gpu_max_vram" for the session default

    @property
    def explicit(self) -> bool:
        return self.origin == "marker"


@dataclass(frozen=True)
class MinUtilization:
    """``@pytest.mark.min_utilization(percent, warmup=..., interval=...)``."""

    percent: float
    warmup: float = 0.0
    interval: float = DEFAULT_INTERVAL


@dataclass(frozen=True)
class GpuTestSpec:
    """What the GPU markers and fixtures of one test ask for."""

    requires: tuple[RequiresCuda, ...] = ()
    max_vram: MaxVram | None = None
    min_utilization: MinUtilization | None = None
    fixtures: frozenset[str] = field(default_factory=frozenset)

    @property
    def sample_interval(self) -> float:
        if self.min_utilization is not None:
            return min(self.min_utilization.interval, DEFAULT_INTERVAL)
        return DEFAULT_INTERVAL

    @property
    def min_devices(self) -> int:
        return max((r.min_devices for r in self.requires), default=1)


# -- argument binding -----------------------------------------------------------------------------

def _bind(marker: str, args: tuple[Any, ...], kwargs: Mapping[str, Any],
          positional: tuple[str, ...], keywords: tuple[str, ...], required: tuple[str, ...],
          example: str) -> dict[str, Any]:
    if len(args) > len(positional):
        allowed = (f"at most {len(positional)} positional argument"
                   f"{'s' if len(positional) != 1 else ''} ({', '.join(positional)})"
                   if positional else "keyword arguments only")
        raise MarkerError(f"{marker}: too many positional arguments {shown(args)}: {allowed}; "
                          f"e.g. {example}")
    bound = dict(zip(positional, args, strict=False))
    for name, value in kwargs.items():
        if name not in keywords:
            import difflib

            close = difflib.get_close_matches(name, keywords, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise MarkerError(f"{marker}: unknown argument {name!r}{hint}; valid: "
                              f"{', '.join(keywords)}; e.g. {example}")
        if name in bound:
            raise MarkerError(f"{marker}: {name!r} given twice; e.g. {example}")
        bound[name] = value
    missing = [name for name in required if name not in bound]
    if missing:
        raise MarkerError(f"{marker}: missing {', '.join(repr(m) for m in missing)}; "
                          f"e.g. {example}")
    return bound


def _size(marker: str, name: str, value: Any, example: str) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        where = "" if name == "limit" else f" {name}:"
        text = str(exc)
        hint = "" if "e.g." in text or "such as" in text else f"; e.g. {example}"
        raise MarkerError(f"{marker}:{where} {text}{hint}") from None


MAX_DEVICES = 4096  # more GPUs than any one job sees: a larger count is a typo


def _device_count(marker: str, name: str, value: Any, example: str) -> int:
    if (isinstance(value, bool) or not isinstance(value, int)
            or not 1 <= value <= MAX_DEVICES):
        raise MarkerError(f"{marker}: {name}: invalid value {shown(value)}: expected a whole "
                          f"number from 1 to {MAX_DEVICES}; e.g. {example}")
    return value


_CAPABILITY_RE = re.compile(r"^\s*(?:sm_?)?(\d{1,2})(?:\.(\d))?\s*$", re.IGNORECASE)
_CAPABILITY_COMPACT_RE = re.compile(r"^\s*sm_?(\d)(\d)\s*$", re.IGNORECASE)


def parse_capability(value: Any) -> tuple[int, int]:
    """``(8, 0)``, ``[8, 0]``, ``"8.0"``, ``"8"``, ``8``, ``8.6``, ``"sm_80"`` -> ``(8, 0)``."""
    error = (f"invalid compute capability {shown(value)}: expected (major, minor) such as (8, 0) "
             "or \"8.0\"")
    if isinstance(value, tuple | list):
        if (len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                    for v in value) and 1 <= value[0] <= 99
                and 0 <= value[1] <= 9):
            return int(value[0]), int(value[1])
        raise ValueError(error)
    if isinstance(value, bool):
        raise ValueError(error)
    if isinstance(value, int):
        if not 1 <= value <= 99:
            raise ValueError(error)
        value = str(value)
    elif isinstance(value, float):
        if not (math.isfinite(value) and 1 <= value < 100):
            raise ValueError(error)
        value = f"{value:.1f}"
    if not isinstance(value, str):
        raise ValueError(error)
    compact = _CAPABILITY_COMPACT_RE.match(value)
    if compact:
        return int(compact.group(1)), int(compact.group(2))
    match = _CAPABILITY_RE.match(value)
    if not match or int(match.group(1)) < 1:
        raise ValueError(error)
    return int(match.group(1)), int(match.group(2) or 0)


def _version(marker: str, name: str, value: Any, example: str) -> str:
    # A version number has a few short parts; a huge int (10**5000 cannot even be printed) or
    # a thousand-digit part is a mistake.
    if (isinstance(value, bool) or not isinstance(value, str | int)
            or (isinstance(value, int) and not 0 <= value < 10**9) or len(str(value)) > 64):
        raise MarkerError(f"{marker}: {name}: invalid version {shown(value)}: expected a string "
                          f"such as {example}")
    text = str(value).strip()
    from pytest_gputrain.versions import Version  # imports packaging: only for markers that need it

    try:
        Version(text)  # the whole text: a typo is an error, not a shorter version
    except ValueError:
        raise MarkerError(f"{marker}: {name}: invalid version {shown(value)}: expected a "
                          f"version number (PEP 440) such as {example}") from None
    return text


_DURATION_RE = re.compile(rf"^\s*({NUMBER_PATTERN})\s*(ms|s|sec|min)?\s*$")


def parse_duration(value: Any) -> float:
    """Seconds: ``2``, ``0.5``, ``"2s"``, ``"500ms"``, ``"1min"``."""
    example = 'e.g. 2, 0.5, "2s" or "500ms"'
    error = f"invalid duration {shown(value)}: expected seconds, {example}"
    if isinstance(value, bool):
        raise ValueError(error)
    if isinstance(value, int) and abs(value) > 10**300:  # float() cannot hold it
        raise ValueError(f"invalid duration {shown(value)}: too long; {example}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION_RE.match(value)
        if not match:
            raise ValueError(error)
        unit = match.group(2) or "s"
        seconds = float(match.group(1)) * {"ms": 0.001, "s": 1.0, "sec": 1.0, "min": 60.0}[unit]
    else:
        raise ValueError(error)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"invalid duration {shown(value)}: must be a finite, non-negative time; "
                         f"{example}")
    return seconds


# -- the markers ----------------------------------------------------------------------------------

REQUIRES_EXAMPLE = ('@pytest.mark.requires_cuda(min_devices=1, min_capability=(8, 0), '
                    'min_free_vram="24GiB", bf16=True, min_torch="2.1", min_driver="535")')
MAX_VRAM_EXAMPLE = '@pytest.mark.max_vram("6GiB", measure="reserved")'
MIN_UTIL_EXAMPLE = '@pytest.mark.min_utilization(70, warmup=2, interval=0.05)'


def parse_requires_cuda(*args: Any, **kwargs: Any) -> RequiresCuda:
    marker = REQUIRES_CUDA
    fields = ("min_devices", "min_capability", "min_total_vram", "min_free_vram", "bf16",
              "min_torch", "min_driver")
    bound = _bind(marker, args, kwargs, (), fields, (), REQUIRES_EXAMPLE)
    result: dict[str, Any] = {}
    if "min_devices" in bound:
        result["min_devices"] = _device_count(marker, "min_devices", bound["min_devices"],
                                              "min_devices=2")
    if bound.get("min_capability") is not None:
        try:
            result["min_capability"] = parse_capability(bound["min_capability"])
        except ValueError as exc:
            raise MarkerError(f"{marker}: min_capability: {exc}; e.g. "
                              "min_capability=(8, 0)") from None
    for name in ("min_total_vram", "min_free_vram"):
        if bound.get(name) is not None:
            result[name] = _size(marker, name, bound[name], f'{name}="24GiB"')
    if "bf16" in bound:
        if not isinstance(bound["bf16"], bool):
            raise MarkerError(f"{marker}: bf16: invalid value {shown(bound['bf16'])}: expected "
                              "True or False; e.g. bf16=True")
        result["bf16"] = bound["bf16"]
    if bound.get("min_torch") is not None:
        result["min_torch"] = _version(marker, "min_torch", bound["min_torch"],
                                       'min_torch="2.1"')
    if bound.get("min_driver") is not None:
        result["min_driver"] = _version(marker, "min_driver", bound["min_driver"],
                                        'min_driver="535"')
    return RequiresCuda(**result)


def _measure(marker: str, value: Any, example: str) -> str:
    if not isinstance(value, str) or value.strip().lower() not in MEASURES:
        raise MarkerError(f"{marker}: measure: invalid value {shown(value)}: expected one of "
                          f"{', '.join(repr(m) for m in MEASURES)}; e.g. {example}")
    return value.strip().lower()


def parse_max_vram(*args: Any, **kwargs: Any) -> MaxVram:
    marker = MAX_VRAM
    bound = _bind(marker, args, kwargs, ("limit", "measure"), ("limit", "measure"), ("limit",),
                  MAX_VRAM_EXAMPLE)
    limit = _size(marker, "limit", bound["limit"], MAX_VRAM_EXAMPLE)
    if limit <= 0:
        raise MarkerError(f"{marker}: limit: must be above zero, got {shown(bound['limit'])}; "
                          f"e.g. {MAX_VRAM_EXAMPLE}")
    measure = _measure(marker, bound.get("measure", "allocated"), MAX_VRAM_EXAMPLE)
    return MaxVram(limit=limit, measure=measure)


def parse_min_utilization(*args: Any, **kwargs: Any) -> MinUtilization:
    marker = MIN_UTILIZATION
    bound = _bind(marker, args, kwargs, ("percent",), ("percent", "warmup", "interval"),
                  ("percent",), MIN_UTIL_EXAMPLE)
    try:
        percent = parse_percent(bound["percent"])
    except ValueError as exc:
        raise MarkerError(f"{marker}: percent: {exc}; e.g. {MIN_UTIL_EXAMPLE}") from None
    try:
        warmup = parse_duration(bound.get("warmup", 0.0))
    except ValueError as exc:
        raise MarkerError(f"{marker}: warmup: {exc}; e.g. {MIN_UTIL_EXAMPLE}") from None
    try:
        interval = parse_duration(bound.get("interval", DEFAULT_INTERVAL))
    except ValueError as exc:
        raise MarkerError(f"{marker}: interval: {exc}; e.g. {MIN_UTIL_EXAMPLE}") from None
    if not 0.001 <= interval <= 10:
        raise MarkerError(f"{marker}: interval: {shown(bound.get('interval'))} is outside 1 ms to "
                          f"10 s; e.g. {MIN_UTIL_EXAMPLE}")
    return MinUtilization(percent=percent, warmup=warmup, interval=interval)


def parse_default_max_vram(text: str) -> MaxVram:
    """The ``gpu_max_vram`` ini value: ``"20GiB"`` or ``"20GiB:reserved"``."""
    size_text, _, measure = str(text).partition(":")
    example = "gpu_max_vram = 20GiB (or 20GiB:reserved)"
    try:
        limit = parse_size(size_text.strip())
    except ValueError as exc:
        raise MarkerError(f"{exc}; e.g. {example}") from None
    if limit <= 0:
        raise MarkerError(f"invalid size {shown(text)}: must be above zero; e.g. {example}")
    return MaxVram(limit=limit, measure=_measure("gpu_max_vram", measure or "allocated", example),
                   origin="gpu_max_vram")


def build_spec(marks: Iterable[tuple[str, tuple[Any, ...], Mapping[str, Any]]],
               fixturenames: Iterable[str], default_max_vram: MaxVram | None = None
               ) -> GpuTestSpec | None:
    """The spec of a test from its markers (closest first) and fixture names; None if not GPU.

    Every ``requires_cuda`` applies (class and function markers add up); for ``max_vram`` and
    ``min_utilization`` the closest marker wins. Raises ``MarkerError`` on a bad argument.
    """
    requires: list[RequiresCuda] = []
    max_vram: MaxVram | None = None
    min_util: MinUtilization | None = None
    is_gpu = False
    for name, args, kwargs in marks:
        if name not in GPU_MARKERS:
            continue
        is_gpu = True
        if name == GPU and (args or kwargs):
            raise MarkerError(_gpu_takes_no_arguments(args, kwargs))
        if name == REQUIRES_CUDA:
            requires.append(parse_requires_cuda(*args, **kwargs))
        elif name == MAX_VRAM:
            parsed = parse_max_vram(*args, **kwargs)
            max_vram = max_vram or parsed
        elif name == MIN_UTILIZATION:
            parsed_util = parse_min_utilization(*args, **kwargs)
            min_util = min_util or parsed_util
    fixtures = frozenset(name for name in fixturenames if name in GPU_FIXTURES)
    if not is_gpu and not fixtures:
        return None
    return GpuTestSpec(
        requires=tuple(requires) or (RequiresCuda(),),
        max_vram=max_vram or default_max_vram,
        min_utilization=min_util,
        fixtures=fixtures,
    )


def _gpu_takes_no_arguments(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """``gpu`` only selects (``-m gpu``); ``gpu(2)`` reads as "two GPUs" and was ignored."""
    given = ", ".join([shown(arg) for arg in args]
                      + [f"{key}={shown(value)}" for key, value in kwargs.items()])
    count = args[0] if len(args) == 1 and not kwargs and type(args[0]) is int else None
    devices = count if count is not None and 1 <= count <= 4096 else 2
    return (f"{GPU}: takes no arguments, got ({given}): it only marks a GPU test (for "
            f"`-m gpu`); to need {devices} GPUs write "
            f"@pytest.mark.{REQUIRES_CUDA}(min_devices={devices})")


def describe_size(value: int) -> str:
    """``format_bytes`` without a trailing ``.0``: ``24 GiB``, ``7.9 GiB``."""
    return format_bytes(value).replace(".0 ", " ")
