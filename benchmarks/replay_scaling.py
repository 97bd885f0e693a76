"""Replay time and memory against the size of the facts file: it must grow linearly.

    python benchmarks/replay_scaling.py [--sizes 1000 2000 5000 10000 20000] [--failures]

For each size, a facts file of that many recorded runs (the run of
``tests/facts/run_healthy_h200.json`` under as many test ids; with ``--failures``, each test
failed as well: the run and the failure of ``tests/facts/run_failure_h200.json``, the case where
every failure looks up its run) is replayed by
``python -m pytest_gputrain replay FILE --format json`` in a process of its own; the script
prints the wall time, the time per run and the peak memory (max RSS) of each, then the ratio
of time per run between the largest and the smallest size (goal: close to 1).
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FACTS = Path(__file__).resolve().parent.parent / "tests" / "facts"


def make_facts(path: Path, runs: int, failures: bool) -> None:
    data = json.loads((FACTS / ("run_failure_h200.json" if failures
                                else "run_healthy_h200.json")).read_text())
    templates = {key: data[key][0] for key in ("runs", "failures") if data[key]}
    for key in templates:
        data[key] = []
    for index in range(runs):
        for key, template in templates.items():
            record = copy.deepcopy(template)
            record["nodeid"] = f"tests/test_generated.py::test_train[{index}]"
            data[key].append(record)
    path.write_text(json.dumps(data))


def replay(path: Path) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one replay in a child process."""
    command = [sys.executable, "-m", "pytest_gputrain", "replay", str(path), "--format", "json",
               "--fail-on", "never", "--rootdir", str(path.parent)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False,
                            cwd=path.parent)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"replay failed ({result.returncode}): {result.stderr}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the largest child so far: sizes run smallest first, so a
    # larger file's peak is its own (or ties an earlier one).
    return elapsed, max(peak, before) * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 5000, 10000, 20000])
    parser.add_argument("--failures", action="store_true",
                        help="every test failed too: a failure record beside each run")
    args = parser.parse_args()
    sizes = sorted(args.sizes)
    per_run: list[float] = []
    print("runs and a failure each" if args.failures else "runs")
    print(f"{'runs':>7}  {'file':>9}  {'time':>8}  {'per run':>9}  {'peak RSS':>9}")
    with tempfile.TemporaryDirectory() as folder:
        for size in sizes:
            path = Path(folder) / f"facts-{size}.json"
            make_facts(path, size, args.failures)
            elapsed, peak = replay(path)
            per_run.append(elapsed / size)
            print(f"{size:>7}  {path.stat().st_size / 2**20:>7.1f}MB  {elapsed:>7.2f}s  "
                  f"{elapsed / size * 1000:>7.3f}ms  {peak / 2**20:>7.0f}MB")
            path.unlink()
    ratio = per_run[-1] / per_run[0]
    print(f"time per run, {sizes[-1]} runs against {sizes[0]}: {ratio:.2f}x (linear: about 1; "
          "the interpreter's start-up weighs on the smallest size)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
