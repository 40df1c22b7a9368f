"""Deployment-level effects (paired comparisons), drift, explanatory model, hypotheses.

The independent unit is the *deployment repeat*: requests within one cell share a server, a node and
a moment in time, so they are not independent samples of the effect. For every comparison
(phase, arm, workload, concurrency) the arm's repeat ``r`` is paired with the baseline's repeat ``r``
of the same phase, workload and concurrency (the plan interleaves arm and baseline deployments in
blocks by repeat index, so pairing by ``rep`` removes block-to-block drift). A repeat without a valid
partner is excluded and counted, never paired with another repeat.

Per repeat: ``speedup = otps_arm / otps_base`` (output tokens per second), ``tpot_ratio`` and
``ttft_ratio`` (arm / baseline of the cell p50). Summaries: median, min/max, IQR, geometric mean and a
confidence interval of the geometric mean, from :func:`specstudy.inference.intervals.describe`; the primary
interval is ``analysis.ci_method`` (default ``t_log``, a Student-t interval on log ratios; why not the
bootstrap with 2–5 repeats: :mod:`specstudy.inference.intervals`), the bootstrap is reported alongside.

Then: baseline drift and node-to-node variability, the explanatory model (not confirmatory), the
pre-registered hypotheses and the KV-capacity cost of each arm. The cell status and the recommendation
are the decision rule's (:mod:`specstudy.inference.decision`). The recommended arm's vLLM flags are
:mod:`specstudy.deployment.command`'s.

Everything here takes plain pandas frames from :mod:`specstudy.analysis.tables` and returns plain dicts.
"""

from __future__ import annotations

import math
from typing import Any

from specstudy.core.arms import baseline_of, engine_of, is_arm_name, is_baseline
from specstudy.core.stat_util import median
from specstudy.inference.intervals import describe

DEFAULTS: dict[str, dict[str, Any]] = {
    "analysis": {
        "confidence": 0.95,
        "ci_method": "t_log",  # t_log | bootstrap_percentile | bootstrap_bca
        "bootstrap_resamples": 9999,
        "seed": 12345,
        "drift_alpha": 0.05,
        "drift_min_fraction": 0.02,
        "hypothesis_phase": "screen",
        "stability_resamples": 500,  # bootstrap resamples of the rounds for the decision's stability
    },
    "recommendation": {
        "phase": "confirm",
        "min_gain": 0.05,
        "max_regression": 0.02,
        "concurrencies": None,
        "workloads": None,
        "launch_args": [],
        "draft_model": None,
    },
}

# The hypothesis tests the pre-registration can name (``hypotheses[].test``), with the roles each needs.
# Hypotheses are declared in the pre-registration (id, statement, phase, test, roles, params) and
# evaluated from it; nothing here names a workload.
HYPOTHESIS_TESTS: dict[str, dict[str, Any]] = {
    "acceptance_not_sufficient": {"roles": {}, "doc": "speedup rises with acceptance, but acceptance alone does "
                                  "not predict it (params.r2_alone_max)"},
    "workload_contrast": {"roles": {"high": "list", "low": "workload"},
                          "doc": "the 'high' workloads accept more AND gain more than the 'low' workload in at least "
                                 "params.min_share of matched (arm, concurrency) pairs"},
    "depth_falls_with_concurrency": {"roles": {}, "doc": "the best speculation depth falls as concurrency rises"},
    "draft_tp_contrast": {"roles": {}, "doc": "draft TP params.better beats draft TP params.worse at the same depth"},
    "ngram_competitive": {"roles": {"workload": "workload"},
                          "doc": "n-gram reaches params.competitive_fraction of the best draft speedup on the role "
                                 "workload at no more than params.memory_factor of its KV-capacity cost"},
}

METRICS = ("speedup", "tpot_ratio", "ttft_ratio")


def settings(config: dict | None) -> dict:
    """The analysis/recommendation settings: config values over :data:`DEFAULTS`."""
    config = config or {}
    out = {}
    for section, defaults in DEFAULTS.items():
        given = config.get(section) or {}
        out[section] = {k: given.get(k, v) for k, v in defaults.items()}
    return out


