"""The JSON report: a pydantic model, so its schema is documented and checked in one place.

Schema ``pytest-gputrain-report`` version 1. Readers should check ``schema`` and
``schema_version``; fields are only ever added within a version.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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


def report_json(report: Report) -> str:
    return json.dumps(report.model_dump(mode="json", by_alias=True), indent=2) + "\n"


def report_schema() -> dict[str, Any]:
    return Report.model_json_schema(by_alias=True)
