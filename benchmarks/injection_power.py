"""``regression_power.py --injections``: five regressions injected into a launch-bound and a
GPU-bound training step (``injections.py``), each session its own process; does the gate's
default policy catch each one, name the right counter, and stay quiet on unchanged code?

    python benchmarks/regression_power.py --injections --out sessions.jsonl   # on the GPU
    python benchmarks/regression_power.py --injections --replay sessions.jsonl  # anywhere

The run: a calibration session sizes the Python work and the copy to ``--size`` of each step's
median; then sessions in the order unchanged, kernel, sync, unchanged, copy, python, alloc, ...
until ``--budget-s`` runs out. Each session is one process (forked from a server that imported
torch, not CUDA) that times both steps with the plugin's own ``GpuBenchmark`` (warm-up, timed
rounds, the GPU's time per step, and the counting pass), saves them as one run in a real store,
reads them back, and the parent appends them as one line to ``--out`` (flushed and synced: a run
cut short keeps every session it finished). ``--busy-host N`` keeps N busy processes on the
sessions' own CPUs, as a shared CI host has.

The trials (here or with ``--replay``, on the CPU): the sessions are loaded into a fresh store,
and each trial draws ``--sessions`` unchanged sessions as the baseline and as many of one
injection as the candidate (or two disjoint sets of unchanged ones for a false-alarm trial) and
decides them with the gate's own ``compare_test`` under ``--regression`` (default ``auto``: the
default policy), as ``python -m pytest_gputrain compare`` does. A trial catches an injection when
a metric is a regression, and names it when a regression is on one of the injection's own
counters (``injections.EXPECTED``; for a GPU-bound step, where counters are not gated, when a
regression's reason names that counter). It prints per step and injection what it cost (step
time), what the counters saw, how often it was caught and named, the false alarms on unchanged
code, and the host CPU time's own spread between sessions.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import injections
from cpu_pinning import cpu_sets as pinned_sets
from cpu_pinning import describe as describe_cpus
from session_process import run_in_process
from tabulate import tabulate

from pytest_gputrain.regression import counters, policy
from pytest_gputrain.regression.compare import GateSettings, compare_test, session_value
from pytest_gputrain.regression.settings import parse_spec
from pytest_gputrain.regression.stats import pooled_spread
from pytest_gputrain.regression.store import ResultRecord
from pytest_gputrain.regression.store_backends import open_store

KIND = "pytest-gputrain-injection-power"
STEPS = ("launch", "gpu")
NODE = "benchmarks/regression_power.py::{}"
CYCLE = ("unchanged", "kernel", "sync", "unchanged", "copy", "python", "alloc")
DESCRIPTIONS = {
    ("launch", "cuda"): "launch-bound: ResNet-18, batch 32, fp32, 224x224, SGD",
    ("gpu", "cuda"): "GPU-bound: conv net (4 conv + linear, 64x64), batch 512, SGD",
    ("launch", "cpu"): "ResNet-18 at width 8, batch 2, 32x32, SGD (CPU stand-in)",
    ("gpu", "cpu"): "MLP 512-1024-1024-10, batch 64, SGD (CPU stand-in)",
}


# -- a session (in its own process) --------------------------------------------------------------


def _record(result: ResultRecord) -> dict[str, Any]:
    return {"nodeid": result.nodeid, "fingerprint": result.fingerprint,
            "fingerprint_hash": result.fingerprint_hash, "rounds": result.rounds,
            "metrics": result.metrics, "summary": result.summary,
            "created_at": result.created_at, "counters": result.counters}


def session(spec: dict[str, Any]) -> dict[str, Any]:
    """Both steps with one variant, timed and counted by the plugin, saved as one run."""
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
        if spec.get("cpus"):
            torch.set_num_threads(len(spec["cpus"]))
        torch.cuda.set_device(torch.device(device))
    torch.backends.cudnn.benchmark = bool(spec.get("cudnn_benchmark"))
    options = BenchmarkOptions(warmup=spec["warmup"], min_rounds=spec["rounds"],
                               max_rounds=spec["rounds"], max_time=3600.0)
    variant = spec["variant"]
    results = []
    medians = {}
    for step in spec["steps"]:
        built = injections.build(torch, step, device, variant, spec["gpu_batch"])
        stepped = injections.inject(torch, built, variant, device,
                                    (spec.get("sizes") or {}).get(step, {}))
        bench = GpuBenchmark(NODE.format(step), options, gpu_time=device != "cpu",
                             counters=not spec.get("calibrate"))
        result = bench(stepped, device=device)
        medians[step] = median(result.clean_step_times())
        results.append(result)
    out: dict[str, Any] = {"pid": os.getpid(), "variant": variant, "medians": medians}
    if spec.get("calibrate"):
        out["sizes"] = injections.sizes(torch, device, medians, spec["size"])
        out["alloc_pool"] = device != "cpu" and hasattr(torch.cuda, "MemPool")
        return out
    with open_store(spec["store"]) as store:
        run = save_results(store, f"{variant}/{spec['number']:03d}", results, commit=None)
        out["run_id"] = run.id
        out["results"] = {nodeid: _record(record)
                          for nodeid, record in store.results(run.id).items()}
    return out


def start(context: Any, spec: dict[str, Any]) -> dict[str, Any]:
    return run_in_process(context, session, spec, spec["variant"])


def _busy(cpus: list[int]) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    while True:
        pass


# -- the run -------------------------------------------------------------------------------------


def _append(path: Path, entry: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    deadline = started + args.budget_s
    device = "cpu" if args.device == "cpu" else "cuda:0"
    variants = injections.CPU_VARIANTS if device == "cpu" else injections.VARIANTS
    out = Path(args.out)
    if out.exists():
        out.unlink()
    folder = tempfile.TemporaryDirectory(prefix="gputrain-injections-")
    store = str(Path(folder.name) / "sessions.sqlite")
    open_store(Path(store)).close()
    per_session = args.cpus_per_session
    if per_session is None:
        per_session = 8 if device != "cpu" else os.cpu_count() or 1
    (cpus,) = pinned_sets(1, per_session)
    forked = multiprocessing.get_context("forkserver")
    forked.set_forkserver_preload(["torch", "training_step", "injections",
                                   "pytest_gputrain.regression.gate",
                                   "pytest_gputrain.regression.store_sqlite",
                                   "pytest_gputrain.collect.step_counters",
                                   "pytest_gputrain.collect.sampler"])
    busy = [multiprocessing.get_context("spawn").Process(target=_busy, args=(cpus,),
                                                         daemon=True)
            for _ in range(args.busy_host)]
    for process in busy:
        process.start()
    steps = [s.strip() for s in args.steps.split(",") if s.strip() in STEPS]
    base = {"device": device, "steps": steps, "rounds": args.rounds, "warmup": args.warmup,
            "store": store,
            "cpus": cpus, "gpu_batch": args.gpu_batch, "size": args.size,
            "cudnn_benchmark": args.cudnn_benchmark}
    print(f"injection power: sessions in separate processes on {device}; {args.rounds} timed "
          f"steps after {args.warmup} warm-up steps, then the counting pass; "
          f"{describe_cpus(cpus)}; {args.busy_host} busy process(es) on those CPUs; "
          f"writing {out}", flush=True)
    try:
        calibration = start(forked, {**base, "variant": "unchanged", "calibrate": True,
                                     "number": 0})
        print(f"  calibrated: medians {', '.join(f'{s} {v * 1e3:.3f} ms' for s, v in calibration['medians'].items())}; "  # noqa: E501
              f"sizes {json.dumps(calibration['sizes'])} ({calibration['wall']:.1f} s)",
              flush=True)
        _append(out, {"kind": KIND, "version": 1, "device": device, "steps": steps,
                      "variants": list(variants),
                      "rounds": args.rounds, "warmup": args.warmup, "size": args.size,
                      "busy_host": args.busy_host, "cpus": cpus, "calibration": calibration,
                      "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        order = [v for v in CYCLE if v in variants]
        walls: list[float] = []
        number = 0
        while args.pool is None or number < args.pool:
            estimate = statistics.median(walls) if walls else calibration["wall"]
            if time.perf_counter() + estimate > deadline:
                break
            variant = order[number % len(order)]
            number += 1
            answer = start(forked, {**base, "variant": variant, "number": number,
                                    "sizes": calibration["sizes"]})
            walls.append(answer["wall"])
            answer.pop("ok", None)
            _append(out, {"session": number, **answer})
            if number % 7 == 0:
                print(f"  {number} sessions ({time.perf_counter() - started:.0f} s, "
                      f"{statistics.median(walls):.1f} s a session)", flush=True)
    finally:
        for process in busy:
            process.terminate()
            process.join(5)
        folder.cleanup()
    print(f"{number} sessions in {time.perf_counter() - started:.0f} s", flush=True)
    return replay(out, args)


# -- the trials (offline) ------------------------------------------------------------------------


def load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's description and its sessions (a ``.gz`` file is read as gzip: the recorded
    H200 run in tests/facts is kept so); a line cut short at the end (a run stopped mid-write)
    is left out."""
    if path.suffix == ".gz":
        lines = gzip.decompress(path.read_bytes()).decode("utf-8").splitlines()
    else:
        lines = path.read_text(encoding="utf-8").splitlines()
    meta = json.loads(lines[0])
    if meta.get("kind") != KIND:
        raise ValueError(f"{path} is not a file of regression_power.py --injections")
    sessions = []
    for line in lines[1:]:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "results" in entry:
            sessions.append(entry)
    return meta, sessions