# ---------------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------------
def _plain(v: Any) -> Any:
    """numpy/pandas scalars and arrays as plain Python values (NaN/NA -> None)."""
    if v is None or isinstance(v, str):
        return v
    if hasattr(v, "tolist") and not hasattr(v, "item") or type(v).__name__ == "ndarray":
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    if type(v).__name__ in ("NAType", "NaTType"):
        return None
    return v


def _records(df) -> list[dict]:
    if df is None or len(df) == 0:
        return []
    if isinstance(df, list):
        return [{k: _plain(v) for k, v in r.items()} for r in df]
    return [{k: _plain(v) for k, v in r.items()} for r in df.to_dict("records")]


def _ok(cell: dict, kind: str) -> bool:
    if not cell.get("valid"):
        return False
    flag = cell.get("throughput_valid" if kind == "throughput" else "latency_valid")
    return flag is not False


def _ratio(a, b):
    if a is None or b is None or not b or a <= 0 or b <= 0:
        return None
    return float(a) / float(b)


def comparisons(cells, config: dict | None = None) -> list[dict]:
    """Every (phase, arm, workload, concurrency) against the baseline of the same phase and the same engine
    build (``draft-k3-tp1@v026`` against ``baseline@v026``: core.arms.baseline_of), paired by rep."""
    s = settings(config)["analysis"]
    # Interleaved drift baselines (kind "drift") are for the drift analysis only, never paired with arms.
    recs = [r for r in _records(cells) if (r.get("kind") or "repeat") != "drift"]
    base = {(r["phase"], r["arm"], r["workload"], r["concurrency"], r["rep"]): r for r in recs
            if is_baseline(r.get("arm"))}
    groups: dict[tuple, list[dict]] = {}
    for r in recs:
        if not is_baseline(r.get("arm")):
            groups.setdefault((r["phase"], r["arm"], r["workload"], r["concurrency"]), []).append(r)
    out = []
    for (phase, arm, workload, conc), rows in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        repeats, excluded = [], []
        own = baseline_of(arm) if is_arm_name(arm) else "baseline"
        for a in sorted(rows, key=lambda r: r["rep"]):
            b = base.get((phase, own, workload, conc, a["rep"]))
            if b is None:
                excluded.append({"rep": a["rep"], "reason": "no baseline cell with the same rep (unpaired)"})
                continue
            bad = [f"{who}: {c.get('invalid_reasons') or 'invalid'}" for who, c in (("arm", a), ("baseline", b))
                   if not c.get("valid")]
            if bad:
                excluded.append({"rep": a["rep"], "reason": "; ".join(bad)})
                continue
            thr = _ok(a, "throughput") and _ok(b, "throughput")
            lat = _ok(a, "latency") and _ok(b, "latency")
            repeats.append({
                "rep": a["rep"],
                "speedup": _ratio(a.get("output_tokens_per_second"), b.get("output_tokens_per_second")) if thr else None,
                "tpot_ratio": _ratio(a.get("tpot_p50_ms"), b.get("tpot_p50_ms")) if thr else None,
                "ttft_ratio": _ratio(a.get("ttft_p50_ms"), b.get("ttft_p50_ms")) if lat else None,
                "arm_otps": a.get("output_tokens_per_second"), "base_otps": b.get("output_tokens_per_second"),
                "arm_tpot_ms": a.get("tpot_p50_ms"), "base_tpot_ms": b.get("tpot_p50_ms"),
                "arm_ttft_ms": a.get("ttft_p50_ms"), "base_ttft_ms": b.get("ttft_p50_ms"),
                "acceptance_rate": a.get("acceptance_rate"),
                "mean_acceptance_length": a.get("mean_acceptance_length"),
                "arm_deployment": a.get("deployment_id"), "base_deployment": b.get("deployment_id"),
            })
        first = rows[0]
        comp = {"phase": phase, "arm": arm, "method": first.get("method"),
                "num_speculative_tokens": _opt_int(first.get("num_speculative_tokens")),
                "draft_tensor_parallel_size": _opt_int(first.get("draft_tensor_parallel_size")),
                "workload": workload, "concurrency": conc, "repeats": repeats, "excluded": excluded,
                "n_excluded": len(excluded)}
        if own != "baseline":  # a study of several engine builds: the build the arm and its baseline ran on
            comp["engine"] = engine_of(arm)
        for m in METRICS:
            comp[m] = describe([r[m] for r in repeats], s["confidence"], s["ci_method"], s["bootstrap_resamples"],
                               s["seed"])
        comp["absolute"] = _absolute(repeats)
        out.append(comp)
    return out


