"""Upstream's 8B confirmation report beside the project's pipeline run on the same cells.

The figures are the pipeline's: ``specstudy import-upstream <confirm> <results> --phase confirm
--from-summaries`` imports upstream's cells (block = repeat, so arm and baseline pair within a block exactly
as upstream paired them; ``docs/upstream-8b.md``), ``specstudy tables`` builds the tables and ``specstudy
report`` runs the comparisons, the decision rule and its stability and writes ``recommendation.json``. This
module only does what the pipeline does not: :func:`compare_with_report` puts every figure upstream's
``confirm-report.json`` states beside the pipeline's (from ``recommendation.json`` and the cells table),
with the definition named where the two differ; :func:`counterfactual` re-applies the same rule as if the
correctness gate had passed (no gate record of the project's kind exists for upstream's deployments, so
the pipeline's decision stays ``do_not_enable``), optionally under another study's pre-registration.

Definitions (docs/upstream-8b.md):

* TPOT and E2E p50 are **upstream's** in a summary-only import (a summary carries no rows to recompute
  ours from): TPOT = (e2e - ttft) / (completion_tokens - 1) with e2e to the end of the stream, usage chunk
  and ``[DONE]`` included. The project's own TPOT ends at the last content event (docs/metrics.md).
* Output tokens/s is completion tokens / upstream's wall in both, so throughput is the same quantity.
* Acceptance: the project's comparison reports the **median** over blocks; upstream's report the **mean**.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from specstudy.core import atomic
from specstudy.inference import decision, stats

DEFINITIONS = {
    "tpot_speedup": "baseline TPOT p50 / arm TPOT p50 per block (upstream's TPOT: to the end of the stream); "
                    "geometric mean over blocks. Project: 1 / geomean of stats.comparisons' tpot_ratio (arm / "
                    "baseline of the cell p50, paired by rep = block) - the same quantity",
    "throughput_speedup": "arm / baseline output tokens per second per block, geometric mean over blocks; project: "
                          "geomean of stats.comparisons' speedup - the same quantity",
    "acceptance_rate": "upstream: arithmetic mean over blocks of accepted/draft tokens; project: median over blocks "
                       "(stats.comparisons absolute.acceptance_rate) - different summary of the same per-block values",
    "kv_loss": "1 - arm KV-cache tokens / baseline KV-cache tokens (stats.memory_costs over the deployments table, "
               "median over deployments); upstream states the tokens per deployment",
}


class UpstreamConfirmError(ValueError):
    """A pipeline output or upstream's report is missing or malformed; the message names the file and the fix."""


def geomean(vals: list[float]) -> float:
    return math.exp(math.fsum(math.log(v) for v in vals) / len(vals))


def pipeline_outputs(tables: str | Path, recommendation: str | Path) -> dict:
    """The pipeline's comparisons, recommendation and KV loss (``recommendation.json`` of ``specstudy report``)
    and the confirm rows of the cells table (for the per-block E2E and per-position figures the comparisons
    do not carry)."""
    from specstudy.analysis.tables import read_tables

    rec_path = Path(recommendation)
    if not rec_path.is_file():
        raise UpstreamConfirmError(f"{rec_path}: no recommendation.json; run `specstudy report --results <results> "
                                   f"--tables {tables} --out {rec_path.parent}` first")
    rec = atomic.read_json(rec_path)
    cells = [c for c in stats._records(read_tables(tables)["cells"]) if c["phase"] == "confirm"]
    if not cells:
        raise UpstreamConfirmError(f"{tables}: no confirm cells in the cells table; import upstream's confirmation with "
                                   "`specstudy import-upstream <confirm> <results> --phase confirm --from-summaries`")
    comps = [c for c in rec["comparisons"] if c["phase"] == "confirm"]
    rows = [{**c, "per_position": list(c.get("per_position_acceptance") or [])} for c in cells]
    return {"comparisons": comps, "recommendation": rec["recommendation"], "kv_loss": rec["memory_costs"],
            "rows": rows}


