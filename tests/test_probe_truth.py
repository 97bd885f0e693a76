"""Facts as the test ran: settings read while it trains, the moment of an out-of-memory error,
other processes seen during the test, and memory figures that are the test's own.

CPU-only units: the PyTorch OOM message forms of torch 1.x to 2.13 and the cudaMallocAsync
backend, the settings timeline, the budget built from in-training readings, the failure facts
built from the allocator observer's moment, and a real probe on a CPU training loop that
changes its settings and restores them in ``finally:``. The CUDA behaviour is proven by
tests/gpu/test_probe_truth_gpu.py.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from pytest_gputrain.facts import DeviceSample
from pytest_gputrain.probe import failures, oom_observer, run, settings_timeline
from pytest_gputrain.probe.cuda_readings import CallReadings
from pytest_gputrain.probe.loader import LoaderTracker
from pytest_gputrain.probe.oom_message import parse_oom
from pytest_gputrain.probe.run_facts_builder import THROTTLE_BITS, ProcessReadings, build_run_facts
from pytest_gputrain.probe.run_record import (
    LoaderWaits,
    OomMoment,
    RunRecord,
    StepFlag,
    StepSeries,
)
from pytest_gputrain.probe.timeline_facts_builder import timeline_facts

GiB = 2**30
MiB = 2**20

# -- PyTorch's out-of-memory messages -----------------------------------------------------------

TORCH_2_13_FRACTION = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB "
    "of which 134.70 GiB is free. Including non-PyTorch memory, this process has 4.60 GiB "
    "memory in use. 4.19 GiB allowed; Of the allocated memory 3.90 GiB is allocated by "
    "PyTorch, and 12.00 MiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    "to avoid fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
OTHER_PROCESS = (
    "CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 139.81 GiB "
    "of which 3.10 GiB is free. Process 4242 has 132.00 GiB memory in use. Including "
    "non-PyTorch memory, this process has 4.60 GiB memory in use. Of the allocated memory "
    "4.00 GiB is allocated by PyTorch, and 20.00 MiB is reserved by PyTorch but unallocated.")


def test_torch_2_message_under_a_fraction_gives_the_limit() -> None:
    parsed = parse_oom(TORCH_2_13_FRACTION)
    assert parsed["requested"] == 2 * GiB and parsed["device_index"] == 0
    assert parsed["total"] == round(139.81 * GiB) and parsed["free"] == round(134.70 * GiB)
    assert parsed["fraction_limit"] == round(4.19 * GiB)
    assert parsed["process_in_use"] == round(4.60 * GiB)
    assert parsed["other_processes"] == 0 and parsed["other_process_count"] == 0
    assert parsed["reserved"] == round(3.90 * GiB) + 12 * MiB


def test_other_processes_are_read_from_the_message() -> None:
    parsed = parse_oom(OTHER_PROCESS)
    assert parsed["other_processes"] == 132 * GiB and parsed["other_process_count"] == 1
    assert parsed["process_in_use"] == round(4.60 * GiB)


def test_torch_2_1_spelling_and_private_pools() -> None:
    parsed = parse_oom(
        "CUDA out of memory. Tried to allocate 64.00 MiB. GPU 1 has a total capacty of 79.15 GiB "
        "of which 10.00 MiB is free. Of the allocated memory 70.00 GiB is allocated by PyTorch, "
        "with 6.00 GiB allocated in private pools (e.g., CUDA Graphs), and 2.00 GiB is reserved "
        "by PyTorch but unallocated.")
    assert parsed["total"] == round(79.15 * GiB) and parsed["device_index"] == 1
    assert parsed["private_pools"] == 6 * GiB
    assert parsed["reserved"] == 72 * GiB and parsed["reserved_unallocated"] == 2 * GiB
    assert "other_processes" not in parsed  # the message lists no process: unknown, not 0


def test_torch_1_messages_with_allowed_and_cached() -> None:
    allowed = parse_oom(
        "CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 15.78 GiB total capacity; "
        "4.74 GiB already allocated; 10.50 GiB free; 4.77 GiB allowed; 4.74 GiB reserved in "
        "total by PyTorch)")
    assert allowed["fraction_limit"] == round(4.77 * GiB)
    assert allowed["free"] == round(10.50 * GiB) and allowed["reserved_unallocated"] == 0
    cached = parse_oom(
        "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.17 GiB total capacity; "
        "10.64 GiB already allocated; 2.81 MiB free; 310.00 MiB cached)")
    assert cached["reserved_unallocated"] == 310 * MiB
    assert cached["reserved"] == round(10.64 * GiB) + 310 * MiB


def test_cuda_malloc_async_message() -> None:
    limited = parse_oom(
        "Allocation on device 0 would exceed allowed memory. (out of memory)\n"
        "Currently allocated     : 9.43 GiB\nRequested               : 640.00 MiB\n"
        "Device limit            : 79.11 GiB\nFree (according to CUDA): 69.00 GiB\n"
        "PyTorch limit (set by user-supplied memory fraction)\n                        : "
        "10.00 GiB")
    assert limited["allocator_backend"] == "cudaMallocAsync"
    assert limited["allocated"] == round(9.43 * GiB) and limited["requested"] == 640 * MiB
    assert limited["total"] == round(79.11 * GiB) and limited["free"] == 69 * GiB
    assert limited["fraction_limit"] == 10 * GiB and limited["device_index"] == 0
    unlimited = parse_oom(
        "Allocation on device 1 would exceed allowed memory. (out of memory)\n"
        "Currently allocated : 9.43 GiB\nRequested : 640.00 MiB\nDevice limit : 11.59 GiB\n"
        "Free (according to CUDA): 7.12 MiB\nPyTorch limit (set by user-supplied memory "
        "fraction)\n : 17179869184.00 GiB")
    assert "fraction_limit" not in unlimited and unlimited["device_index"] == 1


def test_hip_message_reads_like_cuda() -> None:
    parsed = parse_oom(TORCH_2_13_FRACTION.replace("CUDA out of memory", "HIP out of memory"))
    assert parsed["fraction_limit"] == round(4.19 * GiB)


def test_own_process_listed_under_another_pid_is_told_apart_by_its_memory() -> None:
    # In a container, PyTorch does not recognise its own PID and lists itself as "Process N".
    message = OTHER_PROCESS.replace(
        "Including non-PyTorch memory, this process has", "Process 17 has")
    parsed = parse_oom(message)
    assert parsed["process_in_use"] == round(4.60 * GiB)
    assert parsed["other_processes"] == 132 * GiB and parsed["other_process_count"] == 1
    # Two processes that could be this one: other processes' memory stays unknown.
    ambiguous = message.replace("Process 4242 has 132.00 GiB", "Process 4242 has 4.50 GiB")
    assert "other_processes" not in parse_oom(ambiguous)


# -- the settings timeline ----------------------------------------------------------------------


def test_settings_in_force_are_those_of_most_steps_and_changes_are_listed() -> None:
    snapshots = [(1, {"cudnn_benchmark": False, "memory_fraction": 1.0}),
                 (2, {"cudnn_benchmark": True, "memory_fraction": 0.03}),
                 (96, {"cudnn_benchmark": False, "memory_fraction": 0.03})]
    chosen, changes = settings_timeline.in_force(snapshots, 100)
    assert chosen == {"cudnn_benchmark": True, "memory_fraction": 0.03}
    assert changes == ["cudnn_benchmark: False -> True (seen at step 2)",
                       "memory_fraction: 1.0 -> 0.03 (seen at step 2)",
                       "cudnn_benchmark: True -> False (seen at step 96)"]
    assert settings_timeline.in_force([], 10) == ({}, [])


# -- the probe on a CPU loop that changes settings and restores them ------------------------------


def _train(steps: int, body: Any = None) -> run.RunProbe:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    try:
        for step in range(steps):
            if body is not None:
                body(step)
            optimizer.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
    finally:
        probe.stop()
    return probe


def test_settings_are_read_at_the_first_steps_and_every_nth() -> None:
    before = torch.backends.cudnn.benchmark

    def body(step: int) -> None:
        if step == 40:  # before the 41st step: next read at step 64
            torch.backends.cudnn.benchmark = not before

    try:
        probe = _train(2 * settings_timeline.EVERY + 6, body)
    finally:
        torch.backends.cudnn.benchmark = before
    timeline = probe.record.settings
    assert timeline.reads == 4  # steps 1, 2, EVERY and 2 * EVERY
    assert [step for step, _ in timeline.snapshots] == [1, 2 * settings_timeline.EVERY]


def test_settings_changed_and_restored_inside_the_test_are_reported_as_trained() -> None:
    before = torch.backends.cudnn.benchmark, torch.is_anomaly_enabled()
    try:
        torch.backends.cudnn.benchmark = True
        torch.autograd.set_detect_anomaly(True)
        probe = _train(40)
    finally:
        torch.backends.cudnn.benchmark = before[0]
        torch.autograd.set_detect_anomaly(before[1])
    facts = probe.facts()  # built after the restore, as the plugin builds them
    assert facts.cudnn_benchmark is True and facts.anomaly_detection is True
    assert facts.anomaly_backwards == 40
    assert facts.settings_reads == 2 + 40 // settings_timeline.EVERY
    assert facts.settings_changes == []


def test_cudnn_turned_off_while_training_is_recorded() -> None:
    before = torch.backends.cudnn.enabled
    try:
        torch.backends.cudnn.enabled = False
        probe = _train(40)
    finally:
        torch.backends.cudnn.enabled = before
    facts = probe.facts()  # built after the restore, as the plugin builds them
    assert facts.cudnn_enabled is False
    assert facts.settings_changes == []
    assert _train(3).facts().cudnn_enabled is True  # torch's default


def test_a_setting_changed_during_training_is_dated() -> None:
    old = torch.are_deterministic_algorithms_enabled()

    def body(step: int) -> None:
        if step == 20:
            torch.use_deterministic_algorithms(True)

    try:
        probe = _train(64, body)
    finally:
        torch.use_deterministic_algorithms(old)
    facts = probe.facts()
    assert facts.deterministic_algorithms is True  # steps 21-64 of 64
    assert facts.settings_changes == [
        "deterministic_algorithms: False -> True (seen at step 32)"]


def test_gradcheck_and_a_profiler_of_the_tests_own_are_counted() -> None:
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)

    def body(step: int) -> None:
        if step in (3, 4):
            torch.autograd.gradcheck(lambda t: (t * t).sum(), (x,))

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):
        probe = _train(10, body)
    facts = probe.facts()
    assert facts.gradcheck_calls == 2
    assert facts.user_profiler_steps == 10 and facts.user_profiler_percent == 100.0
    assert _train(10).facts().user_profiler_steps == 0


def test_new_input_shapes_are_dated_to_their_steps() -> None:
    model = torch.nn.Conv1d(1, 4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False, warmup=0)
    probe.start()
    try:
        for step in range(30):
            length = 40 + step if step % 3 == 0 else 40  # a new length every third step
            optimizer.zero_grad()
            model(torch.randn(2, 1, length)).sum().backward()
            optimizer.step()
    finally:
        probe.stop()
    facts = probe.facts()
    assert facts.input_shape_count_all == 10 and facts.input_shape_count == 8
    assert facts.new_shape_steps == 9  # steps 3, 6, ..., 27 (the first step is not new)
    assert facts.new_shape_time_percent is not None and 0 < facts.new_shape_time_percent < 100


# -- budget and peaks from readings taken while the test trained --------------------------------


def _cuda_record(steps: int = 20) -> RunRecord:
    record = RunRecord(nodeid="t::x", warmup=2, profile_steps=None,
                       steps=StepSeries(last_t=0.0, times=[0.01] * steps, waits=[0.0] * steps,
                                        syncs=[0] * steps, flags=[StepFlag.STEADY] * steps,
                                        allocated=[3 * GiB] * steps),
                       loader=LoaderWaits(LoaderTracker()))
    record.devices.cuda_index = 0
    record.allocator.start = {0: {}}
    record.allocator.end = {"total": 140 * GiB, "fraction": 1.0, "other_processes": 0,
                            "allocated_bytes.all.peak": 4 * GiB,
                            "reserved_bytes.all.peak": 4 * GiB,
                            "reserved_bytes.all.current": 4 * GiB}
    record.duration = 1.0
    return record


def test_the_budget_uses_the_fraction_read_while_training_not_the_restored_one() -> None:
    record = _cuda_record()
    record.settings.snapshots = [(1, {"memory_fraction": 0.03})]  # restored to 1.0 at the end
    memory = build_run_facts(record, ProcessReadings()).memory
    assert memory.fraction == 0.03
    assert memory.budget == int(140 * GiB * 0.03)
    assert memory.peak_reserved_percent == pytest.approx(100 * 4 / (140 * 0.03), abs=0.01)


def test_other_processes_seen_during_the_test_shrink_the_budget() -> None:
    record = _cuda_record()
    record.nvml.samples = [DeviceSample(t=0.0, other_process_memory=0, other_process_count=0),
                           DeviceSample(t=0.5, other_process_memory=132 * GiB,
                                        other_process_count=1),
                           DeviceSample(t=1.0, other_process_memory=0, other_process_count=0)]
    facts = build_run_facts(record, ProcessReadings())
    assert facts.nvml.other_process_memory_max == 132 * GiB
    assert facts.nvml.other_process_count_max == 1
    assert facts.memory.other_processes == 132 * GiB  # the process had exited by the end
    assert facts.memory.budget == 8 * GiB


def test_peaks_kept_across_a_reset_inside_the_test() -> None:
    record = _cuda_record()
    record.allocator.peaks_before_reset = {"allocated_bytes.all.peak": 9 * GiB,
                                           "reserved_bytes.all.peak": 10 * GiB}
    memory = build_run_facts(record, ProcessReadings()).memory
    assert memory.peak_allocated == 9 * GiB and memory.peak_reserved == 10 * GiB
    assert memory.peak_memory == 10 * GiB and memory.reserved_grown == 10 * GiB


def test_a_cache_left_by_an_earlier_test_is_not_this_tests_peak() -> None:
    record = _cuda_record()
    record.allocator.start = {0: {"reserved_bytes.all.current": 45 * GiB,
                                  "reserved_bytes.all.peak": 45 * GiB,
                                  "allocated_bytes.all.current": 0}}
    # The test added two small-pool segments to the 45 GiB it found.
    record.allocator.end.update({"reserved_bytes.all.peak": 45 * GiB + 4 * MiB,
                                 "allocated_bytes.all.peak": 3 * GiB})
    memory = build_run_facts(record, ProcessReadings()).memory
    assert memory.reserved_start == 45 * GiB and memory.reserved_grown == 4 * MiB
    assert memory.peak_memory == 3 * GiB  # its own peak, not the cache it found
    assert memory.peak_reserved_percent == pytest.approx(100 * 3 / 140, abs=0.01)
    # A test that grew the cache by more than it allocated: the growth is its own.
    record.allocator.end["reserved_bytes.all.peak"] = 50 * GiB
    grown = build_run_facts(record, ProcessReadings()).memory
    assert grown.reserved_grown == 5 * GiB and grown.peak_memory == 5 * GiB
    # Without the max_vram marker's exception, the probe reset the peaks at the start; with
    # it, a higher peak from the test's setup is the baseline of the growth.
    record.allocator.start[0]["reserved_bytes.all.peak"] = 48 * GiB
    assert build_run_facts(record, ProcessReadings()).memory.reserved_grown == 2 * GiB


# -- the failure described from its own moment --------------------------------------------------


class _Context:
    """What a probe hands build_failure: its failure context, and a batch size."""

    batch_size = 64

    def __init__(self, context: dict[str, Any]) -> None:
        self._context = context

    def failure_context(self) -> dict[str, Any]:
        return self._context


def _oom(message: str, context: dict[str, Any], state: dict[str, Any] | None = None) -> Any:
    facts = failures.build_failure("t::x", "call", torch.OutOfMemoryError(message), None,
                                   _Context(context), None, state or {})
    assert facts is not None and facts.kind == "oom"
    return facts


def test_the_fraction_at_the_failure_comes_from_the_allocators_limit() -> None:
    total = 150 * GiB
    moment = OomMoment(t=1.0, step=3, device_index=0, requested=2 * GiB,
                       limit=int(total * 0.03), free=140 * GiB, other_processes=0,
                       other_process_count=0)
    # Read after the test's finally: restored the fraction to 1.0.
    state = {"fraction": 1.0, "total": total, "free": 145 * GiB, "peak_reserved": 4 * GiB,
             "peak_allocated": 4 * GiB, "num_ooms": 1}
    facts = _oom("CUDA out of memory. Tried to allocate 2.00 GiB.", {"oom_moments": [moment]},
                 state)
    assert facts.oom_observed is True
    assert facts.fraction == 0.03 and facts.fraction_limit == int(total * 0.03)
    assert facts.budget == int(total * 0.03) and facts.free == 140 * GiB
    assert facts.num_ooms == 1


def test_without_the_observer_the_last_fraction_read_at_a_step_is_used() -> None:
    facts = _oom("CUDA out of memory. Tried to allocate 2.00 GiB.",
                 {"settings": {"memory_fraction": 0.05}}, {"fraction": 1.0, "total": 100 * GiB})
    assert facts.oom_observed is False and facts.fraction == 0.05
    assert facts.budget == 5 * GiB


def test_an_unrelated_earlier_oom_moment_is_not_this_failures() -> None:
    moment = OomMoment(t=1.0, step=3, device_index=0, requested=64 * GiB, limit=10 * GiB,
                       free=GiB)
    facts = _oom(TORCH_2_13_FRACTION, {"oom_moments": [moment]})
    assert facts.oom_observed is False and facts.fraction_limit == round(4.19 * GiB)
    assert facts.fraction == pytest.approx(4.19 / 139.81, abs=1e-4)


def test_a_process_that_left_before_the_test_ended_still_counts_at_the_failure() -> None:
    # Read after the failure, NVML no longer lists it; the message and the moment do.
    facts = _oom(OTHER_PROCESS, {"oom_moments": []}, {"other_processes": 0})
    assert facts.other_processes == 132 * GiB and facts.other_process_count == 1
    moment = OomMoment(t=1.0, step=3, device_index=0, requested=8 * GiB,
                       limit=round(139.81 * GiB), free=round(3.1 * GiB),
                       other_processes=131 * GiB, other_process_count=1)
    bare = _oom("CUDA out of memory. Tried to allocate 8.00 GiB.", {"oom_moments": [moment]},
                {"other_processes": 0, "total": round(139.81 * GiB)})
    assert bare.other_processes == 131 * GiB and bare.fraction == 1.0
    samples = _oom("CUDA out of memory. Tried to allocate 8.00 GiB.",
                   {"other_processes_before": 120 * GiB}, {"other_processes": 0})
    assert samples.other_processes == 120 * GiB


def test_the_peak_of_a_failure_is_the_tests_own() -> None:
    # The case: a 45 GiB cache from an earlier test, an OOM under a 4.2 GiB budget.
    start = {"reserved_bytes.all.current": 45 * GiB, "reserved_bytes.all.peak": 45 * GiB}
    facts = _oom(TORCH_2_13_FRACTION, {"allocator_start": start},
                 {"peak_reserved": round(45.4 * GiB), "peak_allocated": 4 * GiB})
    assert facts.reserved_start == 45 * GiB
    assert facts.reserved_grown == round(0.4 * GiB) and facts.peak_memory == 4 * GiB
    assert facts.peak_reserved == round(45.4 * GiB)  # the allocator's own, kept as evidence
    first = _oom(TORCH_2_13_FRACTION, {}, {"peak_reserved": 5 * GiB, "peak_allocated": 4 * GiB})
    assert first.reserved_start == 0 and first.peak_memory == 5 * GiB


def test_memory_fraction_from_the_allocator_configuration() -> None:
    assert failures.configured_fraction("per_process_memory_fraction:0.25") == 0.25
    assert failures.configured_fraction("expandable_segments:True,"
                                        "per_process_memory_fraction: 0.5") == 0.5
    assert failures.configured_fraction("expandable_segments:True") is None
    assert failures.configured_fraction("per_process_memory_fraction:7") is None


# -- the out-of-memory observer -----------------------------------------------------------------


def test_the_observer_forwards_to_the_running_probe_and_never_raises() -> None:
    seen: list[tuple[int, int, int, int]] = []
    oom_observer.set_target(lambda *args: seen.append(args))
    try:
        oom_observer._observe(0, 2 * GiB, 4 * GiB, 100 * GiB)
        oom_observer.set_target(lambda *args: 1 / 0)
        oom_observer._observe(0, 1, 2, 3)  # the probe's error stays in the probe
    finally:
        oom_observer.set_target(None)
    assert seen == [(0, 2 * GiB, 4 * GiB, 100 * GiB)]
    oom_observer._observe(0, 1, 2, 3)  # no probe: nothing happens


def test_a_probe_targets_the_observer_only_while_its_test_runs() -> None:
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    try:
        assert oom_observer.target() == probe.on_oom
        probe.on_oom(0, 2 * GiB, 4 * GiB, 100 * GiB)
    finally:
        probe.stop()
    assert oom_observer.target() is None
    (moment,) = probe.record.oom_moments
    assert (moment.requested, moment.limit, moment.free, moment.step) == (
        2 * GiB, 4 * GiB, 100 * GiB, 0)
    assert probe.failure_context()["oom_moments"] == [moment]


def _fake_allocator(allocated: int, reserved: int) -> Any:
    """A torch whose allocator answers ``_cuda_memoryStats`` as CUDA's does (no GPU here)."""
    stats = {"allocated_bytes": {"all": {"current": allocated}},
             "reserved_bytes": {"all": {"current": reserved}}}
    return SimpleNamespace(_C=SimpleNamespace(_cuda_memoryStats=lambda index: stats))


