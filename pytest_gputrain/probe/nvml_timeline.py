"""The NVML timeline of the device a test trains on: samples taken on a thread while it runs.

``NvmlTimelineReader`` starts ``collect.sampler.NvmlSampler`` at the test's first CUDA step,
samples every ``NVML_INTERVAL`` seconds, never on the training thread, and keeps the samples in
``record.nvml`` when the test ends. Each sample reads this process's memory and other
processes' (``session_pids``: this process and its pytest-xdist siblings are not "others").
"""

from __future__ import annotations

import os
import time
from typing import Any

from pytest_gputrain.facts import DeviceSample
from pytest_gputrain.probe.run_record import RunRecord

NVML_INTERVAL = 0.1  # seconds between NVML samples (on the sampler thread)
PIDS_REFRESH = 2.0  # seconds between re-reads of the session's PIDs while others show up


class NvmlTimelineReader:
    """Starts and stops the sampler of one test; ``read`` is the sampler's reading."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self._sampler: Any = None  # the NVML sampler thread, on CUDA runs

    def start(self, cuda_index: int) -> None:
        """Sample NVML every NVML_INTERVAL seconds on a thread, off the training thread.

        The thread does not change what Python 3.12+ says when a DataLoader forks its
        workers: torch's own threads (CUDA's, the intra-op pool's) already make the process
        multi-threaded, and that warning already comes without the probe."""
        timeline = self.record.nvml
        try:
            from pytest_gputrain.collect import nvml
            from pytest_gputrain.collect.sampler import NvmlSampler

            if not nvml.shared().available:
                return
            index = nvml.index_for_cuda_device(cuda_index)
            if index is None:
                return
            timeline.index = index
            timeline.power_limit, timeline.power_limit_default = (
                reading.value if reading.ok else None
                for reading in nvml.read_power_limits(index))
            timeline.session_pids = nvml.session_process_ids()
            timeline.pids_read = timeline.started = time.perf_counter()
            self._sampler = NvmlSampler(index, NVML_INTERVAL, read=self.read).start()
        except Exception as exc:
            timeline.index = None
            self.record.errors.append(f"NVML sampling not started: {exc}")

    def stop(self) -> None:
        """Stop the sampler (it takes a last sample) and keep its timeline."""
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return
        try:
            timeline = self.record.nvml
            timeline.before_stop = len(sampler.samples)
            sampler.stop()  # and one last sample, after the test
            timeline.samples = sampler.samples
        except Exception as exc:
            self.record.errors.append(f"NVML sampling: {exc}")

    def read(self, index: int) -> DeviceSample | None:
        """One sample, on the sampler thread: this process's memory and other processes'
        (``session_pids`` re-read while others show up: a sibling started since is no other)."""
        from pytest_gputrain.collect import nvml

        timeline = self.record.nvml
        now = time.perf_counter()
        if timeline.other_seen and now - timeline.pids_read >= PIDS_REFRESH:
            timeline.session_pids = nvml.session_process_ids()
            timeline.pids_read = now
        sample = nvml.read_sample(index, pids=[os.getpid()], session_pids=timeline.session_pids)
        timeline.other_seen = bool(sample is not None and sample.other_process_count)
        return sample
