"""The background NVML sampler, driven by a fake reader (no GPU needed)."""

from __future__ import annotations

import itertools
import math
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gputrain.collect.sampler import NvmlSampler, summarise
from pytest_gputrain.facts import DeviceSample


class Reader:
    """Counts reads; utilization follows ``values`` (last one repeats)."""

    def __init__(self, values: list[float] | None = None, memory: int = 2**30) -> None:
        self.values = values or [50.0]
        self.calls = 0
        self.threads: set[str] = set()
        self.memory = memory

    def __call__(self, index: int) -> DeviceSample | None:
        self.threads.add(threading.current_thread().name)
        value = self.values[min(self.calls, len(self.values) - 1)]
        self.calls += 1
        return DeviceSample(utilization_gpu=value, memory_used=self.memory, power_draw=100.0,
                            temperature=50.0, sm_clock=1500.0, clock_event_reasons=0x4)


def test_samples_on_a_daemon_thread_until_stopped() -> None:
    reader = Reader()
    sampler = NvmlSampler(3, interval=0.01, read=reader)
    with sampler:
        time.sleep(0.15)
        assert sampler.running
    assert not sampler.running
    samples = sampler.samples
    assert 8 <= len(samples) <= 20
    assert [s.t for s in samples] == sorted(s.t for s in samples)
    assert samples[-1].t == pytest.approx(sampler.elapsed(), abs=0.02)
    assert any(name.startswith("gputrain-nvml-sampler-3") for name in reader.threads)
    calls = reader.calls
    time.sleep(0.05)
    assert reader.calls == calls  # really stopped


def test_summary_per_metric() -> None:
    sampler = NvmlSampler(0, interval=0.005, read=Reader([0, 10, 20, 30, 40, 50, 60, 70, 80, 90,
                                                          100] + [100] * 0))
    with sampler:
        while len(sampler.samples) < 11:
            time.sleep(0.005)
    summary = sampler.summary()
    assert set(summary) == {"utilization_gpu", "memory_used", "power_draw", "temperature",
                            "sm_clock"}
    util = summary["utilization_gpu"]
    assert util.min == 0 and util.max == 100
    assert summary["power_draw"].mean == 100.0
    assert sampler.clock_event_fractions() == {"sw_power_cap": 1.0}
    assert sampler.peak("memory_used") == 2**30
    with pytest.raises(KeyError, match="unknown metric"):
        sampler.values("fan_speed")


def test_window_selects_by_time() -> None:
    sampler = NvmlSampler(0, interval=0.01, read=Reader())
    with sampler:
        time.sleep(0.1)
    middle = sampler.window(0.03, 0.06)
    assert middle and all(0.03 <= s.t <= 0.06 for s in middle)
    assert len(sampler.values("utilization_gpu", start=0.05)) < len(sampler.samples)


def test_memory_is_bounded_by_thinning_and_peaks_survive() -> None:
    memory = iter([2**30] * 10 + [9 * 2**30] + [2**30] * 10_000)
    reader = Reader()

    def read(index: int) -> DeviceSample | None:
        sample = reader(index)
        assert sample is not None
        sample.memory_used = next(memory)
        return sample

    sampler = NvmlSampler(0, interval=0.001, capacity=16, read=read)
    with sampler:
        while reader.calls < 40:
            time.sleep(0.005)
    assert len(sampler.samples) < 16
    assert sampler.interval > sampler.requested_interval  # thinned: the interval doubled
    assert sampler.peak("memory_used") == 9 * 2**30  # even if its sample was dropped
    times = [s.t for s in sampler.samples]
    assert times[0] < 0.01 and times[-1] == pytest.approx(sampler.elapsed(), abs=0.05)


def test_failed_reads_are_counted_not_raised() -> None:
    def broken(index: int) -> DeviceSample | None:
        raise RuntimeError("GPU fell off the bus")

    sampler = NvmlSampler(0, interval=0.01, read=broken)
    with sampler:
        time.sleep(0.05)
    assert sampler.samples == []
    assert sampler.misses == sampler.reads > 0
    assert sampler.last_error == "RuntimeError: GPU fell off the bus"
    assert sampler.summary() == {}

    none = NvmlSampler(0, interval=0.01, read=lambda index: None)
    with none:
        time.sleep(0.03)
    assert none.samples == [] and none.misses > 0


def test_start_once_and_stop_is_idempotent() -> None:
    sampler = NvmlSampler(0, interval=0.01, read=Reader())
    sampler.stop()  # before start: nothing
    sampler.start()
    with pytest.raises(RuntimeError, match="only once"):
        sampler.start()
    sampler.stop()
    count = len(sampler.samples)
    sampler.stop()
    assert len(sampler.samples) == count
    assert "stopped" in repr(sampler)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="interval must be positive"):
        NvmlSampler(0, interval=0)
    with pytest.raises(ValueError, match="capacity"):
        NvmlSampler(0, capacity=1)


def test_real_nvml_reader_never_raises_without_a_driver() -> None:
    sampler = NvmlSampler(0, interval=0.01)
    with sampler:
        time.sleep(0.03)
    # On a GPU machine there are samples; without a driver, only misses.
    assert sampler.samples or sampler.misses


def test_summary_interpolates_percentiles_linearly() -> None:
    s = summarise([40.0, 0.0, 30.0, 10.0, 20.0])
    assert s is not None
    assert (s.min, s.p10, s.p50, s.p90, s.max) == pytest.approx((0, 4, 20, 36, 40))
    assert summarise([]) is None


@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=200))
def test_summary_is_ordered(values: list[float]) -> None:
    s = summarise(values)
    assert s is not None
    # Tied values may come back a unit in the last place beside themselves (statistics.quantiles
    # interpolates (x * 7 + x * 3) / 10), so two neighbours may be two units out of order.
    tolerance = 2 * math.ulp(s.max)
    chain = (s.min, s.p10, s.p50, s.p90, s.max)
    assert all(low <= high + tolerance for low, high in itertools.pairwise(chain))
    assert s.min - 1e-9 <= s.mean <= s.max + 1e-9
    assert s.count == len(values)
