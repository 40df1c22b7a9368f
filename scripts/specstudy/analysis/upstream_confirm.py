"""The project's analysis on upstream's 8B EAGLE confirmation, at summary level, beside upstream's own report.

Upstream (swiss-ai/apertus-speculative-decoding) ran the confirmation as one deployment per arm and block
(``results/8b/eagle/confirm/<prefix>-<variant>-confirm-<block>-<stamp>/cells/<workload>/c<c>/``) and
summarised it in ``results/8b/eagle/confirm-report.json``. This module reads the cells' upstream
``summary.json`` files (the raw request rows and scrapes are what ``specstudy import-upstream`` needs; these
summaries are all the data set in ``tests/data/upstream-8b`` carries, see its MANIFEST.md), turns them into
the cell rows :func:`specstudy.inference.stats.comparisons` takes (block = repeat, so arm and baseline pair within a
block exactly as upstream paired them), and runs the project's comparisons, decision rule and stability on
them. :func:`compare_with_report` puts every per-cell figure of upstream's report beside the project's.

Definitions (docs/upstream-8b.md):

* TPOT and TTFT p50 are **upstream's** here (a summary carries no rows to recompute ours from): TPOT =
  (e2e - ttft) / (completion_tokens - 1) with e2e to the end of the stream, usage chunk and ``[DONE]``
  included. The project's own TPOT ends at the last content event (docs/metrics.md "Upstream 70B cells").
* Output tokens/s is upstream's summary value (completion tokens / upstream's wall), which is also what
  the importer's converted summary carries (it takes upstream's wall), so throughput is the same quantity.
* Acceptance: the project's comparison reports the **median** over blocks; upstream's report the **mean**.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from specstudy.core import atomic
from specstudy.inference import decision, stats

DEPLOYMENT_RE = re.compile(r"^(?P<prefix>.+?)-(?P<variant>baseline|[A-Za-z0-9_]+-k[0-9]+)-confirm-(?P<block>c[0-9]+)-(?P<stamp>[0-9]{8}T[0-9]{6}Z)$")
# the valid-cell threshold of specstudy.measure.cell (DEFAULT_THRESHOLDS['min_success_rate'])
MIN_SUCCESS_RATE = 0.99
DEFINITIONS = {
    "tpot_speedup": "baseline TPOT p50 / arm TPOT p50 per block (upstream's TPOT: to the end of the stream); "
                    "geometric mean over blocks. Project: 1 / geomean of stats.comparisons' tpot_ratio (arm / "
                    "baseline of the cell p50, paired by rep = block) - the same quantity",
    "throughput_speedup": "arm / baseline output tokens per second per block, geometric mean over blocks; project: "
                          "geomean of stats.comparisons' speedup - the same quantity",
    "acceptance_rate": "upstream: arithmetic mean over blocks of accepted/draft tokens; project: median over blocks "
                       "(stats.comparisons absolute.acceptance_rate) - different summary of the same per-block values",
    "kv_loss": "1 - arm KV-cache tokens / baseline KV-cache tokens (stats.memory_costs, median over deployments); "
               "upstream states the tokens per deployment",
}


class UpstreamConfirmError(ValueError):
    """A confirmation directory or report is malformed; the message names the file and field."""


def parse_deployment(name: str) -> dict:
    m = DEPLOYMENT_RE.match(name)
    if not m:
        raise UpstreamConfirmError(f"{name}: not an upstream confirmation deployment name "
                                   "(<prefix>-<variant>-confirm-c<block>-<YYYYMMDDTHHMMSSZ>)")
    return {"variant": m["variant"], "block": m["block"], "rep": int(m["block"][1:]), "stamp": m["stamp"]}


def summary_rows(root: str | Path, arms: dict[str, str]) -> list[dict]:
    """One cell row per ``<root>/<deployment>/cells/<workload>/c<c>/summary.json``.

    ``arms`` maps upstream's variant label in the deployment name (``baseline``, ``eagle31-k2``) to the
    project's arm name (the importer's :func:`specstudy.analysis.upstream.arm_of` on the cell's metadata gives it);
    a deployment whose label is not in ``arms`` is an error naming it."""
    root = Path(root)
    rows = []
    for path in sorted(root.glob("*/cells/*/c*/summary.json")):
        dep = path.parents[3].name
        d = parse_deployment(dep)
        if d["variant"] not in arms:
            raise UpstreamConfirmError(f"{path}: deployment variant {d['variant']!r} has no arm; pass it in arms "
                                       f"(known: {sorted(arms)})")
        s = atomic.read_json(path)
        try:
            req, tok, lat = s["requests"], s["tokens"], s["latency_ms"]
            spec = s.get("speculative_decoding") or {}
            conc = int(path.parent.name[1:])
            valid = req["attempted"] > 0 and req["success_rate"] >= MIN_SUCCESS_RATE
            rows.append({
                "phase": "confirm", "kind": "repeat", "arm": arms[d["variant"]], "rep": d["rep"],
                "workload": path.parents[1].name, "concurrency": conc, "deployment_id": dep,
                "valid": valid, "latency_valid": valid, "throughput_valid": valid,
                "invalid_reasons": None if valid else f"success_rate {req['success_rate']} < {MIN_SUCCESS_RATE}",
                "output_tokens_per_second": tok["output_tokens_per_second"],
                "tpot_p50_ms": lat["tpot"]["p50"], "ttft_p50_ms": lat["ttft"]["p50"],
                "e2e_p50_ms": lat["e2e"]["p50"],
                "acceptance_rate": spec.get("acceptance_rate"),
                "mean_acceptance_length": spec.get("mean_acceptance_length"),
                "per_position": [spec["acceptance_rate_per_position"][k]
                                 for k in sorted(spec.get("acceptance_rate_per_position") or {}, key=int)],
                "source": str(path),
            })
        except (KeyError, TypeError, ValueError) as exc:
            raise UpstreamConfirmError(f"{path}: upstream summary lacks a field the analysis needs ({exc!r})") from None
    if not rows:
        raise UpstreamConfirmError(f"{root}: no <deployment>/cells/<workload>/c<c>/summary.json found")
    return rows


def geomean(vals: list[float]) -> float:
    return math.exp(math.fsum(math.log(v) for v in vals) / len(vals))


def analyse(rows: list[dict], kv_tokens: dict[str, int] | None = None, config: dict | None = None,
            prereg: dict | None = None) -> dict:
    """The project's comparisons, recommendation (with the correctness gate as it stands: none) and a
    performance-only counterfactual (the same rule with a passing gate), plus the KV cost."""
    comps = stats.comparisons(rows, config)
    arms = sorted({c["arm"] for c in comps})
    as_is = decision.recommend(comps, [], config, prereg)
    counterfactual = decision.recommend(comps, [{"arm": a, "phase": "confirm", "verdict": "pass"} for a in arms], config,
                                     prereg)
    deployments = [{"arm": r["arm"], "deployment_id": r["deployment_id"], "kv_cache_tokens": (kv_tokens or {}).get(
        r["deployment_id"])} for r in rows]
    uniq = {d["deployment_id"]: d for d in deployments}.values()
    return {"comparisons": comps, "recommendation": as_is, "recommendation_if_gate_passed": counterfactual,
            "kv_loss": stats.memory_costs(list(uniq)), "definitions": DEFINITIONS}


def _rel(a, b):
    if a is None or b is None:
        return None
    return abs(a - b) / max(abs(a), abs(b)) if (a or b) else 0.0


def compare_with_report(result: dict, report: dict, rows: list[dict], arm_labels: dict[str, str]) -> list[dict]:
    """Every per-cell figure upstream's report states (``per_cell`` of the depths in ``arm_labels``:
    upstream label ``k2`` -> arm) beside the project's, with the relative difference and the definition."""
    out = []
    by_cell = {(c["arm"], c["workload"], c["concurrency"]): c for c in result["comparisons"]}
    for label, arm in arm_labels.items():
        for key, up in sorted(report.get("per_cell", {}).items()):
            lab, workload, conc = key.split("/")
            if lab != label:
                continue
            c = by_cell.get((arm, workload, int(conc[1:])))
            if c is None:
                out.append({"cell": key, "figure": "*", "upstream": None, "project": None, "note": "no project cell"})
                continue
            reps = c["repeats"]
            ours = {
                "geomean": 1 / geomean([r["tpot_ratio"] for r in reps]),
                "min": min(1 / r["tpot_ratio"] for r in reps),
                "max": max(1 / r["tpot_ratio"] for r in reps),
                "throughput_speedup_geomean": c["speedup"]["geomean"] if isinstance(c["speedup"], dict) else None,
                "ttft_p50_ratio_geomean": geomean([r["ttft_ratio"] for r in reps]),
                "acceptance_rate_mean": c["absolute"]["acceptance_rate"],
                "g_mean": c["absolute"]["mean_acceptance_length"],
            }
            for blk in sorted(up.get("blocks") or {}):
                r = next((r for r in reps if r["rep"] == int(blk[1:])), None)
                ours[f"blocks.{blk}"] = None if r is None else round(1 / r["tpot_ratio"], 4)
            cell_rows = {(r["arm"], r["rep"]): r for r in rows
                         if r["workload"] == workload and r["concurrency"] == int(conc[1:])}
            e2e = [cell_rows[(arm, r["rep"])]["e2e_p50_ms"] / cell_rows[("baseline", r["rep"])]["e2e_p50_ms"]
                   for r in reps]
            ours["e2e_p50_ratio_geomean"] = geomean(e2e)
            pos = [cell_rows[(arm, r["rep"])]["per_position"] for r in reps]
            ours["acceptance_per_position_mean"] = [math.fsum(p[i] for p in pos) / len(pos) for i in range(len(pos[0]))]
            notes = {"acceptance_rate_mean": "project: median over blocks; upstream: mean",
                     "g_mean": "project: median over blocks of mean acceptance length; upstream: mean",
                     "ttft_p50_ratio_geomean": "upstream's TTFT (same definition as ours)",
                     "e2e_p50_ratio_geomean": "upstream's E2E (to the end of the stream; ours ends at the last content "
                                              "event), from the summaries' p50, paired by block",
                     "acceptance_per_position_mean": "same definition (mean over blocks of the per-position rates)"}
            for fig, theirs in up.items():
                if fig == "blocks":
                    continue
                if fig == "acceptance_per_position_mean":
                    mine = ours[fig]
                    worst = max((_rel(a, b) or 0.0) for a, b in zip(theirs, mine, strict=True))
                    out.append({"cell": key, "figure": fig, "upstream": theirs, "project": mine, "rel_diff": worst,
                                "note": notes[fig]})
                    continue
                out.append({"cell": key, "figure": fig, "upstream": theirs, "project": ours.get(fig),
                            "rel_diff": _rel(theirs, ours.get(fig)), "note": notes.get(fig, "same definition")})
            for blk, theirs in sorted((up.get("blocks") or {}).items()):
                fig = f"blocks.{blk}"
                out.append({"cell": key, "figure": fig, "upstream": theirs, "project": ours[fig],
                            "rel_diff": _rel(theirs, ours[fig]), "note": "rounded to 4 decimals as upstream"})
        out += _depth_figures(label, arm, result, report)
        kv = (report.get("deployments") or {})
        base_kv = sorted({v.get("kv_cache_tokens") for k, v in kv.items() if "-baseline-" in k} - {None})
        arm_kv = sorted({v.get("kv_cache_tokens") for k, v in kv.items()
                         if k in {r["deployment_id"] for r in rows if r["arm"] == arm}} - {None})
        if len(base_kv) == 1 and len(arm_kv) == 1:
            theirs = 1 - arm_kv[0] / base_kv[0]
            out.append({"cell": f"kv/{label}", "figure": "kv_loss", "upstream": theirs,
                        "project": result["kv_loss"].get(arm), "rel_diff": _rel(theirs, result["kv_loss"].get(arm)),
                        "note": f"same definition; upstream states {base_kv[0]} -> {arm_kv[0]} KV-cache tokens"})
    return out


