"""The controller's work: check the store at start-up; compare, save and write outputs at the end.

Runs in the controller only (the single process, or xdist's controller, which receives the
workers' results through ``workeroutput``), so a session is one writer of one run.
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
    compare_session,
    session_fingerprint,
)
from pytest_gputrain.regression.fingerprint import fingerprint_hash, git_commit
from pytest_gputrain.regression.settings import RegressionSettings
from pytest_gputrain.regression.store import ResultRecord, Store, StoreError, inspect


def check_store(settings: RegressionSettings) -> None:
    """Refuse a foreign, corrupt or newer store, or an unknown ``--gpu-compare`` name, up front.

    Read-only: nothing is created or changed here.
    """
    path = settings.store_path
    try:
        state = inspect(path)
        if not settings.compare or settings.compare == "latest":
            return
        if state != "ours":
            raise pytest.UsageError(
                f"gpu_compare / --gpu-compare: no run {settings.compare!r}: the benchmark store "
                f"{path} has no saved runs yet (save one with --gpu-save=NAME)")
        with Store.open(path, create=False) as store:
            if store.find_run(settings.compare) is None:
                names = sorted({run.name for run in store.runs(limit=200)})
                listed = ", ".join(names[:12]) or "none"
                raise pytest.UsageError(
                    f"gpu_compare / --gpu-compare: no saved run {settings.compare!r} in {path} "
                    f"(saved: {listed}; `python -m pytest_gputrain history` lists them); e.g. "
                    "--gpu-compare=latest")
    except StoreError as exc:
        raise pytest.UsageError(f"gpu_store: {exc}") from None


def _record(result: BenchmarkResult, raw: dict[str, Any]) -> ResultRecord:
    return ResultRecord(nodeid=result.nodeid, fingerprint=result.fingerprint,
                        fingerprint_hash=fingerprint_hash(result.fingerprint),
                        rounds=result.rounds, metrics=raw.get("metrics") or result.metrics(),
                        summary=raw.get("summary") or result.summary())


def finish(config: pytest.Config, settings: RegressionSettings,
           records: list[dict[str, Any]], *, save: bool = True) -> GateReport:
    """Compare, save, write JSON and Markdown; never raises into pytest (errors become notes).

    ``save=False`` (an interrupted session) compares and reports but saves nothing.
    """
    results = [BenchmarkResult.from_record(r) for r in records]
    report = GateReport(GateSettings(settings.thresholds, settings.alpha, settings.force),
                        benchmarks=results, compare_spec=settings.compare,
                        save_name=settings.save)
    fingerprint = session_fingerprint(results)
    if settings.save and not save:
        report.notes.append(f"gpu_save={settings.save!r}: the session was interrupted; "
                            "nothing saved")
        settings = replace(settings, save=None)
    if settings.uses_store:
        _use_store(config, settings, report, results, records, fingerprint)
    if settings.json_path is not None:
        _write_json(settings.json_path, report)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and (settings.uses_store or settings.json_path is not None):
        _append_markdown(Path(summary), report)
    return report


def _use_store(config: pytest.Config, settings: RegressionSettings, report: GateReport,
               results: list[BenchmarkResult], records: list[dict[str, Any]],
               fingerprint: dict[str, Any]) -> None:
    path = settings.store_path
    try:
        state = inspect(path)
        if state == "missing" and not settings.save:
            report.notes.append(f"no benchmark store at {path} yet: nothing to compare with "
                                "(save a baseline with --gpu-save=NAME)")
            return
        with Store.open(path, create=True) as store:
            if settings.compare:
                prefer = fingerprint_hash(fingerprint) if fingerprint else None
                report.baseline = store.find_run(settings.compare, prefer_hash=prefer)
                if report.baseline is None:
                    report.notes.append(f"no saved run matches gpu_compare="
                                        f"{settings.compare!r}: nothing compared")
                else:
                    baseline = store.results(report.baseline.id)
                    report.comparisons = compare_session(results, baseline, report.settings)
                    missing = sorted(set(baseline) - {r.nodeid for r in results})
                    if missing:
                        report.notes.append(f"{len(missing)} test(s) of the baseline did not "
                                            "run a benchmark this time")
            if settings.save:
                if not results:
                    report.notes.append(f"gpu_save={settings.save!r}: no gpu_benchmark result "
                                        "in this session (passed tests only); nothing saved")
                    return
                report.commit = git_commit(Path(config.rootpath))
                saved = [_record(result, raw) for result, raw in zip(results, records,
                                                                      strict=True)]
                run_id = store.save_run(settings.save, fingerprint,
                                        fingerprint_hash(fingerprint), report.commit, saved)
                report.saved_run = store.run(run_id)
    except StoreError as exc:
        report.notes.append(f"benchmark store error: {exc}")
        report.errors.append(str(exc))


def _write_json(path: Path, report: GateReport) -> None:
    from pytest_gputrain.regression.output import report_json

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report_json(report), indent=2, allow_nan=False) + "\n",
                        encoding="utf-8")
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
