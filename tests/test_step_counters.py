"""Exact per-step counters of a step (collect/step_counters.py and the modules it runs): the
host's CPU time and instructions, ATen operators and the call sites of copies and
synchronisations, and what the CUDA runtime saw (kernels, copies, syncs), from plain event
records where no GPU is at hand."""

from __future__ import annotations

import errno
import sys
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_gputrain.collect import cuda_activity, host_counters, op_counts
from pytest_gputrain.collect.cuda_activity import GpuEvent, RuntimeEvent, kernel_label, per_step
from pytest_gputrain.collect.step_counters import count_step

torch = pytest.importorskip("torch")


def _model_step(extra_op: bool = False) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    inputs = torch.randn(8, 16)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        out = model(inputs)
        if extra_op:
            out = out * 1.0  # one more operator forward, one more in its backward
        out.sum().backward()
        optimizer.step()

    step()  # warm: the optimizer's state exists before anything is counted
    return step


# -- the host ------------------------------------------------------------------------------------


def _named_worker(name: bytes, go: threading.Event, done: threading.Event,
                  ids: list[int], release: threading.Event) -> threading.Thread:
    """A thread that names itself as the kernel shows it (/proc/self/task/*/comm), works once
    told to, and lives on until released (as torch's autograd threads live on)."""
    import ctypes

    def work() -> None:
        ctypes.CDLL(None).prctl(15, name)  # PR_SET_NAME, as torch's setThreadName does
        ids.append(threading.get_native_id())
        go.wait()
        sum(i * i for i in range(400_000))
        done.set()
        release.wait()

    thread = threading.Thread(target=work)
    thread.start()
    while not ids:
        threading.Event().wait(0.001)
    return thread


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="Linux threads")
def test_the_step_threads_are_the_callers_and_the_autograd_engines() -> None:
    """torch's autograd engine runs a CUDA backward on threads named pt_autograd_<device>:
    their CPU time is the step's; another thread's (an OpenMP worker spinning) is not."""
    go, done, other_done = threading.Event(), threading.Event(), threading.Event()
    release = threading.Event()
    autograd_ids: list[int] = []
    other_ids: list[int] = []
    autograd = _named_worker(b"pt_autograd_0", go, done, autograd_ids, release)
    other = _named_worker(b"omp_worker", go, other_done, other_ids, release)
    threads = host_counters.step_threads()
    assert threads[0] == threading.get_native_id()
    assert autograd_ids[0] in threads and other_ids[0] not in threads
    before = host_counters.cpu_time_ns(threads)
    go.set()
    done.wait()
    other_done.wait()
    spent = host_counters.cpu_time_ns(threads) - before
    release.set()
    autograd.join()
    other.join()
    assert spent > 5_000_000  # the autograd thread's work, in ns...
    # ...and an ended thread adds none (join returns before the kernel has reaped the thread).
    task = Path(f"/proc/self/task/{autograd_ids[0]}")
    deadline = time.monotonic() + 5
    while task.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert host_counters.cpu_time_ns([autograd_ids[0]]) == 0


def test_instruction_counter_opens_or_says_why() -> None:
    counter = host_counters.InstructionCounter.open()
    if isinstance(counter, str):  # this machine's answer, in words: no crash, no number
        assert "perf_event_open" in counter or "instruction counter" in counter
        return
    with counter:
        first = counter.read()
        sum(i * i for i in range(100_000))
        assert counter.read().value - first.value > 100_000


def test_the_counters_count_the_threads_they_are_given() -> None:
    """The machinery itself, on the kernel's software task clock (a counter there is, unlike the
    instruction counter, without a PMU): work on another thread is counted."""
    go, done = threading.Event(), threading.Event()

    def work() -> None:
        go.wait()
        sum(i * i for i in range(400_000))
        done.set()

    thread = threading.Thread(target=work)
    thread.start()
    counter = host_counters.InstructionCounter.open(
        host_counters.TASK_CLOCK, [threading.get_native_id(), thread.native_id or 0])
    if isinstance(counter, str):
        go.set()
        thread.join()
        pytest.skip(f"this kernel counts no software event either: {counter}")
    with counter:
        assert counter.threads >= 2
        before = counter.read().value
        go.set()
        done.wait()
        thread.join()
        assert counter.read().value - before > 5_000_000  # ns of the other thread on a core


