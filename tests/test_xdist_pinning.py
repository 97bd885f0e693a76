"""pytest-xdist GPU pinning: the assignment as a pure function, then real ``-n 2`` runs."""

from __future__ import annotations

import types

import pytest
from gputrain_fake import fake_project
from hypothesis import given
from hypothesis import strategies as st

from pytest_gputrain.assertions.worker_gpus import (
    NOTES_KEY,
    WORKERINPUT_KEY,
    PinningError,
    assign_devices,
    parse_per_worker,
    parse_visible,
    pin_worker,
)
from pytest_gputrain.xdist import send_to_controller, sent_by_worker, worker_number

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")


# -- assign_devices --------------------------------------------------------------------------------

def test_one_gpu_per_worker_in_order() -> None:
    assert [assign_devices(i, 4, 1, None, 8) for i in range(4)] == [["0"], ["1"], ["2"], ["3"]]


def test_several_gpus_per_worker() -> None:
    assert [assign_devices(i, 2, 2, None, 4) for i in range(2)] == [["0", "1"], ["2", "3"]]


def test_callers_visible_devices_are_the_pool() -> None:
    visible = "3,5,6,7"
    assert [assign_devices(i, 2, 2, visible, 8) for i in range(2)] == [["3", "5"], ["6", "7"]]
    uuids = "GPU-aaaa,GPU-bbbb"
    assert [assign_devices(i, 2, 1, uuids, 8) for i in range(2)] == [["GPU-aaaa"], ["GPU-bbbb"]]


def test_workers_never_get_a_gpu_the_caller_excluded() -> None:
    with pytest.raises(PinningError, match=r"3 xdist workers x 1 GPU each need 3 GPUs, 2 "
                                           r"available \(CUDA_VISIBLE_DEVICES='4,5'\): run with "
                                           r"-n 2, or add --gpu-share"):
        assign_devices(0, 3, 1, "4,5", 8)


def test_more_workers_than_gpus_is_an_error_unless_shared() -> None:
    with pytest.raises(PinningError, match=r"32 xdist workers .* need 32 GPUs, 8 available "
                                           r"\(NVML sees 8\)"):
        assign_devices(0, 32, 1, None, 8)
    shared = [assign_devices(i, 32, 1, None, 8, share=True)[0] for i in range(32)]
    assert shared == [str(i % 8) for i in range(32)]  # round-robin, not all on GPU 0


def test_sharing_with_several_gpus_per_worker_keeps_each_workers_gpus_distinct() -> None:
    assert [assign_devices(i, 3, 2, None, 4, share=True) for i in range(3)] == [
        ["0", "1"], ["2", "3"], ["0", "1"]]
    assert assign_devices(1, 2, 2, None, 3, share=True) == ["2", "0"]


def test_one_gpu_shared_by_two_workers() -> None:
    assert [assign_devices(i, 2, 1, None, 1, share=True) for i in range(2)] == [["0"], ["0"]]


@pytest.mark.parametrize(("args", "message"), [
    ((0, 2, 2, None, 1, True), r"--gpu-per-worker=2 but only 1 GPU available \(NVML sees 1\)"),
    ((0, 1, 0, None, 8, False), r"--gpu-per-worker must be 1 or more"),
    ((2, 2, 1, None, 8, False), r"worker 2 is not one of 2 workers"),
    ((0, 1, 1, None, None, False), r"cannot count the GPUs"),
    ((0, 1, 1, "", 8, False), r"no GPU to assign \(CUDA_VISIBLE_DEVICES=''\)"),
    ((0, 1, 1, None, 0, False), r"no GPU to assign \(NVML sees 0\)"),
])
def test_impossible_assignments(args: tuple[int, int, int, str | None, int | None, bool],
                                message: str) -> None:
    with pytest.raises(PinningError, match=message):
        assign_devices(*args)


def test_parse_visible_follows_cuda_rules() -> None:
    assert parse_visible(None) is None
    assert parse_visible("") == []
    assert parse_visible(" 0, 2 ,3") == ["0", "2", "3"]
    assert parse_visible("0,9,1", device_count=4) == ["0"]  # CUDA stops at the first bad one
    assert parse_visible("1,-1,2") == ["1"]
    assert parse_visible("GPU-abc,MIG-def") == ["GPU-abc", "MIG-def"]


