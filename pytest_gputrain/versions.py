"""Version numbers as the project compares them, for the rule language's ``version()`` and the
markers' ``min_torch``/``min_driver``: PEP 440 order through ``packaging.version``, so a
pre-release comes before its release (``2.6.0rc1 < 2.6``, ``2.11.0.dev20260101 < 2.11``) and
driver versions compare part by part as numbers (``580.159.04 > 535.104.5``).

The local build tag is dropped: ``2.11.0+cu130`` is torch 2.11.0 built for CUDA 13.0, the same
release as ``2.11.0`` (PEP 440 would order it after 2.11.0 and call the two unequal, so a
CUDA build would fail ``<= 2.11.0`` and ``== 2.11``).

Imports ``packaging``: import this module where a version is compared, not at start-up.
"""

from __future__ import annotations

import re
from typing import Final

import packaging.version

# A version part longer than this is a mistake; int() refuses more than 4,300 digits anyway.
MAX_PART_DIGITS: Final = 64

_LEADING_VERSION: Final = re.compile(
    r"\s*" + packaging.version.VERSION_PATTERN, re.VERBOSE | re.IGNORECASE)
_LONG_PART: Final = re.compile(rf"\d{{{MAX_PART_DIGITS + 1}}}")


class Version(packaging.version.Version):
    """A PEP 440 version without its local tag: ``Version("2.11.0+cu130") == Version("2.11")``."""

    __slots__ = ()

    def __init__(self, version: str) -> None:
        # In PEP 440 a '+' only ever starts the local tag.
        super().__init__(version.partition("+")[0])

    def __repr__(self) -> str:
        return f"version('{self}')"


def read_version(text: str) -> Version:
    """The version at the start of ``text``, ignoring what follows it.

    ``"v2.11.0+cu130"`` -> 2.11.0, ``"12.4.x"`` -> 12.4, ``"2.6.0rc1"`` -> 2.6.0rc1. Raises
    ``ValueError`` when ``text`` does not start with a version.
    """
    match = _LEADING_VERSION.match(text)
    if match is None:
        raise ValueError("no version number at its start")
    found = match.group(0)
    if _LONG_PART.search(found):
        raise ValueError(f"a part has more than {MAX_PART_DIGITS} digits")
    return Version(found)


def version_at_least(have: str, need: str) -> bool | None:
    """``have >= need`` in PEP 440 order, local tags dropped; None when either is unreadable."""
    try:
        return read_version(have) >= read_version(need)
    except ValueError:
        return None
