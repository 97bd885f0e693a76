"""The gate on per-step counters: the spec and its default policy, exact counts decided without
statistics, the cause of a change in words, the host counters over sessions, the explanation of
each test (Markdown, and the HTML partial), and the whole path through pytest on the CPU."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from pytest_gputrain.collect import step_counters
from pytest_gputrain.regression import counters, explain, options, policy
from pytest_gputrain.regression.compare import GateReport, GateSettings, compare_test
from pytest_gputrain.regression.output import compare_lines, markdown, report_section
from pytest_gputrain.regression.settings import RegressionSpec, parse_spec
from pytest_gputrain.regression.store import ResultRecord

NODE = "tests/perf/test_step.py::test_train_step"
AUTO = GateSettings({"step_time": 0.05, "peak_vram": 0.02}, auto=True)


def counted(kernels: int = 612, syncs: int = 0, h2d: int = 0, ops: int = 1500,
            kind: str = "launch", host: float = 0.0065, spread: float = 0.004,
            sync_sites: list[dict[str, Any]] | None = None,
            extra_ops: dict[str, int] | None = None, rng: random.Random | None = None,
            bytecodes_by_function: dict[str, int] | None = None,
            **per_step: Any) -> dict[str, Any]:
    """What a counting pass of a ResNet-like step stores (collect.step_counters' shape)."""
    rng = rng or random.Random(0)
    names = {"aten::convolution": 20, "aten::add_": 400, "aten::relu_": 17, **(extra_ops or {})}
    return {
        "version": 1, "steps": 3, "host_rounds": 20,
        "per_step": {"kernels": kernels, "syncs": syncs, "h2d_copies": h2d,
                     "h2d_bytes": h2d * 602112, "d2h_copies": syncs, "d2h_bytes": 4 * syncs,
                     "allocs": 180, "cuda_mallocs": 0, "ops": ops, **per_step},
        "varies": {}, "ops_by_name": names,
        "bytecodes_by_function": bytecodes_by_function or {},
        "kernel_names": {"vectorized_elementwise_kernel<CUDAFunctor_add>": kernels - 20,
                         "sm90_xmma_fprop_implicit_gemm": 20},
        "sync_sites": sync_sites or [], "copy_sites": [],
        "syncs_by_kind": {"stream": syncs} if syncs else {},
        "host_cpu": [host * math.exp(rng.gauss(0, spread)) * (1 + 0.05 * rng.random())
                     for _ in range(20)],
        "bound": {"kind": kind, "why": "the host's CPU time 88 % of the GPU's"},
        "unavailable": {"instructions": "the kernel exposes no hardware instruction counter"},
    }


def session(step_s: float, counters_: dict[str, Any] | None, spread: float = 0.10,
            seed: int = 0, cudnn_benchmark: bool = False) -> ResultRecord:
    """One session of a launch-bound step on a busy host: its pace 10 % apart from the next."""
    rng = random.Random(seed)
    pace = step_s * math.exp(rng.gauss(0, spread))
    times = [pace * (1 + 0.02 * rng.random()) for _ in range(30)]
    return ResultRecord(NODE, {"device_type": "cuda"}, "h", 30,
                        {"step_time": times, "throttled": [False] * 30},
                        {"conditions": {"cudnn_benchmark": cudnn_benchmark}},
                        counters=counters_)


def sides(before: dict[str, Any], after: dict[str, Any], slowdown: float = 1.0,
          n: int = 4) -> tuple[list[ResultRecord], list[ResultRecord]]:
    return ([session(0.0085, before, seed=i) for i in range(n)],
            [session(0.0085 * slowdown, after, seed=100 + i) for i in range(n)])


def rows_by_metric(rows: list[Any]) -> dict[str, Any]:
    return {row.metric: row for row in rows}


ITEM = {"kind": "stream", "op": "aten::_local_scalar_dense", "site": "train.py:42",
        "code": "print(loss.item())", "count": 1}


# -- the spec and the policy ---------------------------------------------------------------------


def test_the_spec_keeps_the_policy_with_auto_and_drops_it_without() -> None:
    assert parse_spec("auto") == RegressionSpec({"step_time": 0.05, "peak_vram": 0.02}, True)
    assert parse_spec("auto,step_time:2%,host_cpu:off") == RegressionSpec(
        {"step_time": 0.02, "peak_vram": 0.02}, True, frozenset({"host_cpu"}))
    assert parse_spec("step_time:5%,kernels:0,syncs:0,h2d_bytes:0,host_cpu:2%") == \
        RegressionSpec({"step_time": 0.05, "kernels": 0.0, "syncs": 0.0, "h2d_bytes": 0.0,
                        "host_cpu": 0.02})
    assert parse_spec("auto,peak_vram:off").thresholds == {"step_time": 0.05}
    with pytest.raises(ValueError, match="'auto' appears twice"):
        parse_spec("auto,AUTO")
    with pytest.raises(ValueError, match=r"unknown metric 'kernel'.*kernels, syncs"):
        parse_spec("kernel:0")
    with pytest.raises(ValueError, match=r"'-1' in 'syncs:-1' is not a percentage from 0 to 100"):
        parse_spec("syncs:-1")


def test_the_default_spec_is_the_policy() -> None:
    from pytest_gputrain.regression.settings import DEFAULT_THRESHOLDS

    assert options.DEFAULT_REGRESSION == policy.AUTO
    assert parse_spec(options.DEFAULT_REGRESSION) == RegressionSpec(DEFAULT_THRESHOLDS, True)
    assert DEFAULT_THRESHOLDS == policy.BASE


def test_the_collector_counts_what_the_gate_names() -> None:
    assert step_counters.EXACT == options.EXACT_COUNTERS
    assert set(counters.WORDS) == set(counters.LABELS) == set(options.COUNTER_METRICS)


@pytest.mark.parametrize(("args", "kind"), [
    (("cuda:0", 0.0075, 0.0072, None, 0.0065), "launch"),  # host 90 % of the GPU's time
    (("cuda:0", 0.0100, 0.0030, None, 0.0010), "launch"),  # the GPU idle 70 % of the step
    (("cuda:0", 0.0080, 0.0079, None, 0.0004), "gpu"),  # the conv net at batch 512
    (("cuda:0", 0.0080, None, 0.0079, 0.0004), "gpu"),  # from the queued rounds' GPU time
    (("cuda:0", 0.0080, None, None, 0.0004), None),
    (("cpu", 0.0200, None, None, 0.0190), "host"),
])
def test_a_step_is_judged_launch_bound_gpu_bound_or_a_cpu_step(args: tuple[Any, ...],
                                                                kind: str | None) -> None:
    judged = policy.classify(*args)
    assert judged["kind"] == kind and judged["why"]


def test_each_kind_is_gated_on_its_own_metrics() -> None:
    launch = AUTO.gated(["launch"])
    assert launch["step_time"] == 0.05 and launch["syncs"] == 0 and launch["kernels"] == 0
    assert launch["host_cpu"] == 0.02 and launch["instructions"] == 0.01
    assert "gpu_time" not in launch and "ops" not in launch
    gpu = AUTO.gated(["gpu"])
    assert set(gpu) == {"step_time", "peak_vram", "gpu_time", "syncs", "cuda_mallocs"}
    assert AUTO.gated(["host"]) == {"step_time": 0.05, "peak_vram": 0.02, "ops": 0.0,
                                    "bytecodes": 0.01, "instructions": 0.01}
    assert launch["bytecodes"] == 0.01 and "bytecodes" not in gpu
    unknown = AUTO.gated([None])
    assert "gpu_time" in unknown and "syncs" in unknown
    explicit = GateSettings({"step_time": 0.02, "syncs": 0.5}, auto=True,
                            off=frozenset({"host_cpu"})).gated(["launch"])
    assert explicit["syncs"] == 0.5 and "host_cpu" not in explicit
    assert GateSettings({"step_time": 0.05}).gated(["launch"]) == {"step_time": 0.05}


# -- exact counters ------------------------------------------------------------------------------


def test_a_new_sync_is_a_regression_where_the_clock_cannot_tell() -> None:
    """The issue's case: a launch-bound step on a busy host, its sessions 10 % apart, one sync
    added per step. The step time cannot tell; the sync count is exact, and the verdict names
    the call."""
    baseline, current = sides(counted(), counted(syncs=1, sync_sites=[ITEM]), slowdown=1.02)
    rows = rows_by_metric(compare_test(NODE, baseline, current, AUTO))
    assert rows["step_time"].verdict == "cannot_tell"
    syncs = rows["syncs"]
    assert syncs.verdict == "regression" and syncs.exact
    assert syncs.baseline_value == 0 and syncs.current_value == 1 and syncs.change is None
    assert syncs.cause == ("Tensor.item() at train.py:42 `print(loss.item())`")
    assert syncs.reason.startswith("+1 sync per step (Tensor.item() at train.py:42 "
                                   "`print(loss.item())`), past any rise; exact")
    assert rows["d2h_copies"].verdict == "regression"  # .item() copies 4 bytes to the host
    assert "counters that changed: +1 sync per step" in rows["step_time"].reason
    report = GateReport(AUTO, comparisons=list(rows.values()))
    assert report.failed


def test_nothing_counted_changed_and_the_clock_cannot_tell_stays_cannot_tell() -> None:
    baseline, current = sides(counted(), counted(), slowdown=1.02)
    rows = rows_by_metric(compare_test(NODE, baseline, current, AUTO))
    assert rows["step_time"].verdict == "cannot_tell"
    for name in ("kernels", "syncs", "h2d_bytes", "allocs", "cuda_mallocs"):
        assert rows[name].verdict == "ok" and rows[name].exact
        assert rows[name].reason.startswith("the same per step; exact")
    report = GateReport(AUTO, comparisons=list(rows.values()))
    assert not report.failed and report.undecided == [rows["step_time"]]


def test_more_kernels_name_the_operators_behind_them() -> None:
    baseline, current = sides(counted(), counted(kernels=676, ops=1564,
                                                 extra_ops={"aten::index": 64}))
    row = rows_by_metric(compare_test(NODE, baseline, current, AUTO))["kernels"]
    assert row.verdict == "regression"
    assert row.reason.startswith("+64 kernels per step (aten::index ×64), past any rise")
    assert row.change == pytest.approx(64 / 612)


def test_fewer_is_an_improvement_and_a_threshold_lets_small_rises_pass() -> None:
    baseline, current = sides(counted(kernels=612), counted(kernels=600))
    assert rows_by_metric(compare_test(NODE, baseline, current, AUTO))["kernels"].verdict == (
        "improvement")
    loose = GateSettings({"kernels": 0.05})
    baseline, current = sides(counted(kernels=612), counted(kernels=620))
    (row,) = compare_test(NODE, baseline, current, loose)
    assert row.verdict == "ok" and "within the 5 % threshold" in row.reason


def test_a_count_that_varies_is_not_exact() -> None:
    steady = counted()
    unsteady = counted(kernels=614)
    unsteady["varies"] = {"kernels": [612, 616]}
    baseline, current = sides(steady, unsteady)
    row = rows_by_metric(compare_test(NODE, baseline, current, AUTO))["kernels"]
    assert not row.exact and row.verdict == "cannot_tell"
    assert "varied between steps of a session (612-616)" in row.reason
    apart = counted(kernels=700)
    apart["varies"] = {"kernels": [690, 700]}
    row = rows_by_metric(compare_test(NODE, *sides(steady, apart), AUTO))["kernels"]
    assert row.verdict == "regression" and not row.exact  # every count above every other


def test_kernels_picked_by_cudnn_autotuning_are_not_the_codes() -> None:
    baseline = [session(0.0085, counted(kernels=612), seed=i, cudnn_benchmark=True)
                for i in range(4)]
    current = [session(0.0085, counted(kernels=618), seed=9 + i, cudnn_benchmark=True)
               for i in range(4)]
    row = rows_by_metric(compare_test(NODE, baseline, current, AUTO))["kernels"]
    assert row.verdict == "cannot_tell"
    assert "cuDNN autotuning is on" in row.reason


def test_a_gpu_bound_step_is_judged_by_its_times_and_says_what_it_counted() -> None:
    """More kernels on a GPU-bound step are the GPU time's to judge (the counter is shown, not
    gated); a new sync is gated on every kind: the GPU's queue runs dry while the host waits."""
    baseline, current = sides(counted(kind="gpu"), counted(kind="gpu", kernels=614))
    rows = rows_by_metric(compare_test(NODE, baseline, current, AUTO))
    assert "kernels" not in rows  # not gated on a GPU-bound step
    report = GateReport(AUTO, comparisons=list(rows.values()),
                        explanations=[explain.explain(NODE, baseline, current)])  # type: ignore
    lines = [text for text, _ in compare_lines(report)]
    assert any(line.startswith(f"counted per step in {NODE}: +2 kernels per step")
               for line in lines), lines
    synced = sides(counted(kind="gpu"), counted(kind="gpu", syncs=1, sync_sites=[ITEM]))
    sync_row = rows_by_metric(compare_test(NODE, *synced, AUTO))["syncs"]
    assert sync_row.verdict == "regression" and sync_row.exact


# -- the host counters ---------------------------------------------------------------------------


def test_more_host_work_is_caught_by_the_host_cpu_time_over_sessions() -> None:
    """Python work per step: no exact counter moves; the host CPU time does, by 3 % at a
    spread of 0.4 % between sessions, while the wall clock of a busy host cannot tell."""
    base = [session(0.0085, counted(rng=random.Random(i)), seed=i) for i in range(4)]
    more = [session(0.0085 * 1.02, counted(host=0.0065 * 1.03, rng=random.Random(50 + i)),
                    seed=50 + i) for i in range(4)]
    rows = rows_by_metric(compare_test(NODE, base, more, AUTO))
    assert rows["step_time"].verdict == "cannot_tell"
    host = rows["host_cpu"]
    assert host.verdict == "regression" and not host.exact
    assert host.cause.startswith("no exact counter changed: the host does more outside")
    assert "instructions" not in rows  # not counted on this machine


def test_more_python_is_caught_by_the_bytecodes_and_names_the_function() -> None:
    """The issue's "extra Python work per step" on a busy host where the host CPU time spreads
    11 % between sessions: the bytecode count is exact, and names where they ran."""
    functions = {"Module._call_impl (module.py:1782)": 2923, "SGD.step (sgd.py:105)": 956}
    base = [session(0.0085, counted(bytecodes=24351, spread=0.11, rng=random.Random(i),
                                    bytecodes_by_function=functions), seed=i) for i in range(4)]
    worked = {**functions, "log_step (train.py:88)": 25679}
    more = [session(0.0085 * 1.02, counted(bytecodes=50030, spread=0.11,
                                           rng=random.Random(50 + i),
                                           bytecodes_by_function=worked), seed=50 + i)
            for i in range(4)]
    rows = rows_by_metric(compare_test(NODE, base, more, AUTO))
    assert rows["step_time"].verdict == "cannot_tell"
    row = rows["bytecodes"]
    assert row.verdict == "regression" and row.exact
    assert row.reason.startswith("+25.7 k Python bytecodes per step (in log_step (train.py:88) "
                                 "×25679), past the 1 % threshold; exact"), row.reason
    x = explain.explain(NODE, base, more)
    assert x is not None and x["functions"][0]["name"] == "log_step (train.py:88)"
    assert "| `log_step (train.py:88)` | 0 | 25679 | +25679 |" in explain.markdown([x])
    small = [session(0.0085, counted(bytecodes=24351 + 100, rng=random.Random(90 + i)),
                     seed=90 + i) for i in range(4)]  # a reordered batch's few more lines
    assert rows_by_metric(compare_test(NODE, base, small, AUTO))["bytecodes"].verdict == "ok"


# -- the explanation -----------------------------------------------------------------------------


def test_the_explanation_sets_the_sides_beside_each_other() -> None:
    baseline, current = sides(counted(), counted(kernels=676, syncs=1, ops=1564,
                                                 sync_sites=[ITEM],
                                                 extra_ops={"aten::index": 64}))
    x = explain.explain(NODE, baseline, current)
    assert x is not None
    assert x["changes"][0].startswith("+64 kernels per step (aten::index ×64)")
    table = {row["metric"]: row for row in x["counters"]}
    assert table["kernels"]["baseline_text"] == "612" and table["kernels"]["current_text"] == (
        "676")
    assert table["kernels"]["change_text"] == "+64" and table["kernels"]["changed"]
    assert table["allocs"]["change_text"] == "0" and not table["allocs"]["changed"]
    assert table["host_cpu"]["exact"] is False
    assert x["kernels"] == [{"name": "vectorized_elementwise_kernel<CUDAFunctor_add>",
                             "baseline": 592.0, "current": 656.0, "change": 64.0}]
    assert x["ops"][0]["name"] == "aten::index"
    assert x["syncs"][0]["name"] == "Tensor.item() at train.py:42 `print(loss.item())`"
    assert x["bound"]["current"] == "launch-bound"
    report = GateReport(AUTO, comparisons=compare_test(NODE, baseline, current, AUTO),
                        explanations=[x], baseline_runs=[])
    text = "\n".join(explain.markdown([x]))
    assert "<details open><summary><code>tests/perf/test_step.py::test_train_step</code>" in text
    assert "| kernels | 612 | 676 | **+64** |" in text
    assert "| `vectorized_elementwise_kernel<CUDAFunctor_add>` | 592 | 656 | +64 |" in text
    assert "- not counted: instructions: the kernel exposes no hardware instruction counter" in (
        text)
    section = report_section(report)
    assert section["explanations"] == [x]
    json.dumps(section)  # JSON-ready, as the report files hold it


# -- through pytest, on the CPU ------------------------------------------------------------------


STEP_TEST = """
import os
import torch

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
OPTIMIZER = torch.optim.SGD(MODEL.parameters(), lr=0.01)
BATCH = torch.randn(16, 32)


def step():
    OPTIMIZER.zero_grad(set_to_none=True)
    out = MODEL(BATCH)
    if os.environ.get("EXTRA_OP"):
        out = out * 1.0
    out.sum().backward()
    OPTIMIZER.step()


def test_step(gpu_benchmark):
    result = gpu_benchmark(step, rounds=10, warmup=2)
    assert result.counters["bound"]["kind"] == "host"
"""


def test_an_extra_operator_per_step_fails_the_gate_and_is_named(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_step=STEP_TEST)
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.delenv("EXTRA_OP", raising=False)
    store = pytester.path / "store.sqlite"
    for _ in range(2):  # two sessions of the baseline: a spread for the host counters
        saved = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--gpu-save=main",
                                              f"--gpu-store={store}")
        saved.assert_outcomes(passed=1)
    monkeypatch.setenv("EXTRA_OP", "1")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--gpu-compare=main",
                                           f"--gpu-store={store}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*test_step.py::test_step*ops*exact*REGRESSION (> 0 %)*",
        "*REGRESSION test_step.py::test_step ops: +2 ATen operators per step (aten::mul ×2), "
        "past any rise; exact*",
        "*performance regression:*test_step.py::test_step ops*",
    ])
    text = summary.read_text()
    assert "### What each test does per step" in text
    assert "| ATen ops | " in text and "| `aten::mul` | 0 | 2 | +2 |" in text
    monkeypatch.delenv("EXTRA_OP")
    same = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--gpu-compare=main",
                                         f"--gpu-store={store}")
    same.stdout.fnmatch_lines(["*test_step.py::test_step*ops*0*exact*ok*"])
    # The step's clock is judged too, and on a host as busy as a parallel test run it can move
    # past its threshold by itself (+61 % once here): only the counters must stay quiet.
    assert "REGRESSION test_step.py::test_step ops" not in same.stdout.str()
    assert "REGRESSION test_step.py::test_step bytecodes" not in same.stdout.str()


