"""The frameworks a run trains through, as the probe sees them, on the CPU.

The pure parts: which package a call site belongs to, which framework drives a loop, the syncs a
framework's own code asks for (counted by the sync wrappers from a call site inside
``transformers``: a fake CUDA tensor stands in for the GPU), and the tokens of a batch of token
ids. Then the framework samples' own training code (sample_projects/pipelines/lightning_*,
hf_trainer_*) runs on the CPU under a real probe, shrunk: the probe sees the framework's steps,
forwards and backwards, and which framework drove them. Those tests skip without the frameworks
(``pip install 'pytest-gputrain[frameworks]'``); on the GPU the samples run whole
(tests/gpu/test_sample_pipelines_gpu.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
from probed_run import probed
from sample_modules import load_sample

from pytest_gputrain.collect import sync_calls
from pytest_gputrain.probe import frameworks
from pytest_gputrain.probe.facts import RunFacts
from pytest_gputrain.probe.loader import LoaderTracker, token_count
from pytest_gputrain.probe.run_record import LoaderWaits, RunRecord, StepSeries, SyncCounts
from pytest_gputrain.probe.window_facts_builder import sync_facts


def _frame_in(module: str, body: str = "frame = sys._getframe()") -> FrameType:
    """A frame of code that runs as module ``module`` (its globals' ``__name__``)."""
    scope: dict[str, Any] = {"__name__": module, "sys": sys}
    exec(compile(body, f"<{module}>", "exec"), scope)
    frame = scope["frame"]
    assert isinstance(frame, FrameType)
    return frame


def test_packages_name_their_framework() -> None:
    assert frameworks.package_framework("transformers.trainer") == "transformers"
    assert frameworks.package_framework("pytorch_lightning.loops.fit_loop") == "lightning"
    assert frameworks.package_framework("lightning.pytorch.trainer") == "lightning"
    assert frameworks.package_framework("lightning_fabric.utilities.apply_func") == "lightning"
    assert frameworks.package_framework("accelerate.accelerator") == "accelerate"
    assert frameworks.package_framework("my_project.train") is None
    assert frameworks.package_framework(None) is None


def test_the_caller_outside_torch_is_the_one_that_counts() -> None:
    counts = SyncCounts()
    assert counts.count("Tensor.item", _frame_in("transformers.trainer"))
    assert counts.count("Tensor.item", _frame_in("test_my_model"))
    # torch's own frames are passed over: the framework called torch, which synced
    scope: dict[str, Any] = {"__name__": "torch.nn.utils.clip_grad", "sys": sys}
    exec("def inner():\n    return sys._getframe()\n", scope)
    outer: dict[str, Any] = {"__name__": "pytorch_lightning.loops", "inner": scope["inner"]}
    exec("frame = inner()", outer)
    assert counts.count("Tensor.item", outer["frame"])
    assert counts.by_framework == {"transformers: Tensor.item": 1, "lightning: Tensor.item": 1}
    assert counts.pending == 3 and counts.framework_pending == 2
    # this plugin's own syncs (the profiler window's, the gate's timing events) are not counted
    assert not counts.count("torch.cuda.synchronize", _frame_in("pytest_gputrain.probe.x"))
    assert counts.pending == 3


def test_the_trainer_outranks_the_accelerate_it_runs_on() -> None:
    scope: dict[str, Any] = {"__name__": "accelerate.optimizer", "sys": sys}
    exec("def step():\n    return sys._getframe()\n", scope)
    trainer: dict[str, Any] = {"__name__": "transformers.trainer", "step": scope["step"]}
    exec("frame = step()", trainer)
    assert frameworks.driving_framework(trainer["frame"]) == "transformers"
    assert frameworks.driving_framework(scope["step"]()) == "accelerate"
    assert frameworks.driving_framework(sys._getframe()) == frameworks.PLAIN


class _FakeCudaTensor:
    is_cuda = True

    def __bool__(self) -> bool:
        return False


def test_a_sync_asked_for_by_a_framework_is_counted_as_its_own() -> None:
    counts = SyncCounts()
    wrapped = sync_calls.wrap_tensor_method("__bool__", _FakeCudaTensor.__bool__, counts)
    tensor = _FakeCudaTensor()
    # the Hugging Face Trainer's NaN/Inf loss filter: `torch.isnan(loss) or torch.isinf(loss)`
    trainer: dict[str, Any] = {"__name__": "transformers.trainer", "check": wrapped,
                               "t": tensor}
    exec("for _ in range(3):\n    check(t)\n    check(t)\n", trainer)
    wrapped(tensor)  # the test's own `if loss:`
    assert counts.pending == 7 and counts.framework_pending == 6
    assert counts.by_kind == {"Tensor.__bool__": 7}
    assert counts.by_framework == {"transformers: Tensor.__bool__": 6}
    # each call site named, most frequent first: the Trainer's two checks, then the test's
    sites = counts.sites()
    assert sites[:2] == ["Tensor.__bool__ at <string>:2 in <module>: 3",
                         "Tensor.__bool__ at <string>:3 in <module>: 3"]
    assert sites[2].startswith("Tensor.__bool__ at test_probe_frameworks.py:")


def test_sync_facts_split_the_frameworks_syncs_and_their_cost() -> None:
    record = RunRecord(nodeid="t::x", warmup=0, profile_steps=None,
                       steps=StepSeries(last_t=0.0), loader=LoaderWaits(LoaderTracker()))
    steps = record.steps
    steps.times = [0.1] * 4
    steps.syncs = [3, 3, 3, 3]
    steps.framework_syncs = [2, 2, 2, 2]
    steps.sync_waits = [0.0005] * 4
    record.syncs.by_kind = {"Tensor.__bool__": 8, "Tensor.item": 4}
    record.syncs.by_framework = {"transformers: Tensor.__bool__": 8}
    facts = sync_facts(record, [0, 1, 2, 3])
    assert facts.per_step == 3.0 and facts.framework_per_step == 2.0
    assert facts.framework == "transformers"
    assert facts.framework_calls == ["transformers: Tensor.__bool__: 8"]
    assert facts.by_call == ["Tensor.__bool__: 8", "Tensor.item: 4"]
    assert facts.wait_percent == 0.5


def test_a_batch_of_token_ids_counts_its_tokens() -> None:
    assert token_count(torch.zeros(32, 256, dtype=torch.long)) == 8192
    assert token_count(torch.zeros(8, 128, dtype=torch.int32)) == 1024
    assert token_count(torch.zeros(32, 256)) is None  # features, not token ids
    assert token_count(torch.zeros(32, 3, 8, 8, dtype=torch.uint8)) is None  # images
    assert token_count(torch.zeros(32, dtype=torch.long)) is None  # class labels
    assert token_count(object()) is None


# -- the framework samples' training code on the CPU, under a real probe ----------------------

def ignore_framework_warnings(test: Callable[..., Any]) -> Callable[..., Any]:
    """The frameworks' own warnings on a CPU (pin_memory without an accelerator, deprecations)
    are theirs, not the probe's: ignored in the tests that train through them."""
    for category in ("UserWarning", "DeprecationWarning", "FutureWarning"):
        test = pytest.mark.filterwarnings(f"ignore::{category}")(test)
    return test


def _probed(train: Callable[[], Any]) -> tuple[Any, RunFacts]:
    return probed(train)


@ignore_framework_warnings
@pytest.mark.parametrize("name", ["lightning_healthy", "lightning_starved_loader"])
def test_lightning_samples_train_on_the_cpu_and_the_probe_sees_lightning(name: str) -> None:
    pytest.importorskip("pytorch_lightning", reason="pip install 'pytest-gputrain[frameworks]'")
    sample = load_sample(name)
    steps = 10
    if name == "lightning_healthy":
        data = sample.Data(images=96, size=32, batch_size=12, workers=0)
        losses, facts = _probed(lambda: sample.train("cpu", steps, data, precision="32-true"))
    else:
        losses, facts = _probed(lambda: sample.train("cpu", steps, images=120, size=32,
                                                     batch_size=12, precision="32-true"))
    assert losses and all(loss > 0 for loss in losses)
    assert facts.framework == "lightning"
    assert facts.steps == steps and facts.backwards == steps and facts.grad_forwards == steps
    assert facts.loader.batch_size == 12 and facts.loader.num_workers == 0
    assert facts.batch_tokens is None  # images, not token ids
    # configure_optimizers takes every parameter: no gradient outside the optimizer (GT145)
    assert facts.grads.unused_params == 0 and facts.grads.model_params


@ignore_framework_warnings
@pytest.mark.parametrize("name", ["hf_trainer_healthy", "hf_trainer_fp32"])
def test_trainer_samples_train_on_the_cpu_and_the_probe_sees_the_trainer(
        name: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="pip install 'pytest-gputrain[frameworks]'")
    pytest.importorskip("accelerate", reason="pip install 'pytest-gputrain[frameworks]'")
    sample = load_sample(name)
    steps = 8
    losses, facts = _probed(lambda: sample.train(
        str(tmp_path), steps, cpu=True, layers=1, width=32, length=16, batch_size=4, vocab=128,
        workers=0))
    assert len(losses) == 4 and all(loss > 0 for loss in losses)
    assert facts.framework == "transformers"
    assert facts.steps == steps and facts.backwards == steps
    assert facts.modules[0].name == "GPT2LMHeadModel"
    assert facts.loader.batch_size == 4 and facts.batch_tokens == 4 * 16
    # the Trainer's optimizer holds every parameter that requires a gradient (GT145 quiet)
    assert facts.grads.unused_params == 0 and facts.grads.model_params


# -- a framework's checkpoint every step: its whole save counts, torch.save inside it once -----

@ignore_framework_warnings
def test_the_trainers_checkpoint_counts_whole_and_once(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers",
                                       reason="pip install 'pytest-gputrain[frameworks]'")
    pytest.importorskip("accelerate", reason="pip install 'pytest-gputrain[frameworks]'")
    sample = load_sample("hf_trainer_healthy")
    steps = 6
    config = transformers.GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=1,
                                     n_head=1)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=4, use_cpu=True,
        save_strategy="steps", save_steps=1, report_to="none", disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args,
                                   train_dataset=sample.MarkovTokens(32, 16, 128))
    _, facts = _probed(trainer.train)
    assert facts.framework == "transformers" and facts.steps == steps
    # One save a step, each the whole checkpoint: the weights (safetensors), and the optimizer,
    # scheduler and RNG state written by torch.save inside it, which do not count again.
    assert facts.checkpoint.saves == steps
    assert facts.checkpoint.writers == ["transformers Trainer._save_checkpoint"]
    assert facts.checkpoint.time_per_save and facts.checkpoint.time_per_save > 0
    assert len(list(tmp_path.glob("checkpoint-*"))) == steps


