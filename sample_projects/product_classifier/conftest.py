"""Let `pytest sample_projects/product_classifier` import the package without installing it."""

import os
import sys
from pathlib import Path

import pytest
import torch

PROJECT = Path(__file__).resolve().parent
if str(PROJECT) not in sys.path:
    sys.path.insert(0, str(PROJECT))

# Under pytest-xdist every worker would start one intra-op thread per core; on a small CPU box
# the workers' OpenMP threads then fight each other and the CPU rungs slow down many times.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))


# The GPU ladder module is the pytest-gputrain showcase: it uses the plugin's markers and its
# `gpu_ladder` fixture. Without the plugin (`-p no:gputrain`, or not installed) it is left out,
# and the CPU tests run as plain pytest (the repository's --strict-markers would reject it).
GPU_LADDER_MODULE = "test_product_gpu_ladder.py"
PLUGIN_NAMES = ("gputrain", "pytest_gputrain.plugin")  # entry point, or `-p pytest_gputrain.plugin`


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.name == GPU_LADDER_MODULE and not any(
            config.pluginmanager.hasplugin(name) for name in PLUGIN_NAMES):
        return True
    return None


def pytest_configure(config: pytest.Config) -> None:
    # The pytest-gputrain repository's configuration registers `slow` (and leaves such tests
    # out of its default run); run from this folder, the project registers it itself.
    if not any(line.split(":")[0].strip() == "slow" for line in config.getini("markers")):
        config.addinivalue_line("markers", "slow: trains for minutes on a CPU")
