"""What the run probe records while one test trains: small state groups, one per concern.

``run.py``'s hook callbacks fill a ``RunRecord``; ``run_facts_builder.py`` turns it into
``RunFacts``. The groups hold recorded values only; what steers the hooks (armed, the module in
its forward, inside a backward, the open profiler window) stays on the probe. Every group is a
slotted dataclass, so the hot path reads and writes slots.
"""

from __future__ import annotations

import enum
import weakref
from dataclasses import dataclass, field
from typing import Any

from pytest_gputrain.facts import DeviceSample
from pytest_gputrain.probe.loader import LoaderTracker

ALLOCATED_CAPACITY = 64  # allocator readings kept per test (see StepSeries.allocated)


class StepFlag(enum.Enum):
    """What was special about an optimizer step; only STEADY steps make the steady statistics."""

    STEADY = "steady"
    IN_WINDOW = "inside the profiler window"
    AFTER_WINDOW = "right after the profiler window"
    # Worker start-up: reported as run.loader.epoch_start_*, not as steady loader wait.
    EPOCH_START = "began a later epoch"


@dataclass(slots=True)
class StepSeries:
    """One entry per step of the main optimizer in each list, in step order."""

    last_t: float  # clock at the previous step boundary
    times: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)  # DataLoader wait before the step
    syncs: list[int] = field(default_factory=list)  # syncs asked for from Python before it
    flags: list[StepFlag] = field(default_factory=list)
    after_window: bool = False  # the next step is the first after the profiler window
    # The allocator's bytes after steps 0, s, 2s, ... (0-based; CUDA runs only), s being
    # allocated_stride: read at every step until ALLOCATED_CAPACITY readings, then every
    # second one is dropped and the stride doubles, so the readings stay evenly spaced and
    # a long run pays for a few dozen reads per doubling of its length.
    allocated: list[int] = field(default_factory=list)
    allocated_stride: int = 1

    def allocated_due(self, index: int) -> bool:
        """Step ``index`` (0-based) is one whose allocated bytes the series keeps."""
        return index % self.allocated_stride == 0

    def add_allocated(self, value: int) -> None:
        allocated = self.allocated
        allocated.append(value)
        if len(allocated) >= ALLOCATED_CAPACITY:
            del allocated[1::2]
            self.allocated_stride *= 2


@dataclass(slots=True)
class Optimizers:
    """The optimizers stepped; the first one (primary) sets the run's steps."""

    primary: Any = None  # dropped at stop: the record keeps no model alive
    ids: set[int] = field(default_factory=set)
    names: list[str] = field(default_factory=list)
    steps: int = 0  # steps of all optimizers


@dataclass(slots=True)
class LoaderWaits:
    """DataLoader batches: per-loader totals and what is pending until the next step."""

    tracker: LoaderTracker
    pending: float = 0.0  # seconds waited since the last step
    epoch_start: bool = False  # a later epoch's first batch came since the last step


@dataclass(slots=True)
class SyncCounts:
    """Host-device syncs asked for from Python on CUDA tensors (``hooks.wrap_sync_method``)."""

    pending: int = 0  # since the last step
    by_call: dict[str, int] = field(default_factory=dict)


class WatchMode(enum.Enum):
    """Which grad-mode forwards of a model get their graph watched (``run.py``'s docstring)."""

    PROBATION = "its first forwards, every one"
    STREAKS = "those after another forward with no backward in between"
    EVERY = "every one"


