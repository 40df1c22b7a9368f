"""The pre-registered decision rule: its checks, cell verdicts, adaptive confirmation, stability, the recommendation.

Cell verdicts (issue #15). For every declared workload × concurrency of a candidate, the interval of
the geometric-mean speedup (Student-t on per-deployment log ratios, paired by round) is compared with
the pre-registered margins ``min_gain`` (g) and ``max_regression`` (d):

- ``gain``          the interval lies above 1 + g;
- ``regression``    the interval lies below 1 − d (a material loss is shown);
- ``non_inferior``  the interval lies above 1 − d (a material loss is excluded);
- ``inconclusive``  otherwise (a material loss is neither shown nor excluded);
- ``missing``       fewer than two valid paired repeats (no interval).

A candidate is enabled only when its gate passed, no cell and no traffic-mixture level shows a
regression, every decisive cell is non-inferior (``non_inferiority_on: cells``, the default; with
``mixture`` the declared traffic mixture at each concurrency must be non-inferior instead) and a gain
is shown on the traffic mixture at some concurrency (per workload when traffic is routed by workload).

Repeated looks. Confirmation starts with ``confirmation.repeats`` rounds and adds one round at a time
up to ``confirmation.stopping.max_repeats`` while a decisive cell is inconclusive, so the rule may look
at the data up to K = max_repeats − repeats + 1 times. With ``correction: bonferroni`` every look uses
intervals at confidence 1 − α/K (α = 1 − confidence): by Bonferroni's inequality the chance that any
of the K looks produces a false verdict on a cell is at most α, whatever the dependence between looks.
It is conservative (an O'Brien–Fleming boundary would spend less α early), but it needs no normality
or independent-increments assumption, which matters with skewed or heavy-tailed deployment effects
(benchmarks/decision_rule.py shows the effect with and without it).

The recommendation (:func:`recommend`) applies the rule to a study's comparisons and gate verdicts.
Everything here is pure: comparisons (from :func:`specstudy.inference.stats.comparisons`) in, plain dicts out. The
checkpoint after each confirmation round, which reads files, is :mod:`specstudy.analysis.checkpoint`.
"""

from __future__ import annotations

import math
from typing import Any

from specstudy.inference.intervals import log_interval, t_half_width

VERDICTS = ("gain", "non_inferior", "inconclusive", "regression", "missing")
CORRECTIONS = ("bonferroni", "obrien_fleming", "none")
SCOPES = ("cells", "mixture")
MAX_EXTRA_REPEATS = 100


class DecisionRuleError(ValueError):
    """The pre-registered decision rule is unusable; the message names the file, the field and the fix."""


# ---------------------------------------------------------------------------------------------
# The rule
# ---------------------------------------------------------------------------------------------
def check_prereg(prereg: dict, source: str = "<pre-registration>") -> None:
    """Semantic checks of the stopping rule and margins a JSON schema cannot express."""
    conf = prereg.get("confirmation") or {}
    problems = []
    stop = conf.get("stopping")
    if not isinstance(stop, dict):
        problems.append("field 'confirmation.stopping': missing; declare the stopping rule before screening, e.g. "
                        "stopping: {max_repeats: 5, correction: bonferroni}")
    else:
        cap, initial = stop.get("max_repeats"), conf.get("repeats")
        if isinstance(cap, int) and isinstance(initial, int) and cap < initial:
            problems.append(f"field 'confirmation.stopping.max_repeats': {cap} is below confirmation.repeats "
                            f"({initial}); the cap must be >= the initial number of repeats")
    dec = conf.get("decision")
    if not isinstance(dec, dict):
        problems.append("field 'confirmation.decision': missing; declare the margins, e.g. decision: {min_gain: 0.05, "
                        "max_regression: 0.02, confidence: 0.95, non_inferiority_on: cells}")
    else:
        for key in ("min_gain", "max_regression"):
            v = dec.get(key)
            if isinstance(v, int | float) and v < 0:
                problems.append(f"field 'confirmation.decision.{key}': {v} is negative; margins are fractions >= 0")
        d = dec.get("max_regression")
        if isinstance(d, int | float) and d >= 1:
            problems.append(f"field 'confirmation.decision.max_regression': {d} must be < 1 (a fraction of throughput)")
    if problems:
        raise DecisionRuleError(f"{source}: invalid stopping/decision rule:\n  - " + "\n  - ".join(problems))


