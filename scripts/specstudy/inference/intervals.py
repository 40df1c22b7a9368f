"""Intervals of a geometric mean of positive ratios: Student-t on logs, exact/BCa bootstrap, summaries.

:func:`describe` summarises per-repeat ratios (median, min/max, quartiles, geometric mean) with a
confidence interval of the geometric mean. The primary interval (``ci_method``, default ``t_log``) is
:func:`log_interval`, a Student-t interval on log ratios with n-1 degrees of freedom: with 2–5 repeats
the percentile bootstrap under-covers badly (the bootstrap distribution of a mean of 3 values is too
narrow by a factor ≈ sqrt((n-1)/n) and ignores t quantiles), which :func:`specstudy.inference.simulate.coverage` measures
and the tests pin. :func:`bootstrap_interval` (exact enumeration of all n^n resamples for n ≤ 6, BCa
with fall-back to percentile when BCa is undefined) is reported alongside.

The Student-t interval on log ratios is written here only: :func:`log_interval` (one sample),
:func:`log_intervals` (many samples of one array at once, for the simulations) and their half-width
:func:`t_half_width`.

These are general methods: plain sequences of numbers in, floats and plain dicts out; nothing here
knows about arms, cells or the study (:mod:`specstudy.inference.stats` applies them to the comparisons).
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import product
from typing import Any

from specstudy.core.stat_util import median, percentile


@lru_cache(maxsize=4096)
def t_quantile(df: int, confidence: float) -> float:
    """The two-sided Student-t quantile of ``confidence`` with ``df`` degrees of freedom."""
    from scipy import stats as st

    return float(st.t.ppf(0.5 + confidence / 2, df))


def t_half_width(sd, n: int, confidence: float):
    """Half-width of the Student-t interval (n-1 df) of a mean of ``n`` values with sample SD ``sd`` (a float
    or an array of them)."""
    return t_quantile(n - 1, confidence) * sd / math.sqrt(n)


def log_interval(logs: list[float], confidence: float) -> tuple[float, float, float, float] | None:
    """(mean, sd, lo, hi) of the Student-t interval on log ratios; lo/hi on the ratio scale."""
    n = len(logs)
    if n < 2:
        return None
    m = sum(logs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (n - 1))
    h = t_half_width(sd, n, confidence)
    return m, sd, math.exp(m - h), math.exp(m + h)


def log_intervals(logs, confidence: float, axis: int = 1):
    """:func:`log_interval` over many samples at once: ``logs`` an array whose ``axis`` holds each sample's
    log ratios; (mean, sd, lo, hi) arrays, all on the log scale."""
    m = logs.mean(axis=axis)
    sd = logs.std(axis=axis, ddof=1)
    h = t_half_width(sd, logs.shape[axis], confidence)
    return m, sd, m - h, m + h


@lru_cache(maxsize=8)
def _all_resamples(n: int):
    import numpy as np

    return np.array(list(product(range(n), repeat=n)), dtype=np.int64)


def _boot_means(x, resamples: int, seed: int):
    import numpy as np

    n = len(x)
    if n <= 6:  # exact bootstrap: every one of the n^n equally likely resamples
        idx = _all_resamples(n)
    else:
        idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    return x[idx].mean(axis=1)


def bootstrap_interval(values, confidence: float = 0.95, method: str = "bca", resamples: int = 9999,
                       seed: int = 12345) -> tuple[tuple[float, float] | None, str]:
    """Bootstrap interval of the geometric mean; returns (interval, method actually used)."""
    import numpy as np
    from scipy import stats as st

    x = np.log(np.asarray(values, dtype=float))
    n = len(x)
    if n < 2:
        return None, "none"
    boots = _boot_means(x, resamples, seed)
    alpha = 1 - confidence
    lo_q, hi_q = alpha / 2, 1 - alpha / 2
    used = "percentile"
    if method == "bca":
        theta = x.mean()
        prop = float(np.mean(boots < theta))
        jack = np.array([np.delete(x, i).mean() for i in range(n)])
        d = jack.mean() - jack
        denom = 6 * (np.sum(d**2) ** 1.5)
        if 0 < prop < 1 and denom > 0:
            z0 = st.norm.ppf(prop)
            a = float(np.sum(d**3) / denom)
            za, zb = st.norm.ppf(lo_q), st.norm.ppf(hi_q)
            lo_q = float(st.norm.cdf(z0 + (z0 + za) / (1 - a * (z0 + za))))
            hi_q = float(st.norm.cdf(z0 + (z0 + zb) / (1 - a * (z0 + zb))))
            used = "bca"
        else:
            used = "percentile (BCa undefined: degenerate bootstrap distribution)"
    lo, hi = np.quantile(boots, [lo_q, hi_q])
    return (math.exp(float(lo)), math.exp(float(hi))), used


def describe(values, confidence: float = 0.95, ci_method: str = "t_log", resamples: int = 9999,
             seed: int = 12345) -> dict:
    """Median, spread, geometric mean and CI of positive per-repeat ratios."""
    import numpy as np

    vals = [float(v) for v in values if v is not None and np.isfinite(v) and v > 0]
    n = len(vals)
    out: dict[str, Any] = {"n": n, "values": vals, "median": None, "min": None, "max": None, "q1": None,
                           "q3": None, "geomean": None, "ci_low": None, "ci_high": None, "ci_method": ci_method,
                           "boot_low": None, "boot_high": None, "boot_method": None, "ci_note": ""}
    if n == 0:
        out["ci_note"] = "no valid repeats"
        return out
    a = np.asarray(vals)
    q1, q3 = percentile(vals, 25), percentile(vals, 75)
    out.update(median=median(vals), min=float(a.min()), max=float(a.max()), q1=float(q1), q3=float(q3),
               geomean=float(np.exp(np.log(a).mean())))
    if n < 2:
        out["ci_note"] = "one repeat: no interval"
        return out
    t_iv = log_interval([math.log(v) for v in vals], confidence)
    t_ci = None if t_iv is None else (t_iv[2], t_iv[3])
    boot, used = bootstrap_interval(a, confidence, "bca" if ci_method != "bootstrap_percentile" else "percentile",
                                    resamples, seed)
    out["boot_low"], out["boot_high"] = boot if boot else (None, None)
    out["boot_method"] = used
    primary = t_ci if ci_method == "t_log" else boot
    out["ci_low"], out["ci_high"] = primary if primary else (None, None)
    if ci_method != "t_log":
        out["ci_method"] = f"bootstrap ({used})"
    if n < 5 and ci_method != "t_log":
        out["ci_note"] = "bootstrap with < 5 repeats under-covers; see coverage simulation"
    return out
