"""PyTorch's CUDA caching allocator, replayed: how much memory a recorded sequence of
allocations needs under a limit, with the fragmentation the allocator's placement leaves.

What a per-process limit (``torch.cuda.set_per_process_memory_fraction``, or the GPU's own
size) bounds is not the live bytes but the segments the allocator got from ``cudaMalloc``. A
live block pins its whole segment: ``empty_cache()``, and the allocator itself when an
allocation would pass the limit, give back only segments with no live block left. So a step
that fits by its live bytes can still run out of memory, by the free pieces of the segments
its live blocks pin: a workspace the libraries keep for the process, placed in a large block a
step had freed, or optimizer state made at the first step among that step's activations.

This module replays the allocator's policy over the events recorded by
``torch.cuda.memory._record_memory_history`` (``c10/cuda/CUDACachingAllocator.cpp``, default
settings):

- sizes are rounded up to 512 bytes; requests of up to 1 MiB come from the small pool, the rest
  from the large pool, one pool per stream;
- a request takes the smallest free block of its pool that fits (the lowest address among
  equals) and splits off the rest when that is at least 512 bytes (small pool) or more than
  1 MiB (large pool);
- no free block fits: a new segment, 2 MiB for a small request, 20 MiB for one under 10 MiB,
  else the request rounded up to 2 MiB, at an address below the segment made before it;
- a new segment that would pass the limit: every free segment (no block of it in use) is
  given back, then the segment is tried once more; failing that, out of memory;
- a freed block merges with its free neighbours in its segment.

Settings that change this (``expandable_segments``, ``max_split_size_mb``,
``roundup_power2_divisions``, ``garbage_collection_threshold``) are not modelled: the caller
replays only under the defaults, and checks each replay against the allocator's own decisions
(the segments it made, in order) before trusting it.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MiB = 2**20
MIN_BLOCK = 512  # every size is rounded up to a multiple of this
SMALL_SIZE = MiB  # the largest request the small pool serves
SMALL_SEGMENT = 2 * MiB  # the small pool's segments
LARGE_SEGMENT = 20 * MiB  # what a large-pool request under MIN_LARGE_ALLOC gets
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB  # larger requests get a segment of their own, rounded up to this
# New segments in a replay get addresses above every recorded one, each below the one before:
# the allocator orders free blocks of one size by address, so their order decides which of two
# equal blocks a request takes, and ``cudaMalloc`` hands out large segments downwards (on the
# H200, torch 2.11: replayed with descending addresses the model made the allocator's segments,
# size for size in order, in 33 of 36 recorded runs; with ascending ones in 24).
FIRST_REPLAYED_ADDRESS = 1 << 56


def round_size(size: int) -> int:
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    """The segment ``cudaMalloc`` is asked for when no free block fits a rounded ``size``."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(frozen=True)
class Event:
    """One allocation (``alloc``) or its release (``free``), as the allocator recorded it."""

    action: str  # "alloc" or "free"
    address: int  # the recorded block's address: ties a free to its allocation
    size: int  # bytes requested
    stream: int = 0


@dataclass(frozen=True)
class InitialSegment:
    """A segment the allocator held when the recording began, and its live blocks."""

    address: int
    size: int
    stream: int
    small: bool
    live: tuple[tuple[int, int], ...]  # (address, size) of each block in use


@dataclass(frozen=True)
class Recording:
    """What a run did to the allocator: the segments it began with, its allocations and frees
    in order, and the segments the allocator made for it (size and address, in order)."""

    initial: tuple[InitialSegment, ...]
    events: tuple[Event, ...]
    segments_made: tuple[tuple[int, int], ...] = ()
    out_of_memory: int | None = None  # the request (bytes) that ran out of memory, if one did


class OutOfMemory(Exception):
    """The replayed allocator could not serve a request under its limit."""


class _Block:
    __slots__ = ("address", "allocated", "next", "prev", "size", "small", "stream")

    def __init__(self, address: int, size: int, stream: int, small: bool) -> None:
        self.address, self.size, self.stream, self.small = address, size, stream, small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


