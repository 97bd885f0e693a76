"""The regression gate end to end, through pytester: sessions saved and compared, outputs,
options, xdist, the compare command and the CI recipe, on both store backends."""

from __future__ import annotations

import json
import sqlite3
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Imported up front: pytester's in-process runs drop modules first imported inside them.
import pytest_gputrain.regression.benchmark
import pytest_gputrain.regression.compare_command
import pytest_gputrain.regression.gate
import pytest_gputrain.regression.history
import pytest_gputrain.regression.output
import pytest_gputrain.regression.process_state
import pytest_gputrain.regression.store_postgres
import pytest_gputrain.regression.store_sqlite  # noqa: F401
from pytest_gputrain.regression.store_backends import open_store

# A conftest for the inner runs: a fake clock the step advances, so timings are exact and
# reproducible (STEP_FACTOR scales the step, STEP_SEED varies the noise of a session: each
# seed is another session's luck).
FAKE_CLOCK_CONFTEST = """
import os
import random

import pytest

from pytest_gputrain.regression import benchmark


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def fake_step(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(benchmark, "_clock", clock)
    factor = float(os.environ.get("STEP_FACTOR", "1"))
    rng = random.Random(int(os.environ.get("STEP_SEED", "0")))
    session = rng.lognormvariate(0, 0.001)  # this session's luck: 0.1 % between sessions
    # drawn up front: the step's own Python then runs the same bytecodes every time, as a
    # training step's does (normalvariate's rejection loop would not)
    luck = iter([rng.lognormvariate(0, 0.005) for _ in range(2000)])

    def step():
        clock.now += 0.010 * factor * session * next(luck)
        return "stepped"

    return step
"""

FAKE_TESTS = """
def test_train(gpu_benchmark, fake_step):
    result = gpu_benchmark(fake_step, rounds=40, warmup=2, device="cpu")
    assert result.rounds == 40
    assert result.returned == "stepped"


def test_eval(gpu_benchmark, fake_step):
    gpu_benchmark(fake_step, rounds=30, device="cpu")


def test_plain():
    pass
"""


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GITHUB_STEP_SUMMARY", "STEP_FACTOR", "STEP_SEED", "GITHUB_SHA",
                 "CI_COMMIT_SHA", "BUILDKITE_COMMIT", "GIT_COMMIT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\n")
    pytester.makeconftest(FAKE_CLOCK_CONFTEST)
    pytester.makepyfile(test_steps=FAKE_TESTS)
    return pytester


def store_path(pytester: pytest.Pytester) -> Path:
    return pytester.path / ".gputrain" / "benchmarks.sqlite"


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str,
        factor: float = 1.0, seed: int = 0) -> pytest.RunResult:
    monkeypatch.setenv("STEP_FACTOR", str(factor))
    monkeypatch.setenv("STEP_SEED", str(seed))
    return pytester.runpytest("-p", "no:cacheprovider", *args)


def save_sessions(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str,
                  count: int, *args: str, factor: float = 1.0, first_seed: int = 100) -> None:
    """``count`` sessions saved under one name (a baseline of several sessions)."""
    for i in range(count):
        result = run(pytester, monkeypatch, f"--gpu-save={name}", *args, factor=factor,
                     seed=first_seed + i)
        assert result.ret == 0, result.stdout.str()


