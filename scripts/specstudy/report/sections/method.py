"""The report's sections on the statistics: the explanatory model, the pre-registered hypotheses, and the
statistical method with the simulated coverage of its intervals.
"""

from __future__ import annotations

from specstudy.report.blocks import fmt


def declared_hypotheses(config: dict) -> tuple[list[dict] | None, str | None]:
    """The pre-registered hypotheses of the study config (None without a pre-registration)."""
    from specstudy.study.prereg import load_prereg, prereg_path

    if not (config.get("study") or {}).get("preregistration"):
        return None, None
    prereg = load_prereg(config)
    return list(prereg.get("hypotheses") or []), str(prereg_path(config))


def model_section(B, model):
    B.append(("h", 2, "Explanatory model"))
    B.append(("p", model["label"] + ". Deployment-level effects; coefficients describe associations in the screened "
                   "design and are not tests of the recommendation."))
    if not model.get("fitted"):
        B.append(("p", f"Not fitted: {model.get('note')}"))
        return
    B.append(("p", f"{model['formula']}; n = {model['n']}, R² = {model['r2']:.3f} (adj. {model['adj_r2']:.3f}); "
                   f"acceptance alone R² = {model['acceptance_only']['r2']:.3f}."))
    B.append(("table", ["term", "coef", "95% CI", "p"],
              [[p["term"], fmt(p["coef"], "{:.4f}"), f"[{fmt(p['ci_low'], '{:.4f}')}, {fmt(p['ci_high'], '{:.4f}')}]",
                fmt(p["p"], "{:.3g}")] for p in model["params"]]))


#: the interval methods whose coverage the report simulates
COVERAGE_METHODS = ("t_log", "bootstrap_percentile", "bootstrap_bca")


def coverage(comps: list[dict]) -> list[dict]:
    """The coverage simulation the report shows (section "Statistical method") and judges the results' intervals
    by: 3 and 5 repeats, and each repeat count below 5 that a comparison has (exact bootstrap enumeration beyond
    that is too slow for a report)."""
    from specstudy.inference import simulate

    ns = sorted({3, 5} | {int(c["speedup"]["n"]) for c in comps if 2 <= int(c["speedup"].get("n") or 0) < 5})
    return simulate.coverage_table(ns=tuple(ns), methods=COVERAGE_METHODS, sims=300, seed=7)


def method_section(B, s, cov: list[dict]):
    from specstudy.inference import simulate

    a = s["analysis"]
    B.append(("h", 2, "Statistical method"))
    methods = COVERAGE_METHODS
    B.append(("p", "The independent unit is the deployment repeat. Arm repeat r is paired with the baseline repeat r "
                   "of the same phase, workload and concurrency. Interval: "
                   f"{a['ci_method']} at {a['confidence']:.0%} on the geometric mean of per-repeat ratios; the bootstrap "
                   "(exact enumeration for n ≤ 6, BCa falling back to percentile) is shown beside it in the results "
                   "tables and in recommendation.json. "
                   "Simulated coverage of a known effect under four deployment-effect scenarios (300 simulated "
                   "studies for t, 150 for the bootstraps; scenarios: "
                   + "; ".join(f"{k}: {v}" for k, v in simulate.SCENARIOS.items()) + "):"))
    B.append(("table", ["scenario", "repeats", "t interval on log ratios", "percentile bootstrap", "BCa bootstrap"],
              [[r["scenario"], r["n"]] + [fmt(r[m], "{:.2f}") for m in methods] for r in cov]))


def hypotheses_section(B, declared: list[dict] | None, hyp_source: str | None, hyps: list[dict]) -> None:
    B.append(("h", 2, "Hypotheses"))
    if declared is None:
        B.append(("p", "No pre-registration was given: no hypothesis is evaluated (hypotheses are declared in the "
                       "pre-registration's `hypotheses:` list, with their phase, test and workload roles)."))
        return
    B.append(("p", f"As declared in the pre-registration ({hyp_source}): each hypothesis is evaluated on its "
                   "declared phase with its declared test and workload roles."))
    B.append(("table", ["id", "statement", "phase", "test", "roles", "verdict", "evidence", "reason"],
              [[h["id"], h["statement"], h["phase_used"], h["test"],
                "; ".join(f"{k}: {', '.join(v) if isinstance(v, list) else v}" for k, v in h["roles"].items()) or "–",
                h["verdict"], h["evidence"], h["reason"]] for h in hyps]))
