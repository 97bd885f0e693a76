"""Multi-GPU tests on real GPUs (written for the lent 2x H200: torch 2.11, CUDA 13, NCCL).

One rank per GPU over NCCL. Inner pytest runs go through subprocesses so that each has its own
CUDA state. The machine's NCCL_NVLS_ENABLE=0 / TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are inherited
by every process started here; nothing here unsets them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from pytest_gputrain.distributed import RankFailure, rank_device, run_ranks  # noqa: E402

pytestmark = [pytest.mark.requires_cuda(min_devices=2),
              pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def plugin_args(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Arguments that load the plugin (installed or from this checkout) in inner runs."""
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{path}" if path else str(ROOT))
    installed = any(ep.value.startswith("pytest_gputrain")
                    for ep in entry_points(group="pytest11"))
    return ["-p", "no:cacheprovider", *([] if installed else ["-p", "pytest_gputrain.plugin"]),
            "-p", "pytest_gputrain.distributed.plugin"]


def train_ddp_cuda(steps: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    device = rank_device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1)).to(device)
    model = DistributedDataParallel(model, device_ids=[device.index])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator(device=device).manual_seed(1 + dist.get_rank())
    for _ in range(steps):
        x = torch.randn(256, 1024, device=device, generator=generator)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    return {"checksum": checksum, "device": str(device), "backend": dist.get_backend(),
            "name": torch.cuda.get_device_name(device)}


def test_ddp_trains_on_two_nccl_ranks() -> None:
    started = time.monotonic()
    results = run_ranks(train_ddp_cuda, world_size=2, backend="nccl", args=(20,), timeout=180)
    print(f"2-rank NCCL DDP launch took {time.monotonic() - started:.1f} s: {results}")
    assert [r["device"] for r in results] == ["cuda:0", "cuda:1"]
    assert {r["backend"] for r in results} == {"nccl"}
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"], rel=1e-9)


TRAINING = '''
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pytest_gputrain.distributed import rank_device


def train(sleep_rank, sleep_s, steps=30):
    device = rank_device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 10)).to(device)
    model = DistributedDataParallel(model, device_ids=[device.index])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(steps):
        if dist.get_rank() == sleep_rank:
            time.sleep(sleep_s)  # one rank's data loading is slow
        x = torch.randn(512, 2048, device=device)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return dist.get_rank()


def test_straggler(distributed):
    assert distributed.run(train, world_size=2, backend="nccl", args=(1, 0.03)) == [0, 1]


def test_balanced(distributed):
    distributed.run(train, world_size=2, backend="nccl", args=(-1, 0.0))
'''


def _findings(path: Path) -> list[dict[str, Any]]:
    report = json.loads(path.read_text())
    findings: list[dict[str, Any]] = report["findings"]
    return findings


def test_straggler_is_reported_under_diagnose(pytester: pytest.Pytester,
                                              plugin_args: list[str]) -> None:
    pytester.makepyfile(test_training=TRAINING)
    result = pytester.runpytest_subprocess("--gpu-diagnose", "--gpu-report=report.json",
                                           "--gpu-fail-on=never", "-rA", *plugin_args,
                                           timeout=400)
    print(result.stdout.str()[-6000:])
    result.assert_outcomes(passed=2)
    findings = _findings(pytester.path / "report.json")
    straggler = [f for f in findings if f["code"] == "GT301"]
    assert [f["subject"].split("::")[-1] for f in straggler] == ["test_straggler [2 ranks, nccl]"]
    evidence = {item["name"]: item["value"] for item in straggler[0]["evidence"]}
    assert evidence["dist.straggler_rank"] == 1
    busy = evidence["dist.busy_time_medians"]
    assert busy[1] > 0.03 > busy[0], busy
    report = json.loads((pytester.path / "report.json").read_text())
    for launch in report["sections"]["distributed"]:
        assert launch["backend"] == "nccl" and launch["cuda_used"] and launch["ddp_used"]
        assert launch["device_names"] == [launch["device_names"][0]] * 2


SIMPLE = '''
from tests_helpers_gpu import train


def test_ddp(distributed):
    distributed.run(train, world_size=2, backend="nccl", args=(-1, 0.0, 5))
'''