def _opt_int(v):
    return None if v is None else int(v)


def _absolute(repeats: list[dict]) -> dict:
    keys = ("arm_otps", "base_otps", "arm_tpot_ms", "base_tpot_ms", "arm_ttft_ms", "base_ttft_ms",
            "acceptance_rate", "mean_acceptance_length")
    return {k: median([r.get(k) for r in repeats]) for k in keys}


def excluded_cells(cells) -> list[dict]:
    """Invalid cells with their reasons (every phase and arm, baselines included)."""
    return [{k: r.get(k) for k in ("phase", "arm", "rep", "workload", "concurrency", "deployment_id",
                                   "invalid_reasons", "invalid_details")}
            for r in _records(cells) if not r.get("valid")]


# ---------------------------------------------------------------------------------------------
# Drift and node-to-node variability
# ---------------------------------------------------------------------------------------------
def drift(cells, deployments=None, comps: list[dict] | None = None, config: dict | None = None) -> dict:
    """Baseline throughput over time: OLS of the per-series-demeaned log throughput on time."""
    import numpy as np

    s = settings(config)["analysis"]
    recs = [r for r in _records(cells) if is_baseline(r.get("arm")) and _ok(r, "throughput")
            and (r.get("output_tokens_per_second") or 0) > 0]
    host = {}
    for d in _records(deployments):
        if d.get("deployment_id"):
            host[d["deployment_id"]] = d.get("hostname")
    out: dict[str, Any] = {"n": len(recs), "detected": None, "points": [], "nodes": [], "note": ""}
    # Interleaved drift baselines (kind "drift", paths drift<n>) exist for this analysis: say what they add.
    drift_recs = [r for r in recs if (r.get("kind") or "repeat") == "drift"]
    out["n_by_kind"] = {"repeat": len(recs) - len(drift_recs), "drift": len(drift_recs)}
    out["drift_deployments"] = sorted({f"{r['phase']}/{r.get('rep_label') or 'drift' + str(r['rep'])}"
                                       for r in drift_recs})
    if len(recs) < 3:
        out["note"] = "fewer than 3 valid baseline cells: drift not estimable"
        return out
    series: dict[tuple, list[dict]] = {}
    for r in recs:
        series.setdefault((r["arm"], r["workload"], r["concurrency"]), []).append(r)  # arm: one series per build
    times = [r.get("started_unix") for r in recs]
    use_time = all(t is not None for t in times)
    t0 = min(times) if use_time else 0
    pts = []
    resid: dict[tuple, list[float]] = {}
    for key, rows in series.items():
        _arm, w, c = key
        logs = np.log([r["output_tokens_per_second"] for r in rows])
        resid[key] = [float(lv - logs.mean()) for lv in logs]
        for r, lv in zip(rows, logs, strict=True):
            x = (r["started_unix"] - t0) / 3600 if use_time else (0 if r["phase"] == "screen" else 1000) + r["rep"]
            pts.append({"x": float(x), "resid": float(lv - logs.mean()), "workload": w, "concurrency": c,
                        "phase": r["phase"], "rep": r["rep"], "kind": r.get("kind") or "repeat",
                        "node": host.get(r.get("deployment_id")),
                        "otps": r["output_tokens_per_second"], "n_series": len(rows)})
    pts = [p for p in pts if p["n_series"] > 1]
    out["points"] = pts
    out["x_unit"] = "hours since first baseline cell" if use_time else "block (rep index; confirm offset 1000)"
    resid_sd = [np.std(resid[k], ddof=1) for k in series if len(series[k]) > 1]
    out["baseline_repeat_cv"] = float(np.mean(resid_sd)) if resid_sd else None
    if len(pts) < 3 or len({p["x"] for p in pts}) < 2:
        out["note"] = "baseline repeats do not span time: drift not estimable"
        return out
    from scipy import stats as st

    x = np.array([p["x"] for p in pts])
    y = np.array([p["resid"] for p in pts])
    lr = st.linregress(x, y)
    span = float(x.max() - x.min())
    total = math.exp(lr.slope * span) - 1
    effects = [abs(math.log(c["speedup"]["median"])) for c in (comps or []) if c["speedup"]["median"]]
    med_eff = math.exp(median(effects)) - 1 if effects else None
    out.update(slope_per_unit=float(lr.slope), p_value=float(lr.pvalue), span=span, total_fraction=total,
               detected=bool(lr.pvalue < s["drift_alpha"] and abs(total) > s["drift_min_fraction"]),
               median_abs_effect_fraction=med_eff,
               drift_to_effect=(abs(total) / med_eff) if med_eff else None)
    by_node: dict[str, list[float]] = {}
    for p in pts:
        by_node.setdefault(p["node"] or "unknown", []).append(p["resid"])
    out["nodes"] = [{"node": k, "n": len(v), "mean_resid_fraction": math.exp(float(np.mean(v))) - 1}
                    for k, v in sorted(by_node.items())]
    return out


