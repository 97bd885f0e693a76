"""The regression gate end to end, through pytester: save, compare, outputs, options, xdist."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

# Imported up front: pytester's in-process runs drop modules first imported inside them.
import pytest_gputrain.regression.benchmark
import pytest_gputrain.regression.history
import pytest_gputrain.regression.output
import pytest_gputrain.regression.gate  # noqa: F401
from pytest_gputrain.regression.store import Store

# A conftest for the inner runs: a fake clock the step advances, so timings are exact and
# reproducible (STEP_FACTOR scales the step, STEP_SEED varies the noise).
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

    def step():
        clock.now += 0.010 * factor * rng.lognormvariate(0, 0.02)
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
    for name in ("GITHUB_STEP_SUMMARY", "STEP_FACTOR", "STEP_SEED"):
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


def test_save_then_compare_finds_regression(project: pytest.Pytester,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    saved = run(project, monkeypatch, "--gpu-save=main")
    saved.assert_outcomes(passed=3)
    assert saved.ret == 0
    saved.stdout.fnmatch_lines(["*gpu benchmarks*", "*test_steps.py::test_train*cpu*40*",
                                "saved run #1 'main'*with 2 result(s)"])
    out = project.path / "bench.json"
    summary = project.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    slow = run(project, monkeypatch, "--gpu-compare=main", f"--gpu-benchmark-json={out}",
               factor=1.10, seed=1)
    slow.assert_outcomes(passed=3)
    assert slow.ret == 1
    slow.stdout.fnmatch_lines([
        "compared with run #1 'main'*p < 0.01*step_time > 5 %*",
        "*test*metric*baseline*current*change*p-value*verdict*",
        "*test_steps.py::test_eval*step_time*ms*ms*+*%*REGRESSION (> 5 %)*",
        "*test_steps.py::test_train*step_time*REGRESSION*",
        "performance regression: *test_train step_time +*",
    ])
    document = json.loads(out.read_text())
    assert document["kind"] == "pytest-gputrain-benchmarks"
    assert document["schema_version"] == 1
    assert document["failed"] is True
    assert document["summary"]["regression"] == 2
    assert document["baseline"]["name"] == "main"
    by_test = {c["nodeid"]: c for c in document["comparisons"]}
    train = by_test["test_steps.py::test_train"]
    assert train["verdict"] == "regression"
    assert 0.07 < train["change"] < 0.13
    assert train["p_value"] < 1e-6
    assert train["baseline_rounds"] == 40 and train["current_rounds"] == 40
    assert len(document["benchmarks"]) == 2
    assert len(document["benchmarks"][0]["metrics"]["step_time"]) == 30
    markdown = summary.read_text()
    assert markdown.startswith("## GPU performance gate")
    assert "**Regression**" in markdown
    assert "| test_steps.py::test_train" in markdown


def test_unchanged_passes_and_latest(project: pytest.Pytester,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(project, monkeypatch, "--gpu-save=main").ret == 0
    result = run(project, monkeypatch, "--gpu-compare=latest", "--gpu-save=pr", seed=2)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*test_steps.py::test_train*step_time*ok*40/40*",
                                 "gate passed: 2 ok", "saved run #2 'pr'*"])
    with Store.open(store_path(project), create=False) as store:
        assert [r.name for r in store.runs()] == ["pr", "main"]


def test_improvement_is_not_a_failure(project: pytest.Pytester,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    run(project, monkeypatch, "--gpu-save=main")
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
    assert run(project, monkeypatch).ret == 0
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
    result.stdout.fnmatch_lines(["*p < 0.001*step_time > 20 %*",
                                 "*test_train*step_time*ok*"])
    # The command line wins over the ini file.
    strict = run(project, monkeypatch, "--gpu-regression=step_time:5%", factor=1.10, seed=4)
    assert strict.ret == 1


def test_real_sleep_slowdown(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_sleep="""
        import os, time

        def test_step(gpu_benchmark):
            pause = float(os.environ["PAUSE"])
            gpu_benchmark(time.sleep, pause, rounds=20, warmup=2, device="cpu")
    """)
    monkeypatch.setenv("PAUSE", "0.002")
    assert pytester.runpytest("-p", "no:cacheprovider", "--gpu-save=base").ret == 0
    monkeypatch.setenv("PAUSE", "0.006")
    result = pytester.runpytest("-p", "no:cacheprovider", "--gpu-compare=base")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*test_sleep.py::test_step*step_time*REGRESSION*"])


def test_fingerprint_mismatch_not_comparable(project: pytest.Pytester,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    run(project, monkeypatch, "--gpu-save=main")
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
    with Store.open(store_path(pytester), create=False) as store:
        (saved,) = store.runs()
        assert list(store.results(saved.id)) == ["test_f.py::test_ok"]


def test_plain_session_opens_no_store(project: pytest.Pytester,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(project, monkeypatch)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*gpu benchmarks*", "*test_train*cpu*40*"])
    assert not (project.path / ".gputrain").exists()
    quiet = project.runpytest("-p", "no:cacheprovider", "-k", "plain")
    assert "gpu benchmarks" not in quiet.stdout.str()


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu-regression=step_time=5"], "*gpu_regression / --gpu-regression: 'step_time=5'*"
                                       "not METRIC:PERCENT*step_time:5%,peak_vram:2%*"),
    (["--gpu-regression=speed:5%"], "*unknown metric 'speed'*known: step_time, peak_vram*"),
    (["--gpu-regression=step_time:500%"], "*must lie between 0 and 100*"),
    (["--gpu-alpha=2"], "*gpu_alpha / --gpu-alpha: '2' must lie strictly between 0 and 0.5*"),
    (["--gpu-alpha=often"], "*'often' is not a number*0.01*"),
    (["--gpu-save=latest"], "*gpu_save / --gpu-save: 'latest' is reserved*"),
    (["--gpu-benchmark-min-rounds=50", "--gpu-benchmark-max-rounds=10"],
     "*10 is below gpu_benchmark_min_rounds 50*"),
    (["--gpu-benchmark-warmup=-1"], "*'-1' must be >= 0*"),
    (["--gpu-compare=nope"], "*no run 'nope'*has no saved runs yet*"),
])
def test_bad_options_are_usage_errors(project: pytest.Pytester, args: list[str],
                                      message: str) -> None:
    result = project.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


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
    with Store.open(store_path(project), create=False) as store:
        (saved,) = store.runs()
        results = store.results(saved.id)
    assert len(results) == 8
    assert {f"test_more.py::test_many[{n}]" for n in range(6)} <= set(results)
    assert len(json.loads(json_path.read_text())["benchmarks"]) == 8
    compared = project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2",
                                            "--gpu-compare=xdist")
    assert compared.ret == 0
    compared.stdout.fnmatch_lines(["gate passed: 8 ok"])


def test_history_cli(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_gputrain.regression.history import main

    run(project, monkeypatch, "--gpu-save=main")
    run(project, monkeypatch, "--gpu-save=pr", factor=1.2, seed=1)
    capsys.readouterr()
    monkeypatch.chdir(project.path / ".gputrain")  # found in the nearest parent with a store
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


def test_cuda_timer_with_fake_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from pytest_gputrain.collect import nvml
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

    samples = iter(range(10_000))

    def read_sample(index: int) -> Any:
        n = next(samples)
        if n == 0:  # the availability probe
            return SimpleNamespace(utilization_gpu=0.0, sm_clock=1980.0, clock_event_reasons=0)
        return SimpleNamespace(utilization_gpu=95.0, sm_clock=1200.0 if n == 5 else 1980.0,
                               clock_event_reasons=0x20 if n == 3 else 0x0)

    monkeypatch.setattr(nvml, "read_sample", read_sample)
    monkeypatch.setattr(nvml, "index_for_cuda_device", lambda index: 0)
    options = benchmark.BenchmarkOptions(warmup=3, min_rounds=10, max_rounds=50, max_time=0.1)
    result = benchmark._measure_cuda(torch, 0, step, (), {}, options, True, "t::cuda")
    # 10 rounds took 0.041 s of host time: 0.059 s left at 4.1 ms a round = 14 more rounds.
    assert result.rounds == 24
    assert calls[0] == 3 + 24
    assert result.timer == "cuda_event" and result.device == "cuda:0"
    assert result.returned == 27
    # One device synchronize after the warm-up, then only two event synchronizes.
    assert [e for e in torch.cuda.log if e != "reset"] == [
        "device.synchronize", "event.synchronize", "event.synchronize"]
    assert torch.cuda.log.count("reset") == 24
    assert result.step_time[0] == pytest.approx(0.004)
    slow_rounds = [i for i, t in enumerate(result.step_time) if t > 0.006]
    assert slow_rounds == [i - 4 for i in range(7, 28, 7) if i > 3]
    assert result.peak_vram == [1000 + 4 + i for i in range(24)]
    assert result.utilization == [95.0] * 24
    assert result.throttled[2] and result.throttled[4]  # thermal bit, low SM clock
    assert result.throttled_count == 2
    assert len(result.clean_step_times()) == 22


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
    from pytest_gputrain.regression.compare import GateSettings, compare_test
    from pytest_gputrain.regression.store import ResultRecord

    fingerprint = {"device_type": "cuda", "gpu_name": "H200"}
    base_times = [0.010 + 0.0001 * (i % 5) for i in range(40)]
    base = BenchmarkResult("t::a", "cuda:0", "cuda_event", 5, base_times, [100] * 40,
                           throttled=[False] * 40, fingerprint=fingerprint)
    # The current run is unchanged, except that 10 rounds ran throttled and took 2x as long.
    cur_times = [t * (2 if i < 10 else 1) for i, t in enumerate(base_times)]
    current = BenchmarkResult("t::a", "cuda:0", "cuda_event", 5, cur_times, [100] * 40,
                              throttled=[i < 10 for i in range(40)], fingerprint=fingerprint)
    record = ResultRecord("t::a", fingerprint, "", 40, base.metrics(), base.summary())
    gate = GateSettings({"step_time": 0.05, "peak_vram": 0.02})
    rows = {r.metric: r for r in compare_test(current, record, gate)}
    assert rows["step_time"].verdict == "ok"
    assert rows["step_time"].current_throttled == 10
    assert rows["step_time"].current_rounds == 30
    assert rows["peak_vram"].verdict == "ok"
    # Mostly throttled: no verdict rather than a wrong one.
    current.throttled = [i < 35 for i in range(40)]
    rows = {r.metric: r for r in compare_test(current, record, gate)}
    assert rows["step_time"].verdict == "insufficient_data"
    # Without the flags the slow rounds would have counted.
    current.throttled = [False] * 40
    rows = {r.metric: r for r in compare_test(current, record, gate)}
    assert rows["step_time"].current_throttled == 0


def test_help_lists_options_and_ini_twins(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "*--gpu-save=NAME*", "*--gpu-compare=NAME|#ID|latest*", "*--gpu-regression=SPEC*",
        "*step_time:5%,peak_vram:2%*", "*--gpu-benchmark-json=PATH*",
    ])
    for ini in ("gpu_save", "gpu_compare", "gpu_regression", "gpu_alpha", "gpu_compare_force",
                "gpu_benchmark_json", "gpu_store", "gpu_benchmark_warmup",
                "gpu_benchmark_min_rounds", "gpu_benchmark_max_rounds",
                "gpu_benchmark_max_time"):
        result.stdout.fnmatch_lines([f"  {ini} (*"])
