"""Which kind of failure an exception is, and the details its message names.

Pure functions of the exception's type name and text (and, for a few details, the environment),
so a recorded failure classifies the same way anywhere. The message forms are PyTorch's own:
format strings in ``c10/cuda`` (CUDAFunctions.cpp, CUDACachingAllocator.cpp,
CUDAMallocAsyncAllocator.cpp), ``aten/src/ATen`` (Context.cpp, Convolution.cpp, TensorUtils.cpp,
the cuDNN and cuBLAS bindings), ``torch/cuda/__init__.py``, ``torch/utils/data/dataloader.py``
and the dataloader's C++ worker checks, as shipped in torch 2.1 to 2.13 (older wordings kept
where users still meet them), and the CUDA runtime's error strings.
"""

from __future__ import annotations

import re
import signal as signal_module
from types import TracebackType
from typing import Any, Final

from pytest_gputrain.probe.failure_facts import FailureKind

Pattern = str | re.Pattern[str]

# (kind, patterns) on the lower-cased "type: message"; the first kind with a match wins. The CUDA
# kinds come first (a compile error that wraps an illegal memory access stays sticky), then the
# kinds with a specific fix, then torch.compile's own errors, then the generic cuDNN / cuBLAS /
# CUDA kinds.
_PATTERNS: Final[tuple[tuple[FailureKind, tuple[Pattern, ...]], ...]] = (
    ("oom", (
        "cuda out of memory", "outofmemoryerror", "cublas_status_alloc_failed",
        "cudaerrormemoryallocation", "cuda error: out of memory", "cudnn_status_alloc_failed",
        "hip out of memory",
        # cudaMallocAsync backend (CUDAMallocAsyncAllocator.cpp)
        "would exceed allowed memory. (out of memory)",
        "cuda driver error: out of memory",  # driver API (CUDA_ERROR_OUT_OF_MEMORY)
        re.compile(r"cuda runtime error \(2\) ?: ?out of memory"),  # torch <= 0.4
    )),
    ("device_mismatch", (
        "expected all tensors to be on the same device",
        "but expected it to be on gpu", "expected object of device type",
        "to be on the same device", "is on cpu, different from other tensors",
        "different from other tensors on cuda",
        "indices should be either on cpu or on the same device",
        "to have the same device as tensor",  # TensorUtils.cpp checkSameGPU
        re.compile(r"expected device \S+ but got device"),
        "tensors are not at the same device",  # cuDNN RNN: input/parameter/hidden
        "module must have its parameters and buffers on device",  # DataParallel
        "only work with single-device/multiple-device gpu modules or cpu modules",  # DDP
        "device type for generator but found",
        "found two different devices",  # FakeTensor device propagation under torch.compile
    )),
    ("no_kernel_image", ("no kernel image is available", "cudaerrornokernelimagefordevice",
                         "invalid device function")),
    ("driver_too_old", (
        "driver on your system is too old", "cuda driver version is insufficient",
        "cudaerrorinsufficientdriver", "driver version is insufficient",
        "provided ptx was compiled with an unsupported toolchain",
        "cudaerrorunsupportedptxversion",
        "system has unsupported display driver / cuda driver combination",
        "cudaerrorsystemdrivermismatch",
        "forward compatibility was attempted on non supported hw",
        "cudaerrorcompatnotsupportedondevice",
    )),
    # Not "device-side assertion": every CUDA error of torch 2.x ends in "Compile with
    # `TORCH_USE_CUDA_DSA` to enable device-side assertions." (c10/cuda/CUDAException.cpp).
    ("device_side_assert", ("device-side assert triggered", "cudaerrorassert",
                            "device-side assertion failures were found")),
    ("illegal_memory_access", ("illegal memory access", "cudaerrorillegaladdress",
                               "misaligned address", "illegal instruction",
                               "cudaerrormisalignedaddress")),
    ("launch_failure", ("unspecified launch failure", "cudaerrorlaunchfailure",
                        "the launch timed out", "launch timeout", "uncorrectable ecc error",
                        "gpu has fallen off the bus")),
    ("nccl", ("nccl", "processgroupnccl", "distbackenderror",
              "watchdog caught collective operation timeout")),
    # CUDA runtime capture errors (cudaErrorStreamCapture*, cudaErrorCapturedEvent) and torch's
    # own capture checks.
    ("graph_capture", (
        "operation not permitted when stream is capturing",
        "operation failed due to a previous error during capture",
        "operation would make the legacy stream depend on a capturing blocking stream",
        "operation not permitted on an event last recorded in a capturing stream",
        "capture sequence contains a fork that was not joined to the primary stream",
        "operation would result in a merge of two independent capture sequences",
        "capture was not initiated in this stream",
        "attempt to terminate a thread-local capture sequence from another thread",
        "cudaerrorstreamcapture", "during cuda graph capture",
        "cuda graphs must be captured on a non-default stream",
    )),
    ("cuda_fork", ("cannot re-initialize cuda in forked subprocess",
                   "you must use the 'spawn' start method",
                   # a worker that reached the CUDA runtime without torch's fork check
                   re.compile(r"in dataloader worker process \d+.*cuda error: initialization "
                              r"error", re.DOTALL))),
    ("cuda_unavailable", (
        "torch not compiled with cuda enabled", "not compiled with cuda support",
        "found no nvidia driver on your system", "no cuda gpus are available",
        "cuda driver initialization failed", "cuda unknown error - this may be due to an "
        "incorrectly set up environment", "no cuda-capable device is detected",
        "cuda-capable device(s) is/are busy or unavailable",
        "attempting to deserialize object on a cuda device but torch.cuda.is_available() is "
        "false",
    )),
    ("numpy_on_cuda", ("can't convert cuda", "device type tensor to numpy")),
    ("dtype_mismatch", (
        re.compile(r"expected scalar type '?\w+'? but found '?\w+"),
        "must have the same dtype", "to have the same dtype", "expected to have the same dtype",
        "should have the same dtype", "expected both vectors to have same dtype",
        "can't be cast to the desired output type", "expected object of scalar type",
        re.compile(r"found dtype \w+ but expected \w+"),
        re.compile(r"input must have the type torch\.\w+, got type torch\.\w+"),  # RNNs
        "requires the source and destination dtypes match",  # index_put_
        re.compile(r"\"\w+\" not implemented for '\w+'"),  # a kernel without this dtype
        re.compile(r"expected \w+ dtype to be [\w ,]+, but got \w+"),  # loss targets
        "to have one of the following scalar types",  # embedding indices
        re.compile(r"dtype \(torch\.\w+\) does not match \w+ dtype"),  # RNN input, torch 2.13
    )),
    ("nondeterministic_op", ("does not have a deterministic implementation",
                             "deterministic behavior was enabled with either",
                             "cublas_workspace_config")),
    ("loader_worker", (
        "dataloader worker (pid", "unexpected bus error encountered in worker",
        "dataloader's workers are out of shared memory",
        "too many open files. communication with the workers is no longer possible",
        "received 0 items of ancdata",
        re.compile(r"in dataloader worker process \d+.*(?:too many open files|shared memory"
                   r"|unable to write to file </torch_|no space left on device)", re.DOTALL),
    )),
    # Usually memory exhaustion in disguise (GT219): handle or workspace allocation failed.
    ("cudnn_no_algorithm", ("unable to find a valid cudnn algorithm",
                            "was unable to find an engine to execute this computation")),
    ("library_init", (re.compile(r"cu(?:blas|dnn|solver|sparse)_status_not_initialized"),)),
    ("compile", (
        "torch._dynamo.exc.", "torch._inductor.exc.", "backendcompilerfailed",
        "inductorerror", "backend='inductor' raised", "cppcompileerror",
        "loweringexception", "outofresources", "out of resource: shared memory",
    )),
    ("cudnn", ("cudnn_status", "cudnn error")),
    ("cublas", ("cublas_status", "cublas error")),
    ("cuda_other", ("cuda error", "cuda driver error", "cudaerror", "cuda kernel errors",
                    "cuda runtime error")),
    # Not a GPU error, but a training failure whose cause the probe's records name (the last
    # partial batch of a DataLoader): torch.nn.functional._verify_batch_size, on any device.
    ("batch_norm_single", ("expected more than 1 value per channel when training",)),
)
_BY_KIND: Final[dict[FailureKind, tuple[Pattern, ...]]] = dict(_PATTERNS)

