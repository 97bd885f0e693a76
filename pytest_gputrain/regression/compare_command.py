"""``python -m pytest_gputrain compare BASELINE CURRENT``: the gate over two saved names.

    python -m pytest_gputrain compare main pr-123 [--store PATH|URL] [--format text|md|json]
        [--regression "step_time:2.5%,peak_vram:2%"] [--alpha 0.01] [--step-summary min]
        [--lookback N] [--cannot-tell pass|warn|fail] [--max-sessions N] [--force]

Each side is every session saved under its name at the newest commit of that name, in one
environment (``NAME``), or one run (``#ID``); ``latest`` is the newest run's sessions. This is
how CI compares after running interleaved sessions of the base and the candidate (the recipe in
docs/regression.md). ``--lookback N`` also compares CURRENT with the level of BASELINE's branch
over its newest N sessions and reports a drift no single comparison shows (``drift``). Exit
status: 0 when the gate passes, 1 on a regression (or a "cannot tell" under
``--cannot-tell fail``), 2 when the store or the arguments cannot be used, and with
``--max-sessions N`` (the sequential recipe) 3 while a "cannot tell" would be decided by
more sessions, N a side at most: run another pair of sessions and compare again.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pytest_gputrain.ini_settings import ProjectSettingsError, read_project_settings
from pytest_gputrain.options import not_empty
from pytest_gputrain.regression import change_points
from pytest_gputrain.regression.compare import (
    GateReport,
    GateSettings,
    compare_sides,
    store_history,
)
from pytest_gputrain.regression.explain import explain_sides
from pytest_gputrain.regression.history import add_store_argument, locate
from pytest_gputrain.regression.history_errors import HistoryError
from pytest_gputrain.regression.options import (
    CANNOT_TELL,
    DEFAULT_ALPHA,
    DEFAULT_CANNOT_TELL,
    DEFAULT_REGRESSION,
    MAX_LOOKBACK,
    MIN_LOOKBACK,
)
from pytest_gputrain.regression.settings import (
    DEFAULT_STEP_SUMMARY,
    REGRESSION_EXAMPLE,
    STEP_SUMMARIES,
    parse_alpha,
    parse_cannot_tell,
    parse_spec,
)
from pytest_gputrain.regression.store import RunInfo, Store, StoreError
from pytest_gputrain.regression.store_backends import open_for_reading
from pytest_gputrain.units import printable

# The exit status that asks the sequential recipe for another pair of sessions.
MORE_SESSIONS = 3
# The most sessions a side --max-sessions accepts: past it, a value is a typo.
MOST_SESSIONS_BUDGET = 1_000


class CompareError(Exception):
    pass


def add_compare_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``compare`` subcommand to ``parser.add_subparsers()``'s result."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "compare", help="compare two saved names (the sessions of each); exit 1 on a regression",
        description="Compare the sessions saved under CURRENT with those saved under BASELINE "
                    "(each: NAME, #ID or latest), test by test, over sessions.")
    parser.add_argument("baseline", metavar="BASELINE", type=not_empty,
                        help="the baseline: NAME, #ID or latest")
    parser.add_argument("current", metavar="CURRENT", type=not_empty,
                        help="the candidate: NAME, #ID or latest")
    add_store_argument(parser)
    parser.add_argument("--regression", metavar="SPEC", default=DEFAULT_REGRESSION,
                        type=not_empty,
                        help="what counts as a regression: METRIC:PERCENT pairs (METRIC:off "
                             "drops one); 'auto' (the default) is step_time:5%%,peak_vram:2%% "
                             "and, by each test's kind of step, its counters (kernels, syncs, "
                             "copies, allocations: any rise; instructions 1%%, host_cpu 2%%) or "
                             "gpu_time:1%%; e.g. auto,step_time:2.5%%")
    parser.add_argument("--alpha", default=str(DEFAULT_ALPHA), type=not_empty,
                        help=f"significance level over sessions (default {DEFAULT_ALPHA})")
    parser.add_argument("--step-summary", default=DEFAULT_STEP_SUMMARY, choices=STEP_SUMMARIES,
                        help="one session's step time: min (its fastest clean round, the "
                             "default) or median")
    parser.add_argument("--lookback", metavar="N", type=int,
                        help="also compare CURRENT with BASELINE's branch level over its newest "
                             "N sessions and report a drift no single comparison shows (needs "
                             f"ruptures; N from {MIN_LOOKBACK} to {MAX_LOOKBACK})")
    parser.add_argument("--cannot-tell", choices=CANNOT_TELL, default=None,
                        help="when the sessions could not see a change of the threshold's "
                             "size: pass (exit 0), warn (exit 0, with a warning) or fail (exit "
                             "1); default: the gpu_cannot_tell of the project's ini file, else "
                             f"{DEFAULT_CANNOT_TELL}")
    parser.add_argument("--max-sessions", metavar="N", type=_budget, default=None,
                        help="the sequential recipe: the most sessions a side you will run. "
                             f"Exit {MORE_SESSIONS} while a 'cannot tell' would be decided by "
                             "more sessions, N a side at most (run another pair and compare "
                             "again); otherwise exit as without it")
    parser.add_argument("--force", action="store_true",
                        help="compare even when the environment fingerprints differ")
    parser.add_argument("--format", choices=("text", "md", "json"), default="text",
                        help="text: for the terminal (default); md: Markdown for a CI summary; "
                             "json: the same report, for a program")
    parser.set_defaults(func=cmd_compare)
    return parser


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        report = _compare(args)
    except (CompareError, HistoryError, StoreError) as exc:
        print(f"pytest_gputrain: error: {printable(str(exc))}", file=sys.stderr)
        return 2
    if args.format == "json":
        from pytest_gputrain.regression.output import report_json

        print(json.dumps(report_json(report), indent=2, allow_nan=False))
    elif args.format == "md":
        from pytest_gputrain.regression.output import markdown

        sys.stdout.write(markdown(report))
    else:
        from pytest_gputrain.regression.output import compare_lines

        for line, _ in compare_lines(report):
            print(line)
        for note in report.notes:
            print(note)
    if report.warned:
        print(f"pytest_gputrain: warning: cannot tell for {len(report.undecided)} metric(s): "
              "their sessions could not see a change of the threshold's size "
              "(--cannot-tell warn)", file=sys.stderr)
    budget = report.session_budget
    if budget is not None and report.sessions_to_decide(budget) is not None:
        return MORE_SESSIONS
    return 1 if report.failed else 0


def _budget(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of sessions a side; "
                                         "e.g. --max-sessions 8") from None
    if not 2 <= value <= MOST_SESSIONS_BUDGET:
        raise argparse.ArgumentTypeError(f"{text!r} must lie between 2 and "
                                         f"{MOST_SESSIONS_BUDGET}; e.g. --max-sessions 8")
    return value


def _policy(args: argparse.Namespace) -> str:
    """``--cannot-tell``, else the project's ``gpu_cannot_tell``, as pytest run here reads it."""
    if args.cannot_tell is not None:
        return str(args.cannot_tell)
    try:
        value = read_project_settings(names=("gpu_cannot_tell",)).values["gpu_cannot_tell"]
    except ProjectSettingsError as exc:
        raise CompareError(str(exc)) from None
    if value in (None, ""):
        return DEFAULT_CANNOT_TELL
    try:
        return parse_cannot_tell(value)
    except ValueError as exc:
        raise CompareError(f"gpu_cannot_tell (the project's ini file): {exc}") from None


