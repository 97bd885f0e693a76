"""Parsing and formatting of sizes and percentages, as users write them in markers and ini files,
and of durations.

Sizes accept ``"6GiB"``, ``"6 GB"``, ``"512MiB"``, ``6e9`` (bytes) and ints; percentages accept
``70``, ``70.5`` and ``"70%"``. Every bad value -- a typo, a boolean, NaN, infinity, a negative
or absurdly large amount, an integer too large for a float -- raises ``ValueError`` (never
``OverflowError``) with a message that names the value and shows a valid example, so callers can
turn them into usage errors as they are.
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

# A decimal number written so that the regex cannot backtrack over its digits in many ways
# (``[0-9]*\.?[0-9]+`` can, and takes seconds to reject a few thousand digits with a bad tail).
NUMBER_PATTERN = r"(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_SIZE_RE = re.compile(rf"^\s*({NUMBER_PATTERN})\s*([a-zA-Z]*)\s*$")

SIZE_EXAMPLE = '"6GiB", "6 GB", "512MiB" or 6e9 (bytes)'
PERCENT_EXAMPLE = '70 or "70%"'

# No machine has an exbibyte of memory: a larger size is a typo or a unit mix-up, and refusing
# it keeps every later computation (and message) on ordinary numbers.
MAX_SIZE = 2**60
MAX_SIZE_TEXT = "1 EiB (2**60 bytes)"


# C0 controls but tab and newline, DEL, and C1 controls: what a terminal acts on (an escape
# sequence that clears the screen, moves the cursor, rewrites the title) rather than prints.
# And the invisible marks that reorder, hide or break text where it is shown (Trojan Source,
# CVE-2021-42574 and CVE-2021-42694): the bidirectional embeddings, overrides and isolates
# (U+202A-U+202E, U+2066-U+2069), the direction marks (U+200E, U+200F, U+061C), the line and
# paragraph separators (U+2028, U+2029), and the formatting characters that show nothing: the
# zero-width space (U+200B), the word joiner and invisible operators (U+2060-U+2064), the
# deprecated shaping controls (U+206A-U+206F), the Mongolian vowel separator (U+180E), the
# zero-width no-break space (U+FEFF) and the interlinear annotation marks (U+FFF9-U+FFFB).
# The zero-width joiner and non-joiner (U+200C, U+200D) stay: emoji and Persian or Indic text
# need them, and they reorder nothing.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u180e\u200b\u200e\u200f"
                      "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb]")


def _written_out(character: str) -> str:
    code = ord(character)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every terminal control character and bidirectional mark written out
    (``\\x1b``, ``\\u202e``), so that a string from a facts file, a rule file or the
    environment prints as itself. The one filter of what the terminal and Markdown show."""
    return _CONTROL.sub(lambda match: _written_out(match.group()), text)


def shown(value: object, limit: int = 40) -> str:
    """``repr(value)`` cut to a readable length, for error messages.

    Safe for any value: integers too long to print in full (Python refuses to print more than
    4300 digits) are described by their number of digits.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"{'a negative' if value < 0 else 'an'} integer of about {digits} digits"
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    try:
        text = repr(value)
    except Exception:  # an object whose repr fails still deserves an error message
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _invalid_size(value: object, problem: str) -> ValueError:
    return ValueError(f"invalid size {shown(value)}: {problem}; e.g. {SIZE_EXAMPLE}")


def parse_size(value: object) -> int:
    """Return ``value`` as a number of bytes, at most :data:`MAX_SIZE`."""
    if isinstance(value, bool):
        raise _invalid_size(value, "a boolean is not a size")
    number: int | float
    if isinstance(value, int):
        number, unit = value, ""  # exact: a huge int must not pass through float
    elif isinstance(value, float):
        number, unit = value, ""
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        if not match:
            raise _invalid_size(value, "expected a number and a unit")
        number, unit = float(match.group(1)), match.group(2).lower()
    else:
        raise _invalid_size(value, f"a {type(value).__name__} is not a size")
    if unit not in _SIZE_UNITS:
        raise _invalid_size(value, f"unknown unit {unit!r} (use {BYTE_UNIT_NAMES})")
    if isinstance(number, float) and math.isnan(number):
        raise _invalid_size(value, "not a number")
    if number < 0:
        raise _invalid_size(value, "must not be negative")
    amount = number * _SIZE_UNITS[unit]
    if amount > MAX_SIZE:  # also inf
        raise _invalid_size(value, f"larger than {MAX_SIZE_TEXT}, more than any machine has")
    return round(amount)


def parse_percent(value: object) -> float:
    """Return ``value`` as a percentage in [0, 100]."""
    if isinstance(value, bool):
        raise ValueError(f"invalid percentage {value!r}: a boolean is not a percentage; "
                         f"e.g. {PERCENT_EXAMPLE}")
    out_of_range = ValueError(f"invalid percentage {shown(value)}: must lie between 0 and 100; "
                              f"e.g. {PERCENT_EXAMPLE}")
    if isinstance(value, int) and not 0 <= value <= 100:
        raise out_of_range  # before float(), which cannot hold 10**400
    text = value.strip().removesuffix("%").strip() if isinstance(value, str) else value
    try:
        number = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"invalid percentage {shown(value)}: expected a number; "
                         f"e.g. {PERCENT_EXAMPLE}") from None
    if math.isnan(number):
        raise ValueError(f"invalid percentage {shown(value)}: not a number; "
                         f"e.g. {PERCENT_EXAMPLE}")
    if not 0 <= number <= 100:
        raise out_of_range
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


def format_duration(seconds: float | None, *, precise: bool = False) -> str:
    """A duration for people: ``12.3 ms``, ``1.50 s``; ``–`` when unknown.

    ``precise`` (the regression gate, whose verdicts turn on a few percent): three decimals and
    microseconds below a millisecond, ``9.986 ms``, ``1.234 s``, ``45.6 µs``.
    """
    if seconds is None:
        return "–"
    if not precise:
        return f"{seconds * 1000:.1f} ms" if abs(seconds) < 1 else f"{seconds:.2f} s"
    if abs(seconds) >= 1:
        return f"{seconds:.3f} s"
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} µs"


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
            return format_duration(value)
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
