"""Plugin start-up cost: `pytest --co` of a generated torch-free suite, with and without the plugin.

    python benchmarks/startup.py [--tests 2000] [--pairs 15]

Measured as a user feels it: whole processes, each `pytest --co -q` started from scratch. Runs
come in pairs, one with the plugin and one with `-p no:gputrain`, the order alternating from
pair to pair (so that a drift of the machine's speed, or a cache warmed by the first of a pair,
favours neither side); each pair gives a ratio, and the result is the median of the ratios
(goal: <= 1.05). Other processes on a small machine disturb single runs: the load average is
printed before and after, a run under heavy load is worth repeating, and the median ratio of
CPU time (user + system) is printed beside it, less disturbed by other processes. Also checked:
neither torch nor pydantic is imported in the plugin's run (goal: neither).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFTEST = '''
import sys

def pytest_sessionfinish(session):
    heavy = [name for name in ("torch", "pydantic", "pynvml") if name in sys.modules]
    print("HEAVY-MODULES:", ",".join(heavy) or "none")
'''
WITHOUT = ["-p", "no:gputrain"]


def make_suite(root: Path, tests: int, per_file: int = 50) -> None:
    (root / "conftest.py").write_text(CONFTEST)
    (root / "pytest.ini").write_text("[pytest]\n")
    for index in range(0, tests, per_file):
        body = "\n".join(
            f"def test_{index + n}():\n    assert {index + n} >= 0\n" for n in range(per_file)
        )
        (root / f"test_generated_{index // per_file:03d}.py").write_text(body)


def run(root: Path, extra: list[str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system) and the heavy modules of one whole process."""
    command = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if result.returncode != 0:
        raise SystemExit(f"pytest failed ({' '.join(command)}):\n{result.stdout}{result.stderr}")
    heavy = next((line.split(":", 1)[1].strip() for line in result.stdout.splitlines()
                  if line.startswith("HEAVY-MODULES:")), "?")
    return elapsed, cpu, heavy


def load() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tests", type=int, default=2000)
    parser.add_argument("--pairs", type=int, default=15)
    args = parser.parse_args()
    print(f"load average before: {load()} ({os.cpu_count()} CPUs)")
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    with_plugin: list[float] = []
    without: list[float] = []
    heavy = "none"
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        make_suite(root, args.tests)
        run(root, [])  # warm the file system and bytecode caches, both ways
        run(root, WITHOUT)
        for pair in range(args.pairs):
            order = [[], WITHOUT] if pair % 2 == 0 else [WITHOUT, []]
            times, cpus = {}, {}
            for extra in order:
                elapsed, cpu, heavy_here = run(root, extra)
                times[bool(extra)], cpus[bool(extra)] = elapsed, cpu
                if not extra and heavy_here != "none":
                    heavy = heavy_here
            with_plugin.append(times[False])
            without.append(times[True])
            ratios.append(times[False] / times[True])
            cpu_ratios.append(cpus[False] / cpus[True])
    ratio = statistics.median(ratios)
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratio] * 3
    print(f"suite: {args.tests} tests; {args.pairs} pairs of whole `pytest --co` processes, "
          "the order alternating")
    print(f"with plugin     median {statistics.median(with_plugin):.3f} s  "
          f"(min {min(with_plugin):.3f})")
    print(f"-p no:gputrain  median {statistics.median(without):.3f} s  (min {min(without):.3f})")
    print(f"median of the pairs' ratios {ratio:.3f} (quartiles {quartiles[0]:.3f}-"
          f"{quartiles[2]:.3f}; goal <= 1.05): {'OK' if ratio <= 1.05 else 'TOO SLOW'}")
    cpu_ratio = statistics.median(cpu_ratios)
    print(f"CPU time (user + system), median of the pairs' ratios {cpu_ratio:.3f}"
          " (less disturbed by other processes than the wall time)")
    print(f"heavy modules imported with the plugin: {heavy} (goal: none)")
    print(f"load average after: {load()}")
    return 0 if ratio <= 1.05 and heavy == "none" else 1


if __name__ == "__main__":
    raise SystemExit(main())
