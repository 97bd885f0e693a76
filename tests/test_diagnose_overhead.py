"""benchmarks/diagnose_overhead.py: one pytest process per mode, the plugin loaded as users get
it, rounds interleaved by a controller; its arithmetic, and a CPU smoke run end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _benchmark() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import diagnose_overhead
    finally:
        sys.path.remove(str(BENCHMARKS))
    return diagnose_overhead


def test_each_mode_loads_the_plugin_as_users_get_it(tmp_path: Path) -> None:
    module = _benchmark()
    facts = tmp_path / "facts.json"
    assert module.mode_arguments("plain", True, facts) == ["-p", "no:gputrain"]
    assert module.mode_arguments("loaded", True, facts) == []
    assert module.mode_arguments("diagnose", True, facts) == [
        "--gpu-diagnose", "--gpu-fail-on=never", f"--gpu-facts-out={facts}"]
    # Not installed: the checkout's plugin is named on the command line.
    assert module.mode_arguments("plain", False, facts) == []
    assert module.mode_arguments("loaded", False, facts) == ["-p", "pytest_gputrain.plugin"]
    assert module.mode_arguments("diagnose", False, facts)[:3] == [
        "-p", "pytest_gputrain.plugin", "--gpu-diagnose"]


def _process(module: ModuleType, mode: str, index: int, rounds: list[float], warmup: float,
             tmp_path: Path) -> Any:
    return module.Process(ident=f"mlp-{mode}-{index}", loop="mlp", mode=mode,
                          popen=SimpleNamespace(), log=tmp_path / "log",
                          facts=tmp_path / f"facts-{mode}-{index}.json", rounds=rounds,
                          warmup=warmup)


def test_medians_ratios_and_the_cost_per_test(tmp_path: Path) -> None:
    module = _benchmark()
    ms = 1e-3
    processes = [
        _process(module, "plain", 0, [1.00 * ms, 1.02 * ms, 0.98 * ms], 1.0, tmp_path),
        _process(module, "plain", 1, [1.01 * ms, 0.99 * ms, 1.00 * ms], 1.2, tmp_path),
        _process(module, "loaded", 0, [1.00 * ms, 1.01 * ms, 1.00 * ms], 1.1, tmp_path),
        _process(module, "loaded", 1, [1.00 * ms, 0.99 * ms, 1.01 * ms], 1.1, tmp_path),
        _process(module, "diagnose", 0, [1.02 * ms, 1.03 * ms, 1.02 * ms], 2.1, tmp_path),
        _process(module, "diagnose", 1, [1.02 * ms, 1.01 * ms, 1.02 * ms], 2.3, tmp_path),
    ]
    (tmp_path / "facts-diagnose-0.json").write_text(json.dumps({"runs": [{
        "profile": {"captured": True, "reason": None, "cupti_teardown": True,
                    "cupti_teardown_reason": "TEARDOWN_CUPTI=1, set by the probe"},
        "probe_errors": []}]}))
    result = module.summarise(processes, "mlp")
    assert result["modes"]["plain"]["median_ms"] == pytest.approx(1.0)
    assert result["ratios"]["loaded"] == pytest.approx(1.0)
    assert result["ratios"]["diagnose"] == pytest.approx(1.02)
    assert result["per_test_cost_s"] == pytest.approx(2.2 - 1.1)
    assert result["modes"]["diagnose"]["process_median_ms"] == [1.02, 1.02]
    first, second = result["windows"]
    assert first["captured"] is True and first["cupti_teardown"] is True
    assert second == {"captured": None, "reason": "no facts file"}


def test_the_ratio_interval_resamples_processes_with_a_fixed_seed(tmp_path: Path) -> None:
    module = _benchmark()
    ms = 1e-3
    plain = [_process(module, "plain", i, [t * ms, t * ms], 1.0, tmp_path)
             for i, t in enumerate((1.00, 1.00, 1.00, 1.00))]
    steady = [_process(module, "diagnose", i, [1.02 * ms, 1.02 * ms], 1.0, tmp_path)
              for i in range(4)]
    # Processes that agree: every draw gives the same ratio.
    assert module.ratio_interval(plain, steady, seed=0) == pytest.approx((1.02, 1.02))
    # One slow process among four widens the interval towards it, never beyond the extremes.
    spread = [_process(module, "diagnose", i, [t * ms, t * ms], 1.0, tmp_path)
              for i, t in enumerate((1.00, 1.00, 1.00, 1.20))]
    low, high = module.ratio_interval(plain, spread, seed=0)
    assert low == pytest.approx(1.00) and 1.00 < high <= 1.20
    assert module.ratio_interval(plain, spread, seed=0) == (low, high)  # the seed fixes it
    loaded = [_process(module, "loaded", i, [1.00 * ms], 1.0, tmp_path) for i in range(4)]
    result = module.summarise(plain + loaded + spread, "mlp", seed=0)
    assert result["ratio_intervals_90"]["diagnose"] == (low, high)


def test_a_process_in_the_wrong_mode_is_refused(tmp_path: Path) -> None:
    module = _benchmark()
    process = _process(module, "diagnose", 0, [], 0.0, tmp_path)
    process.hello = {"plugin_loaded": True, "probe_hooks": 0}  # the diagnosis did not start
    with pytest.raises(RuntimeError, match="wrong mode"):
        module.check_modes([process])


def test_cpu_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "diagnose_overhead.py"), "--device", "cpu",
         "--loops", "mlp", "--procs", "1", "--rounds", "2", "--steps", "4",
         "--json", str(out)],
        capture_output=True, text=True, timeout=600, check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    for text in ("--gpu-diagnose overhead on CPU", "  plain ", "  loaded ", "  diagnose ",
                 "the diagnosis's cost per test", "took "):
        assert text in completed.stdout, completed.stdout
    figures = json.loads(out.read_text())
    modes = figures["loops"]["mlp"]["modes"]
    assert {mode: len(data["rounds_ms"]) for mode, data in modes.items()} == {
        "plain": 2, "loaded": 2, "diagnose": 2}
    assert set(figures["loops"]["mlp"]["ratios"]) == {"loaded", "diagnose"}
    for low, high in figures["loops"]["mlp"]["ratio_intervals_90"].values():
        assert low <= high
    assert "90 % interval" in completed.stdout
    (window,) = figures["loops"]["mlp"]["windows"]
    assert window["captured"] is False and window["probe_errors"] == []  # no CUDA: no window
