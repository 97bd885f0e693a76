"""The failure rules through the plugin: a test that fails the way GPU pipelines fail gets its
finding in the report section and the facts file (pytester, in-process, recorded H200 facts)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("--gpu-diagnose", "--gpu-facts-out=facts.json",
                              "--gpu-fail-on=never", "--gpu-report=report.json",
                              "-p", "no:cacheprovider", *args)


def _failure_codes(pytester: pytest.Pytester) -> dict[str, set[str]]:
    findings = json.loads((pytester.path / "report.json").read_text())["findings"]
    codes: dict[str, set[str]] = {}
    for finding in findings:
        if finding["scope"] == "failure":
            codes.setdefault(finding["subject"].split("::")[1], set()).add(finding["code"])
    return codes


def _failures(pytester: pytest.Pytester) -> dict[str, dict[str, Any]]:
    data = json.loads((pytester.path / "facts.json").read_text())
    return {failure["nodeid"].split("::")[1]: failure for failure in data["failures"]}


def test_each_new_failure_kind_gets_its_rule(pytester: pytest.Pytester,
                                             use_facts: Callable[..., Any]) -> None:
    use_facts("h200_healthy")
    pytester.makepyfile(test_kinds="""
        def test_nondeterministic():
            raise RuntimeError(
                "upsample_bilinear2d_backward_out_cuda does not have a deterministic "
                "implementation, but you set 'torch.use_deterministic_algorithms(True)'.")

        def test_fork():
            raise RuntimeError(
                "Caught RuntimeError in DataLoader worker process 0.\\nOriginal Traceback (most "
                "recent call last):\\nRuntimeError: Cannot re-initialize CUDA in forked "
                "subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start "
                "method")

        def test_capture():
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\\n"
                               "Compile with `TORCH_USE_CUDA_DSA` to enable device-side "
                               "assertions.")

        class Unsupported(RuntimeError):  # as torch._dynamo raises it under fullgraph=True
            __module__ = "torch._dynamo.exc"

        def test_compile():
            raise Unsupported("Failed to trace builtin operator\\n  Explanation: Dynamo does "
                              "not know how to trace builtin operator `print`")

        def test_numpy():
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() "
                            "to copy the tensor to host memory first.")

        def test_loader():
            raise RuntimeError("DataLoader worker (pid 2113) is killed by signal: Bus error. It "
                               "is possible that dataloader's workers are out of shared memory.")

        def test_unavailable():
            raise RuntimeError("No CUDA GPUs are available")

        def test_plain():
            assert 1 == 2
        """)
    result = _run(pytester)
    result.assert_outcomes(failed=8)
    codes = _failure_codes(pytester)
    assert codes == {"test_nondeterministic": {"GT211"}, "test_fork": {"GT212"},
                     "test_capture": {"GT213"}, "test_compile": {"GT214"},
                     "test_numpy": {"GT218"}, "test_loader": {"GT217"},
                     "test_unavailable": {"GT216"}}
    failures = _failures(pytester)
    assert failures["test_fork"]["in_loader_worker"] is True
    assert failures["test_loader"]["signal"] == "Bus error"
    assert failures["test_compile"]["compile_stage"] == "dynamo"
    result.stdout.fnmatch_lines(["ERROR GT213 cuda-graph-capture-error:*"])


def test_a_dtype_mismatch_in_a_cpu_only_test_is_left_alone(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    use_facts("h200_healthy")
    pytester.makepyfile(test_dtype="""
        import numpy as np
        import torch

        def test_cpu_regressor():
            model = torch.nn.Linear(4, 1)
            model(torch.from_numpy(np.zeros((2, 4))))  # float64 into float32, on the CPU

        def test_gpu_message():
            raise RuntimeError("Input type (torch.cuda.HalfTensor) and weight type "
                               "(torch.cuda.FloatTensor) should be the same")
        """)
    result = _run(pytester)
    result.assert_outcomes(failed=2)
    assert _failure_codes(pytester) == {"test_gpu_message": {"GT215"}}
    failures = _failures(pytester)
    assert failures["test_cpu_regressor"]["kind"] == "dtype_mismatch"
    assert failures["test_cpu_regressor"]["cuda_involved"] is False
    assert failures["test_cpu_regressor"]["module"] == "Linear"
    assert failures["test_gpu_message"]["dtypes"] == ["float16", "float32"]


def test_a_wrapped_gpu_error_is_diagnosed_by_its_cause(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    use_facts("h200_healthy")
    pytester.makepyfile(test_wrapped="""
        def train_step():
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB.")

        def test_trainer():
            try:
                train_step()
            except RuntimeError as exc:
                raise ValueError("epoch 3 failed") from exc
        """)
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    assert _failure_codes(pytester)["test_trainer"] >= {"GT201"}
    failure = _failures(pytester)["test_trainer"]
    assert failure["kind"] == "oom" and failure["exc_type"] == "RuntimeError"