#: Config fields that moved into the pre-registration's ``traffic`` section (issue 28).
MOVED_TO_TRAFFIC = {"traffic_mix": "traffic.mixture", "route_by_workload": "traffic.route_by_workload"}
#: What the mixture's weights mean; :func:`_mixture` computes the mixture speedup from them.
SHARES = "output_tokens"


def refuse_config_traffic(config: dict | None, source: str = "<config>") -> None:
    """A config that still sets the traffic mixture or routing outside the pre-registration is refused."""
    rec = (config or {}).get("recommendation") or {}
    found = [k for k in MOVED_TO_TRAFFIC if k in rec]
    if found:
        raise DecisionRuleError(
            f"{source}: " + "; ".join(
                f"field 'recommendation.{k}' is no longer read from the config: declare it in the pre-registration "
                f"as '{MOVED_TO_TRAFFIC[k]}' (locked by its hash before screening) and remove it here" for k in found))


def check_traffic(prereg: dict, workloads, source: str = "<pre-registration>") -> None:
    """The pre-registration's ``traffic`` section: present, weights summing to 1, known workloads, and no
    mixture in a routed study (the schema checks the types)."""
    t = prereg.get("traffic")
    if not isinstance(t, dict):
        raise DecisionRuleError(
            f"{source}: field 'traffic': missing; declare how traffic reaches the setting, e.g. traffic: "
            "{route_by_workload: false, shares: output_tokens, mixture: {open_chat: 0.5, code: 0.3, summarization: 0.2}}")
    problems = []
    mix = t.get("mixture")
    if t.get("route_by_workload"):
        if mix is not None:
            problems.append("field 'traffic.mixture': a routed study (traffic.route_by_workload: true) decides per "
                            "workload and evaluates no mixture; set mixture: null, or route_by_workload: false")
    elif mix is None:
        problems.append("field 'traffic.mixture': required when traffic.route_by_workload is false (one deployment "
                        "serves the mixture); give every workload its output-token share")
    if isinstance(mix, dict):
        known = list(workloads or [])
        unknown = [w for w in mix if known and w not in known]
        if unknown:
            problems.append(f"field 'traffic.mixture': {', '.join(map(repr, unknown))} not a workload of the study "
                            f"(corpora.workloads: {', '.join(known)})")
        total = math.fsum(float(v) for v in mix.values())
        if abs(total - 1.0) > 1e-6:
            problems.append(f"field 'traffic.mixture': the shares sum to {total:.6g}, not 1; make them output-token "
                            "shares that add up to 1")
    if problems:
        raise DecisionRuleError(f"{source}: invalid traffic declaration:\n  - " + "\n  - ".join(problems))


def traffic_from(prereg: dict | None, workloads) -> dict:
    """Mixture weights (output-token shares) and routing: the pre-registration's ``traffic`` section, else equal
    shares over ``workloads``, one deployment (flagged in ``source``)."""
    t = (prereg or {}).get("traffic")
    if isinstance(t, dict):
        routed = bool(t["route_by_workload"])
        mix = None if routed else {w: float(v) for w, v in t["mixture"].items()}
        return {"route_by_workload": routed, "shares": t.get("shares", SHARES), "mixture": mix,
                "source": "pre-registration traffic"}
    ws = list(workloads)
    return {"route_by_workload": False, "shares": SHARES, "mixture": {w: 1.0 / len(ws) for w in ws} if ws else {},
            "source": "no traffic section in a pre-registration: equal output-token shares, one deployment"}


