"""Plugin start-up cost: `pytest --co -q` of a generated torch-free suite, with and without the
plugin.

    python benchmarks/startup.py [--tests 2000] [--pairs 15] [--bytecode cached|none|inherit]
                                 [--instructions]

Measured as a user feels it: whole processes, each `python -m pytest --co -q` started from
scratch in a folder of trivial tests with a `pytest.ini`, pytest's cache on. Runs come in
pairs, one with the plugin and one with `-p no:gputrain`, the order alternating from pair to
pair (so that a drift of the machine's speed, or a cache warmed by the first of a pair, favours
neither side); each pair gives a ratio of CPU time (user + system, the child's own) and one of
wall time, and the result is the median of each with its quartiles. The goal is on CPU time
(<= 1.05), which other processes on a small machine disturb less than the wall time: the load
average is printed before and after, and a run under heavy load is worth repeating.

Bytecode, which decides how much of a module's cost is its source (two untimed runs, one each
way, come first in every mode):

- ``cached`` (the default, as in a usual install): the processes share a bytecode cache of
  their own (``PYTHONPYCACHEPREFIX``, a new folder), which the untimed runs fill; pytest's
  rewritten test and plugin modules are cached there too;
- ``none``: every process starts from an empty cache it may not write to
  (``PYTHONDONTWRITEBYTECODE`` as well): everything imported is compiled anew, as in a
  read-only install;
- ``inherit``: as the calling environment has it. With ``PYTHONDONTWRITEBYTECODE=1`` set, the
  installed packages' cached bytecode is read but pytest rewrites and compiles the plugin's
  modules (and the tests) anew each run: the case ``tests/test_startup.py`` holds to a budget.

``--instructions`` also counts the instructions of one run each way under valgrind's callgrind:
a figure other processes do not disturb (about fifty times slower than a run).

Also checked, in one more run: neither torch nor pydantic nor pynvml is imported by the
plugin's run (goal: none of them).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import pytest_gputrain

WITHOUT = ["-p", "no:gputrain"]
GOAL = 1.05
# A plugin module for the one run that looks at what the plugin imported.
HEAVY_CHECK = '''
import sys

def pytest_sessionfinish(session):
    heavy = [name for name in ("torch", "pydantic", "pynvml") if name in sys.modules]
    print("HEAVY-MODULES:", ",".join(heavy) or "none")
    print("PLUGIN-FILE:", getattr(sys.modules.get("pytest_gputrain"), "__file__", "not loaded"))
'''


def make_suite(root: Path, tests: int, per_file: int = 50) -> None:
    (root / "pytest.ini").write_text("[pytest]\n")
    for index in range(0, tests, per_file):
        count = min(per_file, tests - index)
        body = "\n".join(f"def test_{index + n}():\n    assert {index + n} >= 0\n"
                         for n in range(count))
        (root / f"test_generated_{index // per_file:03d}.py").write_text(body)


def run(root: Path, extra: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system) and the output of one whole process."""
    command = [sys.executable, "-m", "pytest", "--co", "-q", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False,
                            env=env)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if result.returncode != 0:
        raise SystemExit(f"pytest failed ({' '.join(command)}):\n{result.stdout}{result.stderr}")
    return elapsed, cpu, result.stdout


def environment(bytecode: str, folder: Path) -> dict[str, str]:
    """The processes' environment for the ``--bytecode`` mode (see the module's text)."""
    env = dict(os.environ)
    if bytecode == "inherit":
        return env
    cache = folder / "bytecode"
    cache.mkdir()
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    if bytecode == "none":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def instructions(root: Path, extra: list[str], env: dict[str, str]) -> int:
    """The instructions one whole ``pytest --co -q`` process executes (valgrind's callgrind)."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
               "-m", "pytest", "--co", "-q", *extra]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False,
                            env=env)
    found = re.search(r"Collected\s*:\s*(\d+)", result.stderr)
    if result.returncode != 0 or found is None:
        raise SystemExit(f"valgrind failed ({' '.join(command)}):\n{result.stderr[-2000:]}")
    return int(found.group(1))


def heavy_modules(root: Path, env: dict[str, str]) -> tuple[str, str]:
    """The heavy modules the plugin's run imported, and the plugin's file it loaded."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "gputrain_heavy_check.py").write_text(HEAVY_CHECK)
        path = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH", "")) if p)
        _, _, out = run(root, ["-p", "gputrain_heavy_check"], {**env, "PYTHONPATH": path})
    found = dict(line.split(": ", 1) for line in out.splitlines()
                 if line.startswith(("HEAVY-MODULES: ", "PLUGIN-FILE: ")))
    return found.get("HEAVY-MODULES", "?"), found.get("PLUGIN-FILE", "?")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cores() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    total = os.cpu_count()
    return f"{usable} usable of {total}" if usable not in (None, total) else f"{total}"