# ---------------------------------------------------------------------------------------------
# Explanatory model (not confirmatory)
# ---------------------------------------------------------------------------------------------
def effect_rows(comps: list[dict]) -> list[dict]:
    """One row per (comparison, repeat) with a speedup: the deployment-level effects."""
    rows = []
    for c in comps:
        for r in c["repeats"]:
            if r["speedup"]:
                rows.append({"phase": c["phase"], "arm": c["arm"], "method": c["method"],
                             "k": c["num_speculative_tokens"], "draft_tp": c["draft_tensor_parallel_size"] or 0,
                             "workload": c["workload"], "concurrency": c["concurrency"], "rep": r["rep"],
                             "log_speedup": math.log(r["speedup"]), "speedup": r["speedup"],
                             "acceptance_rate": r["acceptance_rate"]})
    return rows


def explanatory_model(comps: list[dict]) -> dict:
    """OLS of log speedup on acceptance, depth, draft TP, workload, concurrency, acceptance×concurrency."""
    import numpy as np
    import pandas as pd

    label = "EXPLANATORY model (describes the screened factorial; not a confirmatory test)"
    rows = [r for r in effect_rows(comps) if r["acceptance_rate"] is not None]
    out: dict[str, Any] = {"label": label, "n": len(rows), "fitted": False, "params": [], "note": ""}
    if len(rows) < 4:
        out["note"] = f"{len(rows)} deployment-level effects with an acceptance rate: too few to fit"
        return out
    df = pd.DataFrame(rows)
    df["log2c"] = np.log2(df["concurrency"].astype(float))
    terms = ["acceptance_rate"]
    for col, term in (("k", "k"), ("workload", "C(workload)"), ("method", "C(method)")):
        if df[col].nunique() > 1:
            terms.append(term)
    if df.loc[df["method"] == "draft_model", "draft_tp"].nunique() > 1:  # else collinear with method
        terms.append("C(draft_tp)")
    if df["log2c"].nunique() > 1:
        terms += ["log2c", "acceptance_rate:log2c"]
    formula = "log_speedup ~ " + " + ".join(terms)
    out["formula"] = formula
    import statsmodels.formula.api as smf

    try:
        fit = smf.ols(formula, data=df).fit()
    except Exception as exc:  # singular design etc.
        out["note"] = f"fit failed: {exc}"
        return out
    if fit.df_resid < 1:
        out["note"] = f"saturated design (n={len(df)}, parameters={len(fit.params)}): not fitted"
        return out
    ci = fit.conf_int()
    out.update(fitted=True, r2=float(fit.rsquared), adj_r2=float(fit.rsquared_adj), df_resid=float(fit.df_resid),
               params=[{"term": t, "coef": float(fit.params[t]), "ci_low": float(ci.loc[t, 0]),
                        "ci_high": float(ci.loc[t, 1]), "p": float(fit.pvalues[t])} for t in fit.params.index])
    alone = smf.ols("log_speedup ~ acceptance_rate", data=df).fit()
    out["acceptance_only"] = {"r2": float(alone.rsquared), "coef": float(alone.params["acceptance_rate"]),
                              "ci_low": float(alone.conf_int().loc["acceptance_rate", 0]),
                              "ci_high": float(alone.conf_int().loc["acceptance_rate", 1])}
    return out


# ---------------------------------------------------------------------------------------------
# Hypotheses
# ---------------------------------------------------------------------------------------------
def _verdict(v: str, evidence: str, reason: str = "") -> dict:
    return {"verdict": v, "evidence": evidence, "reason": reason}


