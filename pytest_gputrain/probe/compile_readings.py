"""What the run probe reads of torch.compile: dynamo's global counters and settings.

Dynamo keeps process-wide counters (``torch._dynamo.utils.counters``): frames it tried to
compile and those that compiled, graphs, graph breaks by reason, "unimplemented" entries (the
recompile limit among them), and the guard failures that made it recompile
(``guard_failures``). The probe reads them at the start of a test, after its warm-up steps and at
its end; the test's own activity is the difference. Counters can go back within a test:
dynamo's own test case replaces them (a reading keeps the counter object it read, so a later
reading tells a new object and counts from zero), and ``torch._dynamo.reset()`` empties the
compile-time metrics and the guard failures (a smaller reading than the earlier one counts from
zero). Nothing here imports dynamo: a process that never compiled has no counters to read
(``None``). ``CompileWatch`` takes the readings of one test and answers dynamo's callbacks.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pytest_gputrain.probe.callbacks import ProbeCallbacks



class SyncWrappers(Protocol):
    """The installation's part compile handling needs (``torch_hooks.Installation``; named by
    its one method, so this module stays below the hooks that import it)."""

    def drop_sync_wrappers(self) -> list[str]: ...


# "unimplemented" entries written when a frame hits the recompile limit: torch 2.13 says
# "Dynamo recompile limit exceeded"; earlier versions "cache_size_limit reached".
RECOMPILE_LIMIT_MARKERS = ("recompile limit", "cache_size_limit", "cache size limit")
MAX_REASONS = 5
MAX_REASON_CHARS = 200
_COMPILE_ID = re.compile(r"^\[?\d+/\d+\]?:\s*")  # "0/7: tensor 'x' size mismatch ..."
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class DynamoCounters:
    """One reading of dynamo's counters (cumulative over the process)."""

    frames_total: int = 0
    frames_ok: int = 0
    unique_graphs: int = 0
    graph_breaks: dict[str, int] = field(default_factory=dict)
    unimplemented: dict[str, int] = field(default_factory=dict)
    guard_failures: dict[Any, int] = field(default_factory=dict)  # code object -> reasons
    compile_time: float = 0.0
    suppress_errors: bool | None = None
    # The frames Counter itself (kept alive, so identity tells a reset apart from no change).
    frames_counter: Any = None

    def since(self, earlier: DynamoCounters | None, reset: bool = False) -> DynamoCounters:
        """The baseline to subtract from this reading: ``earlier``, or zeros when there was
        none or dynamo's counters were replaced in between. ``torch._dynamo.reset()`` in
        between (``reset``, or a compile time that went back) empties the compile-time metrics
        and the guard failures: those count from zero."""
        if earlier is None or earlier.frames_counter is not self.frames_counter:
            return DynamoCounters(frames_counter=self.frames_counter)
        if reset or self.compile_time < earlier.compile_time:
            return replace(earlier, compile_time=0.0, guard_failures={})
        return earlier


