"""``HostWatch``: where the training thread spends the host time the GPU waits for.

GT117 (the GPU idles while the host works inside the step) and GT118 (steps many times the
usual length) measure host time; this reader says which call took it. Two readings, neither on
the per-step path:

- **a sampler thread** reads the training thread's Python stack (``sys._current_frames``) every
  ``INTERVAL`` seconds, but only while it matters: inside the probe's profiler window (the steps
  GT117 judges) and inside a step that has already run ``LONG_RATIO`` times the recent median
  step (the steps GT118 judges). Otherwise it sleeps until the step under way would turn long,
  so a step of ordinary length is never sampled and pays nothing but, at most, one wake-up of a
  sleeping thread. Each sample is attributed to a call site: the innermost frame of the test's
  own code or of a training framework's (``frameworks.PACKAGES``); frames of torch, the
  standard library and other installed packages are folded into the frame that called them,
  and the innermost of them is kept as what the site was doing (``numpy.stack``,
  ``torch.nn.functional.scaled_dot_product_attention``). A sample stands for the time since the
  previous one (the first of a stretch for ``INTERVAL``): a thread that holds the GIL delays the
  sampler, so the gaps are longer where the host is busiest, and the time is the gap's, less
  the garbage collections timed meanwhile (they are counted as such).
- **``gc.callbacks``** time every garbage collection during the test exactly (its start to its
  stop), with its generation and the step it fell in; a wrapper of ``gc.collect`` names the
  call site of an explicit collection. A collection holds the GIL, so the sampler cannot see it:
  ``gc.collect()`` after every step is found here, as is the automatic collection of the oldest
  generation that a heap of Python objects sets off.

What it records is ``run_record.HostSamples`` (``record.host``); ``host_facts_builder.py``
turns it into ``run.host.*``. Nothing here raises into the test: a failure stops the sampler
and is reported in ``run.probe_errors``.
"""

from __future__ import annotations

import gc
import linecache
import os
import site
import statistics
import sys
import sysconfig
import threading
import time
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any, Final

from pytest_gputrain.probe.frameworks import PACKAGES
from pytest_gputrain.probe.run_record import (
    HOST_SAMPLE_INTERVAL,
    CallSite,
    HostSamples,
    RunRecord,
    StepSeries,
)
from pytest_gputrain.probe.wrapping import probe_wrapper

if TYPE_CHECKING:
    from pytest_gputrain.probe.torch_hooks import Patches

INTERVAL: Final = HOST_SAMPLE_INTERVAL  # seconds between two samples while sampling
IDLE_WAIT: Final = 0.01  # longest sleep while not sampling (the window may open meanwhile)
LONG_RATIO: Final = 2.0  # a step turns long past this many recent median steps ...
LONG_MIN: Final = 0.02  # ... and this many seconds
RECENT_STEPS: Final = 15  # the steps the recent median is taken over
MAX_SAMPLES: Final = 4000  # per test: 8 s of sampling at INTERVAL
GC_KEPT_SECONDS: Final = 0.0005  # a young collection shorter than this only adds to the totals
MAX_COLLECTIONS: Final = 4096  # collections kept one by one per test
SOURCE_CHARS: Final = 72  # a call site's source line is cut to this many characters


class _Sites:
    """Call sites by (code object, line): the sampler's cheap key, resolved to text at the end."""

    def __init__(self, samples: HostSamples) -> None:
        self.samples = samples
        self._index: dict[tuple[CodeType, int, CodeType | None], int] = {}
        self._inner: list[tuple[str, str] | None] = []

    def index(self, frame: FrameType, inner: FrameType | None) -> int:
        code = frame.f_code
        key = (code, frame.f_lineno, inner.f_code if inner is not None else None)
        found = self._index.get(key)
        if found is None:
            found = self._index[key] = len(self.samples.sites)
            self.samples.sites.append(CallSite(
                file=code.co_filename, line=frame.f_lineno,
                function=getattr(code, "co_qualname", code.co_name)))
            self._inner.append(_qualified(inner) if inner is not None else None)
        return found

    def resolve(self) -> None:
        """Each site's source line and inner call as text (off the training path, at the end)."""
        for site_, inner in zip(self.samples.sites, self._inner, strict=True):
            text = linecache.getline(site_.file, site_.line).strip()
            site_.source = text if len(text) <= SOURCE_CHARS else text[:SOURCE_CHARS - 3] + "..."
            if inner is not None:
                site_.inner = ".".join(part for part in inner if part)
        self._index.clear()


