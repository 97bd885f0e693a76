"""Hooks of the GPU assertions: options, markers, finding GPU tests, fixtures, xdist pinning.

Import-light: importing this module imports neither torch nor pydantic, and it loads the
assertions' run-time part (``runtime.py``: requirements, measurements, limits, OOM clean-up) only
when the session needs it: collection found a GPU test, tests are about to run, or workers are
pinned to GPUs. A collect-only run of a suite without GPU tests costs one look at each module's
and class's markers and each test's own. The GPU stack is reached through a backend
(``backend.GpuBackend``), created on first use through the ``pytest_gputrain_backend`` hook, so
tests can replace it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gputrain import options
from pytest_gputrain.assertions import marker_names
from pytest_gputrain.assertions.fixtures import PLUGIN_KEY, PLUGIN_NAME, gpu, gpu_monitor
from pytest_gputrain.xdist import is_xdist_worker

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pytest_gputrain.assertions.markers import MaxVram
    from pytest_gputrain.assertions.runtime import GpuAssertions
    from pytest_gputrain.assertions.xdist import XdistPinning  # noqa: F401 (stash key type)

__all__ = ["gpu", "gpu_monitor"]

PINNING_NAME = "gputrain-xdist-pinning"
DEFAULT_HISTORY = 20000

PINNING_KEY = pytest.StashKey["XdistPinning"]()
SETTINGS_KEY = pytest.StashKey["AssertionSettings"]()

OPTIONS: tuple[options.Option, ...] = (
    options.Option(
        "--gpu-required", "gpu_required",
        "GPU tests that would be skipped (no usable GPU, unmet requires_cuda) fail instead: "
        "for GPU CI runners that must not pass vacuously", kind="bool", default=False),
    options.Option(
        "--gpu-max-vram", "gpu_max_vram",
        "peak-VRAM limit for every GPU test without its own max_vram marker: SIZE or "
        "SIZE:MEASURE, e.g. 20GiB or 20GiB:reserved", metavar="SIZE"),
    options.Option(
        "--gpu-vram-history", "gpu_vram_history",
        "allocator events to record (Python stacks) in tests with a max_vram marker, to show "
        f"the top allocations when one fails; 0 turns recording off (default {DEFAULT_HISTORY})",
        default=str(DEFAULT_HISTORY), metavar="ENTRIES"),
    options.Option(
        "--gpu-per-worker", "gpu_per_worker",
        "pytest-xdist: give each worker N GPUs through CUDA_VISIBLE_DEVICES, taken from the "
        "caller's CUDA_VISIBLE_DEVICES when set; more workers than GPUs is an error without "
        "--gpu-share", metavar="N"),
    options.Option(
        "--gpu-share", "gpu_share",
        "pytest-xdist with --gpu-per-worker: let workers share GPUs round-robin when there are "
        "more workers than GPUs", kind="bool", default=False),
)


@dataclass(frozen=True)
class AssertionSettings:
    required: bool = False
    default_max_vram: MaxVram | None = None
    history_entries: int = DEFAULT_HISTORY
    per_worker: int | None = None
    share: bool = False


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser, OPTIONS)


def read_settings(config: pytest.Config) -> AssertionSettings:
    """The assertion options, validated; a bad value is a usage error that names it."""
    read = options.read
    default_text = read(config, "gpu_max_vram")
    default = None
    if default_text not in (None, ""):
        from pytest_gputrain.assertions import markers

        try:
            default = markers.parse_default_max_vram(str(default_text))
        except markers.MarkerError as exc:
            raise pytest.UsageError(f"gpu_max_vram / --gpu-max-vram: {exc}") from None
    history_text = str(read(config, "gpu_vram_history") or "0").strip()
    # ASCII digits only (int() refuses some that isdigit() accepts), and few of them.
    if not re.fullmatch(r"[0-9]{1,9}", history_text):
        from pytest_gputrain.units import shown

        raise pytest.UsageError(
            f"gpu_vram_history / --gpu-vram-history: {shown(history_text)} is not a whole "
            f"number of entries from 0 to 999999999 (e.g. --gpu-vram-history={DEFAULT_HISTORY}, "
            "0 turns it off)")
    return AssertionSettings(
        required=bool(read(config, "gpu_required")),
        default_max_vram=default,
        history_entries=int(history_text),
        per_worker=_per_worker(read(config, "gpu_per_worker")),
        share=bool(read(config, "gpu_share")),
    )


def _per_worker(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None  # the usual case: the pinning's module is not even imported
    from pytest_gputrain.assertions.xdist import parse_per_worker

    return parse_per_worker(value)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in marker_names.MARKER_HELP:
        config.addinivalue_line("markers", line)
    settings = read_settings(config)
    config.stash[SETTINGS_KEY] = settings
    if is_xdist_worker(config):
        # An xdist worker: pin it before anything initialises CUDA in this process.
        from pytest_gputrain.assertions.xdist import pin_worker

        pin_worker(config, settings.per_worker, settings.share,
                   lambda: runtime(config).count_gpus())
    elif settings.per_worker is not None and config.pluginmanager.hasplugin("xdist"):
        from pytest_gputrain.assertions.xdist import XdistPinning

        plugin = runtime(config)
        pinning = XdistPinning(config, settings.per_worker, settings.share, plugin.count_gpus)
        config.stash[PINNING_KEY] = pinning
        config.pluginmanager.register(pinning, PINNING_NAME)


def runtime(config: pytest.Config) -> GpuAssertions:
    """The assertions' run-time plugin, loaded and registered on first need."""
    plugin = config.stash.get(PLUGIN_KEY, None)
    if plugin is None:
        from pytest_gputrain.assertions.runtime import GpuAssertions

        plugin = GpuAssertions(config, config.stash[SETTINGS_KEY])
        config.stash[PLUGIN_KEY] = plugin
        config.pluginmanager.register(plugin, PLUGIN_NAME)
    return plugin


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Find the GPU tests (a GPU marker on the test or its module or class, or a GPU fixture)
    and hand them to the run-time part, which parses their markers."""
    names, fixtures = marker_names.GPU_MARKERS, marker_names.GPU_FIXTURES
    inherited: dict[int, list[tuple[str, tuple[Any, ...], Mapping[str, Any]]]] = {}

    def gpu_marks(node: Any) -> list[tuple[str, tuple[Any, ...], Mapping[str, Any]]]:
        # The GPU markers of a node and its parents, closest first (as iter_markers gives
        # them), worked out once per module or class rather than once per test: this loop
        # runs over every collected test of every suite.
        key = id(node)
        if key not in inherited:
            parent = node.parent
            inherited[key] = [(m.name, m.args, m.kwargs) for m in node.own_markers
                              if m.name in names] + (gpu_marks(parent) if parent else [])
        return inherited[key]

    found = []
    for item in items:
        own = [(m.name, m.args, m.kwargs) for m in item.own_markers if m.name in names]
        parent = item.parent
        marks = own + gpu_marks(parent) if parent is not None else own
        fixturenames = getattr(item, "fixturenames", ())
        if marks or any(name in fixturenames for name in fixtures):
            found.append((item, marks))
    if found:
        runtime(config).adopt(found, items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Tests are about to run: any of them may run out of CUDA memory, so the run-time part
    (OOM clean-up, the GPU tests' tally) is in place from the first."""
    if not session.config.option.collectonly:
        runtime(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    _unregister(config, PINNING_KEY)
    _unregister(config, PLUGIN_KEY)


def _unregister(config: pytest.Config, key: pytest.StashKey[Any]) -> None:
    plugin = config.stash.get(key, None)
    if plugin is not None:
        del config.stash[key]
        config.pluginmanager.unregister(plugin)