def rule_from(config: dict | None = None, prereg: dict | None = None) -> dict:
    """The decision rule: from the pre-registration when it declares one, else from the config (flagged)."""
    from specstudy.inference import stats

    s = stats.settings(config)
    rec, an = s["recommendation"], s["analysis"]
    conf = (prereg or {}).get("confirmation") or {}
    if isinstance(conf.get("decision"), dict) and isinstance(conf.get("stopping"), dict):
        dec, stop = conf["decision"], conf["stopping"]
        rule = {"source": "pre-registration", "min_gain": float(dec["min_gain"]),
                "max_regression": float(dec["max_regression"]), "confidence": float(dec.get("confidence", 0.95)),
                "non_inferiority_on": dec.get("non_inferiority_on", "cells"),
                "initial_repeats": int(conf["repeats"]), "max_repeats": int(stop["max_repeats"]),
                "correction": stop.get("correction", "bonferroni")}
        given = (config or {}).get("recommendation") or {}
        rule["notes"] = [f"config recommendation.{k} = {given[k]} is ignored: the pre-registration declares {rule[k]}"
                         for k in ("min_gain", "max_regression") if k in given and float(given[k]) != rule[k]]
    else:
        rule = {"source": "config recommendation.* (no decision/stopping rule in a pre-registration: fixed design, "
                          "one look)", "min_gain": float(rec["min_gain"]), "max_regression": float(rec["max_regression"]),
                "confidence": float(an["confidence"]), "non_inferiority_on": "cells",
                "initial_repeats": None, "max_repeats": None, "correction": "none", "notes": []}
    rule["looks"] = looks(rule)
    rule["look_confidence"] = look_confidence(rule)
    if rule.get("correction") == "obrien_fleming" and rule.get("max_repeats") is not None:
        rule["look_confidences"] = obrien_fleming_confidences(1 - rule["confidence"], rule["initial_repeats"],
                                                              rule["max_repeats"])
    return rule


def looks(rule: dict) -> int:
    if rule.get("max_repeats") is None or rule.get("initial_repeats") is None:
        return 1
    return int(rule["max_repeats"]) - int(rule["initial_repeats"]) + 1


def look_confidence(rule: dict) -> float:
    """Confidence of every interval at every look (Bonferroni over the K possible looks); with
    ``obrien_fleming`` the confidence at the cap (the last look; earlier looks: :func:`look_confidences`)."""
    alpha = 1 - float(rule["confidence"])
    if rule.get("correction") == "obrien_fleming" and rule.get("max_repeats") is not None:
        return obrien_fleming_confidences(alpha, int(rule["initial_repeats"]), int(rule["max_repeats"]))[
            int(rule["max_repeats"])]
    k = looks(rule) if rule.get("correction", "none") == "bonferroni" else 1
    return 1 - alpha / k


def obrien_fleming_confidences(alpha: float, initial: int, cap: int) -> dict[int, float]:
    """Per-look two-sided interval confidence after n = initial..cap rounds under an O'Brien–Fleming-type
    alpha-spending function (Lan–DeMets: α(t) = 2 − 2Φ(z_{α/2} / √t), information fraction t = n / cap).

    Look n spends α(t_n) − α(t_{n−1}) (the first look spends α(t_initial)); the increments sum to α, so by
    Bonferroni's inequality over the looks the chance of any false verdict on a cell is at most α whatever
    the dependence between looks, as with ``bonferroni``, but the early looks spend almost nothing and the
    late ones most of α (at 3 → 10 rounds: 0.9997 at round 3, 0.9888 at round 10, against 0.99375 at
    every look with Bonferroni)."""
    from scipy.stats import norm

    z = norm.ppf(1 - alpha / 2)
    spent = {n: 2 - 2 * norm.cdf(z / math.sqrt(n / cap)) for n in range(initial, cap + 1)}
    out, prev = {}, 0.0
    for n in range(initial, cap + 1):
        out[n] = float(1 - max(spent[n] - prev, 1e-12))
        prev = float(spent[n])
    return out


def confidence_at(rule: dict, n: int) -> float:
    """The interval confidence of a cell with ``n`` rounds: the look at n rounds under the rule's correction."""
    per = rule.get("look_confidences") or {}
    if not per:
        return rule["look_confidence"]
    return per.get(n, per[min(per)] if n < min(per) else per[max(per)])


# ---------------------------------------------------------------------------------------------
# Intervals and verdicts
# ---------------------------------------------------------------------------------------------
def verdict(lo: float | None, hi: float | None, min_gain: float, max_regression: float) -> str:
    """Three-way verdict (plus gain) of an interval [lo, hi] of a speedup; works on floats only."""
    if lo is None or hi is None:
        return "missing"
    if lo > 1 + min_gain:
        return "gain"
    if hi < 1 - max_regression:
        return "regression"
    if lo > 1 - max_regression:
        return "non_inferior"
    return "inconclusive"


