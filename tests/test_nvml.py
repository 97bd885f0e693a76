"""collect/nvml.py and the modules behind it (nvml_session, nvml_processes, gpu_index) on a fake
NVML: cuda:N to NVML index, who holds memory, and the boundary (NVML is named nowhere outside
collect/)."""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from pytest_gputrain.assertions.backend import RealBackend
from pytest_gputrain.collect import nvml, nvml_session
from pytest_gputrain.probe import failures

GiB = 1024**3
UUIDS = ["GPU-aaaa1111-0000-0000-0000-000000000000",
         "GPU-bbbb2222-0000-0000-0000-000000000000",
         "GPU-aaaa3333-0000-0000-0000-000000000000"]


class FakeBinding:
    """The few pynvml functions collect/ calls, over a list of GPUs."""

    def __init__(self, uuids: list[str], processes: list[Any] | None = None,
                 fail: dict[str, int] | None = None) -> None:
        self.uuids = uuids
        self.processes = processes if processes is not None else []
        self.fail = fail or {}  # NVML function name -> NVML_ERROR_* code it answers with
        self.calls: list[str] = []

    def _answer(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise pynvml.NVMLError(self.fail[name])

    def nvmlDeviceGetCount(self) -> int:
        self._answer("nvmlDeviceGetCount")
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._answer("nvmlDeviceGetHandleByIndex")
        if index >= len(self.uuids):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        self._answer("nvmlDeviceGetUUID")
        return self.uuids[handle].encode()  # older bindings answer bytes

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        self._answer("nvmlDeviceGetName")
        return b"NVIDIA H200"

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        self._answer("nvmlDeviceGetCudaComputeCapability")
        return (9, 0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        self._answer("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=140 * GiB, free=100 * GiB, used=40 * GiB)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        self._answer("nvmlDeviceGetEnforcedPowerLimit")
        return 400_000  # mW: lowered with nvidia-smi -pl 400

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: int) -> int:
        self._answer("nvmlDeviceGetPowerManagementDefaultLimit")
        return 700_000

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: int) -> list[Any]:
        self._answer("nvmlDeviceGetComputeRunningProcesses_v3")
        return self.processes

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        self._answer("nvmlDeviceGetComputeRunningProcesses")
        return self.processes


class OlderBinding(FakeBinding):
    """An nvidia-ml-py from before nvmlDeviceGetComputeRunningProcesses_v3."""

    nvmlDeviceGetComputeRunningProcesses_v3 = None  # type: ignore[assignment]


def process(pid: int, used: int | None) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, usedGpuMemory=used)


def session(**kwargs: Any) -> nvml.Nvml:
    return nvml.Nvml(FakeBinding(list(UUIDS), **kwargs))


# -- CUDA_VISIBLE_DEVICES -> NVML indices ---------------------------------------------------------


@pytest.mark.parametrize(("visible", "expected"), [
    (None, [0, 1, 2]),  # unset: every GPU, in NVML order
    ("", []),  # set but empty: none
    ("2,0", [2, 0]),
    (" 1 , 2 ", [1, 2]),
    ("1gpu2,0", [1, 0]),  # CUDA reads an index like strtoul
    ("0,foo,1", [0]),  # the first entry naming no GPU hides the rest
    ("foo", []),
    ("0,-1,1", [0]),
    ("0,7", [0]),  # there is no GPU 7
    ("0,,1", [0]),
    ("0,1,0", []),  # a GPU named twice hides them all
    ("0,GPU-bbbb2222", [0]),  # a list is indices or UUIDs, not both
])
def test_visible_indices_read_like_cuda(visible: str | None, expected: list[int]) -> None:
    assert nvml.visible_nvml_indices(visible, UUIDS) == expected


@pytest.mark.parametrize(("visible", "expected"), [
    (UUIDS[1], [1]),  # a full UUID
    (f"{UUIDS[2]},{UUIDS[0]}", [2, 0]),
    ("GPU-bbbb", [1]),  # a prefix that names one GPU
    ("gpu-BBBB2222", [1]),  # case does not matter
    ("GPU-aaaa", []),  # a prefix two GPUs share names none
    ("GPU-aaaa3,GPU-aaaa", [2]),
    ("GPU-", []),
    ("GPU-cccc", []),  # no such GPU
    (f"{UUIDS[1]},1", [1]),  # an index after UUIDs ends the list
    (f"{UUIDS[1]},GPU-bbbb", []),  # the same GPU twice
    ("MIG-GPU-aaaa1111-0000-0000-0000-000000000000/1/0", []),  # a MIG instance is no NVML GPU
    ("MIG-8c3f0f1e-2b7a-5a4e-9a7c-1c2d3e4f5a6b", []),
])
def test_visible_uuids_and_prefixes(visible: str, expected: list[int]) -> None:
    assert nvml.visible_nvml_indices(visible, UUIDS) == expected


