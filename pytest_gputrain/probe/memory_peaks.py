"""A test's own memory peaks, from the caching allocator's counters (``memory_stats`` keys).

Pure: shared by the run facts (``memory_facts_builder.py``) and the failure facts
(``failures.py``), which read the same counters at the end of a test or right after its
failure.
"""

from __future__ import annotations

from typing import Any


def own_peaks(start: dict[str, Any], end: dict[str, Any], before_reset: dict[str, int]
              ) -> dict[str, int]:
    """``peak_allocated``, ``peak_reserved``, ``reserved_start``, ``reserved_grown`` and
    ``peak_memory`` of one test, from ``memory_stats`` keys.

    The probe resets the allocator's peaks when the test starts, so the peak allocated is the
    test's own. Reserved memory is not: a cache an earlier test left stays reserved, so the raw
    peak reserved can be another test's figure. The test's own share of it is how far it grew
    the cache (``reserved_grown``), and its own peak (``peak_memory``) the larger of its peak
    allocated and that growth; with an empty cache at the start that is the peak reserved.
    """
    found: dict[str, int] = {}
    reserved_start = int(start.get("reserved_bytes.all.current", 0))
    found["reserved_start"] = reserved_start
    allocated = [int(v) for v in (end.get("allocated_bytes.all.peak"),
                                  before_reset.get("allocated_bytes.all.peak")) if v is not None]
    reserved = [int(v) for v in (end.get("reserved_bytes.all.peak"),
                                 before_reset.get("reserved_bytes.all.peak")) if v is not None]
    if allocated:
        found["peak_allocated"] = max(allocated)
    if reserved:
        found["peak_reserved"] = max(reserved)
        # A peak read at the start exceeds the current reserve when the probe did not reset it
        # (the max_vram marker measures from the test's setup): growth counts from there.
        baseline = max(reserved_start, int(start.get("reserved_bytes.all.peak", 0)))
        found["reserved_grown"] = max(0, found["peak_reserved"] - baseline)
    if allocated or reserved:
        found["peak_memory"] = max(found.get("peak_allocated", 0), found.get("reserved_grown", 0))
    return found
