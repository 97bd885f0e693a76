"""The warnings torch and the training frameworks raised while the test ran
(``run.warnings.*``, GT150), from ``warning_readings.WarningWatch``; built by
``warning_facts_builder.py``."""

from __future__ import annotations

from pydantic import Field

from pytest_gputrain.facts import FactGroup, fact


class WarningFacts(FactGroup):
    """Warnings of torch and the frameworks shown while the test ran (deprecations left out);
    those that name no fault (``warning_readings.BENIGN``) apart."""

    count: int = fact(doc="distinct warnings that may name a fault (not benign, not "
                          "deprecations)", default=0)
    benign: int = fact(doc="distinct warnings on the benign list", default=0)
    first: str | None = fact(doc="the first of those warnings: category and message")
    first_where: str | None = fact(doc="the file and line it names (torch/utils/checkpoint.py:87)")
    first_caller: str | None = fact(doc="the test's or framework's line that led there")
    first_step: int | None = fact(doc="1-based optimizer step under way when it was first shown")
    listed: list[str] = Field(
        default_factory=list, description="every such warning: category, message, where, "
        "times shown (at most 8)")
    benign_listed: list[str] = Field(default_factory=list,
                                     description="the benign ones, the same way (at most 8)")
