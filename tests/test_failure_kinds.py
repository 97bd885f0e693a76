"""The failure classifier on the texts PyTorch and CUDA really raise, and the details it reads.

Message texts come from torch 2.13's sources and binaries (the format strings in
c10/cuda/CUDAFunctions.cpp, CUDACachingAllocator.cpp, CUDAMallocAsyncAllocator.cpp,
aten/src/ATen/native/Convolution.cpp, TensorUtils.cpp, torch/cuda/__init__.py,
torch/utils/data/dataloader.py, torch/nn/parallel/*.py), from raising them with the CPU build
where that is possible (the ``raised_*`` tests), and, for older releases and CUDA-only paths,
from the wording users report. Each case names its source.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
from typing import Any

import pytest
import torch

from pytest_gputrain.probe import failure_kinds, failures

MEMORY_LINES = ("\nCUDA kernel errors might be asynchronously reported at some other API call, so "
                "the stacktrace below might be incorrect.\nFor debugging consider passing "
                "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
                "assertions.\n")

CASES: list[tuple[str, str, str]] = [
    # -- out of memory: every wording of torch 1.x to 2.13 --
    ("torch.OutOfMemoryError",  # 2.13, CUDACachingAllocator.cpp
     "CUDA out of memory. Tried to allocate 512.00 GiB. GPU 0 has a total capacity of 139.81 GiB "
     "of which 138.94 GiB is free. Including non-PyTorch memory, this process has 880.00 MiB "
     "memory in use. Of the allocated memory 256.00 MiB is allocated by PyTorch, and 2.00 MiB is "
     "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
     "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.", "oom"),
    ("torch.cuda.OutOfMemoryError",  # 2.1 (its "capacty" typo)
     "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacty of 79.15 GiB "
     "of which 9.44 MiB is free. Process 1234 has 79.13 GiB memory in use.", "oom"),
    ("torch.OutOfMemoryError",  # the cudaMallocAsync backend (CUDAMallocAsyncAllocator.cpp)
     "Allocation on device 0 would exceed allowed memory. (out of memory)\n"
     "Currently allocated     : 22.43 GiB\nRequested               : 4.07 GiB\n"
     "Device limit            : 16.00 GiB\nFree (according to CUDA): 0 bytes\n"
     "PyTorch limit (set by user-supplied memory fraction)\n"
     "                        : 17179869184.00 GiB", "oom"),
    ("RuntimeError",  # the same text re-raised by a framework as a plain RuntimeError
     "Allocation on device 0 would exceed allowed memory. (out of memory)\n"
     "Currently allocated     : 44.05 GiB", "oom"),
    ("RuntimeError",  # torch 1.x under a memory fraction ("allowed")
     "CUDA out of memory. Tried to allocate 256.00 MiB (GPU 0; 23.69 GiB total capacity; "
     "4.51 GiB already allocated; 18.67 GiB free; 4.77 GiB allowed; 4.74 GiB reserved in total "
     "by PyTorch)", "oom"),
    ("RuntimeError",  # torch <= 1.3
     "CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; "
     "8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)", "oom"),
    ("RuntimeError",  # torch <= 0.4
     "cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/generic/THCStorage.cu:58",
     "oom"),
    ("RuntimeError", "CUDA driver error: out of memory", "oom"),  # driver API allocations
    ("RuntimeError", "CUDA error: out of memory" + MEMORY_LINES, "oom"),  # context creation
    ("RuntimeError",
     "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "oom"),
    # -- devices --
    ("RuntimeError",  # TensorIterator, 2.x
     "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
     "cpu! (when checking argument for argument target in method "
     "wrapper_CUDA_nll_loss_forward)", "device_mismatch"),
    ("RuntimeError",  # embedding / index_select, 2.3+
     "Expected all tensors to be on the same device, but got index is on cpu, different from "
     "other tensors on cuda:0 (when checking argument in method wrapper_CUDA__index_select)",
     "device_mismatch"),
    ("RuntimeError",  # TensorUtils.cpp checkSameGPU (cuDNN convolution)
     "Expected tensor for argument #1 'input' to have the same device as tensor for argument "
     "#2 'weight'; but device 1 does not equal 0 (while checking arguments for "
     "cudnn_convolution)", "device_mismatch"),
    ("RuntimeError", "expected device cuda:0 but got device cpu", "device_mismatch"),
    ("RuntimeError",  # cuDNN RNN
     "Input and parameter tensors are not at the same device, found input tensor at cpu and "
     "parameter tensor at cuda:0", "device_mismatch"),
    ("RuntimeError",
     "Input and hidden tensors are not at the same device, found input tensor at cuda:0 and "
     "hidden tensor at cpu", "device_mismatch"),
    ("RuntimeError",  # torch/nn/parallel/data_parallel.py
     "module must have its parameters and buffers on device cuda:0 (device_ids[0]) but found "
     "one of them on device: cpu", "device_mismatch"),
    ("ValueError",  # torch/nn/parallel/distributed.py
     "DistributedDataParallel device_ids and output_device arguments only work with "
     "single-device/multiple-device GPU modules or CPU modules, but got device_ids [0], "
     "output_device None, and module parameters {device(type='cpu')}.", "device_mismatch"),
    ("RuntimeError", "Expected a 'cuda' device type for generator but found 'cpu'",
     "device_mismatch"),
    ("torch._dynamo.exc.TorchRuntimeError",  # FakeTensor under torch.compile, torch 2.0-2.2
     "Failed running call_function <built-in function linear>(*(FakeTensor(..., size=(4, 3)), "
     "...)): Unhandled FakeTensor Device Propagation for aten.mm.default, found two different "
     "devices cpu, cuda:0", "device_mismatch"),
    ("RuntimeError",
     "Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the "
     "same or input should be a MKLDNN tensor and weight is a dense tensor", "device_mismatch"),
    ("RuntimeError",  # without the MKLDNN tail (older releases, GPU input)
     "Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the "
     "same", "device_mismatch"),
    ("RuntimeError",  # Convolution.cpp with toString() type names
     "Input type (CUDABFloat16Type) and weight type (CPUBFloat16Type) should be the same",
     "device_mismatch"),
    # -- dtypes: the same sentence with two CUDA (or two CPU) types, and the other forms --
    ("RuntimeError",
     "Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be "
     "the same", "dtype_mismatch"),
    ("RuntimeError",
     "Input type (CUDABFloat16Type) and weight type (torch.cuda.FloatTensor) should be the same",
     "dtype_mismatch"),
    ("RuntimeError", "Input type (c10::BFloat16) and bias type (float) should be the same",
     "dtype_mismatch"),
    ("RuntimeError", "expected scalar type Float but found Half", "dtype_mismatch"),
    ("RuntimeError", "expected scalar type Long but found Int", "dtype_mismatch"),
    ("RuntimeError", "Found dtype Double but expected Float", "dtype_mismatch"),  # mse backward
    ("RuntimeError", "expected both vectors to have same dtype, but found Float and Double",
     "dtype_mismatch"),
    ("RuntimeError",
     "\"nll_loss_forward_reduce_cuda_kernel_2d_index\" not implemented for 'Int'",
     "dtype_mismatch"),
    # -- driver --
    ("RuntimeError",  # CUDAFunctions.cpp
     "The NVIDIA driver on your system is too old (found version 11040). Please update your GPU "
     "driver by downloading and installing a new version from the URL: "
     "http://www.nvidia.com/Download/index.aspx", "driver_too_old"),
    ("RuntimeError", "CUDA error: the provided PTX was compiled with an unsupported toolchain."
     + MEMORY_LINES, "driver_too_old"),
    ("RuntimeError",  # CUDAFunctions.cpp default branch, error 803
     "Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
     "calling NumCudaDevices() that might have already set an error? Error 803: system has "
     "unsupported display driver / cuda driver combination", "driver_too_old"),
    ("RuntimeError",
     "Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
     "calling NumCudaDevices() that might have already set an error? Error 804: forward "
     "compatibility was attempted on non supported HW", "driver_too_old"),
    # -- kernel faults: torch appends the same tail to every CUDA error (CUDAException.cpp) --
    ("torch.AcceleratorError", "CUDA error: device-side assert triggered" + MEMORY_LINES,
     "device_side_assert"),
    ("RuntimeError",  # a build with TORCH_USE_CUDA_DSA (CUDADeviceAssertionHost.cpp)
     "CUDA error: device-side assert triggered\n# of GPUs this process interacted with = 1\n"
     "CUDA device-side assertion failures were found on GPU #0!", "device_side_assert"),
    ("torch.AcceleratorError", "CUDA error: an illegal memory access was encountered"
     + MEMORY_LINES, "illegal_memory_access"),
    ("torch.AcceleratorError", "CUDA error: unspecified launch failure" + MEMORY_LINES,
     "launch_failure"),
    ("torch.AcceleratorError", "CUDA error: no kernel image is available for execution on the "
     "device" + MEMORY_LINES, "no_kernel_image"),
    # -- CUDA not usable at all --
    ("AssertionError", "Torch not compiled with CUDA enabled", "cuda_unavailable"),
    ("RuntimeError", "No CUDA GPUs are available", "cuda_unavailable"),  # CUDAFunctions.cpp
    ("RuntimeError",
     "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
     "installed a driver from http://www.nvidia.com/Download/index.aspx", "cuda_unavailable"),
    ("RuntimeError", "CUDA driver initialization failed, you might not have a CUDA gpu.",
     "cuda_unavailable"),
    ("RuntimeError",
     "CUDA unknown error - this may be due to an incorrectly set up environment, e.g. changing "
     "env variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to "
     "be zero.", "cuda_unavailable"),
    ("RuntimeError", "CUDA error: CUDA-capable device(s) is/are busy or unavailable"
     + MEMORY_LINES, "cuda_unavailable"),
    ("RuntimeError",  # torch.load of a GPU checkpoint (torch/serialization.py)
     "Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is "
     "False. If you are running on a CPU-only machine, please use torch.load with "
     "map_location=torch.device('cpu') to map your storages to the CPU.", "cuda_unavailable"),
    # -- forks, loaders, numpy --
    ("RuntimeError",
     "Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent "
     "call last):\n  File \".../torch/cuda/__init__.py\", line 518, in _lazy_init\n    raise "
     "RuntimeError(\nRuntimeError: Cannot re-initialize CUDA in forked subprocess. To use "
     "CUDA with multiprocessing, you must use the 'spawn' start method\n", "cuda_fork"),
    ("RuntimeError",  # a worker that reached the CUDA runtime without torch's fork check
     "Caught RuntimeError in DataLoader worker process 1.\nOriginal Traceback (most recent "
     "call last):\nRuntimeError: CUDA error: initialization error\nCUDA kernel errors might be "
     "asynchronously reported at some other API call", "cuda_fork"),
    ("RuntimeError", "DataLoader worker (pid(s) 31707) exited unexpectedly", "loader_worker"),
    ("RuntimeError",
     "DataLoader worker (pid 2113) is killed by signal: Bus error. It is possible that "
     "dataloader's workers are out of shared memory. Please try to raise your shared memory "
     "limit.", "loader_worker"),
    ("RuntimeError",
     "Too many open files. Communication with the workers is no longer possible. Please "
     "increase the limit using `ulimit -n` in the shell or change the sharing strategy by "
     "calling `torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of "
     "your code", "loader_worker"),
    ("RuntimeError",
     "Caught RuntimeError in DataLoader worker process 1.\nOriginal Traceback (most recent "
     "call last):\nRuntimeError: unable to write to file </torch_412_3326826090_0>: No space "
     "left on device (28)", "loader_worker"),
    ("KeyError",  # a bug in the user's dataset, re-raised by the loader: not a loader crash
     "Caught KeyError in DataLoader worker process 0.\nOriginal Traceback (most recent call "
     "last):\nKeyError: 'label'", "not_gpu"),
    ("TypeError",  # tensor_numpy.cpp
     "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to "
     "host memory first.", "numpy_on_cuda"),
    # -- determinism --
    ("RuntimeError",  # Context.cpp alertNotDeterministic
     "upsample_bilinear2d_backward_out_cuda does not have a deterministic implementation, but "
     "you set 'torch.use_deterministic_algorithms(True)'. You can turn off determinism just "
     "for this operation, or you can use the 'warn_only=True' option, if that's acceptable for "
     "your application.", "nondeterministic_op"),
    ("torch._dynamo.exc.BackendCompilerFailed",  # torch 1.8-2.5's cuBLAS check, inside compile
     "backend='inductor' raised:\nRuntimeError: Deterministic behavior was enabled with either "
     "`torch.use_deterministic_algorithms(True)` or `at::Context::setDeterministicAlgorithms("
     "true)`, but this operation is not deterministic because it uses CuBLAS and you have CUDA "
     ">= 10.2. To enable deterministic behavior in this case, you must set an environment "
     "variable before running your PyTorch application: CUBLAS_WORKSPACE_CONFIG=:4096:8 or "
     "CUBLAS_WORKSPACE_CONFIG=:16:8.", "nondeterministic_op"),
    # -- CUDA graphs --
    ("torch.AcceleratorError",
     "CUDA error: operation not permitted when stream is capturing" + MEMORY_LINES,
     "graph_capture"),
    ("torch.AcceleratorError",  # capture_end after an error inside the capture
     "CUDA error: operation failed due to a previous error during capture" + MEMORY_LINES,
     "graph_capture"),
    ("RuntimeError",
     "CUDA error: operation would make the legacy stream depend on a capturing blocking stream",
     "graph_capture"),
    # -- torch.compile --
    ("torch._dynamo.exc.Unsupported",
     "Failed to trace builtin operator\n  Explanation: Dynamo does not know how to trace "
     "builtin operator `print` with argument types ['str', 'Size'] (has_kwargs False)",
     "compile"),
    ("torch._dynamo.exc.UserError",
     "Could not guard on data-dependent expression zuf0 > 10.0 (unhinted: zuf0 > 10.0).",
     "compile"),
    ("torch._inductor.exc.InductorError",
     "CppCompileError: C++ compile error\n\nCommand:\ng++ /tmp/torchinductor_root/xx.cpp",
     "compile"),
    ("triton.runtime.errors.OutOfResources",
     "out of resource: shared memory, Required: 262144, Hardware limit: 232448. Reducing block "
     "sizes or `num_stages` may help.", "compile"),
    ("torch._dynamo.exc.BackendCompilerFailed",  # a CUDA error inside compiled code stays sticky
     "backend='inductor' raised:\nRuntimeError: CUDA error: an illegal memory access was "
     "encountered", "illegal_memory_access"),
    ("torch._dynamo.exc.BackendCompilerFailed",
     "backend='inductor' raised:\nRuntimeError: CUDA error: unknown error", "cuda_other"),
    # -- cuDNN / cuBLAS --
    ("RuntimeError", "Unable to find a valid cuDNN algorithm to run convolution",
     "cudnn_no_algorithm"),
    ("RuntimeError", "GET was unable to find an engine to execute this computation",
     "cudnn_no_algorithm"),
    ("RuntimeError",  # CublasHandlePool.cpp
     "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
     "library_init"),
    ("RuntimeError", "cuDNN error: CUDNN_STATUS_NOT_INITIALIZED", "library_init"),
    ("RuntimeError", "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR", "cudnn"),
    ("RuntimeError",
     "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, "
     "m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`", "cublas"),
    ("RuntimeError", "CUDA error: too many resources requested for launch" + MEMORY_LINES,
     "cuda_other"),
    # -- NCCL, and what is not a GPU failure --
    ("torch.distributed.DistBackendError",
     "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, invalid usage, "
     "NCCL version 2.14.3\nncclInvalidUsage: This usually reflects invalid usage of NCCL "
     "library.\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000", "nccl"),
    ("RuntimeError", "mat1 and mat2 shapes cannot be multiplied (4x3 and 4x2)", "not_gpu"),
    ("ValueError", "Expected input batch_size (32) to match target batch_size (16).", "not_gpu"),
    # -- not a GPU error, but a cause the probe's records name (GT220) --
    ("ValueError", "Expected more than 1 value per channel when training, got input size "
     "torch.Size([1, 256])", "batch_norm_single"),
]


@pytest.mark.parametrize(("exc_type", "message", "kind"), CASES,
                         ids=[f"{kind}-{i}" for i, (_, _, kind) in enumerate(CASES)])
def test_classify_the_texts_torch_raises(exc_type: str, message: str, kind: str) -> None:
    assert failure_kinds.classify(exc_type, message) == kind


def test_every_kind_has_a_case() -> None:
    kinds = {kind for kind, _ in failure_kinds._PATTERNS}
    assert kinds <= {kind for _, _, kind in CASES}


def _raised(fn: Any) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # the exception is the subject
        return exc
    raise AssertionError("did not raise")


@pytest.mark.parametrize(("name", "make", "kind"), [
    ("linear float64 input",
     lambda: torch.nn.Linear(4, 2)(torch.randn(3, 4, dtype=torch.float64)), "dtype_mismatch"),
    ("matmul float32 @ float64",
     lambda: torch.randn(3, 4) @ torch.randn(4, 2, dtype=torch.float64), "dtype_mismatch"),
    ("bmm float32 x float16",
     lambda: torch.bmm(torch.randn(1, 3, 4), torch.randn(1, 4, 2, dtype=torch.half)),
     "dtype_mismatch"),
    ("conv with float64 input",
     lambda: torch.nn.Conv2d(1, 2, 3)(torch.randn(1, 1, 5, 5, dtype=torch.float64)),
     "dtype_mismatch"),
    ("cross-entropy with float targets",
     lambda: torch.nn.functional.cross_entropy(torch.randn(3, 5), torch.tensor([1., 2., 3.])),
     "dtype_mismatch"),
    ("LSTM with float64 input",
     lambda: torch.nn.LSTM(4, 4)(torch.randn(2, 1, 4, dtype=torch.float64)), "dtype_mismatch"),
    ("embedding with float indices",
     lambda: torch.nn.Embedding(10, 3)(torch.tensor([1.0, 2.0])), "dtype_mismatch"),
    ("in-place add of a float to a long tensor",
     lambda: torch.zeros(4, dtype=torch.long).add_(0.5), "dtype_mismatch"),
    ("numpy() of a tensor not on the CPU",
     lambda: torch.empty(2, device="meta").numpy(), "numpy_on_cuda"),
])
def test_classify_what_the_cpu_build_raises(name: str, make: Any, kind: str) -> None:
    exc = _raised(make)
    assert failure_kinds.classify_exception(exc) == kind, f"{name}: {exc!r}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU build's message")
def test_cuda_on_a_cpu_only_build_is_cuda_unavailable() -> None:
    exc = _raised(lambda: torch.zeros(1, device="cuda"))
    facts = failures.build_failure("t::cuda", "call", exc, exc.__traceback__, None, torch)
    assert facts is not None and facts.kind == "cuda_unavailable"
    assert facts.cuda_unavailable_cause == "cpu_only_build"


def test_nondeterministic_operation_raised_on_the_cpu() -> None:
    def put() -> None:
        torch.use_deterministic_algorithms(True)
        try:
            torch.zeros(4).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))
        finally:
            torch.use_deterministic_algorithms(False)

    facts = failures.build_failure("t::det", "call", _raised(put), None)
    assert facts is not None and facts.kind == "nondeterministic_op"
    assert facts.operation == "put_" and not facts.sticky


DYNAMO_FULLGRAPH_BREAK = """
import json, torch