def _depth_figures(label: str, arm: str, result: dict, report: dict) -> list[dict]:
    """``by_depth`` and ``per_stratum``: upstream's overall figures beside the project's over the same
    per-block TPOT speedups (the project's summary of them is a geometric mean over every (cell, block);
    upstream's is the arithmetic mean over blocks of each block's geometric mean over cells)."""
    depth = label.lstrip("k")
    up = (report.get("by_depth") or {}).get(depth)
    if not up:
        return []
    sp = [(c["workload"], c["concurrency"], r["rep"], 1 / r["tpot_ratio"], r["mean_acceptance_length"])
          for c in result["comparisons"] if c["arm"] == arm for r in c["repeats"]]
    mean_of_blocks = "project: geometric mean over every (cell, block); upstream: arithmetic mean over blocks of " \
                     "the block's geometric mean over cells"
    pairs = [
        ("geomean_tpot_speedup_all", geomean([s[3] for s in sp]), mean_of_blocks),
        ("worst_cell_speedup", min(s[3] for s in sp), "same definition (lowest per-block cell speedup)"),
        ("mean_g", math.fsum(s[4] for s in sp) / len(sp), "same definition (mean acceptance length, mean over "
         "cells and blocks)"),
    ]
    for conc in sorted({s[1] for s in sp}):
        pairs.append((f"geomean_tpot_speedup_c{conc}", geomean([s[3] for s in sp if s[1] == conc]), mean_of_blocks))
    for blk in sorted({s[2] for s in sp}):
        pairs.append((f"blocks.c{blk}.all", geomean([s[3] for s in sp if s[2] == blk]), "same definition (geometric "
                      "mean over the block's cells)"))
        pairs.append((f"blocks.c{blk}.worst_cell", min(s[3] for s in sp if s[2] == blk), "same definition"))
    out = []
    for fig, ours, note in pairs:
        theirs = up
        for part in fig.split("."):
            theirs = (theirs or {}).get(part) if isinstance(theirs, dict) else None
        out.append({"cell": f"by_depth/{depth}", "figure": fig, "upstream": theirs, "project": ours,
                    "rel_diff": _rel(theirs, ours), "note": note})
    for key, theirs in sorted((report.get("per_stratum") or {}).items()):
        lab, workload = key.split("/")
        if lab != label:
            continue
        ours = geomean([s[3] for s in sp if s[0] == workload])
        out.append({"cell": f"per_stratum/{key}", "figure": "tpot_speedup_geomean", "upstream": theirs, "project": ours,
                    "rel_diff": _rel(theirs, ours), "note": "same definition (geometric mean over the workload's "
                    "concurrencies and blocks)"})
    return out


