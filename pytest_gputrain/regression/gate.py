"""The controller's work: check the store at start-up; compare, save and write outputs at the end.

Runs in the controller only (the single process, or xdist's controller, which receives the
workers' results through ``workeroutput``), so a pytest session is one writer of one run.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_gputrain.regression.benchmark import BenchmarkResult
from pytest_gputrain.regression.compare import (
    GateReport,
    GateSettings,
    as_record,
    compare_sides,
    session_fingerprint,
    store_history,
)
from pytest_gputrain.regression.explain import explain_sides
from pytest_gputrain.regression.fingerprint import fingerprint_hash, git_commit
from pytest_gputrain.regression.settings import RegressionSettings
from pytest_gputrain.regression.store import RunInfo, Store, StoreError
from pytest_gputrain.regression.store_backends import (
    check_creatable,
    inspect,
    open_for_reading,
    open_store,
)
from pytest_gputrain.regression.store_location import describe


def check_store(settings: RegressionSettings) -> None:
    """Refuse a foreign, damaged, newer or unreachable store, a store ``--gpu-save`` could not
    create, or an unknown ``--gpu-compare`` name, up front. Nothing is created or changed
    here."""
    where = describe(settings.store)
    try:
        state = inspect(settings.store)
        if settings.save and state == "missing":
            # Found now, not after the session's benchmarks have run for nothing.
            check_creatable(settings.store)
        if not settings.compare or settings.compare == "latest":
            return
        if state not in ("ours", "older"):
            raise pytest.UsageError(
                f"gpu_compare / --gpu-compare: no run {settings.compare!r}: the benchmark store "
                f"{where} has no saved runs yet (save one with --gpu-save=NAME)")
        with open_for_reading(settings.store) as store:
            if store.find_run(settings.compare) is None:
                names = sorted({run.name for run in store.runs(limit=200)})
                listed = ", ".join(names[:12]) or "none"
                raise pytest.UsageError(
                    f"gpu_compare / --gpu-compare: no saved run {settings.compare!r} in {where} "
                    f"(saved: {listed}; `python -m pytest_gputrain history` lists them); e.g. "
                    "--gpu-compare=latest")
    except StoreError as exc:
        raise pytest.UsageError(f"gpu_store: {exc}") from None


def save_results(store: Store, name: str, results: list[BenchmarkResult],
                 commit: str | None) -> RunInfo:
    """Save one session's results as one run (one transaction); the saved run."""
    fingerprint = session_fingerprint(results)
    run_id = store.save_run(name, fingerprint, fingerprint_hash(fingerprint), commit,
                            [as_record(result) for result in results])
    saved = store.run(run_id)
    assert saved is not None
    return saved


def finish(config: pytest.Config, settings: RegressionSettings,
           records: list[dict[str, Any]], *, save: bool = True) -> GateReport:
    """Compare, save, write JSON and Markdown; never raises into pytest (errors become notes).

    ``save=False`` (an interrupted session) compares and reports but saves nothing.
    """
    results = [BenchmarkResult.from_record(r) for r in records]
    report = GateReport(GateSettings(settings.thresholds, settings.alpha, settings.force,
                                     settings.step_summary, settings.cannot_tell,
                                     settings.auto, settings.off),
                        benchmarks=results, compare_spec=settings.compare,
                        save_name=settings.save)
    _note_profiled(report, results)
    if settings.save and not save:
        report.notes.append(f"gpu_save={settings.save!r}: the session was interrupted; "
                            "nothing saved")
        settings = replace(settings, save=None)
    if settings.uses_store:
        _use_store(config, settings, report, results)
    if settings.json_path is not None:
        _write_json(settings.json_path, report)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and (settings.uses_store or settings.json_path is not None):
        _append_markdown(Path(summary), report)
    return report


def _note_profiled(report: GateReport, results: list[BenchmarkResult]) -> None:
    """Benchmarks timed after a torch profiler ran in the same process pay for CUPTI."""
    profiled = [r.nodeid for r in results if r.conditions.get("profiler_before")
                and r.conditions.get("teardown_cupti") != "1"]
    if profiled:
        report.notes.append(
            f"{len(profiled)} benchmark(s) ran after a torch profiler in the same process (e.g. "
            f"{profiled[0]}): kineto leaves CUPTI attached, which slows every kernel launch, so "
            "these timings are not like those of a session without a profiler. Run benchmarks "
            "in a session of their own, or set TEARDOWN_CUPTI=1")


def _use_store(config: pytest.Config, settings: RegressionSettings, report: GateReport,
               results: list[BenchmarkResult]) -> None:
    try:
        state = inspect(settings.store)
        if state != "ours" and not settings.save:
            report.notes.append(f"no benchmark store at {describe(settings.store)} yet: nothing "
                                "to compare with (save a baseline with --gpu-save=NAME)")
            return
        # A run that only compares reads the store, and changes nothing in it.
        opened = open_store(settings.store) if settings.save else open_for_reading(settings.store)
        with opened as store:
            if settings.compare:
                _compare(store, settings.compare, report, results)
                if settings.lookback:
                    from pytest_gputrain.regression.drift import add_drifts

                    add_drifts(store, report, {r.nodeid: [as_record(r)] for r in results},
                               settings.lookback)
            if settings.save:
                if not results:
                    report.notes.append(f"gpu_save={settings.save!r}: no gpu_benchmark result "
                                        "in this session (passed tests only); nothing saved")
                    return
                report.commit = git_commit(Path(config.rootpath))
                report.saved_run = save_results(store, settings.save, results, report.commit)
    except StoreError as exc:
        report.notes.append(f"benchmark store error: {exc}")
        report.errors.append(str(exc))


def _compare(store: Store, spec: str, report: GateReport, results: list[BenchmarkResult]) -> None:
    """This session (one session a side) against the sessions ``spec`` names."""
    fingerprint = session_fingerprint(results)
    prefer = fingerprint_hash(fingerprint) if fingerprint else None
    report.baseline_runs = store.select_runs(spec, prefer_hash=prefer)
    if not report.baseline_runs:
        report.notes.append(f"no saved run matches gpu_compare={spec!r}: nothing compared")
        return
    baseline = store.results_of(report.baseline_runs)
    current = {result.nodeid: [as_record(result)] for result in results}
    history = store_history(store, {run.id for run in report.baseline_runs})
    report.comparisons = compare_sides(baseline, current, report.settings, history)
    report.baseline_steps = {nodeid: [[float(v) for v in record.metrics.get("step_time") or []]
                                      for record in baseline[nodeid]]
                             for nodeid in current if baseline.get(nodeid)}
    report.explanations = explain_sides(baseline, current)
    missing = sorted(set(baseline) - set(current))
    if missing:
        report.notes.append(f"{len(missing)} test(s) of the baseline did not run a benchmark "
                            "this time")


def _write_json(path: Path, report: GateReport) -> None:
    from pytest_gputrain.outputs import write_output
    from pytest_gputrain.regression.output import report_json

    try:
        write_output(path, json.dumps(report_json(report), indent=2, allow_nan=False) + "\n")
    except (OSError, ValueError) as exc:
        report.notes.append(f"could not write {path}: {exc}")
        report.errors.append(str(exc))


def _append_markdown(path: Path, report: GateReport) -> None:
    from pytest_gputrain.regression.output import markdown

    try:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(markdown(report))
    except OSError as exc:
        report.notes.append(f"could not append to GITHUB_STEP_SUMMARY {path}: {exc}")