def test_history_shows_each_sessions_counters(pytester: pytest.Pytester,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    pytester.makepyfile(test_step=STEP_TEST)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    store = pytester.path / "store.sqlite"
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--gpu-save=main",
                                  f"--gpu-store={store}").assert_outcomes(passed=1)
    shown = subprocess.run([sys.executable, "-m", "pytest_gputrain", "history", "--store",
                            str(store), "--test", "test_step.py::test_step"],
                           capture_output=True, text=True, check=True).stdout
    header = shown.splitlines()[0]
    for column in ("kernels", "syncs", "H2D", "allocs", "ops", "host CPU", "step"):
        assert column in header
    assert "a CPU step" in shown
    data = json.loads(subprocess.run(
        [sys.executable, "-m", "pytest_gputrain", "history", "--store", str(store), "--test",
         "test_step.py::test_step", "--json"], capture_output=True, text=True,
        check=True).stdout)
    assert data[0]["counters"]["per_step"]["ops"] > 10


def test_a_bound_that_is_no_kind_of_step_is_an_error() -> None:
    from pytest_gputrain.regression.benchmark import GpuBenchmark

    with pytest.raises(ValueError, match=r"bound='cpu' is not a kind of step; use 'launch' "
                                         r"or 'gpu'"):
        GpuBenchmark("t::a")(lambda: None, bound="cpu")


