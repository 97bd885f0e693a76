"""The readiness ladder: headroom prediction (pure), rungs on the CPU, and the session table."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from pytest_gputrain.ladder.headroom import (
    MARGIN,
    fit_line,
    fit_upper_line,
    predict_largest,
    probes_below,
    take_probes,
)


def test_line_through_exact_points() -> None:
    fit = fit_line([(32, 1_000 + 32 * 50), (64, 1_000 + 64 * 50), (256, 1_000 + 256 * 50)])
    assert fit.intercept == pytest.approx(1_000)
    assert fit.per_sample == pytest.approx(50)


def test_line_through_scattered_points_is_numpys_least_squares_fit() -> None:
    import numpy

    points = [(8, 1_300_000), (16, 1_690_000), (24, 2_010_000), (48, 3_400_000)]
    slope, intercept = numpy.polyfit([b for b, _ in points], [p for _, p in points], 1)
    fit = fit_line(points)
    assert (fit.per_sample, fit.intercept) == pytest.approx((slope, intercept), rel=1e-12)


def test_prediction_meets_the_budget_and_stays_under_it() -> None:
    fit = fit_line([(32, 2_000_000_000 + 32 * 5_000_000), (700, 2_000_000_000 + 700 * 5_000_000)])
    budget = 14 * 2**30
    largest = predict_largest(fit, budget, safety=0.0)
    assert largest is not None
    assert fit.at(largest) <= budget < fit.at(largest + 1)
    assert predict_largest(fit, budget) <= largest  # the safety margin only lowers it


def test_no_growth_means_no_prediction() -> None:
    assert predict_largest(fit_line([(8, 100), (16, 100)]), 1_000) is None
    with pytest.raises(ValueError, match="two or more"):
        fit_line([(8, 100), (8, 120)])


def _planned(peak_of: Callable[[int], int], first: int, fixed: int, budget: int
             ) -> list[tuple[int, int]]:
    """The probes the ladder takes against a memory model ``peak_of(batch)``."""
    return take_probes(first, peak_of(first), fixed, budget, peak_of)


def test_probes_climb_to_two_thirds_of_the_budget_and_no_further() -> None:
    per_sample, fixed, budget = 5_000_000, 1_000_000_000, 14 * 2**30
    workspace = 300_000_000  # what a step needs besides activations: counts in every peak
    probes = _planned(lambda b: fixed + workspace + b * per_sample, 32, fixed, budget)
    assert len(probes) == 3 and [b for b, _ in probes] == sorted(b for b, _ in probes)
    shares = [(peak - fixed) / (budget - fixed) for _, peak in probes[1:]]
    # The first probe alone overstates the cost per sample (its workspace counts), so the second
    # lands low; the line through two probes puts the third where it was meant to go.
    assert 0.1 < shares[0] < 0.34 and 0.6 < shares[1] < 0.72
    assert all(peak < 0.75 * budget for _, peak in probes)


def test_prediction_from_the_upper_probes_reaches_097_of_a_convex_true_limit() -> None:
    # Small batches pick kernels with bigger per-sample workspaces; the cost per sample settles
    # at large batches. A line through all three probes would be steered by the small one.
    fixed, budget = 2_000_000_000, 12 * 2**30

    def peak_of(batch: int) -> int:
        return int(fixed + 18_000_000 * batch + 400_000_000 * (1 - math.exp(-batch / 64)))

    probes = _planned(peak_of, 32, fixed, budget)
    predicted = predict_largest(fit_upper_line(probes), budget, MARGIN)
    true_largest = max(b for b in range(1, 10_000) if peak_of(b) <= budget)
    assert predicted is not None and peak_of(predicted) <= budget
    assert 0.97 <= predicted / true_largest <= 1.0
    predicted_with_all = predict_largest(fit_line(probes), budget, MARGIN)
    # The small probe's steeper slope would have cost batch size.
    assert predicted_with_all is not None and predicted_with_all < predicted


def test_a_first_batch_past_a_third_of_the_budget_probes_below_it() -> None:
    per_sample, fixed = 5_000_000, 1_000_000_000
    budget = fixed + 1200 * per_sample
    assert probes_below(1000, fixed + 1000 * per_sample, fixed, budget) == [500, 250]
    assert probes_below(32, fixed + 32 * per_sample, fixed, budget) == []
    probes = _planned(lambda b: fixed + b * per_sample, 1000, fixed, budget)
    assert [b for b, _ in probes] == [1000, 500, 250]


def test_ladder_rungs_on_cpu_and_the_session_table(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch
        from pytest_gputrain.ladder import LadderSpec

        def batches(size):
            g = torch.Generator().manual_seed(0)
            while True:
                x = torch.randn(size, 8, generator=g)
                yield x, (x.sum(dim=1) > 0).long()

        def step(model, batch, optimizer, device, precision):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss.detach()

        def accuracy(model, device, precision):
            x, y = next(batches(512))
            with torch.no_grad():
                return (model(x).argmax(1) == y).float().mean().item()

        SPEC = LadderSpec(name="toy", make_model=lambda: torch.nn.Linear(8, 2),
                          make_optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.5),
                          batches=batches, step=step, evaluate=accuracy)

        def test_cpu_rungs(gpu_ladder):
            ladder = gpu_ladder(SPEC)
            one = ladder.one_batch("cpu", batch_size=16)
            run = ladder.short_run("cpu", batch_size=64, steps=60, warmup=5)
            assert one.steps == 2 and run.seconds_per_step > 0
            assert run.val_accuracy > 0.8

        def test_gpu_rung_without_gpu_says_why(gpu_ladder):
            from pytest_gputrain.ladder import LadderError
            import pytest
            if torch.cuda.is_available():
                pytest.skip("this check is for machines without CUDA")
            with pytest.raises(LadderError, match="CUDA is not available"):
                gpu_ladder(SPEC).short_run("cuda")

        def test_bad_precision(gpu_ladder):
            from pytest_gputrain.ladder import LadderError
            import pytest
            with pytest.raises(LadderError, match="unknown precision 'fp8'"):
                gpu_ladder(SPEC).short_run("cpu", precision="fp8", steps=2)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    # The no-CUDA check skips itself where CUDA is available (a GPU machine).
    cuda = pytest.importorskip("torch").cuda.is_available()
    result.assert_outcomes(passed=2 if cuda else 3, skipped=1 if cuda else 0)
    result.stdout.fnmatch_lines([
        "*gputrain readiness ladder: toy*",
        "run*batch*step time*speed-up*val acc",
        "CPU fp32 one batch*16*",
        "CPU fp32 short run*64*1.0×*",
        "not shown, as no rung measured them: peak VRAM, util and temp (need a GPU rung)",
    ])


def test_a_step_returning_the_loss_itself_runs_under_warnings_as_errors(
        pytester: pytest.Pytester) -> None:
    """The loss a step returns usually still requires grad, and the accuracy may be a tensor:
    the ladder must read them without torch's "Converting a tensor with requires_grad=True to
    a scalar" warning, which `-W error` makes a failure of the project's test."""
    pytester.makepyfile(
        """
        import torch
        from pytest_gputrain.ladder import LadderSpec

        def batches(size):
            while True:
                yield torch.randn(size, 4), torch.zeros(size, dtype=torch.long)

        def step(model, batch, optimizer, device, precision):
            loss = torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
            optimizer.zero_grad(); loss.backward(); optimizer.step()
            assert loss.requires_grad
            return loss

        def accuracy(model, device, precision):
            x, y = next(batches(16))
            return (model(x).argmax(1) == y).float().mean()  # a tensor, not a float

        def test_rungs(gpu_ladder):
            spec = LadderSpec("toy", lambda: torch.nn.Linear(4, 2),
                              lambda m: torch.optim.SGD(m.parameters(), lr=0.1), batches, step,
                              accuracy)
            ladder = gpu_ladder(spec)
            one = ladder.one_batch("cpu", batch_size=8)
            run = ladder.short_run("cpu", batch_size=8, steps=5, warmup=1)
            for value in (one.loss_first, one.loss_last, run.loss_first, run.loss_last,
                          run.val_accuracy):
                assert type(value) is float
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=1)


def test_ladder_table_goes_into_the_reports(pytester: pytest.Pytester, use_facts: object) -> None:
    use_facts("cpu_laptop")  # type: ignore[operator]
    pytester.makepyfile(
        """
        import torch
        from pytest_gputrain.ladder import LadderSpec

        def batches(size):
            while True:
                yield torch.randn(size, 4), torch.zeros(size, dtype=torch.long)

        def step(model, batch, optimizer, device, precision):
            loss = torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
            optimizer.zero_grad(); loss.backward(); optimizer.step()
            return loss.detach()

        def test_rung(gpu_ladder):
            spec = LadderSpec("toy", lambda: torch.nn.Linear(4, 2),
                              lambda m: torch.optim.SGD(m.parameters(), lr=0.1), batches, step)
            gpu_ladder(spec).short_run("cpu", batch_size=8, steps=5, warmup=1)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--gpu-diagnose",
                                "--gpu-report=r.json", "--gpu-report=r.md")
    result.assert_outcomes(passed=1)
    import json

    report = json.loads((pytester.path / "r.json").read_text())
    section = report["sections"]["ladder: toy"]
    assert section["rungs"][0]["rung"] == "short run"
    assert section["rungs"][0]["batch_size"] == 8
    markdown = (pytester.path / "r.md").read_text()
    assert "### ladder: toy" in markdown and "| CPU fp32 short run" in markdown


