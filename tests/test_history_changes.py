"""Steps in a branch's history (``history --changes``), the site (``history --html``) and the
drift over a look-back window (``compare --lookback``, ``--gpu-lookback``), on both store
backends (SQLite and a real PostgreSQL server)."""

from __future__ import annotations

import json
import math
import random
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_gputrain.cli import main as cli_main
from pytest_gputrain.regression import change_points, fingerprint
from pytest_gputrain.regression.branch_history import Series, build_series, find_changes
from pytest_gputrain.regression.drift import find_drift
from pytest_gputrain.regression.store import ResultRecord
from pytest_gputrain.regression.store_backends import open_store
from pytest_gputrain.regression.store_location import Location

NODE = "tests/perf/test_step.py::test_train_step"
OTHER = "tests/perf/test_step.py::test_eval"
FINGERPRINT = {"device_type": "cuda", "gpu_name": "NVIDIA H200", "driver_version": "570.86.15",
               "torch_version": "2.11.0+cu130", "torch_cuda": "13.0", "cudnn_version": "91200",
               "python": "CPython 3.12", "platform": "linux-x86_64"}
UPGRADED = {**FINGERPRINT, "driver_version": "580.159.04"}


def noisy(rng: random.Random, level: float, n: int, spread: float = 0.003) -> list[float]:
    return [level * math.exp(rng.gauss(0, spread)) for _ in range(n)]


def record(nodeid: str, value: float, print_: dict[str, Any] = FINGERPRINT,
           peak: int = 2**30) -> ResultRecord:
    """A session whose fastest clean step is ``value``."""
    rounds = [value * (1 + 0.01 * k / 30) for k in range(30)]
    return ResultRecord(nodeid, print_, fingerprint.fingerprint_hash(print_), len(rounds),
                        {"step_time": rounds, "peak_vram": [peak, peak],
                         "throttled": [False] * len(rounds)}, {})


def save(location: Location, name: str, values: list[float], *, upgrade_at: int | None = None,
         first_commit: int = 0, peak_from: int | None = None) -> None:
    """One run a session, each at its own commit; the driver upgraded from ``upgrade_at``."""
    with open_store(location) as store:
        for i, value in enumerate(values):
            print_ = UPGRADED if upgrade_at is not None and i >= upgrade_at else FINGERPRINT
            peak = 2**30 + (2**28 if peak_from is not None and i >= peak_from else 0)
            store.save_run(name, print_, fingerprint.fingerprint_hash(print_),
                           f"{first_commit + i:04d}" + "c" * 36,
                           [record(NODE, value, print_, peak),
                            record(OTHER, value / 2, print_)])


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    if request.param == "sqlite":
        return tmp_path / "benchmarks.sqlite"
    return str(request.getfixturevalue("postgres_url"))


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli_main([*args])
    out, err = capsys.readouterr()
    return code, out, err


# -- finding steps ---------------------------------------------------------------------------


def test_a_two_percent_step_is_found_three_sessions_after_it() -> None:
    rng = random.Random(1)
    values = noisy(rng, 0.010, 30) + noisy(rng, 0.0102, 3)
    steps = change_points.find_steps(values)
    assert [s.index for s in steps] == [30]
    assert steps[0].change == pytest.approx(0.02, abs=0.004)
    assert steps[0].p_value < change_points.DEFAULT_ALPHA and steps[0].confidence > 0.999
    assert change_points.find_steps(values[:32]) == []  # two sessions after it: not yet


def test_no_step_in_a_hundred_unchanged_sessions_nor_at_host_paced_ones() -> None:
    rng = random.Random(2)
    values = noisy(rng, 0.010, 100)
    assert change_points.find_steps(values) == []
    values[40] *= 1.3  # two sessions at the host's pace, then the old level again
    values[41] *= 1.25
    values[70] *= 1.2
    assert change_points.strays(values) == [40, 41, 70]
    assert change_points.find_steps(values) == []


def test_peak_memory_steps_are_exact() -> None:
    values = [1e9] * 20 + [1.1e9] * 5
    (step,) = change_points.find_steps(values)
    assert (step.index, step.change, step.p_value) == (20, pytest.approx(0.1), 0.0)
    assert change_points.find_steps([1e9] * 20 + [1.001e9] * 5) == []  # below --min-change


def test_values_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        change_points.find_steps([1.0, 0.0, 1.0])


def test_without_ruptures_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ruptures", None)
    with pytest.raises(change_points.ChangePointsUnavailable,
                       match=r"pip install 'pytest-gputrain\[changes\]'"):
        change_points.find_steps([1.0] * 10)


def test_a_driver_upgrade_at_the_step_is_its_likely_cause() -> None:
    rng = random.Random(3)
    values = noisy(rng, 0.010, 20) + noisy(rng, 0.0105, 10)
    entries = []
    for i, value in enumerate(values):
        print_ = UPGRADED if i >= 20 else FINGERPRINT
        run = _run(i, print_)
        entries.append((run, record(NODE, value, print_)))
    (series,) = build_series(entries, NODE, metrics=("step_time",))
    (change,) = find_changes(series).changes
    assert change.first.run.id == 21 and change.last_before.run.id == 20
    assert change.cause == "driver_version: '570.86.15' -> '580.159.04'"