@pytest.mark.parametrize(("code", "words"), [
    (errno.EACCES, "perf_event_paranoid"), (errno.EPERM, "seccomp"),
    (errno.ENOENT, "no hardware instruction counter"), (errno.ENOSYS, "no perf_event_open")])
def test_a_refused_counter_says_why(code: int, words: str) -> None:
    assert words in host_counters._refusal(code)


# -- operators and call sites --------------------------------------------------------------------


def test_operators_are_counted_per_step_and_an_extra_one_is_named() -> None:
    plain = op_counts.count_ops(torch, _model_step(), 3, cuda=False)
    extra = op_counts.count_ops(torch, _model_step(extra_op=True), 3, cuda=False)
    assert not isinstance(plain, str) and not isinstance(extra, str)
    assert plain[0].ops == plain[1].ops == plain[2].ops  # deterministic, step after step
    assert plain[0].ops["aten::addmm"] == 2 and plain[0].ops["aten::mm"] == 3
    added = extra[0].ops - plain[0].ops
    assert added == {"aten::mul": 2}  # the forward's mul and its backward's
    assert "profiler::_record_function_enter_new" not in plain[0].ops  # the optimizer's marks


def test_a_copy_between_host_and_device_is_measured_from_its_tensors() -> None:
    def tensor(device: str, size: int = 256, pinned: bool = False) -> Any:
        return SimpleNamespace(device=SimpleNamespace(type=device), numel=lambda: size,
                               element_size=lambda: 4, is_pinned=lambda: pinned)

    to_copy = SimpleNamespace(overloadpacket=SimpleNamespace(__name__="_to_copy"))
    copy_ = SimpleNamespace(overloadpacket=SimpleNamespace(__name__="copy_"))
    cuda = SimpleNamespace(type="cuda")
    assert op_counts._copy(to_copy, (tensor("cpu"),), {"device": cuda}) == ("h2d", "pageable",
                                                                            1024)
    assert op_counts._copy(to_copy, (tensor("cpu", pinned=True),), {"device": cuda}) == (
        "h2d", "pinned", 1024)
    assert op_counts._copy(to_copy, (tensor("cuda", 8),), {"device": SimpleNamespace(
        type="cpu"), "pin_memory": True}) == ("d2h", "pinned", 32)
    assert op_counts._copy(copy_, (tensor("cpu"), tensor("cuda", 2)), {}) == ("d2h", "pageable",
                                                                              8)
    assert op_counts._copy(to_copy, (tensor("cpu"),), {"dtype": "float64"}) is None
    assert op_counts._copy(to_copy, (tensor("cpu"),), {"device": SimpleNamespace(
        type="meta")}) is None  # no data moves to a meta tensor
    add = SimpleNamespace(overloadpacket=SimpleNamespace(__name__="add"))
    assert op_counts._copy(add, (tensor("cpu"), tensor("cuda")), {}) is None


def test_a_call_site_is_the_users_line() -> None:
    site = op_counts.call_site(sys._getframe())
    assert site.where.endswith("test_step_counters.py:" + str(sys._getframe().f_lineno - 1))
    assert site.code == "site = op_counts.call_site(sys._getframe())"


class _FakeCuda:
    """Just what ``_sync_sites`` switches: the sync debug mode, ``synchronize`` and
    ``Event.synchronize`` (torch's CPU build has no CUDA to warn about syncs)."""

    def __init__(self) -> None:
        self.mode = 0
        self.calls: list[str] = []

        class Event:
            def synchronize(inner: Any) -> None:
                self.calls.append("event")

        self.Event = Event

    def get_sync_debug_mode(self) -> int:
        return self.mode

    def set_sync_debug_mode(self, mode: str | int) -> None:
        self.mode = 1 if mode == "warn" else int(mode)

    def synchronize(self) -> None:
        self.calls.append("device")


