"""Which training framework drives a run, and which framework a call came from (pure).

A framework is told by the package of the code on the Python call stack: ``transformers`` (the
Hugging Face Trainer), PyTorch Lightning (``lightning``, ``pytorch_lightning``,
``lightning_fabric``) or ``accelerate``. The rules name the framework's own setting in their
fixes (``Trainer(precision="bf16-mixed")``, ``TrainingArguments(dataloader_num_workers=...)``)
and do not blame the user's loop for the framework's habits (the Trainer's NaN/Inf loss filter
reads the loss back every step).

Two readings, both off the per-step path: the framework that drives the run is read once, at
the main optimizer's first step (``driving_framework``); the framework that asked for a sync is
the package of the sync's call site (``package_framework`` of the first caller outside torch,
found by ``collect/sync_calls.py`` at each sync, which already costs the host tens of
microseconds while the GPU drains: a few frame reads do not show beside it).
"""

from __future__ import annotations

from types import FrameType
from typing import Final

# Top-level package -> the framework's name in the facts.
PACKAGES: Final = {
    "transformers": "transformers",
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "lightning_fabric": "lightning",
    "accelerate": "accelerate",
}
# The Hugging Face Trainer runs on accelerate, and Lightning may too: the trainer that called
# it is the one whose settings the user writes.
PRECEDENCE: Final = ("transformers", "lightning", "accelerate")
PLAIN: Final = "pytorch"  # no framework on the stack: the test's own loop
# Each framework as a rule's documentation names it (``explain`` shows a fix's case for it as
# "Under Lightning: ..."), and the facts that hold a framework's name.
READER_NAMES: Final = {"lightning": "Lightning", "transformers": "the Hugging Face Trainer",
                       "accelerate": "accelerate"}
FRAMEWORK_FACTS: Final = ("run.framework", "run.sync.framework")


def case_label(subject: str, value: object) -> str | None:
    """The label of a fix's case chosen by a framework fact (``engine.expr.CaseLabel``):
    "Under the Hugging Face Trainer"; None for any other case."""
    if subject in FRAMEWORK_FACTS and isinstance(value, str) and value in READER_NAMES:
        return f"Under {READER_NAMES[value]}"
    return None


def package_framework(module: object) -> str | None:
    """The framework a module (its ``__name__``) belongs to, or None."""
    if not isinstance(module, str):
        return None
    return PACKAGES.get(module.partition(".")[0])


def driving_framework(frame: FrameType | None) -> str:
    """The framework anywhere on the stack from ``frame`` up (by ``PRECEDENCE``), else
    ``PLAIN``."""
    found: set[str] = set()
    while frame is not None:
        name = package_framework(frame.f_globals.get("__name__"))
        if name is not None:
            found.add(name)
        frame = frame.f_back
    return next((name for name in PRECEDENCE if name in found), PLAIN)