def pooled(sessions: list[dict[str, Any]], folder: Path) -> dict[str, dict[str, Any]]:
    """The sessions saved in a fresh store as ``compare`` would read them: per variant, per
    step, the records of its sessions, read back from the store."""
    found: dict[str, dict[str, Any]] = {}
    with open_store(folder / "pooled.sqlite") as store:
        for entry in sessions:
            records = [ResultRecord(**record) for record in entry["results"].values()]
            run_id = store.save_run(f"{entry['variant']}/{entry['session']:03d}",
                                    records[0].fingerprint, records[0].fingerprint_hash, None,
                                    records)
            for nodeid, record in store.results(run_id).items():
                step = nodeid.rsplit("::", 1)[-1]
                found.setdefault(step, {}).setdefault(entry["variant"], []).append(record)
    return found


def _gate(args: argparse.Namespace) -> GateSettings:
    spec = parse_spec(args.regression)
    return GateSettings(spec.thresholds, alpha=args.alpha, auto=spec.auto, off=spec.off)


def _summary(records: list[ResultRecord], metric: str) -> list[float]:
    return [v for v in (session_value(r, metric)[0] for r in records) if v is not None]


def _change(before: list[float], after: list[float]) -> float | None:
    if not before or not after or min(before + after) <= 0:
        return None
    return statistics.geometric_mean(after) / statistics.geometric_mean(before) - 1


