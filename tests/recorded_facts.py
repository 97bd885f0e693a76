"""The recorded fact sets under tests/facts/: one loader for conftest.py, the rule cases and the
report cases. A module of its own because under a whole-suite run the name "conftest" may be the
sample project's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FACTS_DIR = Path(__file__).resolve().parent / "facts"


def load_fact_set(name: str) -> dict[str, Any]:
    """A recorded facts file (tests/facts/NAME.json) as plain JSON data, a fresh copy each call."""
    data: dict[str, Any] = json.loads((FACTS_DIR / f"{name}.json").read_text(encoding="utf-8"))
    return data