def test_save_then_compare_finds_regression(project: pytest.Pytester,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    saved = run(project, monkeypatch, "--gpu-save=main")
    saved.assert_outcomes(passed=3)
    assert saved.ret == 0
    saved.stdout.fnmatch_lines(["*gpu benchmarks*", "*test_steps.py::test_train*cpu*40*",
                                "saved run #1 'main'*with 2 result(s)"])
    save_sessions(project, monkeypatch, "main", 2)
    out = project.path / "bench.json"
    summary = project.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    slow = run(project, monkeypatch, "--gpu-compare=main", f"--gpu-benchmark-json={out}",
               factor=1.10, seed=1)
    slow.assert_outcomes(passed=3)
    assert slow.ret == 1
    slow.stdout.fnmatch_lines([
        "this session compared with 'main' runs #1, #2, #3 (3 sessions)",
        "a regression needs a change past the threshold (step_time 5 %, peak_vram 2 %) and "
        "p < 0.01 over sessions*",
        "*test*metric*sessions (base/cur)*baseline*current*change*detectable*p*verdict*",
        "*test_steps.py::test_eval*step_time*3/1*ms*ms*+*%*%*REGRESSION (> 5 %)*",
        "*test_steps.py::test_train*step_time*3/1*REGRESSION*",
        "REGRESSION test_steps.py::test_eval step_time: +*past the 5 % threshold, and p = *"
        "over sessions (3 vs 1 session(s), spread *",
        "performance regression: *test_train step_time +*",
    ])
    document = json.loads(out.read_text())
    assert document["kind"] == "pytest-gputrain-benchmarks"
    assert document["schema_version"] == 3
    assert document["failed"] is True
    assert document["summary"]["regression"] == 2
    assert [r["name"] for r in document["baseline"]["runs"]] == ["main"] * 3
    by_test = {c["nodeid"]: c for c in document["comparisons"] if c["metric"] == "step_time"}
    train = by_test["test_steps.py::test_train"]
    assert train["verdict"] == "regression"
    assert 0.07 < train["change"] < 0.13
    assert train["baseline"]["sessions"] == 3 and train["current"]["sessions"] == 1
    assert train["spread"]["df"] == 2 and train["spread"]["df_sides"] == 2
    assert 0.05 < train["detectable_change"] < 0.09
    assert len(document["benchmarks"]) == 2
    assert len(document["benchmarks"][0]["metrics"]["step_time"]) == 30
    markdown = summary.read_text()
    assert markdown.startswith("## GPU performance gate")
    assert "**Regression**" in markdown
    assert "| test_steps.py::test_train" in markdown


def test_the_gate_is_a_section_of_the_diagnosis_reports(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
        use_facts: Callable[..., Any]) -> None:
    use_facts("cpu_laptop")
    save_sessions(project, monkeypatch, "main", 3)
    reports = ("--gpu-report=report.json", "--gpu-report=report.md", "--gpu-fail-on=never")
    slow = run(project, monkeypatch, "--gpu-compare=main", *reports, factor=1.10, seed=1)
    slow.assert_outcomes(passed=3)
    assert slow.ret == 1  # the gate fails the run; the diagnosis does not
    section = json.loads((project.path / "report.json").read_text())["sections"]["benchmarks"]
    assert section["compare"] == "main" and section["failed"] is True
    assert [run["name"] for run in section["baseline_runs"]] == ["main"] * 3
    assert section["summary"]["regression"] == 2
    by_test = {c["nodeid"]: c for c in section["comparisons"] if c["metric"] == "step_time"}
    train = by_test["test_steps.py::test_train"]
    assert (train["metric"], train["verdict"]) == ("step_time", "regression")
    assert 0.07 < train["change"] < 0.13 and train["p_value"] < 0.01
    assert train["baseline"]["sessions"] == 3 and train["current"]["sessions"] == 1
    assert train["baseline"]["value"] < train["current"]["value"]
    # Each compared test's rounds, for the HTML report's steps lane: every baseline session's
    # and this session's, in seconds.
    steps = section["steps"]["test_steps.py::test_train"]
    assert steps["metric"] == "step_time" and len(steps["baseline"]) == 3
    rounds = {len(r) for r in steps["baseline"]} | {len(steps["current"])}
    assert len(rounds) == 1 and rounds.pop() >= 10  # every session timed as many rounds
    assert statistics.median(steps["current"]) > statistics.median(steps["baseline"][0])
    markdown = (project.path / "report.md").read_text()
    assert "### benchmarks\n\n**Regression** :x:" in markdown
    assert "| test_steps.py::test_train" in markdown and "#### Benchmarks" in markdown
    assert "## GPU performance gate" not in markdown  # the diagnosis's report has its own title

    # Without the gate (no benchmark, no store) the reports have no such section.
    project.makepyfile(test_steps="def test_plain():\n    pass\n")
    plain = project.runpytest("-p", "no:cacheprovider", "--gpu-report=plain.json")
    assert plain.ret == 0, plain.stdout.str()
    assert "benchmarks" not in json.loads((project.path / "plain.json").read_text())["sections"]


def test_one_session_a_side_cannot_tell(project: pytest.Pytester,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same code in two sessions that differ by a session's luck (here 30 %), rounds tight
    inside each: never "improvement, p = 1e-31"; the gate says it cannot tell, and what it
    saw."""
    run(project, monkeypatch, "--gpu-save=main")
    out = project.path / "bench.json"
    result = run(project, monkeypatch, "--gpu-compare=main", f"--gpu-benchmark-json={out}",
                 factor=0.7, seed=1)
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "*test_steps.py::test_train*step_time*1/1*-*%*–*–*cannot tell*",
        "cannot tell (2 metric(s)): *step_time saw -*%, but with 1 baseline and 1 current "
        "session(s) and no repeated sessions*Run 2 or more sessions a side*",
        "gate passed with a warning: 2 ok, 2 cannot tell (cannot-tell policy: warn)",
    ])
    assert "improved" not in result.stdout.str()
    document = json.loads(out.read_text())
    rows = [r for r in document["comparisons"] if r["metric"] == "step_time"]
    assert {r["verdict"] for r in rows} == {"cannot_tell"} and len(rows) == 2
    assert all(r["p_value"] is None and r["detectable_change"] is None for r in rows)
    assert all(r["sessions_to_decide"] is None for r in rows)  # the spread is unknown
    # the step's Python counted the same in both sessions: the exact counter is "ok"
    assert {(r["metric"], r["verdict"]) for r in document["comparisons"]
            if r["metric"] != "step_time"} == {("bytecodes", "ok")}
    assert document["summary"]["cannot_tell"] == 2 and document["summary"]["ok"] == 2
    assert document["settings"]["cannot_tell"] == "warn"
    assert document["cannot_tell"] == {"policy": "warn", "count": 2, "warned": True,
                                       "session_budget": None, "more_sessions": False,
                                       "sessions_to_decide": None}
    assert document["failed"] is False


@pytest.mark.parametrize(("args", "ini", "policy", "line"), [
    (["--gpu-cannot-tell=fail"], "", "fail",
     "gate failed: 2 ok, 2 cannot tell (cannot-tell policy: fail)"),
    ([], "gpu_cannot_tell = fail", "fail",
     "gate failed: 2 ok, 2 cannot tell (cannot-tell policy: fail)"),
    (["--gpu-cannot-tell=pass"], "gpu_cannot_tell = fail", "pass",
     "gate passed: 2 ok, 2 cannot tell"),
    (["--gpu-cannot-tell=WARN"], "", "warn",
     "gate passed with a warning: 2 ok, 2 cannot tell (cannot-tell policy: warn)"),
])
def test_cannot_tell_policy(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                            args: list[str], ini: str, policy: str, line: str) -> None:
    """What a "cannot tell" does to the session: the command line over the ini file; "fail"
    fails the session as a regression does, and the reports say so."""
    project.makeini(f"[pytest]\n{ini}\n")
    run(project, monkeypatch, "--gpu-save=main")
    result = run(project, monkeypatch, "--gpu-compare=main", "--gpu-report=report.json",
                 "--gpu-fail-on=never", *args, factor=0.7, seed=1)
    result.assert_outcomes(passed=3)
    assert result.ret == (1 if policy == "fail" else 0)
    result.stdout.fnmatch_lines(["*test_train*step_time*1/1*cannot tell*", line])
    assert "performance regression" not in result.stdout.str()
    section = json.loads((project.path / "report.json").read_text())["sections"]["benchmarks"]
    # the step's bytecodes, counted the same in both sessions, are the two "ok" rows
    assert section["summary"]["cannot_tell"] == 2 and section["summary"]["ok"] == 2
    assert section["failed"] is (policy == "fail")
    assert section["cannot_tell"]["policy"] == policy
    assert section["cannot_tell"]["warned"] is (policy == "warn")
    status = {"fail": "**Cannot tell** :x:", "warn": "Passed, but **cannot tell** :warning:",
              "pass": "Passed :white_check_mark:"}[policy]
    assert section["markdown"].startswith(status)


def test_history_gives_one_session_a_detectable_change(project: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Repeated sessions of an earlier commit tell the spread between sessions: a later
    one-session comparison states the smallest change it could have detected."""
    monkeypatch.setenv("GITHUB_SHA", "aaaa")
    save_sessions(project, monkeypatch, "main", 3)
    monkeypatch.setenv("GITHUB_SHA", "bbbb")
    save_sessions(project, monkeypatch, "main", 1, first_seed=200)
    out = project.path / "bench.json"
    result = run(project, monkeypatch, "--gpu-compare=main", f"--gpu-benchmark-json={out}",
                 seed=7)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["this session compared with run #4 'main' (*, commit bbbb)",
                                 "*test_steps.py::test_train*step_time*1/1*%*ok*"])
    rows = json.loads(out.read_text())["comparisons"]
    assert {row["verdict"] for row in rows} == {"ok"}
    for row in (r for r in rows if r["metric"] == "step_time"):
        assert row["spread"]["df_history"] == 2 and row["spread"]["history_groups"] == 1
        assert row["spread"]["df_sides"] == 0
        assert 0.05 <= row["detectable_change"] < 0.5
    slow = run(project, monkeypatch, "--gpu-compare=main", factor=1.3, seed=8)
    assert slow.ret == 1
    slow.stdout.fnmatch_lines(["*test_train*step_time*1/1*+*%*REGRESSION*"])


def test_unchanged_passes_and_latest(project: pytest.Pytester,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    save_sessions(project, monkeypatch, "main", 3)
    result = run(project, monkeypatch, "--gpu-compare=latest", "--gpu-save=pr", seed=2)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*test_steps.py::test_train*step_time*3/1*ok*",
                                 "gate passed: 4 ok", "saved run #4 'pr'*"])
    with open_store(store_path(project), create=False) as store:
        assert [r.name for r in store.runs()] == ["pr", "main", "main", "main"]


