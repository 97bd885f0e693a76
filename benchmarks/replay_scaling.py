"""Replay time and memory against the size of its input: every kind of input must scale linearly.

    python benchmarks/replay_scaling.py [--cases runs findings failures devices strings]
                                        [--quick]

Each case replays generated facts files of growing size, each with
``python -m pytest_gputrain replay FILE`` in a process of its own (``COLUMNS=80``):

- ``runs``: runs without findings (the run of ``tests/facts/run_healthy_h200.json`` under as
  many test ids), 1,000 / 5,000 / 20,000 runs, JSON report;
- ``findings``: the same runs, each with a finding (GT118's stalls), JSON report;
- ``failures``: each test failed too, a failure with a finding (GT216, a CPU-only build) that
  looks up its run, beside each run, JSON report;
- ``devices``: one machine with 1,000 / 10,000 / 100,000 GPUs (the H200 of
  ``tests/facts/h200_healthy.json``), the terminal view (a header line per GPU);
- ``strings``: one string of 10 KB / 100 KB / 1 MB where the terminal shows it: a rule's title
  (a rule of its own in a ``--rules-dir``) and a run's test id, the terminal view.

Each file is replayed ``--rounds`` times (default 2) and the fastest counts. It prints, for
each size, the CPU time of the replay process (user + system: it moves far less than wall time
when other processes share the machine), its wall time and peak memory (VmHWM), the CPU time
per item with the start-up taken out (the CPU time of replaying the one-record base file), and
last how the CPU time grew against the size, and the ratio of the time per item between the
largest and the smallest size: about 1 is linear, more is worse, less means the per-item cost
falls (a capped string). The first lines state the machine, the date and the version measured,
and the load average before and after (another process's load still slows the CPU time a
little: caches and memory bandwidth are shared).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FACTS = ROOT / "tests" / "facts"
STALLS = {"threshold": 0.1, "steps": 8, "explained": 0, "time": 15.8, "time_percent": 80.3,
          "longest": 2.1, "step_numbers": [25, 50, 75, 100, 125, 150, 175, 200], "every": 25}
LONG_TITLE_RULE = '''code = "GT901"
name = "long-title"
title = "{title}"
scope = "session"
severity = "info"
condition = "true"
message = "A rule whose title is {size} characters long."
fix = "Nothing to fix."
why = "Measures how the terminal view grows with the length of a title."
'''


def _base(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((FACTS / name).read_text(encoding="utf-8"))
    return data


def _runs(path: Path, count: int, finding: bool, failure: bool) -> list[str]:
    data = _base("run_failure_h200.json" if failure else "run_healthy_h200.json")
    run = data["runs"][0]  # type: ignore[index]
    if finding:
        run["stalls"] = STALLS
    fail = dict(data["failures"][0]) if failure else None  # type: ignore[index]
    if fail is not None:
        fail.update(kind="cuda_unavailable", cuda_unavailable_cause="cpu_only_build",
                    message="Torch not compiled with CUDA enabled")
    runs, failures = [], []
    for index in range(count):
        nodeid = f"tests/test_generated.py::test_train[{index}]"
        runs.append({**copy.deepcopy(run), "nodeid": nodeid})
        if fail is not None:
            failures.append({**fail, "nodeid": nodeid})
    data["runs"], data["failures"] = runs, failures
    path.write_text(json.dumps(data), encoding="utf-8")
    return ["--format", "json"]


def _devices(path: Path, count: int) -> list[str]:
    data = _base("h200_healthy.json")
    environment = data["environment"]
    device = environment["devices"][0]  # type: ignore[index]
    environment["devices"] = [  # type: ignore[index]
        {**copy.deepcopy(device), "index": index, "uuid": f"GPU-{index:08d}"}
        for index in range(count)]
    environment["nvml"]["device_count"] = count  # type: ignore[index]
    path.write_text(json.dumps(data), encoding="utf-8")
    return ["--format", "text"]


def _strings(path: Path, length: int) -> list[str]:
    data = _base("run_healthy_h200.json")
    run = data["runs"][0]  # type: ignore[index]
    run["stalls"] = STALLS  # a finding whose subject is the long test id
    run["nodeid"] = "tests/test_long.py::test_" + "x" * length
    path.write_text(json.dumps(data), encoding="utf-8")
    rules = path.parent / f"rules-{length}"
    rules.mkdir(exist_ok=True)
    (rules / "GT901-long-title.toml").write_text(
        LONG_TITLE_RULE.format(title="T" * length, size=length), encoding="utf-8")
    return ["--format", "text", "--rules-dir", str(rules)]


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    unit: str
    sizes: tuple[int, ...]
    quick: tuple[int, ...]
    make: Callable[[Path, int], list[str]]


CASES = (
    Case("runs", "runs without findings (JSON report)", "run", (1000, 5000, 20000),
         (200, 1000), lambda path, n: _runs(path, n, finding=False, failure=False)),
    Case("findings", "runs with a finding each (GT118; JSON report)", "run",
         (1000, 5000, 20000), (200, 1000),
         lambda path, n: _runs(path, n, finding=True, failure=False)),
    Case("failures", "failed tests: a run and a failure with a finding (GT216) each (JSON report)",
         "test", (1000, 5000, 20000), (200, 1000),
         lambda path, n: _runs(path, n, finding=True, failure=True)),
    Case("devices", "GPUs of one machine (terminal view)", "GPU", (1000, 10000, 100000),
         (1000, 5000), _devices),
    Case("strings", "a rule title and a test id of n characters (terminal view)", "KB",
         (10_000, 100_000, 1_000_000), (10_000, 100_000), _strings),
)


@dataclass(frozen=True)
class Measure:
    cpu: float  # seconds, user + system
    wall: float
    peak: int  # bytes
    error: str = ""  # what a refused file was told


# `python -m pytest_gputrain`, saying its own peak memory as it exits. Linux carries a parent's
# resident size at fork into the child's ru_maxrss (this script holds the facts it generated),
# so the peak is the child's VmHWM, which starts anew with the program it runs.
_PEAK = "gputrain-peak-kB"
_REPLAY = f"""
import atexit, runpy, sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            sys.stderr.write("\\n{_PEAK} " + line.split()[1] + "\\n")
atexit.register(peak)
sys.argv = ["pytest_gputrain", *sys.argv[1:]]
runpy.run_module("pytest_gputrain", run_name="__main__", alter_sys=True)
"""


def replay(path: Path, arguments: list[str], codes: tuple[int, ...] = (0,),
           root: Path = ROOT) -> Measure:
    """One replay in a child process: its CPU time (its own resource usage), wall time and
    peak resident memory. ``codes``: the exit statuses it may end with (a refused file's is
    2); ``root``: the checkout whose code replays."""
    command = [sys.executable, "-c", _REPLAY, "replay", str(path), "--fail-on", "never",
               "--rootdir", str(path.parent), *arguments]
    environment = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(root)}
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             cwd=path.parent, env=environment)
    assert child.stderr is not None
    error = child.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    peak = [line.split()[1] for line in error.splitlines() if line.startswith(_PEAK)]
    if child.returncode not in codes or not (peak or child.returncode < 0):
        raise SystemExit(f"replay failed ({child.returncode}): {error}")
    said = [line for line in error.splitlines() if line.startswith("pytest_gputrain: error")]
    if child.returncode < 0:  # killed (by the kernel, out of memory): its peak is unknown
        said = [f"killed by signal {-child.returncode}"]
    return Measure(usage.ru_utime + usage.ru_stime, wall, int(peak[-1]) * 1024 if peak else 0,
                   said[0] if said else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def describe_machine() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from pytest_gputrain import __version__

    return [
        f"pytest-gputrain {__version__}, Python {platform.python_version()}, "
        f"{datetime.date.today().isoformat()}",
        f"machine: {cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} "
        f"{platform.release()}; load average {os.getloadavg()[0]:.1f}",
    ]


def best(path: Path, arguments: list[str], rounds: int) -> Measure:
    """The fastest of ``rounds`` replays (a busy machine only ever adds time), and the
    largest peak memory."""
    measures = [replay(path, arguments) for _ in range(rounds)]
    return Measure(min(m.cpu for m in measures), min(m.wall for m in measures),
                   max(m.peak for m in measures))


def run_case(case: Case, sizes: tuple[int, ...], folder: Path, rounds: int) -> None:
    print(f"\n{case.name}: {case.what}")
    base = folder / f"{case.name}-base.json"
    baseline = best(base, case.make(base, 1), rounds).cpu
    per_item: list[float] = []
    scale = 1000 if case.unit == "KB" else 1
    print(f"{'size':>9}  {'file':>8}  {'CPU':>8}  {'wall':>8}  {'peak RSS':>8}  "
          f"{'CPU per ' + case.unit:>14}")
    for size in sizes:
        path = folder / f"{case.name}-{size}.json"
        arguments = case.make(path, size)
        measure = best(path, arguments, rounds)
        items = size / scale
        per_item.append(max(measure.cpu - baseline, 0.0) / items)
        print(f"{size:>9,}  {path.stat().st_size / 2**20:>6.1f}MB  {measure.cpu:>7.2f}s  "
              f"{measure.wall:>7.2f}s  {measure.peak / 2**20:>6.0f}MB  "
              f"{per_item[-1] * 1000:>11.3f} ms")
        path.unlink()
    growth = (per_item[-1] * sizes[-1]) / (per_item[0] * sizes[0]) if per_item[0] > 0 else None
    ratio = f"{per_item[-1] / per_item[0]:.2f}x" if per_item[0] > 0 else "n/a (no time to take)"
    print(f"start-up ({baseline:.2f} s CPU) taken out: {sizes[-1] // sizes[0]}x the size took "
          + (f"{growth:.1f}x the CPU time" if growth is not None else "no measurable time")
          + f"; CPU per {case.unit} {ratio} (linear: about 1)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=[case.name for case in CASES],
                        default=[case.name for case in CASES])
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="replays of each file; the fastest counts (default 2)")
    args = parser.parse_args()
    for line in describe_machine():
        print(line)
    with tempfile.TemporaryDirectory() as folder:
        for case in CASES:
            if case.name in args.cases:
                run_case(case, case.quick if args.quick else case.sizes, Path(folder),
                         max(1, args.rounds))
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
