"""The GPU markers through pytester, on a CPU machine, with a fake GPU where one is needed."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from gputrain_fake import fake_project

from pytest_gputrain.assertions import markers
from pytest_gputrain.versions import version_at_least

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")


# -- requires_cuda ---------------------------------------------------------------------------------

def test_requires_cuda_runs_on_a_gpu_that_meets_every_condition(pytester: pytest.Pytester
                                                                ) -> None:
    fake_project(pytester, "gpu_inventory(count=2)")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.requires_cuda(min_devices=2, min_capability=(8, 0), min_total_vram="80GiB",
                                   min_free_vram="24 GB", bf16=True, min_torch="2.1",
                                   min_driver="535")
        def test_big():
            pass

        @pytest.mark.requires_cuda
        def test_plain():
            pass
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["gputrain: 2 GPU tests: 2 ran, 0 skipped, 0 failed"])


@pytest.mark.parametrize(("inventory", "marker", "reason"), [
    ("cpu_inventory()", "", "no CUDA GPU: torch 2.13.0+cpu is a CPU-only build; NVIDIA driver "
     "not installed (libnvidia-ml.so not found: NVML Shared Library Not Found)"),
    ("Inventory(torch_version='2.11.0+cu130', cuda_build='13.0', nvml_error='the NVIDIA driver "
     "is not installed (libnvidia-ml.so not found): x')", "",
     "no CUDA GPU: NVIDIA driver not installed (libnvidia-ml.so not found: x)"),
    ("Inventory(torch_version='2.13.0+cpu', nvml_device_count=2, driver_version='580.1')", "",
     "no CUDA GPU: torch 2.13.0+cpu is a CPU-only build although NVML sees 2 GPUs: install a "
     "CUDA build of torch"),
    ("Inventory(torch_version='2.11.0', cuda_build='13.0', nvml_device_count=8, "
     "cuda_visible_devices='')", "", "no CUDA GPU: CUDA_VISIBLE_DEVICES='' hides all 8 GPUs"),
    ("Inventory(torch_version='2.11.0', cuda_build='13.0', driver_version='470.1', "
     "nvml_device_count=1, cuda_error='The NVIDIA driver on your system is too old')", "",
     "no CUDA GPU: torch.cuda.is_available() is False (torch 2.11.0, CUDA 13.0): The NVIDIA "
     "driver on your system is too old"),
    ("gpu_inventory(count=1)", "min_devices=2", "needs 2 CUDA GPUs, 1 visible"),
    ("gpu_inventory(name='Tesla T4', capability=(7, 5))", "min_capability='8.0'",
     "needs compute capability >= 8.0, cuda:0 (Tesla T4) has 7.5"),
    ("gpu_inventory(name='Tesla T4', capability=(7, 5))", "bf16=True",
     "needs bf16: cuda:0 (Tesla T4) has compute capability 7.5 (bf16 needs >= 8.0)"),
    ("gpu_inventory(name='NVIDIA A10', total='22GiB')", "min_total_vram='80GiB'",
     "needs 80 GiB total on cuda:0, NVIDIA A10 has 22 GiB"),
    ("gpu_inventory(torch_version='2.0.1+cu118')", "min_torch='2.1'",
     "needs torch >= 2.1, have 2.0.1+cu118"),
    ("gpu_inventory(torch_version='2.6.0rc1+cu126')", "min_torch='2.6'",
     "needs torch >= 2.6, have 2.6.0rc1+cu126"),
    ("gpu_inventory(driver_version='470.82.01')", "min_driver='535'",
     "needs NVIDIA driver >= 535, have 470.82.01"),
])
def test_requires_cuda_skips_with_the_unmet_condition(
        pytester: pytest.Pytester, inventory: str, marker: str, reason: str) -> None:
    fake_project(pytester, inventory)
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.requires_cuda({marker})
        def test_x():
            pass
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"SKIPPED [[]1[]] test_requires_cuda_skips*.py:3: {reason}"])


def test_min_free_vram_reads_free_memory_when_the_test_starts(pytester: pytest.Pytester) -> None:
    fake_project(pytester, "gpu_inventory()",
                 "free=FreeMemory(free=int(7.9 * 2**30), total=141 * 2**30, other_processes=2, "
                 "other_memory=131 * 2**30)")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.requires_cuda(min_free_vram="24GiB")
        def test_needs_room():
            pass

        @pytest.mark.requires_cuda(min_free_vram="4GiB")
        def test_fits():
            pass
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([
        "*needs 24 GiB free on cuda:0, 7.9 GiB free: 2 other processes hold 131 GiB"])


def test_free_memory_is_read_per_test_not_per_session(pytester: pytest.Pytester) -> None:
    fake_project(pytester, "gpu_inventory(total='80GiB')")
    pytester.makepyfile("""
        import pytest

        def test_other_process_arrives(fake):
            fake.other_memory = 70 * 2**30

        @pytest.mark.requires_cuda(min_free_vram="24GiB")
        def test_needs_room():
            pass
    """)
    result = pytester.runpytest("-rs", "-p", "no:randomly")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*needs 24 GiB free on cuda:0, * free: 1 other process hold*"])


def test_class_and_function_requirements_all_apply(pytester: pytest.Pytester) -> None:
    fake_project(pytester, "gpu_inventory(count=1, capability=(8, 0))")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.requires_cuda(min_capability=(8, 0))
        class TestBoth:
            @pytest.mark.requires_cuda(min_devices=2)
            def test_two(self):
                pass

            def test_one(self):
                pass
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*needs 2 CUDA GPUs, 1 visible"])


def test_inventory_is_gathered_once_and_only_for_gpu_tests(pytester: pytest.Pytester) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import pytest

        def test_cpu_only(fake):
            assert fake.inventory_calls == 0

        @pytest.mark.requires_cuda
        def test_gpu_1():
            pass

        @pytest.mark.requires_cuda(min_devices=1)
        def test_gpu_2(fake):
            assert fake.inventory_calls == 1
    """)
    pytester.runpytest("-p", "no:randomly").assert_outcomes(passed=3)