def test_improvement_is_not_a_failure(project: pytest.Pytester,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    save_sessions(project, monkeypatch, "main", 3)
    result = run(project, monkeypatch, "--gpu-compare=main", factor=0.8, seed=3)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*test_train*step_time*-*%*improved*"])


def test_threshold_option_and_ini_twins(project: pytest.Pytester,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    project.makeini("""
        [pytest]
        gpu_save = nightly
        gpu_store = perf/store.sqlite
    """)
    for seed in range(3):
        assert run(project, monkeypatch, seed=seed).ret == 0
    assert (project.path / "perf" / "store.sqlite").is_file()
    project.makeini("""
        [pytest]
        gpu_compare = nightly
        gpu_store = perf/store.sqlite
        gpu_regression = step_time:20%
        gpu_alpha = 0.001
    """)
    result = run(project, monkeypatch, factor=1.10, seed=4)
    assert result.ret == 0  # +10 % is within the 20 % threshold
    result.stdout.fnmatch_lines(["*(step_time 20 %) and p < 0.001 over sessions (t-test on "
                                 "each session's fastest clean step*",
                                 "*test_train*step_time*ok*"])
    project.makeini("""
        [pytest]
        gpu_compare = nightly
        gpu_store = perf/store.sqlite
        gpu_step_summary = median
    """)
    by_median = run(project, monkeypatch, seed=5)
    by_median.stdout.fnmatch_lines(["*t-test on each session's median clean step*"])
    # The command line wins over the ini file.
    strict = run(project, monkeypatch, "--gpu-regression=step_time:5%", "--gpu-alpha=0.01",
                 factor=1.10, seed=4)
    assert strict.ret == 1


def test_real_sleep_slowdown(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_sleep="""
        import os, time

        def test_step(gpu_benchmark):
            pause = float(os.environ["PAUSE"])
            gpu_benchmark(time.sleep, pause, rounds=10, warmup=1, device="cpu")
    """)
    monkeypatch.setenv("PAUSE", "0.002")
    for _ in range(3):
        assert pytester.runpytest("-p", "no:cacheprovider", "--gpu-save=base").ret == 0
    monkeypatch.setenv("PAUSE", "0.008")
    result = pytester.runpytest("-p", "no:cacheprovider", "--gpu-compare=base")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*test_sleep.py::test_step*step_time*3/1*REGRESSION*"])


def test_fingerprint_mismatch_not_comparable(project: pytest.Pytester,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    save_sessions(project, monkeypatch, "main", 3)
    connection = sqlite3.connect(store_path(project))
    for table in ("runs", "results"):
        rows = connection.execute(f"SELECT id, fingerprint FROM {table}").fetchall()
        for row_id, text in rows:
            data = json.loads(text)
            data["torch_version"] = "1.13.0"
            connection.execute(f"UPDATE {table} SET fingerprint = ? WHERE id = ?",
                               (json.dumps(data), row_id))
    connection.commit()
    connection.close()
    result = run(project, monkeypatch, "--gpu-compare=main", factor=1.5, seed=5)
    assert result.ret == 0  # not compared, so not failed
    result.stdout.fnmatch_lines([
        "*test_train*step_time*not comparable*",
        "not comparable: test_steps.py::test_train: environment differs: "
        "torch_version: '1.13.0' -> *",
    ])
    forced = run(project, monkeypatch, "--gpu-compare=main", "--gpu-compare-force", factor=1.5,
                 seed=5)
    assert forced.ret == 1
    forced.stdout.fnmatch_lines(["*test_train*step_time*REGRESSION (> 5 %) (forced)*"])


def test_unlike_sessions_are_named(project: pytest.Pytester,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN autotuning on one side and not the other: the verdict says the sides are unlike."""
    project.makeconftest(FAKE_CLOCK_CONFTEST + """

@pytest.fixture(autouse=True)
def cudnn_benchmark(monkeypatch):
    import torch

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", os.environ.get("AUTOTUNE") == "1")
""")
    monkeypatch.setenv("AUTOTUNE", "0")
    save_sessions(project, monkeypatch, "main", 3)
    monkeypatch.setenv("AUTOTUNE", "1")
    result = run(project, monkeypatch, "--gpu-compare=main", factor=1.2, seed=9)
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*test_train*step_time*REGRESSION (> 5 %) (unlike)*",
        "REGRESSION *test_train step_time: *; the sides are not like for like: "
        "cudnn_benchmark: False -> True",
        "not like for like: test_steps.py::test_train: cudnn_benchmark: False -> True",
    ])


def test_profiler_earlier_in_the_process_is_recorded(pytester: pytest.Pytester) -> None:
    """A torch profiler that ran in an earlier test leaves CUPTI attached: the benchmark's
    conditions say so. (A subprocess: the watch on torch's profiler is per process.)"""
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_profiled="""
        import torch

        def test_a_profiled_test():
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                torch.ones(4).sum()

        def test_b_benchmark(gpu_benchmark):
            result = gpu_benchmark(lambda: torch.ones(4).sum(), rounds=8, warmup=0,
                                   device="cpu")
            assert result.conditions["profiler_before"] is True
            assert result.conditions["cudnn_benchmark"] is False
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["1 benchmark(s) ran after a torch profiler in the same process "
                                 "(e.g. test_profiled.py::test_b_benchmark): kineto leaves CUPTI "
                                 "attached*set TEARDOWN_CUPTI=1"])
    alone = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "benchmark")
    alone.assert_outcomes(failed=1)
    alone.stdout.fnmatch_lines(["*assert False is True*"])


def test_new_test_without_baseline(project: pytest.Pytester,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    run(project, monkeypatch, "--gpu-save=main", "-k", "train")
    result = run(project, monkeypatch, "--gpu-compare=main")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*test_eval*step_time*new (no baseline)*"])


def test_compare_latest_with_no_store_is_a_note(project: pytest.Pytester,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(project, monkeypatch, "--gpu-compare=latest")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*no benchmark store at*nothing to compare with*"])
    assert not store_path(project).exists()


def test_failed_test_results_are_not_saved(pytester: pytest.Pytester,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_f="""
        def test_fails(gpu_benchmark):
            gpu_benchmark(lambda: None, rounds=5, warmup=0, device="cpu")
            assert False

        def test_twice(gpu_benchmark):
            gpu_benchmark(lambda: None, rounds=5, warmup=0, device="cpu")
            gpu_benchmark(lambda: None, rounds=5, warmup=0, device="cpu")

        def test_ok(gpu_benchmark):
            gpu_benchmark(lambda: None, rounds=5, warmup=0, device="cpu")
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--gpu-save=x")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*can time one step per test*"])
    with open_store(store_path(pytester), create=False) as store:
        (saved,) = store.runs()
        assert list(store.results(saved.id)) == ["test_f.py::test_ok"]


def test_plugin_start_up_stays_light(pytester: pytest.Pytester) -> None:
    """No store backend, no torch, no pydantic at load: a plain suite pays nothing."""
    pytester.makepyfile(test_light="""
        import sys

        def test_nothing_heavy_loaded():
            heavy = ("torch", "pydantic", "sqlite3", "psycopg", "pytest_gputrain.regression.store",
                     "pytest_gputrain.regression.benchmark")
            assert [name for name in heavy if name in sys.modules] == []
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist",
                                           "-p", "no:hypothesispytest")
    result.assert_outcomes(passed=1)


def test_plain_session_opens_no_store(project: pytest.Pytester,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(project, monkeypatch)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*gpu benchmarks*", "*test_train*cpu*40*"])
    assert not (project.path / ".gputrain").exists()
    quiet = project.runpytest("-p", "no:cacheprovider", "-k", "plain")
    assert "gpu benchmarks" not in quiet.stdout.str()


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu-regression=step_time=5"], "*: --gpu-regression: 'step_time=5'*"
                                       "not METRIC:PERCENT*auto,step_time:2%*kernels:0*"),
    (["--gpu-regression=speed:5%"],
     "*unknown metric 'speed'*known: step_time, gpu_time, peak_vram*"),
    (["--gpu-regression=step_time:500%"],
     "*: --gpu-regression: '500%' in 'step_time:500%' is not a percentage from 0 to 100*"),
    (["--gpu-alpha=2"], "*: --gpu-alpha: '2' must lie strictly between 0 and 0.5*"),
    (["--gpu-alpha=often"], "*'often' is not a number*0.01*"),
    (["--gpu-step-summary=mean"], "*: --gpu-step-summary: 'mean' is not a "
                                  "step summary; expected one of min, median*"),
    (["--gpu-cannot-tell=ignore"], "*: --gpu-cannot-tell: 'ignore' is not a "
                                   "policy for 'cannot tell'; expected one of pass, warn, fail*"),
    (["--gpu-save=latest"], "*: --gpu-save: 'latest' is reserved*"),
    (["--gpu-benchmark-min-rounds=50", "--gpu-benchmark-max-rounds=10"],
     "*: --gpu-benchmark-max-rounds: 10 is below --gpu-benchmark-min-rounds 50*"),
    (["--gpu-benchmark-warmup=-1"], "*'-1' must lie between 0 and 10000*"),
    (["--gpu-compare=nope"], "*no run 'nope'*has no saved runs yet*"),
    (["--gpu-store=mysql://db/x"], "*: --gpu-store: 'mysql':// is not a store*"
                                   "postgresql://*"),
    # A URL libpq cannot read shows nothing after its scheme: any part may be a password.
    (["--gpu-store=postgresql://[::1"], "*: --gpu-store: postgresql://*** is not a valid "
                                        "PostgreSQL URL: libpq cannot read it as meant*"
                                        "e.g. postgresql://*"),
    (["--gpu-store=postgresql://ci:s3cret@[::1/db"],
     "*: --gpu-store: postgresql://*** is not a valid PostgreSQL URL*"),
    (["--gpu-benchmark-disable", "--gpu-save=x"],
     "*: --gpu-benchmark-disable: measures nothing, so --gpu-save would*"),
    (["--gpu-benchmark-skip", "--gpu-compare=x"],
     "*: --gpu-benchmark-skip: measures nothing, so --gpu-compare would*"),
    (["--gpu-benchmark-skip", "--gpu-benchmark-disable"],
     "*cannot be combined with --gpu-benchmark-skip*"),
    (["--gpu-save=x", "--gpu-store=postgresql://ci:pw@127.0.0.1:1/db?connect_timeout=3"],
     "*gpu_store: cannot connect to the PostgreSQL store postgresql://ci:***@127.0.0.1:1/db*"),
])
def test_bad_options_are_usage_errors(project: pytest.Pytester, args: list[str],
                                      message: str) -> None:
    result = project.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert "s3cret" not in result.stderr.str()


def test_unknown_compare_name_lists_saved_runs(project: pytest.Pytester,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    run(project, monkeypatch, "--gpu-save=main")
    result = project.runpytest("-p", "no:cacheprovider", "--gpu-compare=mian")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no saved run 'mian'*(saved: main;*"])


@pytest.mark.parametrize("option", ["--gpu-save=x", "--gpu-compare=latest", "--gpu-compare=x"])
@pytest.mark.parametrize("kind", ["garbage", "corrupt_sqlite", "foreign_sqlite"])
def test_foreign_or_corrupt_store_left_untouched(project: pytest.Pytester, option: str,
                                                 kind: str) -> None:
    path = store_path(project)
    path.parent.mkdir()
    if kind == "garbage":
        path.write_bytes(b"\x00\x01 not a database " * 500)
    elif kind == "corrupt_sqlite":
        path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 8000)
    else:
        connection = sqlite3.connect(path)
        connection.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        connection.execute("INSERT INTO invoices (total) VALUES (12.5)")
        connection.commit()
        connection.close()
    before = path.read_bytes()
    listing = sorted(p.name for p in path.parent.iterdir())
    result = project.runpytest("-p", "no:cacheprovider", option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*gpu_store: *benchmarks.sqlite*left untouched*"])
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == listing


def test_store_folder_taken_by_a_file_is_a_usage_error(project: pytest.Pytester) -> None:
    blocker = project.path / ".gputrain"
    blocker.write_text("notes\n")
    result = project.runpytest("-p", "no:cacheprovider", "--gpu-save=x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*gpu_store: cannot create the folder of the benchmark store "
                                 "*.gputrain: *.gputrain is a file, not a folder. Set gpu_store*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert blocker.read_text() == "notes\n"


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux's /sys")
def test_store_in_a_folder_that_refuses_writes_is_a_usage_error(
        project: pytest.Pytester) -> None:
    # A rootdir on a read-only file system: /sys refuses new folders even to root.
    result = project.runpytest("-p", "no:cacheprovider", "--gpu-save=x",
                               "--gpu-store=/sys/gputrain-test/benchmarks.sqlite")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*gpu_store: cannot create the benchmark store "
                                 "/sys/gputrain-test/benchmarks.sqlite: /sys is not writable*"])


def test_store_that_cannot_be_written_at_the_end_is_reported(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder is taken by a file while the tests run: a clear line, the summary kept."""
    project.makepyfile(test_zz_block="""
        from pathlib import Path

        def test_block_the_store(request):
            (Path(str(request.config.rootpath)) / ".gputrain").write_text("in the way")
    """)
    result = run(project, monkeypatch, "--gpu-save=x")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*benchmark store error: cannot create the folder of the "
                                 "benchmark store*.gputrain is a file, not a folder*",
                                 "*4 passed*"])
    assert "Traceback" not in result.stdout.str()


@pytest.mark.parametrize("version", ["'one'", "1.5"])
def test_store_with_a_schema_version_not_a_number_is_a_usage_error(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    run(project, monkeypatch, "--gpu-save=main")
    connection = sqlite3.connect(store_path(project))
    connection.execute(f"UPDATE gputrain_schema SET version = {version}")
    connection.commit()
    connection.close()
    result = project.runpytest("-p", "no:cacheprovider", "--gpu-compare=main")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*gpu_store: *benchmarks.sqlite: damaged pytest-gputrain store "
                                 "(its schema version * is not a whole number); it was left "
                                 "untouched*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_xdist_workers_results_saved(project: pytest.Pytester) -> None:
    project.makepyfile(test_more="""
        import pytest

        @pytest.mark.parametrize("n", range(6))
        def test_many(gpu_benchmark, fake_step, n):
            gpu_benchmark(fake_step, rounds=10, warmup=0, device="cpu")
    """)
    json_path = project.path / "x.json"
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2",
                                          "--gpu-save=xdist", f"--gpu-benchmark-json={json_path}")
    result.assert_outcomes(passed=9)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["saved run #1 'xdist'*with 8 result(s)"])
    with open_store(store_path(project), create=False) as store:
        (saved,) = store.runs()
        results = store.results(saved.id)
    assert len(results) == 8
    assert {f"test_more.py::test_many[{n}]" for n in range(6)} <= set(results)
    assert len(json.loads(json_path.read_text())["benchmarks"]) == 8
    compared = project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2",
                                            "--gpu-compare=xdist")
    assert compared.ret == 0
    compared.stdout.fnmatch_lines(
        ["gate passed with a warning: 8 ok, 8 cannot tell (cannot-tell policy: warn)"])


