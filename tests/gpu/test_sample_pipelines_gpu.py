"""Run each sample training pipeline under ``--gpu-diagnose`` and compare with EXPECTED.toml.

One subprocess per sample folder (``sample_projects/pipelines/<name>``), so a sample that kills
its CUDA context (device_assert) or caps its memory fraction cannot affect another. The codes at
warning or error level in run or failure scope must equal the sample's ``expect`` exactly;
session and device findings describe the machine, not the pipeline, and are left out.

A sample's ``env`` table (variable -> string) is set in its process's environment, for faults
that must be in place before torch starts (``CUDA_VISIBLE_DEVICES``). A sample that ``requires``
a framework (PyTorch Lightning, transformers) is skipped, naming it, where it is not installed.

Each test prints ``SAMPLE <name>: <codes>``; with ``GPUTRAIN_SAMPLE_TABLE=<path>`` set, a
Markdown table of all samples run so far is (re)written there after each one.

``GPUTRAIN_SAMPLE_SET`` picks the samples: ``pipelines`` (the default), ``heldout`` (the
held-out samples of sample_projects/heldout/, test ids ``heldout/<name>``) or ``all``. A
held-out sample's test checks that the sample ran as its table says (its own test passed, or
failed where ``fails``) and records the verdict on its diagnosis (NAMED or MISSED for a fault,
quiet or LOUD for a healthy sample) without asserting it: the held-out score is a measure of
the rules, not a target (benchmarks/heldout_score.py computes it from the facts files).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "sample_projects" / "pipelines"
HELDOUT = ROOT / "sample_projects" / "heldout"
EXPECTED: dict[str, dict[str, Any]] = tomllib.loads(
    (PIPELINES / "EXPECTED.toml").read_text(encoding="utf-8"))
HELDOUT_EXPECTED: dict[str, dict[str, Any]] = tomllib.loads(
    (HELDOUT / "EXPECTED.toml").read_text(encoding="utf-8"))
# GPUTRAIN_SAMPLE_SET=pipelines|heldout|all (default pipelines): which samples run.
SET_ENV = "GPUTRAIN_SAMPLE_SET"
SAMPLE_SETS = {"pipelines": (PIPELINES, EXPECTED), "heldout": (HELDOUT, HELDOUT_EXPECTED)}
# Seconds a sample may run; GPUTRAIN_SAMPLE_TIMEOUT lowers it for a quick pass over all samples.
TIMEOUT_S = int(os.environ.get("GPUTRAIN_SAMPLE_TIMEOUT", "300"))
PIPELINE_SCOPES = {"run", "failure"}
LOUD = {"warning", "error"}
# GPUTRAIN_SAMPLE_TABLE=samples.md writes a Markdown table of the samples run; under
# pytest-xdist each worker writes its own (samples.gw0.md, ...), as each sees only its samples.
TABLE_ENV = "GPUTRAIN_SAMPLE_TABLE"
# GPUTRAIN_SAMPLE_FACTS=DIR keeps each sample's facts file as DIR/<sample>.json (to see why a
# sample's diagnosis differs from EXPECTED.toml).
FACTS_ENV = "GPUTRAIN_SAMPLE_FACTS"

_rows: dict[str, dict[str, Any]] = {}


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _plugin_args() -> list[str]:
    """Load the plugin by module where it is not installed (a source checkout on a GPU box)."""
    from importlib.metadata import entry_points

    if any(ep.name == "gputrain" for ep in entry_points(group="pytest11")):
        return []
    return ["-p", "pytest_gputrain.plugin"]


def _release_outer_cache() -> None:
    """This pytest process is "another process" to the one it starts: give back the GPU memory
    it cached in earlier in-process GPU tests (its CUDA context alone stays under the 1 GiB
    from which other processes count, GT134/GT208)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _outcome(returncode: int, stdout: str) -> str:
    """'passed', 'failed', 'skipped' (nothing ran) or 'exit N', from pytest's summary line."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else ""
    if returncode == 0 and re.search(r"\bskipped\b", summary) and "passed" not in summary:
        return "skipped"
    return {0: "passed", 1: "failed"}.get(returncode, f"exit {returncode}")


def sample_env(name: str, spec: dict[str, Any]) -> dict[str, str]:
    """The environment of a sample's process: this one's, plus the sample's ``env`` table."""
    extra = spec.get("env", {})
    if not isinstance(extra, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in extra.items()):
        raise ValueError(f"EXPECTED.toml [{name}]: env must be a table of strings, e.g. "
                         f'env = {{ CUDA_VISIBLE_DEVICES = "" }}, got {extra!r}')
    return {**os.environ, **extra}


