"""sample_projects/pipelines/EXPECTED.toml is consistent with the samples and the rules, and the
GPU runner applies a sample's ``env`` table (checked here, without a GPU)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from pytest_gputrain.engine.evaluate import RuleEngine
from pytest_gputrain.plugin import load_features

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ROOT / "sample_projects" / "pipelines"
EXPECTED = tomllib.loads((PIPELINES / "EXPECTED.toml").read_text(encoding="utf-8"))
KEYS = {"fault", "expect", "info_ok", "expect_info", "fails", "isolated", "env", "gpus", "args",
        "requires"}


def _runner() -> ModuleType:
    path = ROOT / "tests" / "gpu" / "test_sample_pipelines_gpu.py"
    spec = importlib.util.spec_from_file_location("sample_pipelines_runner", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_sample_folder_has_a_table_and_every_table_a_folder() -> None:
    folders = {path.parent.name for path in PIPELINES.glob("*/test_*.py")}
    assert folders == set(EXPECTED), (
        f"folders without a table: {sorted(folders - set(EXPECTED))}; "
        f"tables without a folder: {sorted(set(EXPECTED) - folders)}")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tables_use_known_keys_and_existing_codes(name: str) -> None:
    spec = EXPECTED[name]
    assert set(spec) <= KEYS, f"[{name}]: unknown key(s) {sorted(set(spec) - KEYS)}"
    load_features()
    scopes = {rule.code: rule.scope for rule in RuleEngine.load().rules}
    for key in ("expect", "info_ok", "expect_info"):
        for code in spec.get(key, []):
            assert scopes.get(code) in ("run", "failure"), (
                f"[{name}] {key}: {code} is not a run or failure rule")
    assert isinstance(spec.get("fails", False), bool)


def test_the_runner_sets_a_samples_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _runner()
    monkeypatch.setenv("GPUTRAIN_SAMPLE_PROBE", "kept")
    env = runner.sample_env("hidden_gpus", {"env": {"CUDA_VISIBLE_DEVICES": ""}})
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["GPUTRAIN_SAMPLE_PROBE"] == "kept"
    assert runner.sample_env("plain", {})["GPUTRAIN_SAMPLE_PROBE"] == "kept"
    with pytest.raises(ValueError, match=r"\[bad\]: env must be a table of strings"):
        runner.sample_env("bad", {"env": {"CUDA_VISIBLE_DEVICES": 0}})
    assert EXPECTED["hidden_gpus"]["env"] == {"CUDA_VISIBLE_DEVICES": ""}


def test_the_runner_passes_a_samples_arguments_and_they_are_valid_settings() -> None:
    from pytest_gputrain.engine.rule_settings import build_config

    runner = _runner()
    assert runner.sample_args("plain", {}) == []
    with pytest.raises(ValueError, match=r"\[bad\]: args must be a list of strings"):
        runner.sample_args("bad", {"args": "-o x=1"})
    load_features()
    for name, spec in EXPECTED.items():
        args = runner.sample_args(name, spec)
        # only ini overrides of rule parameters are used: each must name a real parameter
        for flag, value in zip(args[::2], args[1::2], strict=True):
            assert flag == "-o" and value.startswith("gpu_rule_param="), (name, args)
            RuleEngine.load(build_config(params=value.split("=", 1)[1]))


def test_the_runner_skips_a_sample_whose_framework_is_missing() -> None:
    runner = _runner()
    assert runner.missing_modules("plain", {}) == []
    assert runner.missing_modules("x", {"requires": ["json", "no_such_module_gputrain"]}) == [
        "no_such_module_gputrain"]
    with pytest.raises(ValueError, match=r"\[bad\]: requires must be a list of module names"):
        runner.missing_modules("bad", {"requires": "transformers"})
    for name in ("lightning_healthy", "lightning_starved_loader"):
        assert EXPECTED[name]["requires"] == ["pytorch_lightning"]
    for name in ("hf_trainer_healthy", "hf_trainer_fp32"):
        assert EXPECTED[name]["requires"] == ["transformers", "accelerate"]


def test_the_runner_selects_the_sample_sets() -> None:
    runner = _runner()
    assert runner.selected_sets(None) == ["pipelines"]
    assert runner.selected_sets("heldout") == ["heldout"]
    assert runner.selected_sets("all") == runner.selected_sets(" pipelines, heldout ") == [
        "pipelines", "heldout"]
    with pytest.raises(ValueError, match=r"GPUTRAIN_SAMPLE_SET='pipeline': name pipelines, "
                                         r"heldout or all"):
        runner.selected_sets("pipeline")
    ids = [param.id for param in runner.sample_params(["pipelines", "heldout"])]
    assert "sync_heavy" in ids and "heldout/gc_collect_every_step" in ids
    assert len(ids) == len(EXPECTED) + len(runner.HELDOUT_EXPECTED) == len(set(ids))


def test_the_runner_judges_a_held_out_sample_with_the_scorer() -> None:
    """The runner's verdict on a held-out sample comes from benchmarks/heldout_score.py, on the
    findings of the sample's JSON report."""
    runner = _runner()
    spec = runner.HELDOUT_EXPECTED["gc_collect_every_step"]
    finding = {"code": "GT117", "severity": "warning", "scope": "run", "subject": "t",
               "message": "The GPU idled while the host ran Python between launches.",
               "fix": "Move host work out of the loop."}
    judge = runner._heldout_scorer().judge
    assert judge("gc_collect_every_step", spec, [finding]).outcome == "MISSED"  # a symptom
    named = {**finding, "fix": "Drop the gc.collect() after every step."}
    assert judge("gc_collect_every_step", spec, [named]).outcome == "NAMED"