def extra_repeats_to_settle(mean: float, sd: float, n: int, bound: float, confidence: float) -> int | None:
    """Rounds beyond ``n`` expected to move the interval off ``bound`` (log scale), if mean and SD stay as observed.

    None when more than :data:`MAX_EXTRA_REPEATS` would be needed (the effect sits at the margin).
    """
    dist = abs(mean - bound)
    if dist == 0:
        return None
    for extra in range(1, MAX_EXTRA_REPEATS + 1):
        m = n + extra
        if t_half_width(sd, m, confidence) < dist:
            return extra
    return None


def judge(values: list[float], rule: dict, target: str = "non_inferiority") -> dict:
    """Verdict of one cell (or mixture level) from its per-round speedups."""
    vals = [float(v) for v in values if v is not None and v > 0 and math.isfinite(v)]
    conf = confidence_at(rule, len(vals))
    out: dict[str, Any] = {"n": len(vals), "values": vals, "geomean": None, "lo": None, "hi": None,
                           "confidence": conf, "verdict": "missing", "extra_repeats": None}
    iv = log_interval([math.log(v) for v in vals], conf)
    if iv is None:
        if vals:
            out["geomean"] = math.exp(sum(math.log(v) for v in vals) / len(vals))
        return out
    m, sd, lo, hi = iv
    out.update(geomean=math.exp(m), lo=lo, hi=hi, sd_log=sd,
               verdict=verdict(lo, hi, rule["min_gain"], rule["max_regression"]))
    if out["verdict"] == "inconclusive" or (target == "gain" and out["verdict"] == "non_inferior"):
        # inconclusive: rounds until a material loss is shown or excluded; non-inferior (gain pending): until a
        # gain above 1 + min_gain is shown or excluded
        bound = (math.log(1 - rule["max_regression"]) if out["verdict"] == "inconclusive"
                 else math.log(1 + rule["min_gain"]))
        out["extra_repeats"] = extra_repeats_to_settle(m, sd, len(vals), bound, conf)
    return out


# ---------------------------------------------------------------------------------------------
# The decision
# ---------------------------------------------------------------------------------------------
def _label(w: str, c) -> str:
    return f"{w}@c{c}"


def _undecided(item: str, j: dict, why: str) -> dict:
    return {"what": item, "verdict": j["verdict"], "lo": j["lo"], "hi": j["hi"], "n": j["n"],
            "extra_repeats": j["extra_repeats"], "why": why}


def _scope(cells: dict[str, dict], mixture: dict[str, dict], gain_levels: dict[str, dict],
           ni_levels: dict[str, dict], gate: str, rule: dict, gate_blocker: str | None = None) -> dict:
    """Enable/blockers/undecided for one scope (all traffic, or one routed workload)."""
    d = rule["max_regression"]
    g = rule["min_gain"]
    blockers, undecided = [], []
    if gate != "pass":
        blockers.append(gate_blocker or f"gate verdict {gate}")
    regress = [k for k, j in {**cells, **mixture}.items()
               if j["verdict"] == "regression"]
    if regress:
        blockers.append(f"regression shown (interval below {1 - d:.2f}) on " + ", ".join(regress))
    missing = [k for k, j in ni_levels.items() if j["verdict"] == "missing"]
    if missing:
        blockers.append("no interval (fewer than 2 valid paired repeats) for " + ", ".join(missing))
    inconclusive = [k for k, j in ni_levels.items() if j["verdict"] == "inconclusive"]
    if inconclusive:
        blockers.append(f"non-inferiority not shown (interval reaches below {1 - d:.2f}) on " + ", ".join(inconclusive))
    gains = [k for k, j in gain_levels.items() if j["verdict"] == "gain"]
    if not gains:
        blockers.append(f"no gain shown (no interval above {1 + g:.2f})")
    excluded = gate == "fail" or bool(regress)
    if not excluded:
        for k in missing + inconclusive:
            undecided.append(_undecided(k, ni_levels[k], "material regression neither shown nor excluded"
                                        if ni_levels[k]["verdict"] == "inconclusive" else "no interval yet"))
        if not gains:
            open_gain = [k for k, j in gain_levels.items() if j["hi"] is not None and j["hi"] > 1 + g]
            if open_gain:
                best = max(open_gain, key=lambda k: gain_levels[k]["geomean"] or 0)
                undecided.append(_undecided(best, gain_levels[best], f"gain above {1 + g:.2f} neither shown nor excluded"))
    lows = [j["lo"] for j in gain_levels.values() if j["lo"] is not None]
    return {"enable": not blockers, "blockers": blockers, "undecided": undecided, "excluded": excluded,
            "score": min(lows) if lows else None}


