"""The README's sample outputs, printed by the tool itself and written into README.md.

    python docs/sample_outputs.py [--only main-job|hidden-gpus] [--check]

Each sample sits in README.md between ``<!-- sample:NAME -->`` and ``<!-- /sample:NAME -->``,
a caption (the date, the commit, the machine and the command) and a fenced block:

- ``main-job``: the README's main job, ``pytest --gpu-diagnose sample_projects/
  product_classifier``, run here on an 80-column terminal (``COLUMNS=80``); the header, the
  collection line and the whole summary, with the progress lines and the middle of the runs
  table elided (``…``). It trains for a minute or two on a CPU; the caption gives the load
  average, since other jobs on the machine lengthen the run.
- ``hidden-gpus``: ``replay`` of the facts recorded on two NVIDIA H200s with
  ``CUDA_VISIBLE_DEVICES=""`` (``tests/facts/h200x2_hidden_recorded.json``), as this version
  prints them; the caption names the commit that recorded the facts.

``--check`` writes nothing: it prints each sample and exits 1 where the README's differs in
form from it (``same_form``: figures masked, spacing ignored, and lines the run printed beyond
the README's allowed, such as a finding about a busy host), so a layout that changed is caught.
``tests/test_readme_samples.py`` checks the replayed sample at every run and the main job's
with the slow tests.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
WIDTH = 80
MAIN_JOB = ("pytest", "--gpu-diagnose", "sample_projects/product_classifier")
HIDDEN_FACTS = "tests/facts/h200x2_hidden_recorded.json"
ELLIPSIS = "…"
_FIGURE = re.compile(r"\d+(?:[.,:]\d+)*")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def commit() -> str:
    """HEAD, and whether the code differs from it (the sample then shows that code)."""
    head = git("rev-parse", "--short=7", "HEAD")
    changed = git("status", "--porcelain", "--", "pytest_gputrain", "rules", "sample_projects")
    return f"commit {head}" + (" with uncommitted changes" if changed else "")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    shown = f", load average {load:.1f}" if load is not None else ""
    return f"a {os.cpu_count()}-core machine ({cpu}{shown})"


def run(command: Sequence[str]) -> str:
    env = {**os.environ, "COLUMNS": str(WIDTH)}
    env.pop("PYTEST_ADDOPTS", None)
    result = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, env=env,
                            capture_output=True, text=True, check=False)
    return result.stdout


def main_job_excerpt(output: str) -> list[str]:
    """The header's gputrain lines, the collection line and the whole summary; the progress
    lines and all but the first and last test of the runs table elided."""
    lines = output.rstrip("\n").splitlines()
    header = [line for line in lines[:lines.index(next(
        line for line in lines if line.startswith("collected")))]
        if line.startswith(("gputrain:", " " * 12))]
    collected = next(line for line in lines if line.startswith("collected"))
    start = next(index for index, line in enumerate(lines)
                 if line.startswith("gputrain: ") and index > lines.index(collected))
    return [*header, collected, ELLIPSIS, *_runs_trimmed(lines[start:])]


def _runs_trimmed(lines: list[str]) -> list[str]:
    """The runs table with its first and last test only."""
    try:
        top = next(index for index, line in enumerate(lines) if "run(s) probed" in line)
    except StopIteration:
        return lines
    end = next((index for index in range(top + 1, len(lines))
                if lines[index].startswith("=") or not lines[index].strip()), len(lines))
    table = lines[top:end]
    rule = next((index for index, line in enumerate(table) if line.lstrip().startswith("---")),
                None)
    if rule is None:
        return lines
    entries: list[list[str]] = []  # each test: its id's lines, then its row (indented)
    current: list[str] = []
    for line in table[rule + 1:]:
        current.append(line)
        if line.startswith(" "):
            entries.append(current)
            current = []
    if len(entries) <= 2 or current:
        return lines
    kept = [*entries[0], ELLIPSIS, *entries[-1]]
    return [*lines[:top], *table[:rule + 1], *kept, *lines[end:]]


def main_job() -> tuple[str, list[str]]:
    caption, output = run_main_job()
    return caption, main_job_excerpt(output)


def run_main_job() -> tuple[str, str]:
    """The caption, and the main job's whole output."""
    started, at, where = datetime.datetime.now(), commit(), machine()  # as the run starts
    output = run(MAIN_JOB)
    gpu = "without a GPU" if "no NVIDIA GPU visible" in output else "with its GPUs"
    caption = (f"The main job as printed on {started:%Y-%m-%d} at {at}, on {where}, "
               f"{gpu}, in an 80-column terminal (`COLUMNS=80 {' '.join(MAIN_JOB)}`; "
               f"`python docs/sample_outputs.py` prints it again):")
    return caption, output


