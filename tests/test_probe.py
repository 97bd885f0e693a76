"""The run probe under ``--gpu-diagnose``, through pytester, on the CPU.

Training loops here run on the CPU: the probe counts steps, times the DataLoader, records devices,
grad mode and backward use, removes every hook after each test, never fails a user's test, and
classifies GPU failures from their text. CUDA-only measurements are in tests/gpu/test_probe_gpu.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_gputrain.probe import module_readings
from pytest_gputrain.probe import run as run_module
from pytest_gputrain.probe.torch_hooks import global_hook_counts

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

TRAIN_LOOP = """
import torch
from torch.utils.data import DataLoader, TensorDataset

def make(batch_size=16, n=256):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(n, 8), torch.randint(0, 2, (n,)))
    return model, optimizer, DataLoader(data, batch_size=batch_size)

def train(model, optimizer, loader, epochs=2):
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            loss.item()
"""


def _facts(pytester: pytest.Pytester) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((pytester.path / "facts.json").read_text())
    return data


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("--gpu-diagnose", "--gpu-facts-out=facts.json",
                              "--gpu-fail-on=never", "-p", "no:cacheprovider", *args)


def _no_hooks_left() -> None:
    counts = global_hook_counts(torch)
    assert counts == {name: 0 for name in counts}, counts


def test_cpu_training_loop_is_recorded(pytester: pytest.Pytester,
                                       use_facts: Callable[..., Any]) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile(helpers=TRAIN_LOOP)
    pytester.makepyfile(test_train="""
        from helpers import make, train

        def test_train():
            model, optimizer, loader = make(batch_size=16, n=256)
            train(model, optimizer, loader, epochs=2)

        def test_not_training():
            assert 1 + 1 == 2
        """)
    result = _run(pytester)
    result.assert_outcomes(passed=2)
    runs = _facts(pytester)["runs"]
    assert [r["nodeid"] for r in runs] == ["test_train.py::test_train"]  # only the trainer
    run = runs[0]
    assert run["steps"] == 32 and run["optimizers"] == ["SGD"]
    assert run["backwards"] == 32
    assert run["device"] == "cpu" and run["param_devices"] == ["cpu"]
    assert run["input_devices"] == ["cpu"] and run["cuda_used"] is False
    assert run["grad_forwards"] == 64  # the model and the loss module, every step
    assert run["forwards_without_backward"] == 0
    assert len(run["step_times"]) == 32 and run["step_time"] > 0
    loader = run["loader"]
    assert loader["batches"] == 32 and loader["epochs"] == 2
    assert loader["num_workers"] == 0 and loader["batch_size"] == 16
    assert loader["pin_memory"] is False and loader["batch_pinned"] is False
    assert loader["wait_total"] > 0 and 0 <= loader["wait_percent"] < 100
    assert run["sync"]["per_step"] == 0  # .item() on CPU tensors is no sync
    assert run["profile"]["captured"] is False and "CUDA" in run["profile"]["reason"]
    result.stdout.fnmatch_lines(["gputrain: 1 training run(s) probed", "*test_train.py::test_*"])
    _no_hooks_left()


def test_hooks_are_installed_during_the_call_and_removed_after(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile(test_hooks="""
        import torch
        from pytest_gputrain.probe.torch_hooks import global_hook_counts

        def test_first():
            counts = global_hook_counts(torch)
            assert counts["_global_optimizer_post_hooks"] == 1
            assert counts["_global_forward_pre_hooks"] == 1
            assert counts["patched_attributes"] >= 10

        def test_second_after_a_training_test():
            model = torch.nn.Linear(2, 2)
            model(torch.zeros(1, 2)).sum().backward()
            assert global_hook_counts(torch)["_global_optimizer_post_hooks"] == 1
        """)
    result = _run(pytester)
    result.assert_outcomes(passed=2)
    _no_hooks_left()
    assert not hasattr(torch.Tensor.item, "_gputrain_probe")
    assert "item" not in vars(torch.Tensor)


def test_without_the_flag_no_hook_is_installed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(helpers=TRAIN_LOOP)
    pytester.makepyfile(test_plain="""
        import torch
        from helpers import make, train

        def test_plain_path(request):
            model, optimizer, loader = make()
            train(model, optimizer, loader, epochs=1)
            from torch.nn.modules import module
            from torch.optim import optimizer as optim_module
            assert not module._global_forward_pre_hooks
            assert not optim_module._global_optimizer_post_hooks
            assert "item" not in vars(torch.Tensor)
            assert not hasattr(torch.autograd.backward, "_gputrain_probe")
            assert not request.config.pluginmanager.has_plugin("gputrain-probe")
        """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    _no_hooks_left()


def test_probe_is_not_imported_without_the_flag(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import sys
        def test_nothing_loaded():
            # The probe's options module is loaded; the probe itself and its facts are not.
            assert "pytest_gputrain.probe.plugin" in sys.modules
            for name in ("pytest_gputrain.probe.run", "pytest_gputrain.probe.torch_hooks",
                         "pytest_gputrain.probe.failures", "pytest_gputrain.probe.facts"):
                assert name not in sys.modules, name
        """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_an_error_inside_the_probe_never_fails_the_test(
        pytester: pytest.Pytester, use_facts: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    use_facts("cpu_laptop")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ZeroDivisionError("probe bug")

    monkeypatch.setattr(module_readings.ModuleWatch, "_record_call", broken)
    monkeypatch.setattr(run_module.LoaderTracker, "on_batch", broken)
    pytester.makepyfile(helpers=TRAIN_LOOP)
    pytester.makepyfile(test_train="""
        from helpers import make, train

        def test_train():
            model, optimizer, loader = make()
            train(model, optimizer, loader, epochs=1)
        """)
    result = _run(pytester)
    result.assert_outcomes(passed=1)
    run = _facts(pytester)["runs"][0]
    assert any("ZeroDivisionError: probe bug" in error for error in run["probe_errors"])
    _no_hooks_left()


def test_a_hook_replaced_by_the_test_is_left_alone(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile(test_patch="""
        import torch

        def test_patches_backward():
            original = torch.autograd.backward
            torch.autograd.backward = lambda *a, **k: original(*a, **k)
            try:
                torch.nn.Linear(2, 1)(torch.ones(1, 2)).sum().backward()
            finally:
                torch.autograd.backward = original
        """)
    result = _run(pytester)
    result.assert_outcomes(passed=1)
    _no_hooks_left()


def test_evaluation_without_no_grad_is_counted(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    use_facts("h200_healthy")
    pytester.makepyfile(helpers=TRAIN_LOOP)
    pytester.makepyfile(test_eval="""
        import torch
        from helpers import make, train

        def evaluate(model, loader):
            model.eval()
            return sum(int((model(x).argmax(1) == y).sum()) for x, y in loader)

        def test_eval_with_grad():
            model, optimizer, loader = make(n=128)
            train(model, optimizer, loader, epochs=1)
            evaluate(model, loader)

        def test_eval_under_no_grad():
            model, optimizer, loader = make(n=128)
            train(model, optimizer, loader, epochs=1)
            with torch.no_grad():
                evaluate(model, loader)
        """)
    result = _run(pytester)
    result.assert_outcomes(passed=2)
    runs = {r["nodeid"].split("::")[1]: r for r in _facts(pytester)["runs"]}
    assert runs["test_eval_with_grad"]["forwards_without_backward"] == 8
    assert runs["test_eval_under_no_grad"]["forwards_without_backward"] == 0
    assert runs["test_eval_under_no_grad"]["no_grad_forwards"] == 8
    result.stdout.fnmatch_lines(
        ["WARNING GT109 eval-without-no-grad: *",
         "    where: test_eval.py::test_eval_with_grad",
         "    8 model forward pass(es) ran with autograd enabled*"])
    assert "where: test_eval.py::test_eval_under_no_grad" not in result.stdout.str()


def test_synthetic_cuda_oom_gets_the_gt201_section(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    use_facts("h200_healthy")
    pytester.makepyfile(test_oom="""
        def test_oom():
            raise RuntimeError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                "139.81 GiB of which 1.50 GiB is free. Including non-PyTorch memory, this process "
                "has 138.00 GiB memory in use. Of the allocated memory 118.00 GiB is allocated "
                "by PyTorch, and 19.50 GiB is reserved by PyTorch but unallocated.")

        def test_plain_failure():
            assert 1 == 2
        """)
    result = _run(pytester, "--gpu-report=report.json")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*- gputrain diagnosis -*",
        "ERROR GT201 cuda-out-of-memory: The test ran out of GPU memory",
        "*trying to allocate 2.0 GiB*",
    ])
    out = result.stdout.str()
    assert "ERROR GT207 oom-fragmentation" in out  # 19.5 GiB free in the cache > 2 GiB asked
    failures = _facts(pytester)["failures"]
    assert [f["nodeid"] for f in failures] == ["test_oom.py::test_oom"]
    assert failures[0]["kind"] == "oom" and failures[0]["requested"] == 2 * 2**30
    findings = json.loads((pytester.path / "report.json").read_text())["findings"]
    mine = {(f["code"], f["subject"]) for f in findings if f["scope"] == "failure"}
    assert mine == {("GT201", "test_oom.py::test_oom"), ("GT207", "test_oom.py::test_oom")}


def test_device_mismatch_names_the_module_and_devices(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    use_facts("h200_healthy")
    pytester.makepyfile(test_mismatch="""
        import torch

        class Head(torch.nn.Linear):
            def forward(self, x):
                raise RuntimeError("Expected all tensors to be on the same device, but found at "
                                   "least two devices, cuda:0 and cpu!")

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.body = torch.nn.Linear(4, 4)
                self.head = Head(4, 2)

            def forward(self, x):
                return self.head(self.body(x))

        def test_mismatch():
            Net()(torch.zeros(3, 4))
        """)
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "ERROR GT202 device-mismatch:*",
        "*Net.head (Head) failed with parameters on cpu and inputs on cpu (the error*",
    ])
    failure = _facts(pytester)["failures"][0]
    assert failure["devices"] == ["cuda:0", "cpu"] and failure["module"] == "Head"


def test_replay_of_recorded_runs_and_failures_gives_the_same_findings(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    use_facts("h200_healthy")
    pytester.makepyfile(helpers=TRAIN_LOOP)
    pytester.makepyfile(test_mix="""
        import torch
        from helpers import make, train

        def test_eval_with_grad():
            model, optimizer, loader = make(n=128)
            train(model, optimizer, loader, epochs=1)
            [model(x) for x, _ in loader]

        def test_oom():
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB.")
        """)
    result = _run(pytester, "--gpu-report=report.json")
    result.assert_outcomes(passed=1, failed=1)
    live = json.loads((pytester.path / "report.json").read_text())["findings"]
    replay = subprocess.run(
        [sys.executable, "-m", "pytest_gputrain", "replay", str(pytester.path / "facts.json"),
         "--format", "json", "--fail-on", "never"], capture_output=True, text=True, check=False)
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout)["findings"] == live
    codes = {(f["code"], f["subject"]) for f in live if f["scope"] in ("run", "failure")}
    assert ("GT109", "test_mix.py::test_eval_with_grad") in codes
    assert ("GT201", "test_mix.py::test_oom") in codes


def test_replay_rejects_malformed_run_facts(tmp_path: Path) -> None:
    data = json.loads((Path(__file__).parent / "facts" / "run_healthy_h200.json").read_text())
    data["runs"][0]["steps"] = "many"
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    replay = subprocess.run([sys.executable, "-m", "pytest_gputrain", "replay", str(path)],
                            capture_output=True, text=True, check=False)
    assert replay.returncode == 2
    assert "invalid run or failure facts at steps" in replay.stderr


def test_xdist_workers_probe_and_send_facts_to_the_controller(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(helpers=TRAIN_LOOP)
    pytester.makepyfile(test_dist="""
        from helpers import make, train

        def test_a():
            model, optimizer, loader = make()
            train(model, optimizer, loader, epochs=1)

        def test_b():
            model, optimizer, loader = make(batch_size=32)
            train(model, optimizer, loader, epochs=1)

        def test_oom():
            raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB.")
        """)
    result = pytester.runpytest_subprocess(
        "--gpu-diagnose", "-n", "2", "--gpu-fail-on=never", "--gpu-facts-out=facts.json",
        "--gpu-report=report.json", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    assert result.stdout.str().count("= gputrain diagnosis =") == 1
    result.stdout.fnmatch_lines(["*- gputrain diagnosis -*", "ERROR GT201 cuda-out-of-memory*"])
    facts = _facts(pytester)
    steps = {r["nodeid"]: r["steps"] for r in facts["runs"]}
    assert steps == {"test_dist.py::test_a": 16, "test_dist.py::test_b": 8}
    assert [f["nodeid"] for f in facts["failures"]] == ["test_dist.py::test_oom"]
    findings = json.loads((pytester.path / "report.json").read_text())["findings"]
    assert ("GT201", "test_dist.py::test_oom") in {(f["code"], f["subject"]) for f in findings}


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu-profile-steps=1-4"], "*--gpu-profile-steps*must start at step 2 or later*"),
    (["--gpu-profile-steps=soon"], "*--gpu-profile-steps*'soon' is not a step range*"),
    (["--gpu-probe=maybe"], "*--gpu-probe*'maybe' must be on or off*"),
])
def test_bad_probe_settings_are_usage_errors(pytester: pytest.Pytester, args: list[str],
                                             message: str) -> None:
    result = pytester.runpytest("--gpu-diagnose", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_probe_off_records_no_runs(pytester: pytest.Pytester,
                                   use_facts: Callable[..., Any]) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile(helpers=TRAIN_LOOP)
    pytester.makepyfile(test_train="""
        from helpers import make, train

        def test_train():
            model, optimizer, loader = make()
            train(model, optimizer, loader, epochs=1)
        """)
    result = _run(pytester, "--gpu-probe=off")
    result.assert_outcomes(passed=1)
    assert _facts(pytester)["runs"] == []
    _no_hooks_left()


def test_compiled_models_train_under_the_probe_without_warnings(pytester: pytest.Pytester) -> None:
    """torch.compile warns when a global module hook exists; the probe's hook is disarmed before
    dynamo looks, whether the model was compiled before the test or inside it."""
    pytester.makepyfile(test_compiled="""
        import torch

        COMPILED_EARLY = torch.compile(torch.nn.Linear(4, 2), backend="eager")

        def train(model, steps=6):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(steps):
                loss = model(torch.ones(8, 4)).square().mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()

        def test_compiled_inside_the_test():
            train(torch.compile(torch.nn.Linear(4, 2), backend="eager"))

        def test_compiled_before_the_test():
            train(COMPILED_EARLY)
        """)
    result = pytester.runpytest_subprocess(
        "--gpu-diagnose", "--gpu-fail-on=never", "--gpu-facts-out=facts.json",
        "-p", "no:cacheprovider", "-W", "error", "-W", "ignore::DeprecationWarning")
    result.assert_outcomes(passed=2)
    runs = {r["nodeid"].split("::")[1]: r for r in _facts(pytester)["runs"]}
    for run in runs.values():
        assert run["steps"] == 6 and run["forwards"] == 6, run
        assert [m["name"] for m in run["modules"]] == ["OptimizedModule"]
        assert run["probe_errors"] == []


def test_a_cpu_parametrized_test_is_recorded_as_such(pytester: pytest.Pytester,
                                                    use_facts: Callable[..., Any]) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile(helpers=TRAIN_LOOP)
    pytester.makepyfile(test_devices="""
        import pytest
        from helpers import make, train

        @pytest.mark.parametrize("device", ["cpu"])
        def test_on(device):
            model, optimizer, loader = make(batch_size=16, n=128)
            train(model.to(device), optimizer, loader, epochs=1)

        def test_plain():
            model, optimizer, loader = make(batch_size=16, n=128)
            train(model, optimizer, loader, epochs=1)
        """)
    result = _run(pytester)
    result.assert_outcomes(passed=2)
    runs = {r["nodeid"]: r for r in _facts(pytester)["runs"]}
    assert runs["test_devices.py::test_on[cpu]"]["cpu_parametrized"] is True
    assert runs["test_devices.py::test_plain"]["cpu_parametrized"] is False
    _no_hooks_left()