def _qualified(frame: FrameType) -> tuple[str, str]:
    module = frame.f_globals.get("__name__")
    code = frame.f_code
    return (module if isinstance(module, str) else "",
            getattr(code, "co_qualname", code.co_name))


def library_roots() -> tuple[str, ...]:
    """Folders whose code is folded into its caller: the standard library, the installed
    packages, torch's and this plugin's own folders."""
    roots: set[str] = set()
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            roots.add(paths[key])
    try:
        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    except Exception:  # a virtualenv's older site module lacks them
        pass
    torch = sys.modules.get("torch")
    for module in (torch, sys.modules.get("pytest_gputrain")):
        location = getattr(module, "__file__", None)
        if isinstance(location, str):
            roots.add(os.path.dirname(location))
    return tuple(sorted(os.path.join(os.path.realpath(root), "") for root in roots if root))


def call_line(frame: FrameType) -> str:
    """A frame's line as the facts name a call site: `the source` at file:line (the source cut
    to SOURCE_CHARS, a trailing comment dropped)."""
    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    code = text.partition("  #")[0].strip()
    if len(code) > SOURCE_CHARS:
        code = code[:SOURCE_CHARS - 3] + "..."
    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    return f"`{code}` at {where}" if code else where


class SiteFinder:
    """Tells a frame of the test's or a framework's code (a call site) from a folded one."""

    def __init__(self, roots: tuple[str, ...] | None = None) -> None:
        self.roots = library_roots() if roots is None else roots
        self._known: dict[CodeType, bool] = {}

    def is_site(self, frame: FrameType) -> bool:
        code = frame.f_code
        known = self._known.get(code)
        if known is None:
            known = self._known[code] = self._classify(frame)
        return known

    def _classify(self, frame: FrameType) -> bool:
        module = frame.f_globals.get("__name__")
        if isinstance(module, str) and module.partition(".")[0] in PACKAGES:
            return True  # a framework's own code: its settings are what the rules name
        filename = frame.f_code.co_filename
        if not filename or filename.startswith("<"):
            return False  # frozen modules, exec'd strings
        return not os.path.realpath(filename).startswith(self.roots)

    def site(self, frame: FrameType | None) -> tuple[FrameType, FrameType | None] | None:
        """The innermost site from ``frame`` outwards, and the innermost folded frame below
        it (None when ``frame`` is itself a site)."""
        inner = None
        while frame is not None:
            if self.is_site(frame):
                return frame, inner
            if inner is None:
                inner = frame
            frame = frame.f_back
        return None