# After these the context is dead: no CUDA call may be made (it would fail or hang).
STICKY: Final[frozenset[str]] = frozenset(
    {"illegal_memory_access", "device_side_assert", "launch_failure", "cuda_other", "nccl"})
# The probe makes no CUDA call after these either: a failed capture may leave a stream capturing,
# and a synchronising call would then fail too (the context itself is still usable).
NO_CUDA_CALLS: Final[frozenset[str]] = STICKY | {"graph_capture"}
# Failures whose diagnosis needs the allocator's state right after them (safe to read then).
MEMORY_KINDS: Final[frozenset[str]] = frozenset({"oom", "cudnn_no_algorithm", "library_init"})

# "Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the same",
# also with CUDABFloat16Type-style names and a bias instead of the weight (Convolution.cpp).
_TYPE_PAIR = re.compile(r"input type \(([^()]*)\) and (?:weight|bias) type \(([^()]*)\) "
                        r"should be the same", re.IGNORECASE)
_MAX_CHAIN = 5


def classify(exc_type: str, message: str) -> FailureKind:
    """The kind of GPU failure an exception is ('not_gpu' when it is none; 'batch_norm_single'
    is the one kind that is no GPU error, see _PATTERNS)."""
    text = f"{exc_type}: {message}".lower()
    if _is_rank_failure(exc_type):
        return "not_gpu"  # the distributed launcher's own diagnosis (GT308) has the rank detail
    if exc_type.rsplit(".", 1)[-1] == "OutOfMemoryError" and "cuda" in text:
        return "oom"
    pair = _TYPE_PAIR.search(message)
    if pair is not None and not _matches("oom", text):
        first, second = (_type_device(name) for name in pair.groups())
        return "device_mismatch" if first != second else "dtype_mismatch"
    for kind, _ in _PATTERNS:
        if _matches(kind, text):
            if kind == "nccl" and not _looks_nccl(text):
                continue
            if kind == "compile" and _matches("cuda_other", text):
                return "cuda_other"  # a CUDA error inside compiled code: the context is suspect
            return kind
    return "not_gpu"


