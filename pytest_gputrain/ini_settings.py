"""The project's pytest settings, for the command line: found and read exactly as pytest does.

``python -m pytest_gputrain replay`` must give the findings ``pytest --gpu-diagnose`` gave, so
it reads the same ``gpu_*`` settings (``gpu_rules_dir``, ``gpu_select``, ``gpu_ignore``,
``gpu_severity``, ``gpu_rule_param``, ``gpu_fail_on``) from the same file; ``history`` and
``compare`` find the store ``pytest --gpu-save`` wrote (``gpu_store``) the same way. Rather
than copy pytest's rules for finding that file (pytest.ini, pyproject.toml's ``[tool.pytest]``
tables, tox.ini, setup.cfg; the rootdir; ``--rootdir`` and ``-c``), this starts pytest itself
up to the point where its configuration is read, and stops there: no conftest is imported, no
test is collected, nothing is printed (``pytest_cmdline_main`` answers first).
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_gputrain.options import RULE_SETTINGS, ini_folder, ini_value, renamed_in_use

# The settings the rule engine and the verdict read.
SETTINGS = (*RULE_SETTINGS, "gpu_fail_on")


class ProjectSettingsError(Exception):
    """pytest could not read the project's configuration; the message says why."""


@dataclass(frozen=True)
class ProjectSettings:
    rootpath: Path
    ini_folder: Path  # where the ini file's relative paths start (``options.ini_folder``)
    values: dict[str, Any] = field(default_factory=dict)
    deprecations: list[str] = field(default_factory=list)  # old ini names in use
    ini_file: Path | None = None  # the file the values come from, where there is one


class _ReadAndStop:
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.settings: ProjectSettings | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_cmdline_main(self, config: pytest.Config) -> int:
        self.settings = ProjectSettings(
            rootpath=Path(config.rootpath), ini_folder=ini_folder(config),
            values={name: ini_value(config, name) for name in self.names},
            deprecations=renamed_in_use(config),
            ini_file=Path(config.inipath) if config.inipath else None)
        return 0  # firstresult: pytest runs no session


def read_project_settings(rootdir: str | None = None, inifile: str | None = None,
                          names: tuple[str, ...] = SETTINGS) -> ProjectSettings:
    """The ini settings ``names`` of the project in the current directory, found as ``pytest``
    run there would find them; ``rootdir``/``inifile`` as ``--rootdir``/``-c``."""
    args: list[str] = ["-p", "no:cacheprovider", "--noconftest", "--assert=plain",
                       "--capture=no", "-o", "addopts="]
    if rootdir is not None:
        args += ["--rootdir", rootdir]
    if inifile is not None:
        args += ["-c", inifile]
    reader = _ReadAndStop(names)
    captured = io.StringIO()
    with redirect_stdout(captured), redirect_stderr(captured):
        code = pytest.main(args, plugins=[reader])
    if reader.settings is None:
        said = " ".join(captured.getvalue().split())
        raise ProjectSettingsError(f"pytest could not read the project's configuration (exit "
                                   f"{int(code)}): {said or 'no message'}")
    return reader.settings
