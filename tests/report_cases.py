"""Recorded facts made into the HTML report's cases, as tests/rule_cases make rule cases.

Each case patches a recorded fact set of tests/facts/ the way the rule cases do (``run.*`` and
``failure.*`` paths into its first run and failure, the others into the environment), and gives
its run the timeline the probe would have recorded: the series are built by the probe's own
builder (``timeline_facts``) from a ``RunRecord`` holding the steps, allocator readings, NVML
samples and out-of-memory moments of that kind of run.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from recorded_facts import load_fact_set

from pytest_gputrain.engine.evaluate import RuleEngine
from pytest_gputrain.facts import DeviceSample, FactsFile
from pytest_gputrain.findings import Finding
from pytest_gputrain.probe.loader import LoaderTracker
from pytest_gputrain.probe.run_facts_builder import THROTTLE_BITS
from pytest_gputrain.probe.run_record import (
    LoaderWaits,
    OomMoment,
    RunRecord,
    StepFlag,
    StepSeries,
)
from pytest_gputrain.probe.timeline_facts_builder import timeline_facts
from pytest_gputrain.report.model import Report, build_report

GiB = 2**30
NODE = "tests/test_train.py::test_train_resnet_bf16"
DATA_BLOCK = re.compile(r'<script type="application/json" id="([^"]+)">(.*?)</script>', re.S)


def page_data(page: str) -> dict[str, Any]:
    """What a written page's script draws: the page's own block (``gputrain-data``: the
    ladders and benchmarks) with each test's block under ``tests``, by anchor."""
    blocks = {name: json.loads(text) for name, text in DATA_BLOCK.findall(page)}
    data: dict[str, Any] = blocks.pop("gputrain-data")
    data["tests"] = {name.removeprefix("data-"): value for name, value in blocks.items()}
    return data

@dataclass
class Case:
    name: str
    facts: FactsFile
    sections: dict[str, Any] = field(default_factory=dict)

    def findings(self) -> list[Finding]:
        engine = RuleEngine.load(None)
        return engine.evaluate_records(self.facts,
                                       engine.evaluate_environment(self.facts.environment))

    def report(self) -> Report:
        return build_report(self.facts.environment, self.findings(), "error", self.sections)


def recorded_timeline(step_times: list[float], waits: list[float] | None = None, *,
                      allocated: list[int] | None = None, util: Any = None,
                      sm_clock: Any = None, power: Any = None, throttled: Any = None,
                      oom_at: float | None = None, window: tuple[int, int] | None = (3, 6),
                      interval: float = 0.1, nvml_start: float = 0.9) -> dict[str, Any]:
    """The ``run.timeline`` of a run with these steps; ``allocated``: the bytes after each step
    (None: a CPU run); ``util``, ``sm_clock``, ``power`` and ``throttled`` are functions of the
    time (None: no NVML sampling)."""
    count = len(step_times)
    record = RunRecord(nodeid=NODE, warmup=2, profile_steps=window,
                       steps=StepSeries(last_t=0.0, times=list(step_times),
                                        waits=list(waits or [0.0] * count),
                                        flags=[StepFlag.STEADY] * count),
                       loader=LoaderWaits(LoaderTracker()), started=100.0)
    for index, value in enumerate(allocated or []):  # read as the probe reads them
        if record.steps.allocated_due(index):
            record.steps.add_allocated(value, value + GiB)
    if window is not None and count >= window[1]:
        record.window_facts = {"first_step": window[0], "last_step": window[1]}
    end = sum(step_times)
    if util is not None:
        record.nvml.started = 100.0 + nvml_start
        record.nvml.index = 0
        t = 0.0
        while t <= end - nvml_start:
            moment = t + nvml_start
            record.nvml.samples.append(DeviceSample(
                t=t, utilization_gpu=util(moment), memory_used=int(30 * GiB),
                process_memory=int(28 * GiB), sm_clock=sm_clock(moment) if sm_clock else 1980.0,
                power_draw=power(moment) if power else 600.0, temperature=60.0 + moment,
                clock_event_reasons=(0x20 if throttled and throttled(moment) else 0)))
            t += interval
    if oom_at is not None:
        record.oom_moments.append(OomMoment(t=100.0 + oom_at, step=count, device_index=0,
                                            requested=9 * GiB, limit=140 * GiB, free=2 * GiB))
    return timeline_facts(record, THROTTLE_BITS).model_dump(mode="json")