def test_history_cli(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_gputrain.regression.history import main

    run(project, monkeypatch, "--gpu-save=main")
    run(project, monkeypatch, "--gpu-save=pr", factor=1.2, seed=1)
    capsys.readouterr()
    monkeypatch.chdir(project.path / ".gputrain")  # the rootdir's, as pytest run here finds it
    assert main([]) == 0
    listing = capsys.readouterr().out
    assert "id    name" in listing and " pr " in listing and " main " in listing
    assert main(["--json", "--name", "pr"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in runs] == ["pr"]
    png = project.path / "h.png"
    assert main(["--test", "test_steps.py::test_train", "--png", str(png)]) == 0
    table = capsys.readouterr().out
    assert "median step" in table and "10." in table and "12." in table
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["--test", "nope"]) == 2
    assert "no saved result for 'nope'" in capsys.readouterr().err
    assert main(["--png", "x.png"]) == 2
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["--test", "test_steps.py::test_train", "--png", str(png)]) == 2
    assert "install 'pytest-gputrain[plot]'" in capsys.readouterr().err


def test_history_without_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_gputrain.regression.history import main

    monkeypatch.chdir(tmp_path)
    assert main([]) == 2
    assert "no benchmark store found" in capsys.readouterr().err
    (tmp_path / "junk.sqlite").write_text("junk")
    assert main(["--store", str(tmp_path / "junk.sqlite")]) == 2
    assert "not an SQLite database" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["history"], ["compare", "base", "head"]])