def sample_args(name: str, spec: dict[str, Any]) -> list[str]:
    """The sample's ``args``: extra pytest arguments (a list of strings)."""
    extra = spec.get("args", [])
    if not isinstance(extra, list) or not all(isinstance(item, str) for item in extra):
        raise ValueError(f"EXPECTED.toml [{name}]: args must be a list of strings, e.g. "
                         f'args = ["-o", "gpu_rule_param=GT138.max_percent=10"], got {extra!r}')
    return extra


def missing_modules(name: str, spec: dict[str, Any]) -> list[str]:
    """The sample's ``requires`` (a list of module names) that are not installed."""
    required = spec.get("requires", [])
    if not isinstance(required, list) or not all(isinstance(item, str) for item in required):
        raise ValueError(f"EXPECTED.toml [{name}]: requires must be a list of module names, "
                         f'e.g. requires = ["transformers", "accelerate"], got {required!r}')
    return [module for module in required if importlib.util.find_spec(module) is None]


def _codes(findings: list[dict[str, Any]], severities: set[str]) -> list[str]:
    return sorted({f["code"] for f in findings
                   if f["scope"] in PIPELINE_SCOPES and f["severity"] in severities})


def _write_table(path: str) -> None:
    lines = ["| sample | fault | expected | found (warning/error) | info | test outcome | "
             "wall s | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for name, row in sorted(_rows.items()):
        cells = [name, row["fault"], ", ".join(row["expect"]) or "-",
                 ", ".join(row["found"]) or "-", ", ".join(row["info"]) or "-", row["outcome"],
                 f"{row['wall_s']:.1f}", row["verdict"]]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    target = Path(path)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        target = target.with_name(f"{target.stem}.{worker}{target.suffix}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")


def selected_sets(value: str | None) -> list[str]:
    """The sample sets ``GPUTRAIN_SAMPLE_SET`` names (comma-separated; ``all``: every set)."""
    names = [part.strip() for part in (value or "pipelines").split(",") if part.strip()]
    if names == ["all"]:
        return list(SAMPLE_SETS)
    unknown = [name for name in names if name not in SAMPLE_SETS]
    if unknown or not names:
        raise ValueError(f"{SET_ENV}={value!r}: name pipelines, heldout or all "
                         "(comma-separated)")
    return names


def sample_params(sets: list[str]) -> list[Any]:
    """One parameter per sample of the sets, ids ``<name>`` (pipelines) and
    ``heldout/<name>``."""
    return [pytest.param(sample_set, name,
                         id=name if sample_set == "pipelines" else f"{sample_set}/{name}")
            for sample_set in sets for name in sorted(SAMPLE_SETS[sample_set][1])]


def _heldout_scorer() -> Any:
    """benchmarks/heldout_score.py, which judges a held-out sample's findings (loaded once)."""
    if "heldout_score" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "heldout_score", ROOT / "benchmarks" / "heldout_score.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules["heldout_score"]


def _skip_without_gpus(name: str, needed: int) -> None:
    import torch

    if torch.cuda.device_count() < needed:
        pytest.skip(f"sample {name} needs {needed} GPUs, "
                    f"this machine has {torch.cuda.device_count()}")


@pytest.mark.gpu
@pytest.mark.requires_cuda
@pytest.mark.skipif(not _cuda_available(), reason="needs torch with a usable CUDA GPU")
@pytest.mark.parametrize(("sample_set", "name"), sample_params(selected_sets(
    os.environ.get(SET_ENV))))
def test_sample_pipeline_diagnosis(sample_set: str, name: str, tmp_path: Path) -> None:
    folder, table = SAMPLE_SETS[sample_set]
    spec = table[name]
    heldout = sample_set == "heldout"
    _skip_without_gpus(name, int(spec.get("gpus", 1)))
    missing = missing_modules(name, spec)
    if missing:
        pytest.skip(f"sample {name} trains with {', '.join(missing)}, not installed: "
                    "pip install 'pytest-gputrain[frameworks]'")
    expect = sorted(spec.get("expect", []))
    report = tmp_path / "r.json"
    command = [
        sys.executable, "-m", "pytest", str(folder / name), *_plugin_args(),
        "--gpu-diagnose", "--gpu-fail-on=never", f"--gpu-report={report}",
        "-p", "no:cacheprovider", "-q", *sample_args(name, spec),
    ]
    if os.environ.get(FACTS_ENV):
        facts_dir = Path(os.environ[FACTS_ENV])
        facts_dir.mkdir(parents=True, exist_ok=True)
        command.append(f"--gpu-facts-out={facts_dir / name}.json")
    _release_outer_cache()
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True,
                              text=True, timeout=TIMEOUT_S, check=False,
                              env=sample_env(name, spec))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"sample {name} ran past {TIMEOUT_S} s:\n{exc.stdout or ''}")
    wall_s = time.perf_counter() - started
    output = f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert report.is_file(), f"sample {name} wrote no report (exit {done.returncode})\n{output}"

    findings: list[dict[str, Any]] = json.loads(report.read_text(encoding="utf-8"))["findings"]
    found = _codes(findings, LOUD)
    info = _codes(findings, {"info"})
    should_fail = bool(spec.get("fails", False))
    # --gpu-fail-on=never: the exit status is the sample's own tests (1 failed, 0 passed)
    outcome = _outcome(done.returncode, done.stdout)
    wanted = "failed" if should_fail else "passed"
    missing_info = sorted(set(spec.get("expect_info", [])) - set(info))
    if heldout:  # the diagnosis is measured (NAMED/MISSED, quiet/LOUD), not asserted
        judged = _heldout_scorer().judge(name, spec, findings)
        expected_text = "names: " + spec["names"] if "cause" in spec else "-"
        verdict = judged.outcome if outcome == wanted else f"{judged.outcome}; tests {outcome}"
    else:
        expected_text = ", ".join(expect) or "-"
        verdict_ok = found == expect and outcome == wanted and not missing_info
        verdict = "ok" if verdict_ok else "MISMATCH"

    label = f"{sample_set}/{name}" if heldout else name
    print(f"SAMPLE {label}: {', '.join(found) or '-'}"
          f" (expected {expected_text}; info {', '.join(info) or '-'}; "
          f"tests {outcome}; {wall_s:.1f} s; {verdict})")
    _rows[label] = {"fault": spec.get("fault", ""), "expect": [expected_text], "found": found,
                    "info": info, "outcome": outcome, "wall_s": wall_s, "verdict": verdict}
    if os.environ.get(TABLE_ENV):
        _write_table(os.environ[TABLE_ENV])

    details = "\n".join(
        f"  {f['severity']:7} {f['code']} [{f['scope']}] {f['subject']}: "
        f"{f.get('message', '')[:300]}" for f in findings)
    assert outcome == wanted, (
        f"sample {name}: expected its tests to have {wanted}, got {outcome}\n{output}")
    if heldout:
        return
    assert found == expect, f"sample {name}: findings\n{details}\n{output}"
    assert not missing_info, f"sample {name}: info codes {missing_info} missing\n{details}"