def _named(rows: list[Any], variant: str, kind: str | None) -> bool:
    expected = injections.EXPECTED[variant]
    if any(r.verdict == "regression" and r.metric in expected for r in rows):
        return True
    calls = injections.CALLS.get(variant, ())
    if any(r.verdict == "regression" and any(c in r.reason for c in calls) for r in rows):
        return True
    if kind == "gpu":  # counters not gated: the time's reason names what changed
        words = [counters.WORDS[m][1] for m in expected] + [counters.WORDS[m][0]
                                                            for m in expected]
        return any(r.verdict == "regression" and any(w in r.reason for w in words)
                   for r in rows)
    return False


def trials(pool: dict[str, list[ResultRecord]], variant: str, n: int, count: int, seed: int,
           gate: GateSettings) -> list[dict[str, Any]]:
    rng = random.Random(f"{seed}/{variant}")
    unchanged = pool["unchanged"]
    rows = []
    for _ in range(count):
        if variant == "unchanged":
            drawn = rng.sample(unchanged, 2 * n)
            base, current = drawn[:n], drawn[n:]
        else:
            base, current = rng.sample(unchanged, n), rng.sample(pool[variant], n)
        found = compare_test(base[0].nodeid, base, current, gate)
        kind = counters.bound_of(current[-1])
        rows.append({
            "caught": any(r.verdict == "regression" for r in found),
            "alarm": any(r.verdict in ("regression", "improvement") for r in found),
            "named": variant != "unchanged" and _named(found, variant, kind),
            "by": sorted({r.metric for r in found if r.verdict in ("regression",
                                                                      "improvement")}),
            "cannot_tell": sorted({r.metric for r in found if r.verdict == "cannot_tell"}),
            "reasons": {r.metric: r.reason for r in found if r.verdict == "regression"}})
    return rows