def test_nccl_p2p_disable_is_reported(pytester: pytest.Pytester, plugin_args: list[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    pytester.makepyfile(tests_helpers_gpu=TRAINING.split("def test_straggler")[0],
                        test_simple=SIMPLE)
    result = pytester.runpytest_subprocess("--gpu-diagnose", "--gpu-report=report.json",
                                           "--gpu-facts-out=facts.json", "--gpu-fail-on=never",
                                           *plugin_args, timeout=300)
    print(result.stdout.str()[-4000:])
    result.assert_outcomes(passed=1)  # slower, not broken
    findings = _findings(pytester.path / "report.json")
    (gt305,) = [f for f in findings if f["code"] == "GT305"]
    assert "NCCL_P2P_DISABLE=1" in gt305["message"]
    report = json.loads((pytester.path / "report.json").read_text())
    (launch,) = report["sections"]["distributed"]
    assert launch["nccl_variables"]["NCCL_P2P_DISABLE"] == "1"
    assert launch["nccl_variables"].get("NCCL_NVLS_ENABLE") == os.environ.get("NCCL_NVLS_ENABLE")
    topology = json.loads((pytester.path / "facts.json").read_text())["environment"]["topology"]
    print("topology:", json.dumps(topology, indent=1))
    assert topology["gpu_count"] >= 2 and topology["pair_count"] >= 1


BROKEN = '''
import torch
import torch.distributed as dist

from pytest_gputrain.distributed import rank_device


def skip_second_all_reduce():
    value = torch.ones(4, device=rank_device())
    dist.all_reduce(value)                      # both ranks
    if dist.get_rank() == 0:
        dist.all_reduce(value)                  # rank 1 never joins this one
    torch.cuda.synchronize()
    return value.sum().item()


def test_broken_collective(distributed):
    distributed.run(skip_second_all_reduce, world_size=2, backend="nccl", timeout=60,
                    collective_timeout=20,
                    env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"})
'''


def test_broken_collective_fails_with_a_diagnosis_and_no_hang(
        pytester: pytest.Pytester, plugin_args: list[str]) -> None:
    pytester.makepyfile(test_broken=BROKEN)
    started = time.monotonic()
    result = pytester.runpytest_subprocess("--gpu-diagnose", "--gpu-report=report.json",
                                           *plugin_args, timeout=300)
    elapsed = time.monotonic() - started
    output = result.stdout.str()
    print(output[-8000:])
    result.assert_outcomes(failed=1)
    assert elapsed < 60 + 60, f"the broken collective took {elapsed:.0f} s"  # + pytest start-up
    assert "never entered all_reduce #2" in output
    findings = _findings(pytester.path / "report.json")
    (gt308,) = [f for f in findings if f["code"] == "GT308"]
    assert gt308["severity"] == "error"
    evidence = {item["name"]: item["value"] for item in gt308["evidence"]}
    assert evidence["dist.failure_kind"] in ("nccl_timeout", "nccl_error", "collective_timeout",
                                             "hang")
    assert "never entered all_reduce #2" in (evidence["dist.desync"] or "")


def test_rank_failure_on_gpu_names_the_rank() -> None:
    with pytest.raises(RankFailure) as caught:
        run_ranks(fail_on_gpu_rank_1, world_size=2, backend="nccl", timeout=120)
    assert caught.value.rank == 1
    assert "ValueError: rank 1 refuses" in str(caught.value)


def fail_on_gpu_rank_1() -> None:
    torch.ones(1, device=rank_device())
    if dist.get_rank() == 1:
        raise ValueError("rank 1 refuses")


UNDER_TORCHRUN = '''
import os

import pytest
import torch
import torch.distributed as dist

from pytest_gputrain.distributed import RankFailure
from tests_helpers_gpu import train


def refuse_on_rank_1():
    torch.ones(1, device=f"cuda:{os.environ['LOCAL_RANK']}")
    if dist.get_rank() == 1:
        raise ValueError("rank 1 refuses")


def test_ddp_twice(distributed):
    for _ in range(2):  # each launch gets an NCCL group of its own
        assert distributed.run(train, world_size=2, backend="nccl", args=(-1, 0.0, 5)) == [0, 1]
    record = distributed.last.record
    assert record.launcher == "torchrun" and record.backend == "nccl"
    assert [rank.probe["device"] for rank in record.ranks] == ["cuda:0", "cuda:1"]


def test_failure_is_named_on_every_rank(distributed):
    with pytest.raises(RankFailure) as caught:
        distributed.run(refuse_on_rank_1, world_size=2, backend="nccl", timeout=120)
    assert caught.value.rank == 1
    assert "ValueError: rank 1 refuses" in str(caught.value)
'''


def test_the_same_nccl_tests_run_on_torchrun_ranks(pytester: pytest.Pytester,
                                                    plugin_args: list[str]) -> None:
    """pytest on 2 torchrun ranks: the launches run in the workers, one GPU each, over NCCL."""
    pytester.makepyfile(tests_helpers_gpu=TRAINING.split("def test_straggler")[0],
                        test_torchrun=UNDER_TORCHRUN)
    started = time.monotonic()
    result = pytester.run(sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", "--log-dir=logs", "--redirects=3", "-m",
                          "pytest", "--gpu-diagnose", "-rA", *plugin_args, "test_torchrun.py",
                          timeout=400)
    logs = {int(path.parent.name): path.read_text()
            for path in (pytester.path / "logs").glob("*/attempt_0/*/stdout.log")}
    for rank, log in sorted(logs.items()):
        print(f"--- torchrun rank {rank} ---\n{log[-3000:]}")
    print(f"torchrun session took {time.monotonic() - started:.1f} s")
    assert sorted(logs) == [0, 1], result.stderr.str()[-4000:]
    assert all("2 passed" in log for log in logs.values())
    assert result.ret == 0