@given(n_workers=st.integers(1, 16), per_worker=st.integers(1, 4),
       device_count=st.integers(1, 16), share=st.booleans())
def test_assignments_stay_in_the_pool_and_never_overlap_without_sharing(
        n_workers: int, per_worker: int, device_count: int, share: bool) -> None:
    try:
        assigned = [assign_devices(i, n_workers, per_worker, None, device_count, share)
                    for i in range(n_workers)]
    except PinningError:
        assert per_worker > device_count or (n_workers * per_worker > device_count and not share)
        return
    pool = {str(i) for i in range(device_count)}
    for devices in assigned:
        assert len(devices) == per_worker == len(set(devices))
        assert set(devices) <= pool
    flat = [d for devices in assigned for d in devices]
    if n_workers * per_worker <= device_count:
        assert len(flat) == len(set(flat))
    else:  # shared: balanced within one GPU
        counts = [flat.count(d) for d in pool]
        assert max(counts) - min(counts) <= 1


def test_option_parsing() -> None:
    assert parse_per_worker(None) is None
    assert parse_per_worker("") is None
    assert parse_per_worker("2") == 2
    for bad in ("0", "shared", "-1", "1.5"):
        with pytest.raises(ValueError, match="is not a whole number >= 1"):
            parse_per_worker(bad)
    assert worker_number("gw12") == 12
    assert worker_number("master") is None


# -- real xdist runs, with a fake GPU count ------------------------------------------------------

PIN_TEST = """
    import os
    import pytest

    @pytest.mark.parametrize("i", range(6))
    def test_pinned(i, worker_id):
        expected = {expected!r}[worker_id]
        assert os.environ["CUDA_VISIBLE_DEVICES"] == expected
"""


def test_two_workers_each_get_their_own_gpu(pytester: pytest.Pytester) -> None:
    fake_project(pytester, "gpu_inventory(count=2)")
    pytester.makepyfile(PIN_TEST.format(expected={"gw0": "0", "gw1": "1"}))
    result = pytester.runpytest("-n", "2", "--gpu-per-worker=1")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["gputrain: pinning 2 xdist workers to GPUs "
                                 "(CUDA_VISIBLE_DEVICES): gw0=0 gw1=1"])


def test_pinning_from_the_ini_file(pytester: pytest.Pytester) -> None:
    fake_project(pytester, "gpu_inventory(count=4)")
    pytester.makeini("[pytest]\ngpu_per_worker = 2\n")
    pytester.makepyfile(PIN_TEST.format(expected={"gw0": "0,1", "gw1": "2,3"}))
    pytester.runpytest("-n", "2").assert_outcomes(passed=6)


def test_workers_take_gpus_from_the_callers_visible_devices(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_project(pytester, "gpu_inventory(count=8)")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,2")
    pytester.makepyfile(PIN_TEST.format(expected={"gw0": "6", "gw1": "2"}))
    pytester.runpytest("-n", "2", "--gpu-per-worker=1").assert_outcomes(passed=6)


def test_shared_gpu(pytester: pytest.Pytester) -> None:
    fake_project(pytester, "gpu_inventory(count=1)")
    pytester.makepyfile(PIN_TEST.format(expected={"gw0": "0", "gw1": "0"}))
    result = pytester.runpytest("-n", "2", "--gpu-per-worker=1", "--gpu-share")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["gputrain: pinning 2 xdist workers to GPUs "
                                 "(CUDA_VISIBLE_DEVICES, shared): gw0=0 gw1=0"])


def test_more_workers_than_gpus_is_a_usage_error(pytester: pytest.Pytester) -> None:
    fake_project(pytester, "gpu_inventory(count=1)")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-n", "2", "--gpu-per-worker=1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: gputrain: 2 xdist workers x 1 GPU each need 2 GPUs, 1 available (NVML sees 1): "
        "run with -n 1, or add --gpu-share to let workers share GPUs round-robin"])


