"""What the run probe records while one test trains: small state groups, one per concern.

The probe's hook callbacks (``run.py`` and its readers) fill a ``RunRecord``;
``run_facts_builder.py`` turns it into ``RunFacts``. The groups hold recorded values, and the
flags that say what the next step is (inside the profiler window, the first after it, the first
of a later epoch); what steers the hooks (armed, the module in its forward, inside a backward,
the open profiler window) stays on the probe and its readers. Every group is a slotted
dataclass, so the hot path reads and writes slots.
"""

from __future__ import annotations

import enum
import weakref
from dataclasses import dataclass, field
from typing import Any

from pytest_gputrain.collect.sync_calls import SyncTally
from pytest_gputrain.facts import DeviceSample
from pytest_gputrain.probe.frameworks import package_framework
from pytest_gputrain.probe.layer_scan import LayerScan
from pytest_gputrain.probe.loader import LoaderTracker
from pytest_gputrain.probe.recompute_record import RecomputeReadings

ALLOCATED_CAPACITY = 64  # allocator readings kept per test (see StepSeries.allocated)
MAX_SHAPES_SEEN = 64  # distinct input shapes counted per module
MAX_OOM_MOMENTS = 4  # out-of-memory moments kept per test (the last ones)
HOST_SAMPLE_INTERVAL = 0.002  # seconds between two stack samples (host_stacks.py)


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
    framework_syncs: list[int] = field(default_factory=list)  # of those, a framework's own
    sync_waits: list[float] = field(default_factory=list)  # seconds spent inside those syncs
    flags: list[StepFlag] = field(default_factory=list)
    # Top-level forwards so far, at each step boundary: a step with more of them than usual
    # ran validation (GT118 does not call such a long step a stall).
    forwards: list[int] = field(default_factory=list)
    saves: list[int] = field(default_factory=list)  # index of the step each torch.save fell in
    save_times: list[float] = field(default_factory=list)  # seconds inside each of those saves
    save_writers: set[str] = field(default_factory=set)  # torch.save, a framework's checkpoint
    in_window: bool = False  # the profiler window is open: the next step ends inside it
    after_window: bool = False  # the next step is the first after the profiler window
    # The allocator's bytes after steps 0, s, 2s, ... (0-based; CUDA runs only), s being
    # allocated_stride: read at every step until ALLOCATED_CAPACITY readings, then every
    # second one is dropped and the stride doubles, so the readings stay evenly spaced and
    # a long run pays for a few dozen reads per doubling of its length.
    allocated: list[int] = field(default_factory=list)
    reserved: list[int] = field(default_factory=list)  # read with allocated, from the same stats
    allocated_stride: int = 1

    def allocated_due(self, index: int) -> bool:
        """Step ``index`` (0-based) is one whose allocated bytes the series keeps."""
        return index % self.allocated_stride == 0

    def add_allocated(self, value: int, reserved: int | None = None) -> None:
        allocated = self.allocated
        allocated.append(value)
        if reserved is not None:
            self.reserved.append(reserved)
        if len(allocated) >= ALLOCATED_CAPACITY:
            del allocated[1::2]
            del self.reserved[1::2]
            self.allocated_stride *= 2


@dataclass(slots=True)
class Optimizers:
    """The optimizers stepped; the first one (primary) sets the run's steps."""

    primary: Any = None  # dropped at stop: the record keeps no model alive
    ids: set[int] = field(default_factory=set)
    refs: list[Any] = field(default_factory=list)  # weakrefs to each optimizer stepped
    names: list[str] = field(default_factory=list)
    steps: int = 0  # steps of all optimizers


@dataclass(slots=True)
class LoaderWaits:
    """DataLoader batches: per-loader totals and what is pending until the next step."""

    tracker: LoaderTracker
    pending: float = 0.0  # seconds waited since the last step
    epoch_start: bool = False  # a later epoch's first batch came since the last step


@dataclass(slots=True)
class SyncCounts(SyncTally):
    """Host-device syncs asked for from Python (``collect/sync_calls.py``: ``pending`` since
    the last step, ``by_kind``, ``by_site``), and those a framework's own code asked for."""

    # Those whose caller (outside torch) is a framework's code (``frameworks.package_framework``)
    framework_pending: int = 0
    by_framework: dict[str, int] = field(default_factory=dict)  # 'transformers: Tensor.__bool__'
    # Steps done when torch.compile began and the wrappers were taken out (None: counted to
    # the end); later steps' counts are not the code's syncs.
    stopped_at: int | None = None

    def attribute(self, kind: str, module: object) -> None:
        framework = package_framework(module)
        if framework is not None:  # the framework's own habit, not the test's code
            self.framework_pending += 1
            key = f"{framework}: {kind}"
            self.by_framework[key] = self.by_framework.get(key, 0) + 1


