"""Percentiles as numpy computes them by default: linear interpolation between the two nearest
values (Hyndman and Fan's type 7, R's default), from the standard library's
``statistics.quantiles(method="inclusive")``.

The wrapper adds what the library leaves to its callers: percentiles by number (0 and 100
included) and a single value (Python before 3.13 refuses one). Where values tie the library's
interpolation can land one unit in the last place beside them (``(x * 63 + x * 37) / 100``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def percentiles(values: Iterable[float], *qs: int) -> tuple[float, ...]:
    """The ``q``-th percentile of ``values`` for each whole ``q`` from 0 to 100, in order.

    ``percentiles([0, 10, 20, 30, 40], 10, 50, 90) == (4.0, 20.0, 36.0)``. Raises ``ValueError``
    for no values.
    """
    if any(not 0 <= q <= 100 for q in qs):
        raise ValueError(f"percentiles lie from 0 to 100, got {qs}")
    data = sorted(values)
    if not data:
        raise ValueError("percentiles of no values")
    if len(data) == 1:
        return (float(data[0]),) * len(qs)
    cuts = statistics.quantiles(data, n=100, method="inclusive")  # the 1st to the 99th
    return tuple(float(data[0] if q == 0 else data[-1] if q == 100 else cuts[q - 1])
                 for q in qs)