def _run(index: int, print_: dict[str, Any]) -> Any:
    from pytest_gputrain.regression.store import RunInfo

    return RunInfo(index + 1, "main", f"2026-11-{1 + index // 4:02d}", print_,
                   fingerprint.fingerprint_hash(print_), f"{index:040x}")


def test_drift_of_sub_threshold_steps_names_them() -> None:
    rng = random.Random(4)
    values = noisy(rng, 0.010, 15) + noisy(rng, 0.0102, 10) + noisy(rng, 0.0104, 10)
    entries = [(_run(i, FINGERPRINT), record(NODE, v)) for i, v in enumerate(values)]
    (series,) = build_series(entries, NODE, metrics=("step_time",))
    drift = find_drift(series.sessions, [0.0104], threshold=0.025, alpha=0.01, nodeid=NODE,
                       name="main")
    assert drift is not None and drift.change == pytest.approx(0.04, abs=0.005)
    assert [c.first.run.id for c in drift.changes] == [16, 26]
    assert "made of +" in drift.describe() and "at run #16 (commit" in drift.describe()
    assert find_drift(series.sessions, [0.0101], threshold=0.025, alpha=0.01) is None


# -- history --changes and --html on both backends -------------------------------------------


def test_changes_on_both_backends(location: Location, capsys: pytest.CaptureFixture[str]
                                  ) -> None:
    rng = random.Random(5)
    save(location, "main", noisy(rng, 0.010, 20) + noisy(rng, 0.0103, 10)
         + noisy(rng, 0.0108, 10), upgrade_at=30, peak_from=35)
    save(location, "nightly", noisy(rng, 0.010, 8), first_commit=100)
    code, out, err = cli(capsys, "history", "--store", str(location), "--changes")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    steps = [line for line in lines if line.startswith("main ")]
    assert len(steps) == 5  # 2 steps of each test's step time, 1 of the tested one's peak
    assert any("#31" in line and "driver_version: '570.86.15' -> '580.159.04' (likely cause)"
               in line for line in steps)
    assert any("#21" in line and "0020cccccc" in line and "+3." in line for line in steps)
    assert lines[-1].startswith("5 change(s) in 8 series (192 sessions in ")
    code, out, _ = cli(capsys, "history", "--store", str(location), "--changes", "--test",
                       NODE, "--name", "main", "--metric", "peak_vram", "--json")
    (series,) = json.loads(out)
    assert (series["name"], series["metric"], len(series["sessions"])) == ("main", "peak_vram",
                                                                             40)
    (change,) = series["changes"]
    assert change["first_run"]["id"] == 36 and change["change"] == pytest.approx(0.25)
    assert change["first_fingerprint"]["driver_version"] == "580.159.04"


def test_site_on_both_backends(location: Location, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(6)
    save(location, "main", noisy(rng, 0.010, 15) + noisy(rng, 0.0105, 6))
    site = tmp_path / "site"
    code, out, _ = cli(capsys, "history", "--store", str(location), "--html", str(site))
    assert code == 0 and out.startswith(f"wrote {site / 'index.html'} (2 test page(s))")
    index = (site / "index.html").read_text(encoding="utf-8")
    pages = sorted((site / "tests").glob("*.html"))
    assert len(pages) == 2 and index.count('class="series-row"') == 4
    assert "+5." in index and "<svg" in index
    for page in [site / "index.html", *pages]:
        text = page.read_text(encoding="utf-8")
        # Inline only: no script, style or link fetched (the browser test watches requests).
        assert ' src="' not in text and 'href="http' not in text and "<link" not in text
        assert "Content-Security-Policy" in text
    train = next(p for p in pages if "test_train_step" in p.name)
    text = train.read_text(encoding="utf-8")
    assert 'id="gputrain-history"' in text and "0015cccccc" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--changes", "--test", "tests/none.py::test_x"],
     "no saved result for 'tests/none.py::test_x' in "),
    (["--changes", "--name", "nope"], "no run saved under the name 'nope'"),
    (["--changes", "--min-change", "lots"], "--min-change: "),
    (["--changes", "--min-change", "80%"], "must lie above 0 and at most 50 %"),
    (["--changes", "--test", NODE, "--png", "x.png"], "does not go with --changes or --html"),
    (["--changes", "--limit", "0"], "--limit 0 must lie between 1 and"),
])
def test_bad_arguments_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        args: list[str], message: str) -> None:
    store = tmp_path / "benchmarks.sqlite"
    save(store, "main", [0.010] * 8)
    code, out, err = cli(capsys, "history", "--store", str(store), *args)
    assert code == 2 and out == "" and message in err, err