@dataclass
class Replay:
    """One replay's outcome: whether every request was served, the peaks of the bytes in use
    and of the bytes held in segments, and the segments it made (size, address) in order."""

    fits: bool
    peak_allocated: int
    peak_reserved: int
    segments_made: list[tuple[int, int]] = field(default_factory=list)


class CachingAllocatorModel:
    """The allocator's placement under ``limit`` bytes of segments (None: no limit)."""

    def __init__(self, initial: Iterable[InitialSegment], limit: int | None,
                 addresses: Iterable[int] = ()) -> None:
        self.limit = limit
        self.free: dict[tuple[bool, int], list[tuple[int, int]]] = {}  # sorted (size, address)
        self.blocks: dict[int, _Block] = {}  # free blocks by address
        self.live: dict[int, _Block] = {}  # blocks in use, by their recorded address
        self.reserved = self.allocated = 0
        self.peak_reserved = self.peak_allocated = 0
        self.segments_made: list[tuple[int, int]] = []
        # Where new segments go: the recorded ones first (a replay of the run as it ran places
        # them where the allocator did), then above everything recorded, downwards.
        self._addresses = iter(addresses)
        self._next_address = FIRST_REPLAYED_ADDRESS
        for segment in initial:
            self._adopt(segment)
        self.peak_reserved, self.peak_allocated = self.reserved, self.allocated

    # -- what a run does -------------------------------------------------------------------------

    def malloc(self, address: int, requested: int, stream: int) -> None:
        size = round_size(requested)
        small = size <= SMALL_SIZE
        block = self._take_free(small, stream, size) or self._new_segment(small, stream, size)
        remaining = block.size - size
        # What is left is split off: any of it in the small pool, over 1 MiB in the large one.
        if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_SIZE):
            rest = _Block(block.address + size, remaining, stream, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._insert_free(rest)
        block.allocated = True
        self.live[address] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def release(self, address: int) -> None:
        block = self.live.pop(address)
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove_free(neighbour)
                if neighbour is block.prev:
                    block.address, block.prev = neighbour.address, neighbour.prev
                    if block.prev is not None:
                        block.prev.next = block
                else:
                    block.next = neighbour.next
                    if block.next is not None:
                        block.next.prev = block
                block.size += neighbour.size
        self._insert_free(block)

    # -- the pools -------------------------------------------------------------------------------

    def _take_free(self, small: bool, stream: int, size: int) -> _Block | None:
        pool = self.free.get((small, stream), [])
        index = bisect.bisect_left(pool, (size, -1))
        if index == len(pool):
            return None
        _, address = pool.pop(index)
        return self.blocks.pop(address)

    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self.free.setdefault((block.small, block.stream), []),
                      (block.size, block.address))
        self.blocks[block.address] = block

    def _remove_free(self, block: _Block) -> None:
        pool = self.free[(block.small, block.stream)]
        del pool[bisect.bisect_left(pool, (block.size, block.address))]
        del self.blocks[block.address]

    def _new_segment(self, small: bool, stream: int, size: int) -> _Block:
        wanted = segment_size(size)
        if self.limit is not None and self.reserved + wanted > self.limit:
            self._give_back_free_segments()
            if self.reserved + wanted > self.limit:
                raise OutOfMemory(size)
        address = next(self._addresses, None)
        if address is None:
            self._next_address -= wanted
            address = self._next_address
        self.reserved += wanted
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.segments_made.append((wanted, address))
        return _Block(address, wanted, stream, small)

    def _give_back_free_segments(self) -> None:
        whole = [block for block in self.blocks.values()
                 if block.prev is None and block.next is None]
        for block in whole:
            self._remove_free(block)
            self.reserved -= block.size

    def _adopt(self, segment: InitialSegment) -> None:
        """A segment held before the recording: its live blocks as recorded, the rest free."""
        pieces: list[tuple[int, int, bool]] = []
        offset = segment.address
        for address, size in sorted(segment.live):
            if address > offset:
                pieces.append((offset, address - offset, False))
            pieces.append((address, size, True))
            offset = address + size
        end = segment.address + segment.size
        if end > offset:
            pieces.append((offset, end - offset, False))
        previous: _Block | None = None
        for address, size, in_use in pieces:
            block = _Block(address, size, segment.stream, segment.small)
            block.prev = previous
            if previous is not None:
                previous.next = block
            previous = block
            if in_use:
                block.allocated = True
                self.live[address] = block
                self.allocated += size
            else:
                self._insert_free(block)
        self.reserved += segment.size


