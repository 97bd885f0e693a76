"""Power of the regression gate across sessions: does the CI recipe catch a 5 % slowdown, and does
it stay quiet when nothing changed, when every session is its own process?

    python benchmarks/regression_power.py                    # CUDA, one GPU, about 5 minutes
    python benchmarks/regression_power.py --devices 2        # two GPUs, one stream of sessions each
    python benchmarks/regression_power.py --device cpu --sessions 2 --rounds 20 --budget-s 60
    python benchmarks/regression_power.py --replay power.json --step-summary median --trials 400
    python benchmarks/regression_power.py --slowdown 0.02 --threshold 0.01 --sequential 8
    python benchmarks/regression_power.py --injections --out sessions.jsonl   # injection_power.py
    python benchmarks/regression_power.py --injections --replay sessions.jsonl

Two training steps, each timed as CI times it:

- launch-bound: ResNet-18, batch 32, fp32, 224x224, SGD (the host's kernel launches are the
  critical path: what small models and small batches in test suites look like);
- GPU-bound: a conv net at batch 512 (``training_step.build_step``).

Every session is a separate OS process with its own CUDA context, started from a forkserver
that has imported torch but not initialised CUDA (a cold process per step, a new interpreter,
measures what a CI session costs). A session builds the step, times it with the plugin's own
engine (``GpuBenchmark``: ``--warmup`` untimed steps, ``--rounds`` <= 100 timed steps, NVML
sampler thread) and saves it in a real store as one run; the comparisons then run in this
parent process, which reads the runs back from the store and decides with the gate's own
``compare_test`` (t-test over sessions, each summarised by its fastest clean step or with
``--step-summary median`` its median; ``--threshold``, ``--alpha``), as
``python -m pytest_gputrain compare`` does in CI. On CUDA every session also measures the GPU's
own time per step (the queued rounds of the plugin's ``gpu_time``); ``--metric gpu_time`` gates
on it, and every run prints each session summary side by side (step time or GPU time, fastest
or median: ``gate_trials.ALTERNATIVES``) with its spread, the slowdown it measured, and its
trials' verdicts, so that the summaries can be compared on the same sessions.

The slowdown makes the step 5 % slower. For the GPU-bound step: a GPU spin kernel
(``torch.cuda._sleep``) of 5 % of the calibration session's median after each step. For the
launch-bound step (``--launch-slowdown both``, the default): host busy work of 5 % of the median
before each step *and* a GPU spin kernel as long after it, so the step is 5 % slower whichever
side sets its pace in a session. Host work alone (``--launch-slowdown host``, sized in the
calibration session until the median rises by 5 %) is a cliff, not a 5 % slowdown: on the H200 a
quiet ResNet-18 batch-32 session runs at the GPU's pace with about 1 ms of host slack, host work
below it hides behind the queued kernels and slows nothing, and past it the step becomes
host-paced, slower by far more than 5 % and by a different amount in every session (the pace of
the host's launches differs between processes).

Each device's stream of sessions is pinned to its own CPUs (``--cpus-per-session``, default 8;
``os.sched_setaffinity``), so the streams do not take each other's cores and every session of
a stream runs on the same ones, as a CI job on one runner does. Sessions of the unchanged and
the slowed step alternate (two unchanged to one slowed), so drift in clocks or temperature
hits both alike. The steps run one after the other, each on every device, so the host runs one
kind of session at a time; ``--mix-steps`` alternates them instead (on the H200 a launch-bound
session beside a GPU-bound one on the other GPU ran at the host's pace in about half the
sessions: 7.5 to 10.3 ms, an 8.6 % spread).

Trials are formed from the pools of sessions: a power trial draws ``--sessions`` unchanged
sessions as the baseline and as many slowed ones as the candidate; a false-alarm trial draws
two disjoint sets of unchanged sessions. Trials share sessions (the pools are finite), so the
trials are not independent; the output says how large the pools were. Verdicts are counted
apart (``gate_trials.tally``): on slowed code caught, "ok" (a miss the gate did not admit) and
"cannot tell"; on unchanged code false alarms ("improvement" as much as "regression"), "ok" and
"cannot tell". The number of sessions the recipe needs is the fewest a side whose trials on the
same pools reach the goal: >= 95 % caught and <= 5 % false alarms, each over >= 20 trials; a
step whose trials miss it but never call a slowdown "ok" is HONEST. ``--sequential N`` also
runs the sequential recipe: pairs of sessions until the gate decides, N a side at most.

``--json PATH`` saves every session's clean rounds; ``--replay PATH`` runs no session and
decides the trials again on those saved sessions, with another recipe or gate (more trials,
another number of sessions a side, the median as a session's summary): with the run's own
settings it prints the run's own figures.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

try:
    import pytest_gputrain  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gate_trials
import injection_power
from cpu_pinning import cpu_sets as pinned_sets
from cpu_pinning import describe as describe_cpus
from gate_trials import PoolIds, Records, Rows
from session_process import run_in_process
from tabulate import tabulate

from pytest_gputrain.regression.benchmark import spin_cycles_per_second
from pytest_gputrain.regression.compare import GateSettings
from pytest_gputrain.regression.stats import pooled_spread
from pytest_gputrain.regression.store import ResultRecord
from pytest_gputrain.regression.store_backends import open_store
from pytest_gputrain.regression.store_location import describe
from pytest_gputrain.units import format_duration

# Durations printed as the gate prints them: three decimals, microseconds below a millisecond.
seconds = partial(format_duration, precise=True)
STEPS = ("launch", "gpu")
DESCRIPTIONS = {
    ("launch", "cuda"): "launch-bound: ResNet-18, batch 32, fp32, 224x224, SGD",
    ("gpu", "cuda"): "GPU-bound: conv net (4 conv + linear, 64x64), batch 512, SGD",
    ("launch", "cpu"): "launch-bound (CPU stand-in): ResNet-18 at width 8, batch 2, 32x32, SGD",
    ("gpu", "cpu"): "compute-bound (CPU stand-in): MLP 512-1024-1024-10, batch 64, SGD",
}
METRIC_WORDS = {"step_time": "step time", "gpu_time": "GPU time per step"}
# How the pools' summaries are named: (metric, step summary) -> words.
LABELS = {("step_time", "min"): "fastest steps", ("step_time", "median"): "medians",
          ("gpu_time", "min"): "fastest GPU times", ("gpu_time", "median"): "median GPU times"}


# -- one session (runs in its own process) -------------------------------------------------------


def build_step(torch: Any, step: str, device: str, gpu_batch: int) -> Callable[[], None]:
    import training_step  # benchmarks/ is on sys.path

    if step == "launch":
        if device == "cpu":
            return training_step.build_resnet18_step(torch, device, batch=2, size=32, width=8)
        return training_step.build_resnet18_step(torch, device, batch=32, size=224)
    return training_step.build_step(torch, device, 64 if device == "cpu" else gpu_batch)


def slowed(torch: Any, step: Callable[[], None], host_seconds: float,
           gpu_cycles: float) -> Callable[[], None]:
    """The step plus extra work: a host busy-wait of ``host_seconds`` before it, and a GPU spin
    kernel of ``gpu_cycles`` queued after it on the same stream (either may be 0)."""
    def slowed_step() -> None:
        if host_seconds:
            end = time.perf_counter() + host_seconds
            while time.perf_counter() < end:
                pass
        step()
        if gpu_cycles:
            torch.cuda._sleep(int(gpu_cycles))
    return slowed_step


def host_work_for(median: float, slowdown: float,
                  measure: Callable[[float], float]) -> tuple[float, float]:
    """Host busy-wait before each step that makes the step's median ``slowdown`` slower (to a
    tenth of ``slowdown``), and the median measured with it; ``measure(amount)`` times the step
    with that much host work. Host work first fills the host's slack, where the GPU still sets
    the pace and the step is no slower (the amount doubles), then adds to the step one for one
    (each try corrects by the miss, kept between the amounts known to fall short and to
    overshoot; on the H200 the step went from unchanged to 12 % slower between 0.9 and 1.5 ms).
    Returns a measured amount, never an untried one: the one that slowed the step least while
    reaching the target, or else the one that slowed it most."""
    target, tolerance = median * (1 + slowdown), median * slowdown / 10
    short, over = 0.0, math.inf
    amount = slowdown * median
    tried: list[tuple[float, float]] = []
    for _ in range(12):
        reached = measure(amount)
        tried.append((amount, reached))
        if abs(reached - target) <= tolerance:
            break
        if reached < target:
            short = max(short, amount)
            guess = amount * 2 if reached < median + 2 * tolerance else amount + target - reached
        else:
            over = min(over, amount)
            guess = amount - (reached - target)
        if not short < guess < over:
            guess = (short + over) / 2 if over < math.inf else amount * 2
        amount = guess
    reaching = [pair for pair in tried if pair[1] >= target - tolerance]
    if reaching:
        return min(reaching, key=lambda pair: (pair[1], pair[0]))
    return max(tried, key=lambda pair: pair[1])


def run_session(spec: dict[str, Any]) -> dict[str, Any]:
    """One session: build the step, time it with the plugin's engine, save it as one run."""
    if spec.get("cpus"):
        os.sched_setaffinity(0, spec["cpus"])
    import torch

    from pytest_gputrain.regression.benchmark import BenchmarkOptions, GpuBenchmark
    from pytest_gputrain.regression.gate import save_results
    from pytest_gputrain.regression.stats import median

    device = spec["device"]
    if device == "cpu":
        torch.set_num_threads(1)
    else:
        if spec.get("cpus"):  # the forkserver imported torch before pinning: as many as it has
            torch.set_num_threads(len(spec["cpus"]))
        torch.cuda.set_device(torch.device(device))
    torch.backends.cudnn.benchmark = bool(spec["cudnn_benchmark"])
    step = build_step(torch, spec["step"], device, spec["gpu_batch"])
    if spec["host_seconds"] or spec["gpu_cycles"]:
        step = slowed(torch, step, spec["host_seconds"], spec["gpu_cycles"])
    options = BenchmarkOptions(warmup=spec["warmup"], min_rounds=spec["rounds"],
                               max_rounds=spec["rounds"], max_time=3600.0)
    # Times only: the counters' proof is --injections (injection_power.py).
    bench = GpuBenchmark(f"benchmarks/regression_power.py::{spec['step']}", options,
                         gpu_time=device != "cpu", counters=False)
    result = bench(step, device=device)
    out: dict[str, Any] = {"median": median(result.clean_step_times()), "pid": os.getpid(),
                           "round_times": list(result.clean_step_times()),
                           "gpu_times": result.gpu_time,
                           "throttled": result.throttled_count,
                           "fingerprint": result.fingerprint, "conditions": result.conditions}
    if spec.get("calibrate") and device != "cpu":
        out["cycles_per_second"] = spin_cycles_per_second(torch)
    if spec.get("calibrate_host"):
        probe = BenchmarkOptions(warmup=10, min_rounds=60, max_rounds=60, max_time=3600.0)

        def measure(amount: float) -> float:
            timed = GpuBenchmark(f"benchmarks/regression_power.py::{spec['step']}/sizing", probe,
                                 counters=False)
            candidate = slowed(torch, step, amount, 0.0)
            return float(median(timed(candidate, device=device).clean_step_times()))

        out["host_amount"], out["host_reached"] = host_work_for(
            out["median"], spec["calibrate_host"], measure)
    with open_store(spec["store"]) as store:
        out["run_id"] = save_results(store, spec["name"], [result], commit=None).id
    return out