def test_no_gpu_means_no_pinning_and_a_note(pytester: pytest.Pytester,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_project(pytester, "cpu_inventory()")
    pytester.makepyfile("""
        import os

        def test_untouched():
            assert "CUDA_VISIBLE_DEVICES" not in os.environ
    """)
    result = pytester.runpytest("-n", "2", "--gpu-per-worker=1")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["gputrain: --gpu-per-worker: no GPU to pin workers to (the "
                                 "NVIDIA driver is not installed*); workers are not pinned"])
    # Said once, by the controller: the workers follow its decision instead of each warning
    # (on their own stderr, as raw UserWarnings with this package's file paths).
    worker_stderr = capfd.readouterr().err
    assert "not pinned" not in worker_stderr and "UserWarning" not in worker_stderr
    assert "not pinned" not in result.stdout.str().replace("workers are not pinned", "")


def test_a_worker_that_touched_cuda_before_pinning_says_so_in_one_line(
        pytester: pytest.Pytester, capfd: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The inner run's controller is this process: when this suite itself runs under xdist it
    # must not look like a worker to the conftest below.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    fake_project(pytester, "gpu_inventory(count=2)")
    # A conftest that initialises CUDA at import, after changing the variable: the worker's
    # pinning comes too late for it.
    conftest = pytester.path / "conftest.py"
    conftest.write_text(conftest.read_text() + """
import os
if "PYTEST_XDIST_WORKER" in os.environ:
    import torch
    torch.cuda.is_initialized = lambda: True
    os.environ["CUDA_VISIBLE_DEVICES"] = "1,0"
""")
    pytester.makepyfile(PIN_TEST.format(expected={"gw0": "0", "gw1": "1"}))
    result = pytester.runpytest("-n", "2", "--gpu-per-worker=1")
    result.assert_outcomes(passed=6)
    late = ("gputrain: {} CUDA was initialised before the worker could be pinned to "
            "CUDA_VISIBLE_DEVICES={} (a conftest or plugin touched CUDA at import); it may use "
            "the wrong GPU")
    lines = result.stdout.lines
    assert late.format("gw0:", "0") in lines and late.format("gw1:", "1") in lines
    assert "warnings summary" not in result.stdout.str()
    worker_stderr = capfd.readouterr().err
    assert "UserWarning" not in worker_stderr and "xdist.py" not in worker_stderr


def test_a_worker_the_controller_did_not_pin_pins_itself_or_tells_why() -> None:
    """Without the controller's decision (no key in workerinput) a worker works out its own
    GPUs; when it cannot, it tells the reason (the plugin sends it to the controller)."""
    config = types.SimpleNamespace(workerinput={"workerid": "gw1", "workercount": 2})
    told: list[str] = []
    no_gpu = pin_worker(config, 1, False, lambda: (None, "no NVML"),  # type: ignore[arg-type]
                        told.append)
    assert no_gpu is None
    assert told == [
        "not pinned to a GPU: cannot count the GPUs (NVML not available) and "
        "CUDA_VISIBLE_DEVICES is not set"]
    config.workerinput[WORKERINPUT_KEY] = None  # the controller decided: not pinned
    told.clear()
    assert pin_worker(config, 1, False, lambda: (None, "no NVML"),  # type: ignore[arg-type]
                      told.append) is None
    assert told == []


def test_what_a_worker_sends_reaches_the_controller_as_json_data() -> None:
    worker = types.SimpleNamespace(workeroutput={})
    send_to_controller(worker, NOTES_KEY, ["a note", ("a", 1)])  # type: ignore[arg-type]
    assert isinstance(worker.workeroutput[NOTES_KEY], str)  # one form on the wire: JSON text
    assert sent_by_worker(worker, NOTES_KEY) == ["a note", ["a", 1]]
    assert sent_by_worker(worker, "nothing", []) == []
    assert sent_by_worker(types.SimpleNamespace(), NOTES_KEY, []) == []  # a crashed worker
    with pytest.raises(TypeError, match=r"workeroutput.*must be JSON data"):
        send_to_controller(worker, "bad", {1, 2})  # type: ignore[arg-type]


def test_bad_per_worker_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--gpu-per-worker=shared")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpu-per-worker: 'shared' is not a "
                                 "whole number >= 1 (e.g. 1; add --gpu-share*"])


def test_without_xdist_the_option_does_nothing(pytester: pytest.Pytester,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_project(pytester, "gpu_inventory(count=2)")
    pytester.makepyfile("""
        import os

        def test_untouched():
            assert "CUDA_VISIBLE_DEVICES" not in os.environ
    """)
    pytester.runpytest("--gpu-per-worker=1").assert_outcomes(passed=1)
