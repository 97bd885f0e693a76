"""Findings: what a rule concluded, with the evidence that made it fire."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pytest_gputrain import scopes
from pytest_gputrain.severity import SEVERITY_RANK

Severity = Literal["info", "warning", "error"]


def _scope_schema(schema: dict[str, Any]) -> None:
    # The documented schema lists the scopes registered when it is generated.
    rest = dict(schema)
    schema.clear()
    schema.update({"enum": scopes.names(), **rest})


class Evidence(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    value: Any = None
    unit: str | None = None
    display: str = Field(description="the value formatted for people")
    why_unknown: str | None = None


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str
    name: str
    title: str
    severity: Severity
    scope: str = Field(json_schema_extra=_scope_schema)
    subject: str = Field(description="'session', a device ('cuda:0 NVIDIA H200') or a test id")
    message: str
    fix: str
    why: str
    evidence: list[Evidence] = Field(default_factory=list)
    params: dict[str, Any] = Field(default_factory=dict)
    references: list[str] = Field(default_factory=list)
    explained_by: str | None = Field(
        default=None, description="the code of the finding (of the session, or of the same "
        "test) that explains this one's cost: this finding then offers that finding's fix")

    @property
    def rank(self) -> int:
        return SEVERITY_RANK[self.severity]


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then by code and subject: identical facts give identical output."""
    return sorted(findings, key=lambda f: (-f.rank, f.code, f.subject))