def test_an_empty_store_a_file_in_the_way_and_no_ruptures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "benchmarks.sqlite"
    open_store(store).close()
    code, _, err = cli(capsys, "history", "--store", str(store), "--changes")
    assert code == 2 and "no saved runs in" in err and "--gpu-save=NAME" in err
    save(store, "main", [0.010] * 8)
    (tmp_path / "taken").write_text("")
    code, _, err = cli(capsys, "history", "--store", str(store), "--html",
                       str(tmp_path / "taken"))
    assert code == 2 and "taken is a file, not a folder" in err, err
    monkeypatch.setitem(sys.modules, "ruptures", None)
    code, _, err = cli(capsys, "history", "--store", str(store), "--changes")
    assert code == 2 and "pip install 'pytest-gputrain[changes]'" in err


# -- drift in compare --------------------------------------------------------------------------


def test_compare_lookback_reports_drift_on_both_backends(
        location: Location, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(7)
    # Two sub-threshold steps of 2 % on main, then a pull request like main's newest.
    save(location, "main", noisy(rng, 0.010, 12) + noisy(rng, 0.0102, 8)
         + noisy(rng, 0.010404, 8))
    with open_store(location) as store:
        newest = store.runs(name="main", limit=1)[0]
    save(location, "pr-1", noisy(rng, 0.010404, 3), first_commit=500)
    args = ["compare", "main", "pr-1", "--store", str(location), "--regression",
            "step_time:2.5%"]
    code, out, _ = cli(capsys, *args)
    assert code == 0 and "DRIFT" not in out
    code, out, _ = cli(capsys, *args, "--lookback", "30")
    assert code == 0, out  # a drift is a warning: the pull request did not make it
    (line,) = [line for line in out.splitlines() if line.startswith(f"DRIFT {NODE} ")]
    assert re.match(rf"DRIFT {NODE} step_time: \+[34]\.\d\d % against the level of 'main' at "
                    r"the start of its last 28 sessions \(run #1, ", line), line
    assert "at run #13 (commit 0012cccccc)" in line and "at run #21 (commit 0020cccccc)" in line
    code, out, _ = cli(capsys, *args, "--lookback", "30", "--format", "json")
    drifts = json.loads(out)["drifts"]
    assert {d["nodeid"] for d in drifts} == {NODE, OTHER}
    assert all(d["window_runs"][-1] == newest.id for d in drifts)


def test_compare_lookback_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    store = tmp_path / "benchmarks.sqlite"
    save(store, "main", [0.010] * 8)
    code, _, err = cli(capsys, "compare", "main", "latest", "--store", str(store),
                       "--lookback", "3")
    assert code == 2 and "--lookback 3 must lie between 6 and 10000 sessions" in err


PLUGIN_TEST = """
from pytest_gputrain.regression import benchmark


def test_train_step(gpu_benchmark, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(benchmark, "_clock", lambda: clock[0])

    def step():
        clock[0] += 0.0110

    gpu_benchmark(step, rounds=20, warmup=1, device="cpu")
"""


def test_gpu_lookback_reports_drift_in_the_session(pytester: pytest.Pytester) -> None:
    """``pytest --gpu-compare=main --gpu-lookback=30``: main's newest sessions are this
    session's pace (ok), but main drifted to it in two steps from 10 ms (a drift)."""
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_perf=PLUGIN_TEST)
    store = pytester.path / ".gputrain" / "benchmarks.sqlite"
    cpu = fingerprint.collect("cpu")
    rng = random.Random(8)
    nodeid = "test_perf.py::test_train_step"
    with open_store(store) as opened:
        values = noisy(rng, 0.0100, 12, 0.001) + noisy(rng, 0.0105, 8, 0.001) \
            + noisy(rng, 0.0110, 8, 0.001)
        for i, value in enumerate(values):
            opened.save_run("main", cpu, fingerprint.fingerprint_hash(cpu), f"{i:040x}",
                            [record(nodeid, value, cpu)])
    result = pytester.runpytest("-p", "no:cacheprovider", "--gpu-compare=main",
                                "--gpu-lookback=30", "--gpu-regression=step_time:5%")
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"DRIFT {nodeid} step_time: +*% against the level of 'main'*made "
                                 "of +*at run #13*at run #21*"])


@pytest.mark.parametrize("value", ["2", "ten", "20000"])
def test_gpu_lookback_bad_values_are_usage_errors(pytester: pytest.Pytester, value: str) -> None:
    pytester.makeini("[pytest]\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--gpu-compare=latest",
                                f"--gpu-lookback={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*: --gpu-lookback: *e.g. 30*"])


def test_gpu_lookback_has_help_and_an_ini_twin(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--gpu-lookback=N*", "*gpu_lookback (*):*"])


def test_series_json_lists_its_sessions() -> None:
    entries = [(_run(i, FINGERPRINT), record(NODE, 0.010)) for i in range(3)]
    series: Series = build_series(entries, NODE, metrics=("step_time",))[0]
    assert [s["run"] for s in series.to_json()["sessions"]] == [1, 2, 3]  # type: ignore[index]
