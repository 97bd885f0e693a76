"""Plugin start-up cost: `pytest --co` of a generated torch-free suite, with and without the plugin.

    python benchmarks/startup.py [--tests 2000] [--rounds 7]

Prints the median wall time of each variant, their ratio (goal: <= 1.05) and whether torch (or
pydantic) was imported in the plugin's run (goal: neither).
"""

from __future__ import annotations

import argparse
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


def make_suite(root: Path, tests: int, per_file: int = 50) -> None:
    (root / "conftest.py").write_text(CONFTEST)
    (root / "pytest.ini").write_text("[pytest]\n")
    for index in range(0, tests, per_file):
        body = "\n".join(
            f"def test_{index + n}():\n    assert {index + n} >= 0\n" for n in range(per_file)
        )
        (root / f"test_generated_{index // per_file:03d}.py").write_text(body)


def run(root: Path, extra: list[str]) -> tuple[float, str]:
    command = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *extra]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"pytest failed ({' '.join(command)}):\n{result.stdout}{result.stderr}")
    heavy = next((line.split(":", 1)[1].strip() for line in result.stdout.splitlines()
                  if line.startswith("HEAVY-MODULES:")), "?")
    return elapsed, heavy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        make_suite(root, args.tests)
        run(root, [])  # warm the file system and bytecode caches
        run(root, ["-p", "no:gputrain"])
        with_plugin: list[float] = []
        without: list[float] = []
        heavy = "none"
        for _ in range(args.rounds):  # interleaved, so drift hits both variants alike
            elapsed, heavy_here = run(root, [])
            with_plugin.append(elapsed)
            if heavy_here != "none":
                heavy = heavy_here
            without.append(run(root, ["-p", "no:gputrain"])[0])
    median_with, median_without = statistics.median(with_plugin), statistics.median(without)
    ratio = median_with / median_without
    print(f"suite: {args.tests} tests, {args.rounds} interleaved rounds of `pytest --co`")
    print(f"with plugin     median {median_with:.3f} s  (min {min(with_plugin):.3f})")
    print(f"-p no:gputrain  median {median_without:.3f} s  (min {min(without):.3f})")
    print(f"ratio {ratio:.3f} (goal <= 1.05): {'OK' if ratio <= 1.05 else 'TOO SLOW'}")
    print(f"heavy modules imported with the plugin: {heavy} (goal: none)")
    return 0 if ratio <= 1.05 and heavy == "none" else 1


if __name__ == "__main__":
    raise SystemExit(main())
