"""Downsampling time series for people to look at: fewer points, the extremes kept.

A timeline of a long test has thousands of samples; a chart of it needs a few hundred. Keeping
every n-th sample would drop a short stall or a one-sample power peak, which is what the reader
is looking for, so ``keep_extremes`` splits the series into buckets and keeps, in each, the
samples holding the lowest and the highest value of every column (the idea of M4 and of
"min/max decimation" in charting libraries). The first and last samples are always kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")
Column = Sequence[float | int | bool | None]


def _picked(columns: Sequence[Column], size: int, buckets: int) -> list[int]:
    chosen = {0, size - 1}
    for bucket in range(buckets):
        start, end = bucket * size // buckets, (bucket + 1) * size // buckets
        if start >= end:
            continue
        found = False
        for column in columns:
            low = high = -1
            low_value = high_value = 0.0
            for index in range(start, end):
                value = column[index]
                if value is None:
                    continue
                if low < 0 or value < low_value:
                    low, low_value = index, value
                if high < 0 or value > high_value:
                    high, high_value = index, value
            if low >= 0:
                chosen.update((low, high))
                found = True
        if not found:
            chosen.add(start)  # a bucket with no values keeps its place on the time axis
    return sorted(chosen)


def keep_extremes(columns: Sequence[Column], limit: int) -> list[int]:
    """The indices to keep so that at most ``limit`` samples remain (``limit`` >= 2).

    ``columns`` are series of equal length sampled at the same moments (None: not measured at
    that moment). Each bucket gives up to two samples per column, fewer where columns peak
    together; as many buckets are used as that leaves room for.
    """
    if limit < 2:
        raise ValueError(f"keep at least 2 samples, not {limit}")
    size = len(columns[0]) if columns else 0
    if any(len(column) != size for column in columns):
        raise ValueError("the columns of a series must have the same length")
    if size <= limit:
        return list(range(size))
    # Each bucket gives at most two samples a column: that many buckets always fit. Where the
    # columns peak together fewer are kept, and a second try uses the room left.
    buckets = max(1, (limit - 2) // (2 * max(1, len(columns))))
    best = _picked(columns, size, buckets)
    if len(best) < limit:
        wider = min(size, buckets * limit // max(1, len(best)))
        if wider > buckets:
            picked = _picked(columns, size, wider)
            if len(picked) <= limit:
                best = picked
    if len(best) > limit:  # more columns than the limit has room for: every n-th sample
        step = (size - 1) / (limit - 1)
        return sorted({round(i * step) for i in range(limit)})
    return best


def gaps(moments: Sequence[float]) -> list[float]:
    """The time from each moment to the one before it (0 for the first)."""
    return [b - a for a, b in zip([*moments[:1], *moments[:-1]], moments, strict=True)]


def take(values: Sequence[T], indices: Sequence[int]) -> list[T]:
    """``values`` at ``indices``."""
    return [values[index] for index in indices]