def test_a_store_url_that_cannot_be_parsed_is_a_clear_error(
        command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_gputrain.cli import main

    assert main([*command, "--store", "postgresql://ci:s3cret@[::1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pytest_gputrain: error: --store: postgresql://*** is not a valid "
                          "PostgreSQL URL: libpq cannot read it as meant (not shown: it may hold "
                          "a password). Percent-encode a reserved character")
    assert err.endswith("e.g. postgresql://ci@db.example.com:5432/benchmarks\n")
    assert "s3cret" not in err


@pytest.mark.parametrize(("ini_name", "ini_text"), [
    ("pytest.ini", "[pytest]\ngpu_store = perf/shared.sqlite\n"),
    ("pyproject.toml", '[tool.pytest.ini_options]\ngpu_store = "perf/shared.sqlite"\n'),
    ("tox.ini", "[pytest]\ngpu_store = perf/shared.sqlite\n"),
    ("setup.cfg", "[tool:pytest]\ngpu_store = perf/shared.sqlite\n"),
])
def test_history_and_compare_find_the_store_of_the_ini_file(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ini_name: str,
        ini_text: str) -> None:
    """``pytest --gpu-save`` writes to the ini file's gpu_store; the commands, run in the
    project (here from a subfolder), find the ini file as pytest does and read the same store,
    relative to the ini file's folder."""
    (pytester.path / ini_name).write_text(ini_text)
    pytester.makeconftest(FAKE_CLOCK_CONFTEST)
    pytester.makepyfile(test_steps=FAKE_TESTS)
    for seed, name in enumerate(("base", "head")):
        result = run(pytester, monkeypatch, f"--gpu-save={name}", seed=seed)
        assert result.ret == 0, result.stdout.str()
    assert (pytester.path / "perf" / "shared.sqlite").is_file()
    assert not store_path(pytester).exists()
    folder = pytester.mkdir("tests")

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest_gputrain", *args],
                              capture_output=True, text=True, check=False, cwd=folder)

    history = command("history", "--json")
    assert history.returncode == 0, history.stderr
    assert [run["name"] for run in json.loads(history.stdout)] == ["head", "base"]
    compared = command("compare", "base", "head")
    assert compared.returncode == 0, compared.stderr
    assert ("gate passed with a warning: 2 ok, 2 cannot tell (cannot-tell policy: warn)"
            in compared.stdout)
    # --store on the command line is relative to the current directory, as --gpu-store is.
    named = command("history", "--store", "../perf/shared.sqlite", "--name", "base", "--json")
    assert named.returncode == 0, named.stderr
    assert [run["name"] for run in json.loads(named.stdout)] == ["base"]


# -- the CUDA timer, against a fake torch (this suite runs without a GPU) --------------------


class _FakeEvent:
    def __init__(self, cuda: _FakeCuda) -> None:
        self.cuda = cuda
        self.at: float | None = None

    def record(self) -> None:
        self.at = self.cuda.gpu_time

    def synchronize(self) -> None:
        self.cuda.log.append("event.synchronize")

    def elapsed_time(self, end: _FakeEvent) -> float:
        assert self.at is not None and end.at is not None
        assert "event.synchronize" in self.cuda.log, "elapsed_time read before a synchronize"
        return (end.at - self.at) * 1000.0


class _FakeCuda:
    def __init__(self) -> None:
        self.gpu_time = 0.0
        self.peak = 0
        self.log: list[str] = []

    def Event(self, enable_timing: bool = False) -> _FakeEvent:  # torch's name
        assert enable_timing
        return _FakeEvent(self)

    def device(self, index: int) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def synchronize(self) -> None:
        self.log.append("device.synchronize")

    def reset_peak_memory_stats(self, index: int) -> None:
        self.log.append("reset")
        self.peak = 0

    def max_memory_allocated(self, index: int) -> int:
        return self.peak


class _FakeTorch:
    def __init__(self) -> None:
        self.cuda = _FakeCuda()


class _FakeSampler:
    """Stands in for the NVML sampler thread: samples at chosen times (fake clock)."""

    def __init__(self, samples: list[Any]) -> None:
        self._samples = samples
        self.started = self.stopped = False

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True

    @property
    def samples(self) -> list[Any]:
        return self._samples


def test_cuda_timer_with_fake_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from pytest_gputrain.regression import benchmark

    torch = _FakeTorch()
    clock = [0.0]
    monkeypatch.setattr(benchmark, "_clock", lambda: clock[0])
    calls = [0]

    def step() -> int:
        calls[0] += 1
        torch.cuda.gpu_time += 0.004 if calls[0] % 7 else 0.008  # every 7th call is slow
        clock[0] += 0.0041
        torch.cuda.peak = 1000 + calls[0]
        return calls[0]

    # Host clock: 3 warm-up steps end at 0.0123 s, where the sampler starts (t = 0). A sample
    # every 10 ms; the one at t = 0.030 s carries a thermal slowdown, the one at 0.060 s a low
    # SM clock.
    samples = [SimpleNamespace(t=0.010 * k, utilization_gpu=95.0,
                               sm_clock=1200.0 if k == 6 else 1980.0,
                               clock_event_reasons=0x20 if k == 3 else 0x0) for k in range(12)]
    sampler = _FakeSampler(samples)
    monkeypatch.setattr(benchmark, "open_sampler", lambda index, enabled: sampler)
    options = benchmark.BenchmarkOptions(warmup=3, min_rounds=10, max_rounds=50, max_time=0.1)
    result = benchmark._measure_cuda(torch, 0, step, (), {}, options, True, "t::cuda")
    # 10 rounds took 0.041 s of host time: 0.059 s left at 4.1 ms a round = 14 more rounds.
    assert result.rounds == 24
    assert calls[0] == 3 + 24
    assert result.timer == "cuda_event" and result.device == "cuda:0"
    assert result.returned == 27
    assert sampler.started and sampler.stopped
    # Nothing between rounds: one device synchronize after the warm-up, one peak reset before
    # each phase, and one event synchronize at the end of each phase.
    assert torch.cuda.log == ["device.synchronize", "reset", "event.synchronize", "reset",
                              "event.synchronize"]
    assert result.step_time[0] == pytest.approx(0.004)
    slow_rounds = [i for i, t in enumerate(result.step_time) if t > 0.006]
    assert slow_rounds == [i - 4 for i in range(7, 28, 7) if i > 3]
    assert result.peak_vram == [1000 + 3 + 10, 1000 + 3 + 24]  # one peak per phase
    assert result.utilization == [95.0] * 24
    # Each round gets the last sample before its end on the GPU's timeline (counted back from
    # each phase's synchronisation at 0.0533 s and 0.1107 s host time, i.e. t = 0.041, 0.0984).
    flagged = [i for i, bad in enumerate(result.throttled) if bad]
    assert flagged and all(result.clock_event_reasons[i] == 0x20 or result.sm_clock[i] == 1200.0
                           for i in flagged)
    assert {result.clock_event_reasons[i] for i in range(24)} == {0x0, 0x20}
    assert 1200.0 in result.sm_clock  # type: ignore[operator]
    assert len(result.clean_step_times()) == 24 - len(flagged)


class _QueueEvent:
    def __init__(self, cuda: _QueueCuda) -> None:
        self.cuda = cuda
        self.at: float | None = None

    def record(self) -> None:
        self.at = self.cuda.enqueue(0.0)

    def synchronize(self) -> None:
        assert self.at is not None
        self.cuda.syncs += 1
        self.cuda.host = max(self.cuda.host, self.at)

    def elapsed_time(self, end: _QueueEvent) -> float:
        assert self.at is not None and end.at is not None
        return (end.at - self.at) * 1000.0


class _QueueCuda:
    """A GPU that runs its stream's work in order, each item when the GPU is free and the host
    has launched it: the host's clock and the GPU's timeline apart, as on a real one."""

    SPIN_RATE = 1e9  # _sleep cycles per second

    def __init__(self) -> None:
        self.host = 0.0  # the host's clock
        self.free_at = 0.0  # when the GPU is done with what it was given
        self.syncs = 0

    def enqueue(self, seconds: float) -> float:
        begins = max(self.free_at, self.host)
        self.free_at = begins + seconds
        return self.free_at

    def Event(self, enable_timing: bool = False) -> _QueueEvent:  # torch's name
        return _QueueEvent(self)

    def _sleep(self, cycles: int) -> None:
        self.enqueue(cycles / self.SPIN_RATE)

    def synchronize(self) -> None:
        self.syncs += 1
        self.host = max(self.host, self.free_at)


def _launch_bound_step(cuda: _QueueCuda, host_s: list[float], gpu_s: float,
                       kernels: int = 50, sync: bool = False) -> Callable[[], None]:
    """A step of ``kernels`` launches: the host spends the next of ``host_s`` on them, the GPU
    ``gpu_s`` in all; ``sync``: it reads a value back at the end (``.item()``)."""
    calls = [0]

    def step() -> None:
        host = host_s[calls[0] % len(host_s)]
        calls[0] += 1
        for _ in range(kernels):
            cuda.host += host / kernels
            cuda.enqueue(gpu_s / kernels)
        if sync:
            cuda.synchronize()
    return step


def test_gpu_time_of_a_launch_bound_step_leaves_out_the_hosts_pace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch-bound step: the host needs 10-16 ms a step (a busy host, another pace every
    round), the GPU 6 ms. Its rounds run at the host's pace; queued behind a spin kernel they
    time the GPU's 6 ms, whatever the host did, with no synchronisation per round."""
    from types import SimpleNamespace

    from pytest_gputrain.regression import benchmark

    cuda = _QueueCuda()
    monkeypatch.setattr(benchmark, "_clock", lambda: cuda.host)
    torch = SimpleNamespace(cuda=cuda)
    step = _launch_bound_step(cuda, [0.010, 0.016, 0.012], 0.006)
    times = benchmark.queued_gpu_times(torch, step, (), {}, 30, round_seconds=0.012)
    assert times is not None and len(times) == 30
    assert times == [pytest.approx(0.006)] * 30
    assert cuda.syncs == 3  # the calibration's, the reference event's, the end's
    # Timed back to back instead, a round takes the host's 10 ms (and its last kernel).
    start, end = cuda.Event(), cuda.Event()
    start.record()
    step()
    end.record()
    assert start.elapsed_time(end) / 1000 == pytest.approx(0.010 + 0.006 / 50)

    # A spin too short for the host's pace: the GPU starts before the step is queued, so
    # those rounds have no GPU time rather than one with the host's gaps in it.
    assert benchmark.queued_gpu_times(torch, step, (), {}, 3, round_seconds=0.004) == [None] * 3
    # A step that synchronises itself is never queued ahead of the GPU.
    synced = _launch_bound_step(cuda, [0.002], 0.006, sync=True)
    assert benchmark.queued_gpu_times(torch, synced, (), {}, 10, 0.006) == [None] * 10
    # A torch without the spin kernel: no GPU time at all.
    assert benchmark.queued_gpu_times(SimpleNamespace(cuda=SimpleNamespace()), step, (), {},
                                      10, 0.01) is None


def test_gpu_time_is_a_metric_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Saved with the result, summarised per session like the step time (its queued rounds
    only), gated as ``gpu_time``, and shown in the benchmarks table."""
    from pytest_gputrain.regression.benchmark import BenchmarkOptions, BenchmarkResult, measure
    from pytest_gputrain.regression.compare import (
        GateReport,
        GateSettings,
        as_record,
        compare_test,
        session_value,
    )
    from pytest_gputrain.regression.output import terminal_lines

    def session(gpu: float, host: float) -> BenchmarkResult:
        queued: list[float | None] = [gpu * (1 + 0.0001 * (i % 5)) for i in range(30)]
        queued[3] = None  # not queued in time
        return BenchmarkResult("t::a", "cuda:0", "cuda_event", 5, [host] * 40, [100],
                               throttled=[False] * 40, gpu_time=queued,
                               fingerprint={"device_type": "cuda"})

    record = as_record(session(0.006, 0.010))
    assert session_value(record, "gpu_time") == (pytest.approx(0.006), 0)
    assert session_value(record, "gpu_time", "median") == (pytest.approx(0.0060012), 0)
    again = BenchmarkResult.from_record(session(0.006, 0.010).to_record())
    assert again.gpu_time is not None and again.gpu_time[3] is None
    assert again.summary()["gpu_time"]["queued"] == 29
    # The host's pace wanders from 10 to 13 ms between sessions; the GPU's 2 % shows.
    baseline = [as_record(session(0.006, host)) for host in (0.010, 0.013, 0.011, 0.0125)]
    slowed = [as_record(session(0.00612, host)) for host in (0.0105, 0.0102, 0.0128, 0.011)]
    gate = GateSettings({"step_time": 0.01, "gpu_time": 0.01})
    rows = {r.metric: r for r in compare_test("t::a", baseline, slowed, gate)}
    assert rows["gpu_time"].verdict == "regression"
    assert rows["step_time"].verdict == "cannot_tell"
    report = GateReport(gate, benchmarks=[session(0.006, 0.010)])
    table = "\n".join(line for line, _ in terminal_lines(report))
    assert "GPU time" in table and "6.001 ms (29/30 queued)" in table
    # On the CPU there is no GPU time to measure.
    options = BenchmarkOptions(warmup=0, min_rounds=2, max_rounds=2)
    assert measure(lambda: None, device="cpu", gpu_time=True, fingerprint=False,
                   options=options).gpu_time is None


def test_samples_for_rounds_counts_back_from_each_synchronisation() -> None:
    from pytest_gputrain.regression.benchmark import samples_for_rounds

    times = [0.010] * 6
    samples = [(t, f"s{t:.2f}") for t in (0.00, 0.02, 0.04, 0.10, 0.12)]
    # Phase 1: rounds 0-2 ended at 0.03, 0.04, 0.05 (synchronised at 0.05); phase 2: rounds 3-5
    # ended at 0.11, 0.12, 0.13.
    found = samples_for_rounds(times, [(0, 3, 0.05), (3, 3, 0.13)], samples)
    assert found == ["s0.02", "s0.04", "s0.04", "s0.10", "s0.12", "s0.12"]
    # A round that ended before the first sample gets the first one; no samples, no sample.
    assert samples_for_rounds([0.01], [(0, 1, -1.0)], samples) == ["s0.00"]
    assert samples_for_rounds(times, [(0, 6, 0.1)], []) == [None] * 6


def test_cpu_timer_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_gputrain.regression import benchmark

    clock = [0.0]
    monkeypatch.setattr(benchmark, "_clock", lambda: clock[0])

    def step() -> None:
        clock[0] += 0.25

    options = benchmark.BenchmarkOptions(warmup=0, min_rounds=3, max_rounds=100, max_time=2.0)
    result = benchmark.measure(step, options=options, device="cpu", fingerprint=False)
    assert result.rounds == 8  # 3 required, then more until 2 s of timed rounds
    assert result.timer == "perf_counter" and result.peak_vram is None
    assert result.median == pytest.approx(0.25)


def test_benchmark_options_validation() -> None:
    from pytest_gputrain.regression.benchmark import BenchmarkOptions

    options = BenchmarkOptions()
    assert (options.warmup, options.min_rounds, options.max_rounds) == (5, 30, 100)
    assert options.override(rounds=50).min_rounds == 50
    assert options.override(rounds=50).max_rounds == 50
    assert options.override(min_rounds=200).max_rounds == 200
    assert options.override(max_rounds=10).min_rounds == 10
    with pytest.raises(ValueError, match="max_rounds=10 is below min_rounds=20"):
        options.override(min_rounds=20, max_rounds=10)
    with pytest.raises(ValueError, match="warmup=-1"):
        options.override(warmup=-1)


def test_device_none_without_torch_in_use_is_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_gputrain.regression.benchmark import resolve_device

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert resolve_device(None) == ("cpu", None)
    assert resolve_device("cpu") == ("cpu", None)


def test_throttled_rounds_left_out_of_comparison() -> None:
    from pytest_gputrain.regression.benchmark import BenchmarkResult
    from pytest_gputrain.regression.compare import GateSettings, as_record, compare_test

    fingerprint = {"device_type": "cuda", "gpu_name": "H200"}

    def session(scale: float, throttled: int = 0, slow_factor: float = 2.0) -> Any:
        times = [scale * (0.010 + 0.0001 * (i % 5)) * (slow_factor if i < throttled else 1)
                 for i in range(40)]
        return as_record(BenchmarkResult("t::a", "cuda:0", "cuda_event", 5, times, [100],
                                         throttled=[i < throttled for i in range(40)],
                                         fingerprint=fingerprint))

    baseline = [session(1.0), session(1.002), session(0.998)]
    gate = GateSettings({"step_time": 0.05, "peak_vram": 0.02})
    # Unchanged, except that 10 rounds ran throttled and took twice as long: left out.
    rows = {r.metric: r for r in compare_test("t::a", baseline, [session(1.0, 10)], gate)}
    assert rows["step_time"].verdict == "ok"
    assert rows["step_time"].current_throttled == 10
    assert rows["peak_vram"].verdict == "ok"
    # Mostly throttled: the session has no summary, so no verdict rather than a wrong one.
    rows = {r.metric: r for r in compare_test("t::a", baseline, [session(1.0, 35)], gate)}
    assert rows["step_time"].verdict == "insufficient_data"
    assert rows["step_time"].current_left_out == 1
    # Without the flags the slow rounds count in the median, which moves; the fastest round,
    # the default summary, is the step's own cost and stays.
    unflagged = session(1.0, 30)
    unflagged.metrics["throttled"] = [False] * 40
    by_median = GateSettings({"step_time": 0.05}, step_summary="median")
    rows = {r.metric: r for r in compare_test("t::a", baseline, [unflagged], by_median)}
    assert rows["step_time"].verdict == "regression"
    rows = {r.metric: r for r in compare_test("t::a", baseline, [unflagged], gate)}
    assert rows["step_time"].verdict == "ok"
    assert rows["step_time"].current_values == (pytest.approx(0.010),)


def test_fastest_step_summary_sees_a_slowdown_of_every_step() -> None:
    """A slowdown of every step moves the fastest round as much as the median; interference
    in some rounds (a busy host, a neighbour) moves only the median."""
    from pytest_gputrain.regression.benchmark import BenchmarkResult
    from pytest_gputrain.regression.compare import GateSettings, as_record, compare_test

    fingerprint = {"device_type": "cuda", "gpu_name": "H200"}

    def session(scale: float, busy: int = 0) -> Any:
        times = [scale * (0.0075 + 0.00001 * (i % 3)) * (1.3 if i < busy else 1.0)
                 for i in range(100)]
        return as_record(BenchmarkResult("t::a", "cuda:0", "cuda_event", 5, times, [100],
                                         fingerprint=fingerprint))

    baseline = [session(1.0), session(1.001, busy=70), session(0.999)]
    gate = GateSettings({"step_time": 0.025})
    (slowed,) = compare_test("t::a", baseline,
                             [session(1.05), session(1.051, busy=60), session(1.049)], gate)
    assert slowed.verdict == "regression", slowed.reason
    assert slowed.change == pytest.approx(0.05, abs=0.002)
    (same,) = compare_test("t::a", baseline, [session(1.0, busy=80), session(1.0)], gate)
    assert same.verdict == "ok" and abs(same.change or 0) < 0.002
    by_median = GateSettings({"step_time": 0.025}, step_summary="median")
    (noisy,) = compare_test("t::a", baseline,
                            [session(1.05), session(1.051, busy=60), session(1.049)], by_median)
    # The busy sessions' medians swamp the 5 %: it cannot tell, and does not say "ok".
    assert noisy.verdict == "cannot_tell"


def test_help_lists_options_and_ini_twins(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "*--gpu-save=NAME*", "*--gpu-compare=NAME|#ID|latest*", "*--gpu-regression=SPEC*",
        "*step_time:5%,peak_vram:2%*", "*--gpu-benchmark-json=PATH*",
        "*--gpu-store=PATH|URL*benchmark store*", "*postgresql://*", "*--gpu-benchmark-disable*",
        "*--gpu-benchmark-skip*", "*--gpu-benchmark-only*", "*--gpu-benchmark-counters*",
        "*--no-gpu-benchmark-counters*",
    ])
    result.stdout.fnmatch_lines(["*--gpu-step-summary=min|median*",
                                 "*--gpu-cannot-tell=pass|warn|fail*"])
    for ini in ("gpu_save", "gpu_compare", "gpu_regression", "gpu_alpha", "gpu_compare_force",
                "gpu_step_summary", "gpu_cannot_tell",
                "gpu_benchmark_json", "gpu_store", "gpu_benchmark_warmup",
                "gpu_benchmark_min_rounds", "gpu_benchmark_max_rounds",
                "gpu_benchmark_max_time", "gpu_benchmark_disable", "gpu_benchmark_skip",
                "gpu_benchmark_only", "gpu_benchmark_counters"):
        result.stdout.fnmatch_lines([f"  {ini} (*"])


# -- ordinary runs: --gpu-benchmark-disable, --gpu-benchmark-skip and --gpu-benchmark-only ---

UNTIMED_TESTS = """
import pytest

calls = []


def step():
    calls.append(1)
    return "stepped"


def test_bench(gpu_benchmark):
    result = gpu_benchmark(step, rounds=20, warmup=3, device="cpu")
    assert result.returned == "stepped"
    print(f"CALLS={len(calls)} DISABLED={result.disabled} ROUNDS={result.rounds}")


def test_asks_for_timings(gpu_benchmark):
    result = gpu_benchmark(step, rounds=20, device="cpu")
    if result.disabled:
        with pytest.raises(RuntimeError, match="ran once, untimed.*--gpu-benchmark-disable"):
            result.median
    else:
        assert result.median >= 0


def test_plain():
    pass
"""


@pytest.mark.parametrize("how", ["option", "ini"])
def test_benchmark_disable_runs_each_step_once_untimed(pytester: pytest.Pytester,
                                                       how: str) -> None:
    pytester.makeini("[pytest]\ngpu_benchmark_disable = true\n" if how == "ini"
                     else "[pytest]\n")
    pytester.makepyfile(test_untimed=UNTIMED_TESTS)
    args = ["--gpu-benchmark-disable"] if how == "option" else []
    result = pytester.runpytest("-p", "no:cacheprovider", "-s", *args)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*CALLS=1 DISABLED=True ROUNDS=0*"])
    assert "gpu benchmarks" not in result.stdout.str()  # nothing timed, nothing to show
    timed = pytester.runpytest("-p", "no:cacheprovider", "-s", "-p", "no:gputrain",
                               "-p", "pytest_gputrain.regression.plugin") if how == "option" \
        else None
    if timed is not None:
        timed.assert_outcomes(passed=3)
        # 3 warm-up and 20 timed calls, then the counting pass: 20 plain steps and the 3
        # counted for operators (none: the step is plain Python), and the 3 whose bytecodes
        # are counted
        timed.stdout.fnmatch_lines(["*CALLS=49 DISABLED=False ROUNDS=20*"])


@pytest.mark.parametrize("how", ["option", "ini"])
def test_benchmark_skip_skips_the_benchmarks(pytester: pytest.Pytester, how: str) -> None:
    pytester.makeini("[pytest]\ngpu_benchmark_skip = true\n" if how == "ini" else "[pytest]\n")
    pytester.makepyfile(test_untimed=UNTIMED_TESTS)
    args = ["--gpu-benchmark-skip"] if how == "option" else []
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", *args)
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*SKIPPED*uses gpu_benchmark (--gpu-benchmark-skip)*"])


@pytest.mark.parametrize("how", ["option", "ini"])
def test_benchmark_only_deselects_the_other_tests_and_says_why(pytester: pytest.Pytester,
                                                               how: str) -> None:
    pytester.makeini("[pytest]\ngpu_benchmark_only = true\n" if how == "ini" else "[pytest]\n")
    pytester.makepyfile(test_untimed=UNTIMED_TESTS)
    args = ["--gpu-benchmark-only"] if how == "option" else []
    result = pytester.runpytest("-p", "no:cacheprovider", "-v", *args)
    result.assert_outcomes(passed=2, deselected=1)
    assert "test_plain" not in result.stdout.str()
    result.stdout.fnmatch_lines([
        "gputrain: 1 deselected: not benchmarks (--gpu-benchmark-only runs only the tests that "
        "use gpu_benchmark)",
        "*2 passed, 1 deselected*"])


def test_benchmark_only_is_turned_off_from_the_command_line(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngpu_benchmark_only = true\n")
    pytester.makepyfile(test_untimed=UNTIMED_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--no-gpu-benchmark-only")
    result.assert_outcomes(passed=3)
    assert "not benchmarks" not in result.stdout.str()


def test_benchmark_only_under_xdist_says_why_on_the_controller(pytester: pytest.Pytester
                                                               ) -> None:
    pytester.makepyfile(test_untimed=UNTIMED_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2",
                                           "--gpu-benchmark-only")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["gputrain: 1 deselected: not benchmarks*"])


def test_benchmark_only_and_skip_contradict_each_other(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_untimed=UNTIMED_TESTS)
    result = pytester.runpytest("--gpu-benchmark-only", "--gpu-benchmark-skip")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*: --gpu-benchmark-only: cannot be "
                                 "combined with --gpu-benchmark-skip*"])


# -- python -m pytest_gputrain compare, and the CI recipe ---------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_store(request: pytest.FixtureRequest, pytester: pytest.Pytester) -> str:
    """Where the recipe's sessions are saved: a file, or a PostgreSQL database CI shares."""
    if request.param == "sqlite":
        return str(pytester.path / "perf" / "benchmarks.sqlite")
    return str(request.getfixturevalue("postgres_url"))


def interleaved(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, store: str,
                sessions: int, candidate_factor: float) -> None:
    """The CI recipe: sessions of the base and of the candidate, alternating, one store."""
    for i in range(sessions):
        for name, factor in (("base", 1.0), ("head", candidate_factor)):
            result = run(pytester, monkeypatch, f"--gpu-save={name}", f"--gpu-store={store}",
                         factor=factor, seed=1000 + 2 * i + (name == "head"))
            assert result.ret == 0, result.stdout.str()


def compare_main(*args: str) -> int:
    from pytest_gputrain.cli import main

    return main(["compare", *args])


def test_recipe_catches_a_slowdown(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                   shared_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    interleaved(project, monkeypatch, shared_store, 3, candidate_factor=1.05)
    capsys.readouterr()
    assert compare_main("base", "head", "--store", shared_store,
                        "--regression", "step_time:2.5%") == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("'head' runs #2, #4, #6 (3 sessions) compared with 'base' runs "
                               "#1, #3, #5 (3 sessions)")
    assert "(step_time 2.5 %) and p < 0.01 over sessions" in lines[1]
    table = "\n".join(lines)
    for test in ("test_steps.py::test_eval", "test_steps.py::test_train"):
        row = next(line for line in lines if line.startswith(test))
        assert "step_time" in row and "3/3" in row and "REGRESSION (> 2.5 %)" in row
    assert "performance regression: test_steps.py::test_eval step_time +" in table
    assert "postgres" not in out or "***" in out or "@" not in out

    assert compare_main("base", "head", "--store", shared_store, "--format", "json",
                        "--regression", "step_time:2.5%") == 1
    document = json.loads(capsys.readouterr().out)
    assert document["schema_version"] == 3 and document["failed"] is True
    assert {c["verdict"] for c in document["comparisons"]} == {"regression"}
    for row in document["comparisons"]:
        assert 0.035 < row["change"] < 0.065
        assert row["spread"]["df_sides"] == 4
        assert row["detectable_change"] < 0.05

    assert compare_main("base", "head", "--store", shared_store, "--format", "json",
                        "--regression", "step_time:2.5%", "--step-summary", "median") == 1
    by_median = json.loads(capsys.readouterr().out)
    assert document["settings"]["step_summary"] == "min"
    assert by_median["settings"]["step_summary"] == "median"
    for fastest, middle in zip(document["comparisons"], by_median["comparisons"], strict=True):
        assert fastest["verdict"] == middle["verdict"] == "regression"
        assert all(a < b for a, b in zip(fastest["baseline"]["values"],
                                         middle["baseline"]["values"], strict=True))

    assert compare_main("base", "head", "--store", shared_store, "--format", "md",
                        "--regression", "step_time:2.5%") == 1
    markdown = capsys.readouterr().out
    assert markdown.startswith("## GPU performance gate\n\n**Regression** :x:")
    assert "| test_steps.py::test_train" in markdown


def test_recipe_passes_unchanged_code(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    store = str(project.path / "perf" / "benchmarks.sqlite")
    interleaved(project, monkeypatch, store, 3, candidate_factor=1.0)
    capsys.readouterr()
    assert compare_main("base", "head", "--store", store, "--regression",
                        "step_time:2.5%") == 0
    out = capsys.readouterr().out
    assert "gate passed: 2 ok" in out
    assert "improved" not in out and "REGRESSION" not in out


@pytest.mark.parametrize(("factor", "decided"), [(1.0, 0), (1.03, 1)])
def test_sequential_recipe_adds_pairs_until_decided(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], factor: float, decided: int) -> None:
    """The loop of docs/regression.md: a pair of sessions, then compare --max-sessions; exit 3
    asks for another pair (first: the spread is unknown; then: this many a side would
    decide), until the verdict is decided (0: ok, 1: regression) within the budget."""
    store = str(project.path / "perf" / "benchmarks.sqlite")
    statuses, outputs = [], []
    for pair in range(8):
        for name, scale in (("base", 1.0), ("head", factor)):
            result = run(project, monkeypatch, f"--gpu-save={name}", f"--gpu-store={store}",
                         factor=scale, seed=2000 + 2 * pair + (name == "head"))
            assert result.ret == 0, result.stdout.str()
        capsys.readouterr()
        statuses.append(compare_main("base", "head", "--store", store, "--regression",
                                     "step_time:1%", "--max-sessions", "8"))
        outputs.append(capsys.readouterr().out)
        if statuses[-1] != 3:
            break
    assert statuses[0] == 3 and statuses[-1] == decided and set(statuses[:-1]) == {3}
    assert 2 <= len(statuses) <= 8
    assert "more sessions would decide: 2 a side (budget 8); run another pair" in outputs[0]
    final = outputs[-1]
    assert "cannot tell" not in final.splitlines()[-2:]
    assert ("decided: a regression" if decided else "decided: no more sessions needed") in final


def test_sequential_recipe_stops_when_the_budget_cannot_decide(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A threshold the sessions' spread could only resolve with more sessions than the
    budget: no exit 3, the policy decides at once (and JSON says how many would do)."""
    store = str(project.path / "perf" / "benchmarks.sqlite")
    interleaved(project, monkeypatch, store, 2, candidate_factor=1.0)
    capsys.readouterr()
    args = ("base", "head", "--store", store, "--regression", "step_time:0.1%",
            "--max-sessions", "3")
    assert compare_main(*args) == 0
    out = capsys.readouterr().out
    assert "no more sessions within the budget of 3 a side would decide; the 'cannot tell' " \
           "policy (warn) applies" in out
    assert "gate passed with a warning: 2 cannot tell" in out
    assert compare_main(*args, "--cannot-tell", "fail", "--format", "json") == 1
    document = json.loads(capsys.readouterr().out)
    assert document["cannot_tell"]["more_sessions"] is False
    assert document["cannot_tell"]["session_budget"] == 3
    for row in document["comparisons"]:
        assert row["verdict"] == "cannot_tell" and row["sessions_to_decide"] > 3
        assert row["resolution"] > 0.001
    for bad, message in (("1", "'1' must lie between 2 and 1000; e.g. --max-sessions 8"),
                         ("many", "'many' is not a whole number of sessions a side")):
        with pytest.raises(SystemExit) as exited:
            compare_main(*args[:-1], bad)
        assert exited.value.code == 2
        assert f"argument --max-sessions: {message}" in capsys.readouterr().err


def test_compare_command_errors(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    store = str(project.path / "perf" / "benchmarks.sqlite")
    assert compare_main("base", "head", "--store", store) == 2
    assert "no benchmark store at" in capsys.readouterr().err
    interleaved(project, monkeypatch, store, 1, candidate_factor=1.0)
    capsys.readouterr()
    assert compare_main("base", "nope", "--store", store) == 2
    assert "no saved run 'nope'" in capsys.readouterr().err
    assert compare_main("base", "base", "--store", store) == 2
    assert "name the same sessions (runs #1)" in capsys.readouterr().err
    assert compare_main("base", "head", "--store", store, "--regression", "speed:5%") == 2
    assert "--regression: unknown metric 'speed'" in capsys.readouterr().err
    assert compare_main("base", "head", "--store", store, "--alpha", "2") == 2
    assert "--alpha: '2' must lie strictly between 0 and 0.5" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad_summary:
        compare_main("base", "head", "--store", store, "--step-summary", "mean")
    assert bad_summary.value.code == 2
    assert "--step-summary: invalid choice: 'mean'" in capsys.readouterr().err
    # One session a side: it cannot tell, and passes.
    assert compare_main("base", "head", "--store", store) == 0
    warned = capsys.readouterr()
    assert ("gate passed with a warning: 2 ok, 2 cannot tell (cannot-tell policy: warn)"
            in warned.out)
    assert "warning: cannot tell for 2 metric(s)" in warned.err
    monkeypatch.chdir(project.path)
    assert compare_main("base", "head") == 2  # no .gputrain/benchmarks.sqlite near here
    assert "no benchmark store found" in capsys.readouterr().err


def test_compare_command_unreachable_postgres(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql://ci:s3cret@127.0.0.1:1/bench?connect_timeout=3"
    assert compare_main("main", "pr", "--store", url) == 2
    err = capsys.readouterr().err
    assert "cannot connect to the PostgreSQL store postgresql://ci:***@127.0.0.1:1/bench" in err
    assert "s3cret" not in err


def test_plugin_saves_and_compares_in_postgres(project: pytest.Pytester,
                                               monkeypatch: pytest.MonkeyPatch,
                                               postgres_url: str) -> None:
    store = f"--gpu-store={postgres_url}"
    save_sessions(project, monkeypatch, "main", 3, store)
    result = run(project, monkeypatch, "--gpu-compare=main", store, factor=1.2, seed=3)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["this session compared with 'main' runs #1, #2, #3 "
                                 "(3 sessions)", "*test_train*step_time*3/1*REGRESSION*"])
    assert not (project.path / ".gputrain").exists()
    unknown = project.runpytest("-p", "no:cacheprovider", store, "--gpu-compare=mian")
    assert unknown.ret == pytest.ExitCode.USAGE_ERROR
    unknown.stderr.fnmatch_lines(["*no saved run 'mian' in postgresql://*(saved: main;*"])