def _h1(comps, deployments, params, model):
    rows = [r for r in effect_rows(comps) if r["acceptance_rate"] is not None]
    if len(rows) < 4 or len({round(r["acceptance_rate"], 6) for r in rows}) < 3:
        return _verdict("untestable", f"{len(rows)} effects with acceptance", "too few effects or no spread in acceptance")
    from scipy import stats as st

    rho, p = st.spearmanr([r["acceptance_rate"] for r in rows], [r["log_speedup"] for r in rows])
    alone = (model or {}).get("acceptance_only") or {}
    r2 = alone.get("r2")
    rises = rho > 0 and p < 0.05
    not_alone = r2 is not None and r2 < params.get("r2_alone_max", 0.8)
    ev = (f"Spearman rho(acceptance, log speedup) = {rho:.2f} (p = {p:.3g}, n = {len(rows)}); "
          f"R² of acceptance alone = {r2:.2f}" if r2 is not None else f"rho = {rho:.2f}, p = {p:.3g}; no model")
    if model and model.get("fitted"):
        ev += f"; full explanatory model R² = {model['r2']:.2f}"
    return _verdict("supported" if rises and not_alone else "not supported", ev)


def _h2(comps, deployments, params, model):
    high, low = params["high"], params["low"]
    idx = {(c["arm"], c["workload"], c["concurrency"]): c for c in comps}
    checks = []
    for (arm, w, conc), c in idx.items():
        if w not in high:
            continue
        o = idx.get((arm, low, conc))
        if not o or c["speedup"]["median"] is None or o["speedup"]["median"] is None:
            continue
        acc_a, acc_o = c["absolute"]["acceptance_rate"], o["absolute"]["acceptance_rate"]
        if acc_a is None or acc_o is None:
            continue
        checks.append((acc_a > acc_o) and (c["speedup"]["median"] > o["speedup"]["median"]))
    if not checks:
        return _verdict("untestable", "", f"no arm measured on both {high} and {low!r} with acceptance data")
    share = sum(checks) / len(checks)
    ev = f"{sum(checks)}/{len(checks)} (arm, workload, concurrency) pairs: higher acceptance AND higher median speedup than {low}"
    return _verdict("supported" if share >= params.get("min_share", 0.75) else "not supported", ev)


def _h3(comps, deployments, params, model):
    series: dict[tuple, dict[int, dict[int, float]]] = {}
    for c in comps:
        if c["num_speculative_tokens"] is None or c["speedup"]["median"] is None:
            continue
        key = (c["method"], c["draft_tensor_parallel_size"], c["workload"])
        series.setdefault(key, {}).setdefault(c["concurrency"], {})[c["num_speculative_tokens"]] = c["speedup"]["median"]
    results = []
    for key, by_c in sorted(series.items(), key=lambda kv: tuple(map(str, kv[0]))):
        concs = sorted(c for c in by_c if len(by_c[c]) > 1)
        if len(concs) < 2:
            continue
        best = [max(by_c[c], key=by_c[c].get) for c in concs]
        nonincreasing = all(b2 <= b1 for b1, b2 in zip(best, best[1:], strict=False))
        results.append((key, concs, best, nonincreasing and best[-1] < best[0]))
    if not results:
        return _verdict("untestable", "", "needs >= 2 depths at >= 2 concurrencies for one method and workload")
    ev = "; ".join(f"{k[0]}/{k[2]}: best k {b} at c {cs}" for k, cs, b, _ in results)
    share = sum(r[3] for r in results) / len(results)
    return _verdict("supported" if share >= 0.5 else "not supported", ev)


