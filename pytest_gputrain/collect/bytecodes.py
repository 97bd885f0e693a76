"""Python bytecode instructions a step executes on its own thread, counted by function.

More Python per step (a bookkeeping loop, a per-sample transform, a logging call) is the one
kind of host work torch's counters cannot see: no operator, kernel or copy changes. The host's
CPU time sees it, but moves with the host's load (on the H200's busy host, 2026-12-02, 10.7 %
between sessions of the same code); a hardware instruction counter would not, but virtual
machines often have none. The interpreter's own count of the instructions it executed is exact
wherever Python runs: the same code on the same input executes the same bytecodes, however busy
the host, so a rise of a few thousand per step is seen at once, and the function they ran in is
named.

How: on Python 3.12+ ``sys.monitoring``'s ``INSTRUCTION`` event under a tool id of our own (a
debugger, coverage or a profiler keep theirs); before 3.12 the calling thread's trace function
with ``f_trace_opcodes`` (``sys.settrace``, which a debugger or coverage may already hold: then
nothing is counted, and ``count_bytecodes`` says why). Only the calling thread counts: a
sampler, a logger or a pin-memory thread runs its own Python at its own pace. Either way each
instruction calls back into Python, many times the cost of running it, which is why
this runs in the untimed counting pass, over few steps.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

# sys.monitoring's ids are shared by every tool in the process: 0 debugger, 1 coverage,
# 2 profiler, 5 optimizer; 3 and 4 have no owner by convention.
FREE_TOOL_IDS = (3, 4)
TOOL_NAME = "pytest-gputrain bytecode count"
# Counting slows Python many times over: after this long, no further step is counted.
COUNTING_TIME_S = 5.0
FUNCTIONS_KEPT = 200  # the functions that executed the most, per step: a wrapper of a few
# bytecodes is among them in a step of some hundred functions


@dataclass(frozen=True)
class StepBytecodes:
    """One counted step: its instructions, and how many ran in each function."""

    total: int
    by_function: dict[str, int]


def function_name(code: CodeType) -> str:
    """``train_step (train.py:40)``: the function and where it begins."""
    name = getattr(code, "co_qualname", code.co_name)
    return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


def _named(counts: Counter[CodeType]) -> StepBytecodes:
    named: Counter[str] = Counter()
    for code, count in counts.items():
        named[function_name(code)] += count
    return StepBytecodes(sum(named.values()), dict(named.most_common(FUNCTIONS_KEPT)))


def _count_with_monitoring(step: Callable[[], Any], steps: int) -> list[StepBytecodes] | str:
    monitoring = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
    tool = next((i for i in FREE_TOOL_IDS if monitoring.get_tool(i) is None), None)
    if tool is None:
        return (f"sys.monitoring's tool ids {', '.join(map(str, FREE_TOOL_IDS))} are taken by "
                "other tools in this process")
    own = threading.get_ident()
    get_ident = threading.get_ident
    counts: Counter[CodeType] = Counter()

    def on_instruction(code: CodeType, offset: int) -> None:
        if get_ident() == own:
            counts[code] += 1

    found: list[StepBytecodes] = []
    monitoring.use_tool_id(tool, TOOL_NAME)
    try:
        monitoring.register_callback(tool, monitoring.events.INSTRUCTION, on_instruction)
        started = time.monotonic()
        for _ in range(steps):
            counts.clear()
            monitoring.set_events(tool, monitoring.events.INSTRUCTION)
            try:
                step()
            finally:
                monitoring.set_events(tool, monitoring.events.NO_EVENTS)
            counts.pop(_count_with_monitoring.__code__, None)  # its own call of the step
            found.append(_named(counts))
            if time.monotonic() - started > COUNTING_TIME_S:
                break
    finally:
        monitoring.register_callback(tool, monitoring.events.INSTRUCTION, None)
        monitoring.free_tool_id(tool)
    return found


def _count_with_trace(step: Callable[[], Any], steps: int) -> list[StepBytecodes] | str:
    held = sys.gettrace()
    if held is not None:
        return (f"this thread is already traced ({getattr(held, '__qualname__', held)!r}: a "
                "debugger or coverage); counting bytecodes before Python 3.12 would take its "
                "place")
    counts: Counter[CodeType] = Counter()

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            counts[frame.f_code] += 1
        return local

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True  # from here on, an "opcode" event per instruction
        return local

    found: list[StepBytecodes] = []
    started = time.monotonic()
    for _ in range(steps):
        counts.clear()
        sys.settrace(on_call)
        try:
            step()
        finally:
            sys.settrace(None)
        found.append(_named(counts))
        if time.monotonic() - started > COUNTING_TIME_S:
            break
    return found


def count_bytecodes(step: Callable[[], Any], steps: int) -> list[StepBytecodes] | str:
    """Per step (``steps`` of them, fewer when they take over ``COUNTING_TIME_S``), the bytecode
    instructions ``step`` executed on the calling thread; or why none could be counted. The
    step's own exceptions propagate."""
    if sys.implementation.name != "cpython":
        return f"bytecodes are counted on CPython only (this is {sys.implementation.name})"
    if sys.version_info >= (3, 12):
        return _count_with_monitoring(step, steps)
    return _count_with_trace(step, steps)