def replay(path: Path, args: argparse.Namespace) -> int:
    meta, sessions = load(path)
    gate = _gate(args)
    n, count = args.sessions, args.trials
    print(f"injection power: {len(sessions)} sessions of {path} ({meta['device']}, "
          f"{meta['rounds']} timed steps, {meta['busy_host']} busy process(es), started "
          f"{meta.get('started', '?')}); trials of {n} sessions a side under "
          f"--regression {args.regression!r}, alpha {args.alpha:g}, as compare decides",
          flush=True)
    report: dict[str, Any] = {"file": str(path), "meta": meta, "sessions": len(sessions),
                              "regression": args.regression, "sessions_a_side": n,
                              "trials": count, "steps": {}}
    with tempfile.TemporaryDirectory(prefix="gputrain-injections-") as folder:
        pools = pooled(sessions, Path(folder))
    results = []
    for step in meta.get("steps", STEPS):
        pool = pools.get(step, {})
        figures = summarise(step, pool, meta, args, gate)
        report["steps"][step] = figures
        results.append(figures["result"])
    overall = "PASS" if all(r == "PASS" for r in results) else "MISS"
    print(f"\noverall: {overall}")
    report["result"] = overall
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _host_spread(records: list[ResultRecord], metric: str) -> dict[str, Any] | None:
    values = _summary(records, metric)
    if len(values) < 2:
        return None
    spread = pooled_spread([values])
    return {"sessions": len(values), "min": min(values), "max": max(values),
            "spread": spread.sd}