def _is_rank_failure(exc_type: str) -> bool:
    return exc_type.rsplit(".", 1)[-1] in ("RankFailure", "RankTimeout")


def _matches(kind: FailureKind, text: str) -> bool:
    return any(p in text if isinstance(p, str) else p.search(text) is not None
               for p in _BY_KIND[kind])


def _looks_nccl(text: str) -> bool:
    # NCCL as a word or an NCCL error name, not "nccl" inside a file name.
    return re.search(r"\bnccl\b|nccl(?:unhandled|system|internal|invalid|remote)"
                     r"|processgroupnccl|distbackenderror|watchdog caught collective",
                     text) is not None


def type_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")


def failing_exception(exc: BaseException) -> tuple[FailureKind, BaseException]:
    """The kind, and the exception in ``exc``'s chain that has it.

    ``exc`` itself when it is a GPU failure; else the first cause (``raise ... from``) or
    unsuppressed context (an exception raised while handling another) that is, so that a
    framework that wraps a CUDA error in its own exception is still diagnosed.
    """
    if _is_rank_failure(type_name(exc)):
        return "not_gpu", exc  # the launcher's diagnosis (GT308) covers the ranks' causes
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(current))
        kind = classify(type_name(current), str(current))
        if kind != "not_gpu":
            return kind, current
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__)
    return "not_gpu", exc


def classify_exception(exc: BaseException) -> FailureKind:
    return failing_exception(exc)[0]


def chain_text(exc: BaseException) -> str:
    """``exc``'s message followed by those of its causes ("DataLoader worker exited
    unexpectedly" is caused by "... is killed by signal: Bus error")."""
    parts = [str(exc)]
    current = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    while current is not None and len(parts) < _MAX_CHAIN:
        parts.append(f"{type_name(current)}: {current}")
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__)
    return "\n".join(parts)


# -- details the message names ----------------------------------------------------------------


def _type_device(name: str) -> str:
    """Device of a legacy type name: torch.cuda.FloatTensor, CUDABFloat16Type, FloatTensor."""
    lower = name.lower()
    for device in ("cuda", "mps", "xpu", "meta"):
        if device in lower:
            return device
    return "cpu"


def parse_devices(message: str) -> list[str]:
    """Devices an error message names, in order (cuda:0, cpu; torch.cuda.FloatTensor -> cuda)."""
    devices: list[str] = []
    pair = _TYPE_PAIR.search(message)
    if pair is not None:
        devices = [_type_device(name) for name in pair.groups()]
        return list(dict.fromkeys(devices))
    for match in re.finditer(
            r"\b(cuda:\d+|cuda|cpu|mps|meta|xpu:\d+|xpu)\b|torch\.(cuda\.)?\w*Tensor",
            message, re.IGNORECASE):
        device = match.group(1).lower() if match.group(1) else (
            "cuda" if match.group(2) else "cpu")
        if device not in devices:
            devices.append(device)
    return devices


