"""``history --changes`` and ``history --html DIR``: the steps in each test's history on a branch.

Reads the store once, builds each test's series per branch (run name) and metric
(``branch_history``), finds the steps, and prints them as a table or JSON, or writes the site
(``history_site``). What cannot be used is a ``HistoryError`` saying why: an empty store, a test
or a name it does not hold, a malformed ``--min-change``; ruptures missing is
``ChangePointsUnavailable``, naming the extra.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tabulate import tabulate

from pytest_gputrain.outputs import Claims
from pytest_gputrain.regression import change_points
from pytest_gputrain.regression.branch_history import (
    DEFAULT_LIMIT,
    Series,
    find_changes,
    read_series,
)
from pytest_gputrain.regression.change_text import format_confidence, format_value, what_changed
from pytest_gputrain.regression.history_errors import HistoryError, unknown_test
from pytest_gputrain.regression.options import TIME_METRICS
from pytest_gputrain.regression.store import Store
from pytest_gputrain.regression.store_backends import open_for_reading
from pytest_gputrain.regression.store_location import Location
from pytest_gputrain.units import parse_percent, printable

CHANGE_HEADERS = ("name", "test", "metric", "from run", "created", "commit", "environment",
                  "change", "level", "confidence", "what else changed")
MAX_MIN_CHANGE = 50.0  # percent: a larger smallest step reported is a typo


def parse_min_change(text: str) -> float:
    """``--min-change``: a percentage, as a fraction."""
    try:
        value = parse_percent(text)
    except ValueError as exc:
        raise HistoryError(f"--min-change: {exc}; e.g. --min-change 1%") from None
    if not 0 < value <= MAX_MIN_CHANGE:
        raise HistoryError(f"--min-change {text!r} must lie above 0 and at most "
                           f"{MAX_MIN_CHANGE:g} %; e.g. --min-change 1%")
    return value / 100


def change_rows(series: list[Series]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for one in series:
        for change in one.changes:
            run, step = change.first.run, change.step
            rows.append((one.name, one.nodeid, one.metric, f"#{run.id}", run.created_at,
                         (run.commit or "–")[:10], run.fingerprint_hash[:8],
                         f"{step.change * 100:+.2f} %",
                         f"{format_value(one.metric, step.before)} -> "
                         f"{format_value(one.metric, step.after)}",
                         format_confidence(step.p_value), what_changed(change)))
    return rows


def load(store: Store, args: argparse.Namespace) -> list[Series]:
    """Every series the arguments select, with its steps found."""
    change_points.check_available()  # before reading a large store for nothing
    min_change = parse_min_change(args.min_change)
    if not store.runs(limit=1):
        raise HistoryError(f"no saved runs in {store.where}: nothing to look for changes in "
                           "(save runs with `pytest --gpu-save=NAME`)")
    if args.name is not None and not store.runs(name=args.name, limit=1):
        names = sorted({run.name for run in store.runs(limit=200)})
        raise HistoryError(f"no run saved under the name {args.name!r} in {store.where} "
                           f"(saved: {', '.join(names[:12])})")
    nodeids = [args.test] if args.test else store.nodeids()
    metrics = tuple(dict.fromkeys(args.metric or TIME_METRICS))
    series = read_series(store, nodeids, name=args.name, limit=args.limit or DEFAULT_LIMIT,
                         metrics=metrics, step_summary=args.step_summary)
    if args.test and not series:
        raise HistoryError(unknown_test(store, args.test, args.name))
    return [find_changes(one, min_change=min_change) for one in series]


def show_changes(args: argparse.Namespace, location: Location, claims: Claims) -> int:
    """The steps as a table or JSON, or (``--html``) the site, whose pages join ``claims``
    (the command's outputs, the store among them)."""
    if args.html:
        from pytest_gputrain.regression.history_site import check_site_folder

        check_site_folder(Path(args.html))  # before the store is read for nothing
    with open_for_reading(location) as store:
        series = load(store, args)
        where = store.where
    if args.html:
        from pytest_gputrain.regression.history_site import write_site

        index = write_site(Path(args.html), series, where, claims)
        print(f"wrote {index} ({len({s.nodeid for s in series})} test page(s))")
        if not args.changes:
            return 0
    if args.json:
        print(json.dumps([one.to_json() for one in series], indent=2, allow_nan=False))
        return 0
    rows = change_rows(series)
    sessions = sum(len(one.sessions) for one in series)
    if rows:
        print(printable(tabulate(rows, headers=CHANGE_HEADERS, disable_numparse=True)))
    quiet = sum(1 for one in series if not one.changes)
    print(f"{len(rows)} change(s) in {len(series)} series ({sessions} sessions in {where}); "
          f"{quiet} series without a change")
    return 0
