"""The JSON report: a pydantic model, so its schema is documented and checked in one place.

Schema ``pytest-gputrain-report`` version 1. Readers should check ``schema`` and
``schema_version``; fields are only ever added within a version.
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticSerializationError

from pytest_gputrain.facts import EnvironmentFacts
from pytest_gputrain.findings import Finding
from pytest_gputrain.severity import SEVERITY_RANK

REPORT_SCHEMA_VERSION = 1


class Summary(BaseModel):
    error: int = 0
    warning: int = 0
    info: int = 0


class Report(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal["pytest-gputrain-report"] = Field("pytest-gputrain-report", alias="schema")
    schema_version: int = REPORT_SCHEMA_VERSION
    plugin_version: str
    generated_at: str
    fail_on: str = Field(description="the --gpu-fail-on level in force")
    failed: bool = Field(description="the diagnosis failed the run (a finding at fail_on level)")
    summary: Summary
    environment: EnvironmentFacts
    findings: list[Finding]
    sections: dict[str, Any] = Field(
        default_factory=dict,
        description="extra tables added by other features (ladder, regression), by name",
    )


def build_report(env: EnvironmentFacts, findings: list[Finding], fail_on: str,
                 sections: dict[str, Any] | None = None) -> Report:
    from pytest_gputrain import __version__

    summary = Summary()
    for finding in findings:
        setattr(summary, finding.severity, getattr(summary, finding.severity) + 1)
    return Report(
        schema="pytest-gputrain-report",
        plugin_version=__version__,
        generated_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        fail_on=fail_on,
        failed=fails(findings, fail_on),
        summary=summary,
        environment=env,
        findings=findings,
        sections=sections or {},
    )


def fails(findings: list[Finding], fail_on: str) -> bool:
    if fail_on == "never":
        return False
    return any(f.rank >= SEVERITY_RANK[fail_on] for f in findings)


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # as a UTF-16 surrogate pair, as json.dumps writes it
    return f"\\u{0xd800 + (code >> 10):04x}\\u{0xdc00 + (code & 0x3ff):04x}"


def report_json(report: Report) -> str:
    """The report as JSON, indented, in ASCII (others as ``\\uXXXX``, as ``json.dumps``).

    Serialised by pydantic in one pass: ``json.dumps(..., indent=2)`` runs Python's encoder
    over a dict of the whole report, which took a third of a large replay's time and doubled
    its memory. A lone surrogate (from an undecodable file name in a message), which pydantic
    cannot encode, takes that slower way, which escapes it.
    """
    try:
        text = report.model_dump_json(by_alias=True, indent=2)
    except PydanticSerializationError:
        return json.dumps(report.model_dump(mode="json", by_alias=True), indent=2) + "\n"
    text = _NON_ASCII.sub(_escaped, text)  # the same string when all is ASCII
    text += "\n"  # in place (one reference): no copy of a report of 100 MB
    return text


def report_schema() -> dict[str, Any]:
    return Report.model_json_schema(by_alias=True)
