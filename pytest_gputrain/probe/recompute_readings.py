"""``RecomputeWatch``: activation checkpointing in force, what its recomputation costs, and the
memory it saves.

``torch.utils.checkpoint`` drops a segment's activations after its forward and runs the forward
again inside the backward: memory for compute. The watch counts the segments and their
recomputations, names what turned checkpointing on, and at a few steps measures the
recomputation's time and the activations it rebuilds.

Every call goes through two names that ``checkpoint()`` looks up in its module at each call, so
a ``checkpoint`` bound before the test began (``from torch.utils.checkpoint import checkpoint``
in a framework's module, the Hugging Face models' ``functools.partial`` of it) is seen too:

- ``CheckpointFunction.forward`` (``use_reentrant=True``): it keeps the function it is given and
  calls it again in its backward; the watch hands it a ``_Segment`` that passes the first call
  (the forward) through and counts every later one as a recomputation;
- ``_checkpoint_without_reentrant_generator`` (``use_reentrant=False``, the default of the
  Hugging Face models since transformers 5 and of ``checkpoint_wrapper``): ``checkpoint()`` runs
  the forward itself and gives the generator the function only to recompute it, so every call
  of the ``_Segment`` is a recomputation (early stop included: it ends by an exception).

``checkpoint_sequential`` calls ``checkpoint`` and is seen through it. Not seen: code that
imported ``_checkpoint_without_reentrant_generator`` by name (``torch.distributed._composable``'s
``checkpoint(module)``), and checkpointing inside a ``torch.compile``d region (dynamo turns it
into a graph operator; nothing of it runs in Python).

At the first call the watch notes the line that called ``checkpoint`` (the test's or a
framework's, ``host_stacks.SiteFinder``), the checkpointed function, and the framework's setting
behind it: a Hugging Face ``Trainer`` on the stack whose ``TrainingArguments`` ask for gradient
checkpointing, else a ``PreTrainedModel`` with it enabled (``gradient_checkpointing_enable()``).
The stack is walked once per test.

The recomputations of the first ``MAX_TIMED_STEPS`` steady steps after the warm-up (not in the
profiler window nor the step after it, not the first of an epoch) are timed: on CUDA by a pair of
events on the current stream around each one, read once when the test ends (no sync while it
trains); on the CPU by the host clock. On CUDA the timed steps themselves are timed the same way,
by an event at the step boundary before and after each (one event per step boundary from the
first recomputation seen until the last timed step ends): a GPU-bound loop without a sync runs
its host ahead of the GPU, and the host's step times then say nothing of what the GPU spent.
Around each timed recomputation on CUDA the allocator's allocated bytes are read (host-side
counters, no sync): what the segments of one backward allocated while recomputed is the
activation memory checkpointing keeps from being held at once. Per untimed recomputation the
cost is a counter and a comparison.

Built into ``run.recompute.*`` by ``recompute_facts.py``.
"""

from __future__ import annotations

import functools
import sys
import time
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

from pytest_gputrain.probe.cuda_readings import memory_reader
from pytest_gputrain.probe.host_stacks import SiteFinder, call_line
from pytest_gputrain.probe.loader import first_tensor
from pytest_gputrain.probe.recompute_record import RecomputeReadings
from pytest_gputrain.probe.torch_hooks import is_tracing
from pytest_gputrain.probe.wrapping import probe_wrapper

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_gputrain.probe.callbacks import ProbeCallbacks
    from pytest_gputrain.probe.torch_hooks import Patches

MAX_TIMED_STEPS: Final = 4  # steady steps whose recomputations are timed
MAX_TIMED: Final = 2048  # recomputations timed per test (two CUDA events each, read at the end)
MAX_SEGMENTS: Final = 4  # distinct checkpointed functions named
NAMED_CALLS: Final = 64  # calls whose function is named (the rest only counted)
GENERATOR: Final = "_checkpoint_without_reentrant_generator"


