"""How the probe dresses the functions it wraps in torch (``torch_hooks.py``, ``loader.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def probe_wrapper(wrapper: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``wrapper`` dressed as ``original`` (name, qualified name, doc, ``__wrapped__``) and marked
    as the probe's, so that the uninstall finds it and a second install does not wrap it again."""
    for attribute in ("__name__", "__qualname__", "__doc__"):
        value = getattr(original, attribute, None)
        if value is not None:
            setattr(wrapper, attribute, value)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper._gputrain_probe = True  # type: ignore[attr-defined]
    return wrapper