def test_sync_warnings_become_call_sites_and_reach_no_one() -> None:
    """torch warns at each sync it makes while the debug mode is on: taken as a call site (with
    the operator running then), never shown, never an error under -W error; the user's own
    warnings pass; explicit syncs are wrapped, and everything is as it was afterwards."""
    cuda = _FakeCuda()
    fake_torch = SimpleNamespace(cuda=cuda)
    original_synchronize, original_event = cuda.synchronize, cuda.Event.synchronize
    tracker = op_counts._Tracker()

    def step() -> None:
        warnings.warn("called a synchronizing CUDA operation (Triggered internally)")  # noqa: B028
        warnings.warn("the user's own warning")  # noqa: B028
        fake_torch.cuda.synchronize()  # an explicit sync: wrapped
        fake_torch.cuda.Event().synchronize()

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("error")  # a suite's filterwarnings = error
        warnings.filterwarnings("always", message="the user's own warning")
        with op_counts._sync_sites(fake_torch, tracker):
            assert cuda.mode == 1
            step()
    assert [str(w.message) for w in seen] == ["the user's own warning"]
    assert cuda.mode == 0 and cuda.synchronize == original_synchronize
    assert cuda.Event.synchronize is original_event
    assert cuda.calls == ["device", "event"]
    found = {(kind, what, site.where.rsplit(":", 1)[0].rsplit("/", 1)[-1], site.code): n
             for (kind, what, site), n in tracker.step.syncs.items()}
    assert found == {
        ("stream", "", "test_step_counters.py",
         'warnings.warn("called a synchronizing CUDA operation (Triggered internally)")  # '
         'noqa: B028'): 1,
        ("device", "torch.cuda.synchronize", "test_step_counters.py",
         "fake_torch.cuda.synchronize()  # an explicit sync: wrapped"): 1,
        ("event", "Event.synchronize", "test_step_counters.py",
         "fake_torch.cuda.Event().synchronize()"): 1}


def test_a_sync_warning_held_past_its_operator_is_the_operator_that_finished_last() -> None:
    """torch 2.11 holds ``Tensor.item()``'s sync warning until the Python call returns, after the
    operator has left the dispatch mode: the warning is the operator that finished last on the
    thread (``aten::_local_scalar_dense`` on the GPU), named once; a later one has no operator."""
    tracker = op_counts._Tracker()
    with op_counts._mode(torch, tracker):
        value = torch.ones(4).sum()
    frame = sys._getframe()
    tracker.sync("stream", frame)
    tracker.sync("stream", frame)
    with op_counts._mode(torch, tracker):
        assert value.item() == 4.0
    tracker.sync("stream", frame)
    assert sorted((what, n) for (_, what, _), n in tracker.step.syncs.items()) == [
        ("", 1), ("aten::_local_scalar_dense", 1), ("aten::sum", 1)]


# -- what the CUDA runtime saw -------------------------------------------------------------------


ELEMENTWISE = ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, "
               "float, float, at::native::binary_internal::MulFunctor<float> >, "
               "at::detail::Array<char*, 2> >(int, at::native::AUnaryFunctor<float, float, float, "
               "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 2>)")


def test_kernel_labels_keep_the_operation_and_drop_the_noise() -> None:
    assert kernel_label(ELEMENTWISE) == "vectorized_elementwise_kernel<MulFunctor>"
    assert kernel_label("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, "
                        "unsigned int, 4, 64, 64>(float*, ...)") == "CatArrayBatchedCopy"
    assert kernel_label("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc") == (
        "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc")
    assert len(kernel_label("k" * 500)) == cuda_activity.LABEL_LENGTH


