"""The run's time series (``run.timeline.*``), for the pictures of it (the HTML report).

``timeline_facts_builder.py`` thins them from the record; ``RunFacts.timeline`` holds them.
"""

from __future__ import annotations

from pydantic import Field

from pytest_gputrain.facts import FactGroup, fact


class TimelineFacts(FactGroup):
    """The run as time series, for the pictures of it (the HTML report), on one clock: seconds
    since the test's call began. Each series keeps at most ``TIMELINE_POINTS`` points, thinned
    by ``series.keep_extremes`` (each bucket's lowest and highest values kept, so a stall or a
    peak survives). Empty in facts recorded before the timeline existed."""

    steps: int = fact(doc="optimizer steps the step series were thinned from", default=0)
    step_end: list[float] = Field(
        default_factory=list, description="s since the start: the end of each kept step")
    step_number: list[int] = Field(default_factory=list,
                                   description="1-based number of each kept step")
    step_time: list[float] = Field(default_factory=list,
                                   description="wall time of each kept step (s)")
    loader_wait: list[float] = Field(
        default_factory=list, description="time blocked in the DataLoader before each kept step "
                                          "(s)")
    memory_time: list[float] = Field(
        default_factory=list, description="s since the start of each allocator reading: the "
        "end of the step it followed, and the moment of each out-of-memory error (after the "
        "test's start, 0, when it failed before its first step)")
    allocated: list[int] = Field(default_factory=list,
                                 description="bytes allocated at each reading")
    reserved: list[int] = Field(default_factory=list,
                                description="bytes reserved by the caching allocator at each "
                                            "reading")
    nvml_time: list[float] = Field(default_factory=list,
                                   description="s since the start of each kept NVML sample")
    utilization: list[float | None] = Field(default_factory=list,
                                            description="GPU utilization (%) per sample")
    memory_used: list[int | None] = Field(
        default_factory=list, description="device memory in use, all processes (bytes)")
    process_memory: list[int | None] = Field(
        default_factory=list, description="device memory this process held (bytes)")
    sm_clock: list[float | None] = Field(default_factory=list, description="SM clock (MHz)")
    power: list[float | None] = Field(default_factory=list, description="power draw (W)")
    temperature: list[float | None] = Field(default_factory=list,
                                            description="temperature (°C)")
    throttled: list[bool | None] = Field(
        default_factory=list, description="a hardware slowdown, thermal slowdown or power "
                                          "brake held the clocks at that sample")
    sync_wait: list[float] = Field(
        default_factory=list, description="time inside host-device syncs the code asked for "
                                          "during each kept step (s)")
    save_steps: list[int] = Field(
        default_factory=list, description="1-based number of the step each checkpoint save fell "
                                          "in (steps + 1: after the last step)")
    compile_steps: list[int] = Field(
        default_factory=list, description="1-based number of the step in which each "
                                          "torch.compile compilation began")
    window_start: float | None = fact("s", "when the profiler window opened")
    window_end: float | None = fact("s", "when the profiler window closed")
    oom_times: list[float] = Field(default_factory=list,
                                   description="s since the start of each out-of-memory error")
