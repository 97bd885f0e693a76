"""Run a function on N ranks, one process each, and never hang the test run.

    from pytest_gputrain.distributed import run_ranks

    def train(steps):                      # module level: each rank imports it by name
        model = DDP(Net().to(rank_device()))
        ...
        return loss.item()

    losses = run_ranks(train, world_size=2, args=(20,))   # [loss of rank 0, loss of rank 1]

The front of a launch: the arguments are checked before any process starts, then the ranks run

* here, as processes that torch elastic starts (``processes``), or
* under ``torchrun``, on the ranks torchrun started, this process being one of them
  (``torchrun``),

and either way the launch ends with a :class:`~pytest_gputrain.distributed.record.LaunchRecord`,
from which this module raises :class:`RankFailure` (a rank failed: its rank and traceback) or
:class:`RankTimeout` (ranks hung: each one's collective and stack), skips the test when a rank
skipped it, and builds the diagnosis facts.

This module imports no torch at import time.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import pickle
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_gputrain.distributed import analysis
from pytest_gputrain.distributed.errors import (
    DistributedSetupError,
    RankFailure,
    RankFunctionNotPicklable,
    RankTimeout,
)
from pytest_gputrain.distributed.processes import EXIT_GRACE_S, RANK_ENV
from pytest_gputrain.distributed.record import (
    LaunchRecord,
    LaunchSettings,
    failure_text,
    hang_text,
)

LOG_ECHO_LINES = 200


class LaunchRecorder(Protocol):
    """Receives the facts of each launch made while a test runs (set by the pytest plugin)."""

    probe: bool

    def record(self, facts: Any) -> None: ...


_recorder: contextvars.ContextVar[LaunchRecorder | None] = contextvars.ContextVar(
    "gputrain_launch_recorder", default=None)


def set_recorder(recorder: LaunchRecorder | None) -> contextvars.Token[LaunchRecorder | None]:
    return _recorder.set(recorder)


def reset_recorder(token: contextvars.Token[LaunchRecorder | None]) -> None:
    _recorder.reset(token)


# ------------------------------------------------------------------------------------------
# Helpers for rank functions


def in_rank() -> bool:
    """True inside a rank process started by the launcher (not in a torchrun worker: there a
    launch runs the function in the worker itself)."""
    return RANK_ENV in os.environ


def rank_device() -> Any:
    """This rank's device: ``cuda:LOCAL_RANK`` when the rank has a GPU, else ``cpu``."""
    import torch

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


# ------------------------------------------------------------------------------------------
# Checks made before any process starts


@dataclass
class Launch:
    """The outcome of a launch that succeeded: per-rank results in rank order, and facts."""

    world_size: int
    backend: str
    results: list[Any]
    duration: float
    pids: list[int]
    facts: Any = None  # DistributedRunFacts when recorded
    outputs: list[str] = field(default_factory=list)
    record: LaunchRecord | None = None


def _check_picklable(fn: Callable[..., Any], args: Sequence[Any],
                     kwargs: Mapping[str, Any]) -> bytes:
    name = getattr(fn, "__qualname__", repr(fn))
    module = getattr(fn, "__module__", None)
    main = sys.modules.get("__main__")
    if module == "__main__" and not os.path.isfile(str(getattr(main, "__file__", ""))):
        raise RankFunctionNotPicklable(
            f"run_ranks: {name} is defined in __main__ of an interactive session (python -c, "
            "stdin, a notebook), which rank processes cannot import. Put it in a module file.")
    if "<lambda>" in name or "<locals>" in name:
        raise RankFunctionNotPicklable(
            f"run_ranks: {module}.{name} cannot run in a rank process: each rank imports the "
            "function by its module and name, so it must be defined at module level (not a "
            "lambda, a nested function or a method of a local class). Move it to the top level "
            "of the test module or of a helper module."
        )
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise RankFunctionNotPicklable(
            f"run_ranks: the function {module}.{name} cannot be pickled for the rank processes "
            f"({type(exc).__name__}: {exc}). Define it at module level of an importable module."
        ) from None
    for label, value in [(f"args[{i}]", v) for i, v in enumerate(args)] + [
            (f"kwargs[{k!r}]", v) for k, v in kwargs.items()]:
        try:
            pickle.dumps(value)
        except Exception as exc:
            raise RankFunctionNotPicklable(
                f"run_ranks: {label} ({type(value).__name__}) cannot be pickled for the rank "
                f"processes ({type(exc).__name__}: {exc}). Pass plain data (numbers, strings, "
                "paths, CPU tensors, state_dict()s) and build models, process groups and "
                "loaders inside the rank function."
            ) from None
    return pickle.dumps((fn, tuple(args), dict(kwargs)))