def test_real_backend_on_this_cpu_machine_skips_and_says_why(pytester: pytest.Pytester) -> None:
    """No fake: whatever this machine is, a GPU test runs or skips, never errors."""
    pytester.makepyfile("""
        import pytest

        @pytest.mark.requires_cuda
        def test_x():
            pass
    """)
    result = pytester.runpytest("-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 1
    if outcomes.get("skipped"):
        result.stdout.fnmatch_lines(["SKIPPED*no CUDA GPU: *"])


# -- the gpu marker, selection, strict markers, summary, --gpu-required ---------------------------

GPU_AND_CPU_TESTS = """
    import pytest

    @pytest.mark.requires_cuda
    def test_marker():
        pass

    @pytest.mark.max_vram("1GiB")
    def test_limit():
        pass

    def test_fixture(gpu):
        pass

    @pytest.mark.gpu
    def test_label():
        pass

    def test_cpu():
        pass
"""


def test_gpu_tests_get_the_gpu_marker_for_selection(pytester: pytest.Pytester) -> None:
    fake_project(pytester)
    pytester.makepyfile(GPU_AND_CPU_TESTS)
    result = pytester.runpytest("-m", "gpu", "--strict-markers")
    result.assert_outcomes(passed=4, deselected=1)
    result = pytester.runpytest("-m", "not gpu", "--strict-markers")
    result.assert_outcomes(passed=1, deselected=4)
    assert "GPU test" not in result.stdout.str()


def test_markers_are_registered_with_descriptions(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines([
        "@pytest.mark.gpu: a GPU test*",
        "@pytest.mark.requires_cuda(min_devices=1, *): skip unless a CUDA GPU meets*",
        "@pytest.mark.max_vram(limit, measure=\"allocated\"): fail the test when*",
        "@pytest.mark.min_utilization(percent, warmup=0, interval=0.05): fail the test when*",
    ])


def test_summary_counts_gpu_tests_and_skip_reasons(pytester: pytest.Pytester) -> None:
    fake_project(pytester, "cpu_inventory()")
    pytester.makepyfile(GPU_AND_CPU_TESTS)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, skipped=4)
    result.stdout.fnmatch_lines([
        "gputrain: 4 GPU tests: 0 ran, 4 skipped, 0 failed",
        "  skipped 4: no CUDA GPU: torch 2.13.0+cpu is a CPU-only build; *",
    ])


def test_no_summary_without_gpu_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_cpu(): pass")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    assert "gputrain:" not in result.stdout.str()


def test_summary_counts_failures(pytester: pytest.Pytester) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.requires_cuda
        def test_bad():
            assert False

        @pytest.mark.requires_cuda(min_devices=4)
        def test_skip():
            pass

        @pytest.mark.requires_cuda
        @pytest.mark.xfail(reason="known")
        def test_xfail():
            assert False
    """)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines(["gputrain: 3 GPU tests: 2 ran, 1 skipped, 1 failed"])


@pytest.mark.parametrize("how", ["cli", "ini"])
def test_gpu_required_turns_skips_into_errors(pytester: pytest.Pytester, how: str) -> None:
    fake_project(pytester, "cpu_inventory()")
    pytester.makepyfile(GPU_AND_CPU_TESTS + """
    def test_user_skip(gpu):
        pytest.skip("not today")
    """)
    args = ["--gpu-required"] if how == "cli" else []
    if how == "ini":
        pytester.makeini("[pytest]\ngpu_required = true\n")
    result = pytester.runpytest(*args)
    # A skip refused at setup is an error, for pytest and for the plugin's tally alike.
    result.assert_outcomes(passed=1, errors=5)
    result.stdout.fnmatch_lines([
        "gpu-required: this GPU test would have been skipped: no CUDA GPU: torch 2.13.0+cpu*",
        "(--gpu-required / gpu_required makes such a skip an error at its setup)",
        "gputrain: 5 GPU tests: 0 ran, 0 skipped, 0 failed, 5 errors (--gpu-required: no GPU "
        "test may skip)",
        "*1 passed, 5 errors*",
    ])
    assert result.ret == 1


def test_gpu_required_fails_a_skip_inside_the_test_too(pytester: pytest.Pytester) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.requires_cuda
        def test_skips_itself():
            pytest.skip("missing dataset")
    """)
    result = pytester.runpytest("--gpu-required")
    result.assert_outcomes(failed=1)  # in its body, not at its setup: a failure
    result.stdout.fnmatch_lines([
        "*would have been skipped: missing dataset",
        "*(--gpu-required / gpu_required makes such a skip a failure)",
        "gputrain: 1 GPU test: 1 ran, 0 skipped, 1 failed (--gpu-required: no GPU test may "
        "skip)"])


