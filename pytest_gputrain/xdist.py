"""pytest-xdist: which kind of process this is (the pinning of workers to GPUs is in
``assertions/xdist.py``)."""

from __future__ import annotations

import pytest


def is_xdist_worker(config: pytest.Config) -> bool:
    """True in a pytest-xdist worker (it runs tests; the controller reports)."""
    return hasattr(config, "workerinput")