def decide(comps: list[dict], gate_by_arm: dict[str, dict], rule: dict, workloads: list[str], concs: list,
           weights: dict[str, float], route_by_workload: bool = False, gate_phase: str | None = None,
           other_gates: dict[str, str] | None = None) -> dict:
    """The decision from per-round paired comparisons of one phase (see the module docstring).

    ``gate_by_arm`` holds the gates of ``gate_phase`` only; ``other_gates`` (arm -> phase) names gates of
    another phase, which never stand in for a missing one: the blocker says so."""

    out: dict[str, Any] = {"candidates": [], "decision": "do_not_enable", "enable": None, "per_workload": {},
                           "undecided": []}
    arms = sorted({c["arm"] for c in comps})
    for arm in arms:
        mine = {(c["workload"], c["concurrency"]): c for c in comps if c["arm"] == arm}
        cells = {}
        for w in workloads:
            for cc in concs:
                c = mine.get((w, cc))
                vals = [r["speedup"] for r in c["repeats"]] if c else []
                cells[_label(w, cc)] = judge(vals, rule, "non_inferiority")
        gate = gate_by_arm.get(arm)
        gv = (gate or {}).get("verdict") or "missing"
        gate_blocker = None
        if gate is None and gate_phase:
            other = (other_gates or {}).get(arm)
            gate_blocker = f"no {gate_phase} gate verdict" + (
                f" (the {other} gate does not stand in for it)" if other else "")
        cand: dict[str, Any] = {"arm": arm, "gate_verdict": gv, "cells": cells,
                                "status": {k: j["verdict"] for k, j in cells.items()}}
        if route_by_workload:
            cand["workloads"] = {}
            for w in workloads:
                mine_w = {k: j for k, j in cells.items() if k.startswith(f"{w}@")}
                gain_levels = {k: judge(j["values"], rule, "gain") for k, j in mine_w.items()}
                sc = _scope(mine_w, {}, gain_levels, mine_w, gv, rule, gate_blocker)
                sc["statuses"] = [j["verdict"] for j in mine_w.values()]
                cand["workloads"][w] = sc
            cand["enable"] = any(v["enable"] for v in cand["workloads"].values())
            cand["blockers"] = [f"{w}: {b}" for w, v in cand["workloads"].items() for b in v["blockers"]]
            cand["undecided"] = [dict(u, workload=w) for w, v in cand["workloads"].items() for u in v["undecided"]]
            cand["excluded"] = all(v["excluded"] for v in cand["workloads"].values())
        else:
            mix = {}
            for cc in concs:
                vals = _mixture({w: mine.get((w, cc)) for w in weights}, weights)
                mix[f"mix@c{cc}"] = judge(vals, rule, "gain")
            cand["mixture"] = mix
            ni = cells if rule.get("non_inferiority_on", "cells") == "cells" else mix
            sc = _scope(cells, mix, mix, ni, gv, rule, gate_blocker)
            cand.update(enable=sc["enable"], blockers=sc["blockers"], undecided=sc["undecided"],
                        excluded=sc["excluded"], score=sc["score"])
        out["candidates"].append(cand)
        out["undecided"] += [dict(u, arm=arm) for u in cand["undecided"]]
    if route_by_workload:
        for w in workloads:
            ok = [c for c in out["candidates"] if c["workloads"][w]["enable"]]
            best = max(ok, key=lambda c: c["workloads"][w]["score"] or 0) if ok else None
            out["per_workload"][w] = best["arm"] if best else None
        out["decision"] = "enable_per_workload" if any(out["per_workload"].values()) else "do_not_enable"
    else:
        ok = [c for c in out["candidates"] if c["enable"]]
        if ok:
            best = max(ok, key=lambda c: c["score"] or 0)
            out["decision"], out["enable"] = "enable", best["arm"]
    return out


