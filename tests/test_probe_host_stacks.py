"""The host calls behind host time (``probe/host_stacks.py``, ``run.host.*``): the training
thread's stack sampled in the profiler window and in long steps, the garbage collections timed
through ``gc.callbacks``, the call sites they are folded into. CPU torch runs every loop here;
the profiler window, which needs CUDA, is stood in for by its flag.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from types import FrameType
from typing import Any

import torch

from pytest_gputrain.probe import host_stacks, run
from pytest_gputrain.probe.host_facts_builder import host_facts
from pytest_gputrain.probe.host_stacks import SiteFinder
from pytest_gputrain.probe.loader import LoaderTracker
from pytest_gputrain.probe.run_facts_builder import ProcessReadings, build_run_facts
from pytest_gputrain.probe.run_record import (
    CallSite,
    HostSamples,
    LoaderWaits,
    RunRecord,
    StepFlag,
    StepSeries,
)
from pytest_gputrain.probe.torch_hooks import global_hook_counts


def _probe() -> run.RunProbe:
    return run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)


def _spin(seconds: float) -> None:
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:  # the host work of a long step
        pass


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()


# -- call sites: library frames folded into the line that called them ---------------------------


def test_a_library_frame_is_folded_into_the_test_line_that_called_it() -> None:
    finder = SiteFinder()
    seen: list[tuple[FrameType, FrameType | None] | None] = []

    def default(value: object) -> str:  # called by json's pure-Python encoder (indent=...)
        seen.append(finder.site(sys._getframe(1)))  # start in json's frame
        return "x"

    json.dumps({"a": [object()]}, default=default, indent=1)
    found = seen[0]
    assert found is not None
    site, inner = found
    assert site.f_code is test_a_library_frame_is_folded_into_the_test_line_that_called_it.__code__
    assert inner is not None and inner.f_globals["__name__"].startswith("json")


def test_the_test_frame_itself_is_a_site_with_nothing_inside() -> None:
    found = SiteFinder().site(sys._getframe())
    assert found is not None and found[1] is None


def test_a_framework_frame_is_a_site_of_its_own() -> None:
    namespace: dict[str, Any] = {"__name__": "transformers.trainer"}
    exec(compile("def train(f):\n    return f()\n", "/site-packages/transformers/trainer.py",
                 "exec"), namespace)
    finder = SiteFinder(roots=("/site-packages/",))
    site, inner = namespace["train"](lambda: finder.site(sys._getframe(1)))
    assert site.f_code.co_filename.endswith("transformers/trainer.py") and inner is None


# -- the sampler: long steps only -----------------------------------------------------------------


def test_a_step_turns_long_past_twice_the_recent_median_and_20_ms() -> None:
    assert host_stacks._long_step([0.5]) is None  # too few steps
    assert host_stacks._long_step([0.5, 0.001, 0.001]) == host_stacks.LONG_MIN
    assert host_stacks._long_step([0.5] + [0.05] * 20) == 0.1


def test_the_sampler_names_the_line_that_stalls_a_step_and_samples_no_other_step() -> None:
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe()
    probe.start()
    probe.host.start_sampler()  # started at the first CUDA step otherwise
    try:
        for step in range(30):
            _step(model, optimizer)
            if step % 10 == 7:
                _spin(0.25)  # the stall: the line the diagnosis must name
    finally:
        probe.stop()
    facts = build_run_facts(probe.record, ProcessReadings())
    times = probe.record.steps.times
    samples = probe.record.host.samples
    assert samples
    # A sample is taken only once a step has run past the long-step threshold (>= 20 ms).
    assert all(times[step] >= host_stacks.LONG_MIN for step, _, _, _ in samples
               if step < len(times))
    assert facts.stalls.step_numbers == [9, 19, 29]
    host = facts.host
    assert host.stall_call_kind == "site"
    assert host.stall_call is not None and "_spin" not in host.stall_call
    assert "while time.perf_counter() - started < seconds" in host.stall_call
    assert host.stall_call_percent is not None and host.stall_call_percent > 20
    assert host.stall_summary is not None and "per stall step" in host.stall_summary
    assert host.window_call is None and host.unknown["window_call"] == "no profiler window"


def test_without_a_gpu_step_no_sampler_thread_starts() -> None:
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe()
    probe.start()
    try:
        assert probe.host._thread is None
        _step(model, optimizer)
    finally:
        probe.stop()
    assert probe.record.host.sampler == "the test never trained on a GPU"


# -- garbage collections ---------------------------------------------------------------------------


def test_explicit_gc_collect_in_the_profiled_steps_is_named_with_its_call_site() -> None:
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe()
    probe.start()
    try:
        for step in range(10):
            probe.record.steps.in_window = 3 <= step <= 6  # stands in for the profiler window
            _step(model, optimizer)
            gc.collect(0)  # the young generation: fast, and explicit all the same
        probe.record.steps.in_window = False
    finally:
        probe.stop()
    line = test_explicit_gc_collect_in_the_profiled_steps_is_named_with_its_call_site
    where = f"test_probe_host_stacks.py:{line.__code__.co_firstlineno + 9}"
    host = build_run_facts(probe.record, ProcessReadings()).host
    assert host.window_call == f"gc.collect() at {where}"
    assert host.window_call_kind == "gc-explicit"
    assert host.window_summary is not None and host.window_summary.endswith("timed)")
    assert host.gc_explicit == 10 and host.gc_explicit_site == where
    assert host.gc_collections is not None and host.gc_collections >= 10
    assert host.gc_percent is not None and host.gc_percent > 0


def test_automatic_collections_of_older_generations_are_timed() -> None:
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe()
    thresholds = gc.get_threshold()
    gc.set_threshold(50, 2, 1_000_000)  # generation 1 often, generation 2 never
    probe.start()
    try:
        for step in range(10):
            probe.record.steps.in_window = 3 <= step <= 6
            _step(model, optimizer)
            cycles: list[list[Any]] = [[] for _ in range(2000)]
            for cell in cycles:
                cell.append(cell)  # reference cycles: garbage only a collection frees
            del cycles
        probe.record.steps.in_window = False
    finally:
        probe.stop()
        gc.set_threshold(*thresholds)
    host = build_run_facts(probe.record, ProcessReadings()).host
    assert host.window_call_kind == "gc-automatic"
    assert host.window_call is not None
    assert host.window_call.startswith("Python's automatic garbage collection (")
    assert host.gc_explicit == 0


def test_the_probe_leaves_gc_as_it_found_it() -> None:
    original = gc.collect
    probe = _probe()
    probe.start()
    assert gc.collect is not original and global_hook_counts(torch)["gc_callbacks"] == 1
    probe.stop()
    assert gc.collect is original
    counts = global_hook_counts(torch)
    assert counts["gc_callbacks"] == 0 and counts["patched_attributes"] == 0


def test_a_forked_child_neither_times_nor_names_collections() -> None:
    probe = _probe()
    probe.start()
    try:
        probe.host._pid = -2  # as in a DataLoader worker forked from the training process
        gc.collect(0)
    finally:
        probe.stop()
    assert probe.record.host.collections == [] and probe.record.host.gc_totals == {}


# -- the facts, from a hand-made record --------------------------------------------------------


def _record(times: list[float], flags: list[StepFlag]) -> RunRecord:
    record = RunRecord(nodeid="t::x", warmup=2, profile_steps=(3, 6), steps=StepSeries(last_t=0),
                       loader=LoaderWaits(LoaderTracker()))
    record.steps.times = times
    record.steps.flags = flags
    return record


def test_the_call_that_took_most_of_the_steps_is_named_gc_or_site() -> None:
    steady, window = StepFlag.STEADY, StepFlag.IN_WINDOW
    record = _record([0.1] * 10, [steady] * 3 + [window] * 4 + [steady] * 3)
    host = record.host
    host.sites = [CallSite("/p/train.py", 40, "train", "x = encode(texts)  # slow", "re.sub"),
                  CallSite("/p/train.py", 41, "train", "gc.collect()")]
    # 30 ms of samples at line 40 in each window step, 50 ms of gc.collect() at line 41.
    host.samples = [(step, True, 0, 0.03) for step in range(3, 7)]
    host.collections = [(step, 2, 0.05, 1) for step in range(10)]
    facts = host_facts(record, steady=list(range(2, 10)), stall_steps=[])
    assert facts.window_call == "gc.collect() at train.py:41"
    assert facts.window_call_kind == "gc-explicit"
    assert facts.window_call_time == 0.05 and facts.window_call_percent == 50.0
    assert facts.window_calls == ["gc.collect() at train.py:41: 50 %",
                                  "`x = encode(texts)` at train.py:40 (in re.sub): 30 %"]
    assert facts.gc_percent == 50.0 and facts.gc_time_per_step == 0.05
    assert facts.gc_explicit == 10 and facts.gc_explicit_site == "train.py:41"
    assert facts.unknown["stall_call"] == "no stalls"
    host.collections = []
    facts = host_facts(record, steady=list(range(2, 10)), stall_steps=[])
    assert facts.window_call == "`x = encode(texts)` at train.py:40 (in re.sub)"
    assert facts.window_call_kind == "site"
    assert facts.window_summary == ("`x = encode(texts)` at train.py:40 (in re.sub), 30.0 ms per "
                                    "profiled step (30 % of those steps, sampled)")


def test_samples_of_one_line_are_one_call_whatever_function_they_were_in() -> None:
    record = _record([0.5] * 4, [StepFlag.STEADY] * 4)
    host = record.host
    host.sites = [CallSite("/p/t.py", 9, "f", "y = model(x)", "torch.nn.functional.linear"),
                  CallSite("/p/t.py", 9, "f", "y = model(x)", "torch.nn.functional.relu"),
                  CallSite("/p/t.py", 12, "f", "log(y)")]
    host.samples = [(3, False, 0, 0.1), (3, False, 1, 0.15), (3, False, 2, 0.2)]
    facts = host_facts(record, steady=[2, 3], stall_steps=[3])
    assert facts.stall_call == "`y = model(x)` at t.py:9 (in torch.nn.functional.relu)"
    assert facts.stall_call_percent == 50.0


def test_a_record_without_host_readings_builds_unknown_calls() -> None:
    facts = host_facts(_record([0.1] * 4, [StepFlag.STEADY] * 4), steady=[2, 3],
                       stall_steps=[3])
    assert facts.samples == 0 and facts.gc_collections == 0
    assert facts.stall_call is None and facts.unknown["stall_call"] == (
        "no stack sample fell in those steps")
    assert isinstance(HostSamples().samples, list)