def _record(started: float) -> RunRecord:
    return RunRecord(nodeid="t::x", warmup=2, profile_steps=None,
                     steps=StepSeries(last_t=started), loader=LoaderWaits(LoaderTracker()),
                     started=started)


def test_an_oom_before_the_first_step_gives_a_memory_timeline_to_the_failure() -> None:
    """An allocation refused in the first forward (another process holds the GPU): no step
    was read, yet the memory series runs from the test's start (no CUDA context then: nothing
    allocated) to the failure, with what the allocator held at it; and no NVML sample is said
    to be a CPU run."""
    record = _record(time.perf_counter() - 1.5)
    probe = SimpleNamespace(record=record, disabled=False)
    CallReadings(_fake_allocator(2 * GiB, 3 * GiB), probe).on_oom(  # type: ignore[arg-type]
        0, 8 * GiB, 140 * GiB, 5 * GiB)
    (moment,) = record.oom_moments
    assert (moment.allocated, moment.reserved) == (2 * GiB, 3 * GiB)
    timeline = timeline_facts(record, THROTTLE_BITS)
    assert timeline.memory_time[0] == 0.0 and timeline.memory_time[1] == pytest.approx(1.5, abs=0.2)
    assert timeline.allocated == [0, 2 * GiB] and timeline.reserved == [0, 3 * GiB]
    assert timeline.oom_times == [timeline.memory_time[1]]
    why = timeline.unknown["nvml_time"]
    assert "CPU" not in why and "the test took none (an out-of-memory error came first)" in why


