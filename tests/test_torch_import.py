"""A torch whose import fails part-way is never imported again by the diagnosis.

``TORCH_LOGS=bogus`` makes ``import torch`` raise ``ValueError`` from its ``__init__``; the
diagnosis's environment collector used to try twice more, and the interpreter then died at exit
with a segmentation fault (rc 139) instead of reporting the failed tests.
"""

from __future__ import annotations

import signal

import pytest


def test_a_failed_torch_import_is_not_retried(pytester: pytest.Pytester,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_LOGS", "bogus")
    pytester.makepyfile("""
        def test_first():
            import torch

        def test_second():
            import torch

        def test_third():
            import torch
    """)
    # Not -q: the header collects the environment (and imports torch) before the tests do.
    result = pytester.runpytest_subprocess("--gpu-diagnose", "--gpu-fail-on=never",
                                           "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, (
        f"rc {result.ret} ({signal.Signals(-result.ret).name if result.ret < 0 else 'exit'})"
        f"\n{result.stderr.str()}")
    result.stdout.fnmatch_lines(["gputrain: torch not importable (torch cannot be imported: "
                                 "ValueError: *", "*3 failed*"])
    output = result.stdout.str() + result.stderr.str()
    assert "ValueError: " in output
    assert "Only a single TORCH_LIBRARY" not in output  # torch's answer to a retried import
    assert "Segmentation fault" not in output and "Fatal Python error" not in output