def _lightning_sample_fit(pl: Any, steps: int, **trainer_args: Any) -> RunFacts:
    """The lightning_healthy sample's module, shrunk, fitted on the CPU under a real probe."""
    sample = load_sample("lightning_healthy")
    pl.seed_everything(0, verbose=False)
    model = sample.StripeClassifier(sample.Data(images=60, size=16, batch_size=12, workers=0))
    trainer = pl.Trainer(accelerator="cpu", devices=1, precision="32-true", max_steps=steps,
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         **trainer_args)
    return _probed(lambda: trainer.fit(model))[1]


@ignore_framework_warnings
def test_lightnings_checkpoint_counts_whole_and_once(tmp_path: Path) -> None:
    pl = pytest.importorskip("pytorch_lightning",
                             reason="pip install 'pytest-gputrain[frameworks]'")
    steps = 5
    every_step = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1,
                                              save_top_k=-1)
    facts = _lightning_sample_fit(pl, steps, callbacks=[every_step])
    assert facts.framework == "lightning" and facts.steps == steps
    assert facts.checkpoint.saves == steps
    assert facts.checkpoint.writers == ["lightning Trainer.save_checkpoint"]
    assert len(list(tmp_path.glob("*.ckpt"))) == steps


def test_torch_save_alone_names_torch_save(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def train() -> None:
        for step in range(4):
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                       tmp_path / f"step{step}.pt")

    _, facts = _probed(train)
    assert facts.checkpoint.saves == 4 and facts.checkpoint.writers == ["torch.save"]


@ignore_framework_warnings
def test_lightnings_debugging_flags_reach_the_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Trainer(detect_anomaly=True, deterministic=True)``: the settings GT115 and GT114 name
    under Lightning are seen as the anomaly mode and the deterministic algorithms they turn on."""
    # deterministic=True sets this for cuBLAS and leaves it set: undone after the test.
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    pl = pytest.importorskip("pytorch_lightning",
                             reason="pip install 'pytest-gputrain[frameworks]'")
    steps = 4
    try:
        facts = _lightning_sample_fit(pl, steps, enable_checkpointing=False, detect_anomaly=True,
                                      deterministic=True)
    finally:
        torch.use_deterministic_algorithms(False)
    assert facts.framework == "lightning" and facts.steps == steps
    assert facts.anomaly_backwards == steps
    assert facts.deterministic_algorithms is True
