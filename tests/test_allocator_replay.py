"""The caching allocator's replay (ladder/allocator_model.py) on hand-made sequences whose
outcome follows from the allocator's rules, and its recorder (ladder/allocator_history.py) on
a torch whose memory history is made up."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pytest_gputrain.ladder.allocator_history import (
    AllocatorHistory,
    placement_settings,
    requested_bytes,
    why_not_recorded,
)
from pytest_gputrain.ladder.allocator_model import (
    Event,
    InitialSegment,
    Recording,
    agrees,
    least_room,
    recording_from_snapshots,
    replay,
    round_size,
    segment_size,
)

MiB = 2**20


def _run(*steps: tuple[str, int, int]) -> Recording:
    """("alloc", id, bytes) and ("free", id, 0) in order, on one stream."""
    return Recording(initial=(), events=tuple(Event(action, key, size)
                                              for action, key, size in steps))


def test_sizes_round_to_512_bytes_and_segments_by_pool() -> None:
    assert [round_size(n) for n in (1, 512, 513, 3 * MiB + 1)] == [512, 512, 1024,
                                                                   3 * MiB + 512]
    assert segment_size(4096) == 2 * MiB  # small requests share 2 MiB segments
    assert segment_size(MiB + 512) == 20 * MiB  # 1 to 10 MiB share 20 MiB ones
    assert segment_size(10 * MiB) == 10 * MiB  # larger: their own, rounded up to 2 MiB
    assert segment_size(117 * MiB + 1) == 118 * MiB


def test_small_and_medium_requests_pack_into_shared_segments() -> None:
    # 600 requests of 3 kB: 1.8 MB in 2 MiB segments; four of 4 MiB fit one 20 MiB segment.
    small = _run(*[("alloc", k, 3000) for k in range(600)])
    assert least_room(small) == 2 * MiB
    medium = _run(*[("alloc", k, 4 * MiB) for k in range(4)])
    assert least_room(medium) == 20 * MiB
    assert least_room(_run(*[("alloc", k, 4 * MiB) for k in range(6)])) == 40 * MiB


def test_a_large_block_with_a_remainder_of_1_mib_or_less_is_handed_out_whole() -> None:
    # 11 MiB + 1 byte rounds to a 12 MiB segment; 1 MiB - 511 bytes stay: not split off.
    whole = replay(_run(("alloc", 1, 11 * MiB + 1)), None)
    assert whole.peak_allocated == 12 * MiB
    split = replay(_run(("alloc", 1, 10 * MiB + 1)), None)  # 2 MiB - 511 bytes: split off
    assert split.peak_allocated == 10 * MiB + 512


def test_freed_neighbours_merge_and_serve_a_larger_request() -> None:
    # Two 8 MiB blocks in one 20 MiB segment, both freed: they merge, and 16 MiB fits there.
    run = _run(("alloc", 1, 8 * MiB), ("alloc", 2, 8 * MiB), ("free", 1, 0), ("free", 2, 0),
               ("alloc", 3, 16 * MiB))
    result = replay(run, None)
    assert result.peak_reserved == 20 * MiB and len(result.segments_made) == 1


def test_free_segments_are_given_back_when_a_new_one_would_pass_the_limit() -> None:
    # 300 MiB freed, then 400 MiB: under a 400 MiB limit the free segment goes back first.
    run = _run(("alloc", 1, 300 * MiB), ("free", 1, 0), ("alloc", 2, 400 * MiB))
    assert replay(run, None).peak_reserved == 700 * MiB
    assert replay(run, 400 * MiB).fits and not replay(run, 398 * MiB).fits
    assert least_room(run) == 400 * MiB


def test_a_workspace_made_in_a_freed_block_pins_its_segment() -> None:
    """The GPT-style model on the H200 (8 x 512, vocab 16k, 128 tokens, batch 32 first): the
    fp32 logits' gradient (256 MiB) is freed before the head's first backward matmul, whose
    cuBLAS workspace (32 MiB, kept for the process) takes the smallest free block that fits:
    that one. The rest of its segment can serve only smaller blocks, so the next logits need a
    segment of their own: the 290 MiB the probes left (256 + 32 + 2) came from two workspaces
    and a small segment, and the room a step needs is the pinned segment's and more."""
    logits = 32 * 128 * 16_384 * 4
    run = _run(("alloc", 1, logits), ("alloc", 2, logits // 2), ("free", 1, 0),
               ("alloc", 3, 32 * MiB),  # the workspace, in the freed logits' segment
               ("free", 2, 0), ("alloc", 4, logits), ("free", 4, 0))
    assert logits == 256 * MiB
    live_peak = replay(run, None).peak_allocated
    assert live_peak == (256 + 128) * MiB  # the first logits and their half-size copy
    assert least_room(run) == 512 * MiB  # the pinned 256 MiB segment and a new one
    # Were the workspace made first, in a segment of its own, the logits would reuse theirs.
    early = _run(("alloc", 3, 32 * MiB), ("alloc", 1, logits), ("alloc", 2, logits // 2),
                 ("free", 1, 0), ("free", 2, 0), ("alloc", 4, logits), ("free", 4, 0))
    assert least_room(early) == (32 + 256 + 128) * MiB


def test_the_least_room_is_the_least_limit_that_fits() -> None:
    run = _run(("alloc", 1, 30 * MiB), ("alloc", 2, 5 * MiB), ("free", 1, 0),
               ("alloc", 3, 40 * MiB), ("alloc", 4, 3000), ("free", 2, 0), ("alloc", 5, 26 * MiB))
    room = least_room(run)
    assert room is not None and room % (2 * MiB) == 0
    assert replay(run, room).fits and not replay(run, room - 2 * MiB).fits


def test_segments_held_before_the_recording_keep_their_live_blocks_and_lend_their_holes() -> None:
    # A 20 MiB segment with 6 MiB live at its start: 12 MiB fits in the rest, 16 MiB does not.
    held = InitialSegment(address=1 << 40, size=20 * MiB, stream=0, small=False,
                          live=(((1 << 40), 6 * MiB),))
    fits = Recording(initial=(held,), events=(Event("alloc", 7, 12 * MiB),))
    assert replay(fits, 20 * MiB).fits
    assert not replay(Recording((held,), (Event("alloc", 7, 16 * MiB),)), 20 * MiB).fits
    # A free of a block held before the recording frees it.
    freed = Recording((held,), (Event("free", 1 << 40, 0), Event("alloc", 7, 16 * MiB)))
    assert replay(freed, 20 * MiB).fits


def test_a_replay_agrees_with_the_allocator_only_where_it_made_the_same_segments() -> None:
    run = _run(("alloc", 1, 64 * MiB), ("alloc", 2, 3 * MiB), ("free", 1, 0),
               ("alloc", 3, 32 * MiB))
    made = tuple((size, 0x7000_0000 + index * 2**30)
                 for index, size in enumerate((64 * MiB, 20 * MiB)))
    assert agrees(Recording((), run.events, made), None) == (2, 2, 2)
    other = ((64 * MiB, 0x7000_0000), (32 * MiB, 0x8000_0000))  # not what the policy does
    assert agrees(Recording((), run.events, other), None) == (1, 2, 2)
    # A replay that makes one more segment than the allocator did does not agree either.
    assert agrees(Recording((), run.events, made[:1]), None) == (1, 1, 2)


def _snapshot_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    base = 0x7F00_0000_0000
    before = {"segments": [
        {"device": 0, "address": base, "total_size": 2 * MiB, "stream": 0,
         "segment_type": "small", "blocks": [
             {"size": 512, "state": "active_allocated"},
             {"size": 2 * MiB - 1024, "state": "inactive"},
             {"size": 512, "state": "active_allocated"}]},
        {"device": 1, "address": base * 2, "total_size": 20 * MiB, "stream": 0,
         "segment_type": "large", "blocks": [{"size": 20 * MiB, "state": "active_allocated"}]}],
        "device_traces": []}
    after = {"segments": [], "device_traces": [[
        {"action": "segment_alloc", "addr": base + 4 * MiB, "size": 40 * MiB, "stream": 0},
        {"action": "alloc", "addr": base + 4 * MiB, "size": 40 * MiB - 100, "stream": 0},
        {"action": "free_requested", "addr": base + 4 * MiB, "size": 40 * MiB - 100,
         "stream": 0},
        {"action": "free_completed", "addr": base + 4 * MiB, "size": 40 * MiB - 100,
         "stream": 0},
        {"action": "free_completed", "addr": base + 2 * MiB - 512, "size": 512, "stream": 0},
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0}]]}
    return before, after


def test_a_recording_is_read_from_two_snapshots_of_torch() -> None:
    before, after = _snapshot_pair()
    recording = recording_from_snapshots(before, after, device=0)
    base = 0x7F00_0000_0000
    assert recording.initial == (InitialSegment(base, 2 * MiB, 0, True,
                                                ((base, 512), (base + 2 * MiB - 512, 512))),)
    assert recording.events == (Event("alloc", base + 4 * MiB, 40 * MiB - 100),
                                Event("free", base + 4 * MiB, 40 * MiB - 100),
                                Event("free", base + 2 * MiB - 512, 512))
    assert recording.segments_made == ((40 * MiB, base + 4 * MiB),)
    assert agrees(recording, None) == (1, 1, 1) and least_room(recording) == 42 * MiB
    assert recording_from_snapshots(before, {"device_traces": []}, 3).events == ()


class _Memory:
    """``torch.cuda.memory`` with a made-up history: ``before`` and ``after`` snapshots."""

    def __init__(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        self.snapshots = [before, after]
        self.recording: list[Any] = []

    def _snapshot(self) -> dict[str, Any]:
        return self.snapshots.pop(0)

    def _record_memory_history(self, enabled: str | None = "all", **settings: Any) -> None:
        self.recording.append((enabled, settings.get("context")))


def _torch(memory: Any = None, backend: str = "native", recording: bool = False,
           held: int = 0) -> Any:
    cuda = SimpleNamespace(get_allocator_backend=lambda: backend,
                           memory_stats=lambda index=0: {"reserved_bytes.all.current": held},
                           current_device=lambda: 0)
    if memory is not None:
        cuda.memory = memory
    return SimpleNamespace(cuda=cuda, OutOfMemoryError=MemoryError,
                           _C=SimpleNamespace(_cuda_isHistoryEnabled=lambda: recording))


def test_the_history_is_recorded_only_where_the_replay_models_the_allocator() -> None:
    memory = _Memory({}, {})
    assert why_not_recorded(_torch(memory)) == ""
    assert why_not_recorded(_torch()) == "this torch cannot record the allocator's history"
    assert "cudaMallocAsync" in why_not_recorded(_torch(memory, backend="cudaMallocAsync"))
    assert why_not_recorded(_torch(memory, recording=True)) == (
        "the project records the allocator's history itself: left as it is")
    # The settings in force, as the allocator reports them (the defaults: none of them).
    defaults = {"expandable_segments": False, "max_split_size": -1,
                "garbage_collection_threshold": 0.0,
                "roundup_power2_divisions": {"1": 0, "2": 0}}
    assert placement_settings({"allocator_settings": defaults}, {}) == []
    changed = {**defaults, "expandable_segments": True, "max_split_size": 128 * MiB,
               "roundup_power2_divisions": {"1": 4, "2": 0}}
    assert placement_settings({"allocator_settings": changed}, {}) == [
        "the allocator runs with expandable_segments",
        "the allocator runs with max_split_size 134,217,728 bytes",
        "the allocator runs with roundup_power2_divisions"]
    # A torch whose snapshot does not say: the environment.
    environ = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128"}
    assert placement_settings({}, environ) == [
        "PYTORCH_CUDA_ALLOC_CONF sets expandable_segments:True",
        "PYTORCH_CUDA_ALLOC_CONF sets max_split_size_mb:128"]
    assert placement_settings({}, {"PYTORCH_ALLOC_CONF": "expandable_segments:False,"
                                                         "release_lock_on_cudamalloc:True"}) == []
    history = AllocatorHistory(_torch(_Memory({"allocator_settings": changed}, {})),
                               SimpleNamespace(index=0), None, 8 * 2**30, environ={})
    with history:
        pass
    assert history.room is None and history.why_not.endswith(
        "roundup_power2_divisions, which the replay does not model")
    assert history._torch.cuda.memory.recording == []  # never switched on


def test_a_recorded_run_is_replayed_and_checked_against_the_allocator() -> None:
    memory = _Memory(*_snapshot_pair())
    history = AllocatorHistory(_torch(memory), SimpleNamespace(index=0), limit=None,
                               budget=8 * 2**30, environ={})
    with history:
        pass
    assert memory.recording == [("all", None), (None, None)]  # no stack traces; then off
    assert history.why_not == "" and history.room == 42 * MiB

    before, after = _snapshot_pair()
    after["device_traces"][0][0]["size"] = 60 * MiB  # the allocator made another segment
    history = AllocatorHistory(_torch(_Memory(before, after)), SimpleNamespace(index=0), None,
                               8 * 2**30, environ={})
    with history:
        pass
    assert history.room is None and history.why_not == (
        "the replay differed from the allocator at segment 1 (the allocator made 1, the replay "
        "1): not trusted")


def test_a_run_that_ran_out_of_memory_says_how_much_it_lacked() -> None:
    assert requested_bytes(MemoryError("CUDA out of memory. Tried to allocate 118.00 MiB. "
                                       "GPU 0 has ...")) == 118 * MiB
    assert requested_bytes(MemoryError("out of memory")) is None
    before, after = _snapshot_pair()
    after["device_traces"][0].append({"action": "oom", "size": 117 * MiB + 5, "stream": 0,
                                      "device_free": 10 * 2**30})
    budget = 8 * 2**30
    history = AllocatorHistory(_torch(_Memory(before, after), held=budget - 100 * MiB),
                               SimpleNamespace(index=0), budget, budget, environ={})
    with pytest.raises(MemoryError), history:
        raise MemoryError("CUDA out of memory. Tried to allocate 118.00 MiB.")
    # It held 100 MiB less than the budget and asked for a 118 MiB segment.
    assert history.short_by == 18 * MiB
    assert history.room is None and history.why_not == "the run ran out of memory"
    # Without a history, the error's own figure stands for the segment.
    plain = AllocatorHistory(_torch(held=budget - 100 * MiB), SimpleNamespace(index=0), budget,
                             budget, environ={})
    with pytest.raises(MemoryError), plain:
        raise MemoryError("CUDA out of memory. Tried to allocate 120.00 MiB.")
    assert plain.short_by == 20 * MiB