def _h4(comps, deployments, params, model):
    good, bad = int(params.get("better", 1)), int(params.get("worse", 4))
    tps = {c["draft_tensor_parallel_size"] for c in comps if c["method"] == "draft_model" and c["speedup"]["median"]}
    fails = [d for d in _records(deployments) if d.get("method") == "draft_model" and d.get("status") == "failed"]
    if {good, bad} <= tps:
        idx = {(c["num_speculative_tokens"], c["draft_tensor_parallel_size"], c["workload"], c["concurrency"]):
               c["speedup"]["median"] for c in comps if c["method"] == "draft_model" and c["speedup"]["median"]}
        wins = [idx[(k, good, w, cc)] > idx[(k, bad, w, cc)] for (k, tp, w, cc) in idx
                if tp == good and (k, bad, w, cc) in idx]
        if not wins:
            return _verdict("untestable", "", f"no depth measured with both draft TP {good} and {bad}")
        ev = f"TP{good} faster than TP{bad} in {sum(wins)}/{len(wins)} matched cells"
        return _verdict("supported" if sum(wins) / len(wins) >= 0.75 else "not supported", ev)
    tp_fail = [d for d in fails if (d.get("draft_tensor_parallel_size") or 0) != bad]
    reason = f"draft TP {good} and {bad} not both measured"
    if tp_fail:
        d = tp_fail[0]
        reason = (f"the engine refused draft TP != target TP (deployment {d.get('deployment_id')}: "
                  f"{d.get('failure_stage') or '?'}: {d.get('failure_reason') or d.get('failure_error_excerpt') or '?'})")
    return _verdict("untestable", f"measured draft TPs: {sorted(t for t in tps if t is not None)}", reason)


def _h5(comps, deployments, params, model):
    w = params["workload"]
    by_c: dict[int, dict[str, float]] = {}
    for c in comps:
        if c["workload"] == w and c["speedup"]["median"]:
            d = by_c.setdefault(c["concurrency"], {})
            key = "ngram" if c["method"] == "ngram" else "draft" if c["method"] == "draft_model" else None
            if key:
                d[key] = max(d.get(key, 0), c["speedup"]["median"])
    pairs = [(cc, d["ngram"], d["draft"]) for cc, d in sorted(by_c.items()) if "ngram" in d and "draft" in d]
    mem = memory_costs(deployments)
    ng = [v for a, v in mem.items() if a.startswith("ngram")]
    dr = [v for a, v in mem.items() if a.startswith("draft")]
    if not pairs:
        return _verdict("untestable", "", f"n-gram and draft arms not both measured on {w!r}")
    if not ng or not dr:
        return _verdict("untestable", "", "KV-cache capacity missing for n-gram or draft deployments")
    frac = params.get("competitive_fraction", 0.9)
    competitive = sum(n >= frac * d for _, n, d in pairs) / len(pairs) >= 0.5
    ng_cost, dr_cost = min(ng), min(dr)
    lower = ng_cost <= params.get("memory_factor", 0.5) * dr_cost if dr_cost > 0 else False
    ev = (f"best n-gram vs best draft median speedup on {w}: "
          + ", ".join(f"c{cc}: {n:.3f} vs {d:.3f}" for cc, n, d in pairs)
          + f"; KV capacity lost vs baseline: n-gram {ng_cost:.1%}, draft {dr_cost:.1%}")
    return _verdict("supported" if competitive and lower else "not supported", ev)


HYPOTHESIS_EVALUATORS = {"acceptance_not_sufficient": _h1, "workload_contrast": _h2,
                         "depth_falls_with_concurrency": _h3, "draft_tp_contrast": _h4, "ngram_competitive": _h5}


def memory_costs(deployments) -> dict[str, float]:
    """Share of its own build's baseline's KV-cache capacity (tokens) each arm loses (median over deployments)."""
    kv: dict[str, list[float]] = {}
    for d in _records(deployments):
        if d.get("kv_cache_tokens") and d.get("status") != "failed":
            kv.setdefault(d["arm"], []).append(d["kv_cache_tokens"])
    own = {a: baseline_of(a) if is_arm_name(a) else "baseline" for a in kv}
    return {a: 1 - median(v) / median(kv[own[a]]) for a, v in kv.items() if not is_baseline(a) and own[a] in kv}