def decision_label(res: dict) -> str:
    if res["decision"] == "enable":
        return f"enable {res['enable']}"
    if res["decision"] == "enable_per_workload":
        return "enable per workload: " + ", ".join(f"{w}={a}" for w, a in sorted(res["per_workload"].items()) if a)
    return res["decision"]


# ---------------------------------------------------------------------------------------------
# Adaptive confirmation: the checkpoint after each round
# ---------------------------------------------------------------------------------------------
def next_round(res: dict, rounds_done: int, rule: dict) -> dict:
    """Whether the pre-registered stopping rule asks for one more round after ``rounds_done`` rounds."""
    cap = rule.get("max_repeats")
    und = res["undecided"]
    if cap is None:
        return {"continue": False, "why": "no pre-registered stopping rule: fixed design"}
    if not und:
        return {"continue": False, "why": "every decisive cell is settled (no inconclusive cell of a candidate still "
                                          "in contention)"}
    cells = ", ".join(f"{u['arm']} {u['what']}" for u in und)
    if rounds_done >= cap:
        return {"continue": False, "why": f"cap of {cap} rounds reached with undecided cells: {cells}"}
    return {"continue": True, "why": f"undecided after {rounds_done} rounds: {cells}"}


# ---------------------------------------------------------------------------------------------
# Decision stability: bootstrap over rounds
# ---------------------------------------------------------------------------------------------
def _resampled(comps: list[dict], picks: list) -> list[dict]:
    out = []
    for c in comps:
        by_rep: dict[Any, list[dict]] = {}
        for r in c["repeats"]:
            by_rep.setdefault(r["rep"], []).append(r)
        reps = [dict(r, rep=f"{p}#{i}") for i, p in enumerate(picks) for r in by_rep.get(p, [])]
        out.append(dict(c, repeats=reps))
    return out


def _valid_rounds(comps: list[dict], weights: dict[str, float]) -> dict[tuple, set]:
    """The distinct rounds with a speedup behind each cell's interval, and behind each (arm, concurrency)
    mixture level's (the rounds every weighted workload has, as :func:`_mixture` pairs them)."""
    cells = {(c.get("arm"), c.get("workload"), c.get("concurrency")): {r["rep"] for r in c["repeats"] if r["speedup"]}
             for c in comps}
    out: dict[tuple, set] = dict(cells)
    for arm, conc in {(a, cc) for a, _, cc in cells}:
        per_w = [cells.get((arm, w, conc)) for w in weights]
        if per_w and all(v is not None for v in per_w):
            out[(arm, "mixture", conc)] = set.intersection(*per_w)
    return out


