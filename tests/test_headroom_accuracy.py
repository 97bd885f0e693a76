"""benchmarks/headroom_accuracy.py on the CPU: its k-ary search for the true largest batch over
a known "fits" oracle, its sharing of the GPU's memory between processes, its table, and a
smoke run of the whole orchestration (processes, search, outputs)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _benchmark() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import headroom_accuracy
    finally:
        sys.path.remove(str(BENCHMARKS))
    return headroom_accuracy


@pytest.mark.parametrize("limit", [1, 2, 7, 100, 541, 5_000])
@pytest.mark.parametrize("guess_share", [0.3, 0.9, 0.98, 1.0, 1.05, 3.0])
def test_the_search_finds_the_largest_batch_that_fits(limit: int, guess_share: float) -> None:
    module = _benchmark()
    rounds: list[list[int]] = []

    def try_batches(batches: list[int]) -> dict[int, bool]:
        rounds.append(batches)
        return {batch: batch <= limit for batch in batches}

    found = module.search_largest(try_batches, max(1, round(limit * guess_share)), width=8)
    assert found.low == limit and found.high == limit + 1 and found.exact
    assert all(0 < len(batches) <= 8 for batches in rounds)
    tried = [batch for batches in rounds for batch in batches]
    assert len(tried) == len(set(tried)), "a batch was tried twice"
    # Near the prediction (where the ladder should be), for the benchmark's batch sizes
    # (hundreds), three rounds at most.
    if 0.97 <= guess_share <= 1.05 and 100 <= limit <= 1_000:
        assert len(rounds) <= 3, rounds


def test_nothing_fits() -> None:
    module = _benchmark()
    found = module.search_largest(lambda batches: dict.fromkeys(batches, False), 50, width=4)
    assert found.low is None and found.high == 1


def test_a_batch_that_fits_above_one_that_did_not_is_reported() -> None:
    module = _benchmark()
    low, high, above = module.narrow(None, None, {90: True, 100: False, 104: True, 110: False})
    assert (low, high, above) == (90, 100, [104])
    assert module.candidates(90, 100, 0, 4) == [92, 94, 96, 98]
    assert module.candidates(99, 100, 0, 4) == []
    # The prediction itself is among the first round's, in place of the nearest (504).
    assert module.candidates(None, None, 500, 8) == [470, 481, 493, 500, 516, 527, 539, 550]


def test_the_boundary_is_run_again_and_a_repeat_that_differs_is_reported() -> None:
    """ViT-B/16 with SGD on the H200: the ladder's own verification fitted 325 where fresh
    processes ran out of memory at 323 to 328. Each side of the boundary runs once more in a
    fresh process; the table says whether they repeated themselves."""
    module = _benchmark()

    def steady(batches: list[int]) -> dict[int, bool]:
        return {batch: batch <= 322 for batch in batches}

    state = module.search_largest(steady, 325, width=8)
    assert (state.low, state.high) == (322, 323)
    assert 325 in state.tried and state.tried[325] is False  # the prediction, run fresh
    assert module.confirm_boundary(steady, state) == {
        "confirmed": True, "repeats": {"322": [True], "323": [False]}, "why": ""}
    flaky = module.confirm_boundary(lambda batches: dict.fromkeys(batches, True), state)
    assert flaky["confirmed"] is False and flaky["why"] == (
        "batch 322 fitted, then 0 of 1 repeats ran out of memory; batch 323 ran out of memory, "
        "then fitted 1 of 1 repeats")
    unfinished = module.Search(low=300, high=None)
    assert module.confirm_boundary(steady, unfinished)["confirmed"] is None
    entry = {"status": "done", "ratio": 0.99, "ladder_ooms": 0}
    assert module.verdict({**entry, "boundary": {"confirmed": True}}) == "ok"
    assert module.verdict({**entry, "boundary": {"confirmed": False}}) == (
        "ok, boundary not repeatable")
    assert module.verdict({**entry, "ratio": 1.009, "boundary": {"confirmed": None}}) == (
        "MISSED, boundary not run again")


def test_processes_share_the_gpus_memory_in_the_order_they_asked() -> None:
    module = _benchmark()
    memory = module.GpuMemory(capacity=10.0, limit=3, deadline=time.monotonic() + 60)
    held, most, started = [0.0], [0.0], []
    lock = threading.Lock()

    def job(index: int, size: float) -> None:
        assert memory.acquire(size)
        with lock:
            started.append(index)
            held[0] += size
            most[0] = max(most[0], held[0])
        time.sleep(0.05)
        with lock:
            held[0] -= size
        memory.release(size)

    sizes = [6.0, 6.0, 2.0, 2.0, 9.0, 1.0, 1.0, 1.0]
    threads = []
    for index, size in enumerate(sizes):
        threads.append(threading.Thread(target=job, args=(index, size)))
        threads[-1].start()
        time.sleep(0.005)  # they ask in this order
    for thread in threads:
        thread.join()
    assert most[0] <= 10.0
    assert started == list(range(len(sizes)))  # a large request is not overtaken
    late = module.GpuMemory(capacity=10.0, limit=3, deadline=time.monotonic() - 1)
    assert late.acquire(1.0) is False


def test_the_table_keeps_what_a_run_cut_short_had(tmp_path: Path) -> None:
    module = _benchmark()
    results = module.Results(tmp_path / "h.json", {"date": "2026-12-02 10:00 UTC",
                                                   "device": "GPU", "commit": "abc1234"})
    results.update("vit-adamw", config={"model": "ViT-B/16, 128 px", "optimizer": "adamw",
                                        "precision": "bf16", "budget_gib": 8},
                   prediction={"predicted": 300, "probes": [[32, 2 * 2**30]],
                               "optimizer_peaks": [3 * 2**30], "left_by_probes": 0,
                               "verified_peak": 7.8 * 2**30, "allocator_ooms": 2},
                   ladder_ooms=0, bracket=[296, 320], status="cut short",
                   notes=["vit-adamw: the deadline passed before fits 310 could start"])
    results.add_trial("vit-adamw", {"batch": 296, "fits": True, "peak_allocated": 2**33})
    results.update("resnet50-adamw", config={"model": "ResNet-50"}, prediction={
        "predicted": 534, "probes": []}, ladder_ooms=0, true_largest=541, exact=True,
        bracket=[541, 542], ratio=534 / 541, status="done")
    table = results.write_markdown()
    assert json.loads((tmp_path / "h.json").read_text())["cases"]["vit-adamw"]["trials"] == [
        {"batch": 296, "fits": True, "peak_allocated": 2**33}]
    assert (tmp_path / "h.md").read_text() == table
    vit = next(line for line in table.splitlines() if line.startswith("| vit-adamw"))
    assert "| 32: 2.00 | 3.00 | 300 | bracket [296, 320] | – |" in vit
    assert vit.endswith("| 2 | cut short |")
    resnet = next(line for line in table.splitlines() if line.startswith("| resnet50-adamw"))
    assert "| 534 | 541 | 0.987 | 0 |" in resnet and resnet.endswith("| ok |")
    assert "- vit-adamw: vit-adamw: the deadline passed before fits 310 could start" in table


def test_unknown_cases_are_refused() -> None:
    module = _benchmark()
    with pytest.raises(SystemExit):
        module.main(["--cases", "resnet50-adamw,nope", "--device", "cpu"])
    with pytest.raises(ValueError, match="nope; choose from resnet50-adamw"):
        module.parse_cases("resnet50-adamw,nope", module.CASES)


def test_cpu_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "headroom.json"
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "headroom_accuracy.py"), "--device", "cpu",
         "--cases", "smoke-adamw", "--width", "4", "--parallel", "4", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    data = json.loads(out.read_text())
    case = data["cases"]["smoke-adamw"]
    module = _benchmark()
    assert case["status"] == "done" and case["exact"]
    assert case["true_largest"] == module.SMOKE_LIMIT
    assert case["ratio"] == pytest.approx(int(module.SMOKE_LIMIT * 0.98) / module.SMOKE_LIMIT)
    # The prediction's process ran two real steps of the tiny GPT-style model.
    assert len(case["prediction"]["losses"]) == 2 and case["prediction"]["losses"][0] > 0
    assert {trial["batch"] for trial in case["trials"]} >= {module.SMOKE_LIMIT,
                                                             module.SMOKE_LIMIT + 1}
    assert data["smoke"] is True and "seconds" in data
    # The prediction ran in a fresh process too, and the boundary ran once more on each side.
    assert case["fresh_at_prediction"] is True
    assert case["boundary"] == {"confirmed": True, "why": "",
                                "repeats": {str(module.SMOKE_LIMIT): [True],
                                            str(module.SMOKE_LIMIT + 1): [False]}}
    table = out.with_suffix(".md").read_text()
    assert "SMOKE RUN: memory modelled, not measured." in table
    assert "| smoke-adamw |" in table and table in completed.stdout
    assert "smoke-adamw: predicted 294, true largest 300, ratio 0.980, ladder OOMs 0: ok" in (
        completed.stdout)