def _settings(args: argparse.Namespace) -> GateSettings:
    try:
        spec = parse_spec(args.regression)
    except ValueError as exc:
        raise CompareError(f"--regression: {exc}") from None
    if not spec.thresholds and not spec.auto:
        raise CompareError(f"--regression: {args.regression!r} gates no metric; e.g. "
                           f"{REGRESSION_EXAMPLE}")
    try:
        alpha = parse_alpha(args.alpha)
    except ValueError as exc:
        raise CompareError(f"--alpha: {exc}") from None
    return GateSettings(spec.thresholds, alpha, bool(args.force), args.step_summary,
                        _policy(args), spec.auto, spec.off)


def _compare(args: argparse.Namespace) -> GateReport:
    settings = _settings(args)
    if args.lookback is not None and not MIN_LOOKBACK <= args.lookback <= MAX_LOOKBACK:
        raise CompareError(f"--lookback {args.lookback} must lie between {MIN_LOOKBACK} and "
                           f"{MAX_LOOKBACK} sessions; e.g. --lookback 30")
    if args.lookback:
        try:
            change_points.check_available()
        except change_points.ChangePointsUnavailable as exc:
            raise CompareError(f"--lookback: {exc}") from None
    with open_for_reading(locate(args.store)) as store:
        report = GateReport(settings, compare_spec=args.baseline, current_spec=args.current,
                            session_budget=args.max_sessions)
        report.current_runs = _select(store, args.current, None)
        prefer = report.current_runs[0].fingerprint_hash
        report.baseline_runs = _select(store, args.baseline, prefer)
        overlap = {r.id for r in report.current_runs} & {r.id for r in report.baseline_runs}
        if overlap:
            raise CompareError(f"{args.baseline!r} and {args.current!r} name the same sessions "
                               f"(runs {', '.join(f'#{i}' for i in sorted(overlap))}); compare "
                               "two different names")
        baseline = store.results_of(report.baseline_runs)
        current = store.results_of(report.current_runs)
        history = store_history(store, {r.id for r in report.baseline_runs}
                                | {r.id for r in report.current_runs})
        report.comparisons = compare_sides(baseline, current, settings, history)
        report.explanations = explain_sides(baseline, current)
        if args.lookback:
            from pytest_gputrain.regression.drift import add_drifts

            add_drifts(store, report, current, args.lookback)
        missing = sorted(set(baseline) - set(current))
        if missing:
            report.notes.append(f"{len(missing)} test(s) of the baseline have no result in "
                                f"{args.current!r}: {', '.join(missing[:5])}")
        if not current:
            report.notes.append(f"{args.current!r} holds no benchmark result")
    return report


def _select(store: Store, spec: str, prefer_hash: str | None) -> list[RunInfo]:
    runs = store.select_runs(spec, prefer_hash=prefer_hash)
    if not runs:
        names = sorted({run.name for run in store.runs(limit=200)})
        listed = ", ".join(names[:12]) or "none"
        raise CompareError(f"no saved run {spec!r} in {store.where} (saved: {listed}; "
                           "`python -m pytest_gputrain history` lists them)")
    return runs
