"""pytest-xdist: pin each worker to its own GPU(s) through ``CUDA_VISIBLE_DEVICES``.

``--gpu-per-worker=N`` (ini ``gpu_per_worker``) gives worker *i* the GPUs ``N*i … N*i+N-1`` of
the pool, where the pool is the caller's ``CUDA_VISIBLE_DEVICES`` when set (workers never get a
GPU the caller excluded) and else every GPU NVML sees. More workers than the pool can serve is a
usage error, unless ``--gpu-share`` (ini ``gpu_share``) lets workers share GPUs round-robin.

How the variable reaches a worker before CUDA initialises there: the controller computes every
assignment in ``pytest_xdist_setupnodes`` (it knows the gateway specs, so the worker count) and
puts it into each spec's environment (``env:CUDA_VISIBLE_DEVICES``, which execnet sets before
the worker imports anything, conftests included); ``pytest_configure_node`` also sends it in
``workerinput`` (or None when the controller decided not to pin, having said why), and the
worker's ``pytest_configure`` (tryfirst) applies it again. A worker whose controller did not
decide (no key in ``workerinput``) works its own assignment out from ``PYTEST_XDIST_WORKER`` /
the worker count.

What a worker has to say (it could not be pinned, CUDA was initialised too early) travels back
to the controller when the worker finishes, and the controller prints it as one line per worker
at the end of the session: a warning raised in the worker would reach the terminal as a raw
``UserWarning`` with this file's path and source line.

The pytest hooks are the assertions' plugin object's (``assertions/plugin.py``); this module
holds what they do.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from pytest_gputrain.units import shown
from pytest_gputrain.xdist import sent_by_worker, worker_number

WORKERINPUT_KEY = "gputrain_cuda_visible_devices"
NOTES_KEY = "gputrain_pinning_notes"  # what a worker sends: lines for the controller
VARIABLE = "CUDA_VISIBLE_DEVICES"


class PinningError(ValueError):
    """The GPUs cannot be assigned as asked (the message says why and what to do)."""


def parse_visible(visible: str | Sequence[str] | None, device_count: int | None = None
                  ) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` that CUDA would use; None when unset.

    CUDA stops at the first entry that names no device, so with ``device_count`` known the list
    is cut at the first index that is out of range (or negative).
    """
    if visible is None:
        return None
    items = visible.split(",") if isinstance(visible, str) else list(visible)
    entries = [item.strip() for item in items if item.strip()]
    result: list[str] = []
    for entry in entries:
        if re.fullmatch(r"-?\d+", entry):
            number = int(entry)
            if number < 0 or (device_count is not None and number >= device_count):
                break
        result.append(entry)
    return result


def assign_devices(worker_index: int, n_workers: int, per_worker: int,
                   visible: str | Sequence[str] | None, device_count: int | None,
                   share: bool = False) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries of worker ``worker_index`` (0-based) of ``n_workers``.

    ``visible`` is the caller's ``CUDA_VISIBLE_DEVICES`` (None when unset); ``device_count`` the
    GPUs NVML sees (None when unknown). Raises ``PinningError`` when it cannot be done.
    """
    if per_worker < 1:
        raise PinningError(f"--gpu-per-worker must be 1 or more, got {per_worker}")
    if n_workers < 1 or not 0 <= worker_index < n_workers:
        raise PinningError(f"worker {worker_index} is not one of {n_workers} workers")
    pool = parse_visible(visible, device_count)
    if pool is None:
        if device_count is None:
            raise PinningError("cannot count the GPUs (NVML not available) and "
                               "CUDA_VISIBLE_DEVICES is not set")
        pool = [str(index) for index in range(device_count)]
        source = f"NVML sees {device_count}"
    else:
        shown = visible if isinstance(visible, str) else ",".join(visible or ())
        source = f"CUDA_VISIBLE_DEVICES={shown!r}"
    if not pool:
        raise PinningError(f"no GPU to assign ({source})")
    if per_worker > len(pool):
        raise PinningError(f"--gpu-per-worker={per_worker} but only {len(pool)} GPU"
                           f"{'s' if len(pool) != 1 else ''} available ({source})")
    needed = n_workers * per_worker
    if needed <= len(pool):
        start = worker_index * per_worker
        return pool[start:start + per_worker]
    if share:
        start = (worker_index * per_worker) % len(pool)
        return [pool[(start + k) % len(pool)] for k in range(per_worker)]
    fit = len(pool) // per_worker
    raise PinningError(
        f"{n_workers} xdist workers x {per_worker} GPU{'s' if per_worker != 1 else ''} each "
        f"need {needed} GPUs, {len(pool)} available ({source}): run with -n {fit}, or add "
        "--gpu-share to let workers share GPUs round-robin")


def parse_per_worker(value: Any) -> int | None:
    """The ``gpu_per_worker`` option: None (off) or a whole number >= 1; ValueError naming
    anything else."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    text = str(value).strip()
    # ASCII digits only (int() refuses some that isdigit() accepts), and few of them.
    if not re.fullmatch(r"[0-9]{1,4}", text) or int(text) < 1:
        raise ValueError(f"{shown(value)} is not a whole number >= 1 (e.g. 1; add --gpu-share "
                         "to let workers share GPUs)")
    return int(text)


