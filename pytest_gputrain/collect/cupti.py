"""Whether CUPTI stays attached after a torch profiler stops: ``TEARDOWN_CUPTI``.

Every profiler this package starts in a user's process (the probe's window over a few steps of
a diagnosed test, the benchmark's counting pass after its timed rounds) asks here first.

When ``torch.profiler`` stops, kineto detaches CUPTI only if the environment variable
``TEARDOWN_CUPTI`` is ``"1"`` at that moment (libkineto ``CuptiActivityApi::teardownContext``
reads it with ``getenv`` when a trace stops, and again when the next trace starts, to re-attach
lazily). Otherwise CUPTI's callbacks stay subscribed for the rest of the process and every
later CUDA launch pays for them: a ResNet-18 step that ran 7.9 ms before one window ran 9.9 ms
after it, in every later test of the process. So ``TEARDOWN_CUPTI=1`` is set before the first
profiler, unless:

- the variable is already set (by the user, or by torch itself: ``torch.compile`` with CUDA
  graphs and the profiler's ``prepare_trace`` set it to ``"0"`` on CUDA < 12.6, see
  ``_TorchCompileInductorWrapper.__init__`` in ``torch/__init__.py`` and
  ``_KinetoProfile.prepare_trace`` in ``torch/profiler/profiler.py``, torch 2.11-2.13) -- a
  value someone set is never overridden;
- ``DISABLE_CUPTI_LAZY_REINIT`` is set (torch sets it next to the above, with CUDA graphs; and
  without lazy re-initialisation kineto re-subscribes right after the teardown anyway);
- torch was built against CUDA < 12.6, where a CUPTI teardown crashes a later CUDA graph capture
  or re-initialisation (the FIXME next to torch's own workaround), and a later test may use graphs;
- CUDA graphs are known to be in use: inductor's ``triton.cudagraphs`` is on, or its CUDA graph
  trees are loaded (``torch.compile(mode="reduce-overhead")``).

The variable stays set for the rest of the process: kineto reads it again after the profiler
(the teardown finishes on a later CUDA call, and the next profiler re-attaches only when it is
"1"), so restoring it would re-attach CUPTI. Child processes inherit it; it only changes what
their own profilers leave behind.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

VARIABLE = "TEARDOWN_CUPTI"
LAZY_REINIT_OFF = "DISABLE_CUPTI_LAZY_REINIT"
SAFE_WITH_GRAPHS = (12, 6)  # torch's own guard: teardown and CUDA graphs crash below this


@dataclass(frozen=True)
class Teardown:
    """Whether kineto will detach CUPTI when the profiler stops, and why."""

    on: bool
    reason: str


NO_TEARDOWN = Teardown(False, "no profiler has run")

_set_here = False  # this process's TEARDOWN_CUPTI came from ask_for_teardown


def ask_for_teardown(torch: Any, environ: MutableMapping[str, str] | None = None) -> Teardown:
    """Set ``TEARDOWN_CUPTI=1`` where that is safe (see the module docstring); never raises."""
    global _set_here
    env = os.environ if environ is None else environ
    value = env.get(VARIABLE)
    if value is not None:
        if _set_here and environ is None and value == "1":
            return Teardown(True, f"{VARIABLE}=1, set by pytest-gputrain before its first "
                                  "profiler")
        return Teardown(value == "1", f"{VARIABLE}={value} was set before this profiler")
    reason = _unsafe(torch, env)
    if reason is not None:
        return Teardown(False, reason)
    env[VARIABLE] = "1"
    if environ is None:
        _set_here = True
    return Teardown(True, f"{VARIABLE}=1, set by pytest-gputrain before its first profiler")


def _unsafe(torch: Any, env: MutableMapping[str, str]) -> str | None:
    """Why a teardown could break this process's CUDA graphs, else None."""
    if env.get(LAZY_REINIT_OFF) is not None:
        return (f"{LAZY_REINIT_OFF} is set (torch sets it for CUDA graphs): CUPTI left "
                "attached")
    version = cuda_version(torch)
    if version is None:
        return "torch reports no CUDA version: CUPTI left attached"
    if version < SAFE_WITH_GRAPHS:
        return (f"CUDA {version[0]}.{version[1]} < 12.6: a CUPTI teardown can crash later "
                "CUDA graphs, so CUPTI is left attached")
    if _cuda_graphs_in_use():
        return "CUDA graphs are in use (inductor cudagraphs): CUPTI left attached"
    return None


def cuda_version(torch: Any) -> tuple[int, int] | None:
    """``torch.version.cuda`` as (major, minor); None on CPU or unparsable builds."""
    text = getattr(getattr(torch, "version", None), "cuda", None)
    try:
        major, minor = str(text).split(".")[:2]
        return int(major), int(minor)
    except (TypeError, ValueError):
        return None


def _cuda_graphs_in_use() -> bool:
    """Inductor's CUDA graphs are switched on or loaded (never imports inductor)."""
    if "torch._inductor.cudagraph_trees" in sys.modules:
        return True
    config = sys.modules.get("torch._inductor.config")
    triton = getattr(config, "triton", None)
    try:
        return bool(getattr(triton, "cudagraphs", False))
    except Exception:
        return False
