"""DataLoader timing: time blocked in the iterator's ``__next__`` and the loader's settings.

The wrapper replaces ``_BaseDataLoaderIter.__next__`` (every single- and multi-process
iterator inherits it) for the duration of one test. Per batch it costs two clock reads and a
dictionary lookup; the first two batches of each iterator are also inspected (device, pinned).
Iterators are tracked through weak references, so a finished epoch's workers shut down as usual.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_gputrain.probe.wrapping import probe_wrapper


class BatchListener(Protocol):
    """What a wrapped ``__next__`` tells (the probe's ``on_batch``; declared here, beside its
    one caller, so that the loader stays below the probe's callbacks and record)."""

    def on_batch(self, iterator: Any, batch: Any, wait: float) -> None: ...

_perf = time.perf_counter
INSPECTED_BATCHES = 2
MASKED_BATCHES = 8  # batches whose attention_mask is read (a count on the host: microseconds)
SMALL_TENSOR_BYTES = 64 * 1024  # host-to-device copies below this are "small" (GT129)
TOKEN_DTYPES = ("torch.int64", "torch.int32")  # token ids (embedding lookups take these)


@dataclass
class LoaderState:
    """Running totals of one DataLoader (iterators that share dataset and settings)."""

    dataset: str
    num_workers: int | None
    pin_memory: bool | None
    persistent_workers: bool | None
    prefetch_factor: int | None
    batch_size: int | None
    drop_last: bool | None = None
    samples: int | None = None  # samples the sampler yields per epoch (len of sampler/dataset)
    iterators: int = 0
    epochs: int = 0  # passes over the data: iterators, and each reset of a persistent one
    batches: int = 0
    wait: float = 0.0
    wait_max: float = 0.0
    first_batch_wait: float = 0.0
    later_first_batch_wait: float = 0.0
    batch_pinned: bool | None = None
    batch_device: str | None = None
    batch_small_tensors: int | None = None  # host tensors under 64 KiB in one batch
    batch_tokens: int | None = None  # token ids in one batch (token_count)
    # The inspected batches' attention_mask (host tensors only: reading one on a GPU would
    # synchronise): (padded positions, positions, sequence length) of each.
    padding: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass
class IteratorState:
    loader: LoaderState
    seen: int = 0


@dataclass
class LoaderTracker:
    """Loaders and iterators seen during one test."""

    loaders: dict[tuple[Any, ...], LoaderState] = field(default_factory=dict)
    iterators: weakref.WeakKeyDictionary[Any, IteratorState] = field(
        default_factory=weakref.WeakKeyDictionary)
    cuda_initialized: Callable[[], bool] = lambda: False
    # The iterator of the last batch (weakly) and its state: the next batch is nearly always
    # from the same iterator, and this spares the weak dictionary's lookup per batch.
    _last: tuple[Callable[[], Any], IteratorState] | None = None

    def state_for(self, iterator: Any) -> IteratorState:
        last = self._last
        if last is not None and last[0]() is iterator:
            return last[1]
        state = self.iterators.get(iterator)
        if state is None:
            settings = read_settings(iterator)
            key = (id(getattr(iterator, "_dataset", None)), *settings.values())
            loader = self.loaders.get(key)
            if loader is None:
                loader = LoaderState(**settings)
                self.loaders[key] = loader
            loader.iterators += 1
            state = IteratorState(loader)
            # An iterator that cannot be weakly referenced is counted, not tracked.
            with contextlib.suppress(TypeError):
                self.iterators[iterator] = state
        with contextlib.suppress(TypeError):
            self._last = (weakref.ref(iterator), state)
        return state

    def on_batch(self, iterator: Any, batch: Any, wait: float) -> bool:
        """Record one batch; True when it is the first batch of a later epoch (worker start)."""
        state = self.state_for(iterator)
        loader = state.loader
        loader.batches += 1
        loader.wait += wait
        if wait > loader.wait_max:
            loader.wait_max = wait
        epoch_start = False
        # persistent_workers=True: DataLoader.__iter__ hands out the same iterator each epoch,
        # reset (``_reset``), and its ``_num_yielded`` starts again from 0. Its first batch
        # waits for the workers to start the new epoch as a new iterator's does.
        yielded = getattr(iterator, "_num_yielded", None)
        first = yielded == 1 if isinstance(yielded, int) else state.seen == 0
        if first:
            loader.epochs += 1
            loader.first_batch_wait += wait
            if loader.epochs > 1:
                loader.later_first_batch_wait += wait
                epoch_start = True
        if state.seen < INSPECTED_BATCHES:
            self._inspect(loader, batch)
        if state.seen < MASKED_BATCHES:
            _read_padding(loader, batch)
        state.seen += 1
        return epoch_start

    def _inspect(self, loader: LoaderState, batch: Any) -> None:
        tensor = first_tensor(batch)
        if tensor is None:
            return
        loader.batch_device = str(tensor.device)
        if tensor.device.type != "cpu":
            loader.batch_pinned = None
        elif self.cuda_initialized():
            # is_pinned() asks CUDA; only once it is initialised (never create a context here).
            loader.batch_pinned = bool(tensor.is_pinned())
        else:
            loader.batch_pinned = False
        if loader.batch_size is None and tensor.dim() > 0:
            loader.batch_size = int(tensor.shape[0])
        if loader.batch_tokens is None:
            loader.batch_tokens = token_count(tensor)
        small = small_host_tensors(batch)
        loader.batch_small_tensors = max(small, loader.batch_small_tensors or 0)


def _read_padding(loader: LoaderState, batch: Any) -> None:
    """The padded positions of a token batch: the zeros of its attention_mask (a host tensor
    only; reading one on a GPU would synchronise)."""
    mask: Any = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    if hasattr(mask, "dim") and mask.dim() == 2 and mask.device.type == "cpu":
        positions = int(mask.numel())
        loader.padding.append((positions - int(mask.count_nonzero()), positions,
                               int(mask.shape[1])))


def read_settings(iterator: Any) -> dict[str, Any]:
    """The loader settings an iterator carries (private attributes, read defensively)."""
    sampler = getattr(iterator, "_index_sampler", None)
    batch_size = getattr(sampler, "batch_size", None)
    prefetch = getattr(iterator, "_prefetch_factor", None)
    workers = getattr(iterator, "_num_workers", None)
    pin = getattr(iterator, "_pin_memory", None)
    persistent = getattr(iterator, "_persistent_workers", None)
    drop_last = getattr(iterator, "_drop_last", None)
    return {
        "dataset": type(getattr(iterator, "_dataset", None)).__name__,
        "num_workers": workers if isinstance(workers, int) else None,
        "pin_memory": pin if isinstance(pin, bool) else None,
        "persistent_workers": persistent if isinstance(persistent, bool) else None,
        "prefetch_factor": prefetch if isinstance(prefetch, int) else None,
        "batch_size": batch_size if isinstance(batch_size, int) else None,
        "drop_last": drop_last if isinstance(drop_last, bool) else None,
        "samples": samples_per_epoch(iterator),
    }


def samples_per_epoch(iterator: Any) -> int | None:
    """Samples an iterator's sampler yields per epoch (the batch sampler's sampler, else the
    dataset): the size of the last batch follows from it. None for an iterable dataset or a
    sampler without a length. Read once per iterator."""
    sampler = getattr(getattr(iterator, "_index_sampler", None), "sampler", None)
    for source in (sampler, getattr(iterator, "_dataset", None)):
        if source is None:
            continue
        try:
            return len(source)
        except Exception:  # no __len__ (IterableDataset), or a length the user's code refuses
            continue
    return None


def first_tensor(value: Any, depth: int = 0) -> Any:
    """The first tensor in a batch (tensor, tuple/list, dict or an object with tensors)."""
    if hasattr(value, "is_pinned") and hasattr(value, "device"):
        return value
    if depth >= 3:
        return None
    if isinstance(value, dict) or (hasattr(value, "values") and hasattr(value, "keys")):
        try:
            items = list(value.values())
        except Exception:
            return None
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        return None
    for item in items[:16]:
        found = first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def token_count(tensor: Any) -> int | None:
    """Tokens in a batch of token ids: a 2-D integer tensor (batch x sequence), as a language
    model is fed; None for anything else (images, features). A step's work grows with its
    tokens, not its leading dimension: 32 sequences of 256 tokens is not a small batch."""
    try:
        if tensor.dim() != 2 or str(tensor.dtype) not in TOKEN_DTYPES:
            return None
        return int(tensor.shape[0]) * int(tensor.shape[1])
    except Exception:  # exotic tensor subclasses: no count
        return None


def small_host_tensors(value: Any, depth: int = 0) -> int:
    """Tensors on the CPU under 64 KiB in a batch (labels, lengths, masks of a small batch):
    each is one small host-to-device copy when the step moves the batch to the GPU."""
    if hasattr(value, "is_pinned") and hasattr(value, "device"):
        try:
            small = value.device.type == "cpu" and \
                value.numel() * value.element_size() < SMALL_TENSOR_BYTES
        except Exception:
            return 0
        return int(small)
    if depth >= 3:
        return 0
    if isinstance(value, dict) or (hasattr(value, "values") and hasattr(value, "keys")):
        try:
            items = list(value.values())
        except Exception:
            return 0
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        return 0
    return sum(small_host_tensors(item, depth + 1) for item in items[:16])


def wrap_next(original: Callable[[Any], Any], probe: BatchListener) -> Callable[[Any], Any]:
    def __next__(self: Any) -> Any:
        started = _perf()
        batch = original(self)  # StopIteration and loader errors pass through untouched
        probe.on_batch(self, batch, _perf() - started)
        return batch

    return probe_wrapper(__next__, original)


def cpu_count() -> int | None:
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        try:
            return len(affinity(0))
        except OSError:
            pass
    return os.cpu_count()


def processes_per_host(environ: dict[str, str] | None = None) -> int:
    """Training processes sharing this host's CPUs: LOCAL_WORLD_SIZE x xdist workers."""
    environ = dict(os.environ) if environ is None else environ

    def number(name: str) -> int:
        try:
            return max(1, int(environ.get(name, "1")))
        except ValueError:
            return 1

    return number("LOCAL_WORLD_SIZE") * number("PYTEST_XDIST_WORKER_COUNT")