def test_a_gpu_whose_uuid_nvml_cannot_read_still_counts_by_index() -> None:
    uuids = [None, UUIDS[1]]
    assert nvml.visible_nvml_indices("GPU-bbbb", uuids) == [1]
    assert nvml.visible_nvml_indices("1,0", uuids) == [1, 0]
    assert nvml.visible_nvml_indices(None, uuids) == [0, 1]


# -- torch's cuda:N -> NVML index -----------------------------------------------------------------


class FakeTorch:
    """Enough of ``torch`` for index_for_cuda_device: CUDA state and device UUIDs."""

    def __init__(self, initialized: bool, uuids: list[str]) -> None:
        self.asked: list[int] = []
        outer = self

        class Cuda:
            @staticmethod
            def is_initialized() -> bool:
                return initialized

            @staticmethod
            def get_device_properties(index: int) -> SimpleNamespace:
                outer.asked.append(index)
                return SimpleNamespace(uuid=uuids[index])

        self.cuda = Cuda()


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch not imported (and not importable: None in sys.modules makes ``import`` fail)."""
    monkeypatch.setitem(sys.modules, "torch", None)


@pytest.mark.usefixtures("no_torch")
def test_cuda_index_follows_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = session()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [nvml.index_for_cuda_device(i, fake) for i in range(4)] == [0, 1, 2, None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-bbbb")
    assert [nvml.index_for_cuda_device(i, fake) for i in range(2)] == [2, None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb,GPU-aaaa3")
    assert [nvml.index_for_cuda_device(i, fake) for i in range(3)] == [1, 2, None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert nvml.index_for_cuda_device(0, fake) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-GPU-aaaa1111/1/0")
    assert nvml.index_for_cuda_device(0, fake) is None
    assert nvml.index_for_cuda_device(-1, fake) is None


@pytest.mark.usefixtures("no_torch")
def test_cuda_index_is_none_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    broken = session(fail={"nvmlDeviceGetCount": pynvml.NVML_ERROR_UNINITIALIZED})
    assert nvml.index_for_cuda_device(0, broken) is None


def test_initialised_torch_settles_the_index_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    # The variable changed after CUDA started: torch's UUIDs say what cuda:N really is.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    torch = FakeTorch(initialized=True, uuids=[UUIDS[2].removeprefix("GPU-"), "MIG-1234"])
    monkeypatch.setitem(sys.modules, "torch", torch)
    fake = session()
    assert nvml.index_for_cuda_device(0, fake) == 2
    assert nvml.index_for_cuda_device(1, fake) == 1  # a MIG UUID: back to the variable


def test_uninitialised_torch_is_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # Asking torch for device properties would create a CUDA context.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    torch = FakeTorch(initialized=False, uuids=[UUIDS[2]])
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert nvml.index_for_cuda_device(0, session()) == 1
    assert torch.asked == []


# -- who holds memory on a GPU --------------------------------------------------------------------


def test_memory_holders_split_own_and_other_processes() -> None:
    fake = session(processes=[process(10, 3 * GiB), process(20, GiB), process(30, None),
                              process(11, 2 * GiB)])
    reading = nvml.read_memory_holders(0, {10, 11}, fake)
    assert reading.ok
    assert reading.value == nvml.MemoryHolders(own_memory=5 * GiB, other_count=2,
                                               other_memory=GiB)  # pid 30's size is unknown


def test_process_listing_falls_back_to_the_older_nvml_call() -> None:
    binding = OlderBinding(list(UUIDS), processes=[process(20, GiB)])
    reading = nvml.read_memory_holders(0, set(), nvml.Nvml(binding))
    assert reading.value == nvml.MemoryHolders(own_memory=0, other_count=1, other_memory=GiB)
    assert "nvmlDeviceGetComputeRunningProcesses" in binding.calls


@pytest.mark.parametrize(("fail", "reason"), [
    ({"nvmlDeviceGetComputeRunningProcesses_v3": pynvml.NVML_ERROR_NOT_SUPPORTED},
     "Not Supported"),
    ({"nvmlDeviceGetComputeRunningProcesses_v3": pynvml.NVML_ERROR_NO_PERMISSION},
     "Insufficient Permissions"),
    ({"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_GPU_IS_LOST}, "GPU is lost"),
])
def test_nvml_errors_make_process_memory_not_available(fail: dict[str, int], reason: str) -> None:
    fake = session(processes=[process(20, GiB)], fail=fail)
    reading = nvml.read_memory_holders(0, set(), fake)
    assert not reading.ok and reading.error == reason and reading.value is None
    device = nvml.read_device(0, own_pids=set(), nvml=fake)
    sample = nvml.read_sample(0, fake, pids=[20])
    assert device.other_process_memory is None
    if "nvmlDeviceGetHandleByIndex" in fail:  # no GPU to ask at all
        assert device.lost and sample is None
    else:
        assert device.unknown["other_process_memory"] == reason
        assert sample is not None and sample.process_memory is None


def test_an_unexpected_process_record_is_a_reason_not_an_exception() -> None:
    fake = session(processes=[SimpleNamespace(usedGpuMemory=GiB)])  # no pid
    reading = nvml.read_memory_holders(0, set(), fake)
    assert not reading.ok and (reading.error or "").startswith("unexpected value")


def test_device_facts_and_samples_use_the_same_listing() -> None:
    own = os.getpid()
    fake = session(processes=[process(own, 3 * GiB), process(20, GiB), process(30, None)])
    device = nvml.read_device(0, own_pids={own}, nvml=fake)
    assert [(p.pid, p.used_memory, p.own) for p in device.processes or []] == [
        (own, 3 * GiB, True), (20, GiB, False), (30, None, False)]
    assert (device.other_process_count, device.other_process_memory) == (2, GiB)
    sample = nvml.read_sample(0, fake, pids=[own, 30])
    assert sample is not None and sample.process_memory == 3 * GiB


# -- power limits ---------------------------------------------------------------------------------


def test_power_limits_enforced_and_default_in_watts() -> None:
    enforced, default = nvml.read_power_limits(0, session())
    assert (enforced.value, default.value) == (400.0, 700.0)
    device = nvml.read_device(0, own_pids=set(), nvml=session())
    assert (device.power_limit, device.power_limit_default) == (400.0, 700.0)


def test_a_default_limit_nvml_cannot_tell_is_unknown_with_its_reason() -> None:
    fake = session(fail={"nvmlDeviceGetPowerManagementDefaultLimit":
                         pynvml.NVML_ERROR_NOT_SUPPORTED})
    enforced, default = nvml.read_power_limits(0, fake)
    assert enforced.value == 400.0
    assert not default.ok and default.error == "Not Supported"
    device = nvml.read_device(0, own_pids=set(), nvml=fake)
    assert device.power_limit_default is None
    assert device.unknown["power_limit_default"] == "Not Supported"


# -- the callers outside collect/ -----------------------------------------------------------------


@pytest.mark.usefixtures("no_torch")
def test_failure_facts_read_nvml_through_collect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb")
    fake = session(processes=[process(os.getpid(), 3 * GiB), process(2**22 + 7, GiB)])
    monkeypatch.setattr(nvml_session, "_shared", fake)
    assert failures.other_process_memory(0) == GiB
    assert failures.nvml_capability(0) == "9.0"
    assert failures.other_process_memory(1) is None  # cuda:1 is hidden
    monkeypatch.setattr(nvml_session, "_shared", session(
        fail={"nvmlDeviceGetComputeRunningProcesses_v3": pynvml.NVML_ERROR_NOT_SUPPORTED,
              "nvmlDeviceGetCudaComputeCapability": pynvml.NVML_ERROR_NOT_SUPPORTED}))
    assert failures.other_process_memory(0) is None
    assert failures.nvml_capability(0) is None


@pytest.mark.usefixtures("no_torch")
def test_real_backend_reads_nvml_through_collect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    fake = session(processes=[process(os.getpid(), 3 * GiB), process(2**22 + 7, GiB)])
    monkeypatch.setattr(nvml_session, "_shared", fake)
    backend = RealBackend()
    assert backend.nvml_index(0) == 2 and backend.nvml_index(1) is None
    assert backend.nvml_device_count() == (3, None)
    free = backend.free_memory(0)
    assert (free.free, free.total) == (100 * GiB, 140 * GiB)
    assert (free.own_memory, free.other_processes, free.other_memory) == (3 * GiB, 1, GiB)


# -- the boundary ---------------------------------------------------------------------------------

PACKAGE = Path(nvml.__file__).resolve().parent.parent
NVML_FUNCTION = re.compile(r"nvml[A-Z]\w*")


def nvml_uses(path: Path) -> list[str]:
    """Where a module imports pynvml or names an NVML function (``Nvml.call("nvmlX")``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                (node.value == "pynvml" or NVML_FUNCTION.fullmatch(node.value)):
            found.append((node.lineno, repr(node.value)))
        found.extend((node.lineno, f"import {module}") for module in modules
                     if module.split(".")[0] == "pynvml")
    return [f"{path.name}:{line}: {what}" for line, what in sorted(found)]


def test_nvml_is_called_only_from_collect() -> None:
    outside = {path: nvml_uses(path) for path in sorted(PACKAGE.rglob("*.py"))
               if "collect" not in path.relative_to(PACKAGE).parts}
    assert len(outside) > 40  # the scan sees the whole package
    assert {str(path.relative_to(PACKAGE)): uses for path, uses in outside.items() if uses} == {}


def test_the_boundary_scan_sees_imports_and_call_names(tmp_path: Path) -> None:
    assert any("import pynvml" in use
               for use in nvml_uses(PACKAGE / "collect" / "nvml_session.py"))
    module = tmp_path / "feature.py"
    module.write_text("from pynvml import nvmlInit\nimport pynvml.smi as smi\n"
                      "import importlib\nimportlib.import_module('pynvml')\n"
                      "session.call('nvmlDeviceGetName', handle)\n"
                      "text = 'nvml is not available'\n")
    assert nvml_uses(module) == [
        "feature.py:1: import pynvml", "feature.py:2: import pynvml.smi",
        "feature.py:4: 'pynvml'", "feature.py:5: 'nvmlDeviceGetName'"]


def test_samples_count_processes_outside_the_session() -> None:
    me = os.getpid()
    sibling = me + 1  # a pytest-xdist worker of this session: not "another process"
    fake = session(processes=[process(me, GiB), process(4242, 132 * GiB), process(sibling, GiB)])
    sample = nvml.read_sample(0, fake, pids=[me], session_pids={me, sibling})
    assert sample is not None and sample.process_memory == GiB
    assert (sample.other_process_memory, sample.other_process_count) == (132 * GiB, 1)
    assert nvml.read_sample(0, fake, pids=[me]).other_process_memory is None  # not asked


def test_other_processes_are_unknown_when_this_process_is_listed_under_another_pid(
        monkeypatch: pytest.MonkeyPatch) -> None:
    me = os.getpid()
    # A container's PID namespace: NVML lists this process under a host PID.
    foreign = session(processes=[process(2**22 + 1, 5 * GiB), process(4242, 132 * GiB)])
    sample = nvml.read_sample(0, foreign, pids=[me], session_pids={me})
    assert sample is not None and sample.process_memory == 0
    assert sample.other_process_memory is None and sample.other_process_count is None
    monkeypatch.setattr(nvml_session, "_shared", foreign)
    assert failures.read_other_processes(0, {me}) is None
    monkeypatch.setattr(nvml_session, "_shared", session(processes=[process(me, GiB),
                                                            process(4242, 132 * GiB)]))
    assert failures.read_other_processes(0, {me}) == (132 * GiB, 1)
    monkeypatch.setattr(nvml_session, "_shared", session(processes=[]))
    assert failures.read_other_processes(0, {me}) == (0, 0)


def test_session_processes_leave_out_the_tests_own_children(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
        assert nvml.session_process_ids() == {os.getpid()}
        assert child.pid in nvml.own_process_ids()  # the session-start view counts children
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
        pids = nvml.session_process_ids()
        assert os.getppid() in pids and os.getpid() in pids and child.pid not in pids
    finally:
        child.kill()
        child.wait()