def test_each_step_gets_what_its_runtime_calls_launched() -> None:
    """Two steps marked on the host's clock; the marker's own syncs between them count for
    neither; a kernel launched from the autograd engine's thread counts for its step."""
    ranges = [(1_000, 2_000), (5_000, 6_000)]
    runtime = [
        RuntimeEvent("cudaLaunchKernel_v7000", 1_100, 1_110, 1),
        RuntimeEvent("cudaLaunchKernel", 1_200, 1_210, 2),  # the backward's thread
        RuntimeEvent("cudaMemcpyAsync", 1_300, 1_310, 3),
        RuntimeEvent("cudaStreamSynchronize", 1_320, 1_600, 0),  # .item(): copy and sync
        RuntimeEvent("cudaMalloc", 1_700, 1_710, 0),
        RuntimeEvent("cudaDeviceSynchronize", 2_500, 4_000, 0),  # the marker's: no step's
        RuntimeEvent("cudaLaunchKernel", 5_100, 5_110, 4),
        RuntimeEvent("cudaMemcpyAsync", 5_200, 5_210, 5),
        RuntimeEvent("cudaMemcpy", 5_300, 5_400, 6),  # blocking: a wait in itself
    ]
    gpu = [
        GpuEvent(ELEMENTWISE, 1_150, 1_250, 1),
        GpuEvent("sm90_xmma_gemm", 1_240, 1_300, 2),  # overlaps the first on another stream
        GpuEvent("Memcpy DtoH (Device -> Pageable)", 1_400, 1_410, 3, 4),
        GpuEvent(ELEMENTWISE, 5_150, 5_250, 4),
        GpuEvent("Memcpy HtoD (Pageable -> Device)", 5_250, 5_350, 5, 1 << 20),
        GpuEvent("Memcpy HtoD (Pinned -> Device)", 5_400, 5_420, 6, 4096),
        GpuEvent("Memset (Device)", 5_500, 5_510, 0),  # no launch seen: the step before it
    ]
    first, second = per_step(gpu, runtime, ranges)
    assert first.kernels == 2 and second.kernels == 1
    assert first.kernel_names == {"vectorized_elementwise_kernel<MulFunctor>": 1,
                                  "sm90_xmma_gemm": 1}
    assert first.syncs == {"stream": 1} and second.syncs == {"memcpy": 1}
    assert first.copies == {"d2h": {"count": 1, "bytes": 4, "pageable": 1}}
    assert second.copies == {"h2d": {"count": 2, "bytes": (1 << 20) + 4096, "pageable": 1,
                                     "pinned": 1}}
    assert first.cuda_mallocs == 1 and second.cuda_mallocs == 0
    assert second.memsets == 1
    assert first.busy_ns == (1_300 - 1_150) + 10  # the union: overlapping kernels once
    assert second.busy_ns == 100 + 100 + 20 + 10


def test_kineto_events_become_records_with_the_steps_marks() -> None:
    """The profiler's own events on the CPU: the marks around each step come back in order."""
    from torch.profiler import ProfilerActivity, profile, record_function

    step = _model_step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(2):
                with record_function(cuda_activity.STEP_MARK):
                    step()
    gpu, runtime, ranges = cuda_activity.convert(profiler.profiler.kineto_results.events())
    assert gpu == [] and runtime == []  # a CPU step: nothing of CUDA's
    assert len(ranges) == 2 and ranges[0][1] <= ranges[1][0]


# -- the pass ------------------------------------------------------------------------------------


def test_a_cpu_step_has_its_operators_and_host_time_and_says_what_it_lacks() -> None:
    counters = count_step(_model_step(), torch=torch, cuda_index=None, host_rounds=6)
    assert set(counters["per_step"]) == {"ops", "bytecodes"}
    assert counters["per_step"]["ops"] >= 30 and counters["varies"] == {}
    assert len(counters["host_cpu"]) == 6 and min(counters["host_cpu"]) > 0
    assert counters["ops_by_name"]["aten::mm"] == 3
    for name in ("kernels", "syncs", "h2d_bytes", "allocs", "cuda_mallocs"):
        assert counters["unavailable"][name] == "a CPU step: no CUDA runtime to count"
    if "instructions" in counters:
        assert len(counters["instructions"]) == 6
    else:
        assert counters["unavailable"]["instructions"]
    extra = count_step(_model_step(extra_op=True), torch=torch, cuda_index=None, host_rounds=2)
    assert extra["per_step"]["ops"] == counters["per_step"]["ops"] + 2


