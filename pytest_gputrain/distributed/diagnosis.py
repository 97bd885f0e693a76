"""The launches' diagnosis: under ``--gpu-diagnose``, every launch a test makes records per-rank
facts (``DistributedRunFacts``), handed to the diagnosis as records of scope ``distributed``
(``add_test_record``, with lines that describe the launch) and judged there, where the test ran;
the findings and the lines go to the test's report section "gputrain diagnosis".
A test that wraps a model in ``nn.DataParallel`` in its own process is recorded too (GT304).

Loaded by ``plugin.py`` only when the diagnosis runs.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_gputrain.diagnosis import Diagnosis

SCOPE = "distributed"


class ItemRecorder:
    """Collects the launches (and DataParallel use) of one test while it runs."""

    def __init__(self, nodeid: str, probe: bool) -> None:
        self.nodeid = nodeid
        self.probe = probe
        self.facts: list[Any] = []
        self.data_parallel_devices = 0

    def record(self, facts: Any) -> None:
        if getattr(facts, "test", None) is None:
            facts.test = self.nodeid
        self.facts.append(facts)


def _patch_data_parallel(recorder: ItemRecorder) -> Callable[[], None]:
    """Count the GPUs of any nn.DataParallel the test builds in its own process."""
    torch = sys.modules.get("torch")
    parallel = getattr(getattr(torch, "nn", None), "DataParallel", None)
    if parallel is None:
        return lambda: None
    original = parallel.__init__

    @functools.wraps(original)
    def init(module: Any, *args: Any, **kwargs: Any) -> None:
        original(module, *args, **kwargs)
        count = len(getattr(module, "device_ids", None) or [])
        recorder.data_parallel_devices = max(recorder.data_parallel_devices, count)

    parallel.__init__ = init

    def restore() -> None:
        parallel.__init__ = original

    return restore


_RECORDER = pytest.StashKey[ItemRecorder]()


class DistributedDiagnosis:
    """Registered under --gpu-diagnose, in every process that runs tests: records each test's
    launches and judges them there (the records reach the xdist controller with the others)."""

    def __init__(self, config: pytest.Config, session: Diagnosis) -> None:
        self.config = config
        self.session = session

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None
                                ) -> Generator[None, object, object]:
        # By module path, as the fixture imports launch(): a package attribute can outlive the
        # module in sys.modules (pytester's in-process runs forget modules they imported).
        from pytest_gputrain.distributed.launcher import reset_recorder, set_recorder

        recorder = ItemRecorder(item.nodeid, probe=True)
        item.stash[_RECORDER] = recorder
        token = set_recorder(recorder)
        restore = _patch_data_parallel(recorder)
        try:
            return (yield)
        finally:
            restore()
            reset_recorder(token)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        recorder = item.stash.get(_RECORDER, None)
        if recorder is None or call.when != "call":
            return report
        launches = list(recorder.facts)
        if recorder.data_parallel_devices:
            from pytest_gputrain.distributed.launch_facts import in_process_facts

            launches.append(in_process_facts(item.nodeid, recorder.data_parallel_devices))
        if launches:
            from pytest_gputrain.distributed.launch_facts import launch_lines

            for facts in launches:
                self.session.add_test_record(item, SCOPE, facts, launch_lines(facts))
        return report
