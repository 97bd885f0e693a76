"""Command-line options and their ini twins: the declarative table every feature uses, the
diagnosis's own table, and how a value is read (``read``, ``read_with_base``) or found set
(``is_set``).

Every option can be set on the command line or in the ini file (pytest.ini, tox.ini,
setup.cfg, or ``[tool.pytest.ini_options]`` / ``[tool.pytest]`` in pyproject.toml); the command
line wins. One naming rule: an option's ini name is its flag without the leading dashes, dashes
as underscores (``--gpu-rule-param`` and ``gpu_rule_param``); ini names that broke it are read
still, with a deprecation warning (``RENAMED_INI``). A switch (``kind="bool"``) has an off flag
too (``--no-gpu-diagnose``), to turn off from the command line what the ini file turns on.

Each feature declares its own table (``probe/options.py``, ``assertions/options.py``,
``regression/options.py``). Loaded by every run, so it holds no
checks of values: those are in modules loaded where an option is set
(``diagnosis_settings.py`` for the diagnosis's).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class Option:
    flag: str
    ini: str
    help: str
    kind: str = "string"  # string | bool | args | int | float
    default: Any = None
    metavar: str | None = None

    @property
    def off_flag(self) -> str:
        """A switch's flag that turns it off: ``--gpu-share`` -> ``--no-gpu-share``."""
        return "--no-" + self.flag.removeprefix("--")


OPTIONS: tuple[Option, ...] = (
    Option("--gpu-diagnose", "gpu_diagnose", "diagnose the GPU environment and report findings "
           "(header, findings table, reports); a run with no tests still diagnoses the machine. "
           "Any other option of the diagnosis on the command line turns it on too",
           kind="bool", default=False),
    Option("--gpu-report", "gpu_report", "write the diagnosis to PATH: .json (versioned schema), "
           ".md (for CI summaries) or .html (one self-contained page with each test's timeline), "
           "or name the format: md:PATH, json:PATH, html:PATH; Markdown to $GITHUB_STEP_SUMMARY "
           "is appended; repeatable; turns the diagnosis on",
           kind="args", default=[], metavar="PATH"),
    Option("--gpu-fail-on", "gpu_fail_on", "fail the run when a finding reaches this severity: "
           "error (default), warning or never", default="error", metavar="LEVEL"),
    Option("--gpu-select", "gpu_select", "rule codes or prefixes to run, e.g. GT0 or GT007 "
           "(default: all)", kind="args", default=[], metavar="CODES"),
    Option("--gpu-ignore", "gpu_ignore", "rule codes or prefixes to skip, e.g. GT013,GT014",
           kind="args", default=[], metavar="CODES"),
    Option("--gpu-severity", "gpu_severity", "override a rule's severity: CODE=LEVEL, e.g. "
           "GT008=error", kind="args", default=[], metavar="CODE=LEVEL"),
    Option("--gpu-rule-param", "gpu_rule_param", "override a rule threshold: CODE.PARAM=VALUE, "
           "e.g. GT016.min_shm=1GiB", kind="args", default=[], metavar="CODE.PARAM=VALUE"),
    Option("--gpu-rules-dir", "gpu_rules_dir", "extra folder of rule files (GT###-name.toml); "
           "repeatable", kind="args", default=[], metavar="DIR"),
    Option("--gpu-annotations", "gpu_annotations", "print each warning-or-worse finding about "
           "a test as a GitHub Actions annotation at the test's line: auto (when "
           "GITHUB_ACTIONS=true, the default), always or never", default="auto",
           metavar="WHEN"),
    Option("--gpu-facts-out", "gpu_facts_out", "write the collected facts to PATH (JSON) for "
           "`python -m pytest_gputrain replay PATH` on any machine; turns the diagnosis on",
           metavar="PATH"),
)
# In the ini file these ask for output, so they turn the diagnosis on as well; the others only
# tune a diagnosis that something else turns on.
INI_TURNS_ON = ("gpu_report", "gpu_facts_out")


# The session's diagnosis (a ``diagnose.Diagnosis``), stored by the entry point when the
# diagnosis runs. Kept here so that a feature can tell the diagnosis is off without importing it:
# pytest imports every module it loads at start-up anew each run (the plugin's own modules are
# rewritten for assertions), so what a plain run does not import, it does not pay for.
DIAGNOSIS_KEY = pytest.StashKey[Any]()
# The ini settings that choose and tune the rules (the rule engine reads them).
RULE_SETTINGS = ("gpu_select", "gpu_ignore", "gpu_severity", "gpu_rule_param", "gpu_rules_dir")
# Ini names given up for the naming rule, and the names that replace them. The old ones are
# read where the new ones are not set, with a deprecation warning (both set is a usage error).
# Both are lists, for which "not set" is empty.
RENAMED_INI = {"gpu_rule_params": "gpu_rule_param", "gpu_rules_dirs": "gpu_rules_dir"}
OLD_INI_NAME = {new: old for old, new in RENAMED_INI.items()}


def diagnosing(config: pytest.Config) -> bool:
    """Whether this session runs the diagnosis (``diagnose.diagnosis(config)`` is not None)."""
    return DIAGNOSIS_KEY in config.stash


GROUP = "gputrain"
GROUP_DESCRIPTION = "GPU training diagnosis and assertions (pytest-gputrain)"