class ModuleState:
    """One top-level module: its calls, parameters and the inputs it saw."""

    __slots__ = ("autocast_calls", "calls", "conv_layers", "first_cells", "first_device",
                 "first_param", "grad_calls", "handles", "held", "inference_calls",
                 "input_devices", "input_shapes", "last_device", "last_device_name",
                 "last_shape", "leaf", "name", "param_devices", "param_dtypes", "parameters",
                 "pending", "ref", "training_calls", "watch_mode")

    def __init__(self, module: Any) -> None:
        self.name = type(module).__name__
        self.ref = weakref.ref(module)
        self.handles: list[Any] = []
        self.calls = self.grad_calls = self.inference_calls = 0
        self.autocast_calls = self.training_calls = 0
        self.param_devices: list[str] = []
        self.param_dtypes: list[str] = []
        self.first_param: Any = None
        self.first_device: Any = None
        self.input_devices: set[str] = set()
        self.input_shapes: list[tuple[int, ...]] = []
        self.last_device: Any = None
        self.last_device_name = ""
        self.last_shape: Any = None
        self.parameters: int | None = None
        self.conv_layers: int | None = None
        self.leaf = False  # no child modules and no parameters (a loss, an activation)
        # Watching its forwards' graphs: the mode, the cells of the first forwards, whether a
        # grad-mode forward came since the last backward, and the output nodes held of it.
        self.watch_mode = WatchMode.PROBATION
        self.first_cells: list[list[bool]] = []
        self.pending = False
        self.held: list[Any] | None = None

    def scan(self, module: Any) -> None:
        devices: list[str] = []
        dtypes: list[str] = []
        count = 0
        first = None
        for param in module.parameters():
            if first is None:
                first = param
            device, dtype = str(param.device), str(param.dtype).removeprefix("torch.")
            if device not in devices:
                devices.append(device)
            if dtype not in dtypes:
                dtypes.append(dtype)
            count += param.numel()
        self.param_devices, self.param_dtypes, self.parameters = devices, dtypes, count
        self.first_param = first
        self.first_device = first.device if first is not None else None


# The last top-level forward: module name, its parameter devices, this call's input devices
# (filled while the call's inputs are seen), grad mode.
LastForward = tuple[str, list[str], list[str], bool]


@dataclass(slots=True)
class Forwards:
    """Top-level forwards by grad mode, the backwards, and the inputs the modules saw."""

    modules: dict[int, ModuleState] = field(default_factory=dict)  # by id(module)
    calls: int = 0
    grad: int = 0
    no_grad: int = 0
    autocast: int = 0
    backwards: int = 0
    # One cell per watched grad-mode forward of a model: True once a backward went through it.
    graph_outputs: list[list[bool]] = field(default_factory=list)
    without_backward: int = 0  # cells still False at stop
    input_devices: list[str] = field(default_factory=list)
    input_batch: int | None = None  # first dimension of the first input seen
    last: LastForward | None = None


@dataclass(slots=True)
class DevicesSeen:
    """CUDA at the start, and the device, dtypes and backend flags of the trained parameters."""

    cuda_available: bool | None = None
    param_devices: list[str] = field(default_factory=list)
    param_dtypes: list[str] = field(default_factory=list)
    device: str | None = None
    cuda_index: int | None = None
    device_name: str | None = None
    compute_capability: str | None = None
    backend_flags: dict[str, Any] = field(default_factory=dict)  # at the first step


@dataclass(slots=True)
class AllocatorReadings:
    """The CUDA caching allocator's counters (``memory_stats`` keys) at three moments."""

    start: dict[int, dict[str, Any]] = field(default_factory=dict)  # by device, test start
    window: dict[str, Any] = field(default_factory=dict)  # when the profiler window closed
    # At the end, plus the device budget: total, fraction, other_processes.
    end: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class NvmlTimeline:
    """NVML samples of the training device, taken on a sampler thread while the test ran."""

    index: int | None = None  # NVML index; None: not sampling
    samples: list[DeviceSample] = field(default_factory=list)  # copied in when the test ends


@dataclass(slots=True)
class RunRecord:
    """Everything one test's probe recorded, grouped by concern."""

    nodeid: str
    warmup: int
    profile_steps: tuple[int, int] | None
    steps: StepSeries
    loader: LoaderWaits
    optimizers: Optimizers = field(default_factory=Optimizers)
    syncs: SyncCounts = field(default_factory=SyncCounts)
    forwards: Forwards = field(default_factory=Forwards)
    devices: DevicesSeen = field(default_factory=DevicesSeen)
    allocator: AllocatorReadings = field(default_factory=AllocatorReadings)
    nvml: NvmlTimeline = field(default_factory=NvmlTimeline)
    window_facts: dict[str, Any] = field(default_factory=dict)  # ProfilerWindow.stop()'s
    duration: float | None = None
    errors: list[str] = field(default_factory=list)
