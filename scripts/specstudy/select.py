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
- Confirmation arms = baseline + the candidates.

The selection reads only the files it is given, and refuses any that is not a screening output;
it refuses to run when the pre-registration changed since screening locked it.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

from . import atomic
from .atomic import sha256_file
from .config import load_config, load_prereg


class SelectionError(RuntimeError):
    pass


def _metric(summary: dict, metric: str) -> float | None:
    if metric == "tpot_p50":
        v = ((summary.get("latency_ms") or {}).get("tpot") or {}).get("p50")
        return float(v) if v else None
    v = (summary.get("tokens") or {}).get("output_tokens_per_second")
    return 1.0 / float(v) if v else None  # invert: lower is better everywhere below


def _kv_tokens(record: dict) -> float | None:
    for src in (record.get("confounds") or {}, record.get("cache_config") or {}):
        for key in ("kv_cache_tokens", "kv_cache_size_tokens", "kv_cache_tokens_total"):
            if src.get(key):
                return float(src[key])
    return None


def select(summaries: list[dict], deployments: list[dict], prereg: dict) -> dict:
    rule = prereg["selection"]
    metric = rule["metric"]
    within = float(rule["retain_within"])
    retain_if = set(rule.get("retain_if") or ["lower_memory", "better_worst_workload"])
    cells: dict[tuple, list[float]] = defaultdict(list)
    excluded = []
    methods = {}
    for s in summaries:
        k = s["keys"]
        methods[k["arm"]] = k.get("method")
        v = _metric(s, metric) if (s.get("validity") or {}).get("valid") else None
        if v is None:
            excluded.append({"arm": k["arm"], "rep": k["rep"], "workload": k["workload"], "concurrency": k["concurrency"],
                             "reasons": [r.get("code") for r in (s.get("validity") or {}).get("reasons", [])]})
            continue
        cells[(k["arm"], k["workload"], int(k["concurrency"]))].append(v)
    med = {key: statistics.median(vals) for key, vals in cells.items()}
    workloads = sorted({w for (_, w, _) in med})
    conc = sorted({c for (_, _, c) in med})
    scores: dict[str, dict[str, float]] = defaultdict(dict)
    for arm in sorted({a for (a, _, _) in med if a != "baseline"}):
        for w in workloads:
            logs = []
            complete = True
            for c in conc:
                b = med.get(("baseline", w, c))
                v = med.get((arm, w, c))
                if b is None or v is None:
                    complete = False
                    break
                logs.append(math.log(v / b))
            if complete and logs:
                scores[arm][w] = sum(logs) / len(logs)
    kv = defaultdict(list)
    for d in deployments:
        if d.get("status") == "ok" and _kv_tokens(d) is not None:
            kv[(d.get("arm") or {}).get("name")].append(_kv_tokens(d))
    kv_med = {a: statistics.median(v) for a, v in kv.items()}
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
        "excluded_cells": excluded,
    }


def run_selection(config_path: str, lock_path: str, summary_paths: list[str], deployment_paths: list[str],
                  out: str, screen_root: str = "results/screen") -> dict:
    cfg = load_config(config_path)
    prereg = load_prereg(cfg)
    from .config import ConfigError, prereg_path
    from .prereg_guard import verify_lock

    try:
        lock = verify_lock(lock_path, prereg_path(cfg))
    except ConfigError as exc:
        raise SelectionError(str(exc)) from None
    root = Path(screen_root).resolve()
    paths = list(summary_paths) + list(deployment_paths)
    for p in paths:
        if root not in Path(p).resolve().parents:
            raise SelectionError(f"selection may read screening outputs only; refusing {p} (not under {screen_root})")
    summaries = [atomic.read_json(p) for p in summary_paths]
    deployments = [atomic.read_json(p) for p in deployment_paths]
    for p, d in zip(deployment_paths, deployments, strict=True):
        locked = d.get("prereg_sha256")
        if locked and locked != lock["sha256"]:
            raise SelectionError(f"{p}: ran under pre-registration sha256 {locked}, but the lock is {lock['sha256']}")
    for p, s in zip(summary_paths, summaries, strict=True):
        if (s.get("keys") or {}).get("phase") != "screen":
            raise SelectionError(f"{p}: not a screening cell (phase {(s.get('keys') or {}).get('phase')!r})")
    result = select(summaries, deployments, prereg)
    result["prereg_sha256"] = lock["sha256"]
    result["inputs"] = [{"path": p, "sha256": sha256_file(p)} for p in paths]
    result["phase_of_inputs"] = "screen"
    from . import schemas

    schemas.validate(result, "selection", out)
    atomic.write_json(out, result)
    return result