def not_empty(value: str) -> str:
    """A command-line value as given; an empty one (``--gpu-fail-on=``) is a typo, not "unset":
    argparse makes it a usage error naming the option."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty value is not a setting: give a value, or "
                                         "leave the option out for its default")
    return value


def add_options(parser: pytest.Parser, table: tuple[Option, ...] = OPTIONS) -> None:
    """Register each option on the command line and as its ini twin (every feature uses this).
    A value may not be empty, on the command line (``not_empty``) or in the ini file
    (``ini_value``)."""
    group = parser.getgroup(GROUP, GROUP_DESCRIPTION)
    for option in table:
        cli_help = option.help.replace("%", "%%")  # argparse %-formats help texts
        ini_type: Any
        if option.kind == "bool":
            group.addoption(option.flag, action="store_true", default=None, dest=option.ini,
                            help=cli_help)
            group.addoption(option.off_flag, action="store_false", default=None,
                            dest=option.ini, help=f"turn {option.flag} off, whatever the ini "
                            f"file's {option.ini} says")
            ini_type = "bool"
        elif option.kind == "args":
            group.addoption(option.flag, action="append", default=None, dest=option.ini,
                            metavar=option.metavar, help=cli_help, type=not_empty)
            ini_type = "args"
        else:
            group.addoption(option.flag, action="store", default=None, dest=option.ini,
                            metavar=option.metavar, help=cli_help, type=not_empty)
            ini_type = _ini_type(option.kind)
        parser.addini(option.ini, option.help, type=ini_type, default=option.default)
        old = OLD_INI_NAME.get(option.ini)
        if old is not None:
            parser.addini(old, f"deprecated: the old name of {option.ini}", type=ini_type,
                          default=option.default)


def _ini_type(kind: str) -> Any:
    """pytest's ini type for a string or number option. From pytest 9.2 a number option takes
    a number (``gpu_benchmark_warmup = 5`` in ``[tool.pytest]``, where pytest refuses a number
    for a string setting) or a string, which the feature parses and checks as it does the
    command line's; before, pytest's ini types cannot say so, and both are strings."""
    number = {"int": int, "float": float}.get(kind)
    if number is None or pytest.version_tuple[:2] < (9, 2):
        return "string"
    return number | str


def read(config: pytest.Config, ini: str) -> Any:
    """The command-line value if given, else the ini value."""
    value = config.getoption(ini, default=None)
    return ini_value(config, ini) if value is None else value


def ini_value(config: pytest.Config, ini: str) -> Any:
    """The ini file's value of ``ini``, or of its old name where only that is set. A setting
    written with no value (``gpu_cannot_tell =``) is a usage error naming it: a typo, not
    "unset" (pytest gives "" only for a value set empty)."""
    value = config.getini(ini)
    if isinstance(value, str) and value == "":
        overrides = config.getoption("override_ini", default=None) or []
        if any(str(item).partition("=")[0].strip() == ini for item in overrides):
            raise pytest.UsageError(f"-o {ini}: an empty value is not a setting: give it a "
                                    "value, or leave it out for its default")
        where = f" ({config.inipath})" if config.inipath else ""
        raise pytest.UsageError(f"{ini} is set to an empty value in the ini file{where}: give "
                                "it a value, or leave it out for its default")
    old = OLD_INI_NAME.get(ini)
    return config.getini(old) if old is not None and not value else value


def renamed_in_use(config: pytest.Config) -> list[str]:
    """What to tell of each old ini name in use (a deprecation, naming the new one); a usage
    error where the ini file sets both names of one setting."""
    said = []
    for old, new in RENAMED_INI.items():
        if not config.getini(old):
            continue
        if config.getini(new):
            raise pytest.UsageError(f"{old} is the old name of {new}, and both are set: keep "
                                    f"{new} only")
        said.append(f"gputrain: the ini setting {old} is now {new} (named as its flag, "
                    f"--{new.replace('_', '-')}); rename it: the old name will stop working")
    return said


def is_set(config: pytest.Config, option: Option) -> bool:
    """Whether ``option`` is given on the command line, or set in the ini file (``-o`` included)
    to other than its default. Only then need its value be checked: a plain run loads no
    feature's checks of values."""
    return (config.getoption(option.ini, default=None) is not None
            or ini_value(config, option.ini) != option.default)


def any_set(config: pytest.Config, table: tuple[Option, ...]) -> bool:
    """Whether any option of ``table`` is set (``is_set``)."""
    return any(is_set(config, option) for option in table)


def ini_folder(config: pytest.Config) -> Path:
    """Where relative paths in the ini file start: the ini file's folder (the rootdir when
    there is none), as for pytest's own path-valued ini settings."""
    return Path(config.inipath).parent if config.inipath else Path(config.rootpath)


def read_with_base(config: pytest.Config, ini: str) -> tuple[Any, Path]:
    """``read`` for a path option: the value, and the folder its relative paths start from.

    The one rule for every path option: a value from the command line is relative to the
    current directory (where pytest was invoked), a value from the ini file to the ini file's
    folder, so that a project's settings mean the same wherever pytest is run from.
    """
    value = config.getoption(ini, default=None)
    if value is not None:
        return value, Path(config.invocation_params.dir)
    return ini_value(config, ini), ini_folder(config)


def resolve_path(text: str, base: Path) -> Path:
    """``text`` as a path: ``~`` expanded, relative to ``base``; ValueError naming ``text``
    where ``~user`` names no user (or no home directory is known)."""
    try:
        path = Path(text).expanduser()
    except RuntimeError as exc:  # Path.expanduser: "Could not determine home directory"
        raise ValueError(f"{text!r}: cannot expand '~' ({exc})") from None
    return path if path.is_absolute() else base / path
