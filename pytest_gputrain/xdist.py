"""pytest-xdist: which kind of process this is (the pinning of workers to GPUs is in
``assertions/xdist.py``)."""

from __future__ import annotations

import re

import pytest


def is_xdist_worker(config: pytest.Config) -> bool:
    """True in a pytest-xdist worker (it runs tests; the controller reports)."""
    return hasattr(config, "workerinput")


def worker_number(workerid: str | None) -> int | None:
    """``"gw3"`` -> 3; None for anything else (the controller, no xdist)."""
    match = re.fullmatch(r"gw(\d+)", workerid or "")
    return int(match.group(1)) if match else None