_DTYPE_NAMES: Final[dict[str, str]] = {
    "float": "float32", "double": "float64", "half": "float16", "bfloat16": "bfloat16",
    "long": "int64", "int": "int32", "short": "int16", "char": "int8", "byte": "uint8",
    "bool": "bool", "complexfloat": "complex64", "complexdouble": "complex128",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
}
_TORCH_DTYPES: Final[frozenset[str]] = frozenset({
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
    "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2"})
_DTYPE_TOKEN = re.compile(
    r"torch\.(?:cuda\.)?(?P<legacy>[A-Z]\w*?)Tensor\b"        # torch.cuda.HalfTensor
    r"|\b(?:CUDA|CPU)(?P<typed>[A-Z]\w*?)Type\b"              # CUDABFloat16Type
    r"|\btorch\.(?P<torch>[a-z]\w*)\b"                        # torch.float64
    r"|\bc10::(?P<c10>\w+)"                                   # c10::BFloat16
    r"|'(?P<quoted>[A-Z]\w*)'"                                # 'Float', not implemented for 'Int'
    r"|\b(?P<scalar>Float|Double|Half|BFloat16|Long|Int|Short|Char|Byte|Bool|ComplexFloat"
    r"|ComplexDouble)\b"                                      # ScalarType names
    r"|\b(?P<plain>float|double|half)\b")                     # (float), float != double


def parse_dtypes(message: str) -> list[str]:
    """The dtypes a dtype-mismatch message names, as torch names (float32, float64), in order."""
    found: list[str] = []
    for match in _DTYPE_TOKEN.finditer(message):
        raw = next(value for value in match.groups() if value is not None)
        if match.group("torch") is not None:
            name = raw if raw in _TORCH_DTYPES else None
        else:
            name = _DTYPE_NAMES.get(raw.lower())
        if name is not None and name not in found:
            found.append(name)
    return found


_INPUT_SIZE = re.compile(r"got input size torch\.Size\(\[([\d, ]*)\]\)")


def parse_input_size(message: str) -> list[int]:
    """The input size a batch-norm error names ("got input size torch.Size([1, 64])")."""
    match = _INPUT_SIZE.search(message)
    if match is None:
        return []
    return [int(part) for part in match.group(1).split(",") if part.strip()]


def nccl_error(message: str) -> str | None:
    text = message.lower()
    for needle, label in (("duplicate gpu detected", "duplicate gpu"),
                          ("unhandled cuda error", "unhandled cuda error"),
                          ("unhandledcudaerror", "unhandled cuda error"),
                          ("system error", "system error"), ("systemerror", "system error"),
                          ("internal error", "internal error"), ("internalerror", "internal error"),
                          ("invalid usage", "invalid usage"), ("invalidusage", "invalid usage"),
                          ("remote error", "remote error"), ("remoteerror", "remote error"),
                          ("timeout", "timeout"), ("timed out", "timeout")):
        if needle in text:
            return label
    return None


def driver_problem(message: str) -> str | None:
    """Which driver problem: too_old, ptx_newer_than_driver, driver_library_mismatch or
    compat_unsupported (each has its own fix)."""
    text = message.lower()
    for label, needles in (
            ("ptx_newer_than_driver", ("unsupported toolchain", "unsupportedptxversion")),
            ("driver_library_mismatch", ("unsupported display driver / cuda driver combination",
                                         "systemdrivermismatch")),
            ("compat_unsupported", ("forward compatibility was attempted",
                                    "compatnotsupportedondevice")),
            ("too_old", ("too old", "insufficient"))):
        if any(needle in text for needle in needles):
            return label
    return None


def nondeterministic_operation(message: str) -> str | None:
    """The operation a deterministic-algorithms error names (cuBLAS for the workspace check)."""
    match = re.search(r"([\w.:]+) does not have a deterministic implementation", message)
    if match:
        return match.group(1)
    if "cublas" in message.lower():
        return "cuBLAS"
    return None


_SIGNAL = re.compile(r"killed by signal: ([A-Za-z][\w ]*?)\.?\s*(?:$|\n|It is possible)",
                     re.MULTILINE)


