"""pytest entry point (``-p no:gputrain`` disables it).

Kept light: importing this module imports neither torch nor pydantic. Features load their
modules only when switched on (``--gpu-diagnose``) or used (a marker, a fixture).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_gputrain import options

if TYPE_CHECKING:
    from pytest_gputrain.engine.evaluate import RuleEngine

DIAGNOSE_PLUGIN = "gputrain-diagnose"
PROBE_PLUGIN = "gputrain-probe"

# Feature hook modules; each keeps its own import light (no torch/pydantic at load).
pytest_plugins = (
    "pytest_gputrain.assertions.plugin",
    "pytest_gputrain.regression.plugin",
    "pytest_gputrain.ladder.plugin",
    "pytest_gputrain.distributed.plugin",
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_gputrain import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    settings = options.read_settings(config)
    if not settings.diagnose:
        return
    from pytest_gputrain.probe.session import ProbePlugin, read_probe_settings

    probe_settings = read_probe_settings(config)
    engine = load_engine(config)
    if _is_xdist_worker(config):
        # Workers run the tests: they probe them and send run/failure facts to the controller,
        # which diagnoses the environment once and reports everything.
        probe = ProbePlugin.for_worker(config, engine, probe_settings)
        config.pluginmanager.register(probe, PROBE_PLUGIN)
        return
    from pytest_gputrain.diagnose import DiagnoseSession

    session = DiagnoseSession(config, settings, engine)
    config.pluginmanager.register(session, DIAGNOSE_PLUGIN)
    config.pluginmanager.register(
        ProbePlugin(config, engine, lambda: session.environment, session.runs, session.failures,
                    probe_settings),
        PROBE_PLUGIN)


def load_engine(config: pytest.Config) -> RuleEngine:
    """The rule engine with the project's settings; bad rule files or settings are usage errors."""
    from pytest_gputrain.engine.config import SettingError, build_config
    from pytest_gputrain.engine.evaluate import RuleEngine
    from pytest_gputrain.engine.rules import RuleFileError

    read = options.read
    try:
        rule_config = build_config(
            select=read(config, "gpu_select"),
            ignore=read(config, "gpu_ignore"),
            severity=read(config, "gpu_severity"),
            params=read(config, "gpu_rule_params"),
            rules_dirs=read(config, "gpu_rules_dirs"),
            base_dir=Path(config.rootpath),
        )
        return RuleEngine.load(rule_config)
    except (RuleFileError, SettingError) as exc:
        raise pytest.UsageError(f"gputrain: {exc}") from None


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")