def test_gpu_required_is_turned_off_from_the_command_line(pytester: pytest.Pytester) -> None:
    fake_project(pytester, "cpu_inventory()")
    pytester.makepyfile(GPU_AND_CPU_TESTS)
    pytester.makeini("[pytest]\ngpu_required = true\n")
    result = pytester.runpytest("--no-gpu-required")
    result.assert_outcomes(passed=1, skipped=4)
    assert result.ret == 0


def test_gpu_required_passes_when_the_gpu_is_there(pytester: pytest.Pytester) -> None:
    fake_project(pytester)
    pytester.makepyfile(GPU_AND_CPU_TESTS)
    result = pytester.runpytest("--gpu-required")
    result.assert_outcomes(passed=5)
    assert result.ret == 0


# -- max_vram --------------------------------------------------------------------------------------

def test_max_vram_passes_under_the_limit_and_fails_over_it(pytester: pytest.Pytester) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.max_vram("3GiB")
        def test_fits(fake):
            fake.allocate("2GiB")
            fake.free()

        @pytest.mark.max_vram("6GiB")
        def test_too_big(fake):
            fake.allocate("4GiB")
            fake.allocate("3.5GiB")
            fake.free()
            fake.allocate("1GiB")
            fake.free()
    """)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*_ test_too_big _*",
        "max_vram: peak allocated GPU memory 7.5 GiB exceeds the 6 GiB limit by 1.5 GiB (+25 %) "
        "on cuda:0",
        "*- gputrain max_vram -*",
        "limit:    6 GiB",
        "peak:     7.5 GiB  allocated (torch.cuda.max_memory_allocated)",
        "over by:  1.5 GiB (+25 %)",
        "live at the peak, by allocating line:",
        "*4 GiB  test_max_vram_passes_under_the_limit_and_fails_over_it.py:10 in test_too_big *",
        "*3.5 GiB  test_max_vram_passes_under_the_limit_and_fails_over_it.py:11 in test_too_big*",
        "fix: *",
        "FAILED *::test_too_big*",
    ])
    assert "1 GiB  test_max" not in result.stdout.str()  # freed before the peak, not listed


def test_max_vram_measures_reserved_and_device(pytester: pytest.Pytester) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import time
        import pytest

        @pytest.mark.max_vram("2GiB", measure="reserved")
        def test_reserved(fake):
            fake.allocate("1GiB")
            fake.free()
            fake.allocate("1GiB")
            fake.reserved += 2 * 2**30    # fragmentation: the pool grows past the tensors
            fake.peak_reserved = fake.reserved
            fake.free()

        @pytest.mark.max_vram("1GiB", measure="device")
        def test_device(fake):
            fake.allocate("768MiB")       # + the 512 MiB context
            time.sleep(0.2)
            fake.free()
    """)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "max_vram: peak reserved GPU memory 3 GiB exceeds the 2 GiB limit by 1 GiB*",
        "*peak:     3 GiB  reserved (torch.cuda.max_memory_reserved*",
        "max_vram: peak device GPU memory *GiB exceeds the 1 GiB limit by *",
        "sampled:  every 50 ms from setup to the end of the call*",
    ])


