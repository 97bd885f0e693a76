"""Multi-GPU tests: run a function on N ranks, one process each, and diagnose what they did.

    from pytest_gputrain.distributed import run_ranks, rank_device

See ``launcher`` for the launch, ``plugin`` for the ``distributed`` fixture and marker, and
``docs/multi-gpu.md``. Importing this package imports no torch.
"""

from pytest_gputrain.distributed.errors import (
    DistributedError,
    DistributedSetupError,
    RankFailure,
    RankFunctionNotPicklable,
    RankTimeout,
)
from pytest_gputrain.distributed.launcher import Launch, in_rank, launch, rank_device, run_ranks

__all__ = [
    "DistributedError",
    "DistributedSetupError",
    "Launch",
    "RankFailure",
    "RankFunctionNotPicklable",
    "RankTimeout",
    "in_rank",
    "launch",
    "rank_device",
    "run_ranks",
]