def start_session(context: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Run one session in a new process of ``context``; its result and wall time."""
    return run_in_process(context, run_session, spec, spec["name"])


# -- the run -------------------------------------------------------------------------------------


@dataclass
class Pool:
    """The sessions of one step."""

    step: str
    description: str
    calibration: dict[str, Any] = field(default_factory=dict)
    how: str = ""  # what the slowed sessions add, in words
    host_seconds: float = 0.0  # busy-wait before each step
    gpu_cycles: float = 0.0  # spin kernel after each step
    unchanged: list[dict[str, Any]] = field(default_factory=list)
    slowed: list[dict[str, Any]] = field(default_factory=list)

    def walls(self) -> list[float]:
        return [s["wall"] for s in self.unchanged + self.slowed]


def pool_ids(pool: Pool) -> PoolIds:
    return PoolIds(f"benchmarks/regression_power.py::{pool.step}",
                   [s["run_id"] for s in pool.unchanged], [s["run_id"] for s in pool.slowed])


def stored_records(store_location: str | Path, pool: Pool) -> Records:
    """The pool's sessions as the gate reads them: each run's result read back from the store."""
    nodeid = f"benchmarks/regression_power.py::{pool.step}"
    with open_store(store_location, create=False) as store:
        return {session["run_id"]: store.results(session["run_id"])[nodeid]
                for session in pool.unchanged + pool.slowed}


def saved_records(pool: Pool) -> Records:
    """The pool's sessions rebuilt from what ``--json`` saved of them (their clean rounds, GPU
    times, fingerprint and conditions), for ``--replay`` without the store."""
    nodeid = f"benchmarks/regression_power.py::{pool.step}"
    return {session["run_id"]: ResultRecord(
                nodeid=nodeid, fingerprint=session["fingerprint"], fingerprint_hash="",
                rounds=len(session["round_times"]),
                metrics={"step_time": session["round_times"],
                         "gpu_time": session.get("gpu_times")},
                summary={"conditions": session["conditions"]}, run_id=session["run_id"])
            for session in pool.unchanged + pool.slowed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (default) or cpu (tiny steps, for a smoke run anywhere)")
    parser.add_argument("--devices", type=int, default=1,
                        help="GPUs to use, one stream of sessions on each (default 1)")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help="which steps: launch, gpu or both (default launch,gpu)")
    parser.add_argument("--sessions", type=int, default=4,
                        help="sessions a side in the recipe (default 4)")
    parser.add_argument("--trials", type=int, default=20, help="trials of each kind (>= 20)")
    parser.add_argument("--budget-s", type=float, default=270.0,
                        help="start no session that would end after this many seconds "
                             "(default 270)")
    parser.add_argument("--pool", type=int, default=None,
                        help="slowed sessions per step, twice as many unchanged ones "
                             "(default 4 x --sessions, or --sequential if more, as the budget "
                             "allows); with --injections, the most sessions to run")
    parser.add_argument("--rounds", type=int, default=100, help="timed steps a session (<= 100)")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps a session (30)")
    parser.add_argument("--slowdown", type=float, default=0.05, help="injected slowdown (0.05)")
    parser.add_argument("--launch-slowdown", default="both", choices=("both", "host"),
                        help="how the launch-bound step is slowed: both (default: host work "
                             "and GPU work, each --slowdown of its median, so the step is that "
                             "much slower whichever side sets its pace) or host (host work "
                             "alone, sized in the calibration session)")
    parser.add_argument("--threshold", type=float, default=0.025,
                        help="gate: smallest change reported (0.025 = 2.5 %%)")
    parser.add_argument("--alpha", type=float, default=0.01, help="gate: significance (0.01)")
    parser.add_argument("--step-summary", default="min", choices=("min", "median"),
                        help="gate: one session's step time, its fastest clean step (min, the "
                             "default) or their median")
    parser.add_argument("--metric", default="step_time", choices=("step_time", "gpu_time"),
                        help="gate: the step time (default) or the GPU's own time per step "
                             "(CUDA sessions measure both; every run also prints each summary's "
                             "figures side by side)")
    parser.add_argument("--sequential", type=int, default=0, metavar="N",
                        help="also run the sequential recipe: pairs of sessions until the gate "
                             "decides, N a side at most (compare --max-sessions N); 0: off")
    parser.add_argument("--gpu-batch", type=int, default=512, help="GPU-bound step's batch")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="sessions set torch.backends.cudnn.benchmark = True")
    parser.add_argument("--cold", action=argparse.BooleanOptionalAction, default=None,
                        help="calibrate in a new interpreter, timing a cold session (default: "
                             "on for cuda, off for cpu)")
    parser.add_argument("--store", help="store for the sessions: a file or a postgresql:// URL "
                                        "(default: a new SQLite file in a temporary folder)")
    parser.add_argument("--cpus-per-session", type=int, default=None,
                        help="pin each device's stream of sessions to this many CPUs of its "
                             "own (default: 8 for cuda, as many as there are; 0: no pinning)")
    parser.add_argument("--mix-steps", action="store_true",
                        help="alternate the steps' sessions on every device (a launch-bound "
                             "session then shares the host with GPU-bound ones); default: one "
                             "step at a time")
    parser.add_argument("--seed", type=int, default=0, help="seed of the trials' draws")
    parser.add_argument("--json", metavar="PATH", help="also write everything as JSON, each "
                                                       "session's rounds included")
    parser.add_argument("--replay", metavar="PATH",
                        help="run no session: decide the trials again on the sessions a "
                             "--json PATH of an earlier run saved, with this command line's "
                             "--sessions, --trials, --seed and gate (e.g. --step-summary median)")
    injection_power.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.injections:
        if args.sessions < 2 or args.trials < 1 or not 1 <= args.rounds <= 100:
            parser.error("--sessions must be >= 2, --trials >= 1, --rounds 1 to 100")
        if args.busy_host < 0 or not 0 < args.size < 1:
            parser.error("--busy-host must be >= 0 and --size between 0 and 1")
        if not {s.strip() for s in args.steps.split(",")} <= set(STEPS):
            parser.error(f"--steps {args.steps!r}: choose from {', '.join(STEPS)}")
        return injection_power.main_injections(args)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    if not steps or any(s not in STEPS for s in steps):
        parser.error(f"--steps {args.steps!r}: choose from {', '.join(STEPS)}")
    if not 1 <= args.rounds <= 100:
        parser.error("--rounds must be between 1 and 100")
    if args.trials < 1 or args.sessions < 2:
        parser.error("--trials must be >= 1 and --sessions >= 2")
    if args.sequential and args.sequential < 2:
        parser.error("--sequential must be 0 (off) or >= 2 sessions a side")
    if args.pool is not None and args.pool < args.sessions:
        parser.error("--pool must be at least --sessions (a trial draws that many)")
    if args.devices < 1 or (args.device == "cpu" and args.devices != 1):
        parser.error("--devices must be >= 1 (and 1 with --device cpu)")
    cold = args.cold if args.cold is not None else args.device == "cuda"
    if args.cpus_per_session is not None and args.cpus_per_session < 0:
        parser.error("--cpus-per-session must be >= 0")
    if args.replay:
        try:
            replay(Path(args.replay), steps, args)
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            parser.error(f"--replay {args.replay}: not a file this script's --json wrote "
                         f"({type(exc).__name__}: {exc})")
        return 0
    started = time.perf_counter()
    deadline = started + args.budget_s

    folder = tempfile.TemporaryDirectory(prefix="gputrain-power-")
    store = args.store or str(Path(folder.name) / "power.sqlite")
    store_location: str | Path = store if "://" in store else Path(store)
    open_store(store_location).close()  # created once, before the sessions race to it

    devices = ["cpu"] if args.device == "cpu" else [f"cuda:{i}" for i in range(args.devices)]
    per_session = args.cpus_per_session
    if per_session is None:
        per_session = 8 if args.device == "cuda" else os.cpu_count() or 1
    cpu_sets = pinned_sets(len(devices), per_session)
    forked = multiprocessing.get_context("forkserver")
    # The forkserver imports once what every session needs (torch without CUDA, the steps, the
    # plugin's engine and store); each session is a fork of it, with its own CUDA context.
    forked.set_forkserver_preload(["torch", "training_step", "diagnose_overhead",
                                   "pytest_gputrain.regression.gate",
                                   "pytest_gputrain.regression.store_sqlite",
                                   "pytest_gputrain.collect.sampler"])
    spawned = multiprocessing.get_context("spawn")
    base_spec = {"rounds": args.rounds, "warmup": args.warmup, "store": store,
                 "cudnn_benchmark": args.cudnn_benchmark, "gpu_batch": args.gpu_batch,
                 "host_seconds": 0.0, "gpu_cycles": 0.0}

    pools = {step: Pool(step, DESCRIPTIONS[(step, args.device)]) for step in steps}
    streams = list(zip(devices, cpu_sets, strict=True))
    pinning = ("; ".join(f"{d} on {describe_cpus(c)}" for d, c in streams)
               if cpu_sets[0] else describe_cpus([]))
    print(f"regression power: sessions in separate processes on {', '.join(devices)}; "
          f"{args.rounds} timed steps a session after {args.warmup} warm-up steps; "
          f"{pinning}; store {describe(store_location)}", flush=True)
    for step, pool in pools.items():  # calibration: the step's median, and its cost when cold
        host_only = args.device == "cpu" or (step == "launch" and args.launch_slowdown == "host")
        spec = {**base_spec, "step": step, "device": devices[0], "name": f"{step}/calibration",
                "calibrate": True, "cpus": cpu_sets[0],
                "calibrate_host": args.slowdown if host_only else 0.0}
        pool.calibration = start_session(spawned if cold else forked, spec)
        median = pool.calibration["median"]
        extra = args.slowdown * median
        if host_only:
            pool.host_seconds = pool.calibration["host_amount"]
            pool.how = (f"host busy-wait of {seconds(pool.host_seconds)} before each "
                        f"step, sized to slow the calibration session by "
                        f"{args.slowdown * 100:g} %")
            print(f"  sized {step}'s host work: {seconds(pool.host_seconds)} before "
                  f"each step took the median from {seconds(median)} to "
                  f"{seconds(pool.calibration['host_reached'])} (the target: "
                  f"{seconds(median * (1 + args.slowdown))})", flush=True)
        else:
            pool.gpu_cycles = extra * pool.calibration["cycles_per_second"]
            pool.how = (f"GPU spin kernel (torch.cuda._sleep) of {seconds(extra)} after "
                        f"each step, {args.slowdown * 100:g} % of the calibration median")
            if step == "launch":  # the host's work grows as much: the slower side shows it
                pool.host_seconds = extra
                pool.how = (f"host busy-wait of {seconds(extra)} before each step and "
                            f"a GPU spin kernel as long after it (torch.cuda._sleep), each "
                            f"{args.slowdown * 100:g} % of the calibration median")
        print(f"  calibrated {step}: median {seconds(median)}, "
              f"{'cold' if cold else 'forked'} session {pool.calibration['wall']:.1f} s wall",
              flush=True)

    # The pools: two unchanged sessions to one slowed, as many as the budget allows (up to
    # 2 --pool and --pool). One step at a time on every device, the budget left shared between
    # the steps still to run; with --mix-steps the steps alternate on every device instead.
    n = args.sessions
    phases = [steps] if args.mix_steps else [[step] for step in steps]
    lock = threading.Lock()
    counter = [0]
    failures: list[str] = []

    def stream(device: str, cpus: list[int], queue: list[tuple[str, str]],
               deadline: float) -> None:
        while True:
            with lock:
                walls = [w for pool in pools.values() for w in pool.walls()]
                estimate = statistics.median(walls) if walls else 0.0
                if not queue or failures or time.perf_counter() + estimate > deadline:
                    return
                step, kind = queue.pop(0)
                counter[0] += 1
                number = counter[0]
            pool = pools[step]
            spec = {**base_spec, "step": step, "device": device, "cpus": cpus,
                    "name": f"{step}/{kind}/{number:03d}"}
            if kind == "slowed":
                spec.update(host_seconds=pool.host_seconds, gpu_cycles=pool.gpu_cycles)
            try:
                answer = start_session(forked, spec)
            except RuntimeError as exc:
                with lock:
                    failures.append(str(exc))
                return
            answer["device"] = device
            with lock:
                getattr(pool, kind).append(answer)
                done = len(pool.unchanged) + len(pool.slowed)
            if done % 10 == 0:
                print(f"  {step}: {done} sessions ({time.perf_counter() - started:.0f} s)",
                      flush=True)

    for index, phase in enumerate(phases):
        left = deadline - time.perf_counter()
        phase_deadline = time.perf_counter() + left / (len(phases) - index)
        order = [(step, kind) for kind in ("unchanged", "unchanged", "slowed") for step in phase]
        size = args.pool or max(4 * n, args.sequential)
        queue = [(step, kind) for _ in range(size) for step, kind in order]
        threads = [threading.Thread(target=stream, args=(d, c, queue, phase_deadline))
                   for d, c in streams]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if failures:
        print(f"a session failed: {failures[0]}")
        return 2

    report: dict[str, Any] = {"pid": os.getpid(), "devices": devices, "cpu_sets": cpu_sets,
                              "rounds": args.rounds, "warmup": args.warmup,
                              "slowdown": args.slowdown,
                              "launch_slowdown": args.launch_slowdown,
                              "mix_steps": args.mix_steps,
                              "cudnn_benchmark": args.cudnn_benchmark}
    records = {step: stored_records(store_location, pool) for step, pool in pools.items()}
    judge(pools, records, args, cold, report, started)
    folder.cleanup()
    return 0


def judge(pools: dict[str, Pool], records: dict[str, Records], args: argparse.Namespace,
          cold: bool, report: dict[str, Any], started: float) -> None:
    """Decide the trials of every step with the gate of the command line, print the figures and
    the overall result, and write them (with ``report``'s description of the run) to --json."""
    gate = GateSettings({args.metric: args.threshold}, alpha=args.alpha,
                        step_summary=args.step_summary)
    report.update({"sessions_a_side": args.sessions, "threshold": args.threshold,
                   "alpha": args.alpha, "step_summary": args.step_summary,
                   "metric": args.metric, "sequential": args.sequential, "cold": cold,
                   "steps": {}})
    first = next(iter(pools.values())).calibration["fingerprint"]
    print(f"device: {first.get('gpu_name') or first.get('cpu_model')}, torch "
          f"{first.get('torch_version')}, driver {first.get('driver_version')}")
    print(f"recipe: {args.sessions} sessions a side, interleaved; gate "
          f"{args.metric}:{args.threshold * 100:g} %, alpha {args.alpha:g} (t-test over "
          f"sessions), a session's {METRIC_WORDS[args.metric]}: its "
          f"{'fastest clean step' if args.step_summary == 'min' else 'median clean step'}")
    results = []
    for step, pool in pools.items():
        print()
        print(f"== {pool.description} ==")
        figures = summarise(pool, args, records[step], gate, cold)
        report["steps"][step] = figures
        results.append(figures["result"])
    elapsed = time.perf_counter() - started
    overall = next((r for r in ("MISS", "HONEST") if r in results), "PASS")
    print()
    print(f"overall: {overall} ({elapsed:.0f} s)")
    report["elapsed_s"] = elapsed
    report["result"] = overall
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


def replay(path: Path, steps: list[str], args: argparse.Namespace) -> None:
    """The trials again, on the sessions a --json file saved (their rounds, not a store), with
    this command line's recipe and gate (--sessions, --trials, --seed, --threshold, --alpha,
    --step-summary); no session runs. With the run's own settings it repeats the run's figures."""
    started = time.perf_counter()
    saved = json.loads(path.read_text(encoding="utf-8"))
    pools = {}
    for step in steps:
        if step not in saved["steps"]:
            continue
        figures = saved["steps"][step]
        pools[step] = Pool(step, figures["description"], calibration=figures["calibration"],
                           how=figures.get("how", "as the run describes it"),
                           unchanged=figures["pool"]["unchanged"],
                           slowed=figures["pool"]["slowed"])
    if not pools:
        raise ValueError(f"no step of {', '.join(steps)} in it")
    cold = saved.get("cold", saved["devices"][0] != "cpu")
    print(f"regression power, replayed: the sessions saved in {path} "
          f"({', '.join(saved['devices'])}, {saved['rounds']} timed steps a session); "
          f"no session runs", flush=True)
    report = {key: value for key, value in saved.items()
              if key not in ("steps", "elapsed_s", "result")} | {"replay_of": str(path)}
    records = {step: saved_records(pool) for step, pool in pools.items()}
    # the slowdown is the one the saved sessions were given, whatever this command line says
    judge(pools, records, argparse.Namespace(**{**vars(args), "slowdown": saved["slowdown"]}),
          cold, report, started)


def summarise(pool: Pool, args: argparse.Namespace, records: Records,
              gate: GateSettings, cold: bool) -> dict[str, Any]:
    """Print one step's figures; the same as a dict."""
    n, count = args.sessions, args.trials
    ids = pool_ids(pool)
    unchanged = gate_trials.summaries(records, ids.unchanged, args.metric, args.step_summary)
    slow = gate_trials.summaries(records, ids.slowed, args.metric, args.step_summary)
    label = LABELS[(args.metric, args.step_summary)]
    calibration = pool.calibration
    forked_wall = statistics.median(pool.walls()) if pool.walls() else None
    print(f"session median {seconds(calibration['median'])}; "
          f"{'cold' if cold else 'forked'} calibration session {calibration['wall']:.1f} s "
          f"wall; forked sessions {forked_wall or 0:.1f} s wall (median)")
    figures: dict[str, Any] = {"description": pool.description, "how": pool.how,
                               "calibration": calibration,
                               "pool": {"unchanged": pool.unchanged, "slowed": pool.slowed},
                               "forked_session_wall_s": forked_wall, "result": "MISS"}
    if not gate_trials.measured(records, args.metric):
        print(f"MISS: the sessions have no {args.metric} (the CPU measures no GPU time)")
        return figures
    if len(unchanged) < 2 * n or len(slow) < n:
        print(f"MISS: only {len(unchanged)} unchanged and {len(slow)} slowed sessions in the "
              f"pools (a larger --budget-s runs more); trials need {2 * n} and {n}")
        return figures
    spread = pooled_spread([unchanged])
    assert spread.sd is not None
    measured = statistics.geometric_mean(slow) / statistics.geometric_mean(unchanged) - 1
    print(f"unchanged pool: {len(unchanged)} sessions, {label} "
          f"{seconds(min(unchanged))} - {seconds(max(unchanged))}, spread between "
          f"sessions {spread.sd * 100:.2f} % ({spread.df} df)")
    print(f"slowed pool: {len(slow)} sessions, {label} {seconds(min(slow))} - "
          f"{seconds(max(slow))}; {pool.how}; measured {measured * 100:+.2f} % over the "
          "unchanged pool")
    rows = gate_trials.trials(records, ids, n, count, args.seed, gate)
    counts = gate_trials.tally(rows)
    strays = sum(r["strays"] > 0 for kind in rows.values() for r in kind)
    detectable = [r["detectable"] for r in rows["slowed"] if r["detectable"] is not None]
    caught_goal, alarm_goal = math.ceil(0.95 * count), math.floor(0.05 * count)
    print(f"trials: each draws {n} + {n} different sessions from the pools (seed {args.seed}); "
          "trials share sessions")
    print(f"  power for a {args.slowdown * 100:g} % slowdown: {counts['caught']}/{count} "
          f"caught (goal >= {caught_goal}/{count}), missed as 'ok': {counts['missed_ok']}, "
          f"'cannot tell': {counts['cannot_tell']}; detectable change (median) "
          + (f"{statistics.median(detectable) * 100:.1f} %" if detectable else "–"))
    print(f"  false alarms on unchanged code: {counts['false_alarms']}/{count} (goal <= "
          f"{alarm_goal}/{count}), of them 'improvement': "
          f"{counts['improvements_on_unchanged']}; 'ok': {counts['ok_unchanged']}, "
          f"'cannot tell': {counts['cannot_tell_unchanged']}")
    print(f"  trials that left out a stray session (Dixon's Q): {strays}/{2 * count}")
    needed, most = gate_trials.fewest_sessions(records, ids, count, args.seed, gate)
    wall = calibration["wall"] if cold else forked_wall
    if needed is None:
        print(f"sessions the recipe needs: more than {most} a side (no number up to {most}, "
              "the most these pools allow, reached the goal in the trials)")
    else:
        minutes = 2 * needed * (wall or 0.0) / 60
        print(f"sessions the recipe needs (the fewest a side whose trials on these pools reach "
              f"the goal): {needed} a side ({2 * needed} sessions, about {minutes:.1f} min at "
              f"{wall or 0:.1f} s a session, before pytest's own start-up)")
    figures["sequential"] = sequential(records, ids, args, gate, count)
    figures["alternatives"] = alternatives(records, ids, args, count)
    verdict = gate_trials.result(rows, count)
    print(f"result: {verdict}")
    figures.update({
        "spread": asdict(spread), "measured_slowdown": measured, **counts, "trials": count,
        "trials_with_strays": strays,
        "detectable_median": statistics.median(detectable) if detectable else None,
        "sessions_needed": needed,
        "recipe_minutes": None if needed is None else 2 * needed * (wall or 0.0) / 60,
        "trial_rows": rows, "result": verdict})
    return figures


def sequential(records: Records, ids: PoolIds, args: argparse.Namespace, gate: GateSettings,
               count: int) -> dict[str, Any] | None:
    """The sequential recipe's trials (``--sequential N``), printed; None when off or when
    the pools hold too few sessions for its budget."""
    budget = args.sequential
    if not budget:
        return None
    if len(ids.unchanged) < 2 * budget or len(ids.slowed) < budget:
        print(f"sequential recipe: the pools hold too few sessions for {budget} a side (need "
              f"{2 * budget} unchanged and {budget} slowed)")
        return None
    rows: Rows = gate_trials.sequential_trials(records, ids, budget, count, args.seed, gate)
    counts = gate_trials.tally(rows)
    used = [r["sessions"] for kind in rows.values() for r in kind]
    print(f"sequential recipe (a pair at a time until the gate decides, at most {budget} a "
          f"side): {counts['caught']}/{count} caught, missed as 'ok' {counts['missed_ok']}, "
          f"'cannot tell' {counts['cannot_tell']}; false alarms {counts['false_alarms']}/"
          f"{count}, 'ok' {counts['ok_unchanged']}, 'cannot tell' "
          f"{counts['cannot_tell_unchanged']}; sessions a side used: median "
          f"{statistics.median(used):g}, most {max(used)}; "
          f"{gate_trials.result(rows, count)}")
    return {"budget": budget, **counts, "sessions_used": used, "trial_rows": rows,
            "result": gate_trials.result(rows, count)}


def alternatives(records: Records, ids: PoolIds, args: argparse.Namespace,
                 count: int) -> list[dict[str, Any]]:
    """Each session summary's figures on the same sessions and trials, printed as a table."""
    found = []
    for metric, step_summary in gate_trials.ALTERNATIVES:
        if not gate_trials.measured(records, metric):
            continue
        found.append(gate_trials.alternative(records, ids, metric, step_summary,
                                             args.sessions, count, args.seed, args.threshold,
                                             args.alpha))
    table = [(f"{f['metric']} {f['step_summary']}",
              "–" if f["spread"] is None else f"{f['spread'] * 100:.2f} %",
              "–" if f["measured_slowdown"] is None else f"{f['measured_slowdown'] * 100:+.2f} %",
              f"{f['caught']}/{count}", str(f["missed_ok"]), str(f["cannot_tell"]),
              f"{f['false_alarms']}/{count}", str(f["ok_unchanged"]),
              str(f["cannot_tell_unchanged"]), f["result"]) for f in found]
    print(f"session summaries compared ({args.sessions} a side, gate {args.threshold * 100:g} "
          f"%, the same draws):")
    print(tabulate(table, headers=("summary", "spread", "measured", "caught", "missed 'ok'",
                                   "cannot tell", "false alarms", "'ok' (unchanged)",
                                   "cannot tell (unchanged)", "result"),
                   disable_numparse=True))
    return found


if __name__ == "__main__":
    raise SystemExit(main())
