"""What a plain run pays for the plugin at start-up (benchmarks/startup.py measures the time).

Where bytecode is not cached (PYTHONDONTWRITEBYTECODE, a read-only install), pytest compiles every
module it imports anew each run, and a plugin's modules go through its assertion rewriter too
(parsed to Python objects, walked, compiled): the cost of a plain run is the source it loads. So
a plain run loads only the options, the checks of their values and the hooks that find GPU tests;
the diagnosis, the rule engine, the GPU assertions' run-time part and the launches' diagnosis
load when used.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

# Source, in bytes, of the plugin's modules a plain `pytest --co` loads (97 KB today, every
# feature's plugin object included; 155 KB before start-up was looked at).
SOURCE_BUDGET = 100_000
NOT_AT_START_UP = ("pytest_gputrain.diagnosis", "pytest_gputrain.engine.rule_settings",
                   "pytest_gputrain.report.html", "pytest_gputrain.report.test_outputs",
                   "pytest_gputrain.assertions.gpu_checks", "pytest_gputrain.assertions.markers",
                   "pytest_gputrain.assertions.worker_gpus",
                   "pytest_gputrain.distributed.diagnosis", "pytest_gputrain.facts",
                   "pytest_gputrain.findings")

COUNTER = '''
import json, os, sys
import _pytest.config

calls = []
_original = _pytest.config.PytestPluginManager.load_setuptools_entrypoints


def _counted(self, group, name=None):
    calls.append(name)
    return _original(self, group, name)


_pytest.config.PytestPluginManager.load_setuptools_entrypoints = _counted


def pytest_sessionfinish(session):
    modules = {name: os.path.getsize(module.__file__) for name, module in sys.modules.items()
               if name.startswith("pytest_gputrain") and getattr(module, "__file__", None)}
    heavy = [name for name in ("torch", "pydantic", "jinja2") if name in sys.modules]
    with open(os.environ["STARTUP_REPORT"], "w") as out:
        json.dump({"modules": modules, "entry_point_scans": calls, "heavy": heavy}, out)
'''


def test_a_plain_run_loads_little_of_the_plugin(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(startup_counter=COUNTER)
    pytester.makepyfile(**{f"test_plain_{n}": "def test_a():\n    pass\n" for n in range(3)})
    report = pytester.path / "startup.json"
    os.environ["STARTUP_REPORT"] = str(report)
    try:
        # pytest-html (the test extra) loads Jinja2 itself: left out, so that only ours counts.
        result = pytester.runpytest_subprocess("-p", "startup_counter", "--co", "-q",
                                               "-p", "no:cacheprovider", "-p", "no:html")
    finally:
        del os.environ["STARTUP_REPORT"]
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    found = json.loads(report.read_text())
    loaded = found["modules"]
    assert "pytest_gputrain.plugin" in loaded
    assert [name for name in NOT_AT_START_UP if name in loaded] == []
    assert found["heavy"] == []  # the HTML report's Jinja2 loads only when one is written
    assert sum(loaded.values()) <= SOURCE_BUDGET, sorted(loaded.items(), key=lambda i: -i[1])
    # The features are registered directly: naming them in pytest_plugins made pytest scan
    # every installed distribution's entry points once per feature.
    assert found["entry_point_scans"] == [None]


def test_the_features_still_load_their_options_and_hooks(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    options = ["--gpu-diagnose", "--gpu-probe", "--gpu-required", "--gpu-save", "--gpu-store"]
    positions = [result.stdout.str().index(option) for option in options]
    assert positions == sorted(positions)  # the diagnosis's, then the probe's, then the others
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.requires_cuda(*", "@pytest.mark.distributed(*"])
    assert sys.modules.get("pytest_gputrain.probe.plugin") is not None
