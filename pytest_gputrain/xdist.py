"""pytest-xdist: which kind of process this is, and the one way a worker's data reaches the
controller (the pinning of workers to GPUs is in ``assertions/worker_gpus.py``)."""

from __future__ import annotations

import re
from typing import Any

import pytest


def is_xdist_worker(config: pytest.Config) -> bool:
    """True in a pytest-xdist worker (it runs tests; the controller reports)."""
    return hasattr(config, "workerinput")


def worker_number(workerid: str | None) -> int | None:
    """``"gw3"`` -> 3; None for anything else (the controller, no xdist)."""
    match = re.fullmatch(r"gw(\d+)", workerid or "")
    return int(match.group(1)) if match else None


def send_to_controller(config: pytest.Config, key: str, value: Any) -> None:
    """On a worker: ``value`` goes to the controller under ``key`` when the worker finishes.

    As JSON text: what arrives is what a JSON file would hold (lists for tuples), and a value
    JSON cannot hold fails here, naming the key, not in xdist's channel.
    """
    import json

    try:
        text = json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"gputrain: workeroutput[{key!r}] must be JSON data: {exc}") from None
    config.workeroutput[key] = text  # type: ignore[attr-defined]  # set by xdist on a worker


def sent_by_worker(node: Any, key: str, default: Any = None) -> Any:
    """On the controller (``pytest_testnodedown``): what worker ``node`` sent under ``key``;
    ``default`` when it sent nothing (or crashed)."""
    text = (getattr(node, "workeroutput", None) or {}).get(key)
    if text is None:
        return default
    import json

    return json.loads(text)