def resolve_backend(backend: str | None, world_size: int, init: bool = True) -> str:
    """``nccl`` when every rank can have its own GPU, else ``gloo`` (CPU); checks a given one.

    ``world_size`` is the number of ranks on this host: all of them here, LOCAL_WORLD_SIZE
    under torchrun."""
    from pytest_gputrain.collect.torch_import import import_torch

    try:
        torch = import_torch()
        import torch.distributed as dist
    except ImportError as exc:
        raise DistributedSetupError(f"run_ranks needs torch: {exc}") from None
    if not dist.is_available():
        raise DistributedSetupError("this torch build has no torch.distributed support")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:
        return "nccl" if gpus >= world_size and dist.is_nccl_available() else "gloo"
    if not init:
        return backend
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise DistributedSetupError(
                "backend 'nccl' is not available in this torch build (CPU-only or no NCCL); "
                "use backend='gloo' or backend=None (auto)")
        if gpus < world_size:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            raise DistributedSetupError(
                f"backend 'nccl' runs one rank per GPU: world_size={world_size} needs "
                f"{world_size} GPUs, torch sees {gpus}{hint}. Mark the test "
                f"@pytest.mark.requires_cuda(min_devices={world_size}) to skip it there.")
    elif backend == "gloo" and not dist.is_gloo_available():
        raise DistributedSetupError("backend 'gloo' is not available in this torch build")
    return backend


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` in this process's environment for a launch run here (torchrun), then as before."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# ------------------------------------------------------------------------------------------
# What a launch ends with


def _echo(record: LaunchRecord) -> None:
    for rank in record.ranks:
        lines = rank.output.rstrip().splitlines()
        if not lines:
            continue
        if len(lines) > LOG_ECHO_LINES:
            skipped = len(lines) - LOG_ECHO_LINES
            lines = [f"... {skipped} earlier line(s) left out ...", *lines[-LOG_ECHO_LINES:]]
        sys.stdout.write("".join(f"[rank {rank.rank}] {line}\n" for line in lines))
    sys.stdout.flush()


def _raise_for(record: LaunchRecord) -> None:
    """RankFailure, RankTimeout, pytest's skip, or a warning about a rank stuck at exit."""
    common: dict[str, Any] = {"world_size": record.world_size, "backend": record.backend,
                              "nccl_env": dict(record.nccl_env), "pids": record.pids,
                              "record": record}
    if record.failed_rank is not None:
        failed = record.ranks[record.failed_rank]
        error = failed.error
        raise RankFailure(failure_text(record), rank=failed.rank,
                          kind=failed.failure_kind or "crash",
                          exc_type=error.type if error else None,
                          exc_message=error.message if error else None,
                          traceback_text=error.traceback if error else None,
                          exit_code=failed.exit_code, log_tail=analysis.tail(failed.output),
                          **common)
    if record.stuck_ranks:
        first = record.stuck_ranks[0]
        raise RankTimeout(hang_text(record), stuck_ranks=list(record.stuck_ranks),
                          timeout=record.timeout or 0.0, rank=first, kind="hang",
                          log_tail=analysis.tail(record.ranks[first].output), **common)
    skipped = [r for r in record.ranks if r.outcome == "skipped"]
    if skipped:
        import pytest

        error = skipped[0].error
        pytest.skip(f"rank {skipped[0].rank}: {error.message if error else 'skipped'}")
    for rank in record.ranks:
        if rank.outcome == "stuck_at_exit":
            warnings.warn(f"rank {rank.rank} returned its result but did not exit within "
                          f"{EXIT_GRACE_S:g} s (hung in interpreter or NCCL teardown); "
                          "it was killed", RuntimeWarning, stacklevel=4)


# ------------------------------------------------------------------------------------------
# The launch


def launch(
    fn: Callable[..., Any],
    world_size: int = 2,
    backend: str | None = None,
    timeout: float | None = 120.0,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    collective_timeout: float | None = None,
    init_process_group: bool = True,
    probe: bool | None = None,
    echo_output: bool = True,
    test: str | None = None,
) -> Launch:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; see :func:`run_ranks`."""
    if in_rank():
        raise DistributedSetupError(
            "run_ranks was called inside a rank process. If the call is at module level of a "
            "script, guard it with `if __name__ == '__main__':`; nested launches are not "
            "supported.")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise DistributedSetupError(f"world_size must be a positive integer, got {world_size!r}")
    if timeout is not None and timeout <= 0:
        raise DistributedSetupError(f"timeout must be positive seconds or None, got {timeout!r}")
    kwargs = dict(kwargs or {})
    # Checked under torchrun too, where nothing is pickled, so that a test passes or fails alike.
    payload = _check_picklable(fn, args, kwargs)
    from pytest_gputrain.distributed import torchrun

    here = torchrun.under_torchrun()
    if here and world_size != int(os.environ["WORLD_SIZE"]):
        import pytest

        pytest.skip(f"run_ranks(world_size={world_size}) under a torchrun of "
                    f"{os.environ['WORLD_SIZE']} ranks: a launch runs on torchrun's ranks")
    backend = resolve_backend(backend, torchrun.ranks_on_this_host() if here else world_size,
                              init_process_group)
    if collective_timeout is None:
        collective_timeout = max(5.0, timeout / 2) if timeout is not None else 1800.0
    recorder = _recorder.get()
    if probe is None:
        probe = bool(recorder is not None and recorder.probe)
    settings = LaunchSettings(world_size, backend, timeout, float(collective_timeout),
                              init_process_group, probe,
                              {k: str(v) for k, v in (env or {}).items()})
    if here:
        with _environment(settings.env):
            record, results = torchrun.run_here(fn, args, kwargs, settings)
    else:
        from pytest_gputrain.distributed import processes

        record, results = processes.run(settings, payload)
    if echo_output:
        _echo(record)
    error: RankFailure | None = None
    try:
        _raise_for(record)
    except RankFailure as exc:
        error = exc
    facts = None
    if recorder is not None or probe:
        from pytest_gputrain.distributed.launch_facts import build_facts

        facts = build_facts(record, test, error)
        if recorder is not None:
            recorder.record(facts)
    if error is not None:
        error.facts = facts
        raise error
    return Launch(world_size=world_size, backend=backend, results=results,
                  duration=record.duration, pids=record.pids, facts=facts,
                  outputs=[r.output for r in record.ranks], record=record)


def run_ranks(
    fn: Callable[..., Any],
    world_size: int = 2,
    backend: str | None = None,
    timeout: float | None = 120.0,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    collective_timeout: float | None = None,
    init_process_group: bool = True,
    probe: bool | None = None,
    echo_output: bool = True,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks and return their results in rank order.

    ``fn`` must be importable by name (module level). ``backend`` None picks ``nccl`` when torch
    sees a GPU per rank, else ``gloo``. ``timeout`` (seconds, None for none) bounds the whole
    launch, start-up included; ``collective_timeout`` (default half of it) is given to
    ``init_process_group`` so that a stuck collective fails with the backend's own error first.
    ``env`` adds variables to the ranks' environment. ``init_process_group=False`` leaves the
    group to ``fn`` (``init_method="env://"`` works: MASTER_ADDR/PORT, RANK, WORLD_SIZE are set).
    ``probe`` records per-rank steps and batches (on by default under ``--gpu-diagnose``).
    Each rank's output is echoed, prefixed ``[rank N]``, when the launch ends.

    Raises :class:`RankFailure` when a rank fails, :class:`RankTimeout` when ranks hang,
    :class:`RankFunctionNotPicklable` / :class:`DistributedSetupError` before starting any rank.
    """
    return launch(fn, world_size, backend, timeout, args, kwargs, env,
                  collective_timeout=collective_timeout, init_process_group=init_process_group,
                  probe=probe, echo_output=echo_output).results
