"""Multi-GPU facts and rules without processes: analysis of rank records, topology, vocabulary.

The GT3xx rule cases themselves live in tests/rule_cases/GT3NN.toml (test_rules_catalogue.py).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from pytest_gputrain.collect.nvml import Nvml
from pytest_gputrain.collect.topology import read_topology, topology_indices
from pytest_gputrain.distributed import analysis
from pytest_gputrain.distributed.facts import DistributedRunFacts
from pytest_gputrain.engine.evaluate import RuleEngine
from pytest_gputrain.engine.vocabulary import scope_names
from pytest_gputrain.facts import (
    DeviceFacts,
    EnvironmentFacts,
    nccl_fast_paths_disabled,
    session_namespace,
)

# --------------------------------------------------------------------------------------------
# Step times: the straggler shows in busy time, not in step time


def _ddp_like(steps: int, sleep_rank: int, sleep: float, compute: float) -> dict[int, Any]:
    """Two lock-stepped ranks: rank `sleep_rank` arrives `sleep` late at every all-reduce."""
    probes: dict[int, dict[str, Any]] = {0: {"step_ends": [], "arrivals": {}},
                                         1: {"step_ends": [], "arrivals": {}}}
    now = 100.0
    for k in range(steps):
        for rank in (0, 1):
            late = sleep if rank == sleep_rank else 0.0
            probes[rank]["arrivals"][str(k)] = now + late + compute / 2
        now += sleep + compute  # everyone leaves the all-reduce with the last rank
        for rank in (0, 1):
            probes[rank]["step_ends"].append(now)
    return probes


def test_lock_stepped_straggler_has_equal_step_times_but_longer_busy_time() -> None:
    result = analysis.step_analysis(_ddp_like(10, sleep_rank=1, sleep=0.05, compute=0.01))
    assert result["steps"] == [10, 10]
    step0, step1 = result["step_time_medians"]
    assert step0 == pytest.approx(0.06) and step1 == pytest.approx(0.06)
    busy0, busy1 = result["busy_time_medians"]
    assert busy0 == pytest.approx(0.01) and busy1 == pytest.approx(0.06)
    assert result["straggler_rank"] == 1 and result["fastest_rank"] == 0
    assert result["straggler_ratio"] == pytest.approx(6.0)
    assert result["straggler_excess"] == pytest.approx(0.05)
    assert result["wait_fractions"][0] == pytest.approx(5 / 6)


def test_balanced_ranks_are_not_stragglers() -> None:
    result = analysis.step_analysis(_ddp_like(10, sleep_rank=-1, sleep=0.0, compute=0.01))
    assert result["straggler_ratio"] == pytest.approx(1.0)


def test_without_arrivals_busy_time_is_step_time() -> None:
    probes = {0: {"step_ends": [0.0, 1.0, 2.0, 3.0]}, 1: {"step_ends": [0.0, 2.0, 4.0, 6.0]}}
    result = analysis.step_analysis(probes)
    assert result["busy_time_medians"] == [1.0, 2.0]
    assert result["straggler_rank"] == 1


def test_no_steps_means_unknown() -> None:
    result = analysis.step_analysis({0: {}, 1: {}})
    assert result["straggler_ratio"] is None
    assert result["min_steps"] == 0


def test_batches_from_ddp_forwards_before_dataloader() -> None:
    probes = {0: {"forward_batches": [32, 32, 32], "loader_batches": [64]},
              1: {"forward_batches": [16, 16, 16], "loader_batches": [64]}}
    result = analysis.batch_analysis(probes)
    assert result["batch_source"] == "ddp_forward"
    assert result["samples"] == [96, 48]
    assert result["sample_ratio"] == 2.0
    assert result["batch_size_ratio"] == 2.0
    assert analysis.batch_analysis({0: {}, 1: {}})["samples"] is None


# --------------------------------------------------------------------------------------------
# Failures

WATCHDOG = ("[rank0]:[E1129 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, "
            "NumelIn=4, NumelOut=4, Timeout(ms)=20000) ran for 20081 milliseconds before timing "
            "out.")


def test_watchdog_line_is_parsed() -> None:
    found = analysis.parse_watchdog("noise\n" + WATCHDOG + "\nmore")
    assert found is not None
    assert (found["rank"], found["op"], found["seq"]) == (0, "ALLREDUCE", 3)
    assert found["timeout_s"] == 20.0 and found["ran_s"] == pytest.approx(20.081)
    assert analysis.parse_watchdog("RuntimeError: boom") is None


@pytest.mark.parametrize(("text", "phase", "kind"), [
    (WATCHDOG, "running", "nccl_timeout"),
    ("torch.distributed.DistBackendError: NCCL error in: ... ncclUnhandledCudaError", "running",
     "nccl_error"),
    ("RuntimeError: ... Timed out waiting 3000ms for recv operation to complete", "running",
     "collective_timeout"),
    ("RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer", "running",
     "peer_failure"),
    ("torch.distributed.DistNetworkError: The server socket has failed to listen", "init",
     "init_failure"),
    ("ValueError: bad batch", "running", "exception"),
])
def test_failures_are_classified(text: str, phase: str, kind: str) -> None:
    assert analysis.classify_failure(text, phase) == kind


def test_crash_without_exception() -> None:
    assert analysis.classify_failure("", None, -6, has_exception=False) == "crash"
    assert analysis.describe_exit(-6) == "killed by SIGABRT"
    assert analysis.describe_exit(3) == "exit code 3"


def test_desync_names_the_rank_that_never_entered() -> None:
    statuses = {0: {"collectives": {"all_reduce": 3}, "op": "all_reduce", "op_since": 10.0},
                1: {"collectives": {"all_reduce": 2}}}
    text = analysis.collective_desync(statuses, now=40.0)
    assert text == ("rank 1 (2 call(s)) never entered all_reduce #3 while rank 0 waited "
                    "30.0 s in it")
    watchdog = analysis.parse_watchdog(WATCHDOG)
    statuses[0] = {"collectives": {"all_reduce": 3}}
    assert analysis.collective_desync(statuses, 40.0, watchdog) == (
        "rank 1 (2 call(s)) never entered all_reduce #3 while rank 0 waited 20.1 s for it "
        "(NCCL watchdog)")
    assert analysis.collective_desync({0: {"collectives": {"barrier": 1}},
                                       1: {"collectives": {"barrier": 1}}}, 1.0) is None


def test_main_thread_stack_is_read_from_a_faulthandler_dump() -> None:
    dump = (
        "Thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
        '  File "/x/pytest_gputrain/distributed/instrument.py", line 90 in beat\n'
        "\n"
        "Current thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
        '  File "/x/pytest_gputrain/distributed/instrument.py", line 164 in wrapper\n'
        '  File "/proj/test_train.py", line 12 in step\n'
        '  File "<string>", line 1 in <module>\n'
    )
    frames = analysis.main_thread_frames(dump, 0x7F0000000001)
    assert len(frames) == 4
    assert analysis.user_frames(frames) == [
        "/usr/lib/torch/distributed/distributed_c10d.py:3252 in all_reduce",
        "/proj/test_train.py:12 in step",
    ]


# --------------------------------------------------------------------------------------------
# Topology


class _NotSupported(Exception):
    def __str__(self) -> str:
        return "Not Supported"


class FakeNvml:
    """Answers the NVML topology calls for GPUs connected as the test says."""

    def __init__(self, count: int, ancestor: dict[tuple[int, int], int],
                 p2p: dict[tuple[int, int], int], nvlink: dict[tuple[int, int], bool] | None,
                 links: int | None) -> None:
        self.count, self.ancestor, self.p2p, self.nvlink, self.links = (
            count, ancestor, p2p, nvlink, links)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index >= self.count:
            raise _NotSupported
        return index

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return self.ancestor[(a, b)]

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        if index == 2:
            if self.nvlink is None:
                raise _NotSupported
            return 0 if self.nvlink[(a, b)] else 5
        return self.p2p[(a, b)]

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if self.links is None:
            raise _NotSupported
        if link >= 18:
            raise _NotSupported
        return 1 if link < self.links else 0


def fake_session(fake: FakeNvml) -> Nvml:
    session = Nvml()
    session._initialised = True
    session._module = fake
    return session


def test_topology_of_two_nvlinked_gpus() -> None:
    fake = FakeNvml(2, {(0, 1): 50}, {(0, 1): 0}, {(0, 1): True}, links=18)
    facts = read_topology([0, 1], fake_session(fake))
    assert facts.pair_count == 1
    assert facts.pairs is not None
    pair = facts.pairs[0]
    assert (pair.common_ancestor, pair.p2p_read, pair.p2p_nvlink) == ("system", "ok", True)
    assert facts.nvlink_active_links == [18, 18]
    assert facts.nvlink_pair_count == 1
    assert facts.gpu_pairs_without_p2p == []
    assert facts.gpu_pairs_over_system == []  # NVLink, so the PCIe path does not matter


def test_topology_of_a_vm_without_peer_to_peer() -> None:
    fake = FakeNvml(2, {(0, 1): 50}, {(0, 1): 3}, None, links=None)
    facts = read_topology([0, 1], fake_session(fake))
    assert facts.gpu_pairs_without_p2p == ["0-1"]
    assert facts.gpu_pairs_over_system == ["0-1"]
    assert facts.nvlink_pair_count is None
    assert facts.unknown["nvlink_pair_count"] == "Not Supported"
    assert facts.nvlink_active_links == [None, None]
    env = EnvironmentFacts(topology=facts)
    findings = RuleEngine.load().evaluate_environment(env)
    assert [f.code for f in findings if f.code.startswith("GT3")] == ["GT307"]


def test_topology_one_gpu_and_no_nvml() -> None:
    one = read_topology([0], fake_session(FakeNvml(1, {}, {}, None, None)))
    assert one.pair_count == 0 and one.gpu_pairs_without_p2p == []
    missing = Nvml()
    missing._initialised = True
    missing.reason = "NVML not found"
    none = read_topology([0, 1], missing)
    assert none.pair_count is None and none.unknown["pair_count"] == "NVML not found"


def test_topology_covers_the_gpus_torch_sees() -> None:
    devices = [DeviceFacts(index=0), DeviceFacts(index=1, torch_index=0),
               DeviceFacts(index=2, torch_index=1)]
    assert topology_indices(devices) == [1, 2]
    assert topology_indices([DeviceFacts(index=0), DeviceFacts(index=1)]) == [0, 1]


# --------------------------------------------------------------------------------------------
# Vocabulary and derived session names


def test_nccl_variables_are_read_as_nccl_reads_them() -> None:
    assert nccl_fast_paths_disabled({
        "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "true", "NCCL_IB_DISABLE": "0",
        "NCCL_NET_GDR_LEVEL": "loc", "NCCL_NVLS_ENABLE": "0", "NCCL_P2P_LEVEL": "NVL",
    }) == ["NCCL_P2P_DISABLE=1 (GPU peer-to-peer (NVLink/PCIe) off)",
           "NCCL_NET_GDR_LEVEL=loc (GPUDirect RDMA off)"]


def test_session_names_for_multi_gpu_rules() -> None:
    env = EnvironmentFacts(devices=[DeviceFacts(index=0, torch_index=0, name="A"),
                                    DeviceFacts(index=1, name="B")])
    env.env.nccl_variables = {"NCCL_IB_DISABLE": "1"}
    names = session_namespace(env)
    assert names["devices.torch_names"][0] == ["A"]
    assert names["devices.names"][0] == ["A", "B"]
    assert names["env.nccl_fast_paths_disabled"][0] == [
        "NCCL_IB_DISABLE=1 (InfiniBand/RoCE off: sockets between hosts)"]
    assert "topology.gpu_pairs_without_p2p" in names


def test_distributed_scope_names() -> None:
    names = scope_names("distributed")
    assert {"dist.straggler_ratio", "dist.failure_kind", "dist.ranks", "env.nccl_variables",
            "devices.torch_names"} <= names
    assert DistributedRunFacts().model_dump()["launcher"] == "run_ranks"


def test_multi_gpu_rules_have_their_scopes() -> None:
    rules = {rule.code: rule for rule in RuleEngine.load().rules if rule.code.startswith("GT3")}
    session = {"GT305", "GT306", "GT307"}
    run = {"GT309", "GT310", "GT311"}  # judged per test, from the run probe's facts
    assert sorted(rules) == sorted({f"GT30{n}" for n in range(1, 9)} | run)
    for code, rule in rules.items():
        expected = "session" if code in session else "run" if code in run else "distributed"
        assert rule.scope == expected, code


def test_cli_lists_the_distributed_names() -> None:
    out = subprocess.run([sys.executable, "-m", "pytest_gputrain", "facts", "--scope",
                          "distributed"], capture_output=True, text=True, check=True).stdout
    assert "dist.straggler_ratio" in out and "dist.failure_summary" in out
    out = subprocess.run([sys.executable, "-m", "pytest_gputrain", "explain", "GT301"],
                         capture_output=True, text=True, check=True).stdout
    assert "scope: distributed" in out
