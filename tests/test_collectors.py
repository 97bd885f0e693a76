"""Collectors on a machine without a GPU: they never raise, and they say why a fact is unknown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gputrain.collect import nvml
from pytest_gputrain.collect.environment_variables import read_environment
from pytest_gputrain.collect.host import read_host
from pytest_gputrain.collect.toolkit import read_toolkit

SECRETS = {"NCCL_IB_Password": "pw-1", "NCCL_API_KEY": "key-2", "NCCL_APIKEY": "key-3",
           "NCCL_AUTH": "auth-4", "NCCL_CREDENTIALS": "cred-5",
           "NCCL_PRIVATE_KEY_FILE": "/secrets/key-6.pem", "NCCL_COMM_ID_PASSWORD": "hunter2",
           "TORCH_HUB_TOKEN": "tok-7", "CUDA_SOMETHING_NEW": "unreviewed-8"}


def test_only_settings_keep_their_values_every_other_is_redacted() -> None:
    facts = read_environment({
        "CUDA_VISIBLE_DEVICES": "1,0", "CUDA_LAUNCH_BLOCKING": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_P2P_DISABLE": "1",
        "TORCH_NCCL_BLOCKING_WAIT": "1", "AWS_SECRET_ACCESS_KEY": "s", "HOME": "/root",
        "WANDB_API_KEY": "k", **SECRETS,
    })
    assert facts.variables == {
        "CUDA_LAUNCH_BLOCKING": "1", "CUDA_VISIBLE_DEVICES": "1,0", "NCCL_P2P_DISABLE": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCH_NCCL_BLOCKING_WAIT": "1",
        **{name: "<redacted>" for name in SECRETS}}
    assert facts.nccl_variables == {
        "NCCL_P2P_DISABLE": "1", **{name: "<redacted>" for name in SECRETS
                                    if name.startswith("NCCL_")}}
    assert facts.cuda_launch_blocking is True
    assert facts.cuda_visible_devices == "1,0"
    assert read_environment({"CUDA_LAUNCH_BLOCKING": "0"}).cuda_launch_blocking is False
    assert read_environment({}).cuda_visible_devices is None


def test_the_launch_record_uses_the_same_filter() -> None:
    from pytest_gputrain.distributed.record import nccl_environment

    assert nccl_environment({"NCCL_DEBUG": "WARN", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                             "CUDA_VISIBLE_DEVICES": "0", **SECRETS}) == {
        "NCCL_DEBUG": "WARN", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        **{name: "<redacted>" for name in SECRETS if name.startswith("NCCL_")}}


@pytest.mark.parametrize(("environ", "disabled"), [
    ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, True),
    ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "0"}, False),
    ({"PYTORCH_NO_CUDA_MEMORY_CACHING": ""}, False),
    ({"PYTORCH_NO_HIP_MEMORY_CACHING": "true"}, True),
    ({}, False),
])
def test_memory_caching_switch(environ: dict[str, str], disabled: bool) -> None:
    facts = read_environment(environ)
    assert facts.cuda_memory_caching_disabled is disabled
    assert facts.variables == environ


@pytest.mark.parametrize(("environ", "found"), [
    ({"TORCH_COMPILE_DEBUG": "1"}, ["TORCH_COMPILE_DEBUG=1"]),
    ({"TORCH_COMPILE_DEBUG": "0"}, []),
    ({"TORCH_LOGS": "recompiles,graph_breaks"}, []),
    ({"TORCH_LOGS": "+dynamo"}, ["TORCH_LOGS=+dynamo"]),
    ({"TORCH_LOGS": "recompiles, output_code"}, ["TORCH_LOGS=recompiles, output_code"]),
    ({"TORCH_LOGS": "-dynamo"}, []),
    ({"TORCH_TRACE": "/tmp/trace"}, ["TORCH_TRACE=/tmp/trace"]),
    ({"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "TORCHDYNAMO_VERBOSE": "1"},
     ["TORCHINDUCTOR_FORCE_DISABLE_CACHES=1", "TORCHDYNAMO_VERBOSE=1"]),
])
def test_compile_debug_switches(environ: dict[str, str], found: list[str]) -> None:
    facts = read_environment(environ)
    assert facts.compile_debug_settings == found
    assert facts.variables == dict(sorted(environ.items()))


def test_nvml_errors_become_readings_with_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def nvmlInit(self) -> None:
            return None

        def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
            return "handle"

        def nvmlDeviceGetName(self, handle: str) -> str:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED Not Supported")

        def nvmlDeviceGetMemoryInfo(self, handle: str) -> None:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST GPU is lost")

    session = nvml.Nvml()
    session._initialised, session._module = True, Broken()
    reading = session.call("nvmlDeviceGetName", "handle")
    assert not reading.ok and reading.error == "NOT_SUPPORTED Not Supported"
    assert session.call("nvmlDeviceGetNoSuchCall").error == (
        "nvmlDeviceGetNoSuchCall is not in this nvidia-ml-py version")
    device = nvml.read_device(0, own_pids=set(), nvml=session)
    assert device.name is None and device.unknown["name"] == "NOT_SUPPORTED Not Supported"
    assert device.lost is True  # GPU_IS_LOST from any call marks the device lost
    assert device.memory_total is None and "GPU is lost" in device.unknown["memory_total"]


def test_missing_driver_is_a_fact_not_an_error() -> None:
    session = nvml.Nvml()
    facts = nvml.read_system(session)
    if facts.available:
        pytest.skip("this machine has an NVIDIA driver")
    assert (facts.reason and "driver" in facts.reason.lower()) or "nvml" in (facts.reason or "")
    assert facts.unknown["device_count"] == facts.reason


def test_host_and_toolkit_never_raise(tmp_path: object) -> None:
    host = read_host(shm_path="/no/such/shm")
    assert host.shm_total is None and "does not exist" in host.unknown["shm_total"]
    assert host.cpu_count_logical and host.cpu_count_logical >= 1
    tools = read_toolkit()
    assert tools.nvcc_version is not None or "nvcc" in tools.unknown["nvcc_version"]


# Runs before anything else in a subprocess: NumPy then cannot be imported, as if not installed.
WITHOUT_NUMPY = '''
import sys


class _NoNumPy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoNumPy())
'''

SUITE_WITHOUT_TORCH = '''
import sys

import pytest


@pytest.mark.requires_cuda
def test_needs_a_gpu():
    pass


def test_only_the_plugin_imported_torch():
    assert "torch" in sys.modules and "numpy" not in sys.modules
'''


def test_the_plugins_torch_import_keeps_quiet_without_numpy(tmp_path: Path) -> None:
    """torch installed without NumPy warns "Failed to initialize NumPy" at import. In a suite
    whose tests never import torch, the plugin's markers and diagnosis import it: the warning
    would be the plugin's, with nothing for the user to fix."""
    pytest.importorskip("torch")
    control = subprocess.run([sys.executable, "-W", "always", "-c",
                              WITHOUT_NUMPY + "import torch\n"],
                             capture_output=True, text=True, check=False)
    assert control.returncode == 0, control.stderr
    if "Failed to initialize NumPy" not in control.stderr:
        pytest.skip("this torch imports without NumPy silently")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_suite.py").write_text(SUITE_WITHOUT_TORCH)
    run = WITHOUT_NUMPY + "import pytest\nsys.exit(pytest.main(sys.argv[1:]))\n"
    result = subprocess.run([sys.executable, "-c", run, "--gpu-diagnose", "-p", "no:cacheprovider",
                             "-p", "no:xdist", "-rA"],
                            capture_output=True, text=True, check=False, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "PASSED test_suite.py::test_only_the_plugin_imported_torch" in output, output
    assert "NumPy" not in output, output