def hypotheses(comps: list[dict], deployments, declared: list[dict] | None, model: dict | None = None) -> list[dict]:
    """Evaluate the hypotheses declared in the pre-registration (``hypotheses:``), each on its own phase
    with its declared test, roles and params. ``model``: the explanatory model of the comparisons of
    the hypotheses' phase (H1-type tests); fitted here per phase when not given."""
    out = []
    models: dict[str, dict] = {}
    for h in declared or []:
        phase = h.get("phase")
        use = [c for c in comps if c["phase"] == phase]
        base = {"id": h.get("id"), "statement": h.get("statement", ""), "phase_used": phase, "test": h.get("test"),
                "roles": h.get("roles") or {}, "n_comparisons": len(use)}
        fn = HYPOTHESIS_EVALUATORS.get(h.get("test"))
        if fn is None:
            out.append(dict(base, **_verdict("untestable", "", f"unknown test {h.get('test')!r}; known: "
                                                                f"{sorted(HYPOTHESIS_EVALUATORS)}")))
            continue
        if not use:
            out.append(dict(base, **_verdict("untestable", "", f"no {phase} comparisons (has the {phase} phase run?)")))
            continue
        if fn is _h1 and phase not in models:  # only the acceptance test reads the explanatory model
            models[phase] = model if (model is not None and model.get("phase") == phase) else explanatory_model(use)
        params = {**(h.get("params") or {}), **(h.get("roles") or {})}
        out.append(dict(base, **fn(use, deployments, params, models.get(phase))))
    return out


# ---------------------------------------------------------------------------------------------
# The engine build as a factor
# ---------------------------------------------------------------------------------------------
def engine_effects(cells, config: dict | None = None, comps: list[dict] | None = None,
                   builds: list[str] | None = None) -> list[dict]:
    """What the engine build does, separated from what speculation gains (docs/engines.md), per phase,
    speculative arm (its settings, without the build), workload and concurrency, for the reference build A
    (the first of ``builds``: the config's order; else the first by name) against every other build B. Each a
    :func:`~specstudy.inference.intervals.describe` of per-rep ratios, paired by rep (the same round):

    - ``engine``: baseline on B ÷ baseline on A (output tokens/s): the build's own effect;
    - ``speedup_a`` / ``speedup_b``: the arm's speedup on each build, over that build's baseline;
    - ``difference``: ``speedup_b`` ÷ ``speedup_a`` (above 1: speculation gains more on B).

    Empty for a study of one engine."""
    s = settings(config)["analysis"]
    recs = [r for r in _records(cells) if (r.get("kind") or "repeat") != "drift" and is_arm_name(r.get("arm"))]
    present = sorted({engine_of(r["arm"]) for r in recs} - {None})
    order = [b for b in (builds or []) if b in present] + [b for b in present if b not in (builds or [])]
    if len(order) < 2:
        return []
    ref = order[0]
    base = {(r["phase"], engine_of(r["arm"]), r["workload"], r["concurrency"], r["rep"]): r
            for r in recs if is_baseline(r["arm"])}
    comps = comps if comps is not None else comparisons(cells, config)
    speedups: dict[tuple, dict] = {}  # (phase, arm without build, build, workload, c) -> {rep: speedup}
    for c in comps:
        if c.get("engine"):
            key = (c["phase"], c["arm"].rsplit("@", 1)[0], c["engine"], c["workload"], c["concurrency"])
            speedups[key] = {r["rep"]: r["speedup"] for r in c["repeats"] if r.get("speedup") is not None}

    def desc(values: list) -> dict:
        return describe(values, s["confidence"], s["ci_method"], s["bootstrap_resamples"], s["seed"])

    def engine_ratios(phase, build, workload, conc) -> dict:
        out = {}
        for (ph, b, w, c, rep), row in base.items():
            other = base.get((ph, build, w, c, rep))
            if (ph, b, w, c) == (phase, ref, workload, conc) and other is not None \
                    and _ok(row, "throughput") and _ok(other, "throughput"):
                ratio = _ratio(other.get("output_tokens_per_second"), row.get("output_tokens_per_second"))
                if ratio is not None:
                    out[rep] = ratio
        return out

    rows = []
    for (phase, arm, build, workload, conc), on_b in sorted(speedups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        if build == ref or (phase, arm, ref, workload, conc) not in speedups:
            continue
        on_a = speedups[(phase, arm, ref, workload, conc)]
        eng = engine_ratios(phase, build, workload, conc)
        both = sorted(set(on_a) & set(on_b))
        rows.append({"phase": phase, "arm": arm, "workload": workload, "concurrency": conc, "reference": ref,
                     "build": build, "engine": desc(list(eng.values())), "speedup_a": desc(list(on_a.values())),
                     "speedup_b": desc(list(on_b.values())),
                     "difference": desc([on_b[r] / on_a[r] for r in both])})
    return rows