def summarise(step: str, pool: dict[str, list[ResultRecord]], meta: dict[str, Any],
              args: argparse.Namespace, gate: GateSettings) -> dict[str, Any]:
    device = "cpu" if meta["device"] == "cpu" else "cuda"
    n, count = args.sessions, args.trials
    print(f"\n== {DESCRIPTIONS[(step, device)]} ==")
    unchanged = pool.get("unchanged", [])
    figures: dict[str, Any] = {"description": DESCRIPTIONS[(step, device)], "variants": {},
                               "result": "MISS"}
    if len(unchanged) < 2 * n:
        print(f"MISS: {len(unchanged)} unchanged sessions; a false-alarm trial needs {2 * n}")
        return figures
    kinds = [counters.bound_of(r) for r in unchanged]
    kind = max(set(kinds), key=kinds.count)
    figures["bound"] = kind
    spreads = {metric: _host_spread(unchanged, metric)
               for metric in ("step_time", "gpu_time", "host_cpu", "instructions", "bytecodes")}
    figures["spreads"] = spreads
    print(f"judged {policy.KIND_WORDS.get(kind)} in {kinds.count(kind)} of {len(kinds)} "
          "unchanged sessions "
          f"({(counters.counters_of(unchanged[-1]).get('bound') or {}).get('why', '')})")
    for metric, found in spreads.items():
        if found is None:
            reason = (counters.counters_of(unchanged[-1]).get("unavailable") or {}).get(metric)
            print(f"  {metric}: not measured" + (f" ({reason})" if reason else ""))
            continue
        low, high = found["min"], found["max"]
        shown = (f"{counters.amount(metric, low)}-{counters.amount(metric, high)}"
                 if metric in ("instructions", "bytecodes") else
                 f"{low * 1e3:.3f}-{high * 1e3:.3f} ms")
        print(f"  {metric} per step over {found['sessions']} unchanged sessions: {shown}, "
              f"spread between sessions {found['spread'] * 100:.2f} %")
    table = []
    ok = True
    for variant in meta["variants"]:
        records = pool.get(variant, [])
        if variant != "unchanged" and len(records) < n:
            table.append((variant, str(len(records)), injections.WHAT[variant], "–", "–",
                          f"too few sessions (< {n})", "–", "–", "–"))
            ok = False
            continue
        rows = trials(pool, variant, n, count, args.seed, gate)
        caught = sum(r["caught"] for r in rows)
        named = sum(r["named"] for r in rows)
        alarms = sum(r["alarm"] for r in rows)
        by: dict[str, int] = {}
        for r in rows:
            for metric in r["by"]:
                by[metric] = by.get(metric, 0) + 1
        step_change = _change(_summary(unchanged, "step_time"), _summary(records, "step_time"))
        gpu_change = _change(_summary(unchanged, "gpu_time"), _summary(records, "gpu_time"))
        host_change = _change(_summary(unchanged, "host_cpu"), _summary(records, "host_cpu"))
        moved = counters.changed(unchanged, records) if variant != "unchanged" else []
        entry = {"sessions": len(records), "what": injections.WHAT[variant],
                 "step_time_change": step_change, "gpu_time_change": gpu_change,
                 "host_cpu_change": host_change, "counters_changed": moved, "caught": caught,
                 "named": named, "false_alarms": alarms, "by": by, "trials": count,
                 "example": next((r["reasons"] for r in rows if r["reasons"]), {})}
        figures["variants"][variant] = entry
        pct = (lambda v: "–" if v is None else f"{v * 100:+.2f} %")  # noqa: E731
        if variant == "unchanged":
            cell = f"{alarms}/{count} false alarms"
            ok = ok and alarms <= math.floor(0.05 * count)
        else:
            cell = f"{caught}/{count} caught, {named}/{count} named"
            # On a GPU-bound step the times are gated, not the counters: an injection that
            # costs it less than the GPU time's threshold is rightly no regression.
            costly = max(step_change or 0, gpu_change or 0) >= policy.BY_KIND["gpu"]["gpu_time"]
            needed = kind != "gpu" or costly
            entry["must_catch"] = needed
            if needed:
                ok = ok and named >= math.ceil(0.95 * count)
        table.append((variant, str(len(records)), injections.WHAT[variant], pct(step_change),
                      pct(gpu_change), pct(host_change), "; ".join(moved)[:70] or "–", cell,
                      ", ".join(f"{m} {c}" for m, c in sorted(by.items())) or "–"))
    print(tabulate(table, headers=("variant", "sessions", "injected", "step time", "GPU time",
                                   "host CPU", "counters changed (per step)", "trials",
                                   "metrics that alarmed"), disable_numparse=True))
    for variant, entry in figures["variants"].items():
        for metric, reason in entry.get("example", {}).items():
            print(f"  e.g. {variant}: {metric}: {reason[:220]}")
    figures["result"] = "PASS" if ok else "MISS"
    print(f"result: {figures['result']} (each injection named in >= 95 % of the trials, on a "
          "GPU-bound step each that costs it 1 % or more; <= 5 % false alarms)")
    return figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--injections")
    group.add_argument("--injections", action="store_true",
                       help="five injected regressions (a kernel per block, a sync, a pageable "
                            "copy, Python work, an allocation per step) into both steps, "
                            "each session both steps; the gate's default policy must catch and "
                            "name each (benchmarks/injection_power.py)")
    group.add_argument("--out", metavar="PATH",
                       help="with --injections: the sessions, one JSON line each, written as "
                            "they finish (default injection-sessions.jsonl)")
    group.add_argument("--size", type=float, default=0.02,
                       help="with --injections: the injections' size where one can be chosen, "
                            "a share of the step's median (0.02)")
    group.add_argument("--busy-host", type=int, default=0, metavar="N",
                       help="with --injections: N busy processes on the sessions' CPUs")
    group.add_argument("--regression", default="auto", metavar="SPEC",
                       help="with --injections: the gate's spec (default auto, the default "
                            "policy)")


def main_injections(args: argparse.Namespace) -> int:
    if args.replay:
        try:
            return replay(Path(args.replay), args)
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            print(f"--replay {args.replay}: not a file of --injections "
                  f"({type(exc).__name__}: {exc})", file=sys.stderr)
            return 2
    args.out = args.out or "injection-sessions.jsonl"
    return run(args)

