"""Distributed tests under --gpu-diagnose, through pytester, on the CPU (gloo ranks).

The plugin is loaded with ``-p pytest_gputrain.distributed.plugin`` (harmless once plugin.py
lists it in ``pytest_plugins``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("torch.distributed")

PLUGIN = ("-p", "pytest_gputrain.distributed.plugin")
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

TRAINING = textwrap.dedent("""
    import time

    import pytest
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel


    def train(sleep_rank, sleep_s, batch_by_rank, steps=12):
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(32, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        rank = dist.get_rank()
        for _ in range(steps):
            if rank == sleep_rank:
                time.sleep(sleep_s)  # slow data loading on one rank
            x = torch.randn(batch_by_rank[rank], 32)
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return rank


    def test_straggler(distributed):
        assert distributed.run(train, world_size=2, args=(1, 0.05, [16, 16])) == [0, 1]


    def test_balanced(distributed):
        distributed.run(train, world_size=2, args=(-1, 0.0, [16, 16]))


    def test_unbalanced(distributed):
        distributed.run(train, world_size=2, args=(-1, 0.0, [16, 8]))
""")


def _codes_by_test(report: dict[str, Any]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for finding in report["findings"]:
        if finding["scope"] == "distributed":
            test = finding["subject"].split("::")[-1].split(" ")[0]
            found.setdefault(test, set()).add(finding["code"])
    return found


def test_straggler_and_unbalanced_batches_are_diagnosed(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile(test_training=TRAINING)
    result = pytester.runpytest("--gpu-diagnose", "--gpu-report=report.json",
                                "--gpu-facts-out=facts.json", "--gpu-fail-on=never", "-rA",
                                *PLUGIN)
    result.assert_outcomes(passed=3)
    report = json.loads((pytester.path / "report.json").read_text())
    # The launches are recorded facts: a replay anywhere gives the same findings.
    replayed = subprocess.run(
        [sys.executable, "-m", "pytest_gputrain", "replay", str(pytester.path / "facts.json"),
         "--format", "json", "--fail-on", "never"], capture_output=True, text=True, check=True)
    assert json.loads(replayed.stdout)["findings"] == report["findings"]
    codes = _codes_by_test(report)
    assert "GT301" in codes.get("test_straggler", set())
    assert "GT301" not in codes.get("test_balanced", set())
    assert "GT302" not in codes.get("test_balanced", set())
    assert "GT302" in codes.get("test_unbalanced", set())
    (straggler,) = [f for f in report["findings"]
                    if f["code"] == "GT301" and "test_straggler" in f["subject"]]
    assert straggler["subject"].endswith("test_straggler [2 ranks, gloo]")
    assert straggler["message"].startswith("Rank 1 is a straggler")
    evidence = {item["name"]: item["value"] for item in straggler["evidence"]}
    assert evidence["dist.straggler_rank"] == 1
    busy = evidence["dist.busy_time_medians"]
    assert busy[1] > 0.04 > busy[0], busy  # rank 1 sleeps 50 ms; rank 0 waits for it instead
    launches = report["sections"]["distributed"]
    assert {launch["test"].split("::")[-1] for launch in launches} == {
        "test_straggler", "test_balanced", "test_unbalanced"}
    assert all(launch["probe"] and launch["ddp_used"] for launch in launches)
    # The passed test's report carries the diagnosis section (shown by -rA): the findings as
    # the probe's are written, then the launch.
    result.stdout.fnmatch_lines([
        "*- gputrain diagnosis -*", "WARNING GT301 straggler-rank: *", "    Rank 1 is a straggler*",
        "", "launch: 2 rank(s), backend gloo, passed in *", "  rank 0 | cpu | ok | 12 steps*",
        "  rank 1 | cpu | ok | 12 steps*", "", "details: python -m pytest_gputrain explain CODE"])


FAILING = textwrap.dedent("""
    import time

    import pytest
    import torch
    import torch.distributed as dist


    def skip_a_collective():
        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(1))
        else:
            time.sleep(60)


    def test_desync(distributed):
        distributed.run(skip_a_collective, world_size=2, timeout=30, collective_timeout=3)


    @pytest.mark.distributed(world_size=2, backend="gloo", timeout=60)
    def test_marked_body_runs_on_every_rank(tmp_path):
        value = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(value)
        assert value.item() == 3
        (tmp_path / f"rank{dist.get_rank()}").write_text("ran")


    @pytest.mark.distributed(world_size=2)
    def test_marked_body_fails_on_one_rank():
        assert dist.get_rank() == 0, "rank 1 disagrees"
""")


def test_collective_failure_is_diagnosed_on_the_failing_test(
    pytester: pytest.Pytester, use_facts: Callable[..., Any]
) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile(test_failing=FAILING)
    result = pytester.runpytest("--gpu-diagnose", "--gpu-report=report.json", *PLUGIN)
    result.assert_outcomes(passed=1, failed=2)
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*rank 0 of 2 (backend gloo) failed: RuntimeError: *Timed out waiting 3000ms*",
        "*- gputrain diagnosis -*",
        "ERROR GT308 collective-failed-or-hung: *",
    ])
    section = result.stdout.str().split("- gputrain diagnosis -", 1)[1]
    # The message is wrapped: read it as one line.
    assert "rank 1 (0 call(s)) never entered all_reduce #1" in " ".join(section.split())
    result.stdout.fnmatch_lines([
        "*rank 1 of 2 (backend gloo) failed: AssertionError: rank 1 disagrees*",
    ])
    report = json.loads((pytester.path / "report.json").read_text())
    assert _codes_by_test(report) == {"test_desync": {"GT308"}}
    basetemp = pytester.path.parent / "basetemp"  # where pytester's in-process runs put tmp_path
    assert len(list(basetemp.glob("test_marked_body_runs_on_every0/rank*"))) == 2


def test_diagnosis_off_records_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_failing=FAILING.split("@pytest.mark")[0])
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(failed=1)
    assert "gputrain diagnosis" not in result.stdout.str()


def test_xdist_worker_facts_reach_the_controller(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_training=TRAINING.split("def test_balanced")[0])
    result = pytester.runpytest_subprocess(
        "-n", "1", "--gpu-diagnose", "--gpu-report=report.json", "--gpu-fail-on=never",
        "--gpu-select=GT3", "-p", "pytest_gputrain.distributed.plugin")
    result.assert_outcomes(passed=1)
    report = json.loads((pytester.path / "report.json").read_text())
    assert "GT301" in _codes_by_test(report).get("test_straggler", set())