def test_ladder_rows_of_xdist_workers_reach_the_table_and_the_reports(
        pytester: pytest.Pytester) -> None:
    """Rungs run on the workers (the sample project recommends -n 4); the controller prints the
    table and writes the section, with every worker's rows."""
    pytest.importorskip("xdist")
    pytester.makepyfile(
        """
        import os

        import pytest
        import torch
        from pytest_gputrain.ladder import LadderSpec

        def batches(size):
            while True:
                yield torch.randn(size, 4), torch.zeros(size, dtype=torch.long)

        def step(model, batch, optimizer, device, precision):
            loss = torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
            optimizer.zero_grad(); loss.backward(); optimizer.step()
            return loss.detach()

        SPEC = LadderSpec("toy", lambda: torch.nn.Linear(4, 2),
                          lambda m: torch.optim.SGD(m.parameters(), lr=0.1), batches, step)

        @pytest.mark.parametrize("batch", [8, 16, 24, 32])
        def test_rung(gpu_ladder, batch):
            gpu_ladder(SPEC).short_run("cpu", batch_size=batch, steps=3, warmup=1)
            print("WORKER", os.environ["PYTEST_XDIST_WORKER"])
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "-rA",
                                           "--gpu-report=r.json", "--gpu-report=r.md",
                                           "--gpu-fail-on=never")
    result.assert_outcomes(passed=4)
    workers = {line.split()[-1] for line in result.stdout.lines if line.startswith("WORKER gw")}
    assert workers == {"gw0", "gw1"}, "the tests did not spread over both workers"
    result.stdout.fnmatch_lines(["*gputrain readiness ladder: toy*",
                                 "run*batch*step time*"])
    table = [line for line in result.stdout.lines if line.startswith("CPU fp32 short run")]
    assert sorted(int(line.split()[4]) for line in table) == [8, 16, 24, 32]
    import json

    section = json.loads((pytester.path / "r.json").read_text())["sections"]["ladder: toy"]
    assert sorted(rung["batch_size"] for rung in section["rungs"]) == [8, 16, 24, 32]
    assert "### ladder: toy" in (pytester.path / "r.md").read_text()


def test_workers_rows_merge_in_worker_order() -> None:
    from pytest_gputrain.ladder.plugin import _worker_order

    assert sorted(["gw10", "gw2", "gw1", "g2w"], key=_worker_order) == ["g2w", "gw1", "gw2",
                                                                         "gw10"]


class _ModelledLadder:
    """A ladder whose peaks come from a memory model instead of a GPU: the rung's control flow
    (probes, prediction, verification and its one retry) on any machine."""

    def __init__(self, peak_of: Callable[[int], int], true_limit: int) -> None:
        self.peak_of, self.true_limit = peak_of, true_limit
        self.measured: list[int] = []

    def make(self, monkeypatch: pytest.MonkeyPatch) -> Any:
        import torch

        from pytest_gputrain.ladder import Ladder, LadderSpec, rungs

        modelled = self
        monkeypatch.setattr(rungs, "_settled_allocated", lambda torch, dev: 1_000_000_000)
        monkeypatch.setattr(rungs, "_release", lambda torch, dev: None)

        class Modelled(Ladder):
            def _device(self, name: str) -> Any:
                return torch.device("cpu")

            def _run_steps(self, *args: Any, **kwargs: Any) -> list[float]:
                return [1.0]

            def _peak(self, model: Any, optimizer: Any, device: Any, precision: str,
                      batch: int) -> int:
                modelled.measured.append(batch)
                peak = modelled.peak_of(batch)
                if peak > modelled.true_limit:
                    raise torch.OutOfMemoryError("CUDA out of memory (modelled)")
                return peak

        spec = LadderSpec(name="modelled", make_model=lambda: torch.nn.Linear(2, 2),
                          make_optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                          batches=lambda size: iter(()), step=lambda *a: 0.0)
        return Modelled(spec)


def test_largest_batch_takes_three_probes_and_verifies_the_prediction(
        monkeypatch: pytest.MonkeyPatch) -> None:
    budget = 12 * 2**30
    modelled = _ModelledLadder(lambda b: 1_000_000_000 + 20_000_000 * b, true_limit=budget)
    result = modelled.make(monkeypatch).largest_batch("bf16", start_batch=32, budget=budget)
    assert len(result.probes) == 3 and result.verified and not result.note
    true_largest = (budget - 1_000_000_000) // 20_000_000
    assert 0.97 <= result.predicted / true_largest <= 1.0
    assert modelled.measured == [b for b, _ in result.probes] + [result.predicted]


def test_a_prediction_that_runs_out_of_memory_is_retried_once_at_a_wider_margin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    budget = 12 * 2**30
    # The allocator wastes 4 % near the limit: the 2 % margin's batch runs out of memory.
    modelled = _ModelledLadder(lambda b: 1_000_000_000 + 20_000_000 * b,
                               true_limit=int(budget * 0.96))
    result = modelled.make(monkeypatch).largest_batch("bf16", start_batch=32, budget=budget)
    assert result.verified
    assert len(modelled.measured) == len(result.probes) + 2
    assert "ran out of memory on verification" in result.note
    assert str(modelled.measured[-2]) in result.note and result.predicted == modelled.measured[-1]


def test_a_peak_over_a_budget_smaller_than_the_gpu_is_retried_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    budget = 4 * 2**30
    # Memory grows faster than the line near the top: no OOM (the GPU is larger than the
    # budget), but the predicted batch peaks over the budget.
    modelled = _ModelledLadder(lambda b: 1_000_000_000 + 2_000_000 * b + 400 * b * b,
                               true_limit=10**12)
    result = modelled.make(monkeypatch).largest_batch("bf16", start_batch=32, budget=budget)
    assert "over the budget" in result.note
    assert result.verified and result.verified_peak is not None
    assert result.verified_peak <= budget and result.predicted == modelled.measured[-1]
    assert len(modelled.measured) == len(result.probes) + 2