def stability(comps: list[dict], gate_by_arm: dict, rule: dict, workloads: list[str], concs: list,
              weights: dict[str, float], route_by_workload: bool = False, resamples: int = 500,
              seed: int = 7) -> dict:
    """Recompute the whole decision on bootstrap resamples of the rounds (all arms and cells of a round move together).

    A resample that draws fewer than two distinct rounds is excluded and redrawn: its per-cell spread is zero, its
    interval has zero width and its verdict is its point estimate, which no real study with that many rounds can
    produce (with [1.10, 1.20, 0.95] on one cell, every "enable" came from resamples of one round drawn three
    times). The same holds for one cell or one mixture level whose valid rounds are fewer than all rounds (a
    repeat excluded as invalid): a resample that leaves it fewer than two distinct valid rounds, where the data have
    two or more, is excluded and redrawn too (the H200 scale study: cells with valid rounds {1, 2}, {1, 3} and {2, 3}
    flipped the decision in 73 % of resamples, every flip from such a resample). ``degenerate_excluded`` counts the redrawn
    ones (``cell_degenerate_excluded`` those of the second kind); ``resamples`` counts those kept. When fewer than
    one draw in 50 can be kept, the estimate stops with those kept and says so (``note``); when every resample kept
    is a reordering of the observed rounds (each round once), it carries no information and is not reported."""
    import numpy as np

    reps = sorted({r["rep"] for c in comps for r in c["repeats"]}, key=str)
    observed = decide(comps, gate_by_arm, rule, workloads, concs, weights, route_by_workload)
    obs_label = decision_label(observed)
    out: dict[str, Any] = {"resamples": 0, "rounds": len(reps), "observed": obs_label, "outcomes": {},
                           "agreement": None, "drivers": [], "degenerate_excluded": 0,
                           "cell_degenerate_excluded": 0,
                           "method": "bootstrap over rounds (paired: every arm and cell of a resampled round moves "
                           "together); the whole rule recomputed on each resample; resamples with fewer than two "
                           "distinct rounds (zero spread, zero-width intervals) are excluded and redrawn, and so are "
                           "resamples that leave a cell or a mixture level with two or more distinct valid rounds "
                           "fewer than two"}
    if len(reps) < 2:
        out["note"] = "fewer than 2 rounds: stability not estimable"
        return out
    rng = np.random.default_rng(seed)
    obs_v = {(c["arm"], k): j["verdict"] for c in observed["candidates"] for k, j in c["cells"].items()}
    counts: dict[str, int] = {}
    flips: dict[tuple, int] = {}
    flips_when_changed: dict[tuple, int] = {}
    changed = 0
    kept = 0
    estimable = {k: v for k, v in _valid_rounds(comps, weights).items() if len(v) >= 2}
    draws = reordered = 0
    while kept < resamples:
        if draws >= 50 * resamples:
            out["note"] = (f"{kept} of {resamples} resamples kept after {draws} draws: most resamples leave a cell "
                           "or mixture level without two distinct valid rounds")
            break
        draws += 1
        picks = [reps[i] for i in rng.integers(0, len(reps), size=len(reps))]
        if len(set(picks)) < 2:  # degenerate: one round drawn every time
            out["degenerate_excluded"] += 1
            continue
        drawn = set(picks)
        if any(len(v & drawn) < 2 for v in estimable.values()):  # degenerate in one cell or mixture level
            out["degenerate_excluded"] += 1
            out["cell_degenerate_excluded"] += 1
            continue
        kept += 1
        reordered += len(drawn) == len(reps)
        res = decide(_resampled(comps, picks), gate_by_arm, rule, workloads, concs, weights, route_by_workload)
        lab = decision_label(res)
        counts[lab] = counts.get(lab, 0) + 1
        diff = lab != obs_label
        changed += diff
        for c in res["candidates"]:
            for k, j in c["cells"].items():
                if j["verdict"] != obs_v.get((c["arm"], k)):
                    flips[(c["arm"], k)] = flips.get((c["arm"], k), 0) + 1
                    if diff:
                        flips_when_changed[(c["arm"], k)] = flips_when_changed.get((c["arm"], k), 0) + 1
    if kept and reordered == kept:  # every admissible resample holds every round once: the observed data reordered
        out["note"] = (f"not estimable: with {len(reps)} rounds and these exclusions every admissible resample is a "
                       "reordering of the observed rounds (the cells' valid rounds leave no resample with a round "
                       "repeated); stability needs more rounds")
        return out
    if not kept:
        return out
    out["resamples"] = kept
    out["outcomes"] = {k: v / kept for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}
    out["agreement"] = counts.get(obs_label, 0) / kept
    ranked = sorted(flips, key=lambda k: (-flips_when_changed.get(k, 0), -flips[k], str(k)))
    out["drivers"] = [{"arm": a, "cell": k, "observed": obs_v.get((a, k)), "flip_rate": flips[(a, k)] / kept,
                       "flip_rate_when_decision_changes": (flips_when_changed.get((a, k), 0) / changed) if changed else 0.0}
                      for a, k in ranked[:6]]
    return out


def format_outcomes(stab: dict) -> str:
    if not stab.get("resamples"):
        return stab.get("note") or "not estimated"
    return ", ".join(f"{k} in {v:.0%} of resamples" for k, v in stab["outcomes"].items())


# ---------------------------------------------------------------------------------------------
# Recommendation (pure)
# ---------------------------------------------------------------------------------------------
def cell_status(comp: dict, min_gain: float, max_regression: float) -> str:
    """Verdict of a comparison's speedup interval: ``gain``, ``non_inferior``, ``inconclusive``, ``regression``
    or ``missing`` (:func:`specstudy.inference.decision.verdict`; the interval is the comparison's primary CI)."""
    sp = comp["speedup"]
    return verdict(sp.get("ci_low"), sp.get("ci_high"), min_gain, max_regression)


