"""pytest entry point (``-p no:gputrain`` disables it): wires the features to pytest.

Kept light: importing this module imports neither torch nor pydantic. Features load their
modules only when switched on (``--gpu-diagnose``) or used (a marker, a fixture).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import pytest

from pytest_gputrain import feature_plugins, options
from pytest_gputrain.xdist import is_xdist_worker

if TYPE_CHECKING:
    from pytest_gputrain.engine.evaluate import RuleEngine
    from pytest_gputrain.engine.rule_settings import RuleConfig, SettingError

# The features: each module declares its options, hooks and rule scopes, and keeps its own
# import light (no torch/pydantic at load). The probe comes first so that `pytest --help` lists
# its options right after the diagnosis's. A feature whose options tune the diagnosis lists
# them in its module's ``DIAGNOSIS_OPTIONS``: on the command line they turn the diagnosis on,
# as the diagnosis's own do.
FEATURES = (
    "pytest_gputrain.probe.plugin",
    "pytest_gputrain.assertions.plugin",
    "pytest_gputrain.regression.plugin",
    "pytest_gputrain.ladder.plugin",
    "pytest_gputrain.distributed.plugin",
)


def load_features() -> None:
    """Import the features outside pytest (the command line), so their rule scopes are known."""
    for module in FEATURES:
        importlib.import_module(module)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_gputrain import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    options.add_options(parser)
    # The features are registered here, after the diagnosis's options (so `pytest --help` lists
    # theirs next), rather than named in ``pytest_plugins``: pytest looks each name there up
    # among the entry points of every installed distribution first, reading all their metadata
    # once per name, which cost a plain run more than the features themselves.
    for name in FEATURES:
        if pluginmanager.get_plugin(name) is None and not pluginmanager.is_blocked(name):
            pluginmanager.register(importlib.import_module(name), name)


def diagnosis_feature_options(pluginmanager: pytest.PytestPluginManager
                              ) -> tuple[options.Option, ...]:
    """The options of the registered features that tune the diagnosis."""
    return tuple(option for name in FEATURES
                 for option in getattr(pluginmanager.get_plugin(name), "DIAGNOSIS_OPTIONS", ()))


# tryfirst: the diagnosis exists before the features' pytest_configure looks for it.
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for deprecation in options.renamed_in_use(config):
        config.issue_config_time_warning(pytest.PytestDeprecationWarning(deprecation),
                                         stacklevel=2)
    table = options.OPTIONS + diagnosis_feature_options(config.pluginmanager)
    if not options.any_set(config, table):
        return  # nothing asked of the diagnosis: nothing to check, nothing to run
    from pytest_gputrain.diagnosis_settings import read_settings

    # Every value set is checked whether or not the diagnosis runs: a typo is an error in any
    # mode.
    settings = read_settings(config, table)
    rule_config = read_rule_config(config)
    if not settings.diagnose:
        return
    from pytest_gputrain.diagnosis import (
        PLUGIN_NAME,
        Diagnosis,
        DiagnosisSession,
        WorkerDiagnosis,
    )

    engine = load_engine(config, rule_config)
    # Workers run the tests: their features record, and the records go to the controller,
    # which diagnoses the environment once and reports everything.
    session: Diagnosis = (WorkerDiagnosis(config, engine) if is_xdist_worker(config)
                          else DiagnosisSession(config, settings, engine))
    feature_plugins.register(config, options.DIAGNOSIS_KEY, session, PLUGIN_NAME)
    from pytest_gputrain.report import test_outputs  # findings on each test's own report

    test_outputs.register(config, session, settings.annotations)


def pytest_unconfigure(config: pytest.Config) -> None:
    if options.DIAGNOSIS_KEY in config.stash:
        from pytest_gputrain.report import test_outputs

        test_outputs.unregister(config)
    feature_plugins.unregister(config, options.DIAGNOSIS_KEY)


def read_rule_config(config: pytest.Config) -> RuleConfig | None:
    """The project's rule settings, checked for form (cheap: no rule is loaded); whether the
    codes they name exist is checked when the rules load. None when none is set."""
    read = options.read
    if not any(read(config, name) for name in options.RULE_SETTINGS):
        return None
    from pytest_gputrain.engine.rule_settings import SettingError, build_config

    rules_dirs, base = options.read_with_base(config, "gpu_rules_dir")
    try:
        return build_config(
            select=read(config, "gpu_select"),
            ignore=read(config, "gpu_ignore"),
            severity=read(config, "gpu_severity"),
            params=read(config, "gpu_rule_param"),
            rules_dirs=rules_dirs,
            base_dir=base,
        )
    except SettingError as exc:
        raise setting_error(config, exc) from None


def setting_error(config: pytest.Config, exc: SettingError) -> pytest.UsageError:
    """A rule setting's error, naming the setting as the user gave it (``--gpu-select`` or
    ``gpu_select in pytest.ini``)."""
    if exc.setting in options.RULE_SETTINGS:
        from pytest_gputrain import option_errors

        return pytest.UsageError(f"gputrain: {option_errors.given_as(config, exc.setting)}: "
                                 f"{exc.problem}")
    return pytest.UsageError(f"gputrain: {exc}")


def load_engine(config: pytest.Config, rule_config: RuleConfig | None) -> RuleEngine:
    """The rule engine with the project's settings; bad rule files or settings are usage errors."""
    from pytest_gputrain.engine.evaluate import RuleEngine
    from pytest_gputrain.engine.rule_settings import SettingError
    from pytest_gputrain.engine.rules import RuleFileError

    try:
        return RuleEngine.load(rule_config)
    except RuleFileError as exc:
        raise pytest.UsageError(f"gputrain: {exc}") from None
    except SettingError as exc:
        raise setting_error(config, exc) from None