def read_counters() -> DynamoCounters | None:
    """Dynamo's counters now, or None when dynamo was never imported."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return None
    frames_counter = counters.get("frames")
    frames = frames_counter or {}
    stats = counters.get("stats") or {}
    failures = getattr(utils, "guard_failures", None) or {}
    return DynamoCounters(
        frames_total=int(frames.get("total", 0)),
        frames_ok=int(frames.get("ok", 0)),
        unique_graphs=int(stats.get("unique_graphs", 0)),
        graph_breaks={str(k): int(v) for k, v in (counters.get("graph_break") or {}).items()},
        unimplemented={str(k): int(v)
                       for k, v in (counters.get("unimplemented") or {}).items()},
        guard_failures={code: len(reasons) for code, reasons in list(failures.items())},
        compile_time=_compile_time(getattr(utils, "compilation_time_metrics", None) or {}),
        suppress_errors=suppress_errors(),
        frames_counter=frames_counter,
    )


def suppress_errors() -> bool | None:
    config = sys.modules.get("torch._dynamo.config")
    value = getattr(config, "suppress_errors", None)
    return bool(value) if value is not None else None


def new_guard_failures(start: DynamoCounters | None) -> list[str]:
    """Guard failure reasons recorded since ``start`` (None: all of them, as after a
    ``torch._dynamo.reset()``): the first line of one example of each kind (reasons that
    differ only in numbers are one kind), at most 5."""
    utils = sys.modules.get("torch._dynamo.utils")
    failures = getattr(utils, "guard_failures", None) or {}
    before = start.guard_failures if start is not None else {}
    if any(len(failures.get(code, ())) < count for code, count in before.items()):
        before = {}  # cleared by a reset the probe did not see: every entry is new
    reasons: list[str] = []
    kinds: set[str] = set()
    for code, entries in list(failures.items()):
        for entry in list(entries)[before.get(code, 0):]:
            text = _COMPILE_ID.sub("", first_line(str(entry)))
            kind = _NUMBER.sub("#", text)
            if text and kind not in kinds:
                kinds.add(kind)
                reasons.append(text)
            if len(reasons) >= MAX_REASONS:
                return reasons
    return reasons


def first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:MAX_REASON_CHARS]


def increase(start: dict[str, int], end: dict[str, int]) -> dict[str, int]:
    """Entries that grew between two readings, by how much."""
    grown = {key: count - start.get(key, 0) for key, count in end.items()}
    return {key: count for key, count in grown.items() if count > 0}


def is_recompile_limit(entry: str) -> bool:
    text = entry.lower()
    return any(marker in text for marker in RECOMPILE_LIMIT_MARKERS)


def register_compile_callback(callback: Callable[..., None]) -> Any:
    """Call ``callback`` at the start of every dynamo compilation; returns what
    ``remove_compile_callback`` needs, or None where dynamo has no callback API (torch < 2.6)
    or is not imported."""
    module = sys.modules.get("torch._dynamo.callback")
    handler = getattr(module, "callback_handler", None)
    register = getattr(handler, "register_start_callback", None)
    if register is None or not hasattr(handler, "remove_start_callback"):
        return None
    register(callback)
    return handler


def ensure_compile_callback(handler: Any, callback: Callable[..., None]) -> None:
    """Register ``callback`` again where ``torch._dynamo.reset()`` cleared dynamo's callbacks."""
    if callback not in handler.start_callbacks:
        handler.register_start_callback(callback)


def remove_compile_callback(handler: Any, callback: Callable[..., None]) -> None:
    if callback in handler.start_callbacks:
        handler.remove_start_callback(callback)


def _compile_time(metrics: dict[str, list[float]]) -> float:
    """Seconds in dynamo's frame compilation (the outermost timer only: the others nest in it)."""
    for key, values in metrics.items():
        if key.endswith("compile_inner") or key == "entire_frame_compile":
            return float(sum(values))
    return 0.0


class CompileWatch:
    """torch.compile during one test: dynamo's counters at the start, after the warm-up steps
    and at the end (``read_*``), and the steps in which a compilation began or dynamo was reset
    (``on_compile_start`` and ``on_dynamo_reset``, hook callbacks of ``ProbeCallbacks``)."""

    def __init__(self, probe: ProbeCallbacks, install: SyncWrappers) -> None:
        self.probe = probe
        self.record = probe.record
        self.install = install

    def read_start(self) -> None:
        record = self.record
        try:
            record.compile.start = read_counters()
        except Exception as exc:
            record.errors.append(f"reading dynamo's counters at the start: {exc}")

    def read_warm(self) -> None:
        self.record.compile.warm = read_counters()

    def read_end(self) -> None:
        record = self.record
        try:
            record.compile.end = read_counters()
            record.compile.new_recompile_reasons = new_guard_failures(
                None if record.compile.reset_steps else record.compile.start)
        except Exception as exc:
            record.errors.append(f"reading dynamo's counters at the end: {exc}")

    def on_dynamo_reset(self) -> None:
        """``torch._dynamo.reset()`` ran (its wrapper guards this)."""
        self.record.compile.reset_steps.append(len(self.record.steps.times))

    def on_compile_start(self, *_: Any) -> None:
        """Dynamo is about to compile a frame (called by dynamo, with the compile's arguments
        in recent torch and none in some earlier versions; must never raise). The sync
        wrappers go even when the probe disabled itself: dynamo would trace into them."""
        try:
            record = self.record
            steps = len(record.steps.times)
            if not self.probe.disabled:
                record.compile.compile_steps.append(steps)
            if record.syncs.stopped_at is None:
                record.syncs.stopped_at = steps
                record.errors.extend(self.install.drop_sync_wrappers())
        except Exception:
            pass
