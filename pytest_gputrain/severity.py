"""The severities of findings, lowest first: the one list rules, settings and reports share.

Kept apart from ``findings`` (pydantic models) so that settings can be checked at pytest
start-up without importing pydantic.
"""

from __future__ import annotations

SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "error": 2}