def test_an_oom_after_steps_ends_the_step_readings_at_the_failure() -> None:
    """A test that trained, then failed: the allocator's readings at the steps, then the one at
    the failure; where CUDA was initialised before the test, its start is not invented."""
    record = _record(100.0)
    record.allocator.start = {0: {"allocated_bytes.all.current": GiB,
                                  "reserved_bytes.all.current": 2 * GiB}}
    record.steps.times = [0.5, 0.5]
    for value in (3 * GiB, 4 * GiB):
        record.steps.add_allocated(value, value + GiB)
    record.oom_moments.append(OomMoment(t=101.25, step=2, device_index=0, requested=GiB,
                                        limit=8 * GiB, free=0, allocated=7 * GiB,
                                        reserved=8 * GiB))
    timeline = timeline_facts(record, THROTTLE_BITS)
    assert timeline.memory_time == [0.5, 1.0, 1.25]
    assert timeline.allocated == [3 * GiB, 4 * GiB, 7 * GiB]
    assert timeline.reserved == [4 * GiB, 5 * GiB, 8 * GiB]
    # Failed before any step, CUDA initialised by an earlier test: the start as read then.
    early = _record(100.0)
    early.allocator.start = record.allocator.start
    early.oom_moments.append(OomMoment(t=100.5, step=0, device_index=0, requested=GiB,
                                       limit=8 * GiB, free=0, allocated=5 * GiB,
                                       reserved=6 * GiB))
    assert timeline_facts(early, THROTTLE_BITS).allocated == [GiB, 5 * GiB]


def test_an_allocator_that_cannot_answer_at_the_oom_leaves_the_moment_without_bytes() -> None:
    record = _record(time.perf_counter())
    probe = SimpleNamespace(record=record, disabled=False)
    CallReadings(SimpleNamespace(_C=SimpleNamespace()), probe).on_oom(  # type: ignore[arg-type]
        0, GiB, 2 * GiB, 0)
    (moment,) = record.oom_moments
    assert moment.allocated is None and any("the allocator at the out-of-memory error" in e
                                            for e in record.errors)
    assert timeline_facts(record, THROTTLE_BITS).memory_time == []


def test_attaching_never_starts_cuda() -> None:
    fake = SimpleNamespace(_C=SimpleNamespace(), cuda=SimpleNamespace(is_initialized=lambda: False))
    assert oom_observer.attach(fake) is not None  # no binding in this build, or no context
    assert not torch.cuda.is_initialized()

