"""Where the training thread spent host time (``run.host.*``): the calls the host-time rules
name (GT117, GT118), from the stack samples and garbage-collection timings of
``host_stacks.HostWatch``. Built by ``host_facts_builder.py``.

A *call* is either a call site (``file.py:88`` with its source line and, where the thread was
inside a library, the innermost library function it was in) or Python's garbage collection
(``gc.collect()`` at its call site, or the automatic collection), whichever took more of the
steps judged. Sampled times are estimates (a sample every ``interval``); collection times are
exact.
"""

from __future__ import annotations

from pydantic import Field

from pytest_gputrain.facts import FactGroup, fact


class HostFacts(FactGroup):
    """The host calls behind the host time of the profiled steps and of the stalls."""

    samples: int = fact(doc="stack samples of the training thread taken", default=0)
    interval: float | None = fact("s", "time between two stack samples while sampling")
    window_call: str | None = fact(
        doc="the call that took most of the profiled steps' time on the host: a call site "
            "(file:line, its source, the library function it was in) or the garbage collection")
    window_call_kind: str | None = fact(
        doc="what that call is: site (a sampled call site), gc-explicit (gc.collect() calls), "
            "gc-automatic (Python's automatic garbage collection)")
    window_call_time: float | None = fact("s", "that call's time per profiled step")
    window_call_percent: float | None = fact("%", "that call's time / the profiled steps' time")
    window_summary: str | None = fact(
        doc="that call, its time per profiled step and its share, in words (for messages)")
    window_calls: list[str] = Field(
        default_factory=list, description="the calls of the profiled steps, most time first, "
        "with their share of those steps (at most 5)")
    stall_call: str | None = fact(doc="the call that took most of the stall steps' time "
                                      "(run.stalls.step_numbers)")
    stall_call_kind: str | None = fact(doc="what that call is (as window_call_kind)")
    stall_call_time: float | None = fact("s", "that call's time per stall step")
    stall_call_percent: float | None = fact("%", "that call's time / the stall steps' time")
    stall_summary: str | None = fact(
        doc="that call, its time per stall step and its share, in words (for messages)")
    stall_calls: list[str] = Field(
        default_factory=list, description="the calls of the stall steps, most time first (at "
        "most 5)")
    gc_collections: int | None = fact(doc="garbage collections during the test's steps")
    gc_full_collections: int | None = fact(
        doc="of those, collections of the oldest generation (2), which walk every object")
    gc_explicit: int | None = fact(doc="of those, explicit gc.collect() calls")
    gc_explicit_site: str | None = fact(doc="where the explicit gc.collect() calls were made")
    gc_time: float | None = fact("s", "time inside garbage collections during the steps")
    gc_time_per_step: float | None = fact("s", "that time per steady step (mean)")
    gc_percent: float | None = fact("%", "garbage-collection time in the steady steps / their "
                                         "wall time")