class WatchMode(enum.Enum):
    """Which grad-mode forwards of a model get their graph watched (``module_readings.py``)."""

    PROBATION = "its first forwards, every one"
    STREAKS = "those after another forward with no backward in between"
    EVERY = "every one"


class ModuleState:
    """One top-level module: its calls, parameters and the inputs it saw."""

    __slots__ = ("autocast_calls", "calls", "checks", "conv_layers", "first_cells",
                 "first_device", "first_param", "grad_calls", "handles", "held",
                 "inference_calls", "input_devices", "input_shapes", "last_device",
                 "last_device_name", "last_shape", "layers", "leaf", "name", "new_shape_steps",
                 "param_devices", "param_dtypes", "parameters", "pending", "ref", "shapes_seen",
                 "training_calls", "watch_mode")

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
        # Every distinct first-input shape (up to MAX_SHAPES_SEEN), and the steps in which a
        # never-seen one arrived after the first step (cuDNN benchmark mode tunes for each).
        self.shapes_seen: set[tuple[int, ...]] = set()
        self.new_shape_steps: list[int] = []
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
        # Per-forward checks (train/eval mode, DDP gradient sync); None: nothing to check.
        self.checks: ModuleChecks | None = None
        self.layers: LayerScan | None = None  # layer_scan.scan_layers at the first call

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


class ModuleChecks:
    """What a top-level module's forwards are checked for, set once when it is first seen:
    train/eval mode (it holds layers that behave differently in the two modes) and DDP's
    gradient synchronisation. Holds weak references only."""

    __slots__ = ("batch_norm", "ddp", "mode_layers", "target")

    def __init__(self, mode_layers: int, target: Any, ddp: Any, batch_norm: Any) -> None:
        self.mode_layers = mode_layers
        self.target = weakref.ref(target)  # the module whose .training counts (inside wrappers)
        self.ddp = weakref.ref(ddp) if ddp is not None else None
        self.batch_norm = weakref.ref(batch_norm) if batch_norm is not None else None


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
    autocast_fp16: int = 0  # grad-mode forwards under CUDA autocast to float16
    # Forwards under autocast for another device only (``torch.autocast("cpu", ...)``), by the
    # devices whose autocast was on: the context a CUDA model needed, opened for the wrong one.
    autocast_other: int = 0
    autocast_other_devices: list[str] = field(default_factory=list)
    backwards: int = 0
    # One cell per watched grad-mode forward of a model: True once a backward went through it.
    graph_outputs: list[list[bool]] = field(default_factory=list)
    without_backward: int = 0  # cells still False at stop
    input_devices: list[str] = field(default_factory=list)
    input_batch: int | None = None  # first dimension of the first input seen
    input_tokens: int | None = None  # tokens in it, when it is token ids (loader.token_count)
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
    # The test's own peaks read just before it reset the allocator's peak statistics itself
    # (gpu_benchmark, torch.cuda.reset_peak_memory_stats): the highest, by memory_stats key.
    peaks_before_reset: dict[str, int] = field(default_factory=dict)
    backend: str | None = None  # torch.cuda.get_allocator_backend() at the first CUDA step


@dataclass(slots=True)
class NvmlTimeline:
    """NVML samples of the training device, taken on a sampler thread while the test ran."""

    index: int | None = None  # NVML index; None: not sampling
    samples: list[DeviceSample] = field(default_factory=list)  # copied in when the test ends
    started: float | None = None  # probe clock when the sampler started (its samples' t = 0)
    # This process and its pytest-xdist siblings (nvml.session_process_ids): not "others";
    # a process the test starts itself is another process.
    session_pids: set[int] = field(default_factory=set)
    pids_read: float = 0.0  # clock when session_pids was last refreshed
    other_seen: bool = False  # the last sample saw other processes on the device
    before_stop: int | None = None  # samples taken while the test ran (stop adds one after)
    power_limit: float | None = None  # W, enforced, read once when sampling starts
    power_limit_default: float | None = None  # W, the board's default limit