def patch_facts(data: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Assign dotted paths: ``run.loader.num_workers``, ``failure.kind``, ``host.shm_total``."""
    for path, value in values.items():
        head, _, rest = path.partition(".")
        target = {"run": lambda: data["runs"][0], "failure": lambda: data["failures"][0]}.get(
            head, lambda: data["environment"])()
        *parents, last = (rest if head in ("run", "failure") else path).split(".")
        for part in parents:
            target = target[part]
        if last not in target:
            raise KeyError(f"no fact {path!r} in the recorded set")
        target[last] = value
    return data


def _facts(data: dict[str, Any]) -> FactsFile:
    return FactsFile.model_validate(data)


def healthy() -> Case:
    data = load_fact_set("run_healthy_h200")
    times = data["runs"][0]["step_times"]
    data["runs"][0]["timeline"] = recorded_timeline(
        times, [0.0002] * len(times), allocated=[int(3.5 * GiB)] * len(times),
        util=lambda t: 97.0 if t > 1.0 else 20.0)
    return Case("healthy", _facts(data))


def starved_loader() -> Case:
    """GT102's first case: num_workers 0 and a slow __getitem__, the GPU idle between steps."""
    data = patch_facts(load_fact_set("run_healthy_h200"), {
        "run.steps": 60, "run.loader.num_workers": 0, "run.loader.wait_percent": 71.0,
        "run.loader.wait_per_step": 0.11, "run.step_time": 0.155,
        "run.profile.busy_percent": 21.0, "run.nvml.utilization_mean": 25.0,
        "run.duration": 9.3})
    run = data["runs"][0]
    run["step_times"] = [0.9] + [0.155] * 59
    run["timeline"] = recorded_timeline(
        run["step_times"], [0.0] + [0.11] * 59, allocated=[int(3.5 * GiB)] * 60,
        util=lambda t: 95.0 if (t % 0.155) > 0.11 else 0.0, interval=0.05)
    return Case("starved_loader", _facts(data))


def out_of_memory() -> Case:
    """GT201's first case, on a run whose allocated memory grew step by step until the OOM."""
    data = patch_facts(load_fact_set("run_failure_h200"), {
        "failure.kind": "oom", "failure.exc_type": "torch.OutOfMemoryError",
        "failure.message": "CUDA out of memory. Tried to allocate 9.19 GiB. GPU 0 has a total "
                           "capacity of 139.81 GiB of which 2.06 GiB is free.",
        "failure.requested": 9867689984, "failure.total": 150117810176,
        "failure.free": 2211908403, "failure.allocated": 146028888064,
        "failure.reserved": 147102629888, "failure.budget": 150117810176,
        "failure.batch_size": 1024})
    run = data["runs"][0]
    run["step_times"] = run["step_times"][:40]
    run["steps"] = 40
    run["duration"] = round(sum(run["step_times"]) + 0.1, 3)
    growth = [int((20 + 3 * step) * GiB) for step in range(40)]
    run["timeline"] = recorded_timeline(
        run["step_times"], allocated=growth, util=lambda t: 90.0,
        oom_at=sum(run["step_times"]) + 0.05)
    return Case("out_of_memory", _facts(data))


def throttled() -> Case:
    """The healthy run on a GPU that slowed down when it got hot, half-way through."""
    data = patch_facts(load_fact_set("run_healthy_h200"), {
        "run.nvml.throttle_percent": 55.0, "run.nvml.throttle_reasons": ["sw_thermal_slowdown"],
        "run.nvml.sm_clock_min": 1200.0})
    times = data["runs"][0]["step_times"]
    hot = 5.0
    data["runs"][0]["timeline"] = recorded_timeline(
        times, allocated=[int(3.5 * GiB)] * len(times), util=lambda t: 97.0,
        sm_clock=lambda t: 1980.0 if t < hot else 1200.0,
        power=lambda t: 610.0 if t < hot else 380.0, throttled=lambda t: t >= hot)
    return Case("throttled", _facts(data))


def straggler() -> Case:
    """GT301's first case: rank 1 sleeps 50 ms per step under DDP on 2 H200s."""
    from pytest_gputrain.distributed.facts import DistributedRunFacts, RankFacts

    data = load_fact_set("h200x2_recorded")
    steps = 20
    fast = [0.05 + 0.0612 * k for k in range(steps)]
    ranks = [RankFacts(rank=0, device="cuda:0", device_name="NVIDIA H200", outcome="ok",
                       steps=steps, step_time_median=0.0612, busy_time_median=0.0091,
                       wait_fraction=0.85, step_ends=[round(t, 4) for t in fast],
                       step_waits=[0.0] + [0.0521] * (steps - 1)),
             RankFacts(rank=1, device="cuda:1", device_name="NVIDIA H200", outcome="ok",
                       steps=steps, step_time_median=0.0611, busy_time_median=0.0608,
                       wait_fraction=0.0, step_ends=[round(t + 0.0004, 4) for t in fast],
                       step_waits=[0.0] * steps)]
    launch = DistributedRunFacts(
        test="tests/test_ddp.py::test_ddp_train", world_size=2, backend="nccl",
        outcome="passed", duration=4.1, probe=True, ranks=ranks, steps=[steps, steps],
        min_steps=steps, step_time_medians=[0.0612, 0.0611], busy_time_medians=[0.0091, 0.0608],
        step_time_summary="rank 0 61.2 ms, rank 1 61.1 ms",
        busy_time_summary="rank 0 9.1 ms, rank 1 60.8 ms", wait_summary="rank 0 85 %, rank 1 0 %",
        straggler_rank=1, fastest_rank=0, straggler_ratio=6.68, straggler_excess=0.0517,
        straggler_busy=0.0608, fastest_busy=0.0091,
        device_names=["NVIDIA H200", "NVIDIA H200"], cuda_used=True, ddp_used=True)
    data["distributed"] = [launch.model_dump(mode="json")]
    return Case("straggler", _facts(data))


def benchmark_comparison() -> Case:
    """The healthy run's session, and the regression gate's comparison of a 6 % slower step."""
    from pytest_gputrain.regression.compare import GateReport, GateSettings, MetricComparison
    from pytest_gputrain.regression.output import report_section

    comparison = MetricComparison(
        nodeid="tests/perf/test_step.py::test_resnet_step", metric="step_time",
        verdict="regression", threshold=0.025, baseline_value=0.007434,
        current_value=0.00788, baseline_values=(0.007434, 0.007451, 0.007420, 0.007447),
        current_values=(0.007889, 0.007871, 0.007902, 0.007862), change=0.06, p_value=0.0004,
        detectable=0.011, reason="4 sessions a side, spread 0.31 %")
    gate = GateReport(GateSettings({"step_time": 0.025}), comparisons=[comparison],
                      compare_spec="base-17")
    section = report_section(gate)  # as the gate hands it to the diagnosis
    # The healthy test was gated too: its baseline's rounds, 5 % faster than its steps now.
    steady = sorted(healthy().facts.records["run"][0]["step_times"])[100]
    rounds = [[round(steady / 1.05 * (1 + 0.002 * ((k * 7 + s) % 5 - 2)), 6) for k in range(30)]
              for s in range(3)]
    section["steps"] = {NODE: {"metric": "step_time", "baseline": rounds, "current": []}}
    return Case("benchmark_comparison", healthy().facts, {"benchmarks": section})


def ladder() -> Case:
    """The healthy run's session with the sample project's readiness ladder (README's H200
    table) and its largest-batch search."""
    from pytest_gputrain.ladder.rungs import HeadroomRecord, LadderResults, RungRecord
    from pytest_gputrain.ladder.table import render

    MiB = 2**20
    results = LadderResults("product", rungs=[
        RungRecord("one batch", "cuda", "fp32", 32, 1, 0.2365),
        RungRecord("short run", "cuda", "fp32", 32, 50, 0.0129, int(849.8 * MiB),
                   utilization_p10=17, utilization_p90=20, temperature_min=34,
                   temperature_max=35, val_accuracy=0.948),
        RungRecord("short run", "cuda", "bf16", 32, 50, 0.0124, int(807.7 * MiB),
                   utilization_p10=1, utilization_p90=23, temperature_min=34,
                   temperature_max=35, val_accuracy=0.88)],
        headroom=[HeadroomRecord("bf16", 4 * GiB, [(32, int(794.6 * MiB)),
                                                   (571, int(1.4 * GiB)),
                                                   (1143, int(2.1 * GiB))],
                                 2591, True, int(3.8 * GiB))])
    # The section as the ladder hands it to the diagnosis (ladder/plugin.py).
    section = {**results.as_dict(), "markdown": render(results, tablefmt="github")}
    return Case("ladder", healthy().facts, {"ladder: product": section})


def many_tests(count: int) -> Case:
    """``count`` recorded runs like the healthy one (every third starved: a warning, GT102),
    each of 3,000 steps and over two minutes of NVML samples: the size of a large suite's
    report."""
    base = load_fact_set("run_healthy_h200")
    step_times = [0.9] + [0.0455 + 0.002 * math.sin(k / 7) for k in range(2999)]
    timelines = {
        False: recorded_timeline(step_times, allocated=[int(3.5 * GiB)] * 3000,
                                 util=lambda t: 90.0 + 7 * math.sin(t)),
        True: recorded_timeline(step_times, [0.0] + [0.03] * 2999,
                                allocated=[int(3.5 * GiB)] * 3000,
                                util=lambda t: 30.0 + 60 * (math.sin(9 * t) > 0)),
    }
    runs = []
    for index in range(count):
        starved = index % 3 == 0
        run = copy.deepcopy(base["runs"][0])
        run["nodeid"] = f"tests/test_suite_{index // 50}.py::test_train[{index}]"
        run["timeline"] = timelines[starved]
        if starved:  # as starved_loader(): GT102 fires
            run["loader"].update(num_workers=0, wait_percent=71.0, wait_per_step=0.11)
            run["profile"]["busy_percent"] = 21.0
            run["nvml"]["utilization_mean"] = 25.0
            run["step_time"] = 0.155
        runs.append(run)
    base["runs"] = runs
    return Case("many_tests", _facts(base))


# The recorded H200 samples a suite of known faults is made of (tests/facts/h200_samples/):
# five failures (three of them out of memory, one in a forked DataLoader worker), a starved
# loader, checkpoints every step, a forgotten profiler, a loss that turns NaN, memory growth,
# stalls, syncs and a healthy run.
H200_SUITE = ("starved_loader", "oom_failure", "other_process_oom", "fraction_restored_oom",
              "cuda_in_dataset", "device_mismatch", "checkpoint_every_step", "profiler_left_on",
              "nonfinite_loss", "memory_growth", "host_stalls", "sync_heavy", "healthy_resnet",
              "compile_recompiles")


def h200_suite(samples: tuple[str, ...] = H200_SUITE) -> Case:
    """One session of the recorded H200 samples: their records together, on the environment
    the first was recorded in (every sample ran on the same lent H200)."""
    sets = [load_fact_set(f"h200_samples/{name}") for name in samples]
    data = sets[0]
    for other in sets[1:]:
        for key in ("runs", "failures", "distributed"):
            data.setdefault(key, [])
            data[key].extend(other.get(key) or [])
    return Case("h200_suite", _facts(data))


def h200_sample(name: str) -> Case:
    """One recorded H200 sample as its own session."""
    return Case(name, _facts(load_fact_set(f"h200_samples/{name}")))


CASES = {"healthy": healthy, "starved_loader": starved_loader, "out_of_memory": out_of_memory,
         "throttled": throttled, "straggler": straggler,
         "benchmark_comparison": benchmark_comparison, "ladder": ladder,
         "h200_suite": h200_suite}
