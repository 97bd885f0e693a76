"""Multi-GPU tests: run a function on N ranks, one process each, and diagnose what they did.

    from pytest_gputrain.distributed import run_ranks, rank_device

See ``launcher`` for the launch, ``record`` for its public account, ``plugin`` for the
``distributed`` fixture and marker, and ``docs/multi-gpu.md``. Importing this package imports no
torch, and the launcher only when one of its names is used (pytest imports this package at
start-up, for the plugin).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_gputrain.distributed.errors import (
        DistributedError,
        DistributedSetupError,
        RankFailure,
        RankFunctionNotPicklable,
        RankTimeout,
    )
    from pytest_gputrain.distributed.launcher import (
        Launch,
        in_rank,
        launch,
        rank_device,
        run_ranks,
    )
    from pytest_gputrain.distributed.record import LaunchRecord, RankError, RankRecord

_ERRORS = ("DistributedError", "DistributedSetupError", "RankFailure",
           "RankFunctionNotPicklable", "RankTimeout")
_LAUNCHER = ("Launch", "in_rank", "launch", "rank_device", "run_ranks")
_RECORD = ("LaunchRecord", "RankError", "RankRecord")
__all__ = [
    "DistributedError",
    "DistributedSetupError",
    "Launch",
    "LaunchRecord",
    "RankError",
    "RankFailure",
    "RankFunctionNotPicklable",
    "RankRecord",
    "RankTimeout",
    "in_rank",
    "launch",
    "rank_device",
    "run_ranks",
]


def __getattr__(name: str) -> Any:
    if name in _ERRORS:
        return getattr(importlib.import_module("pytest_gputrain.distributed.errors"), name)
    if name in _LAUNCHER:
        return getattr(importlib.import_module("pytest_gputrain.distributed.launcher"), name)
    if name in _RECORD:
        return getattr(importlib.import_module("pytest_gputrain.distributed.record"), name)
    raise AttributeError(f"module 'pytest_gputrain.distributed' has no attribute {name!r}")