def _cmd_select(args) -> int:
    try:
        res = run_selection(args.config, args.lock, args.summaries, args.deployments, args.out, args.screen_root)
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
    p.add_argument("--screen-root", default="results/screen")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_select)
    register_final(sub)


# ---------------------------------------------------------------- final candidate (for capacity)

def final_candidate(summaries: list[dict], gates: list[dict], selection: dict, traffic_mix: dict | None = None) -> dict:
    """The confirmation candidate that goes on to the capacity search.

    Score: traffic-mix-weighted mean over workloads (equal weights without a mix) of the mean over
    concurrencies of log(median confirmation output tokens/s of the arm / baseline's median). Only
    arms whose confirmation gate passed are eligible; the best eligible arm is chosen even when it
    does not beat baseline (the decision records whether it does).
    """
    tput: dict[tuple, list[float]] = defaultdict(list)
    for s in summaries:
        k = s["keys"]
        v = (s.get("tokens") or {}).get("output_tokens_per_second")
        if (s.get("validity") or {}).get("valid") and v:
            tput[(k["arm"], k["workload"], int(k["concurrency"]))].append(float(v))
    med = {key: statistics.median(v) for key, v in tput.items()}
    verdicts = {g.get("arm"): g.get("verdict") for g in gates}
    scores = {}
    for arm in selection.get("confirmation_arms", []):
        if arm == "baseline":
            continue
        per_w = defaultdict(list)
        for (a, w, c), v in med.items():
            b = med.get(("baseline", w, c))
            if a == arm and b:
                per_w[w].append(math.log(v / b))
        if not per_w:
            continue
        weights = {w: (traffic_mix or {}).get(w, 1.0 if not traffic_mix else 0.0) for w in per_w}
        total = sum(weights.values()) or 1.0
        scores[arm] = sum(weights[w] * (sum(x) / len(x)) for w, x in per_w.items()) / total
    eligible = {a: sc for a, sc in scores.items() if verdicts.get(a) == "pass"}
    arm = max(eligible, key=eligible.get) if eligible else None
    return {
        "schema": "specstudy.final-candidate/1",
        "arm": arm,
        "log_speedup_scores": scores,
        "gate_verdicts": verdicts,
        "beats_baseline": bool(arm and eligible[arm] > 0),
        "why": ("best gate-passing confirmation candidate by traffic-weighted log speedup of output tokens/s"
                if arm else "no confirmation candidate passed its correctness gate; capacity runs baseline only"),
    }


def _cmd_final(args) -> int:
    cfg = load_config(args.config)
    summaries = [atomic.read_json(p) for p in args.summaries]
    gates = [atomic.read_json(p) for p in args.gates]
    selection = atomic.read_json(args.selection)
    for p, s in zip(args.summaries, summaries, strict=True):
        if (s.get("keys") or {}).get("phase") != "confirm":
            print(f"error: {p} is not a confirmation cell")
            return 2
    res = final_candidate(summaries, gates, selection, (cfg.get("recommendation") or {}).get("traffic_mix"))
    from . import schemas

    schemas.validate(res, "final-candidate", args.out)
    atomic.write_json(args.out, res)
    print(f"final candidate: {res['arm']} -> {args.out}")
    return 0


def register_final(sub) -> None:
    p = sub.add_parser("final-candidate", help="pick the confirmation candidate for the capacity search")
    p.add_argument("--config", required=True)
    p.add_argument("--summaries", nargs="+", required=True)
    p.add_argument("--gates", nargs="*", default=[])
    p.add_argument("--selection", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_final)
