"""Findings: what a rule concluded, with the evidence that made it fire."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Severity = Literal["info", "warning", "error"]
Scope = Literal["session", "device", "run", "failure", "distributed"]

SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "error": 2}


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
    scope: Scope
    subject: str = Field(description="'session', a device ('cuda:0 NVIDIA H200') or a test id")
    message: str
    fix: str
    why: str
    evidence: list[Evidence] = Field(default_factory=list)
    params: dict[str, Any] = Field(default_factory=dict)
    references: list[str] = Field(default_factory=list)

    @property
    def rank(self) -> int:
        return SEVERITY_RANK[self.severity]


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then by code and subject: identical facts give identical output."""
    return sorted(findings, key=lambda f: (-f.rank, f.code, f.subject))