def test_max_vram_device_measure_falls_back_to_the_whole_device(pytester: pytest.Pytester
                                                                ) -> None:
    fake_project(pytester, options="process_visible=False")
    pytester.makepyfile("""
        import time
        import pytest

        @pytest.mark.max_vram("1GiB", measure="device")
        def test_device(fake):
            fake.allocate("2GiB")
            time.sleep(0.15)
            fake.free()
    """)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["note:     device-wide memory used: this process is not in*"])


def test_max_vram_on_a_test_that_fails_anyway_adds_its_section(pytester: pytest.Pytester
                                                               ) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.max_vram("1GiB")
        def test_both(fake):
            fake.allocate("2GiB")
            fake.free()
            assert 1 == 2
    """)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E       assert 1 == 2", "*- gputrain max_vram -*",
                                 "max_vram: peak allocated GPU memory 2 GiB exceeds*"])


@pytest.mark.parametrize("how", ["cli", "ini"])
def test_global_max_vram_applies_to_gpu_tests_without_their_own(pytester: pytest.Pytester,
                                                                 how: str) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.requires_cuda
        def test_default_limit(fake):
            fake.allocate("2GiB")
            fake.free()

        @pytest.mark.max_vram("4GiB")
        def test_own_limit(fake):
            fake.allocate("2GiB")
            fake.free()

        def test_cpu(fake):
            fake.allocate("2GiB")
            fake.free()
    """)
    args = ["--gpu-max-vram=1GiB"] if how == "cli" else []
    if how == "ini":
        pytester.makeini("[pytest]\ngpu_max_vram = 1GiB\n")
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "max_vram: peak allocated GPU memory 2 GiB exceeds the 1 GiB limit (the session default "
        "gpu_max_vram) by 1 GiB (+100 %) on cuda:0",
        "allocations: not recorded for the gpu_max_vram default: put @pytest.mark.max_vram on*",
    ])