def _python_work(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i * i
    return total


def test_a_step_of_plain_python_has_host_time_and_bytecodes_only() -> None:
    counters = count_step(lambda: _python_work(100), torch=None, cuda_index=None,
                          host_rounds=4)
    assert len(counters["host_cpu"]) == 4
    assert set(counters["per_step"]) == {"bytecodes"} and counters["varies"] == {}
    assert counters["unavailable"]["ops"] == "torch is not in use in this benchmark"
    more = count_step(lambda: _python_work(200), torch=None, cuda_index=None, host_rounds=1)
    # a loop iteration is the same few instructions each time: 100 more iterations, 100 × that
    per_iteration = (more["per_step"]["bytecodes"] - counters["per_step"]["bytecodes"]) / 100
    assert per_iteration == int(per_iteration) and 4 <= per_iteration <= 12
    assert any(name.startswith("_python_work (test_step_counters.py:")
               for name in more["bytecodes_by_function"])


def test_more_python_in_a_torch_step_is_counted_and_named_and_nothing_else_moves() -> None:
    plain = _model_step()

    def worked() -> None:
        _python_work(500)
        plain()

    before = count_step(plain, torch=torch, cuda_index=None, host_rounds=2)
    after = count_step(worked, torch=torch, cuda_index=None, host_rounds=2)
    assert after["per_step"]["ops"] == before["per_step"]["ops"]
    assert after["per_step"]["bytecodes"] > before["per_step"]["bytecodes"] + 500 * 4
    assert before["varies"] == {} and after["varies"] == {}  # the same count every step
    named = [n for n in after["bytecodes_by_function"] if n.startswith("_python_work ")]
    assert named and not any(n.startswith("_python_work ")
                             for n in before["bytecodes_by_function"])


def test_steps_that_disagree_are_not_exact() -> None:
    calls = iter(range(100))

    def step() -> None:
        for _ in range(next(calls) % 2 + 1):  # one operator, then two, then one...
            torch.ones(2)

    counters = count_step(step, torch=torch, cuda_index=None, host_rounds=1)
    assert counters["varies"]["ops"] == [1.0, 2.0]


def test_a_step_that_uses_no_torch_has_no_counts_of_torch_where_torch_is_loaded() -> None:
    counters = count_step(lambda: sum(range(1000)), torch=torch, cuda_index=None,
                          host_rounds=2)
    assert set(counters["per_step"]) == {"bytecodes"}  # Python is all it does
    assert counters["unavailable"]["ops"] == ("the step dispatched no ATen operator: torch is "
                                              "not in use in it")
    assert len(counters["host_cpu"]) == 2


class _Event:
    """What convert reads of a kineto event."""

    def __init__(self, name: str, activity: str, device: str, start: int, duration: int,
                 correlation: int = 0, nbytes: int = 0) -> None:
        self._values = (name, activity, device, start, duration, correlation, nbytes)

    def name(self) -> str:
        return self._values[0]

    def activity_type(self) -> str:
        return self._values[1]

    def device_type(self) -> str:
        return f"DeviceType.{self._values[2]}"

    def start_ns(self) -> int:
        return self._values[3]

    def duration_ns(self) -> int:
        return self._values[4]

    def correlation_id(self) -> int:
        return self._values[5]

    def nbytes(self) -> int:
        return self._values[6]


def test_a_cuda_profile_becomes_steps_kernels_and_runtime_calls() -> None:
    """As kineto gives a CUDA step with CPU activity: the mark on the host and its copy on the
    GPU's timeline (no second step), runtime calls and kernels, an overhead event (no kernel),
    CPU operators (no runtime call)."""
    mark = cuda_activity.STEP_MARK
    events = [
        _Event(mark, "user_annotation", "CPU", 1_000, 1_000),
        _Event(mark, "gpu_user_annotation", "CUDA", 1_050, 1_200),
        _Event("aten::mul", "cpu_op", "CPU", 1_010, 100),
        _Event("cudaLaunchKernel", "cuda_runtime", "CPU", 1_020, 10, 7),
        _Event(ELEMENTWISE, "kernel", "CUDA", 1_100, 50, 7),
        _Event("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", "CUDA", 1_200, 20, 8, 4096),
        _Event("cudaMemcpyAsync", "cuda_runtime", "CPU", 1_150, 10, 8),
        _Event("Activity Buffer Request", "overhead", "CUDA", 1_300, 10),
        _Event("cuStreamSynchronize", "cuda_driver", "CPU", 1_500, 100),
    ]
    gpu, runtime, ranges = cuda_activity.convert(events)
    assert ranges == [(1_000, 2_000)]
    assert [e.name for e in runtime] == ["cudaLaunchKernel", "cudaMemcpyAsync",
                                         "cuStreamSynchronize"]
    assert [e.kind for e in gpu] == ["kernel", "memcpy"] and gpu[1].nbytes == 4096
    (step,) = per_step(gpu, runtime, ranges)
    assert step.kernels == 1 and step.syncs == {"stream": 1}
    assert step.copies == {"h2d": {"count": 1, "bytes": 4096, "pageable": 1}}