def hidden_gpus() -> tuple[str, list[str]]:
    recorded = git("log", "--diff-filter=A", "--format=%ad, commit %h", "--date=short", "--",
                   HIDDEN_FACTS).splitlines()[-1]
    at = commit()
    output = run(("pytest_gputrain", "replay", HIDDEN_FACTS))
    caption = (f"The facts recorded on two NVIDIA H200s with `CUDA_VISIBLE_DEVICES=\"\"` left in "
               f"the environment ({recorded}: `{HIDDEN_FACTS}`), as printed on "
               f"{datetime.date.today():%Y-%m-%d} at {at} by "
               f"`COLUMNS=80 python -m pytest_gputrain replay {HIDDEN_FACTS}` (under pytest "
               "the findings follow the `== gputrain diagnosis ==` line):")
    return caption, output.rstrip("\n").splitlines()


SAMPLES: dict[str, Callable[[], tuple[str, list[str]]]] = {
    "main-job": main_job, "hidden-gpus": hidden_gpus}


def block(name: str, caption: str, lines: list[str]) -> str:
    caption = "\n".join(textwrap.wrap(caption, 100, break_long_words=False,
                                      break_on_hyphens=False))
    return "\n".join([f"<!-- sample:{name} -->", caption, "", "```text", *lines, "```",
                      f"<!-- /sample:{name} -->"])


def readme_sample(name: str, text: str) -> tuple[str, list[str]] | None:
    """(caption, lines) of the sample ``name`` in the README's text, or None."""
    match = re.search(rf"<!-- sample:{name} -->\n(.*?)\n\n```text\n(.*?)\n```\n"
                      rf"<!-- /sample:{name} -->", text, re.S)
    return (match.group(1), match.group(2).splitlines()) if match else None


def sample_form(lines: Sequence[str]) -> list[str]:
    """The lines with every figure masked and runs of spaces as one: what stays the same from
    one run to the next while the layout does."""
    return [" ".join(_FIGURE.sub("N", line).split()) for line in lines]


def same_form(readme: Sequence[str], printed: Sequence[str]) -> bool:
    """Whether the README's lines, in form, appear in that order in what was printed."""
    remaining = iter(sample_form(printed))
    return all(line in remaining for line in sample_form(readme))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SAMPLES), action="append")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 where the README's sample differs in form")
    args = parser.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    differs = False
    for name in args.only or SAMPLES:
        caption, lines = SAMPLES[name]()
        print(block(name, caption, lines), end="\n\n")
        current = readme_sample(name, text)
        if current is None:
            sys.exit(f"README.md has no <!-- sample:{name} --> ... <!-- /sample:{name} -->")
        if args.check:
            if not same_form(current[1], lines):
                print(f"README.md's {name} sample differs in form from this output",
                      file=sys.stderr)
                differs = True
            continue
        # Everything between the markers is replaced, however its caption was wrapped.
        start = text.index(f"<!-- sample:{name} -->")
        end = text.index(f"<!-- /sample:{name} -->") + len(f"<!-- /sample:{name} -->")
        text = text[:start] + block(name, caption, lines) + text[end:]
    if not args.check:
        README.write_text(text, encoding="utf-8")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
