"""A real branch history: a training step saved at successive "commits", with slowdowns injected
at some of them, then searched for steps as ``history --changes`` searches it.

    python benchmarks/change_points_series.py                        # CUDA: 30 commits, +3 % at
                                                                     # commit 12, +5 % at 22
    python benchmarks/change_points_series.py --slowdowns 10:2,20:2  # two 2 % steps
    python benchmarks/change_points_series.py --device cpu --commits 12 --slowdowns 6:20 --rounds 20

Each commit is one session in a process of its own (a new interpreter: imports torch, builds
the step, times it with the plugin's engine, saves one run named ``main`` with the commit), as
a nightly ``pytest --gpu-save=main`` would. The step is ``training_step.build_step`` (a GPU-bound
conv net at batch 512 on CUDA, an MLP on the CPU). A slowdown of X % from commit N on is extra
work after each step of X % of the first session's median: a GPU spin kernel
(``torch.cuda._sleep``) on CUDA, a host busy-wait on the CPU; slowdowns add up (the code only
gets slower). Then the store is read back and searched (``branch_history.find_changes``): it
prints each step found, where it was injected, and the steps found where none was.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
try:
    import pytest_gputrain  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(HERE.parent))

NODE = "benchmarks/change_points_series.py::train_step"


def session(spec: dict[str, Any]) -> dict[str, Any]:
    """One commit's session (in its own process): time the step, save one run."""
    sys.path.insert(0, str(HERE))
    import torch
    import training_step

    from pytest_gputrain.regression.benchmark import BenchmarkOptions, GpuBenchmark
    from pytest_gputrain.regression.gate import save_results
    from pytest_gputrain.regression.stats import median
    from pytest_gputrain.regression.store_backends import open_store

    device = spec["device"]
    if device == "cpu":
        torch.set_num_threads(1)
    step = training_step.build_step(torch, device, 64 if device == "cpu" else 512)
    extra = spec["extra_seconds"]
    cycles = extra * spec.get("cycles_per_second", 0.0)

    def slowed() -> None:
        step()
        if not extra:
            return
        if device == "cpu":
            end = time.perf_counter() + extra
            while time.perf_counter() < end:
                pass
        else:
            torch.cuda._sleep(int(cycles))

    options = BenchmarkOptions(warmup=spec["warmup"], min_rounds=spec["rounds"],
                               max_rounds=spec["rounds"], max_time=3600.0)
    result = GpuBenchmark(NODE, options, counters=False)(slowed, device=device)
    out: dict[str, Any] = {"median": median(result.clean_step_times())}
    if device != "cpu" and spec.get("calibrate"):
        out["cycles_per_second"] = spin_rate(torch)
    with open_store(Path(spec["store"])) as store:
        out["run"] = save_results(store, "main", [result], commit=spec["commit"]).id
    return out


def spin_rate(torch: Any) -> float:
    """``torch.cuda._sleep`` cycles per second on this GPU."""
    cycles = 2_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)
    start.record()
    for _ in range(20):
        torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return 20 * cycles / (start.elapsed_time(end) / 1000)


def run_session(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--session", json.dumps(spec)],
                          capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"session of commit {spec['commit']} failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def commit_name(index: int) -> str:
    """A commit's name as the store and ``history`` show it (its first 10 characters)."""
    return f"commit{index:04d}"


def parse_slowdowns(text: str) -> dict[int, float]:
    found = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        commit, _, percent = item.partition(":")
        found[int(commit)] = float(percent) / 100
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--commits", type=int, default=30)
    parser.add_argument("--slowdowns", default="12:3,22:5",
                        help="COMMIT:PERCENT pairs: from that commit on, that much slower")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--store", help="an SQLite store to keep (default: a temporary one)")
    parser.add_argument("--session", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.session:
        print(json.dumps(session(json.loads(args.session))))
        return 0
    from pytest_gputrain.regression.branch_history import find_changes, read_series

    slowdowns = parse_slowdowns(args.slowdowns)
    folder = tempfile.mkdtemp(prefix="gputrain-series-")
    store = args.store or str(Path(folder) / "benchmarks.sqlite")
    base: dict[str, Any] = {"device": args.device, "rounds": args.rounds,
                            "warmup": args.warmup, "store": store}
    first = run_session({**base, "commit": commit_name(0), "extra_seconds": 0.0,
                         "calibrate": True})
    print(f"commit 0: median {first['median'] * 1e3:.3f} ms (run #{first['run']})", flush=True)
    factor = 0.0
    for commit in range(1, args.commits):
        factor += slowdowns.get(commit, 0.0)
        spec = {**base, "commit": commit_name(commit), "extra_seconds": factor * first["median"],
                "cycles_per_second": first.get("cycles_per_second", 0.0)}
        out = run_session(spec)
        print(f"commit {commit}: median {out['median'] * 1e3:.3f} ms, +{factor * 100:g} % "
              f"injected (run #{out['run']})", flush=True)
    from pytest_gputrain.regression.store_backends import open_store

    with open_store(Path(store), create=False) as opened:
        series = [find_changes(s) for s in read_series(opened, [NODE], name="main",
                                                       metrics=("step_time",))]
    found = [(change.first.run.commit or "", change) for s in series for change in s.changes]
    print(f"\nstore: {store}")
    for commit, change in found:
        index = int(commit.removeprefix("commit"))
        injected = slowdowns.get(index)
        what = (f"injected +{injected * 100:g} %" if injected is not None
                else "no slowdown injected here")
        print(f"step at commit {index}: {change.step.change * 100:+.2f} %, p = "
              f"{change.step.p_value:.2g} ({what})")
    hits = {int(commit.removeprefix("commit")) for commit, _ in found} & set(slowdowns)
    print(f"found {len(hits)} of {len(slowdowns)} injected slowdowns; "
          f"{len(found) - len(hits)} step(s) where none was injected")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