@dataclass(slots=True)
class SettingsTimeline:
    """Settings a test may change inside itself (``settings.py``), read at step boundaries,
    and the debugging switches counted while it trained."""

    # (step, settings) whenever the settings differ from the previous read, in step order.
    snapshots: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    reads: int = 0
    # The step index of each backward pass run under anomaly detection.
    anomaly_steps: list[int] = field(default_factory=list)
    user_profiler_steps: int = 0  # steps with a profiler of the test's own recording
    user_profiled: list[int] = field(default_factory=list)  # the index of each of those steps
    user_profiler_kinds: list[str] = field(default_factory=list)  # torch.profiler, emit_nvtx
    user_profiler_setup_time: float = 0.0  # seconds inside its start() and stop()
    gradcheck_calls: int = 0  # torch.autograd.gradcheck / gradgradcheck after the first step


@dataclass(slots=True)
class OomMoment:
    """What the allocator's out-of-memory observer saw at a failed allocation."""

    t: float  # probe clock
    step: int  # optimizer steps completed before it
    device_index: int
    requested: int
    limit: int  # total x memory fraction once a fraction was set, else the device's total
    free: int  # device memory free at the failure (all processes)
    other_processes: int | None = None  # memory other processes held (NVML, at the failure)
    other_process_count: int | None = None
    # The allocator's bytes at the failure: the memory timeline runs up to it, also when the
    # test failed before the first step's reading.
    allocated: int | None = None
    reserved: int | None = None


@dataclass(slots=True)
class ModeChecks:
    """Forwards whose train/eval mode does not fit what they were used for."""

    eval_in_train: int = 0  # no_grad/inference forwards with the module in training mode
    graph_pending: int = 0  # id of the module running a grad-mode forward in eval mode
    # One cell per grad-mode forward in eval mode: True once a backward went through it.
    eval_graph_outputs: list[list[bool]] = field(default_factory=list)
    trained_in_eval: int = 0  # cells True at stop


@dataclass(slots=True)
class OptimizerReadings:
    """The main optimizer's configuration (read at its first step) and the host time of each
    of its steps (pre hook -> post hook), one entry per step like ``StepSeries``."""

    name: str | None = None
    foreach: bool | None = None
    fused: bool | None = None
    param_tensors: int | None = None
    step_started: float = 0.0  # clock at the last optimizer step pre hook
    host_times: list[float] = field(default_factory=list)
    zero_grad_calls: int = 0
    zero_grad_to_zeros: int = 0
    # the index of the step under way at each zero_grad call (once per step)
    zero_grad_steps: list[int] = field(default_factory=list)
    scaler_scales: int = 0  # GradScaler.scale calls with the scaler enabled (loss scaling)
    # A loss was scaled and GradScaler.unscale_ (called by scaler.step too) has not run since:
    # the gradients are still multiplied by the scale.
    scaled_pending: bool = False
    clip_scaled: int = 0  # clipping calls made while the gradients were still scaled
    init_scale: float | None = None  # the scaler's starting scale (init_scale), no sync
    lr_first: float | None = None  # the largest learning rate of its groups at its first step
    lr_last: float | None = None  # ... when the test ended (a scheduler changes it)
    clip_calls: int = 0  # torch.nn.utils.clip_grad_norm_ / clip_grad_value_ calls
    clip_kinds: list[str] = field(default_factory=list)  # "norm", "value"
    clip_limit: float | None = None  # the last max_norm or clip_value given


# The allocations and frees the caching allocator served (memory_stats counters, cached or
# not), read with its cudaMalloc/cudaFree counters into CacheCalls.mark and end.
REQUEST_KEYS = ("allocation.all.allocated", "allocation.all.freed")


@dataclass(slots=True)
class CacheCalls:
    """``torch.cuda.empty_cache()`` calls and the allocator's cudaMalloc/cudaFree counters."""

    empty_cache_calls: int = 0
    empty_cache_steps: list[int] = field(default_factory=list)  # step index of each call
    # num_device_alloc / num_device_free when the steady counting began, and at the end
    mark: dict[str, int] | None = None
    mark_step: int | None = None  # optimizer steps done at the mark
    end: dict[str, int] | None = None
    frees_by_empty_cache: int = 0  # cudaFree calls made by empty_cache() after the mark


