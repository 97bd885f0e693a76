"""The one door every feature (and the diagnosis) comes in through, as pytest's ``junitxml.py``:
a plugin object kept in ``config.stash`` under the feature's typed ``PLUGIN_KEY`` and registered
in ``pytest_configure``; unregistered and dropped in ``pytest_unconfigure``, so that a second
session in the process (pytester's in-process runs) starts clean.
"""

from __future__ import annotations

from typing import TypeVar

import pytest

Plugin = TypeVar("Plugin")


def register(config: pytest.Config, key: pytest.StashKey[Plugin], plugin: Plugin,
             name: str) -> Plugin:
    """Keep ``plugin`` under ``key`` and register it with pytest as ``name``; returns it."""
    config.stash[key] = plugin
    config.pluginmanager.register(plugin, name)
    return plugin


def unregister(config: pytest.Config, key: pytest.StashKey[Plugin]) -> None:
    """Undo ``register`` (nothing to do where the feature registered nothing)."""
    plugin = config.stash.get(key, None)
    if plugin is not None:
        del config.stash[key]
        config.pluginmanager.unregister(plugin)
