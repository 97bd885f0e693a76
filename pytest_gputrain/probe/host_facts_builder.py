"""``record.host`` -> ``run.host.*`` (``host_facts.py``): the calls behind the host time of the
profiled steps (GT117) and of the stall steps (GT118), as pure functions of the record.

For each group of steps, every call site's sampled time and every garbage collection's exact
time inside those steps compete; the call that took the most is named, with its time per step
and its share of the steps' wall time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from pytest_gputrain.probe.host_facts import HostFacts
from pytest_gputrain.probe.run_record import CallSite, HostSamples, RunRecord, StepFlag
from pytest_gputrain.units import format_value

MAX_CALLS = 5  # calls listed per group of steps
OLDEST = 2  # the generation a full collection walks
# What a call is (run.host.*_call_kind)
SITE, GC_EXPLICIT, GC_AUTOMATIC = "site", "gc-explicit", "gc-automatic"


def host_facts(record: RunRecord, steady: list[int], stall_steps: list[int]) -> HostFacts:
    """The host calls of the profiled steps and of ``stall_steps`` (0-based indices), and the
    garbage collections of the test."""
    host = record.host
    times = record.steps.times
    facts = HostFacts(samples=len(host.samples), interval=host.interval)
    _collections(facts, host, steady, times)
    labels = [site_label(site) for site in host.sites]
    window = [i for i, flag in enumerate(record.steps.flags) if flag is StepFlag.IN_WINDOW]
    why_not = host.sampler or "no stack sample fell in those steps"
    _name_call(facts, "window", _calls(host, labels, window, times), window, times,
               "profiled step", "no profiler window" if not window else why_not)
    _name_call(facts, "stall", _calls(host, labels, stall_steps, times), stall_steps, times,
               "stall step", "no stalls" if not stall_steps else why_not)
    return facts


def _name_call(facts: HostFacts, group: str, calls: list[tuple[float, str, str]],
               steps: list[int], times: list[float], step: str, why_not: str) -> None:
    """``{group}_call*`` and ``{group}_summary``: the call that took the most of ``steps``."""
    if not calls:
        facts.mark_unknown(f"{group}_call", why_not)
        facts.mark_unknown(f"{group}_summary", why_not)
        return
    seconds, label, kind = calls[0]
    total = sum(times[i] for i in steps)
    per_step = round(seconds / len(steps), 6)
    percent = _percent(seconds, total)
    setattr(facts, f"{group}_call", label)
    setattr(facts, f"{group}_call_kind", kind)
    setattr(facts, f"{group}_call_time", per_step)
    setattr(facts, f"{group}_call_percent", percent)
    setattr(facts, f"{group}_calls", [f"{name}: {format_value(_percent(part, total), '%')}"
                                       for part, name, _ in calls[:MAX_CALLS]])
    measured = "timed" if kind != SITE else "sampled"
    setattr(facts, f"{group}_summary",
            f"{label}, {format_value(per_step, 's')} per {step} "
            f"({format_value(percent, '%')} of those steps, {measured})")


def site_label(site: CallSite) -> str:
    """``source`` at file.py:line (in the library function it was inside)."""
    code = _without_comment(site.source) or f"{site.function}()"
    where = f"{os.path.basename(site.file)}:{site.line}"
    inner = f" (in {site.inner})" if site.inner else ""
    return f"`{code}` at {where}{inner}"


def _without_comment(source: str) -> str:
    """The source line without a trailing comment (two spaces and a '#', as code is written)."""
    code, _, _ = source.partition("  #")
    return code.strip()


def _calls(host: HostSamples, labels: list[str], steps: Iterable[int], times: list[float]
           ) -> list[tuple[float, str, str]]:
    """(seconds, call, kind) inside ``steps``, most first: sampled call sites, explicit
    gc.collect() calls by their site, and the automatic garbage collection."""
    wanted = {i for i in steps if 0 <= i < len(times)}
    if not wanted:
        return []
    by_label: dict[tuple[str, str], float] = {}
    # A line is one call site whatever library function it was inside at each sample: its
    # time is summed, and it is named with the function it was in for the longest.
    by_line: dict[tuple[str, int], dict[str, float]] = {}
    for step, _window, site, seconds in host.samples:
        if step in wanted:
            where = host.sites[site]
            inner = by_line.setdefault((where.file, where.line), {})
            inner[labels[site]] = inner.get(labels[site], 0.0) + seconds
    for inner in by_line.values():
        heaviest = max(inner, key=lambda label: (inner[label], label))
        by_label[(heaviest, SITE)] = sum(inner.values())
    automatic, automatic_count, automatic_full = 0.0, 0, 0
    for step, generation, seconds, site in host.collections:
        if step not in wanted:
            continue
        if site >= 0:
            where = host.sites[site]
            key = (f"gc.collect() at {os.path.basename(where.file)}:{where.line}", GC_EXPLICIT)
            by_label[key] = by_label.get(key, 0.0) + seconds
        else:
            automatic += seconds
            automatic_count += 1
            automatic_full += generation == OLDEST
    if automatic_count:
        full = f", {automatic_full} of the oldest generation" if automatic_full else ""
        label = (f"Python's automatic garbage collection ({automatic_count} "
                 f"collection{'s' if automatic_count != 1 else ''}{full})")
        by_label[(label, GC_AUTOMATIC)] = automatic
    return sorted(((seconds, label, kind) for (label, kind), seconds in by_label.items()),
                  key=lambda item: (-item[0], item[1]))


def _percent(part: float, total: float) -> float | None:
    return round(100.0 * part / total, 2) if total > 0 else None


def _collections(facts: HostFacts, host: HostSamples, steady: list[int],
                 times: list[float]) -> None:
    """The garbage collections of the test: counts and time (all of them, from the totals),
    and their share of the steady steps (those kept one by one: every collection of an older
    generation, every explicit one and every young one that took long)."""
    if not host.gc_totals and not host.collections:
        facts.gc_collections = facts.gc_full_collections = facts.gc_explicit = 0
        facts.gc_time = 0.0
    else:
        facts.gc_collections = int(sum(count for count, _ in host.gc_totals.values()))
        facts.gc_full_collections = int(host.gc_totals.get(OLDEST, [0, 0.0])[0])
        facts.gc_time = round(sum(seconds for _, seconds in host.gc_totals.values()), 6)
        explicit = [site for _, _, _, site in host.collections if site >= 0]
        facts.gc_explicit = len(explicit)
        if explicit:
            first = host.sites[max(set(explicit), key=explicit.count)]
            facts.gc_explicit_site = f"{os.path.basename(first.file)}:{first.line}"
    if not steady:
        facts.mark_unknown("gc_percent", "no steady steps")
        return
    counted = set(steady)
    inside = sum(seconds for step, _, seconds, _ in host.collections if step in counted)
    facts.gc_time_per_step = round(inside / len(steady), 6)
    facts.gc_percent = _percent(inside, sum(times[i] for i in steady))
