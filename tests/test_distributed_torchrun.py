"""The same launches under torchrun: pytest runs on every rank torchrun started (CPU, gloo).

torchrun --standalone on one host goes through the same code as several hosts (torchrun's
rendezvous store, RANK/WORLD_SIZE/LOCAL_RANK), so this is the CPU proof of the multi-host path.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

dist = pytest.importorskip("torch.distributed")
pytest.importorskip("torch.distributed.elastic.multiprocessing")

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is needed")

UNCHANGED_TESTS = textwrap.dedent("""
    import os
    import time

    import pytest
    import torch
    import torch.distributed as dist

    from pytest_gputrain.distributed import RankFailure, RankTimeout, run_ranks


    def identify(tag):
        value = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(value)
        return dist.get_rank(), dist.get_world_size(), tag, value.item(), os.getpid()


    def fail_on_rank_1():
        if dist.get_rank() == 1:
            raise ValueError("bad batch on rank 1")
        return "ok"


    def late_rank_1():
        if dist.get_rank() == 1:
            time.sleep(8)
        return dist.get_rank()


    def test_every_rank_gets_every_result():
        results = run_ranks(identify, world_size=2, args=("a",), timeout=60)
        assert [r[:4] for r in results] == [(0, 2, "a", 3.0), (1, 2, "a", 3.0)]
        assert results[int(os.environ["RANK"])][4] == os.getpid()  # ran in this process


    def test_each_launch_has_a_group_of_its_own(distributed):
        results = distributed.run(identify, world_size=2, args=("b",))
        assert [r[:4] for r in results] == [(0, 2, "b", 3.0), (1, 2, "b", 3.0)]
        assert distributed.last.record.launcher == "torchrun"
        assert not dist.is_initialized()


    def test_every_rank_raises_for_the_rank_that_failed():
        with pytest.raises(RankFailure) as caught:
            run_ranks(fail_on_rank_1, world_size=2, timeout=60)
        assert caught.value.rank == 1
        assert str(caught.value).startswith(
            "rank 1 of 2 (backend gloo) failed: ValueError: bad batch on rank 1")
        assert "rank 1 traceback:" in str(caught.value)


    @pytest.mark.distributed(world_size=2)
    def test_marked_body_runs_on_each_rank():
        value = torch.ones(1)
        dist.all_reduce(value)
        assert value.item() == 2


    def test_a_launch_of_another_size_is_skipped():
        run_ranks(identify, world_size=3, args=("c",))


    def test_a_late_rank_is_named_with_its_stack():
        if os.environ["RANK"] == "0":
            with pytest.raises(RankTimeout) as caught:
                run_ranks(late_rank_1, world_size=2, timeout=3)
            text = str(caught.value)
            assert caught.value.stuck_ranks == [1], text
            assert ("rank 1: still running: running the function, not in a collective"
                    in text), text
            assert "in late_rank_1" in text and "pluggy" not in text, text
        else:  # its result came after rank 0 had reported; its own launch saw everyone's
            assert run_ranks(late_rank_1, world_size=2, timeout=3) == [0, 1]
""")


def test_the_same_tests_run_on_torchrun_ranks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_unchanged=UNCHANGED_TESTS)
    result = pytester.run(
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "--log-dir=logs", "--redirects=3", "-m", "pytest", "-p", "no:cacheprovider",
        "-p", "pytest_gputrain.distributed.plugin", "-rA", "test_unchanged.py", timeout=300)
    logs = {int(path.parent.name): path.read_text()
            for path in Path(pytester.path, "logs").glob("*/attempt_0/*/stdout.log")}
    assert sorted(logs) == [0, 1], result.stderr.str()
    for rank, log in logs.items():
        assert "5 passed, 1 skipped" in log, f"rank {rank}:\n{log}"
        assert "under a torchrun of 2 ranks: a launch runs on torchrun's ranks" in log
    assert result.ret == 0