class _Segment:
    """A checkpointed function as ``torch.utils.checkpoint`` keeps it: calls after the first
    ``passes`` go to the watch as recomputations."""

    __slots__ = ("function", "passes", "watch")

    def __init__(self, function: Callable[..., Any], watch: RecomputeWatch, passes: int) -> None:
        self.function = function
        self.watch = watch
        self.passes = passes

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.passes:
            self.passes -= 1
            return self.function(*args, **kwargs)
        return self.watch.recompute(self.function, args, kwargs)


class RecomputeWatch:
    """Counts the checkpointed segments and their recomputations; times a few steps of them."""

    def __init__(self, torch: Any, probe: ProbeCallbacks) -> None:
        self.torch = torch
        self.probe = probe
        self.readings: RecomputeReadings = probe.record.recompute
        self._record = probe.record
        self._tracing = is_tracing(torch)
        capturing = getattr(getattr(torch, "cuda", None), "is_current_stream_capturing", None)
        self._capturing = capturing if callable(capturing) else (lambda: False)
        self._clock = time.perf_counter
        self._closed = False
        self._timing: int | None = None  # the step whose recomputations are being timed
        self._timed = 0  # recomputations timed so far
        self._events: list[tuple[int, Any, Any]] = []  # (step index, start, end) CUDA events
        self._memory: dict[int, Callable[[], tuple[int, int]]] = {}  # per CUDA device
        # The step boundaries on the GPU: RunProbe calls at_boundary() while this is True (from
        # the first recomputation on CUDA until the last timed step has ended).
        self.step_clock = False
        self._device: Any = None  # where the first recomputation ran: None until one did
        self._boundary: tuple[int, Any] | None = None  # (steps done, its event): the last one
        self._step_events: list[tuple[int, Any, Any]] = []  # (step index, start, end) events

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, patches: Patches) -> None:
        module = sys.modules.get("torch.utils.checkpoint")
        function = getattr(module, "CheckpointFunction", None)
        forward = vars(function).get("forward") if isinstance(function, type) else None
        if isinstance(forward, staticmethod) and not getattr(forward, "_gputrain_probe", False):
            patches.set(function, "forward", self._wrap_reentrant(forward.__func__))
        generator = vars(module).get(GENERATOR) if module is not None else None
        if callable(generator) and not getattr(generator, "_gputrain_probe", False):
            patches.set(module, GENERATOR, self._wrap_generator(generator))

    def stop(self, cuda_ok: bool) -> None:
        """Read the CUDA timings back; later recomputations (a graph kept past the test) pass
        through untouched."""
        self._closed, self.step_clock = True, False
        events, self._events = self._events, []
        steps, self._step_events, self._boundary = self._step_events, [], None
        if not events:
            return
        if not cuda_ok:
            self.readings.unread = "the CUDA context was unusable when the test ended"
            return
        seconds, step_seconds = self.readings.seconds, self.readings.step_seconds
        try:
            for step, start, end in events:
                end.synchronize()
                seconds[step] = seconds.get(step, 0.0) + start.elapsed_time(end) / 1000.0
            for step, start, end in steps:
                end.synchronize()
                step_seconds[step] = start.elapsed_time(end) / 1000.0
        except Exception as exc:
            self.readings.unread = f"reading the recomputations' CUDA events: {exc}"

    def at_boundary(self, count: int) -> None:
        """A step boundary (``count`` steps done), while ``step_clock``: an event on the stream
        of the recomputations' device; a timed step gets the events before and after it."""
        try:
            cuda = self.torch.cuda
            event = cuda.Event(enable_timing=True)
            event.record(cuda.current_stream(self._device))
        except Exception as exc:
            self.step_clock = False
            self.probe.fail("timing a checkpointed step", exc)
            return
        ended, before = count - 1, self._boundary
        timed = self.readings.timed_steps
        if before is not None and before[0] == ended and ended in timed and ended != (
                self.readings.cut):
            self._step_events.append((ended, before[1], event))
        self._boundary = (count, event)
        # No step is chosen any more (four were, or the recomputations' cap was reached) and
        # the last chosen has ended: no more events.
        if (len(timed) >= MAX_TIMED_STEPS or self._timed >= MAX_TIMED) and (
                not timed or ended >= timed[-1]):
            self.step_clock = False

    # -- the wrappers ---------------------------------------------------------------------------

    def _wrap_reentrant(self, original: Callable[..., Any]) -> Any:
        def forward(ctx: Any, run_function: Any, preserve_rng_state: Any, *args: Any) -> Any:
            if not self.probe.disabled and not self._tracing():
                try:
                    run_function = self._segment(run_function, reentrant=True)
                except Exception as exc:
                    self.probe.fail("torch.utils.checkpoint wrapper", exc)
            return original(ctx, run_function, preserve_rng_state, *args)

        method = staticmethod(probe_wrapper(forward, original))
        method._gputrain_probe = True  # type: ignore[attr-defined]  # global_hook_counts sees it
        return method

    def _wrap_generator(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def generator(fn: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.probe.disabled and not self._tracing():
                try:
                    fn = self._segment(fn, reentrant=False)
                except Exception as exc:
                    self.probe.fail("torch.utils.checkpoint wrapper", exc)
            return original(fn, *args, **kwargs)

        return probe_wrapper(generator, original)

    def _segment(self, function: Any, reentrant: bool) -> _Segment:
        """Count a checkpoint call; the reentrant one calls ``function`` once for the forward."""
        readings = self.readings
        readings.calls += 1
        if reentrant:
            readings.reentrant_calls += 1
        if readings.calls <= NAMED_CALLS and len(readings.segments) < MAX_SEGMENTS:
            name = segment_name(function, self.torch)
            if name not in readings.segments:
                readings.segments.append(name)
        if readings.calls == 1:
            self._note_origin(sys._getframe(2))
        return _Segment(function, self, passes=1 if reentrant else 0)

    def _note_origin(self, frame: FrameType | None) -> None:
        """The line and the setting behind the first call (a problem here costs the names
        only, not the probe)."""
        try:
            found = SiteFinder().site(frame)
            if found is not None:
                self.readings.site = call_line(found[0])
            self.readings.setting = framework_setting(frame)
        except Exception as exc:
            self.probe.errors.append(f"naming the checkpoint call: {type(exc).__name__}: {exc}")

    # -- a recomputation ------------------------------------------------------------------------

    def recompute(self, function: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
        readings = self.readings
        if self._closed or self.probe.disabled:
            return function(*args, **kwargs)
        readings.recomputes += 1
        step = len(self._record.steps.times)
        if self._device is None:
            self._first_device(args)
        if not self._times(step):
            return function(*args, **kwargs)
        try:
            tensor = first_tensor(args)
            cuda = tensor is not None and bool(tensor.is_cuda)
            if cuda and self._capturing():  # nothing is queued into a CUDA graph
                return function(*args, **kwargs)
        except Exception as exc:
            self.probe.fail("torch.utils.checkpoint recomputation", exc)
            return function(*args, **kwargs)
        self._timed += 1
        if cuda:
            return self._on_cuda(step, tensor.device, function, args, kwargs)
        readings.clock = "host clock"
        started = self._clock()
        try:
            return function(*args, **kwargs)
        finally:
            readings.seconds[step] = readings.seconds.get(step, 0.0) + self._clock() - started

    def _first_device(self, args: tuple[Any, ...]) -> None:
        """The first recomputation's device; on CUDA the step boundaries are timed from here on
        (the boundary before the first timed step must already have its event)."""
        try:
            tensor = first_tensor(args)
            self._device = tensor.device if tensor is not None else False
            if tensor is not None and tensor.is_cuda and not self._capturing():
                self.step_clock = True
        except Exception as exc:
            self._device = False
            self.probe.fail("torch.utils.checkpoint recomputation", exc)

    def _times(self, step: int) -> bool:
        """Whether the recomputation under way is timed: all those of a chosen step are; the
        first MAX_TIMED_STEPS steady steps after the warm-up are chosen."""
        readings = self.readings
        if step == self._timing:
            if self._timed < MAX_TIMED:
                return True
            readings.cut, self._timing = step, None  # a step timed in part says nothing
            return False
        record = self._record
        chosen = readings.timed_steps
        if (len(chosen) >= MAX_TIMED_STEPS or self._timed >= MAX_TIMED or step < record.warmup
                or (chosen and step <= chosen[-1]) or record.steps.in_window
                or record.steps.after_window or record.loader.epoch_start):
            return False
        self._timing = step
        readings.timed_steps.append(step)
        return True

    def _on_cuda(self, step: int, device: Any, function: Callable[..., Any],
                 args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one recomputation between two CUDA events, with the allocated bytes around it."""
        cuda = self.torch.cuda
        index = device.index if device.index is not None else int(cuda.current_device())
        read = self._memory.get(index)
        if read is None:
            read = self._memory[index] = memory_reader(self.torch, index)
        self.readings.clock = "CUDA events"
        before = read()[0]
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        try:
            return function(*args, **kwargs)
        finally:
            end.record()
            grown = read()[0] - before
            self._events.append((step, start, end))
            key = (step, self._record.forwards.grad)
            activations = self.readings.activations
            activations[key] = activations.get(key, 0) + max(0, grown)


def segment_name(function: Any, torch: Any) -> str:
    """The checkpointed function as a reader names it: a module's class (``GPT2Block``, also
    through the Hugging Face layers' ``partial(forward, self)``), else the function's name."""
    module = getattr(getattr(torch, "nn", None), "Module", ())
    for _ in range(4):
        if isinstance(function, functools.partial):
            if function.args and isinstance(function.args[0], module):
                return type(function.args[0]).__name__
            function = function.func
            continue
        if isinstance(function, module):
            return type(function).__name__
        owner = getattr(function, "__self__", None)
        if isinstance(owner, module):
            return type(owner).__name__
        break
    name = str(getattr(function, "__qualname__", None) or type(function).__name__)
    if name.startswith("checkpoint_sequential."):
        return "checkpoint_sequential segment"
    return name


def framework_setting(frame: FrameType | None) -> str | None:
    """The framework's setting that turned checkpointing on, read from the stack of the first
    call: the Hugging Face Trainer's arguments, else the model that enabled it."""
    trainer = getattr(sys.modules.get("transformers.trainer"), "Trainer", None)
    pretrained = getattr(sys.modules.get("transformers.modeling_utils"), "PreTrainedModel", None)
    if trainer is None and pretrained is None:
        return None
    model = None
    while frame is not None:
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":
            owner = frame.f_locals.get("self")
            if trainer is not None and isinstance(owner, trainer):
                setting = _trainer_setting(getattr(owner, "args", None))
                if setting is not None:
                    return setting
            elif pretrained is not None and isinstance(owner, pretrained):
                model = owner  # the outermost one: the model the test built
        frame = frame.f_back
    if model is None or not getattr(model, "is_gradient_checkpointing", False):
        return None
    newer = " (or activation_checkpointing_enable())" if hasattr(
        model, "activation_checkpointing_enable") else ""
    return f"{type(model).__name__}.gradient_checkpointing_enable(){newer}"


def _trainer_setting(args: Any) -> str | None:
    if getattr(args, "activation_checkpointing", None) is True:  # transformers >= 5
        return ("TrainingArguments(gradient_checkpointing=True) "
                "(activation_checkpointing=True in transformers 5)")
    if getattr(args, "gradient_checkpointing", None) is True:
        return "TrainingArguments(gradient_checkpointing=True)"
    return None