def test_history_is_recorded_only_for_explicit_max_vram(pytester: pytest.Pytester) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.requires_cuda
        def test_1(fake):
            pass

        @pytest.mark.max_vram("1GiB")
        def test_2(fake):
            pass

        def test_3(fake):
            assert fake.calls.count("start_history") == 1
            assert fake.calls.count("stop_history") == 1
    """)
    pytester.runpytest("-p", "no:randomly").assert_outcomes(passed=3)
    result = pytester.runpytest("-p", "no:randomly", "--gpu-vram-history=0")
    result.assert_outcomes(passed=2, failed=1)


@pytest.mark.parametrize(("option", "message"), [
    ("--gpu-max-vram=6 GiBs", "--gpu-max-vram: invalid size '6 GiBs'*"),
    ("--gpu-max-vram=6GiB:peak", "--gpu-max-vram: gpu_max_vram: measure: *"),
    ("--gpu-vram-history=lots", "--gpu-vram-history: 'lots' is not*"),
    ("--gpu-max-vram=1e400", "--gpu-max-vram: invalid size '1e400': larger than "
     "1 EiB*"),
    ("--gpu-max-vram=nan", "--gpu-max-vram: invalid size 'nan'*"),
    ("--gpu-vram-history=" + "9" * 5000, "--gpu-vram-history: '9999*'... (5000 "
     "characters) is not a whole number of entries from 0 to 999999999*"),
    ("--gpu-vram-history=²", "--gpu-vram-history: '²' is not a whole*"),
    ("--gpu-per-worker=" + "9" * 5000, "--gpu-per-worker: '9999*'... (5000 "
     "characters) is not a whole number >= 1*"),
])
def test_bad_options_are_usage_errors(pytester: pytest.Pytester, option: str,
                                      message: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


# -- min_utilization -----------------------------------------------------------------------------

def test_min_utilization_passes_when_busy_and_fails_when_starved(pytester: pytest.Pytester
                                                                 ) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import time
        import pytest

        @pytest.mark.min_utilization(70, interval=0.01)
        def test_busy(fake):
            fake.utilization = 95
            time.sleep(0.3)

        @pytest.mark.min_utilization("70%", interval=0.01)
        def test_starved(fake):
            fake.utilization = lambda t: 100 if int(t * 20) % 4 == 0 else 0
            time.sleep(0.4)
    """)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "min_utilization: mean GPU utilization * % is below the 70 % minimum on cuda:0 "
        "(NVML GPU 0)",
        "*- gputrain min_utilization -*",
        "window:   0.4* s of the call phase: * samples, one every 10 ms",
        "stats:    mean * %, p10 0 %, p50 0 %, p90 100 %, max 100 %",
        "timeline: ▁ 0 % … █ 100 %, * s per block",
        "          *█*▁*",
        "fix: *",
    ])


def test_min_utilization_ignores_the_warmup(pytester: pytest.Pytester) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import time
        import pytest

        @pytest.mark.min_utilization(80, warmup=0.2, interval=0.01)
        def test_slow_start(fake):
            fake.utilization = lambda t: 0 if t < 0.2 else 100
            time.sleep(0.5)

        @pytest.mark.min_utilization(80, warmup="50ms", interval=0.01)
        def test_still_idle(fake):
            fake.utilization = lambda t: 0 if t < 0.3 else 100
            time.sleep(0.5)
    """)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "window:   0.4* s of the call phase after a 0.05 s warm-up: * samples*",
        "timeline: ▁ 0 % … █ 100 %, * s per block, | = end of warm-up",
        "          ▁*|▁*█*",
    ])


def test_min_utilization_fails_when_nothing_is_left_after_warmup(pytester: pytest.Pytester
                                                                ) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.min_utilization(50, warmup=5)
        def test_short(fake):
            fake.utilization = 100
    """)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "min_utilization: no utilization sample after the 5 s warm-up on cuda:0 (NVML GPU 0): "
        "the call phase lasted * s; lower warmup= or make the test run longer (needs 50 %)"])


def test_min_utilization_without_nvml_fails_with_the_reason(pytester: pytest.Pytester) -> None:
    fake_project(pytester, options="nvml_available=False")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.min_utilization(50)
        def test_x():
            pass
    """)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "min_utilization: cannot sample GPU utilization on cuda:0 (NVML GPU 0): NVML not "
        "available (fake) (needs 50 %)"])


@pytest.mark.parametrize(("nvml_error", "reason"), [
    ("'NVML Shared Library Not Found (fake)'", "NVML Shared Library Not Found (fake)"),
    ("None", "cuda:0 has no NVML index (MIG, or CUDA_VISIBLE_DEVICES)"),
])
def test_a_device_without_nvml_index_says_why(pytester: pytest.Pytester, nvml_error: str,
                                             reason: str) -> None:
    # A GPU torch sees but NVML cannot name: NVML itself is missing (a container without the
    # driver's "utility" capability), or NVML is there and the device is a MIG instance.
    fake_project(pytester, f"""Inventory(
        torch_version="2.11.0+cu130", cuda_build="13.0", cuda_available=True,
        nvml_error={nvml_error}, nvml_device_count=None if {nvml_error} else 1,
        devices=[CudaDevice(index=0, name="NVIDIA H200", nvml_index=None, capability=(9, 0),
                            memory_total=2**37)])""")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.min_utilization(50)
        def test_x():
            pass
    """)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"min_utilization: cannot sample GPU utilization on cuda:0: {reason} (needs 50 %)"])