def load() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def commit() -> str:
    """The plugin's commit, where it is imported from a git checkout."""
    where = Path(pytest_gputrain.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" with uncommitted changes" if dirty else "")


def spread(ratios: list[float]) -> str:
    """Median and quartiles of the pairs' ratios."""
    middle = statistics.median(ratios)
    low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [middle] * 3
    return f"{middle:.3f} (quartiles {low:.3f}-{high:.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=int, default=2000)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--instructions", action="store_true",
                        help="also count one run's instructions each way under valgrind")
    parser.add_argument("--bytecode", choices=("cached", "none", "inherit"), default="cached",
                        help="cached (default): a bytecode cache of the benchmark's own, warmed "
                        "first; none: every module compiled anew in every run; inherit: as "
                        "this environment has it")
    args = parser.parse_args()
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions needs valgrind on the PATH")
    now = datetime.datetime.now(datetime.timezone.utc)
    print(f"date: {now:%Y-%m-%d %H:%M} UTC")
    print(f"machine: {cpu_model()}, {cores()} cores; Python {platform.python_version()}, "
          f"pytest {pytest.__version__}")
    print(f"pytest-gputrain {pytest_gputrain.__version__}, commit {commit()}")
    print(f"load average before: {load()}")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "suite"
        root.mkdir()
        make_suite(root, args.tests)
        env = environment(args.bytecode, Path(folder))
        heavy, plugin_file = heavy_modules(root, env)
        run(root, [], env)  # warm the file system and bytecode caches, both ways
        run(root, WITHOUT, env)
        walls: dict[bool, list[float]] = {True: [], False: []}  # with the plugin: True
        cpus: dict[bool, list[float]] = {True: [], False: []}
        for pair in range(args.pairs):
            for with_plugin in ((True, False) if pair % 2 == 0 else (False, True)):
                wall, cpu, _ = run(root, [] if with_plugin else WITHOUT, env)
                walls[with_plugin].append(wall)
                cpus[with_plugin].append(cpu)
        counted = ((instructions(root, [], env), instructions(root, WITHOUT, env))
                   if args.instructions else None)
    cpu_ratios = [a / b for a, b in zip(cpus[True], cpus[False], strict=True)]
    wall_ratios = [a / b for a, b in zip(walls[True], walls[False], strict=True)]
    cpu_ratio = statistics.median(cpu_ratios)
    caches = f"bytecode: {args.bytecode}" + (
        f" (PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE')!r})"
        if args.bytecode == "inherit" else "")
    print(f"plugin loaded from: {plugin_file}")
    print(f"suite: {args.tests} tests; {args.pairs} pairs of whole `pytest --co -q` processes, "
          f"the order alternating; {caches}")
    for label, side in (("with plugin   ", True), ("-p no:gputrain", False)):
        print(f"{label}  CPU median {statistics.median(cpus[side]):.3f} s, wall median "
              f"{statistics.median(walls[side]):.3f} s (min {min(walls[side]):.3f} s)")
    print(f"CPU time (user + system), median of the pairs' ratios {spread(cpu_ratios)}; "
          f"goal <= {GOAL}: {'OK' if cpu_ratio <= GOAL else 'TOO SLOW'}")
    print(f"wall time, median of the pairs' ratios {spread(wall_ratios)} (more disturbed by "
          "other processes)")
    if counted is not None:
        print(f"instructions of one run (callgrind): {counted[0]:,} / {counted[1]:,} = "
              f"{counted[0] / counted[1]:.3f}")
    print(f"heavy modules imported with the plugin: {heavy} (goal: none)")
    print(f"load average after: {load()}")
    return 0 if cpu_ratio <= GOAL and heavy == "none" else 1


if __name__ == "__main__":
    raise SystemExit(main())
