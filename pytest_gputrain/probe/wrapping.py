"""How the probe dresses the functions it wraps in torch (``torch_hooks.py``, ``loader.py``):
as the syncs' counters do (``collect/sync_calls.py``), so that one mark finds them all."""

from __future__ import annotations

from pytest_gputrain.collect.sync_calls import dressed

# ``wrapper`` dressed as ``original`` (name, qualified name, doc, ``__wrapped__``) and marked as
# the probe's, so that the uninstall finds it and a second install does not wrap it again.
probe_wrapper = dressed

__all__ = ["probe_wrapper"]
