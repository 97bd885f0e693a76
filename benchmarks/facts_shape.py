"""What a hostile facts file costs ``replay``: the files the shape check refuses before parsing,
and the worst ones it lets through to the parse.

    python benchmarks/facts_shape.py [--size-mb 200] [--files NAME ...]
                                    [--before PATH_TO_AN_OLDER_CHECKOUT]

Each file is replayed by ``python -m pytest_gputrain replay FILE`` in a process of its own
(``replay_scaling.replay``), and the script prints its CPU time (user + system), wall time,
peak resident memory (VmHWM) and what it was told. The files, each ``--size-mb`` large (the
issue's was 200 MB; the input limit is 256 MiB):

- ``nested arrays``: ``[[],[],...]``, the file of issue 29 (43 s and 4.6 GB before);
- ``nested arrays, facts-shaped``: the same under a top-level object that names the facts kind;
- ``densest numbers let through``: a facts-shaped file at the check's density limit (one array
  per 32 bytes), each array of floats, the most memory per byte a parse can take (each float a
  Python object of 24 bytes and a pointer of 8, for 4 bytes of text);
- ``densest objects let through``: the same with objects of five keys.

A real facts file takes about five times its size (README, replay's memory). With
``--before PATH``, each file is also replayed by the code of that checkout (say, a worktree of
an older commit), for the figures before the check; before it, a file of nested arrays under a
facts-shaped top level grows past several GB and is killed by the kernel, so run that one
where nothing else needs the memory (a killed replay is reported as such, its peak unknown).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_scaling import FACTS, Measure, describe_machine, replay

KIND = '"kind": "pytest-gputrain-facts", "schema_version": 1'


def _environment() -> str:
    return json.dumps(json.loads((FACTS / "cpu_laptop.json").read_text())["environment"])


def _repeat(unit: str, size: int) -> str:
    """``unit`` joined by commas to about ``size`` bytes."""
    return ",".join([unit] * max(1, size // (len(unit) + 1)))


def nested(size: int) -> str:
    return "[" + _repeat("[]", size) + "]"


def nested_facts(size: int) -> str:
    return "{" + KIND + ', "runs": [' + _repeat("[]", size) + "]}"


def numbers(size: int) -> str:
    record = '{"x":[' + ",".join(["1e1"] * 15) + "]}"  # 2 containers in 68 bytes, commas in
    return ("{" + KIND + f', "environment": {_environment()}, "runs": ['
            + _repeat(record, size) + "]}")


def objects(size: int) -> str:
    record = '{"a":0,"b":0,"c":0,"d":0,"e":0}'  # 1 container in 32 bytes, its comma in
    return ("{" + KIND + f', "environment": {_environment()}, "runs": ['
            + _repeat(record, size) + "]}")


FILES: dict[str, Callable[[int], str]] = {
    "nested arrays": nested,
    "nested arrays, facts-shaped": nested_facts,
    "densest numbers let through": numbers,
    "densest objects let through": objects,
}


def _row(name: str, size: int, measure: Measure) -> str:
    told = measure.error.removeprefix("pytest_gputrain: error: ")
    told = told.split(": ", 1)[1] if ": " in told else told or "replayed"
    peak = (f"peak {measure.peak / 1e9:5.2f} GB ({measure.peak / size:4.1f}x the file)"
            if measure.peak else "peak unknown")
    return (f"  {name:<30} {size / 1e6:6.0f} MB  CPU {measure.cpu:6.1f} s  wall "
            f"{measure.wall:6.1f} s  {peak}: {told[:100]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=200.0)
    parser.add_argument("--before", type=Path, help="a checkout whose code replays the files "
                        "too, for the figures before the check")
    parser.add_argument("--files", nargs="+", choices=list(FILES), default=list(FILES))
    args = parser.parse_args()
    size = int(args.size_mb * 1e6)
    for line in describe_machine():
        print(line)
    with tempfile.TemporaryDirectory() as folder:
        for name in args.files:
            path = Path(folder) / "facts.json"
            path.write_text(FILES[name](size), encoding="utf-8")
            written = path.stat().st_size
            print(_row(name, written, replay(path, [], codes=(0, 1, 2))), flush=True)
            if args.before is not None:
                before = replay(path, [], codes=(0, 1, 2, -9), root=args.before.resolve())
                print(_row("  (before)", written, before), flush=True)
            path.unlink()
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
