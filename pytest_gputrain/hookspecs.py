"""Hooks that pytest-gputrain's features (and other plugins) implement to extend its reports."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec
def pytest_gputrain_report_sections(config: pytest.Config) -> dict[str, Any] | None:
    """Extra named sections for the ``--gpu-report`` files, e.g. ``{"ladder: name": {...}}``.

    A section may hold a ``markdown`` string, which the Markdown report prints under its name.
    """