class HostWatch:
    """The stack sampler and the garbage-collection timer of one test."""

    def __init__(self, record: RunRecord, sample: bool = True) -> None:
        self.record = record
        self.readings: HostSamples = record.host
        self._steps: StepSeries = record.steps
        self._sample = sample
        self._finder: SiteFinder | None = None
        self._sites = _Sites(self.readings)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the sites table: the sampler and gc.collect's wrapper
        self._target: int | None = None  # the training thread
        self._pid = -1  # its process: a forked DataLoader worker inherits the callbacks
        self._gc_started: float | None = None
        self._explicit = -1  # site of the gc.collect() under way
        self._installed_callback = False

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self, patches: Patches) -> None:
        """Time garbage collections and wrap ``gc.collect`` (on the training thread, when the
        test's call begins)."""
        self._target = threading.get_ident()
        self._pid = os.getpid()
        self.readings.sampler = "the test never trained on a GPU"
        try:
            self._finder = SiteFinder()
            gc.callbacks.append(self._on_gc)
            self._installed_callback = True
            collect = vars(gc).get("collect")
            if callable(collect) and not getattr(collect, "_gputrain_probe", False):
                patches.set(gc, "collect", self._wrap_collect(collect))
        except Exception as exc:
            self.record.errors.append(f"timing garbage collections: {exc}")

    def start_sampler(self) -> None:
        """Start the sampler thread (at the first step on a GPU, as the NVML sampler: a CPU
        run, which neither GT117 nor GT118 judges, gets no thread of the probe's)."""
        if self._thread is not None or self._stop.is_set() or self._finder is None:
            return
        if not self._sample:
            self.readings.sampler = "the stack sampler is off"
            return
        if not hasattr(sys, "_current_frames"):
            self.readings.sampler = "this Python has no sys._current_frames"
            return
        self.readings.sampler = None
        self._thread = threading.Thread(target=self._run, name="gputrain-host-stacks",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the sampler and the timer (``gc.collect`` is restored with the other patches),
        and resolve the call sites' text."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=1.0)
        if self._installed_callback:
            self._installed_callback = False
            try:
                gc.callbacks.remove(self._on_gc)
            except ValueError:
                self.record.errors.append("gc.callbacks lost the probe's callback during the test")
        with self._lock:
            self._sites.resolve()

    # -- garbage collections -------------------------------------------------------------------

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Called by the interpreter around each collection: it must never raise (an exception
        # here would reach the user as an "unraisable exception" warning).
        try:
            if self._pid != os.getpid():
                return
            if phase == "start":
                self._gc_started = time.perf_counter()
                return
            started, self._gc_started = self._gc_started, None
            if started is None:
                return
            seconds = time.perf_counter() - started
            generation = int(info.get("generation", 0))
            readings = self.readings
            total = readings.gc_totals.get(generation)
            if total is None:
                total = readings.gc_totals[generation] = [0, 0.0]
            total[0] += 1
            total[1] += seconds
            readings.gc_seconds += seconds
            explicit = self._explicit
            if (generation or explicit >= 0 or seconds >= GC_KEPT_SECONDS) and len(
                    readings.collections) < MAX_COLLECTIONS:
                readings.collections.append(
                    (len(self._steps.times), generation, seconds, explicit))
        except Exception:  # pragma: no cover - a few arithmetic operations
            self._gc_started = None

    def _wrap_collect(self, original: Any) -> Any:
        getframe = sys._getframe

        def collect(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == self._target and os.getpid() == self._pid:
                try:
                    self._explicit = self._site_index(getframe(1))
                except Exception:
                    self._explicit = -1
            try:
                return original(*args, **kwargs)
            finally:
                self._explicit = -1

        return probe_wrapper(collect, original)

    def _site_index(self, frame: FrameType | None) -> int:
        finder = self._finder
        found = finder.site(frame) if finder is not None else None
        if found is None:
            return -1
        with self._lock:
            return self._sites.index(*found)

    # -- the sampler thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._sample_loop()
        except Exception as exc:  # never let the sampler take the test down
            self.record.errors.append(f"host stack sampler: {type(exc).__name__}: {exc}")

    def _sample_loop(self) -> None:
        steps, readings = self._steps, self.readings
        times = steps.times
        target = self._target
        frames = sys._current_frames
        clock = time.perf_counter
        wait = self._stop.wait
        counted, threshold = -1, None
        last: float | None = None
        collected = 0.0  # readings.gc_seconds at the last sample
        while not self._stop.is_set():
            count = len(times)
            if count != counted:
                counted, threshold = count, _long_step(times)
            now = clock()
            if steps.in_window:
                pause = 0.0
            elif threshold is None:
                pause = IDLE_WAIT
            else:
                pause = threshold - (now - steps.last_t)
            if pause > 0.0:
                last = None
                wait(min(pause, IDLE_WAIT))
                continue
            if len(readings.samples) >= MAX_SAMPLES:
                return
            frame = frames().get(target)  # type: ignore[arg-type]
            found = self._finder.site(frame) if self._finder is not None else None
            if found is not None:
                seconds = INTERVAL if last is None else max(
                    0.0, now - last - (readings.gc_seconds - collected))
                with self._lock:
                    index = self._sites.index(*found)
                readings.samples.append((count, steps.in_window, index, seconds))
            del frame, found
            last, collected = now, readings.gc_seconds
            wait(INTERVAL)


def _long_step(times: list[float]) -> float | None:
    """Seconds after which the step under way counts as long (None: too few steps yet)."""
    if len(times) < 2:
        return None
    recent = times[max(1, len(times) - RECENT_STEPS):]  # the first step does one-time work
    return max(LONG_MIN, LONG_RATIO * statistics.median(recent))