def counterfactual(comps: list[dict], config: dict | None = None, prereg: dict | None = None) -> dict:
    """The pipeline's rule (``decision.recommend``) on the same comparisons with a passing confirm gate for every
    arm: what the rule would decide on performance alone. Not a decision: no such gate exists."""
    arms = sorted({c["arm"] for c in comps})
    return decision.recommend(comps, [{"arm": a, "phase": "confirm", "verdict": "pass"} for a in arms], config, prereg)


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
                                description="Upstream's confirm-report.json beside the pipeline's tables and report on "
                                "the imported confirmation (specstudy import-upstream, tables, report)")
    p.add_argument("report", help="upstream's results/8b/eagle/confirm-report.json")
    p.add_argument("--tables", default="results/tables", help="the tables `specstudy tables` built (default: "
                   "results/tables)")
    p.add_argument("--recommendation", default="results/report/recommendation.json",
                   help="recommendation.json of `specstudy report` on those tables")
    p.add_argument("--depth", action="append", default=[], metavar="LABEL=ARM",
                   help="upstream report depth label -> project arm, e.g. k2=eagle3-k2")
    p.add_argument("--config", help="study config whose decision rule the counterfactual applies (its "
                   "pre-registration's margins and looks); default: the analysis defaults, one look")
    p.add_argument("--traffic-mix", metavar="W=SHARE,...",
                   help="traffic mix (output-token shares) over upstream's workload names (chat, code, "
                   "summarization), replacing the pre-registration's traffic.mixture in the counterfactual, e.g. "
                   "chat=0.6,code=0.3,summarization=0.1")
    p.add_argument("--json", help="write the comparison and the counterfactual as JSON here")
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
    report = json.loads(Path(a.report).read_text(encoding="utf-8"))
    res = pipeline_outputs(a.tables, a.recommendation)
    table = compare_with_report(res, report, res["rows"], dict(x.split("=", 1) for x in a.depth))
    for t in table:
        print(f"{t['cell']:<22} {t['figure']:<28} upstream {_fmt(t['upstream']):>12} project {_fmt(t['project']):>12} "
              f"rel {_fmt(t.get('rel_diff')):>10}  {t['note']}")
    rec = res["recommendation"]
    print(f"pipeline decision ({a.recommendation}): {rec['decision']} {rec.get('enable') or ''}")
    for c in rec["candidates"]:
        print(f"  {c['arm']}: blockers: {'; '.join(c['blockers']) or 'none'}")
    cf = counterfactual(res["comparisons"], config, prereg)
    print(f"counterfactual rule: {cf['rule']['source']}; min_gain {cf['rule']['min_gain']}, "
          f"max_regression {cf['rule']['max_regression']}, look confidence {cf['rule']['look_confidence']:.4f}; "
          f"traffic mix {((prereg or {}).get('traffic') or {}).get('mixture') or 'equal'}")
    for c in cf["candidates"]:
        for k, j in {**c["cells"], **c.get("mixture", {})}.items():
            print(f"  {c['arm']} {k:<18} throughput speedup {_fmt(j['geomean'])} [{_fmt(j['lo'])}, {_fmt(j['hi'])}] "
                  f"{j['verdict']}")
    print(f"decision if the correctness gate passed: {cf['decision']} {cf['enable'] or ''}")
    for c in cf["candidates"]:
        print(f"  {c['arm']}: cells {c['status']}; blockers: {'; '.join(c['blockers']) or 'none'}")
    print(f"stability: {cf['stability'].get('note') or cf['stability'].get('outcomes')}")
    print(f"KV-cache loss: {res['kv_loss']}")
    if a.json:
        atomic.write_json(a.json, {"comparison": table, "recommendation_if_gate_passed": cf,
                                   "definitions": DEFINITIONS})
    return 0


if __name__ == "__main__":
    sys.exit(main())
