"""``python -m pytest_gputrain history``: the saved runs, one test across runs, and a PNG of it;
the steps in each test's history on a branch, and a static site of it all.

    python -m pytest_gputrain history [--store PATH|URL] [--name NAME] [--limit N]
    python -m pytest_gputrain history --test NODEID [--png out.png]
    python -m pytest_gputrain history --changes [--test NODEID] [--name main] [--metric step_time]
    python -m pytest_gputrain history --html DIR [--name main]

The store is the one ``pytest --gpu-save`` run in the current directory writes to: the
project's ini file is found as pytest finds it (pytest.ini, pyproject.toml, tox.ini, setup.cfg,
here or in a parent folder) and its ``gpu_store`` read, else ``.gputrain/benchmarks.sqlite`` in
the rootdir; ``--store`` names another (a file, or a ``postgresql://`` URL).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any

from tabulate import tabulate

from pytest_gputrain.ini_settings import ProjectSettingsError, read_project_settings
from pytest_gputrain.options import not_empty
from pytest_gputrain.outputs import Claims, OutputPathError, output_kind, write_output
from pytest_gputrain.regression import change_points
from pytest_gputrain.regression.branch_history import DEFAULT_LIMIT
from pytest_gputrain.regression.change_points import ChangePointsUnavailable
from pytest_gputrain.regression.history_errors import HistoryError, unknown_test
from pytest_gputrain.regression.options import DEFAULT_STORE, TIME_METRICS
from pytest_gputrain.regression.settings import DEFAULT_STEP_SUMMARY, STEP_SUMMARIES
from pytest_gputrain.regression.store import ResultRecord, RunInfo, StoreError
from pytest_gputrain.regression.store_backends import open_for_reading
from pytest_gputrain.regression.store_location import Location, parse_location, resolve_store
from pytest_gputrain.units import printable, shown

PLOT_HINT = "drawing a PNG needs matplotlib: pip install 'pytest-gputrain[plot]'"


MAX_LIMIT = 1_000_000  # runs listed at most; a larger --limit is a typo (SQLite cannot hold it)
LIST_LIMIT = 50  # runs (or one test's results) listed by default


def add_history_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``history`` subcommand to ``parser.add_subparsers()``'s result."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "history", help="list saved benchmark runs, one test's results across runs, or the "
                        "steps in each test's history",
        description="List the runs saved with --gpu-save, or one test's step time, peak VRAM "
                    "and per-step counters (kernels, syncs, H2D bytes, allocations, ATen ops, "
                    "host CPU time, instructions; '~' where the counted steps disagreed) "
                    "across runs (optionally as a PNG). --changes lists the steps in each "
                    "test's history on a branch (a run name); --html DIR writes them as a "
                    "static site.")
    add_store_argument(parser)
    parser.add_argument("--name", type=not_empty, help="only runs saved under this name (a branch)")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help=f"at most N runs (default "
                        f"{LIST_LIMIT}; with --changes or --html each test's newest N results, "
                        f"default {DEFAULT_LIMIT}; at most {MAX_LIMIT})")
    parser.add_argument("--test", metavar="NODEID", type=not_empty,
                        help="one test's results across runs")
    parser.add_argument("--png", metavar="PATH", type=not_empty,
                        help="with --test: draw step time and peak "
                        "VRAM across runs into PATH (needs matplotlib)")
    parser.add_argument("--changes", action="store_true",
                        help="list the steps in step time and peak VRAM of each test's history "
                             "on each branch (or --test's, --name's): size, confidence, the "
                             "first run after the step, and a likely cause (needs ruptures: "
                             "pip install 'pytest-gputrain[changes]')")
    parser.add_argument("--html", metavar="DIR", type=not_empty,
                        help="write a static site into DIR: an index "
                        "of the tests with sparklines and their latest change, a page per test "
                        "with its series, steps and commits (needs ruptures)")
    parser.add_argument("--metric", choices=TIME_METRICS, action="append",
                        help="with --changes or --html: only this metric (repeatable; default "
                             "both)")
    parser.add_argument("--min-change", metavar="PERCENT", type=not_empty,
                        default=f"{change_points.DEFAULT_MIN_CHANGE * 100:g}%",
                        help="with --changes or --html: the smallest step reported (default "
                             f"{change_points.DEFAULT_MIN_CHANGE * 100:g}%%)")
    parser.add_argument("--step-summary", default=DEFAULT_STEP_SUMMARY, choices=STEP_SUMMARIES,
                        help="one session's step time, as the gate summarises it: min (its "
                             "fastest clean round, the default) or median")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=cmd_history)
    return parser


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", metavar="PATH|URL", type=not_empty,
                        help="benchmark store: a file or a postgresql:// URL (default: the "
                             "gpu_store of the project's ini file, as pytest run here reads "
                             f"it, else {DEFAULT_STORE} in the rootdir)")


def locate(store: str | None) -> Location:
    """The store ``--store`` names (a path relative to the current directory), else the one
    ``pytest --gpu-save`` run here would write to."""
    if store is not None:
        try:
            return parse_location(store, Path.cwd())
        except ValueError as exc:
            raise HistoryError(f"--store: {exc}") from None
    try:
        project = read_project_settings(names=("gpu_store",))
    except ProjectSettingsError as exc:
        raise HistoryError(str(exc)) from None
    try:
        found = resolve_store(project.values["gpu_store"], project.ini_folder, project.rootpath)
    except ValueError as exc:
        raise HistoryError(f"gpu_store: {exc}") from None
    if isinstance(found, Path) and not found.is_file():
        raise HistoryError(f"no benchmark store found at {found} (where pytest run here saves: "
                           f"the ini file's gpu_store, else {DEFAULT_STORE} in the rootdir "
                           f"{project.rootpath}); save a run with `pytest --gpu-save=NAME` or "
                           "pass --store PATH")
    return found


def cmd_history(args: argparse.Namespace) -> int:
    try:
        return _history(args)
    except (HistoryError, StoreError, ChangePointsUnavailable) as exc:
        print(f"pytest_gputrain: error: {printable(str(exc))}", file=sys.stderr)
        return 2


def output_claims(location: Location) -> Claims:
    """The outputs of one ``history`` command, checked as pytest's are (``outputs.Claims``):
    none may be the store it reads (a SQLite file), nor each other."""
    claims = Claims()
    if isinstance(location, Path):
        claims.keep("--store", [location])
    return claims


def png_path(text: str, claims: Claims) -> Path:
    """``--png PATH``: a file whose name ends in .png (a name without a suffix gets it, as
    matplotlib has always given it: ``--png out`` is out.png, and said so), or a device or pipe
    (``/dev/stdout``) taken as named; claimed as an output; ``HistoryError`` naming it
    otherwise."""
    path = Path(text)
    try:
        if output_kind(path) in ("new", "file") and not path.suffix:
            path = path.with_name(path.name + ".png")
        claims.claim("--png", [path])
        kind = output_kind(path)
    except OutputPathError as exc:
        raise HistoryError(str(exc)) from None
    if kind in ("new", "file") and path.suffix.lower() != ".png":
        raise HistoryError(f"--png {text}: a PNG file's name ends in .png (e.g. --png "
                           "step_time.png); a device or pipe such as /dev/stdout takes any "
                           "name")
    return path


def _history(args: argparse.Namespace) -> int:
    if args.png and not args.test:
        raise HistoryError("--png needs --test NODEID (the test to draw)")
    if args.png and (args.changes or args.html):
        raise HistoryError("--png draws one test's runs; it does not go with --changes or "
                           "--html (the site draws every test)")
    if args.limit is not None and not 1 <= args.limit <= MAX_LIMIT:
        raise HistoryError(f"--limit {shown(args.limit)} must lie between 1 and {MAX_LIMIT}")
    location = locate(args.store)
    claims = output_claims(location)
    if args.changes or args.html:
        from pytest_gputrain.regression.history_changes import show_changes

        return show_changes(args, location, claims)
    png = png_path(args.png, claims) if args.png else None
    limit = args.limit or LIST_LIMIT
    with open_for_reading(location) as store:
        where = store.where
        if args.test:
            entries = store.history(args.test, name=args.name)[-limit:]
            if not entries:
                raise HistoryError(unknown_test(store, args.test, args.name))
            if args.json:
                print(json.dumps([_entry_json(run, result) for run, result in entries],
                                 indent=2))
            else:
                counted = any(result.counters for _, result in entries)
                print(printable(tabulate(
                    _test_rows(entries, counted),
                    headers=TEST_HEADERS + (COUNTER_HEADERS if counted else ()),
                    disable_numparse=True)))
            if png is not None:
                try:
                    write_output(png, draw_png(args.test, entries))
                except OSError as exc:
                    raise HistoryError(f"--png: could not write {png}: "
                                       f"{exc.strerror or exc}") from None
                print(f"wrote {png}")
            return 0
        runs = store.runs(name=args.name, limit=limit)
    if args.json:
        print(json.dumps([run.to_json() for run in runs], indent=2))
    elif not runs:
        print(f"no saved runs in {where}")
    else:
        print(printable(tabulate(_run_rows(runs), headers=RUN_HEADERS,
                                 disable_numparse=True)))
    return 0


RUN_HEADERS = ("id", "name", "created", "commit", "device", "torch", "tests")
TEST_HEADERS = ("run", "name", "created", "commit", "rounds", "median step", "IQR",
                "peak VRAM", "throttled")
COUNTER_HEADERS = ("kernels", "syncs", "H2D", "allocs", "ops", "bytecodes", "host CPU",
                   "instructions", "step")
# The counters ``history --test`` shows, one column each (the exact ones per step, the host's
# from the fastest round of the counting pass): what a session did per step beside its times.
SHOWN_COUNTERS = ("kernels", "syncs", "h2d_bytes", "allocs", "ops", "bytecodes", "host_cpu",
                  "instructions")


def _run_rows(runs: list[RunInfo]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for run in runs:
        fp = run.fingerprint
        device = fp.get("gpu_name") or fp.get("cpu_model") or fp.get("device_type") or "–"
        rows.append((str(run.id), run.name, run.created_at, (run.commit or "–")[:10],
                     str(device), str(fp.get("torch_version") or "–"), str(run.result_count)))
    return rows


def _step(result: ResultRecord, key: str) -> float | None:
    value = (result.summary.get("step_time") or {}).get(key)
    return float(value) if isinstance(value, int | float) else None


def _peak(result: ResultRecord) -> float | None:
    value = (result.summary.get("peak_vram") or {}).get("max")
    return float(value) if isinstance(value, int | float) else None


def _counter(result: ResultRecord, name: str) -> str:
    """One counter of a session as ``history --test`` shows it ("–": not counted)."""
    from pytest_gputrain.regression import counters

    if name in counters.EXACT:
        value = counters.exact_value(result, name)
        text = counters.amount(name, value)
        return text + " ~" if value is not None and counters.varies(result, name) else text
    rounds = counters.rounds_of(result, name)
    return counters.amount(name, min(rounds)) if rounds else "–"


def _test_rows(entries: list[tuple[RunInfo, ResultRecord]], counted: bool = False
               ) -> list[tuple[str, ...]]:
    """One row per session; with ``counted``, its counters too (sessions saved before the
    counters existed, or without them, show "–")."""
    from pytest_gputrain.regression import counters, policy
    from pytest_gputrain.units import format_bytes, format_duration

    rows: list[tuple[str, ...]] = []
    for run, result in entries:
        peak = _peak(result)
        kind = counters.bound_of(result)
        row: tuple[str, ...] = (
            str(run.id), run.name, run.created_at, (run.commit or "–")[:10], str(result.rounds),
            format_duration(_step(result, "median"), precise=True),
            format_duration(_step(result, "iqr"), precise=True),
            format_bytes(peak) if peak is not None else "–",
            str(result.summary.get("throttled", 0)))
        if counted:
            row += (*(_counter(result, name) for name in SHOWN_COUNTERS),
                    policy.KIND_WORDS[kind] if result.counters else "–")
        rows.append(row)
    return rows


def _entry_json(run: RunInfo, result: ResultRecord) -> dict[str, Any]:
    return {"run": run.to_json(), "nodeid": result.nodeid, "rounds": result.rounds,
            "summary": result.summary, "counters": result.counters}


def draw_png(nodeid: str, entries: list[tuple[RunInfo, ResultRecord]]) -> bytes:
    """A PNG of step time (median with the interquartile range, each round faint behind) and
    peak VRAM across runs, one x position per run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise HistoryError(PLOT_HINT) from None
    from pytest_gputrain.regression import stats

    labels = [f"#{run.id}\n{run.name[:12]}" for run, _ in entries]
    xs = list(range(len(entries)))
    figure, (ax_time, ax_mem) = plt.subplots(2, 1, figsize=(max(6.0, 0.8 * len(xs) + 3), 6.5),
                                             sharex=True)
    medians, lows, highs = [], [], []
    for x, (_, result) in zip(xs, entries, strict=True):
        times = [float(t) * 1e3 for t in result.metrics.get("step_time") or []]
        if times:
            ax_time.scatter([x] * len(times), times, s=4, alpha=0.15, color="tab:blue")
            low, middle, high = stats.quartiles(times)
            medians.append(middle)
            lows.append(middle - low)
            highs.append(high - middle)
        else:
            medians.append(float("nan"))
            lows.append(0.0)
            highs.append(0.0)
    ax_time.errorbar(xs, medians, yerr=[lows, highs], fmt="o-", color="tab:blue", capsize=3,
                     label="median (IQR)")
    ax_time.set_ylabel("step time (ms)")
    ax_time.set_title(nodeid, fontsize=9)
    ax_time.legend(loc="best", fontsize=8)
    ax_time.grid(alpha=0.3)
    peaks = [_peak(result) for _, result in entries]
    if any(p is not None for p in peaks):
        ax_mem.plot(xs, [p / 2**20 if p is not None else float("nan") for p in peaks], "s-",
                    color="tab:red")
        ax_mem.set_ylabel("peak VRAM (MiB)")
    else:
        ax_mem.text(0.5, 0.5, "no peak VRAM recorded (CPU benchmark)", ha="center",
                    va="center", transform=ax_mem.transAxes)
        ax_mem.set_yticks([])
    ax_mem.grid(alpha=0.3)
    ax_mem.set_xticks(xs)
    ax_mem.set_xticklabels(labels, fontsize=7)
    ax_mem.set_xlabel("saved run")
    figure.tight_layout()
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png", dpi=110)
    finally:
        plt.close(figure)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m pytest_gputrain.regression.history``), same as the
    ``history`` subcommand of ``python -m pytest_gputrain``."""
    parser = argparse.ArgumentParser(prog="python -m pytest_gputrain")
    add_history_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["history", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