def forward(x):
    print("activations", x.shape)  # a graph break: fullgraph=True raises
    return x * 2

try:
    torch.compile(forward, fullgraph=True)(torch.randn(4, 8))
except Exception as exc:
    kind = type(exc)
    print(json.dumps([f"{kind.__module__}.{kind.__qualname__}", str(exc)]))
"""


def test_compile_errors_raised_by_dynamo() -> None:
    # In a process of its own: torch.compile's imports do not survive the module juggling of
    # other tests in this session.
    done = subprocess.run([sys.executable, "-c", DYNAMO_FULLGRAPH_BREAK], capture_output=True,
                          text=True, timeout=300, check=True)
    exc_type, message = json.loads(done.stdout.strip().splitlines()[-1])
    assert exc_type.startswith("torch._dynamo.exc.")
    assert failure_kinds.classify(exc_type, message) == "compile"
    assert failure_kinds.compile_stage(exc_type, message) == "dynamo"


# -- DataLoader workers that die: raised for real on the CPU --------------------------------


class _BusErrorDataset(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 5:
            os.kill(os.getpid(), signal.SIGBUS)
        return torch.zeros(3)


class _ManyTensorsDataset(torch.utils.data.Dataset[list[torch.Tensor]]):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> list[torch.Tensor]:
        return [torch.full((4,), float(index)) for _ in range(128)]


def _drain(loader: torch.utils.data.DataLoader[Any]) -> None:
    for _ in loader:
        pass


@pytest.mark.skipif(not hasattr(signal, "SIGBUS"), reason="POSIX signals")
def test_a_worker_killed_by_a_bus_error() -> None:
    loader = torch.utils.data.DataLoader(_BusErrorDataset(), batch_size=4, num_workers=2)
    exc = _raised(lambda: _drain(loader))
    facts = failures.build_failure("t::bus", "call", exc, None)
    assert facts is not None and facts.kind == "loader_worker"
    # "exited unexpectedly" is caused by "... is killed by signal: Bus error."
    assert (facts.loader_cause, facts.signal) == ("shared_memory", "Bus error")
    assert facts.in_loader_worker


def _bus_error() -> None:
    import faulthandler

    faulthandler.disable()  # pytest's, inherited through fork: no dump of a deliberate signal
    os.kill(os.getpid(), signal.SIGBUS)


@pytest.mark.skipif(not hasattr(signal, "SIGBUS"), reason="POSIX signals")
def test_a_bus_error_seen_by_the_status_check_is_named_from_the_dead_worker() -> None:
    """torch's status check (not its SIGCHLD handler) saw the worker die: the message names no
    signal, the reaped worker in the raising frame does."""
    worker = multiprocessing.get_context("fork").Process(target=_bus_error)
    worker.start()
    worker.join(30)
    assert worker.exitcode == -signal.SIGBUS

    def try_get_data() -> None:
        failed_workers = [worker]
        raise RuntimeError(f"DataLoader worker (pid(s) {failed_workers[0].pid}) exited "
                           "unexpectedly")

    exc = _raised(try_get_data)
    facts = failures.build_failure("t::bus", "call", exc, None)
    assert facts is not None and facts.kind == "loader_worker"
    assert (facts.loader_cause, facts.signal) == ("shared_memory", "Bus error")

    def plain_exit() -> None:
        failed_workers = [object()]  # not a process: nothing to read
        raise RuntimeError(f"DataLoader worker (pid(s) 1) exited unexpectedly {failed_workers}")

    quiet = failures.build_failure("t::exit", "call", _raised(plain_exit), None)
    assert quiet is not None and (quiet.loader_cause, quiet.signal) == ("crashed", None)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc")
def test_workers_out_of_file_descriptors() -> None:
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    headroom = len(os.listdir("/proc/self/fd")) + 48
    loader = torch.utils.data.DataLoader(_ManyTensorsDataset(), batch_size=8, num_workers=2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (headroom, hard))
    try:
        exc = _raised(lambda: _drain(loader))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    facts = failures.build_failure("t::fds", "call", exc, None)
    assert facts is not None and facts.kind == "loader_worker", repr(exc)
    assert facts.loader_cause == "open_files"


# -- details --------------------------------------------------------------------------------


def test_exceptions_wrapping_a_gpu_error_are_diagnosed_by_the_cause() -> None:
    try:
        try:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        except RuntimeError as inner:
            raise ValueError("training step 12 failed") from inner
    except ValueError as outer:
        kind, source = failure_kinds.failing_exception(outer)
        facts = failures.build_failure("t::wrap", "call", outer, outer.__traceback__)
    assert kind == "illegal_memory_access" and isinstance(source, RuntimeError)
    assert facts is not None and facts.exc_type == "RuntimeError" and facts.sticky
    assert failure_kinds.classify_exception(ValueError("plain")) == "not_gpu"


def test_a_rank_failure_is_left_to_the_launchers_diagnosis() -> None:
    class RankFailure(Exception):
        pass

    try:
        try:
            raise RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error")
        except RuntimeError as inner:
            raise RankFailure("rank 1 failed (backend nccl)") from inner
    except RankFailure as outer:
        assert failure_kinds.classify_exception(outer) == "not_gpu"


@pytest.mark.parametrize(("message", "expected"), [
    ("Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the "
     "same", ["float16", "float32"]),
    ("Input type (CUDABFloat16Type) and weight type (CPUBFloat16Type) should be the same",
     ["bfloat16"]),
    ("mat1 and mat2 must have the same dtype, but got Double and Float", ["float64", "float32"]),
    ("expected m1 and m2 to have the same dtype, but got: float != double",
     ["float32", "float64"]),
    ("Input type (c10::BFloat16) and bias type (float) should be the same",
     ["bfloat16", "float32"]),
    ("RNN input dtype (torch.float64) does not match weight dtype (torch.float32). Convert "
     "input: input.to(torch.float32)", ["float64", "float32"]),
    ("\"nll_loss_forward_reduce_cuda_kernel_2d_index\" not implemented for 'Int'", ["int32"]),
])
def test_parse_dtypes(message: str, expected: list[str]) -> None:
    assert failure_kinds.parse_dtypes(message) == expected


def test_devices_of_the_type_pair_message() -> None:
    assert failure_kinds.parse_devices(
        "Input type (CUDABFloat16Type) and weight type (CPUBFloat16Type) should be the same") == [
        "cuda", "cpu"]
    assert failure_kinds.parse_devices(
        "can't convert cuda:0 device type tensor to numpy.") == ["cuda:0"]


@pytest.mark.parametrize(("message", "problem"), [
    ("The NVIDIA driver on your system is too old (found version 11040).", "too_old"),
    ("CUDA driver version is insufficient for CUDA runtime version", "too_old"),
    ("CUDA error: the provided PTX was compiled with an unsupported toolchain.",
     "ptx_newer_than_driver"),
    ("Error 803: system has unsupported display driver / cuda driver combination",
     "driver_library_mismatch"),
    ("Error 804: forward compatibility was attempted on non supported HW",
     "compat_unsupported"),
])
def test_driver_problem(message: str, problem: str) -> None:
    assert failure_kinds.driver_problem(message) == problem


@pytest.mark.parametrize(("message", "visible", "build", "cause"), [
    ("Torch not compiled with CUDA enabled", None, None, "cpu_only_build"),
    ("Found no NVIDIA driver on your system.", None, "13.0", "no_driver"),
    ("No CUDA GPUs are available", "", "13.0", "gpus_hidden"),
    ("No CUDA GPUs are available", "7", "13.0", "gpus_hidden"),
    ("No CUDA GPUs are available", None, "13.0", "no_gpu"),
    ("CUDA driver initialization failed, you might not have a CUDA gpu.", None, "13.0",
     "init_failed"),
    ("CUDA error: CUDA-capable device(s) is/are busy or unavailable", None, "13.0", "busy"),
    ("Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False.",
     None, None, "cpu_only_build"),
])
def test_cuda_unavailable_cause(message: str, visible: str | None, build: str | None,
                                cause: str) -> None:
    assert failure_kinds.cuda_unavailable_cause(message, visible, build) == cause


@pytest.mark.parametrize(("message", "cause", "signal_name"), [
    ("DataLoader worker (pid 2113) is killed by signal: Bus error. It is possible that "
     "dataloader's workers are out of shared memory.", "shared_memory", "Bus error"),
    ("DataLoader worker (pid 90) is killed by signal: Killed. ", "host_memory", "Killed"),
    ("DataLoader worker (pid 90) is killed by signal: Segmentation fault. ", "crashed",
     "Segmentation fault"),
    ("RuntimeError: unable to open shared memory object </torch_31902_2963665567_47> in "
     "read-write mode: Too many open files (24)", "open_files", None),
    ("DataLoader worker (pid 7) exited unexpectedly with exit code 1. Details are lost due to "
     "multiprocessing.", "crashed", None),
])
def test_loader_crash(message: str, cause: str, signal_name: str | None) -> None:
    assert failure_kinds.loader_crash(message) == (cause, signal_name)


@pytest.mark.parametrize(("exc_type", "message", "stage"), [
    ("torch._dynamo.exc.Unsupported", "Failed to trace builtin operator", "dynamo"),
    ("torch._dynamo.exc.BackendCompilerFailed", "backend='inductor' raised:\nLoweringException",
     "inductor"),
    ("torch._dynamo.exc.BackendCompilerFailed", "backend='aot_eager' raised:\nRuntimeError: x",
     "aot"),
    ("triton.runtime.errors.OutOfResources", "out of resource: shared memory", "triton"),
])
def test_compile_stage(exc_type: str, message: str, stage: str) -> None:
    assert failure_kinds.compile_stage(exc_type, message) == stage


def test_status_and_nccl_details() -> None:
    assert failure_kinds.library_status(
        "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm(...)`") == (
        "CUBLAS_STATUS_EXECUTION_FAILED")
    assert failure_kinds.library_status(
        "CUDA error: too many resources requested for launch\nCUDA kernel errors might be") == (
        "too many resources requested for launch")
    assert failure_kinds.nccl_error(
        "invalid usage, NCCL version 2.14.3\nDuplicate GPU detected : rank 1 and rank 0 both on "
        "CUDA device 1000") == "duplicate gpu"
    assert failure_kinds.nondeterministic_operation(
        "Deterministic behavior was enabled with either ... it uses CuBLAS") == "cuBLAS"


def test_graph_capture_makes_no_cuda_call_but_is_not_sticky() -> None:
    assert "graph_capture" in failure_kinds.NO_CUDA_CALLS
    assert "graph_capture" not in failure_kinds.STICKY
    assert failure_kinds.STICKY <= failure_kinds.NO_CUDA_CALLS


def test_memory_kinds_take_the_allocator_state() -> None:
    state = {"allocated": 130 * 2**30, "reserved": 138 * 2**30, "free": 200 * 2**20,
             "total": 140 * 2**30}
    facts = failures.build_failure(
        "t::cudnn", "call", RuntimeError("Unable to find a valid cuDNN algorithm to run "
                                         "convolution"), None, None, None, state)
    assert facts is not None and facts.kind == "cudnn_no_algorithm" and not facts.sticky
    assert facts.free == 200 * 2**20 and facts.reserved == 138 * 2**30

    class Exploding:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"CUDA was asked for {name}")

    assert failures.snapshot(Exploding(), "dtype_mismatch", 0) == {}
