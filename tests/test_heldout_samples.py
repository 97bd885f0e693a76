"""sample_projects/heldout/: its EXPECTED table is consistent with its folders, and every sample
module imports and collects on a machine without CUDA, where its test skips.

The samples train on a GPU (tests/gpu/test_sample_pipelines_gpu.py with
GPUTRAIN_SAMPLE_SET=heldout); here, without one, each must still import, collect its test and
skip it for want of CUDA (not error), so that a broken sample shows before the GPU run it was
written for. A sample that trains through a framework that is not installed skips at import,
naming it.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cuda_usable import cuda_usable
from test_sample_expectations import KEYS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = ROOT / "sample_projects" / "heldout"
PIPELINES = ROOT / "sample_projects" / "pipelines"
EXPECTED = tomllib.loads((HELDOUT / "EXPECTED.toml").read_text(encoding="utf-8"))
HELDOUT_KEYS = KEYS | {"cause", "names", "source"}


def test_every_folder_has_a_table_and_every_table_a_folder() -> None:
    folders = {path.parent.name for path in HELDOUT.glob("*/test_*.py")}
    assert folders == set(EXPECTED), (
        f"folders without a table: {sorted(folders - set(EXPECTED))}; "
        f"tables without a folder: {sorted(set(EXPECTED) - folders)}")
    for name in folders:
        assert (HELDOUT / name / f"test_{name}.py").is_file(), name


def test_no_held_out_sample_shares_a_name_with_a_pipeline() -> None:
    """The GPU runner keeps every sample's facts file as DIR/<name>.json."""
    pipelines = {path.parent.name for path in PIPELINES.glob("*/test_*.py")}
    assert not pipelines & set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_table(name: str) -> None:
    spec = EXPECTED[name]
    assert set(spec) <= HELDOUT_KEYS, f"[{name}]: unknown key(s) {sorted(set(spec) - HELDOUT_KEYS)}"
    assert spec.get("fault"), f"[{name}]: a fault line for the table"
    module = (HELDOUT / name / f"test_{name}.py").read_text(encoding="utf-8")
    if "cause" in spec:
        assert spec["names"] and re.compile(spec["names"], re.IGNORECASE)
        assert "expect" not in spec, f"[{name}]: a faulty held-out sample expects no codes"
        assert spec["source"].startswith("https://"), f"[{name}]: its public source"
        assert spec["source"] in module, f"[{name}]: the docstring cites {spec['source']}"
        assert "A correct diagnosis names" in " ".join(module.split())
    else:
        assert spec.get("expect") == [], f"[{name}]: a healthy sample expects nothing"
        assert name.startswith("healthy_"), name
        assert "No fault." in module
    # the sample's test must skip where CUDA is missing, as the pipelines' do
    assert "@pytest.mark.skipif(not torch.cuda.is_available()" in module


def test_every_healthy_sample_is_the_neighbour_of_a_faulty_one() -> None:
    faulty = {name for name, spec in EXPECTED.items() if "cause" in spec}
    for name, spec in EXPECTED.items():
        if "cause" not in spec:
            module = (HELDOUT / name / f"test_{name}.py").read_text(encoding="utf-8")
            neighbours = set(re.findall(r"neighbour of ``(\w+)``", module))
            assert neighbours and neighbours <= faulty, (name, neighbours)


@pytest.mark.skipif(cuda_usable(), reason="with CUDA the samples would train here")
def test_every_sample_imports_collects_and_skips_without_cuda() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(HELDOUT), "-v", "-rs", "-p", "no:cacheprovider",
         "-p", "no:randomly"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert not re.search(r"\b(passed|failed|error|errors)\b", output.splitlines()[-1]), output
    for name, spec in sorted(EXPECTED.items()):
        path = f"{name}/test_{name}.py"
        missing = [module for module in spec.get("requires", [])
                   if importlib.util.find_spec(module) is None]
        if missing:  # skipped at import, naming the framework it needs
            assert re.search(rf"SKIPPED \[1\] \S*{re.escape(path)}:\d+: needs ", output), (
                name, output)
        else:  # imported and collected; its test skipped for want of CUDA
            assert re.search(rf"{re.escape(path)}::test_\w+ SKIPPED", output), (name, output)
            assert re.search(rf"SKIPPED \[1\] \S*{re.escape(path)}:\d+: needs a CUDA GPU",
                             output), (name, output)
