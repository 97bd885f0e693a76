"""A sample pipeline's test module, loaded by path for its training code (tests of the probe on
the frameworks' samples, on the CPU and on a GPU)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PIPELINES = Path(__file__).resolve().parents[1] / "sample_projects" / "pipelines"


def load_sample(name: str) -> ModuleType:
    """sample_projects/pipelines/NAME/test_NAME.py as a module; skips (the sample's
    ``importorskip``) where its framework is not installed."""
    path = PIPELINES / name / f"test_{name}.py"
    spec = importlib.util.spec_from_file_location(f"gputrain_sample_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it runs
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module
