"""Debugging instruments a test may leave on while it trains, read while it trains.

Each records or checks something at every operator, launch, allocation or sync, and is meant
for one debugging run (PyTorch's tuning guide, "Disable debugging APIs"):

- allocator history recording (``torch.cuda.memory._record_memory_history``): a stack trace at
  every allocation and free of the caching allocator;
- the sync debug mode (``torch.cuda.set_sync_debug_mode("warn")`` / ``"error"``): a Python
  warning (or an error) at every synchronising call;
- verbose torch.compile logging (``torch._logging.set_logs(dynamo=logging.DEBUG,
  output_code=True)``, or ``TORCH_LOGS`` read when torch starts): whole graphs and generated
  code printed at every compilation;
- a profiler of the test's own (``torch.profiler.profile``, ``emit_nvtx``): its kind, read at a
  step where one records, and the time its own calls took (``ProfilerTimes``).

Anomaly detection has its own reading (the backwards run under it, ``module_readings.py``).

``read_instruments`` joins the settings read at step boundaries (``settings_timeline.py``: the
first steps, the profiler window, every ``EVERY``-th step), so a switch turned on inside the test
and restored in ``finally:`` is seen; it makes no CUDA call on a device the test did not
initialise, and never imports a torch module the test did not import.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from pytest_gputrain.collect.environment_variables import VERBOSE_LOG_ARTIFACTS
from pytest_gputrain.probe.wrapping import probe_wrapper

if TYPE_CHECKING:
    from pytest_gputrain.probe.run_record import SettingsTimeline

SYNC_DEBUG_MODES: Final = {0: "off", 1: "warn", 2: "error"}
# Loggers whose DEBUG level prints a compilation's every step (TORCH_LOGS=+dynamo, ...).
COMPILE_LOGGERS: Final = {"torch._dynamo": "dynamo", "torch._inductor": "inductor",
                          "torch._functorch._aot_autograd": "aot", "torch._functorch": "aot"}
DEBUG_LEVEL: Final = 10  # logging.DEBUG
# torch._C._autograd._profiler_type(): ActiveProfilerType.KINETO, .NVTX, .LEGACY, .ITT, ...
PROFILER_KINDS: Final = {"kineto": "torch.profiler", "nvtx": "emit_nvtx",
                         "legacy": "torch.autograd.profiler (legacy)", "itt": "emit_itt"}


def read_instruments(torch: Any) -> dict[str, Any]:
    """The instruments' switches now, named as ``RunFacts`` fields; a switch this torch cannot
    tell is left out (unknown)."""
    found: dict[str, Any] = {}
    cuda_ready = False
    with contextlib.suppress(Exception):
        cuda_ready = bool(torch.cuda.is_initialized())
    if cuda_ready:
        history = getattr(torch._C, "_cuda_isHistoryEnabled", None)
        if callable(history):
            with contextlib.suppress(Exception):
                found["memory_history"] = bool(history())
        mode = getattr(torch._C, "_cuda_get_sync_debug_mode", None)
        if callable(mode):
            with contextlib.suppress(Exception):
                found["sync_debug_mode"] = SYNC_DEBUG_MODES.get(int(mode()), str(mode()))
    found["compile_logs"] = compile_logs()
    return found


def compile_logs() -> str:
    """The verbose torch.compile logging in force ('dynamo=DEBUG, output_code'; '' for none):
    DEBUG levels of the compiler's loggers and the artifacts that print graphs or code. Read
    from torch's log state only where the test's torch has loaded it."""
    internal = sys.modules.get("torch._logging._internal")
    state = getattr(internal, "log_state", None)
    if state is None:
        return ""
    shown: list[str] = []
    try:
        for qname, level in sorted(state.log_qname_to_level.items()):
            name = COMPILE_LOGGERS.get(qname)
            if name is not None and int(level) <= DEBUG_LEVEL and f"{name}=DEBUG" not in shown:
                shown.append(f"{name}=DEBUG")
        shown.extend(sorted(name for name in state.artifact_names
                            if name in VERBOSE_LOG_ARTIFACTS))
    except Exception:  # another torch's log state: nothing to tell
        return ""
    return ", ".join(shown)


def profiler_kind_reader(torch: Any) -> Callable[[], str | None]:
    """A call that names the kind of the profiler recording now ('torch.profiler',
    'emit_nvtx', ...), None where this torch cannot say."""
    kind = getattr(getattr(torch._C, "_autograd", None), "_profiler_type", None)
    if not callable(kind):
        return lambda: None

    def read() -> str | None:
        name = str(kind()).rpartition(".")[2].lower()
        return PROFILER_KINDS.get(name, name) if name and name != "none" else None

    return read


PROFILER_METHODS: Final = ("start", "stop", "step")


def note_user_profiler(settings: SettingsTimeline, index: int,
                       kind: Callable[[], str | None]) -> None:
    """Step ``index`` ended while a profiler of the test's own recorded: counted, dated, and its
    kind read (at a few such steps: a test keeps one kind)."""
    settings.user_profiler_steps += 1
    settings.user_profiled.append(index)
    if settings.user_profiler_steps <= 2 or index % KIND_READ_EVERY == 0:
        name = kind()
        if name is not None and name not in settings.user_profiler_kinds:
            settings.user_profiler_kinds.append(name)


KIND_READ_EVERY: Final = 32


class ProfilerTimes:
    """The host time a profiler of the test's own spent in its own calls: starting (kineto and
    CUPTI set up), stopping (every recorded event processed) and, under a schedule, stepping
    (a cycle's trace processed when it ends): wrappers of ``torch.profiler.profile.start``,
    ``stop`` and ``step`` (``with profile(...)`` calls the first two). The probe's own window is
    left out (its profiler is marked ``_gputrain_window``)."""

    def __init__(self, settings: SettingsTimeline) -> None:
        self.settings = settings

    def wrappers(self, torch: Any) -> list[tuple[Any, str, Callable[..., Any]]]:
        owner = getattr(getattr(torch, "profiler", None), "profile", None)
        found = []
        for name in PROFILER_METHODS:
            original = vars(owner).get(name) if isinstance(owner, type) else None
            if callable(original):
                found.append((owner, name, self._timed(original)))
        return found

    def _timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.perf_counter
        settings = self.settings

        def timed(profiler: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(profiler, "_gputrain_window", False):
                return original(profiler, *args, **kwargs)
            started = clock()
            try:
                return original(profiler, *args, **kwargs)
            finally:
                settings.user_profiler_setup_time += clock() - started

        return probe_wrapper(timed, original)
