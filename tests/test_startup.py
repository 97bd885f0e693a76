"""What a plain run pays for the plugin at start-up (benchmarks/startup.py measures the time).

Where bytecode is not cached (PYTHONDONTWRITEBYTECODE, a read-only install), pytest compiles every
module it imports anew each run, and a plugin's modules go through its assertion rewriter too
(parsed to Python objects, walked, compiled): the cost of a plain run is the source it loads. So
a plain run loads only the options' tables and the hooks that decide whether a feature is
needed (that find GPU tests, for one). The checks of the options' values load where an option is
set; the diagnosis, the rule engine, the GPU assertions' run-time part, the probe's hooks and
the launches' runner and diagnosis load when used.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

# Source, in bytes, of the plugin's modules a plain run loads, with `--co` or running its tests
# (76 KB on 2026-12-01, every feature's plugin object included; 155 KB before start-up was
# looked at, 99 KB for `--co` before the checks of the options' values moved out of the modules
# every run loads; 80.4 KB on 2026-12-02 with an empty ini value refused as a typo, 82.1 KB
# before the messages that name an option as given moved to option_errors.py).
SOURCE_BUDGET = 81_000
NOT_AT_START_UP = ("pytest_gputrain.diagnosis", "pytest_gputrain.engine.rule_settings",
                   "pytest_gputrain.report.html", "pytest_gputrain.report.test_outputs",
                   "pytest_gputrain.assertions.gpu_checks", "pytest_gputrain.assertions.markers",
                   "pytest_gputrain.assertions.worker_gpus",
                   "pytest_gputrain.distributed.diagnosis", "pytest_gputrain.facts",
                   "pytest_gputrain.findings",
                   # the checks of the options' values, loaded where an option is set
                   "pytest_gputrain.diagnosis_settings", "pytest_gputrain.probe.probe_settings",
                   "pytest_gputrain.assertions.assertion_settings",
                   "pytest_gputrain.regression.settings",
                   "pytest_gputrain.regression.store_location", "pytest_gputrain.units",
                   # the hooks of features a plain run does not use
                   "pytest_gputrain.probe.hooks", "pytest_gputrain.distributed.runner")

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
    heavy = [name for name in ("torch", "pydantic", "jinja2", "markdown_it")
             if name in sys.modules]
    with open(os.environ["STARTUP_REPORT"], "w") as out:
        json.dump({"modules": modules, "entry_point_scans": calls, "heavy": heavy}, out)
'''


@pytest.mark.parametrize("mode", [["--co"], []], ids=["collect-only", "run"])
def test_a_plain_run_loads_little_of_the_plugin(pytester: pytest.Pytester,
                                                mode: list[str]) -> None:
    pytester.makepyfile(startup_counter=COUNTER)
    pytester.makepyfile(**{f"test_plain_{n}": "def test_a():\n    pass\n" for n in range(3)})
    report = pytester.path / "startup.json"
    os.environ["STARTUP_REPORT"] = str(report)
    try:
        # pytest-html (the test extra) loads Jinja2 itself: left out, so that only ours counts.
        result = pytester.runpytest_subprocess("-p", "startup_counter", *mode, "-q",
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


# One option of each feature's, with a bad value: set in the ini file alone (or with -o), it
# turns nothing on, and its check is loaded all the same.
BAD_INI_VALUES = {"gpu_fail_on": "bogus", "gpu_profile_steps": "1-2",
                  "gpu_vram_history": "lots", "gpu_alpha": "2"}


@pytest.mark.parametrize("how", ["ini", "-o"])
@pytest.mark.parametrize("ini", sorted(BAD_INI_VALUES))
def test_a_value_set_only_in_the_ini_file_is_still_checked(pytester: pytest.Pytester,
                                                            ini: str, how: str) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    value = BAD_INI_VALUES[ini]
    if how == "ini":
        pytester.makeini(f"[pytest]\n{ini} = {value}\n")
        result = pytester.runpytest("--co", "-q")
    else:
        result = pytester.runpytest("--co", "-q", "-o", f"{ini}={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    # The setting named as it was given: in the ini file, or with -o.
    named = f"{ini} in tox.ini" if how == "ini" else f"-o {ini}"
    result.stderr.fnmatch_lines([f"*{named}: *"])