def _fmt(v):
    return "-" if v is None else (f"{v:.6g}" if isinstance(v, float) else str(v))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specstudy.analysis.upstream_confirm",
                                description="The project's comparisons and decision rule on upstream's 8B EAGLE "
                                "confirmation summaries, beside upstream's confirm-report.json")
    p.add_argument("confirm_root", help="…/results/8b/eagle/confirm")
    p.add_argument("report", help="…/results/8b/eagle/confirm-report.json")
    p.add_argument("--arm", action="append", default=[], metavar="LABEL=ARM",
                   help="upstream variant label in the deployment names -> project arm, e.g. eagle31-k2=eagle3-k2 "
                   "(baseline=baseline is implied)")
    p.add_argument("--depth", action="append", default=[], metavar="LABEL=ARM",
                   help="upstream report depth label -> project arm, e.g. k2=eagle3-k2")
    p.add_argument("--config", help="study config whose decision rule applies (its pre-registration's margins and "
                   "looks, its recommendation settings); default: the analysis defaults, one look")
    p.add_argument("--traffic-mix", metavar="W=SHARE,...",
                   help="traffic mix (output-token shares) over upstream's workload names (chat, code, "
                   "summarization), replacing the pre-registration's traffic.mixture, e.g. "
                   "chat=0.6,code=0.3,summarization=0.1")
    p.add_argument("--json", help="write the whole result as JSON here")
    a = p.parse_args(argv)
    config = prereg = None
    if a.config:
        from specstudy.study.config import load_config
        from specstudy.study.prereg import load_prereg

        config = load_config(a.config)
        if (config.get("study") or {}).get("preregistration"):
            prereg = load_prereg(config)
    if a.traffic_mix:
        try:
            mix = {w: float(v) for w, v in (x.split("=", 1) for x in a.traffic_mix.split(","))}
        except ValueError:
            p.error(f"--traffic-mix {a.traffic_mix!r}: expected W=SHARE pairs separated by commas")
        # upstream's workload names differ from the study's: the given mixture replaces the declared one
        prereg = {**(prereg or {}), "traffic": {"route_by_workload": False, "shares": "output_tokens", "mixture": mix}}
    arms = {"baseline": "baseline", **dict(x.split("=", 1) for x in a.arm)}
    report = json.loads(Path(a.report).read_text(encoding="utf-8"))
    rows = summary_rows(a.confirm_root, arms)
    kv = {k: v.get("kv_cache_tokens") for k, v in (report.get("deployments") or {}).items()}
    res = analyse(rows, kv, config, prereg)
    table = compare_with_report(res, report, rows, dict(x.split("=", 1) for x in a.depth))
    for t in table:
        print(f"{t['cell']:<22} {t['figure']:<28} upstream {_fmt(t['upstream']):>12} project {_fmt(t['project']):>12} "
              f"rel {_fmt(t.get('rel_diff')):>10}  {t['note']}")
    rec, cf = res["recommendation"], res["recommendation_if_gate_passed"]
    print(f"rule: {res['recommendation']['rule']['source']}; min_gain {res['recommendation']['rule']['min_gain']}, "
          f"max_regression {res['recommendation']['rule']['max_regression']}, look confidence "
          f"{res['recommendation']['rule']['look_confidence']:.4f}; traffic mix "
          f"{((prereg or {}).get('traffic') or {}).get('mixture') or 'equal'}")
    for c in res["recommendation_if_gate_passed"]["candidates"]:
        for k, j in {**c["cells"], **c.get("mixture", {})}.items():
            print(f"  {c['arm']} {k:<18} throughput speedup {_fmt(j['geomean'])} [{_fmt(j['lo'])}, {_fmt(j['hi'])}] "
                  f"{j['verdict']}")
    print(f"decision (gates as they stand): {rec['decision']} {rec['enable'] or ''}")
    for c in rec["candidates"]:
        print(f"  {c['arm']}: blockers: {'; '.join(c['blockers']) or 'none'}")
    print(f"decision if the correctness gate passed: {cf['decision']} {cf['enable'] or ''}")
    for c in cf["candidates"]:
        print(f"  {c['arm']}: cells {c['status']}; blockers: {'; '.join(c['blockers']) or 'none'}")
    print(f"stability: {cf['stability'].get('note') or cf['stability'].get('outcomes')}")
    print(f"KV-cache loss: {res['kv_loss']}")
    if a.json:
        atomic.write_json(a.json, {"result": res, "comparison": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
