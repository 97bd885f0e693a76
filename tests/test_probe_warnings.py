"""torch's warnings as evidence (``probe/warning_readings.py``, ``run.warnings.*``, GT150): what
the probe keeps of the warnings shown while a test trains, and that the user still sees them."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from pytest_gputrain.probe import run
from pytest_gputrain.probe.facts import RunFacts
from pytest_gputrain.probe.torch_hooks import global_hook_counts

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")


def _trained(loop: Callable[[], None]) -> RunFacts:
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    try:
        loop()
    finally:
        probe.stop()
    return probe.facts()


def _loop(loss_of: Callable[[torch.nn.Module, torch.nn.Module, torch.Tensor], Any],
          steps: int = 4) -> Callable[[], None]:
    torch.manual_seed(0)
    block, head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD([*block.parameters(), *head.parameters()], lr=0.01)

    def loop() -> None:
        for _ in range(steps):
            loss = loss_of(block, head, torch.randn(16, 8))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    return loop


def test_a_warning_torch_raises_in_the_loop_is_kept_with_the_line_that_led_there() -> None:
    def loss_of(block: torch.nn.Module, head: torch.nn.Module, x: torch.Tensor) -> Any:
        hidden = checkpoint(block, x, use_reentrant=True)  # x does not require grad
        return head(hidden).square().mean()

    with warnings.catch_warnings(record=True):  # as pytest's capture: kept from the summary
        warnings.simplefilter("default")
        found = _trained(_loop(loss_of)).warnings
    assert found.count == 1 and found.benign == 0
    assert found.first == ('UserWarning: "None of the inputs have requires_grad=True. '
                           'Gradients will be None"')
    assert found.first_where is not None and found.first_where.startswith(
        "torch/utils/checkpoint.py:")
    assert found.first_caller is not None
    assert found.first_caller.startswith("`hidden = checkpoint(block, x, use_reentrant=True)` at "
                                         "test_probe_warnings.py:")
    assert found.first_step == 1


def test_a_loss_that_broadcasts_its_target_is_kept_and_the_user_still_sees_it() -> None:
    def loss_of(block: torch.nn.Module, head: torch.nn.Module, x: torch.Tensor) -> Any:
        return F.mse_loss(head(block(x)), x[:, 0])  # (16, 1) against (16,)

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        found = _trained(_loop(loss_of)).warnings
    assert found.count == 1
    assert found.first is not None and "that is different to the input size" in found.first
    assert [str(w.message)[:22] for w in shown] == ["Using a target size (t"]  # still shown


def test_deprecations_benign_warnings_and_the_tests_own_warnings_are_not_judged() -> None:
    def loss_of(block: torch.nn.Module, head: torch.nn.Module, x: torch.Tensor) -> Any:
        warnings.warn("the test's own note", UserWarning, stacklevel=1)
        warnings.warn("TypedStorage is deprecated", UserWarning, stacklevel=1)
        return head(block(x)).square().mean()

    def deprecated_call() -> None:
        torch.cuda.amp.GradScaler(enabled=False)  # FutureWarning: a deprecation

    def loop() -> None:
        deprecated_call()
        _loop(loss_of)()

    with warnings.catch_warnings(record=True):  # as pytest's capture: kept from the summary
        warnings.simplefilter("default")
        found = _trained(loop).warnings
    assert found.count == 0 and found.unknown["first"]
    assert found.benign == 0  # the test's own warnings are the test's, whatever they say


def test_a_warning_the_test_expects_is_not_judged() -> None:
    def loss_of(block: torch.nn.Module, head: torch.nn.Module, x: torch.Tensor) -> Any:
        with pytest.warns(UserWarning, match="different to the input size"):
            return F.mse_loss(head(block(x)), x[:, 0])

    with warnings.catch_warnings(record=True):  # as pytest's capture: kept from the summary
        warnings.simplefilter("default")
        found = _trained(_loop(loss_of)).warnings
    assert found.count == 0


def test_a_benign_warning_of_torch_is_counted_apart() -> None:
    def build() -> None:
        layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, norm_first=True)
        model = torch.nn.TransformerEncoder(layer, 1)  # "enable_nested_tensor is True, but ..."
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.randn(2, 4, 8)).square().mean().backward()
            optimizer.step()

    with warnings.catch_warnings(record=True):  # as pytest's capture: kept from the summary
        warnings.simplefilter("default")
        found = _trained(build).warnings
    assert found.count == 0 and found.benign == 1
    assert "enable_nested_tensor is True" in found.benign_listed[0]


def test_the_probe_puts_warnings_back_as_it_found_them() -> None:
    original = vars(warnings)["_showwarnmsg"]
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    assert vars(warnings)["_showwarnmsg"] is not original
    probe.stop()
    assert vars(warnings)["_showwarnmsg"] is original
    assert global_hook_counts(torch)["patched_attributes"] == 0


def test_gt150_names_the_warning_in_a_diagnosed_test(pytester: pytest.Pytester,
                                                     use_facts: Callable[..., None]) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile(test_regression="""
        import torch
        import torch.nn.functional as F

        def test_fit():
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            x, y = torch.randn(64, 4), torch.randn(64)
            for _ in range(5):
                loss = F.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        """)
    result = pytester.runpytest("--gpu-diagnose", "-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=1, warnings=1)  # pytest's summary still lists it
    result.stdout.fnmatch_lines(["*WARNING GT150*", "*that is different to the input size*",
                                 "*reached from `loss = F.mse_loss(model(x), y)` at",
                                 "*test_regression.py:10, first in step 1 of 5*"])


HELDOUT = Path(__file__).resolve().parent.parent / "sample_projects" / "heldout"


def test_gt150_names_the_held_out_reentrant_checkpoint(pytester: pytest.Pytester,
                                                       use_facts: Callable[..., None]) -> None:
    """The held-out sample's own training loop, small and on the CPU: the warning torch raises
    at its reentrant checkpoint is named by GT150, in words the sample's `names` accepts."""
    use_facts("cpu_laptop")
    sample = HELDOUT / "checkpoint_reentrant_frozen_stem"
    module = next(sample.glob("test_*.py"))
    pytester.makepyfile(test_fine_tune=f"""
        import importlib.util
        import torch

        spec = importlib.util.spec_from_file_location("sample", {str(module)!r})
        sample = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sample)

        def test_fit():
            sample.train(torch.device("cpu"), steps=6, batch_size=32, width=32, blocks=2)
        """)
    result = pytester.runpytest("--gpu-diagnose", "-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*WARNING GT150*"])
    said = " ".join(result.stdout.str().split())  # the report wraps its lines
    assert '"None of the inputs have requires_grad=True. Gradients will be None"' in said
    assert "reached from `x = checkpoint(block, x, use_reentrant=True)` at" in said
    names = tomllib.loads((HELDOUT / "EXPECTED.toml").read_text(encoding="utf-8"))[
        "checkpoint_reentrant_frozen_stem"]["names"]
    assert re.search(names, said, re.IGNORECASE)
