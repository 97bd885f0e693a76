"""The diagnosis's options read into one typed ``Settings``, every value checked: a bad one is a
usage error that names it, whether or not the diagnosis runs.

Loaded by ``plugin.py`` only where an option of the diagnosis is set (``options.any_set``): a
plain run neither reads nor checks them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_gputrain.option_errors import given_as, parse_choice, usage_error
from pytest_gputrain.options import (
    INI_TURNS_ON,
    OPTIONS,
    Option,
    read,
    read_with_base,
    resolve_path,
)

FAIL_ON = ("error", "warning", "never")
REPORT_FORMATS = ("json", "md", "html")
ANNOTATIONS = ("auto", "always", "never")
# Markdown reports to this file (GitHub Actions' job summary of the step) are appended to it.
STEP_SUMMARY = "GITHUB_STEP_SUMMARY"


@dataclass(frozen=True)
class ReportTarget:
    """One ``--gpu-report``: where, in which format, and whether to append (the step summary)."""

    path: Path
    format: str  # "json", "md" or "html"
    append: bool = False


@dataclass(frozen=True)
class Settings:
    diagnose: bool
    reports: list[ReportTarget] = field(default_factory=list)
    fail_on: str = "error"
    facts_out: Path | None = None
    annotations: bool = False  # GitHub Actions workflow annotations of the tests' findings


def parse_report_target(text: str, base: Path, environ: Mapping[str, str]) -> ReportTarget:
    """``report.json``, ``summary.md``, ``report.html``, or ``FORMAT:PATH`` (md, json, html);
    ValueError if none."""
    kind, sep, rest = text.partition(":")
    if sep and kind.lower() in REPORT_FORMATS and rest:
        form, path = kind.lower(), resolve_path(rest, base)
    else:
        path = resolve_path(text, base)
        form = path.suffix.lower().removeprefix(".")
        if form not in REPORT_FORMATS:
            raise ValueError(
                f"{text!r} must end in .json, .md or .html, or name its format: md:PATH, "
                f"json:PATH or html:PATH (e.g. gpu-report.json or md:${STEP_SUMMARY})")
    summary = environ.get(STEP_SUMMARY)
    try:
        append = (form == "md" and bool(summary)
                  and os.path.abspath(path) == os.path.abspath(resolve_path(str(summary), base)))
    except ValueError:  # a summary path that cannot be expanded is not this report's
        append = False
    return ReportTarget(path, form, append)


def parse_fail_on(value: object) -> str:
    """The lowest severity that fails the session (``error`` when not set); ValueError naming
    anything else."""
    return parse_choice(value or "error", FAIL_ON, "a severity that fails the session")


def parse_annotations(value: object, environ: Mapping[str, str]) -> bool:
    """Whether to print workflow annotations: ``auto`` (the default) under GitHub Actions only,
    ``always``, ``never``; ValueError naming anything else."""
    when = parse_choice(value or "auto", ANNOTATIONS, "a setting for workflow annotations")
    return when == "always" or (when == "auto" and environ.get("GITHUB_ACTIONS") == "true")


def diagnosis_requested(config: pytest.Config, table: tuple[Option, ...] = OPTIONS) -> bool:
    """``--gpu-diagnose`` or ``gpu_diagnose``; any option of ``table`` on the command line;
    or an output asked for in the ini file (``gpu_report``, ``gpu_facts_out``).

    ``--no-gpu-diagnose`` turns it off whatever the ini file says; with another option of the
    diagnosis on the command line, which would turn it on, it is a usage error.
    """
    switch = config.getoption("gpu_diagnose", default=None)
    given = [option.flag for option in table if option.ini != "gpu_diagnose"
             and config.getoption(option.ini, default=None) is not None]
    if switch is False:
        if given:
            raise pytest.UsageError(f"--no-gpu-diagnose turns the diagnosis off, and "
                                    f"{', '.join(given)} asks for it: give one or the other")
        return False
    if switch or given or config.getini("gpu_diagnose"):
        return True
    return any(config.getini(ini) for ini in INI_TURNS_ON)


def read_settings(config: pytest.Config, table: tuple[Option, ...] = OPTIONS) -> Settings:
    """Validate the diagnosis options, whether or not the diagnosis runs; a bad value is a
    UsageError that names it. ``table``: every option of the diagnosis (the probe's too)."""
    try:
        fail_on = parse_fail_on(read(config, "gpu_fail_on"))
    except ValueError as exc:
        raise usage_error(config, "gpu_fail_on", str(exc)) from None
    reports = []
    targets, base = read_with_base(config, "gpu_report")
    for text in targets or []:
        try:
            reports.append(parse_report_target(str(text), base, os.environ))
        except ValueError as exc:
            raise usage_error(config, "gpu_report", str(exc)) from None
    try:
        annotations = parse_annotations(read(config, "gpu_annotations"), os.environ)
    except ValueError as exc:
        raise usage_error(config, "gpu_annotations", str(exc)) from None
    facts_out, base = read_with_base(config, "gpu_facts_out")
    try:
        facts_path = resolve_path(str(facts_out), base) if facts_out else None
    except ValueError as exc:
        raise usage_error(config, "gpu_facts_out", str(exc)) from None
    if reports or facts_path:  # loaded only then: a plain run does not pay for it
        from pytest_gputrain import outputs

        outputs.claim(config, given_as(config, "gpu_report"),
                      [report.path for report in reports])
        outputs.claim(config, given_as(config, "gpu_facts_out"),
                      [facts_path] if facts_path else [])
    return Settings(
        diagnose=diagnosis_requested(config, table),
        reports=reports,
        fail_on=fail_on,
        facts_out=facts_path,
        annotations=annotations,
    )
