"""Parsing and formatting of sizes and percentages, as users write them in markers and ini files.

Sizes accept ``"6GiB"``, ``"6 GB"``, ``"512MiB"``, ``6e9`` (bytes) and ints; percentages accept
``70``, ``70.5`` and ``"70%"``. Errors are ``ValueError`` with a message that names the value and
shows a valid example, so callers can turn them into usage errors as they are.
"""

from __future__ import annotations

import math
import re

# The byte units written out in full; the rule language accepts only these.
BYTE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
BYTE_UNIT_NAMES = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"

# Markers and ini values also take a bare number (bytes) and the one-letter binary shorthands.
_SIZE_UNITS: dict[str, int] = {**BYTE_UNITS, "": 1, "k": 2**10, "m": 2**20, "g": 2**30,
                               "t": 2**40}

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

SIZE_EXAMPLE = '"6GiB", "6 GB", "512MiB" or 6e9 (bytes)'
PERCENT_EXAMPLE = '70 or "70%"'


def parse_size(value: object) -> int:
    """Return ``value`` as a number of bytes."""
    if isinstance(value, bool):
        raise ValueError(f"invalid size {value!r}: expected a size such as {SIZE_EXAMPLE}")
    if isinstance(value, int | float):
        number, unit = float(value), ""
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        if not match:
            raise ValueError(f"invalid size {value!r}: expected a size such as {SIZE_EXAMPLE}")
        number, unit = float(match.group(1)), match.group(2).lower()
    else:
        raise ValueError(
            f"invalid size {value!r} ({type(value).__name__}): expected a size such as "
            f"{SIZE_EXAMPLE}"
        )
    if unit not in _SIZE_UNITS:
        raise ValueError(
            f"invalid size {value!r}: unknown unit {unit!r} (use {BYTE_UNIT_NAMES}), "
            f"e.g. {SIZE_EXAMPLE}"
        )
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"invalid size {value!r}: must be a finite, non-negative amount")
    return round(number * _SIZE_UNITS[unit])


def parse_percent(value: object) -> float:
    """Return ``value`` as a percentage in [0, 100]."""
    text = value
    if isinstance(value, bool):
        raise ValueError(f"invalid percentage {value!r}: expected {PERCENT_EXAMPLE}")
    if isinstance(value, str):
        text = value.strip().removesuffix("%").strip()
    try:
        number = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"invalid percentage {value!r}: expected {PERCENT_EXAMPLE}") from None
    if not math.isfinite(number) or not 0 <= number <= 100:
        raise ValueError(f"invalid percentage {value!r}: must lie between 0 and 100")
    return number


def format_bytes(value: float | None) -> str:
    """Human-readable binary size: ``6.0 GiB``."""
    if value is None:
        return "unknown"
    sign = "-" if value < 0 else ""
    amount = abs(float(value))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024:
            return f"{sign}{amount:.0f} {unit}" if unit == "B" else f"{sign}{amount:.1f} {unit}"
        amount /= 1024
    return f"{sign}{amount:.1f} TiB"


def format_value(value: object, unit: str | None) -> str:
    """Format a fact value for people, according to its unit."""
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        if unit == "bytes":
            return format_bytes(value)
        if unit == "%":
            return f"{value:.0f} %" if float(value).is_integer() else f"{value:.1f} %"
        if unit == "s":
            return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"
        if unit == "ms":
            return f"{value:.2f} ms"
        if isinstance(value, float) and not value.is_integer():
            # Three significant digits, but never scientific notation for everyday magnitudes.
            text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
        else:
            text = str(int(value)) if isinstance(value, float) else str(value)
        return f"{text} {unit}" if unit else text
    if isinstance(value, list | tuple):
        return ", ".join(format_value(item, None) for item in value) or "none"
    return str(value)
