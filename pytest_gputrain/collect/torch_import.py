"""Importing torch at most once after a failure: a second try can crash the interpreter.

An import of torch that fails part-way (a bad ``TORCH_LOGS`` raises ``ValueError`` from its
``__init__``) leaves its compiled core and its operator registrations behind. Importing it again
runs ``torch/__init__.py`` over them: torch answers "Only a single TORCH_LIBRARY can be used to
register the namespace ..." and, from the third try on, the interpreter dies at exit with a
segmentation fault (rc 139). So the diagnosis imports torch only where no import has failed
before, and when its own import fails, every later ``import torch`` in the process (the tests')
raises an ``ImportError`` whose cause is that first error, instead of trying again.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

FAILED_BEFORE = ("torch cannot be imported: an import of it failed earlier in this process "
                 "(see that error); importing it again could crash Python")


def half_imported() -> bool:
    """An import of torch failed part-way in this process: its submodules stayed loaded."""
    return "torch" not in sys.modules and any(name.startswith("torch.") for name in sys.modules)


class _FailedImport(importlib.abc.MetaPathFinder):
    """Answers ``import torch`` (and its submodules) with the first import's error."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> None:
        if fullname == "torch" or fullname.startswith("torch."):
            first_line = (str(self.error).strip().splitlines() or [""])[0]
            raise ImportError(f"{FAILED_BEFORE}: {type(self.error).__name__}: {first_line}",
                              name=fullname) from self.error


def import_torch() -> Any:
    """``import torch`` on the plugin's behalf; raises what the import raises, and an
    ``ImportError`` naming the first error where an import of it failed before.

    Without NumPy installed, torch warns at import ("Failed to initialize NumPy": only its NumPy
    interop needs it); where the plugin is the first to import torch, in a run whose tests
    never do, that warning would be the plugin's, so it is left out.
    """
    loaded = sys.modules.get("torch")
    if loaded is not None:
        return loaded
    if any(isinstance(finder, _FailedImport) for finder in sys.meta_path) or half_imported():
        raise ImportError(FAILED_BEFORE, name="torch")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Failed to initialize NumPy",
                                    category=UserWarning)
            import torch
    except Exception as exc:  # ImportError, or a broken install raising OSError, ValueError...
        if half_imported():
            sys.meta_path.insert(0, _FailedImport(exc))
        raise
    return torch


def try_import_torch() -> tuple[Any, str | None]:
    """``(torch, None)``, or ``(None, why)`` when it cannot be imported (never raises)."""
    try:
        return import_torch(), None
    except Exception as exc:
        if isinstance(exc, ImportError) and str(exc) == FAILED_BEFORE:
            return None, FAILED_BEFORE
        return None, f"torch cannot be imported: {type(exc).__name__}: {exc}"