CountGpus = Callable[[], "tuple[int | None, str | None]"]


class XdistPinning:
    """Controller side: one assignment per gateway spec, before any worker starts; then what the
    workers said about their pinning, for the end of the session."""

    def __init__(self, config: pytest.Config, per_worker: int, share: bool,
                 count_gpus: CountGpus) -> None:
        self.config = config
        self.per_worker = per_worker
        self.share = share
        self.count_gpus = count_gpus
        self.assigned: dict[str, str] = {}  # spec id -> CUDA_VISIBLE_DEVICES
        self.decided = False  # setupnodes ran: workers follow it, pinned or not
        self.worker_notes: list[str] = []

    def setup_nodes(self, specs: Sequence[Any]) -> None:
        """``pytest_xdist_setupnodes``: each spec's ``CUDA_VISIBLE_DEVICES``."""
        self.decided = True
        visible = os.environ.get(VARIABLE)
        count, reason = self.count_gpus()
        pool = parse_visible(visible, count)
        if (pool is None and count is None) or pool == [] or (pool is None and count == 0):
            why = reason or ("CUDA_VISIBLE_DEVICES is empty" if visible is not None
                             else "no GPU found")
            self._say(f"gputrain: --gpu-per-worker: no GPU to pin workers to ({why}); "
                      "workers are not pinned")
            return
        lines = []
        for position, spec in enumerate(specs):
            try:
                devices = assign_devices(position, len(specs), self.per_worker, visible, count,
                                         self.share)
            except PinningError as exc:
                raise pytest.UsageError(f"gputrain: {exc}") from None
            value = ",".join(devices)
            spec.env[VARIABLE] = value
            spec_id = getattr(spec, "id", None) or f"gw{position}"
            self.assigned[spec_id] = value
            lines.append(f"{spec_id}={value}")
        pool_size = len(pool) if pool is not None else (count or 0)
        mode = ", shared" if len(specs) * self.per_worker > pool_size else ""
        self._say(f"gputrain: pinning {len(specs)} xdist workers to GPUs (CUDA_VISIBLE_DEVICES"
                  f"{mode}): {' '.join(lines)}")

    def configure_node(self, node: Any) -> None:
        """``pytest_configure_node``: the worker's assignment in its ``workerinput``."""
        spec = getattr(getattr(node, "gateway", None), "spec", None)
        value = getattr(spec, "env", {}).get(VARIABLE) if spec is not None else None
        if value is None:
            value = self.assigned.get(str(node.workerinput.get("workerid")))
        if value is not None or self.decided:
            node.workerinput[WORKERINPUT_KEY] = value  # None: not pinned, and already said why

    def node_down(self, node: Any) -> None:
        """``pytest_testnodedown``: keep what the worker said, one line per note."""
        workerid = getattr(node, "workerinput", {}).get("workerid", "a worker")
        for note in sent_by_worker(node, NOTES_KEY, []):
            self.worker_notes.append(f"gputrain: {workerid}: {note}")

    def _say(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(line)


def pin_worker(config: pytest.Config, per_worker: int | None, share: bool,
               count_gpus: CountGpus, tell: Callable[[str], None]) -> str | None:
    """Worker side (in ``pytest_configure``): set ``CUDA_VISIBLE_DEVICES``; return the value.
    ``tell`` takes a line for the controller (it could not be pinned, or too late)."""
    workerinput: dict[str, Any] = getattr(config, "workerinput", {})
    value = workerinput.get(WORKERINPUT_KEY)
    if value is None:
        if per_worker is None or WORKERINPUT_KEY in workerinput:
            return None  # nothing asked, or the controller decided not to pin (and said why)
        index = worker_number(workerinput.get("workerid") or os.environ.get("PYTEST_XDIST_WORKER"))
        total = workerinput.get("workercount") or os.environ.get("PYTEST_XDIST_WORKER_COUNT")
        if index is None or total is None:
            return None
        count, _ = count_gpus()
        try:
            value = ",".join(assign_devices(index, int(total), per_worker,
                                            os.environ.get(VARIABLE), count, share))
        except PinningError as exc:
            tell(f"not pinned to a GPU: {exc}")
            return None
    if os.environ.get(VARIABLE) != value:
        torch = sys.modules.get("torch")
        try:
            late = torch is not None and bool(torch.cuda.is_initialized())
        except Exception:
            late = False
        if late:
            tell(f"CUDA was initialised before the worker could be pinned to "
                 f"CUDA_VISIBLE_DEVICES={value} (a conftest or plugin touched CUDA at import); "
                 "it may use the wrong GPU")
        os.environ[VARIABLE] = value
    return str(value)