@dataclass(slots=True)
class CompileReadings:
    """torch.compile: dynamo's counters at three moments and the step of each compilation."""

    start: Any = None  # compile_readings.DynamoCounters
    warm: Any = None  # after the warm-up steps
    end: Any = None
    new_recompile_reasons: list[str] = field(default_factory=list)
    compile_steps: list[int] = field(default_factory=list)  # steps done when a compile began
    callback: bool = False  # the compile-start callback was registered (compile_steps valid)
    reset_steps: list[int] = field(default_factory=list)  # steps done at torch._dynamo.reset()
    wrapped: list[str] = field(default_factory=list)  # classes torch.compile wrapped
    wraps_ddp: bool = False


@dataclass(slots=True)
class DdpReadings:
    """Grad-mode forwards of DistributedDataParallel modules, by optimizer step, and DDP's
    logging data (read at a few steps, never per forward)."""

    steps: dict[int, list[int]] = field(default_factory=dict)  # index -> [forwards, synced]
    world_size: int | None = None
    logging: dict[str, Any] = field(default_factory=dict)
    next_read: int = 2  # read the logging data at the first forward of this step, then double


@dataclass(slots=True)
class LossReadings:
    """The tensors backward started from (the loss): where they lived, and whether they were
    finite at the checked backwards (``loss_readings.py``)."""

    backwards: int = 0  # torch.autograd.backward calls with a tensor to start from
    cpu: int = 0  # of those, started from a tensor on the CPU
    check_every: int = 8  # check every n-th backward; doubles as the checks fill up
    # The checks: a 2 x MAX_CHECKS float tensor on the first checked loss's device, allocated
    # once, whose column i the GPU fills with "finite" and the loss's value for the i-th check;
    # read at the end. Their steps, by column:
    slots: Any = None
    checked_steps: list[int] = field(default_factory=list)
    last: Any = None  # the last loss (checked at the end; dropped then)
    last_step: int = 0  # index of the step the last loss belonged to
    finite: list[tuple[int, bool]] = field(default_factory=list)  # the checks, read at the end
    values: list[tuple[int, float]] = field(default_factory=list)  # the finite ones' values
    unread: str | None = None  # why the checks could not be read at the end


@dataclass(slots=True)
class CallSite:
    """A place in the test's (or a framework's) code the training thread was found at."""

    file: str
    line: int
    function: str
    source: str = ""  # the line's text, read when the test ends
    inner: str | None = None  # what it was doing there: the innermost folded call, if any


@dataclass(slots=True)
class HostSamples:
    """What ``host_stacks.HostWatch`` recorded: stack samples, garbage collections, and the
    call sites they name."""

    interval: float = HOST_SAMPLE_INTERVAL
    # (index of the step under way, inside the profiler window, site index, seconds it stands for)
    samples: list[tuple[int, bool, int, float]] = field(default_factory=list)
    sites: list[CallSite] = field(default_factory=list)
    # (index of the step under way, generation, seconds, site index of an explicit gc.collect()
    # or -1) for every explicit or older-generation collection, and young ones that took long
    collections: list[tuple[int, int, float, int]] = field(default_factory=list)
    # All collections, kept or not: generation -> [count, seconds]
    gc_totals: dict[int, list[float]] = field(default_factory=dict)
    gc_seconds: float = 0.0  # all of them, as they end (the sampler leaves them out)
    sampler: str | None = None  # why no stack was sampled, when none could be


@dataclass(slots=True)
class RaisedWarning:
    """One warning shown while the test ran (``warning_readings.WarningWatch``), counted again
    each time the same one is shown."""

    category: str
    message: str  # its first line
    origin: str  # the package whose code raised it: torch or a framework
    where: str  # the file and line it names (torch/utils/checkpoint.py:87)
    caller: str | None  # the test's or framework's line that led there
    benign: bool  # warning_readings.BENIGN: it names no fault
    step: int  # index of the step under way
    training: bool  # a forward or a step had run already
    count: int = 1


@dataclass(slots=True)
class WarningReadings:
    """The warnings of torch and the frameworks shown while the test ran."""

    raised: list[RaisedWarning] = field(default_factory=list)
    dropped: int = 0  # distinct warnings past warning_readings.MAX_WARNINGS