def replay(recording: Recording, limit: int | None, *, as_recorded: bool = False) -> Replay:
    """Replay ``recording`` under ``limit``. ``as_recorded``: place new segments at the
    addresses the allocator gave them, as far as they agree (to check a replay against the
    run it replays)."""
    addresses = [address for _, address in recording.segments_made] if as_recorded else []
    model = CachingAllocatorModel(recording.initial, limit, addresses)
    try:
        for event in recording.events:
            if event.action == "alloc":
                model.malloc(event.address, event.size, event.stream)
            elif event.address in model.live:
                model.release(event.address)
    except OutOfMemory:
        return Replay(False, model.peak_allocated, model.peak_reserved, model.segments_made)
    return Replay(True, model.peak_allocated, model.peak_reserved, model.segments_made)


def agrees(recording: Recording, limit: int | None) -> tuple[int, int, int]:
    """How far the replay under the run's own ``limit`` made the segments the allocator made:
    the number alike (same size, same place) from the first on, the number the allocator made,
    the number the replay made. All three equal: the replay followed the allocator's every
    decision."""
    made = replay(recording, limit, as_recorded=True).segments_made
    pairs = zip(made, recording.segments_made, strict=False)  # up to the shorter
    alike = sum(1 for _ in itertools.takewhile(lambda pair: pair[0] == pair[1], pairs))
    return alike, len(recording.segments_made), len(made)


def least_room(recording: Recording) -> int | None:
    """The least limit (bytes, to the allocator's 2 MiB granularity) under which the recorded
    run's allocations are all served; None when the recording ran out of memory itself (it
    does not hold the run's whole sequence)."""
    if recording.out_of_memory is not None:
        return None
    unlimited = replay(recording, None)
    low = -(-unlimited.peak_allocated // ROUND_LARGE)  # in units of ROUND_LARGE
    high = -(-unlimited.peak_reserved // ROUND_LARGE)
    while low < high:  # the least multiple of ROUND_LARGE that fits
        middle = (low + high) // 2
        if replay(recording, middle * ROUND_LARGE).fits:
            high = middle
        else:
            low = middle + 1
    return high * ROUND_LARGE


# -- reading what torch.cuda.memory._snapshot() returns ------------------------------------------


def recording_from_snapshots(before: Mapping[str, Any], after: Mapping[str, Any],
                             device: int) -> Recording:
    """The recording between two ``torch.cuda.memory._snapshot()`` dictionaries: the segments
    of ``device`` in ``before`` (taken as the history began) and the trace in ``after``."""
    traces: Sequence[Sequence[Mapping[str, Any]]] = after.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    events, made, out_of_memory = [], [], None
    for entry in trace:
        action = entry.get("action")
        if action == "alloc":
            events.append(Event("alloc", int(entry["addr"]), int(entry["size"]),
                                int(entry.get("stream", 0))))
        elif action == "free_completed":
            events.append(Event("free", int(entry["addr"]), int(entry["size"]),
                                int(entry.get("stream", 0))))
        elif action == "segment_alloc":
            made.append((int(entry["size"]), int(entry["addr"])))
        elif action == "oom":
            out_of_memory = int(entry["size"])
    return Recording(initial=tuple(initial_segments(before, device)), events=tuple(events),
                     segments_made=tuple(made), out_of_memory=out_of_memory)


def initial_segments(snapshot: Mapping[str, Any], device: int) -> list[InitialSegment]:
    segments = []
    for segment in snapshot.get("segments", []):
        if int(segment.get("device", device)) != device:
            continue
        offset, live = int(segment["address"]), []
        for block in segment.get("blocks", []):
            if block.get("state") != "inactive":  # in use, or waiting for a stream to finish
                live.append((offset, int(block["size"])))
            offset += int(block["size"])
        segments.append(InitialSegment(
            address=int(segment["address"]), size=int(segment["total_size"]),
            stream=int(segment.get("stream", 0)),
            small=segment.get("segment_type") == "small", live=tuple(live)))
    return segments