def test_the_markdown_of_a_report_holds_the_explanations(tmp_path: Path) -> None:
    baseline, current = sides(counted(), counted(syncs=1, sync_sites=[ITEM]))
    report = GateReport(AUTO, comparisons=compare_test(NODE, baseline, current, AUTO),
                        explanations=explain.explain_sides({NODE: baseline}, {NODE: current}),
                        compare_spec="main")
    text = markdown(report)
    assert "What each test does per step" in text and "+1 sync per step" in text


def test_a_counting_pass_that_fails_fails_no_test() -> None:
    """A step that runs only so often (a generator that ends): the timed rounds had it, the
    counting pass does not; the result keeps its times and says why nothing was counted."""
    from pytest_gputrain.regression.benchmark import BenchmarkOptions, measure

    calls = iter(range(12))

    def step() -> None:
        next(calls)

    result = measure(step, options=BenchmarkOptions(warmup=1, min_rounds=10, max_rounds=10),
                     device="cpu", counters=True, fingerprint=False)
    assert result.rounds == 10 and result.counters is not None
    assert result.counters["per_step"] == {}
    assert result.counters["unavailable"]["host_cpu"] == (
        "the counting pass failed: StopIteration: ")


def test_counts_that_follow_the_data_and_agree_in_the_median_are_ok() -> None:
    """A step whose Python follows its data (a random transform in the main thread) counts a
    few bytecodes more or fewer each step: overlapping counts whose medians agree are "ok", not
    a "cannot tell" on every such test; counts apart are still a regression."""
    def unsteady(value: int, low: int, high: int) -> dict[str, Any]:
        found = counted(bytecodes=value)
        found["varies"] = {"bytecodes": [low, high]}
        return found

    baseline, current = sides(unsteady(30_010, 29_950, 30_100), unsteady(30_040, 29_900,
                                                                          30_120))
    row = rows_by_metric(compare_test(NODE, baseline, current, AUTO))["bytecodes"]
    assert row.verdict == "ok" and not row.exact
    assert row.reason.startswith("the counts overlap, and the sides' medians are +30 Python "
                                 "bytecodes per step apart, within the 1 % threshold; not exact")
    apart = sides(unsteady(30_010, 29_950, 30_100), unsteady(52_000, 51_900, 52_100))
    assert rows_by_metric(compare_test(NODE, *apart, AUTO))["bytecodes"].verdict == "regression"
    far = sides(unsteady(30_010, 29_950, 30_100), unsteady(30_090, 30_000, 31_000))
    assert rows_by_metric(compare_test(NODE, *far, AUTO))["bytecodes"].verdict == "ok"
    drifted = sides(unsteady(30_010, 29_950, 30_100), unsteady(30_500, 30_050, 30_900))
    assert rows_by_metric(compare_test(NODE, *drifted, AUTO))["bytecodes"].verdict == (
        "cannot_tell")
