"""Percentiles and the median: the one definition of each that every module uses (stdlib only, so the load
generator need not import numpy).

Two definitions, chosen with ``method=``:

- ``"linear"`` (default): Hyndman & Fan type 7, numpy's default. For sorted values x[0..n-1] the
  percentile q (0..100) sits at position ``pos = (n - 1) * (q / 100)``; with ``i = floor(pos)`` and
  ``t = pos - i`` it is ``x[i] + (x[i+1] - x[i]) * t`` (computed as ``x[i+1] - (x[i+1] - x[i]) * (1 - t)``
  when ``t >= 0.5``, and ``x[n-1]`` when ``pos >= n - 1``), the same floating-point steps as
  ``numpy.percentile(..., method="linear")``, so results equal numpy's to the last bit (the tests pin it).
  Latency percentiles of cells (p50/p95/p99), capacity steps and the load generator's timing use it.
- ``"nearest_rank"``: the smallest value with at least q % of the values at or below it,
  ``x[max(1, ceil(q / 100 * n)) - 1]``; always one of the values. Corpus length statistics use it.

``None`` values are dropped; no values give ``None``. :func:`median` is the 50th percentile's usual
form (the mean of the two middle values for an even count, as ``numpy.median`` and ``statistics.median``),
with ``None`` and NaN dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

METHODS = ("linear", "nearest_rank")


def percentile(values: Iterable[float | None], q: float, method: str = "linear") -> float | None:
    """The ``q``-th percentile (``q`` in 0..100) of ``values`` by ``method`` (see the module docstring)."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in 0..100, got {q!r}")
    n = len(xs)
    if method == "nearest_rank":
        return xs[max(1, math.ceil(q / 100 * n)) - 1]
    if method != "linear":
        raise ValueError(f"percentile method must be one of {METHODS}, got {method!r}")
    xs = [float(v) for v in xs]
    pos = (n - 1) * (q / 100)
    if pos >= n - 1:
        return xs[-1]
    i = math.floor(pos)
    t = pos - i
    a, b = xs[i], xs[i + 1]
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def median(values: Iterable[float | None], *, finite: bool = False) -> float | None:
    """The median of the values that are numbers (``None`` and NaN dropped; with ``finite``, also infinities
    and anything that is not a number); no values give ``None``."""
    import statistics

    if finite:
        values = (finite_or_none(v) for v in values)
    xs = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(statistics.median(xs)) if xs else None


def finite_or_none(x) -> float | None:
    """``x`` as a finite float, else None (None, text, NaN and infinities alike)."""
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None
