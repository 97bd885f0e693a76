"""The held-out samples' own training loops, run small on the CPU under ``--gpu-diagnose``: the
rule written for a held-out fault names it in words the sample's ``names`` accepts, and stays
quiet on the healthy neighbour. The H200 runs of the samples (``GPUTRAIN_SAMPLE_SET=heldout``)
are the score; this checks the mechanism where no GPU is."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

pytest.importorskip("torch")

HELDOUT = Path(__file__).resolve().parent.parent / "sample_projects" / "heldout"
EXPECTED = tomllib.loads((HELDOUT / "EXPECTED.toml").read_text(encoding="utf-8"))

# (sample, the keyword arguments that make its train() small, the code that names its fault).
# A rule whose severity follows a cost measured in the GPU's profiler window (GT155) is
# information on the CPU: the mechanism is checked here, the warning on the H200.
SMALL_MLP = "torch.device('cpu'), steps=6, batch_size=64, hidden=64"
# bf16 convolutions are slow on a CPU: 32 images a batch, 8 training and 4 validation batches
SMALL_LIGHTNING = "'cpu', steps=12, image_size=16, workers=0"
SMALL_SIZES = {"BATCH_SIZE": 32, "TRAIN_IMAGES": 256, "VAL_IMAGES": 128}
SMALL_LM = "torch.device('cpu'), steps=5, seq_len=128, batch_size=2, width=64, layers=1"
CASES = [
    ("amp_clip_before_unscale", SMALL_MLP, "GT154"),
    ("healthy_amp_clip_after_unscale", SMALL_MLP, "GT154"),
    ("sdpa_explicit_causal_mask", SMALL_LM, "GT155"),
    ("healthy_sdpa_is_causal", SMALL_LM, "GT155"),
    ("lightning_validation_every_batch", SMALL_LIGHTNING, "GT156"),
    ("healthy_lightning_validation_per_epoch", SMALL_LIGHTNING, "GT156"),
]


def _diagnose(pytester: pytest.Pytester, sample: str, arguments: str) -> str:
    module = next((HELDOUT / sample).glob("test_*.py"))
    sizes = SMALL_SIZES if "lightning" in sample else {}
    pytester.makepyfile(test_sample=f"""
        import importlib.util
        import torch

        spec = importlib.util.spec_from_file_location("sample", {str(module)!r})
        sample = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sample)
        for name, value in {sizes!r}.items():
            if hasattr(sample, name):
                setattr(sample, name, value)

        def test_fit():
            sample.train({arguments})
        """)
    # Lightning's loops are run in a process of their own, apart from this session's torch
    run_pytest = pytester.runpytest_subprocess if "lightning" in sample else pytester.runpytest
    result = run_pytest("--gpu-diagnose", "-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=1)
    return " ".join(result.stdout.str().split())  # the report wraps its lines


@pytest.mark.parametrize(("sample", "arguments", "code"), CASES, ids=[c[0] for c in CASES])
def test_the_rule_names_the_fault_and_spares_the_neighbour(
        pytester: pytest.Pytester, use_facts: Callable[..., Any], sample: str, arguments: str,
        code: str) -> None:
    if "lightning" in sample:
        pytest.importorskip("pytorch_lightning", reason="pip install 'pytest-gputrain[frameworks]'")
    use_facts("cpu_laptop")
    said = _diagnose(pytester, sample, arguments)
    table = EXPECTED[sample]
    if "cause" in table:  # a faulty sample
        found = re.search(rf"(WARNING|INFO) {code} ", said)
        assert found, said[-3000:]
        report = said[found.end():]
        assert re.search(table["names"], report, re.IGNORECASE), report[:2000]
    else:
        assert code not in said