@dataclass(slots=True)
class SchedulerStep:
    """A learning-rate scheduler's step() (``update_readings.UpdateWatch``)."""

    scheduler: str  # its class
    optimizer: int  # id() of its optimizer
    step: int  # optimizer steps of the main optimizer done when it ran
    lr: float | None  # the largest learning rate of the optimizer's groups after it


@dataclass(slots=True)
class UpdateCheck:
    """One check of the weights an optimizer step left unchanged (read at the end)."""

    step: int  # 1-based step checked
    dtype: str  # of the first parameter checked
    lr: float | None
    unchanged: int = 0  # elements with a non-zero gradient that kept their exact value
    with_grad: int = 0  # elements with a non-zero gradient


@dataclass(slots=True)
class UpdateReadings:
    """The learning rate's schedule and the unchanged-weight checks of the main optimizer."""

    schedulers: list[SchedulerStep] = field(default_factory=list)
    checks: list[UpdateCheck] = field(default_factory=list)
    primary: int | None = None  # id() of the main optimizer, kept when the test ends
    unread: str | None = None  # why the checks could not be read


@dataclass(slots=True)
class UnusedGradient:
    """A parameter that held a gradient no optimizer used, when the gradients were read."""

    ref: Any  # weakref to the parameter until the test ends (re-checked then), then None
    name: str  # its name in its top-level module (named_parameters)
    params: int  # elements
    grad_bytes: int  # bytes of its .grad
    ahead: bool  # registered before every trained parameter of its module


@dataclass(slots=True)
class GradientReadings:
    """Parameters with gradients that no optimizer uses (``gradient_readings.py``)."""

    read_at: int | None = None  # optimizer steps done when they were read
    model_params: int = 0  # elements of the modules an optimizer trains
    trained_params: int = 0  # of those, held by an optimizer
    unused: list[UnusedGradient] = field(default_factory=list)


@dataclass(slots=True)
class AttentionReadings:
    """``scaled_dot_product_attention`` calls (``attention_readings.AttentionWatch``)."""

    calls: int = 0
    is_causal_calls: int = 0
    masked_calls: int = 0  # calls given an attn_mask
    max_query_len: int = 0  # of the masked calls
    mask_dtype: str | None = None  # of the first mask
    site: str | None = None  # the line that made the first masked call
    checks: list[tuple[int, int]] = field(default_factory=list)  # (queries, keys) checked
    causal: int | None = None  # checked masks that were the causal pattern (read at the end)
    unread: str | None = None  # why the checks could not be read


@dataclass(slots=True)
class EvaluationReadings:
    """A framework's evaluation runs while fitting (``evaluation_readings.EvaluationWatch``)."""

    framework: str | None = None
    runs: list[tuple[int, float]] = field(default_factory=list)  # (steps done, seconds)
    settings: dict[str, Any] = field(default_factory=dict)  # the schedule, read at the first


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
    settings: SettingsTimeline = field(default_factory=SettingsTimeline)
    oom_moments: list[OomMoment] = field(default_factory=list)
    window_facts: dict[str, Any] = field(default_factory=dict)  # ProfilerWindow.stop()'s
    modes: ModeChecks = field(default_factory=ModeChecks)
    optimizer: OptimizerReadings = field(default_factory=OptimizerReadings)
    cache: CacheCalls = field(default_factory=CacheCalls)
    compile: CompileReadings = field(default_factory=CompileReadings)
    ddp: DdpReadings = field(default_factory=DdpReadings)
    loss: LossReadings = field(default_factory=LossReadings)
    host: HostSamples = field(default_factory=HostSamples)  # host_stacks.HostWatch
    warnings: WarningReadings = field(default_factory=WarningReadings)
    updates: UpdateReadings = field(default_factory=UpdateReadings)  # update_readings.py
    grads: GradientReadings = field(default_factory=GradientReadings)
    attention: AttentionReadings = field(default_factory=AttentionReadings)
    recompute: RecomputeReadings = field(default_factory=RecomputeReadings)
    evaluation: EvaluationReadings = field(default_factory=EvaluationReadings)
    started: float = 0.0  # probe clock when the test's call began (the timeline's 0)
    duration: float | None = None
    errors: list[str] = field(default_factory=list)
    # The test's parameters name a CPU device (read from pytest before the test runs).
    cpu_parametrized: bool | None = None
    # The framework that drives the training loop (``frameworks.driving_framework``, read at
    # the main optimizer's first step); None until then.
    framework: str | None = None
