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

A percentile limit over few samples is decided by the largest one or two of them (for n <= 101 the linear p99
lies between the two largest values). :func:`tail_test` judges such a limit with its sample size instead: the
statement "at most ``max_fraction`` of the samples exceed ``limit``" (the p99 statement at 1 %) fails only when
a one-sided exact binomial test (:func:`binom_sf`) rejects it at level ``alpha``.
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


def binom_sf(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, p)``, exact (terms in log space, summed with ``math.fsum``).

    The shorter side is summed: the upper tail from ``k`` while its terms matter, or ``1 -`` the lower tail
    when ``k`` lies at or below the mode (the result is then at least ~0.5, so the subtraction loses nothing).
    Equal to ``scipy.stats.binom.sf(k - 1, n, p)`` to ~1e-10 (the tests pin it); stdlib only.
    """
    if not (isinstance(n, int) and n >= 0 and isinstance(k, int)):
        raise ValueError(f"binom_sf: n must be an integer >= 0 and k an integer, got k={k!r}, n={n!r}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"binom_sf: p must be in [0, 1], got {p!r}")
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p == 0.0:
        return 0.0
    if p == 1.0:
        return 1.0
    lp, lq, lnf = math.log(p), math.log1p(-p), math.lgamma(n + 1)

    def pmf(i: int) -> float:
        return math.exp(lnf - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)

    mode = math.floor((n + 1) * p)
    if k <= mode:
        return min(1.0, max(0.0, 1.0 - math.fsum(pmf(i) for i in range(k))))
    terms = []
    for i in range(k, n + 1):  # decreasing from k (> mode): stop once a term cannot change the sum
        t = pmf(i)
        terms.append(t)
        if t < 1e-17 * terms[0]:
            break
    return min(1.0, math.fsum(terms))


def tail_test(values: Iterable[float | None], limit: float | None, max_fraction: float | None,
              alpha: float) -> dict:
    """Judge "at most ``max_fraction`` of ``values`` exceed ``limit``" with the sample size of ``values``.

    A value is *late* when it is strictly greater than ``limit``. The verdict is ``fail`` when the one-sided
    exact binomial test rejects the statement at level ``alpha`` (``P(X >= late | n, max_fraction) < alpha``),
    ``pass`` otherwise, ``skipped`` when ``limit`` or ``max_fraction`` is ``None`` and ``no_data`` when there
    are no values. The record keeps the raw figures: ``n``, ``late``, ``fraction``, ``p_value``, and ``p99``
    and ``max`` of the values (reported, never deciding). With ``max_fraction`` 0.01 and ``alpha`` 0.05 a
    single late value passes from n = 6 on (1 of 78: p = 0.54), 2 from n = 36, 3 from n = 83, 4 from
    n = 138; 3 of 48 fail (p = 0.012).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"tail_test: alpha must be in (0, 1), got {alpha!r}")
    vals = [float(v) for v in values if v is not None]
    n = len(vals)
    out: dict = {"n": n, "limit": limit, "max_fraction": max_fraction, "alpha": alpha, "late": None,
                 "fraction": None, "p_value": None, "p99": percentile(vals, 99), "max": max(vals) if vals else None}
    if limit is None or max_fraction is None:
        out["verdict"] = "skipped"
        return out
    if n == 0:
        out["verdict"] = "no_data"
        return out
    late = sum(1 for x in vals if x > limit)
    p = binom_sf(late, n, max_fraction)
    out.update(late=late, fraction=late / n, p_value=p, verdict="fail" if p < alpha else "pass")
    return out
