"""What a multi-rank launch raises. Plain classes: importing this module imports no torch.

``RankFailure``  a rank raised, crashed or was aborted (NCCL watchdog): names the rank, embeds its
                 traceback (or its output's tail), the backend and the NCCL variables it ran with.
``RankTimeout``  ranks were still running when the launch's timeout ran out: names them and what
                 each was doing (collective, step, stack), and says that they were killed.
``RankFunctionNotPicklable``  the function or its arguments cannot be sent to a rank process.
``DistributedSetupError``     the launch cannot start as asked (too few GPUs, bad world size...).
"""

from __future__ import annotations

from typing import Any


class DistributedError(Exception):
    """Base class of the launcher's errors."""


class DistributedSetupError(DistributedError):
    """The launch cannot start as asked: a usage error, raised before any rank starts."""


class RankFunctionNotPicklable(DistributedSetupError, TypeError):
    """The rank function or its arguments cannot be pickled for the rank processes."""


class RankFailure(DistributedError):
    """A rank failed: an exception, a crash, or an abort by the NCCL watchdog.

    Attributes: ``rank``, ``world_size``, ``backend``, ``kind`` (``exception``, ``nccl_timeout``,
    ``nccl_error``, ``collective_timeout``, ``peer_failure``, ``init_failure``, ``crash``),
    ``exc_type`` (the rank's exception class name, or None), ``exc_message``, ``traceback_text``,
    ``exit_code``, ``nccl_env`` (the rank's NCCL_* and TORCH_NCCL_* variables), ``log_tail``,
    ``pids`` (of every rank, all ended by now), ``record`` (the launch's ``LaunchRecord``: every
    rank's outcome, activity and stack) and ``facts`` (a DistributedRunFacts when the launch
    recorded them).
    """

    def __init__(self, message: str, *, rank: int, world_size: int, backend: str | None,
                 kind: str, exc_type: str | None = None, exc_message: str | None = None,
                 traceback_text: str | None = None, exit_code: int | None = None,
                 nccl_env: dict[str, str] | None = None, log_tail: str = "",
                 facts: Any = None, pids: list[int] | None = None,
                 record: Any = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.kind = kind
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.traceback_text = traceback_text
        self.exit_code = exit_code
        self.nccl_env = dict(nccl_env or {})
        self.log_tail = log_tail
        self.facts = facts
        self.pids = list(pids or [])
        self.record = record


class RankTimeout(RankFailure):
    """Ranks were still running when the launch's timeout ran out; they were killed.

    ``stuck_ranks`` lists them; ``rank`` is the first of them. ``kind`` is ``hang``.
    """

    def __init__(self, message: str, *, stuck_ranks: list[int], timeout: float,
                 **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.stuck_ranks = list(stuck_ranks)
        self.timeout = timeout
