"""An option's value checked against its choices, and the usage errors that name the option as
the user gave it: its flag, ``-o`` or its ini name in its file. Loaded where a value is checked
or wrong, not by every run (``options.py`` is)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pytest_gputrain.options import OLD_INI_NAME


def parse_choice(value: object, choices: Sequence[str], what: str) -> str:
    """``value`` as one of ``choices``, case and surrounding spaces ignored; a ValueError naming
    the value, what it should be and the choices otherwise."""
    text = str(value).strip().lower()
    if text not in choices:
        raise ValueError(f"{text!r} is not {what}; expected one of {', '.join(choices)}")
    return text


def given_as(config: pytest.Config, ini: str) -> str:
    """The setting ``ini`` as the user gave it, for a message to name: its flag where the
    command line gives it (``--gpu-regression``, ``--no-gpu-share``), ``-o gpu_regression``
    where ``-o`` does, else the ini name in its file (``gpu_regression in pyproject.toml``; an
    old name where only that is set)."""
    value = config.getoption(ini, default=None)
    if value is not None:
        flag = "--" + ini.replace("_", "-")  # the naming rule
        return "--no-" + flag.removeprefix("--") if value is False else flag
    overrides = config.getoption("override_ini", default=None) or []
    old = OLD_INI_NAME.get(ini)
    name = old if old is not None and not config.getini(ini) and config.getini(old) else ini
    if any(str(item).partition("=")[0].strip() == name for item in overrides):
        return f"-o {name}"
    return f"{name} in {config.inipath.name if config.inipath else 'the ini file'}"


def usage_error(config: pytest.Config, ini: str, message: str) -> pytest.UsageError:
    """A usage error about the value of ``ini``, naming the option as the user gave it."""
    return pytest.UsageError(f"{given_as(config, ini)}: {message}")
