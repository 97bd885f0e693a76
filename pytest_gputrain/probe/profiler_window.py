"""A short torch.profiler window (CUDA activity only) over a few steps of each diagnosed test.

``WindowSteering`` opens the window at the boundary of its first step (``gpu_profile_steps``,
default 3-6) and closes it after its last, on the device the test trains on. ``ProfilerWindow``
starts and stops torch.profiler and hands the events to ``window_analysis.analyse`` (what only a
profiler sees: kernel busy time, pageable copies, tensor-core kernels, syncs, ...).
"""

from __future__ import annotations

import time
import warnings
from typing import Any

from pytest_gputrain.collect.cuda_events import with_trace_bytes
from pytest_gputrain.collect.cupti import NO_TEARDOWN, ask_for_teardown
from pytest_gputrain.probe.cuda_readings import memory_stats
from pytest_gputrain.probe.run_record import RunRecord
from pytest_gputrain.probe.window_analysis import analyse, convert


class ProfilerWindow:
    """Starts torch.profiler at one step boundary and stops it at a later one."""

    def __init__(self, torch: Any, device_index: int) -> None:
        self.torch = torch
        self.device_index = device_index
        self.profiler: Any = None
        self.started_at = 0.0
        self.first_step = 0

    @staticmethod
    def busy_reason(torch: Any) -> str | None:
        """Why a window cannot start now (another profiler is running), else None."""
        try:
            if torch.autograd.profiler._is_profiler_enabled:
                return "another torch profiler was running"
        except Exception:
            pass
        try:
            if torch._C._autograd._profiler_enabled():
                return "another torch profiler was running"
        except Exception:
            pass
        return None

    def start(self, first_step: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.first_step = first_step
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Profiler clears events..." is not the user's
            self.profiler = profile(activities=[ProfilerActivity.CUDA])
            self.profiler._gputrain_window = True  # not the test's: its start/stop not timed
            self.profiler.start()
        self.started_at = time.perf_counter()

    def stop(self, steps: int, cuda_ok: bool = True) -> dict[str, Any]:
        """Stop the profiler; with ``cuda_ok`` wait for the GPU first and analyse the events."""
        profiler, self.profiler = self.profiler, None
        if profiler is None:
            return {"captured": False, "reason": "the window never started"}
        own_syncs = 0
        if cuda_ok:
            self.torch.cuda.synchronize(self.device_index)
            own_syncs = 1
        wall = time.perf_counter() - self.started_at
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            profiler.stop()
        if not cuda_ok:
            return {"captured": False, "reason": "the CUDA context failed during the window"}
        results = getattr(profiler.profiler, "kineto_results", None)
        if results is None:
            return {"captured": False, "reason": "the profiler returned no events"}
        gpu, runtime = convert(results.events())
        if any(e.kind == "memcpy" and "Pageable" in e.name and not e.nbytes for e in gpu):
            gpu = with_trace_bytes(profiler, gpu)
        if not gpu:
            return {"captured": False, "reason": "the profiler saw no GPU activity (CUPTI "
                    "unavailable, or no kernels in the window)", "steps": steps, "wall": wall}
        facts = analyse(gpu, runtime, wall, steps, own_syncs=own_syncs)
        facts.update(captured=True, steps=steps, first_step=self.first_step,
                     last_step=self.first_step + steps - 1)
        return facts


class WindowSteering:
    """The window of one test: opened at a step boundary, closed at a later one; what it saw
    goes into ``record.window_facts`` (and the allocator's counters at its end into
    ``record.allocator.window``)."""

    def __init__(self, torch: Any, record: RunRecord,
                 profile_steps: tuple[int, int] | None) -> None:
        self.torch = torch
        self.record = record
        self.open: ProfilerWindow | None = None  # between two step boundaries
        # The window opens at the boundary that ends step first_step - 1 and closes at the one
        # that ends its last step.
        self.opens_at = profile_steps[0] - 1 if profile_steps is not None else -1
        self.last_step = profile_steps[1] if profile_steps is not None else 0
        self._teardown = NO_TEARDOWN  # what the open window leaves of CUPTI when it closes

    def at_step(self, count: int) -> None:
        """Open the profiler window at its first step's boundary, close it after its last
        (``count`` steps so far)."""
        record = self.record
        steps = record.steps
        window = self.open
        if window is not None:
            if count >= self.last_step:
                self.stop(count - window.first_step + 1)
                steps.after_window = True
                steps.last_t = time.perf_counter()
        elif count == self.opens_at and record.devices.cuda_index is not None \
                and not record.window_facts:
            self.start(count + 1)
            steps.last_t = time.perf_counter()

    def start(self, first_step: int) -> None:
        busy = ProfilerWindow.busy_reason(self.torch)
        if busy is not None:
            self.record.window_facts = {"captured": False, "reason": busy}
            return
        teardown = ask_for_teardown(self.torch)
        window = ProfilerWindow(self.torch, self.record.devices.cuda_index or 0)
        try:
            window.start(first_step)
        except Exception as exc:
            self.record.window_facts = {"captured": False,
                                        "reason": f"torch.profiler did not start: {exc}"}
            return
        self.open = window
        self.record.steps.in_window = True
        self._teardown = teardown

    def stop(self, steps: int, cuda_ok: bool = True) -> None:
        """Close the window after ``steps`` steps; with ``cuda_ok`` False (a sticky CUDA error)
        make no CUDA call."""
        window, self.open = self.open, None
        if window is None:
            return
        record = self.record
        record.steps.in_window = False
        try:
            record.window_facts = window.stop(max(1, steps), cuda_ok=cuda_ok)
            record.window_facts["cupti_teardown"] = self._teardown.on
            record.window_facts["cupti_teardown_reason"] = self._teardown.reason
            if cuda_ok and record.devices.cuda_index is not None:
                record.allocator.window = memory_stats(self.torch, record.devices.cuda_index)
        except Exception as exc:
            record.window_facts = {"captured": False,
                                   "reason": f"profiler window failed: {type(exc).__name__}: {exc}"}
