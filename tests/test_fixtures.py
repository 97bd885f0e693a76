"""The ``gpu`` and ``gpu_monitor`` fixtures and test hygiene (leaks, OOM), with a fake GPU."""

from __future__ import annotations

import pytest
from gputrain_fake import fake_project

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")


def test_gpu_fixture_gives_the_device_and_resets_peak_stats(pytester: pytest.Pytester) -> None:
    fake_project(pytester, options="initialized=False")
    pytester.makepyfile("""
        def test_device(gpu, fake):
            assert gpu == "cuda:0"
            assert fake.calls[:1] == ["reset_peak"]

        def test_release_after_the_gpu_test(fake):
            assert "release" in fake.calls
    """)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["gputrain: 1 GPU test: 1 ran, 0 skipped, 0 failed"])


def test_gpu_fixture_skips_without_a_gpu(pytester: pytest.Pytester) -> None:
    fake_project(pytester, "cpu_inventory()")
    pytester.makepyfile("""
        def test_device(gpu):
            raise AssertionError("never runs")
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*no CUDA GPU: torch 2.13.0+cpu is a CPU-only build*"])


def test_gpu_fixture_requested_dynamically_still_checks_and_skips(pytester: pytest.Pytester
                                                                  ) -> None:
    fake_project(pytester, "cpu_inventory()")
    pytester.makepyfile("""
        def test_dynamic(request):
            request.getfixturevalue("gpu")
            raise AssertionError("never runs")
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*no CUDA GPU*"])


def test_memory_left_allocated_is_a_warning(pytester: pytest.Pytester) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import pytest

        KEEP = []

        def test_leaks(gpu, fake):
            KEEP.append(fake.tensor("300MiB"))

        def test_clean(gpu, fake):
            t = fake.tensor("300MiB")
            del t

        @pytest.fixture
        def model(fake):
            return fake.tensor("2GiB")  # function-scoped: freed after the test, not a leak

        def test_fixture_memory(model, gpu):
            pass
    """)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([
        "*test_leaks*",
        "*GpuMemoryWarning: gputrain: the test left 300 MiB allocated on cuda:0 after its "
        "teardown (0 B before its setup, 300 MiB after): tensors still referenced by a module or "
        "session fixture, a global, a cache or a kept exception; later tests start with less "
        "memory",
    ])
    assert result.stdout.str().count("GpuMemoryWarning") == 1


OOM_TESTS = """
    def test_1_runs_out_of_memory(gpu, fake):
        held = []
        for _ in range(10):
            held.append(fake.tensor("1GiB"))  # the 5th raises: the frame keeps 4 GiB alive

    def test_2_needs_most_of_the_budget(gpu, fake):
        big = fake.tensor("3GiB")
        del big

    def test_3_healthy(gpu, fake):
        assert fake.allocated == 0
"""


def test_oom_in_one_test_does_not_fail_the_next(pytester: pytest.Pytester) -> None:
    fake_project(pytester, options="budget='4GiB'")
    pytester.makepyfile(OOM_TESTS)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines([
        "*FakeOutOfMemoryError: CUDA out of memory (fake)*",
        "*- gputrain out of memory -*",
        "cuda:0 when the test failed: allocated 4 GiB, reserved 4 GiB, peak reserved 4 GiB",
        "gputrain frees what this test's traceback kept alive after its teardown*",
        "fix: lower the batch size*",
    ])


def test_without_the_clean_up_the_traceback_would_starve_the_next_test(
        pytester: pytest.Pytester) -> None:
    """Control: the same failure, not recognised as an OOM, keeps its memory alive."""
    fake_project(pytester, options="budget='4GiB'")
    pytester.makepyfile(OOM_TESTS.replace("fake.tensor(\"1GiB\"))", "fake.tensor(\"1GiB\"))\n"
                                          "            if len(held) == 4: raise ValueError()"))
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=3)


def test_gpu_monitor_samples_the_test(pytester: pytest.Pytester) -> None:
    fake_project(pytester, options="utilization=40")
    pytester.makepyfile("""
        import time

        def test_watch(gpu_monitor, fake):
            time.sleep(0.2)
            summary = gpu_monitor.summary()
            assert 40 == summary["utilization_gpu"].mean
            assert summary["power_draw"].p90 == 120.0
            assert set(summary) >= {"utilization_gpu", "memory_used", "power_draw",
                                    "temperature", "sm_clock"}
            assert len(gpu_monitor.samples) >= 3
            assert gpu_monitor.running
            assert gpu_monitor.clock_event_fractions() == {}
    """)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)


def test_gpu_monitor_skips_without_nvml(pytester: pytest.Pytester) -> None:
    fake_project(pytester, options="nvml_available=False")
    pytester.makepyfile("""
        def test_watch(gpu_monitor):
            raise AssertionError("never runs")
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        "SKIPPED*gpu_monitor: cannot sample cuda:0 through NVML: NVML not available (fake)"])


def test_fixtures_are_documented(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--fixtures")
    result.stdout.fnmatch_lines([
        "gpu -- *", "    The test's CUDA device as a ``torch.device``*",
        "gpu_monitor -- *", "    The background NVML sampler of the test's GPU*",
    ])
