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
SMALL_LM = "steps=5, seq_len=128, batch_size=2, width=64, layers=1"
CASES = [
    ("amp_clip_before_unscale", "steps=6, batch_size=64, hidden=64", "GT154"),
    ("healthy_amp_clip_after_unscale", "steps=6, batch_size=64, hidden=64", "GT154"),
    ("sdpa_explicit_causal_mask", SMALL_LM, "GT155"),
    ("healthy_sdpa_is_causal", SMALL_LM, "GT155"),
]


def _diagnose(pytester: pytest.Pytester, sample: str, arguments: str) -> str:
    module = next((HELDOUT / sample).glob("test_*.py"))
    pytester.makepyfile(test_sample=f"""
        import importlib.util
        import torch

        spec = importlib.util.spec_from_file_location("sample", {str(module)!r})
        sample = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sample)

        def test_fit():
            sample.train(torch.device("cpu"), {arguments})
        """)
    result = pytester.runpytest("--gpu-diagnose", "-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=1)
    return " ".join(result.stdout.str().split())  # the report wraps its lines


@pytest.mark.parametrize(("sample", "arguments", "code"), CASES, ids=[c[0] for c in CASES])
def test_the_rule_names_the_fault_and_spares_the_neighbour(
        pytester: pytest.Pytester, use_facts: Callable[..., Any], sample: str, arguments: str,
        code: str) -> None:
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