def _mixture(comps_by_w: dict[str, dict], weights: dict[str, float]) -> list[float]:
    """Per-repeat mixture speedup: sum(w/otps_base) / sum(w/otps_arm) (weights = output-token shares)."""
    reps = None
    per_w = {}
    for w in weights:
        c = comps_by_w.get(w)
        if c is None:
            return []
        per_w[w] = {r["rep"]: r for r in c["repeats"] if r["speedup"]}
        reps = set(per_w[w]) if reps is None else reps & set(per_w[w])
    out = []
    for rep in sorted(reps or []):
        tb = sum(wt / per_w[w][rep]["base_otps"] for w, wt in weights.items())
        ta = sum(wt / per_w[w][rep]["arm_otps"] for w, wt in weights.items())
        out.append(tb / ta)
    return out


GATE_RULE = ("A candidate is eligible only with a correctness-gate verdict 'pass' from the {phase} phase, the phase "
             "the decision is made on; a gate of another phase never stands in for a missing one. The final "
             "candidate for the capacity search follows the same rule (confirmation gates).")


def recommend(comps: list[dict], gates: list[dict], config: dict | None = None, prereg: dict | None = None,
              gate_phase: str | None = None, with_stability: bool = True) -> dict:
    """Decide which speculative setting (if any) to enable; a pure function of its inputs.

    The rule (this module, declared in the pre-registration): three-way cell verdicts from
    intervals corrected for the repeated looks of adaptive confirmation; a candidate is enabled only with
    a gate verdict ``pass``, no regression shown anywhere, non-inferiority shown on every decisive cell
    (or on the declared traffic mixture) and a gain shown on the traffic mixture (per workload when traffic
    is routed by workload). An inconclusive cell blocks enabling; ``undecided`` lists those cells with the
    extra rounds expected to settle them. ``stability`` recomputes the decision on bootstrap resamples of
    the rounds. Without ``prereg`` the config's margins are used and the rule says so (a caller holding a
    config that names a pre-registration reads it first: :func:`specstudy.study.prereg.load_prereg`).
    """
    from specstudy.inference.stats import settings

    s = settings(config)
    r, a = s["recommendation"], s["analysis"]
    refuse_config_traffic(config)
    rule = rule_from(config, prereg)
    phase = r["phase"]
    use = [c for c in comps if c["phase"] == phase]
    workloads = r["workloads"] or sorted({c["workload"] for c in use})
    concs = r["concurrencies"] or sorted({c["concurrency"] for c in use})
    # One rule for the recommendation and the final candidate: the gate of the decision's phase is
    # required; a gate of another phase never stands in for it (GATE_RULE, stated in the report). Only an
    # interim look of adaptive confirmation (decision.checkpoint) names gate_phase='screen' explicitly,
    # because confirmation gates exist only once the rounds are complete; its record says so.
    gate_phase = gate_phase or phase
    traffic = traffic_from(prereg, workloads)
    routed = traffic["route_by_workload"]
    gate_by_arm = {g["arm"]: g for g in gates if g.get("phase") == gate_phase}
    other = {g["arm"]: g.get("phase") for g in gates if g.get("phase") != gate_phase}
    out: dict[str, Any] = {"phase": phase, "gate_phase": gate_phase, "gate_rule": GATE_RULE.format(phase=gate_phase),
                           "workloads": workloads, "concurrencies": concs,
                           "route_by_workload": routed, "traffic": traffic, "min_gain": rule["min_gain"],
                           "max_regression": rule["max_regression"], "rule": rule, "candidates": [],
                           "decision": "do_not_enable", "enable": None, "per_workload": {}, "missing": [],
                           "undecided": [], "stability": None}
    if not use:
        out["decision"] = "insufficient_evidence"
        out["missing"].append(f"no {phase} comparisons (has the {phase} phase run?)")
        return out
    # output-token shares (traffic.shares); a zero share takes no part in the mixture
    weights = {w: v for w, v in (traffic["mixture"] or {}).items() if v}
    res = decide(use, gate_by_arm, rule, workloads, concs, weights, routed,
                          gate_phase=gate_phase, other_gates=other)
    out.update({k: res[k] for k in ("candidates", "decision", "enable", "per_workload", "undecided")})
    if with_stability:  # the final candidate needs the decision only, not its bootstrap
        out["stability"] = stability(use, gate_by_arm, rule, workloads, concs, weights,
                                              routed, int(a["stability_resamples"]), int(a["seed"]))
    return out