# -- JUnit XML -------------------------------------------------------------------------------------

def test_junit_xml_gets_peak_vram_and_mean_utilization(pytester: pytest.Pytester) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import time
        import pytest

        @pytest.mark.min_utilization(10, interval=0.01)
        def test_gpu(fake):
            fake.utilization = 60
            fake.allocate("3GiB")
            time.sleep(0.1)
            fake.free()

        def test_cpu():
            pass
    """)
    result = pytester.runpytest("--junitxml=out.xml")
    result.assert_outcomes(passed=2)
    tree = ET.parse(pytester.path / "out.xml")
    cases = {case.get("name"): case for case in tree.iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["test_gpu"].iter("property")}
    assert props == {"gpu_peak_vram_bytes": str(3 * 2**30), "gpu_mean_utilization": "60.0"}
    assert list(cases["test_cpu"].iter("property")) == []


# -- argument validation -------------------------------------------------------------------------

@pytest.mark.parametrize(("marker", "message"), [
    ('max_vram("6 GiBs")', "max_vram: invalid size '6 GiBs': unknown unit 'gibs' *e.g. \"6GiB\"*"),
    ("max_vram()", "max_vram: missing 'limit'; e.g. @pytest.mark.max_vram(\"6GiB\"*"),
    ('max_vram("1GiB", measure="peak")',
     "max_vram: measure: invalid value 'peak': expected one of 'allocated', 'reserved', "
     "'device'*"),
    ('max_vram("1GiB", limt=2)', "max_vram: unknown argument 'limt'*"),
    ('max_vram(0)', "max_vram: limit: must be above zero*"),
    ("min_utilization(120)", "min_utilization: percent: invalid percentage 120: must lie between"
     " 0 and 100*"),
    ('min_utilization(50, warmup="soon")', "min_utilization: warmup: invalid duration 'soon'*"),
    ("min_utilization(50, interval=0)", "min_utilization: interval: 0 is outside 1 ms to 10 s*"),
    ("min_utilization(50, warmpu=1)",
     "min_utilization: unknown argument 'warmpu' (did you mean 'warmup'?)*"),
    # gpu only selects tests: gpu(2) reads as "two GPUs" and used to be ignored.
    ("gpu(2)", "gpu: takes no arguments, got (2): it only marks a GPU test (for `-m gpu`); to "
     "need 2 GPUs write @pytest.mark.requires_cuda(min_devices=2)"),
    ('gpu(devices=4, name="x")', "gpu: takes no arguments, got (devices=4, name='x'): *"
     "@pytest.mark.requires_cuda(min_devices=2)"),
    ("requires_cuda(2)", "requires_cuda: too many positional arguments (2,): keyword arguments "
     "only; e.g. @pytest.mark.requires_cuda(min_devices=1*"),
    ('requires_cuda(min_capability="eight")',
     "requires_cuda: min_capability: invalid compute capability 'eight'*e.g. "
     "min_capability=(8, 0)"),
    ('requires_cuda(min_devices=0)', "requires_cuda: min_devices: invalid value 0: expected a "
     "whole number from 1 to 4096; e.g. min_devices=2"),
    ('requires_cuda(min_free_vram="lots")', "requires_cuda: min_free_vram: invalid size 'lots'*"),
    ('requires_cuda(bf16="yes")', "requires_cuda: bf16: invalid value 'yes': expected True or "
     "False; e.g. bf16=True"),
    ('requires_cuda(min_torch="two")', "requires_cuda: min_torch: invalid version 'two'*"),
    ('requires_cuda(min_driver=5.35)', "requires_cuda: min_driver: invalid version 5.35*"),
    # Numbers no float can hold, and amounts no machine has, are usage errors too (they used to
    # end the session with an INTERNALERROR OverflowError).
    ("max_vram(10**400)", "max_vram: invalid size an integer of about 401 digits: larger than "
     "1 EiB (2**60 bytes), more than any machine has; e.g. \"6GiB\"*"),
    ('max_vram("2000000 TiB")', "max_vram: invalid size '2000000 TiB': larger than 1 EiB*"),
    ('max_vram(float("inf"))', "max_vram: invalid size inf: larger than 1 EiB*e.g. \"6GiB\"*"),
    ('max_vram(float("nan"))', "max_vram: invalid size nan: not a number; e.g. \"6GiB\"*"),
    ("max_vram(-1)", "max_vram: invalid size -1: must not be negative; e.g. \"6GiB\"*"),
    ("max_vram(True)", "max_vram: invalid size True: a boolean is not a size; e.g. \"6GiB\"*"),
    ("min_utilization(10**400)", "min_utilization: percent: invalid percentage an integer of "
     "about 401 digits: must lie between 0 and 100; e.g. 70 or \"70%\"*"),
    ('min_utilization(float("nan"))',
     "min_utilization: percent: invalid percentage nan: not a number; e.g. 70*"),
    ("min_utilization(50, warmup=10**400)", "min_utilization: warmup: invalid duration an "
     "integer of about 401 digits: too long; e.g. 2, 0.5, \"2s\" or \"500ms\"*"),
    ('min_utilization(50, warmup=float("inf"))',
     "min_utilization: warmup: invalid duration inf: must be a finite, non-negative time; e.g.*"),
    ("min_utilization(50, interval=10**400)",
     "min_utilization: interval: invalid duration an integer of about 401 digits: too long*"),
    ("requires_cuda(min_free_vram=10**400)", "requires_cuda: min_free_vram: invalid size an "
     "integer of about 401 digits: larger than 1 EiB*e.g. \"6GiB\"*"),
    ("requires_cuda(min_total_vram=-10**400)", "requires_cuda: min_total_vram: invalid size a "
     "negative integer of about 401 digits: must not be negative*"),
    ("requires_cuda(min_devices=10**5000)", "requires_cuda: min_devices: invalid value an "
     "integer of about 5001 digits: expected a whole number from 1 to 4096; e.g. min_devices=2"),
    ("requires_cuda(min_capability=10**5000)", "requires_cuda: min_capability: invalid compute "
     "capability an integer of about 5001 digits*e.g. min_capability=(8, 0)"),
    ("requires_cuda(min_torch=10**5000)",
     "requires_cuda: min_torch: invalid version an integer of about 5001 digits*"),
])
def test_bad_marker_arguments_are_collection_errors_naming_test_marker_and_value(
        pytester: pytest.Pytester, marker: str, message: str) -> None:
    fake_project(pytester)
    pytester.makepyfile(test_x=f"""
        import pytest

        @pytest.mark.{marker}
        def test_y():
            pass

        def test_fine():
            pass
    """)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"test_x.py::test_y: {message}",
                                 "*Interrupted: 1 error during collection*"])


def test_bad_marker_argument_under_xdist_is_reported_cleanly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="""
        import pytest

        @pytest.mark.max_vram("6 GiBs")
        def test_y():
            pass
    """)
    result = pytester.runpytest("-n", "2")
    assert "INTERNALERROR" not in result.stdout.str()
    result.stdout.fnmatch_lines(["test_x.py::test_y: max_vram: invalid size '6 GiBs'*"])
    assert result.ret != 0


# -- parsing, as units -----------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [
    ((8, 0), (8, 0)), ([9, 0], (9, 0)), ("8.0", (8, 0)), ("8.6", (8, 6)), ("8", (8, 0)),
    (8, (8, 0)), (8.6, (8, 6)), ("sm_80", (8, 0)), ("sm90", (9, 0)), (" 12.0 ", (12, 0)),
])
def test_parse_capability(value: object, expected: tuple[int, int]) -> None:
    assert markers.parse_capability(value) == expected


@pytest.mark.parametrize("value", [(8,), (8, 0, 1), ("8", "0"), "eight", "8.10", True, None,
                                   float("nan"), 0])
def test_parse_capability_rejects(value: object) -> None:
    with pytest.raises(ValueError, match="invalid compute capability"):
        markers.parse_capability(value)


@pytest.mark.parametrize(("have", "need", "ok"), [
    ("2.13.0+cpu", "2.1", True), ("2.1.0", "2.1", True), ("2.0.1+cu118", "2.1", False),
    ("2.10.0", "2.9", True), ("580.159.04", "535", True), ("470.82.01", "535", False),
    ("535", "535.104.05", False), ("580.159.04", "580.159.3", True), ("12.8", "12.10", False),
    # A local tag names the build, not a later release: a CUDA build of 2.11 is 2.11.
    ("2.11.0+cu130", "2.11", True), ("2.11.0+cu130", "2.11.0+cu131", True),
    # A pre-release comes before its release (PEP 440); it used to count as the release.
    ("2.1.0a0+git", "2.1", False), ("2.6.0rc1", "2.6", False), ("2.6.0rc1", "2.6.0rc1", True),
    ("2.6.0", "2.6.0rc1", True), ("2.6.0rc2", "2.6.0rc1", True), ("2.6.0rc1", "2.5.1", True),
    ("2.11.0.dev20260101+cu130", "2.11", False), ("2.11.0.dev20260101+cu130", "2.10", True),
    ("2.11.0.dev20260101", "2.11.0.dev20251231", True),
])
def test_version_at_least(have: str, need: str, ok: bool) -> None:
    assert version_at_least(have, need) is ok


@pytest.mark.parametrize(("have", "need"),
                         [("unknown", "2.1"), ("2.1", ""), ("2." + "1" * 65, "2")])
def test_version_at_least_is_none_when_a_version_cannot_be_read(have: str, need: str) -> None:
    assert version_at_least(have, need) is None


@pytest.mark.parametrize("value", ["2.6.0rc1", "2.11.0.dev20260101", "580.159.04", 535])
def test_min_torch_and_min_driver_take_pep440_versions(value: object) -> None:
    spec = markers.parse_requires_cuda(min_torch=value, min_driver=value)
    assert spec.min_torch == spec.min_driver == str(value)


@pytest.mark.parametrize("value", ["2.6.0rcx", "2.1 beta", "latest", "2.1-"])
def test_min_torch_rejects_what_is_not_a_whole_version(value: str) -> None:
    with pytest.raises(markers.MarkerError, match=r"min_torch: invalid version .*PEP 440"):
        markers.parse_requires_cuda(min_torch=value)


@pytest.mark.parametrize(("value", "seconds"), [
    (2, 2.0), (0.5, 0.5), ("2s", 2.0), ("500ms", 0.5), ("1.5 s", 1.5), ("1min", 60.0)])
def test_parse_duration(value: object, seconds: float) -> None:
    assert markers.parse_duration(value) == pytest.approx(seconds)


def test_build_spec_keeps_the_closest_limit_and_every_requirement() -> None:
    spec = markers.build_spec(
        [("max_vram", ("2GiB",), {}), ("requires_cuda", (), {"min_devices": 2}),
         ("max_vram", ("8GiB",), {"measure": "device"}), ("requires_cuda", (), {"bf16": True}),
         ("parametrize", (), {})],
        ["gpu_monitor", "tmp_path"])
    assert spec is not None
    assert spec.max_vram == markers.MaxVram(limit=2 * 2**30, measure="allocated")
    assert spec.requires == (markers.RequiresCuda(min_devices=2), markers.RequiresCuda(bf16=True))
    assert spec.fixtures == frozenset({"gpu_monitor"})
    assert spec.min_devices == 2
    assert markers.build_spec([("parametrize", (), {})], ["tmp_path"]) is None


def test_default_max_vram_parsing() -> None:
    assert markers.parse_default_max_vram("20GiB") == markers.MaxVram(
        20 * 2**30, "allocated", "gpu_max_vram")
    assert markers.parse_default_max_vram("20 GB:Reserved").measure == "reserved"
    with pytest.raises(markers.MarkerError, match="invalid size"):
        markers.parse_default_max_vram("big")


def test_summary_and_failure_sections_under_xdist(pytester: pytest.Pytester) -> None:
    fake_project(pytester)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.max_vram("1GiB")
        def test_big(fake):
            fake.allocate("2GiB")
            fake.free()

        @pytest.mark.requires_cuda(min_devices=3)
        def test_three():
            pass

        def test_fixture(gpu):
            pass

        def test_cpu():
            pass
    """)
    result = pytester.runpytest("-n", "2")
    result.assert_outcomes(passed=2, failed=1, skipped=1)
    result.stdout.fnmatch_lines_random([
        "max_vram: peak allocated GPU memory 2 GiB exceeds the 1 GiB limit by 1 GiB*",
        "*- gputrain max_vram -*",
        "gputrain: 3 GPU tests: 2 ran, 1 skipped, 1 failed",
        "  skipped 1: needs 3 CUDA GPUs, 1 visible",
    ])
