"""What a benchmark's process was doing besides the step: the facts that make two sessions of
the same code unlike, recorded with every result so a verdict can say so.

- torch settings that pick different kernels per process: ``cudnn.benchmark`` (autotuning
  chooses algorithms by timing them, so two processes may settle on different ones),
  ``cudnn.deterministic``, TF32 for matmuls, ``float32_matmul_precision``;
- whether a torch profiler ran earlier in the process: kineto leaves CUPTI attached after a
  profiler stops (unless ``TEARDOWN_CUPTI=1``), and every later kernel launch pays for it; on
  an H200 a launch-bound step went from 7.9 ms to 9.9 ms in the same process after one window;
- the SM clock the session ran at (set by ``benchmark`` from its NVML samples).

A profiler is noticed by wrapping ``torch.autograd.profiler._enable_profiler``, through which
``torch.profiler.profile`` and ``torch.autograd.profiler.profile`` start; the wrapper is
installed once torch's profiler module is loaded (the plugin checks before every test), and
only notes that a profiler started.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from typing import Any

# Conditions that, when they differ between the sides, make the sides unlike.
LIKE_FOR_LIKE = ("cudnn_benchmark", "cudnn_deterministic", "tf32_matmul",
                 "float32_matmul_precision", "profiler_before", "teardown_cupti")
# SM clock medians further apart than this fraction make sessions unlike.
CLOCK_TOLERANCE = 0.05

_WATCH_MARK = "_gputrain_watched"
_profiler_started = False


def watch_profiler() -> bool:
    """Wrap torch's profiler start once torch's profiler module is loaded; True when watched.

    Never imports torch: before torch is loaded, no profiler can have run.
    """
    module = sys.modules.get("torch.autograd.profiler")
    if module is None:
        return "torch" not in sys.modules
    original = getattr(module, "_enable_profiler", None)
    if original is None:
        return False
    if getattr(original, _WATCH_MARK, False):
        return True

    def enable_profiler(*args: Any, **kwargs: Any) -> Any:
        global _profiler_started
        _profiler_started = True
        return original(*args, **kwargs)

    setattr(enable_profiler, _WATCH_MARK, True)
    setattr(module, "_enable_profiler", enable_profiler)  # noqa: B010 (a module global)
    return True


@contextlib.contextmanager
def own_profiler() -> Iterator[None]:
    """Around the gate's own counting pass: a profiler it starts that detached CUPTI when it
    stopped (``TEARDOWN_CUPTI=1``) leaves nothing behind, and is not "a profiler before" the
    later benchmarks of the process; one that could not detach it is."""
    global _profiler_started
    before = _profiler_started
    try:
        yield
    finally:
        if os.environ.get("TEARDOWN_CUPTI") == "1":
            _profiler_started = before


def profiler_ran() -> bool | None:
    """True when a torch profiler started in this process; None when that cannot be known
    (torch's profiler was loaded and never watched)."""
    if _profiler_started:
        return True
    return False if watch_profiler() else None


def read(torch: Any | None) -> dict[str, Any]:
    """The conditions of this process now (torch settings only when torch is given)."""
    facts: dict[str, Any] = {
        "profiler_before": profiler_ran(),
        "teardown_cupti": os.environ.get("TEARDOWN_CUPTI") or None,
    }
    if torch is None:
        return facts
    readers: dict[str, Callable[[], Any]] = {
        "cudnn_benchmark": lambda: bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": lambda: bool(torch.backends.cudnn.deterministic),
        "tf32_matmul": lambda: bool(torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": lambda: str(torch.get_float32_matmul_precision()),
    }
    for name, reader in readers.items():
        facts[name] = None
        with contextlib.suppress(Exception):
            facts[name] = reader()
    return facts


def _values(conditions: list[dict[str, Any]], name: str) -> list[Any]:
    return sorted({repr(c.get(name)) for c in conditions if c.get(name) is not None})


def unlike(baseline: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[str]:
    """How the sessions of two sides differ in their conditions, one phrase per difference
    (``cudnn_benchmark: True -> False``); empty when they are alike or nothing is known."""
    found: list[str] = []
    for name in LIKE_FOR_LIKE:
        before, after = _values(baseline, name), _values(current, name)
        if before and after and before != after:
            found.append(f"{name}: {', '.join(before)} -> {', '.join(after)}")
    clocks_before = [float(c["sm_clock_median"]) for c in baseline
                     if isinstance(c.get("sm_clock_median"), int | float)]
    clocks_after = [float(c["sm_clock_median"]) for c in current
                    if isinstance(c.get("sm_clock_median"), int | float)]
    if clocks_before and clocks_after:
        before_mhz, after_mhz = statistics.median(clocks_before), statistics.median(clocks_after)
        if min(before_mhz, after_mhz) > 0 and abs(after_mhz / before_mhz - 1) > CLOCK_TOLERANCE:
            found.append(f"SM clock: {before_mhz:.0f} MHz -> {after_mhz:.0f} MHz")
    return found
