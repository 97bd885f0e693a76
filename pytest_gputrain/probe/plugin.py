"""The probe feature at pytest start-up: its options, and whether it is needed.

Every run loads this module (pytest compiles it anew where bytecode is not cached), so it holds
only the options (``options.py``) and ``pytest_configure``: the values are checked where one is
set (``probe_settings.py``), and under ``--gpu-diagnose`` the probe's hooks (``hooks.py``:
``ProbePlugin``, a ``RunProbe`` around each test call and the diagnosis of GPU failures) are
registered. Importing it imports neither torch nor pydantic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_gputrain import feature_plugins, options, scopes
from pytest_gputrain.probe.options import OPTIONS

if TYPE_CHECKING:
    from pytest_gputrain.probe.hooks import ProbePlugin  # noqa: F401 (stash key type)

PLUGIN_NAME = "gputrain-probe"
PLUGIN_KEY = pytest.StashKey["ProbePlugin"]()
# They tune the diagnosis: on the command line they turn it on (plugin.py reads this).
DIAGNOSIS_OPTIONS = OPTIONS

# The probe's rule scopes, run and failure, registered by probe/facts.py when rules load.
scopes.declare("pytest_gputrain.probe.facts")


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser, OPTIONS)


def pytest_configure(config: pytest.Config) -> None:
    diagnosing = options.diagnosing(config)
    if not (diagnosing or options.any_set(config, OPTIONS)):
        return
    from pytest_gputrain.probe.probe_settings import read_probe_settings

    settings = read_probe_settings(config)  # a bad value is an error with or without diagnosis
    if not diagnosing:
        return
    from pytest_gputrain.diagnosis import diagnosis

    session = diagnosis(config)
    if session is None:
        return
    from pytest_gputrain.probe.hooks import ProbePlugin, add_runs_section

    feature_plugins.register(config, PLUGIN_KEY, ProbePlugin(config, session, settings),
                             PLUGIN_NAME)
    add_runs_section(session)


def pytest_unconfigure(config: pytest.Config) -> None:
    feature_plugins.unregister(config, PLUGIN_KEY)
