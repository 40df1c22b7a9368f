"""The pre-registered selection: screening results in, confirmation candidates out.

Rule (from the pre-registration file, locked before screening):
- Score of an arm on a workload: mean over the screening concurrencies of
  log(median over deployment repeats of the cell's metric / the baseline's median), where the
  metric is TPOT p50 (lower is better) or output tokens/s (higher is better, the ratio inverted).
  Only valid cells count; an arm missing a (workload, concurrency) level has no score there.
- Per workload, the draft configuration with the lowest score is a candidate; any other draft
  configuration whose score is within ``retain_within`` (ratio exp(score - best) ≤ 1 + retain_within)
  is also kept if it has a lower memory cost (larger KV-cache pool) or better worst-workload
  behaviour (a lower maximum score over workloads) than the best.
- With ``best_ngram``, the n-gram setting with the lowest mean score over workloads is also kept.
- With ``max_candidates`` N, only the N candidates with the lowest mean score over workloads go to
  confirmation; the others are listed under ``capped`` with their mean score.
- Arms whose screening correctness gate failed (verdict ``fail``) are never candidates: they are
  listed under ``gate_excluded`` and left out of the ranking.
- Confirmation arms = baseline + the candidates.

The written selection carries ``digest``: the sha256 of its own canonical JSON without that field;
:func:`verify_selection` (the confirmation plan, every confirmation deployment and the final
candidate call it) refuses a selection whose content no longer matches it, or whose file hash
differs from the one the confirmation plan recorded.

The selection reads only the files it is given, and refuses any that is not a screening output;
it refuses to run when the pre-registration changed since screening locked it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from specstudy.core import atomic
from specstudy.core.arms import baseline_of, engine_of, is_arm_name, is_baseline, parse_arm
from specstudy.core.atomic import sha256_file
from specstudy.core.records import kv_cache_tokens, read_plan
from specstudy.core.stat_util import median
from specstudy.study.config import load_config
from specstudy.study.prereg import load_prereg
from specstudy.study.selection_lock import SelectionError, selection_digest, verify_selection


def _metric(summary: dict, metric: str) -> float | None:
    if metric == "tpot_p50":
        v = ((summary.get("latency_ms") or {}).get("tpot") or {}).get("p50")
        return float(v) if v else None
    v = (summary.get("tokens") or {}).get("output_tokens_per_second")
    return 1.0 / float(v) if v else None  # invert: lower is better everywhere below


def _build(arm) -> str | None:
    return engine_of(arm) if is_arm_name(arm) else None


def select(summaries: list[dict], deployments: list[dict], prereg: dict, gates: list[dict] | None = None) -> dict:
    """The selection (module docstring). In a study of several engine builds the rule runs on each build's
    arms against that build's baseline, and every arm that is a candidate on one build is confirmed on every
    build that screened it (so that confirmation measures the same arm across builds: docs/engines.md)."""
    builds = sorted({_build(s["keys"]["arm"]) for s in summaries} - {None})
    if not builds:
        return _select_build(summaries, deployments, prereg, gates)
    subs = {b: _select_build([s for s in summaries if _build(s["keys"]["arm"]) == b],
                             [d for d in deployments if _build((d.get("arm") or {}).get("name")) == b], prereg,
                             [g for g in gates or [] if _build(g.get("arm")) == b]) for b in builds}
    screened = {s["keys"]["arm"] for s in summaries}
    chosen = sorted({parse_arm(c["arm"])["name"].rsplit("@", 1)[0] for sub in subs.values() for c in sub["candidates"]})
    candidates = []
    for b in builds:
        own = {c["arm"]: c["why"] for c in subs[b]["candidates"]}
        for base in chosen:
            name = f"{base}@{b}"
            if name in own or name in screened:
                candidates.append({"arm": name, "why": own.get(name) or [
                    "a candidate on another engine build: confirmed on every build that screened it"]})
    candidates = [c for c in candidates if c["arm"] not in {g["arm"] for sub in subs.values() for g in sub["gate_excluded"]}]
    merged = {key: {k: v for sub in subs.values() for k, v in sub[key].items()}
              for key in ("scores", "kv_cache_tokens_median", "screening_gates")}
    return {
        "schema": "specstudy.selection/1",
        "rule": prereg["selection"],
        "metric": prereg["selection"]["metric"],
        **merged,
        "per_workload": {b: subs[b]["per_workload"] for b in builds},
        "best_ngram": {b: subs[b]["best_ngram"] for b in builds},
        "engines": {b: {"candidates": [c["arm"] for c in subs[b]["candidates"]]} for b in builds},
        "candidates": candidates,
        "confirmation_arms": [f"baseline@{b}" for b in builds] + [c["arm"] for c in candidates],
        **({"capped": [c for b in builds for c in subs[b]["capped"]]} if prereg["selection"].get("max_candidates")
           is not None else {}),
        "excluded_cells": [c for b in builds for c in subs[b]["excluded_cells"]],
        "gate_excluded": [g for b in builds for g in subs[b]["gate_excluded"]],
    }


def _select_build(summaries: list[dict], deployments: list[dict], prereg: dict, gates: list[dict] | None = None) -> dict:
    rule = prereg["selection"]
    gate_verdicts = {g.get("arm"): g.get("verdict") for g in gates or [] if g.get("phase") in ("screen", None)}
    gate_excluded = {a: f"screening correctness gate verdict {v}" for a, v in gate_verdicts.items() if v == "fail"}
    metric = rule["metric"]
    within = float(rule["retain_within"])
    retain_if = set(rule.get("retain_if") or ["lower_memory", "better_worst_workload"])
    cells: dict[tuple, list[float]] = defaultdict(list)
    excluded = []
    methods = {}
    for s in summaries:
        k = s["keys"]
        methods[k["arm"]] = k.get("method")
        if k["arm"] in gate_excluded:
            continue
        v = _metric(s, metric) if (s.get("validity") or {}).get("valid") else None
        if v is None:
            excluded.append({"arm": k["arm"], "rep": k["rep"], "workload": k["workload"], "concurrency": k["concurrency"],
                             "reasons": [r.get("code") for r in (s.get("validity") or {}).get("reasons", [])]})
            continue
        cells[(k["arm"], k["workload"], int(k["concurrency"]))].append(v)
    med = {key: median(vals) for key, vals in cells.items()}
    workloads = sorted({w for (_, w, _) in med})
    conc = sorted({c for (_, _, c) in med})
    scores: dict[str, dict[str, float]] = defaultdict(dict)
    for arm in sorted({a for (a, _, _) in med if not is_baseline(a)}):
        own = baseline_of(arm) if is_arm_name(arm) else "baseline"
        for w in workloads:
            logs = []
            complete = True
            for c in conc:
                b = med.get((own, w, c))
                v = med.get((arm, w, c))
                if b is None or v is None:
                    complete = False
                    break
                logs.append(math.log(v / b))
            if complete and logs:
                scores[arm][w] = sum(logs) / len(logs)
    kv = defaultdict(list)
    for d in deployments:
        tokens = kv_cache_tokens(d)  # the /metrics KV pool, as in the deployments table
        if d.get("status") == "ok" and tokens:
            kv[(d.get("arm") or {}).get("name")].append(tokens)
    kv_med = {a: median(v) for a, v in kv.items()}
    worst = {a: max(s.values()) for a, s in scores.items() if s}
    draft_arms = [a for a in scores if methods.get(a) == "draft_model"]
    ngram_arms = [a for a in scores if methods.get(a) == "ngram"]
    per_workload = {}
    candidates: dict[str, list[str]] = defaultdict(list)
    for w in workloads:
        ranked = sorted((scores[a][w], a) for a in draft_arms if w in scores[a])
        if not ranked:
            per_workload[w] = {"best": None, "retained": [], "why": "no draft configuration with valid screening cells"}
            continue
        best_score, best = ranked[0]
        retained = []
        for sc, a in ranked[1:]:
            ratio = math.exp(sc - best_score)
            reasons = []
            if ratio <= 1 + within:
                if "any" in retain_if:
                    reasons.append("within margin")
                if "lower_memory" in retain_if and kv_med.get(a) and kv_med.get(best) and kv_med[a] > kv_med[best]:
                    reasons.append(f"lower memory cost (KV pool {kv_med[a]:.0f} vs {kv_med[best]:.0f} tokens)")
                if "better_worst_workload" in retain_if and worst.get(a) is not None and worst[a] < worst[best]:
                    reasons.append(f"better worst-workload score ({worst[a]:.4f} vs {worst[best]:.4f})")
            if reasons:
                retained.append({"arm": a, "score_ratio_to_best": ratio, "reasons": reasons})
        per_workload[w] = {"best": best, "best_score": best_score, "retained": retained}
        candidates[best].append(f"best on {w}")
        for r in retained:
            candidates[r["arm"]].append(f"within {within:.0%} of best on {w}: " + "; ".join(r["reasons"]))
    best_ngram = None
    if rule.get("best_ngram", True) and ngram_arms:
        mean_scores = sorted((sum(scores[a].values()) / len(scores[a]), a) for a in ngram_arms if scores[a])
        if mean_scores:
            best_ngram = mean_scores[0][1]
            candidates[best_ngram].append("best n-gram setting (mean score over workloads)")
    order = sorted(candidates)
    capped = []
    cap = rule.get("max_candidates")
    if cap is not None and len(order) > int(cap):
        # keep the ``max_candidates`` with the lowest mean score over workloads (ties: by name); the rest are
        # recorded with the reason, never silently dropped
        mean = {a: sum(scores[a].values()) / len(scores[a]) for a in order}
        kept = sorted(order, key=lambda a: (mean[a], a))[:int(cap)]
        capped = [{"arm": a, "mean_score": mean[a], "why": f"max_candidates {cap}: mean score {mean[a]:.4f} is not "
                   f"among the {cap} lowest"} for a in order if a not in kept]
        order = sorted(kept)
    return {
        "schema": "specstudy.selection/1",
        "rule": rule,
        "metric": metric,
        "scores": {a: dict(s) for a, s in scores.items()},
        "kv_cache_tokens_median": kv_med,
        "per_workload": per_workload,
        "best_ngram": best_ngram,
        "candidates": [{"arm": a, "why": candidates[a]} for a in order],
        "confirmation_arms": ["baseline"] + order,
        **({"capped": capped} if cap is not None else {}),
        "excluded_cells": excluded,
        "screening_gates": {a: v for a, v in sorted(gate_verdicts.items())},
        "gate_excluded": [{"arm": a, "why": why} for a, why in sorted(gate_excluded.items())],
    }


def run_selection(config_path: str, lock_path: str, summary_paths: list[str], deployment_paths: list[str],
                  out: str, screen_root: str = "results/screen", gate_paths: list[str] | None = None,
                  confirm_plan: str | None = None) -> dict:
    """Select from the screening files and write ``out``. With ``confirm_plan`` (the confirmation plan's path)
    that exists, the selection is locked (specstudy.study.selection_lock): only the selection the plan recorded
    may be written (the same screening content gives the same bytes); any other is refused."""
    cfg = load_config(config_path)
    prereg = load_prereg(cfg)
    from specstudy.study.config import ConfigError
    from specstudy.study.prereg import prereg_path
    from specstudy.study.prereg_guard import verify_lock

    try:
        lock = verify_lock(lock_path, prereg_path(cfg))
    except ConfigError as exc:
        raise SelectionError(str(exc)) from None
    root = Path(screen_root).resolve()
    paths = list(summary_paths) + list(deployment_paths)
    for p in paths:
        if root not in Path(p).resolve().parents:
            raise SelectionError(f"selection may read screening outputs only; refusing {p} (not under {screen_root})")
    gates = [atomic.read_json(p) for p in gate_paths or []]
    for p, g in zip(gate_paths or [], gates, strict=True):
        if g.get("phase") != "screen":
            raise SelectionError(f"{p}: field 'phase' is {g.get('phase')!r}; the selection reads screening gates only "
                                 "(results/gates/screen/<arm>.json)")
    summaries = [atomic.read_json(p) for p in summary_paths]
    deployments = [atomic.read_json(p) for p in deployment_paths]
    for p, d in zip(deployment_paths, deployments, strict=True):
        locked = d.get("prereg_sha256")
        if locked and locked != lock["sha256"]:
            raise SelectionError(f"{p}: ran under pre-registration sha256 {locked}, but the lock is {lock['sha256']}")
    for p, s in zip(summary_paths, summaries, strict=True):
        if (s.get("keys") or {}).get("phase") != "screen":
            raise SelectionError(f"{p}: not a screening cell (phase {(s.get('keys') or {}).get('phase')!r})")
    result = select(summaries, deployments, prereg, gates)
    result["prereg_sha256"] = lock["sha256"]
    result["inputs"] = [{"path": p, "sha256": sha256_file(p)} for p in paths + list(gate_paths or [])]
    result["phase_of_inputs"] = "screen"
    result["digest"] = selection_digest(result)
    from specstudy.core import schemas

    schemas.validate(result, "selection", out)
    _refuse_unlocked_rewrite(result, out, confirm_plan)
    atomic.write_json_if_changed(out, result)
    return result


def _refuse_unlocked_rewrite(result: dict, out: str, confirm_plan: str | None) -> None:
    """Refuse a selection other than the one the confirmation plan (if it exists) was built from."""
    import hashlib

    if not confirm_plan or not Path(confirm_plan).exists():
        return
    plan = read_plan(confirm_plan)
    recorded = plan.selection.sha256 if plan.selection else None
    now = hashlib.sha256(atomic.dumps_json(result).encode("utf-8")).hexdigest()
    if recorded and now == recorded:
        return
    from specstudy.study.selection_lock import RESELECT_COMMAND, RESTORE_COMMAND

    old = Path(out)
    changed = ""
    if old.exists():
        from specstudy.study.selection_lock import changed_inputs

        prev = atomic.read_json(old)
        ch = changed_inputs(prev)
        changed = (" Changed screening files: " + ", ".join(c.path for c in ch) + ".") if ch else ""
    raise SelectionError(
        f"{out}: the confirmation plan {confirm_plan} was built from the selection with sha256 {recorded}; the "
        f"screening files now give a different selection (sha256 {now}, confirmation arms "
        f"{result['confirmation_arms']}).{changed} The locked selection is never rewritten: restore the screening "
        f"files ({RESTORE_COMMAND}), or archive confirmation and select again ({RESELECT_COMMAND})")


def _cmd_select(args) -> int:
    try:
        res = run_selection(args.config, args.lock, args.summaries, args.deployments, args.out, args.screen_root,
                            args.gates, args.confirm_plan)
    except SelectionError as exc:
        print(f"error: {exc}")
        return 2
    print(f"selection: confirmation arms {res['confirmation_arms']} -> {args.out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("select", help="apply the pre-registered selection rule to screening results")
    p.add_argument("--config", required=True)
    p.add_argument("--lock", required=True, help="results/screen/prereg-lock.json")
    p.add_argument("--summaries", nargs="+", required=True)
    p.add_argument("--deployments", nargs="*", default=[])
    p.add_argument("--gates", nargs="*", default=[], help="screening gates (results/gates/screen/<arm>.json): "
                   "an arm whose gate failed is never a candidate")
    p.add_argument("--screen-root", default="results/screen")
    p.add_argument("--confirm-plan", default=None, help="results/plan/confirm.json: once it exists the selection "
                   "is locked; only the selection it recorded may be written")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_select)
    register_final(sub)


# ---------------------------------------------------------------- final candidate (for capacity)

#: How the capacity candidate is chosen; written into every final-candidate record.
CANDIDATE_ORDERING = (
    "the arm the pre-registered decision rule enables on the confirmation data (decision.decide, the same call as "
    "the recommendation; among several enabled arms the rule's own choice: the highest score, the lowest interval "
    "bound of its traffic-mixture gain levels); when the rule enables none, the arm closest to enabling by the same "
    "rule, ranked by: enabled, then no regression shown (not excluded), then fewer blockers, then higher score. Only "
    "arms whose confirmation gate passed are eligible (no evidence can enable an arm whose gate did not pass)")


def _comparison_row(s: dict) -> dict:
    """The fields of a confirmation cell summary that :func:`specstudy.inference.stats.comparisons` reads."""
    k, v = s.get("keys") or {}, s.get("validity") or {}
    lat = s.get("latency_ms") or {}
    return {"phase": "confirm", "arm": k.get("arm"), "rep": k.get("rep"), "workload": k.get("workload"),
            "concurrency": int(k["concurrency"]) if k.get("concurrency") is not None else None,
            "kind": k.get("kind") or "repeat", "method": k.get("method"), "deployment_id": k.get("deployment_id"),
            "valid": bool(v.get("valid")), "throughput_valid": v.get("throughput_valid"),
            "latency_valid": v.get("latency_valid"),
            "output_tokens_per_second": (s.get("tokens") or {}).get("output_tokens_per_second"),
            "tpot_p50_ms": (lat.get("tpot") or {}).get("p50"), "ttft_p50_ms": (lat.get("ttft") or {}).get("p50")}


def _rank_key(c: dict) -> tuple:
    if "workloads" in c:  # routed: the arm's best workload scope
        scopes = list(c["workloads"].values())
        score = max((sc["score"] for sc in scopes if sc.get("score") is not None), default=None)
    else:
        score = c.get("score")
    return (bool(c.get("enable")), not c.get("excluded"), -len(c.get("blockers") or []),
            score if score is not None else -math.inf)


def final_candidate(summaries: list[dict], gates: list[dict], selection: dict, config: dict | None = None,
                    prereg: dict | None = None) -> dict:
    """The confirmation candidate that goes on to the capacity search (:data:`CANDIDATE_ORDERING`).

    ``config``/``prereg``: the study's (the rule, margins, traffic mixture and routing come from them, exactly
    as for the recommendation); without them the defaults of :mod:`specstudy.inference.stats` apply.
    """
    from specstudy.inference import decision, stats

    arms = [a for a in selection.get("confirmation_arms", [])]
    rows = [_comparison_row(s) for s in summaries if (s.get("keys") or {}).get("arm") in arms]
    cfg = dict(config or {}, recommendation=dict((config or {}).get("recommendation") or {}, phase="confirm"))
    comps = stats.comparisons(rows, cfg)
    rec = decision.recommend(comps, gates, cfg, prereg, with_stability=False)
    verdicts = {g.get("arm"): g.get("verdict") for g in gates if g.get("phase") == "confirm"}
    cands = [c for c in rec["candidates"] if not is_baseline(c["arm"])]
    ranked = sorted(cands, key=_rank_key, reverse=True)  # stable: ties keep decide's (sorted-arm) order, as max() does
    eligible = [c for c in ranked if c["gate_verdict"] == "pass"]
    arm = eligible[0]["arm"] if eligible else None
    if rec["decision"] == "enable" and arm != rec["enable"]:
        raise AssertionError(f"final candidate {arm} differs from the rule's enabled arm {rec['enable']}")
    enabled = bool(eligible and eligible[0].get("enable"))
    ranking = []
    for c in ranked:
        score = _rank_key(c)[3]
        ranking.append({"arm": c["arm"], "enable": bool(c.get("enable")), "gate_verdict": c["gate_verdict"],
                        "excluded": bool(c.get("excluded")), "blockers": list(c.get("blockers") or []),
                        "score": score if math.isfinite(score) else None, "eligible": c["gate_verdict"] == "pass"})
    if arm is None:
        why = "no confirmation candidate passed its correctness gate; capacity runs baseline only"
    elif enabled:
        why = f"the decision rule enables {arm} on the confirmation data"
    else:
        why = (f"the decision rule enables no arm; {arm} is the closest to enabling by the rule's ordering "
               f"(blockers: {'; '.join(eligible[0]['blockers']) or 'none'})")
    return {
        "schema": "specstudy.final-candidate/1",
        "arm": arm,
        "rule_enables": enabled,
        "decision": stats_decision_label(rec),
        "ordering": CANDIDATE_ORDERING,
        "ranking": ranking,
        "rule": {k: rec["rule"].get(k) for k in ("source", "min_gain", "max_regression", "look_confidence",
                                                 "non_inferiority_on")},
        "gate_verdicts": verdicts,
        # every traffic-mixture gain level's interval lies above 1 (the rule's score above 1)
        "beats_baseline": bool(eligible) and _rank_key(eligible[0])[3] > 1.0,
        "why": why,
    }


def stats_decision_label(rec: dict) -> str:
    from specstudy.inference.decision import decision_label

    return decision_label(rec) if rec["decision"] != "insufficient_evidence" else rec["decision"]


def _cmd_final(args) -> int:
    cfg = load_config(args.config)
    summaries = [atomic.read_json(p) for p in args.summaries]
    gates = [atomic.read_json(p) for p in args.gates]
    try:
        selection = verify_selection(args.selection, args.plan)
    except SelectionError as exc:
        print(f"error: {exc}")
        return 2
    for p, s in zip(args.summaries, summaries, strict=True):
        if (s.get("keys") or {}).get("phase") != "confirm":
            print(f"error: {p} is not a confirmation cell")
            return 2
    # the pre-registered rule, as for the recommendation (without it: the library's default margins)
    from specstudy.study.prereg import prereg_path
    from specstudy.study.prereg_guard import verify_lock

    prereg = load_prereg(cfg)
    if args.lock:
        verify_lock(args.lock, prereg_path(cfg))
    res = final_candidate(summaries, gates, selection, cfg, prereg)
    from specstudy.core import schemas

    schemas.validate(res, "final-candidate", args.out)
    atomic.write_json_if_changed(args.out, res)
    print(f"final candidate: {res['arm']} -> {args.out}")
    return 0


def register_final(sub) -> None:
    p = sub.add_parser("final-candidate", help="pick the confirmation candidate for the capacity search")
    p.add_argument("--config", required=True)
    p.add_argument("--summaries", nargs="+", required=True)
    p.add_argument("--gates", nargs="*", default=[])
    p.add_argument("--selection", required=True)
    p.add_argument("--plan", help="results/plan/confirm.json: the selection's sha256 must match its record")
    p.add_argument("--lock", help="results/screen/prereg-lock.json: refuse a pre-registration changed since it")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_final)
