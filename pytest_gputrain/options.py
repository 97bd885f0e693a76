"""Command-line options and their ini twins: the declarative table every feature uses, and the
diagnosis's own options, read into one typed ``Settings`` object.

Every option can be set on the command line or in the ini file (pytest.ini, tox.ini,
setup.cfg or ``[tool.pytest.ini_options]`` in pyproject.toml); the command line wins. Each
feature declares its own table next to its hooks (``probe/plugin.py``, ``assertions/plugin.py``,
``regression/settings.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

FAIL_ON = ("error", "warning", "never")
REPORT_SUFFIXES = (".json", ".md")


@dataclass(frozen=True)
class Option:
    flag: str
    ini: str
    help: str
    kind: str = "string"  # string | bool | args
    default: Any = None
    metavar: str | None = None


OPTIONS: tuple[Option, ...] = (
    Option("--gpu-diagnose", "gpu_diagnose", "diagnose the GPU environment and report findings "
           "(header, findings table, reports); a run with no tests still diagnoses the machine",
           kind="bool", default=False),
    Option("--gpu-report", "gpu_report", "write the diagnosis to PATH: .json (versioned schema) "
           "or .md (for CI summaries); repeatable", kind="args", default=[], metavar="PATH"),
    Option("--gpu-fail-on", "gpu_fail_on", "fail the run when a finding reaches this severity: "
           "error (default), warning or never", default="error", metavar="LEVEL"),
    Option("--gpu-select", "gpu_select", "rule codes or prefixes to run, e.g. GT0 or GT007 "
           "(default: all)", kind="args", default=[], metavar="CODES"),
    Option("--gpu-ignore", "gpu_ignore", "rule codes or prefixes to skip, e.g. GT013,GT014",
           kind="args", default=[], metavar="CODES"),
    Option("--gpu-severity", "gpu_severity", "override a rule's severity: CODE=LEVEL, e.g. "
           "GT008=error", kind="args", default=[], metavar="CODE=LEVEL"),
    Option("--gpu-rule-param", "gpu_rule_params", "override a rule threshold: CODE.PARAM=VALUE, "
           "e.g. GT016.min_shm=1GiB", kind="args", default=[], metavar="CODE.PARAM=VALUE"),
    Option("--gpu-rules-dir", "gpu_rules_dirs", "extra folder of rule files (GT###-name.toml); "
           "repeatable", kind="args", default=[], metavar="DIR"),
    Option("--gpu-facts-out", "gpu_facts_out", "write the collected facts to PATH (JSON) for "
           "`python -m pytest_gputrain replay PATH` on any machine", metavar="PATH"),
)


GROUP = "gputrain"
GROUP_DESCRIPTION = "GPU training diagnosis and assertions (pytest-gputrain)"


def add_options(parser: pytest.Parser, table: tuple[Option, ...] = OPTIONS) -> None:
    """Register each option on the command line and as its ini twin (every feature uses this)."""
    group = parser.getgroup(GROUP, GROUP_DESCRIPTION)
    for option in table:
        cli_help = option.help.replace("%", "%%")  # argparse %-formats help texts
        if option.kind == "bool":
            group.addoption(option.flag, action="store_true", default=None, dest=option.ini,
                            help=cli_help)
            parser.addini(option.ini, option.help, type="bool", default=option.default)
        elif option.kind == "args":
            group.addoption(option.flag, action="append", default=None, dest=option.ini,
                            metavar=option.metavar, help=cli_help)
            parser.addini(option.ini, option.help, type="args", default=option.default)
        else:
            group.addoption(option.flag, action="store", default=None, dest=option.ini,
                            metavar=option.metavar, help=cli_help)
            parser.addini(option.ini, option.help, type="string", default=option.default)


def read(config: pytest.Config, ini: str) -> Any:
    """The command-line value if given, else the ini value."""
    value = config.getoption(ini, default=None)
    return config.getini(ini) if value is None else value


@dataclass(frozen=True)
class Settings:
    diagnose: bool
    reports: list[Path] = field(default_factory=list)
    fail_on: str = "error"
    facts_out: Path | None = None


def _resolve(config: pytest.Config, text: str) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else Path(config.invocation_params.dir) / path


def read_settings(config: pytest.Config) -> Settings:
    """Validate the diagnosis options; a bad value is a UsageError that names it."""
    fail_on = str(read(config, "gpu_fail_on") or "error").strip().lower()
    if fail_on not in FAIL_ON:
        raise pytest.UsageError(
            f"gpu_fail_on / --gpu-fail-on: {fail_on!r} is not one of {', '.join(FAIL_ON)}"
        )
    reports = []
    for text in read(config, "gpu_report") or []:
        path = _resolve(config, text)
        if path.suffix.lower() not in REPORT_SUFFIXES:
            raise pytest.UsageError(
                f"gpu_report / --gpu-report: {text!r} must end in .json or .md "
                "(e.g. --gpu-report=gpu-report.json)"
            )
        reports.append(path)
    facts_out = read(config, "gpu_facts_out")
    return Settings(
        diagnose=bool(read(config, "gpu_diagnose")),
        reports=reports,
        fail_on=fail_on,
        facts_out=_resolve(config, facts_out) if facts_out else None,
    )
