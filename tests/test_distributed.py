"""The multi-rank launcher on the CPU (gloo): results, failures, hangs, and no leftover processes.

Rank functions live at module level: each rank process imports this module by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from pytest_gputrain.distributed import (  # noqa: E402
    DistributedSetupError,
    RankFailure,
    RankFunctionNotPicklable,
    RankTimeout,
    launch,
    run_ranks,
)

pytest_plugins = ("pytest_gputrain.distributed.plugin",)

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is needed")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_all_gone(pids: list[int]) -> None:
    # Generous: on a loaded 2-core CI machine reaping killed processes can take seconds.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    assert not [pid for pid in pids if alive(pid)], "processes outlived the launch"


# --------------------------------------------------------------------------------------------
# Rank functions


def identify(tag: str) -> tuple[int, int, str, float, str]:
    value = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(value)
    return dist.get_rank(), dist.get_world_size(), tag, value.item(), os.environ["LOCAL_RANK"]


def say_hello() -> None:
    print(f"hello from rank {dist.get_rank()}")


def fail_on_rank_1() -> str:
    if dist.get_rank() == 1:
        raise ValueError(f"bad batch on rank {dist.get_rank()}")
    return "ok"


def hang_rank_1(pid_file: str) -> None:
    if dist.get_rank() == 1:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
        Path(pid_file).write_text(str(child.pid))
        time.sleep(1000)
    dist.all_reduce(torch.ones(1))


def leave_a_child_behind() -> int:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"]).pid


def skip_all_reduce_on_rank_1() -> None:
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))
    else:
        time.sleep(1000)


def abort_rank_1() -> None:
    if dist.get_rank() == 1:
        os.abort()
    time.sleep(0.5)


def tensors() -> dict[str, Any]:
    model = torch.nn.Linear(3, 2)
    return {"rank": torch.tensor([dist.get_rank()]), "state": model.state_dict()}


def unpicklable_result() -> Any:
    return threading.Lock()


def skip_in_rank() -> None:
    pytest.skip("needs a dataset that is not here")


def env_and_own_group() -> tuple[str, str, int]:
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    dist.destroy_process_group()
    return os.environ["MY_SETTING"], os.environ["MASTER_ADDR"], rank


def nested_launch() -> None:
    run_ranks(identify, world_size=1, args=("nested",))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                          torch.nn.Linear(16, 1))

    def forward(self, x: Any) -> Any:
        return self.layers(x)


def train_ddp(steps: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)  # same initial weights; DDP broadcasts rank 0's anyway
    model = DistributedDataParallel(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1 + dist.get_rank())  # different data per rank
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 8, generator=generator)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    checksum = sum(p.detach().sum().item() for p in model.parameters())
    return {"losses": losses, "checksum": checksum}


# --------------------------------------------------------------------------------------------
# Results


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_results_come_back_in_rank_order(world_size: int) -> None:
    results = run_ranks(identify, world_size=world_size, args=("t",), timeout=60)
    total = world_size * (world_size + 1) / 2
    assert results == [(rank, world_size, "t", total, str(rank)) for rank in range(world_size)]


def test_tensors_come_back_to_the_launcher() -> None:
    results = run_ranks(tensors, world_size=2, timeout=60)
    assert [r["rank"].item() for r in results] == [0, 1]
    assert set(results[0]["state"]) == {"weight", "bias"}
    assert results[0]["state"]["weight"].device.type == "cpu"


def test_environment_and_a_group_of_the_function_own() -> None:
    launched = launch(env_and_own_group, world_size=2, init_process_group=False, timeout=60,
                      env={"MY_SETTING": "x", "NCCL_DEBUG": "WARN", "NCCL_IB_SECRET": "hush"})
    assert launched.results == [("x", "127.0.0.1", 0), ("x", "127.0.0.1", 1)]
    # The record keeps the NCCL variables the ranks ran with, others' values redacted.
    assert launched.record is not None
    assert launched.record.nccl_env["NCCL_DEBUG"] == "WARN"
    assert launched.record.nccl_env["NCCL_IB_SECRET"] == "<redacted>"
    assert [r.outcome for r in launched.record.ranks] == ["ok", "ok"]


def test_rank_output_is_echoed_with_the_rank(capsys: pytest.CaptureFixture[str]) -> None:
    launched = launch(say_hello, world_size=2, timeout=60)
    assert launched.backend == "gloo" and launched.world_size == 2
    assert launched.results == [None, None]
    out = capsys.readouterr().out
    assert "[rank 0] hello from rank 0" in out
    assert "[rank 1] hello from rank 1" in out
    assert "hello from rank 1" in launched.outputs[1]
    assert_all_gone(launched.pids)


def test_the_callers_signal_handlers_are_kept() -> None:
    # torch elastic installs torchrun's handlers when it starts processes; pytest keeps its own.
    signals = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
               if hasattr(signal, name)]
    before = [signal.getsignal(number) for number in signals]
    assert run_ranks(identify, world_size=1, args=("s",), timeout=60)[0][:3] == (0, 1, "s")
    assert [signal.getsignal(number) for number in signals] == before


def test_processes_a_rank_leaves_behind_are_killed() -> None:
    launched = launch(leave_a_child_behind, world_size=2, timeout=60)
    assert_all_gone([*launched.pids, *launched.results])


# --------------------------------------------------------------------------------------------
# Failures


def test_rank_exception_names_the_rank_and_shows_its_traceback() -> None:
    with pytest.raises(RankFailure) as caught:
        run_ranks(fail_on_rank_1, world_size=2, timeout=60)
    error = caught.value
    assert error.rank == 1
    assert error.kind == "exception"
    assert error.exc_type == "ValueError"
    assert error.world_size == 2 and error.backend == "gloo"
    text = str(error)
    assert text.startswith("rank 1 of 2 (backend gloo) failed: ValueError: bad batch on rank 1")
    assert "in fail_on_rank_1" in text
    assert 'raise ValueError(f"bad batch on rank {dist.get_rank()}")' in text
    assert "rank 0: finished" in text
    assert "rank_main.py" not in text  # the launcher's own frames are left out
    assert "elastic" not in text  # and so is torch elastic's record(), which runs the rank
    record = error.record
    assert record.failed_rank == 1
    assert [(r.outcome, r.exit_code) for r in record.ranks] == [("ok", 0), ("failed", 3)]
    assert record.ranks[1].error.phase == "running"
    assert_all_gone(error.pids)


def test_hang_becomes_a_timeout_and_nothing_is_left_running(tmp_path: Path) -> None:
    # The timeout covers the ranks' start too (importing torch, joining the process group),
    # which on a loaded machine takes many seconds: a launch that returns at once measures it
    # now, and the hang gets several times that, so that both ranks are in place when it ends.
    warm_up = time.monotonic()
    run_ranks(identify, world_size=2, args=("start-up",), timeout=300)
    start_up = time.monotonic() - warm_up
    timeout = max(8, round(3 * start_up))
    pid_file = tmp_path / "grandchild.pid"
    started = time.monotonic()
    with pytest.raises(RankTimeout) as caught:
        run_ranks(hang_rank_1, world_size=2, args=(str(pid_file),), timeout=timeout,
                  collective_timeout=300)
    elapsed = time.monotonic() - started
    # Ended by the launch's timeout, not the collective's 300 s.
    assert elapsed < timeout + 6 + start_up, f"took {elapsed:.1f} s for a timeout of {timeout} s"
    error = caught.value
    assert error.stuck_ranks == [0, 1]
    assert error.kind == "hang"
    text = str(error)
    assert f"still running after the {timeout} s timeout" in text
    assert "rank 0: killed: in all_reduce #1" in text
    assert "rank 1: killed: running the function, not in a collective" in text
    assert "in hang_rank_1" in text  # rank 1's stack, dumped before the kill
    assert "rank 1 (0 call(s)) never entered all_reduce #1 while rank 0 waited" in text
    record = error.record
    assert record.timed_out and record.stuck_ranks == [0, 1]
    assert record.ranks[0].status["op"] == "all_reduce"
    assert any("in hang_rank_1" in frame for frame in record.ranks[1].stack)
    grandchild = int(pid_file.read_text())
    assert_all_gone([*error.pids, grandchild])


def test_collective_timeout_fails_the_waiting_rank_and_names_the_missing_one() -> None:
    with pytest.raises(RankFailure) as caught:
        run_ranks(skip_all_reduce_on_rank_1, world_size=2, timeout=40, collective_timeout=3)
    error = caught.value
    assert not isinstance(error, RankTimeout)
    assert error.rank == 0
    assert error.kind == "collective_timeout"
    text = str(error)
    assert "Timed out waiting 3000ms" in text
    assert "rank 1: was still running, killed" in text
    assert "rank 1 (0 call(s)) never entered all_reduce #1" in text
    assert_all_gone(error.pids)


def test_crash_without_a_python_exception_shows_the_stack() -> None:
    with pytest.raises(RankFailure) as caught:
        run_ranks(abort_rank_1, world_size=2, timeout=60)
    error = caught.value
    assert error.rank == 1
    assert error.kind == "crash"
    assert error.exit_code == -signal.SIGABRT
    text = str(error)
    assert "without a Python exception (killed by SIGABRT)" in text
    assert "in abort_rank_1" in text


def test_unpicklable_result_is_explained() -> None:
    with pytest.raises(RankFailure, match="return value could not be pickled"):
        run_ranks(unpicklable_result, world_size=1, timeout=60)


def test_skip_inside_a_rank_skips_the_test() -> None:
    with pytest.raises(pytest.skip.Exception, match="needs a dataset"):
        run_ranks(skip_in_rank, world_size=2, timeout=60)


def test_nested_launch_is_refused() -> None:
    with pytest.raises(RankFailure, match="called inside a rank process"):
        run_ranks(nested_launch, world_size=1, timeout=60)


# --------------------------------------------------------------------------------------------
# Usage errors: raised before any process starts


def test_lambda_and_nested_functions_are_refused_with_advice() -> None:
    def local() -> None:
        pass

    for fn in (lambda: None, local):
        with pytest.raises(RankFunctionNotPicklable, match="defined at module level"):
            run_ranks(fn, world_size=2)


def test_unpicklable_argument_is_named() -> None:
    with pytest.raises(RankFunctionNotPicklable, match=r"args\[0\] \(lock\) cannot be pickled"):
        run_ranks(identify, world_size=2, args=(threading.Lock(),))


def test_bad_world_size_and_backend() -> None:
    with pytest.raises(DistributedSetupError, match="world_size must be a positive integer"):
        run_ranks(identify, world_size=0)
    if not torch.cuda.is_available():
        with pytest.raises(DistributedSetupError, match="'nccl'"):
            run_ranks(identify, world_size=2, backend="nccl")


# --------------------------------------------------------------------------------------------
# Training, and the launcher dying


def test_ddp_training_on_two_gloo_ranks(distributed: Any) -> None:
    results = distributed.run(train_ddp, world_size=2, args=(6,), timeout=90)
    assert len(results) == 2
    # DDP averages the gradients: both replicas end with the same weights.
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"], rel=1e-6)
    assert results[0]["losses"] != results[1]["losses"]  # each rank saw its own data
    assert distributed.last.backend == "gloo"


def test_ranks_die_with_their_launcher(tmp_path: Path) -> None:
    script = tmp_path / "launcher_script.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import test_distributed as t
        from pytest_gputrain.distributed import run_ranks
        if __name__ == "__main__":
            run_ranks(t.hang_rank_1, world_size=2, args=({str(tmp_path / "g.pid")!r},),
                      timeout=600, collective_timeout=600)
    """))
    launcher = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    deadline = time.monotonic() + 60
    ranks: list[psutil.Process] = []
    while time.monotonic() < deadline:
        ranks = psutil.Process(launcher.pid).children()
        if len(ranks) == 2 and (tmp_path / "g.pid").exists():
            break
        time.sleep(0.2)
    assert len(ranks) == 2, "the ranks did not start"
    grandchild = int((tmp_path / "g.pid").read_text())
    launcher.kill()
    launcher.wait()
    # The ranks get SIGKILL from the kernel (parent-death signal) or exit from their heartbeat.
    # The grandchild is the rank's own business, as with any process the rank starts: it is
    # orphaned, not killed, unless the launcher lived to kill the rank's process group.
    assert_all_gone([rank.pid for rank in ranks])
    with contextlib.suppress(OSError):
        os.kill(grandchild, signal.SIGKILL)