def loader_crash(message: str, worker_signal: str | None = None
                 ) -> tuple[str | None, str | None]:
    """(cause, signal) of a DataLoader worker failure: cause is shared_memory, host_memory,
    open_files or crashed; signal as the message names it ('Bus error', 'Killed'), else
    ``worker_signal`` (read from the dead worker, ``dead_worker_signal``)."""
    match = _SIGNAL.search(message)
    signal = match.group(1).strip() if match else worker_signal
    text = f"{message}\n{signal or ''}".lower()
    # "unable to open shared memory object ...: Too many open files (24)" is the fd limit.
    if "too many open files" in text or "received 0 items of ancdata" in text:
        return "open_files", signal
    if ("bus error" in text or "shared memory" in text or "unable to write to file </torch_"
            in text or "no space left on device" in text):
        return "shared_memory", signal
    if signal is not None and signal.lower() == "killed":
        return "host_memory", signal
    return "crashed", signal


def dead_worker_signal(tb: TracebackType | None) -> str | None:
    """The signal that killed a DataLoader worker ('Bus error'), from the worker processes in
    the failing frames. torch's message names the signal only when its SIGCHLD handler saw the
    death first; when its periodic status check saw it, the message says only "exited
    unexpectedly", and the frame that raised holds the reaped workers (``failed_workers``)."""
    from multiprocessing.process import BaseProcess

    while tb is not None:
        try:
            candidates: Any = tb.tb_frame.f_locals.get("failed_workers") or ()
            for worker in candidates:
                code = worker.exitcode if isinstance(worker, BaseProcess) else None
                if isinstance(code, int) and code < 0:
                    return signal_module.strsignal(-code) or f"signal {-code}"
        except Exception:  # a frame's locals are the user's: never fail the diagnosis on them
            pass
        tb = tb.tb_next
    return None


def compile_stage(exc_type: str, message: str) -> str | None:
    """The torch.compile stage that failed: dynamo, aot, inductor or triton."""
    text = f"{exc_type}: {message}".lower()
    if "outofresources" in text or "out of resource" in text or "triton" in exc_type.lower():
        return "triton"
    if ("torch._inductor" in text or "inductorerror" in text or "cppcompileerror" in text
            or "loweringexception" in text or "backend='inductor'" in text):
        return "inductor"
    if "aot_autograd" in text or "aotautograd" in text or "backend='aot_eager'" in text:
        return "aot"
    if "torch._dynamo" in text or "backendcompilerfailed" in text:
        return "dynamo"
    return None


def cuda_unavailable_cause(message: str, cuda_visible_devices: str | None,
                           cuda_build: str | None = None) -> str:
    """Why CUDA could not be used: cpu_only_build, no_driver, gpus_hidden, busy, init_failed
    or no_gpu. ``cuda_visible_devices`` is the variable at the failure (None: unset);
    ``cuda_build`` is torch.version.cuda (None for a CPU-only or unknown build)."""
    text = message.lower()
    if "not compiled with cuda" in text:
        return "cpu_only_build"
    if "found no nvidia driver" in text:
        return "no_driver"
    if "busy or unavailable" in text:
        return "busy"
    if "driver initialization failed" in text or "cuda unknown error" in text:
        return "init_failed"
    if "is_available() is false" in text and cuda_build is None:
        return "cpu_only_build"
    if cuda_visible_devices is not None:
        return "gpus_hidden"
    return "no_gpu"


def in_loader_worker(message: str) -> bool:
    """The error was raised inside a DataLoader worker process (and re-raised by the loader)."""
    return re.search(r"in dataloader worker process \d+|dataloader worker \(pid",
                     message, re.IGNORECASE) is not None


_STATUS = re.compile(r"\b((?:CUBLAS|CUDNN|CUSOLVER|CUSPARSE|CURAND)_STATUS_[A-Z_]+"
                     r"|cudaError[A-Za-z]+)\b")


def library_status(message: str) -> str | None:
    """The status a cuBLAS / cuDNN / CUDA error names: CUBLAS_STATUS_EXECUTION_FAILED, or the
    CUDA error's text ('too many resources requested for launch')."""
    match = _STATUS.search(message)
    if match:
        return match.group(1)
    match = re.search(r"CUDA (?:driver )?error: ([^\n]+?)\s*(?:\n|$)", message)
    return match.group(1).strip().rstrip(".") if match else None
