"""collect/nvml.py on a real GPU: cuda:N maps to the NVML GPU with torch's UUID, before CUDA
starts (through CUDA_VISIBLE_DEVICES) and after (through the UUID), and the device reads and
the process listing agree with torch. Skipped without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pytest_gputrain.collect import nvml
from pytest_gputrain.probe import failures

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.requires_cuda

MiB = 1024**2

# Run in a fresh interpreter: this one may have started CUDA already.
MAP_BEFORE_AND_AFTER_CUDA = """
import json, torch
from pytest_gputrain.collect import nvml
count = torch.cuda.device_count()  # no CUDA context yet
before = [nvml.index_for_cuda_device(i) for i in range(count)]
started_early = torch.cuda.is_initialized()
torch.cuda.init()
after = [nvml.index_for_cuda_device(i) for i in range(count)]
uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(count)]
print(json.dumps({"before": before, "after": after, "uuids": uuids,
                  "started_early": started_early}))
"""


def _bare(uuid: str | None) -> str:
    return (uuid or "").lower().removeprefix("gpu-")


def _nvml_uuids() -> list[str | None]:
    count = nvml.read_device_count()
    assert count.ok, count.error
    return [nvml.read_device(i, own_pids=set()).uuid for i in range(count.value)]


def _map_in_child(visible: str | None) -> dict[str, object]:
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    done = subprocess.run([sys.executable, "-c", MAP_BEFORE_AND_AFTER_CUDA], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _variants(uuids: list[str | None]) -> list[str | None]:
    """The inherited variable, the last GPU by a UUID prefix, and every GPU in reverse."""
    variants: list[str | None] = [os.environ.get("CUDA_VISIBLE_DEVICES")]
    last = uuids[-1]
    if last:
        variants.append(last[:12])  # "GPU-" and 8 hex digits
    if len(uuids) > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
        variants.append(",".join(str(i) for i in reversed(range(len(uuids)))))
    return variants


def test_cuda_devices_map_to_the_nvml_gpu_with_their_uuid() -> None:
    uuids = _nvml_uuids()
    for visible in _variants(uuids):
        mapped = _map_in_child(visible)
        assert mapped["started_early"] is False, "device_count() must not start CUDA"
        before, after, torch_uuids = mapped["before"], mapped["after"], mapped["uuids"]
        assert isinstance(after, list) and isinstance(torch_uuids, list)
        assert before == after, f"CUDA_VISIBLE_DEVICES={visible!r}: {mapped}"
        assert after and all(index is not None for index in after), mapped
        for index, torch_uuid in zip(after, torch_uuids, strict=True):
            assert _bare(uuids[index]) == _bare(torch_uuid), f"{visible!r}: {mapped}"


def test_device_reads_agree_with_torch() -> None:
    index = nvml.index_for_cuda_device(0)
    assert index is not None
    name = nvml.read_name(index)
    assert name.ok and name.value == torch.cuda.get_device_name(0), name
    capability = nvml.read_compute_capability(index)
    assert capability.ok and capability.value == torch.cuda.get_device_capability(0), capability
    major, minor = torch.cuda.get_device_capability(0)
    assert failures.nvml_capability(0) == f"{major}.{minor}"
    memory = nvml.read_memory_info(index)
    total = torch.cuda.get_device_properties(0).total_memory
    assert memory.ok and abs(memory.value.total - total) < 0.05 * total, (memory, total)


def test_process_listing_sees_this_process() -> None:
    index = nvml.index_for_cuda_device(0)
    assert index is not None
    held = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    # Only this process: xdist siblings on the same GPU change their memory as they run.
    me = {os.getpid()}
    device = nvml.read_device(index, own_pids=me)
    if device.processes is None:
        pytest.skip(f"NVML lists no processes on this GPU: {device.unknown['processes']}")
    if not any(process.own for process in device.processes):
        pytest.skip("NVML lists this process under another PID (a container's PID namespace)")
    holders = nvml.read_memory_holders(index, me)
    assert holders.ok, holders.error
    assert holders.value.own_memory >= 512 * MiB
    assert holders.value.own_memory == sum(p.used_memory or 0 for p in device.processes if p.own)
    sample = nvml.read_sample(index, pids=me)
    assert sample is not None and sample.process_memory == holders.value.own_memory
    assert failures.other_process_memory(0) is not None
    del held
