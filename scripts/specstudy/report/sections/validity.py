"""The report's validity sections: excluded cells and validity notes, unservable configurations, the
gateway/network and node-to-node variability, and the baseline's drift.
"""

from __future__ import annotations

import json

from specstudy.report.blocks import fmt


def validity_section(B, cells, deps, comps):
    from specstudy.inference import stats

    B.append(("h", 2, "Validity"))
    ex = stats.excluded_cells(cells)
    B.append(("p", f"{len(ex)} of {len(cells)} cells are invalid and excluded; "
                   f"{sum(c['n_excluded'] for c in comps)} arm repeats are excluded from comparisons "
                   "(invalid arm or baseline cell, or no baseline repeat with the same rep)."))
    B.append(("table", ["phase", "arm", "rep", "workload", "c", "deployment", "reasons"],
              [[e["phase"], e["arm"], e["rep"], e["workload"], e["concurrency"], e["deployment_id"],
                e["invalid_reasons"]] for e in ex]))
    noted = [c for c in cells if c.get("validity_notes")]
    if noted:
        B.append(("p", f"{len(noted)} cell(s) carry a validity note: a check made only in part, or a flagged confound "
                       "(`jit_in_window`, below); the cell's validity is unchanged and the note says what it found."))
        B.append(("table", ["phase", "arm", "rep", "workload", "c", "note", "detail"],
                  [[c["phase"], c["arm"], c["rep"], c["workload"], c["concurrency"], c["validity_notes"],
                    "; ".join(n.get("detail", "") for n in json.loads(c.get("validity_note_details") or "[]"))[:300]]
                   for c in noted]))
    foreign_section(B, cells)
    B.append(("h", 2, "Unservable configurations (deployment failures)"))
    fails = [d for d in deps if d.get("status") == "failed"]
    B.append(("table", ["phase", "arm", "rep", "deployment", "stage", "reason", "error excerpt"],
              [[d["phase"], d["arm"], d["rep"], d["deployment_id"], d.get("failure_stage") or "–",
                d.get("failure_reason") or "–", (d.get("failure_error_excerpt") or "–")[:200]] for d in fails]))


def foreign_section(B, cells) -> None:
    """The cells that saw requests the load generator did not send (validity reason ``foreign_traffic``): the
    server's API request count, finished requests and generated tokens against what the load generator sent."""
    hit = [c for c in cells if "foreign_traffic" in str(c.get("invalid_reasons") or "").split(",")]
    checked = sum(1 for c in cells if c.get("server_deltas.foreign_request_check") == "done")
    B.append(("p", f"Requests the load generator did not send: {len(hit)} cell(s) saw traffic of another client "
                   f"(their throughput and TPOT are excluded); the API request count was compared in {checked} of "
                   f"{len(cells)} cells (the rest: no http_requests_total counter, or no usable scrape)."))
    if hit:
        B.append(("table", ["phase", "arm", "rep", "workload", "c", "sent", "API requests answered",
                            "requests finished", "not sent by the load generator", "detail"],
                  [[c["phase"], c["arm"], c["rep"], c["workload"], c["concurrency"], c.get("requests_attempted"),
                    fmt(c.get("server_deltas.requests_received"), "{:g}"),
                    fmt(c.get("server_deltas.requests_finished"), "{:g}"),
                    fmt(c.get("server_deltas.requests_not_sent_by_loadgen"), "{:g}"),
                    "; ".join(r.get("detail", "") for r in json.loads(c.get("invalid_details") or "[]")
                              if r.get("code") == "foreign_traffic")[:300]] for c in hit]))


def network_section(B, cells, dr):
    B.append(("h", 2, "Gateway/network effects and node-to-node variability"))
    limited = [c for c in cells if c.get("loadgen_limited")]
    B.append(("p", "TTFT and end-to-end latency are measured at the client and include the gateway/network path; "
                   "TPOT and output tokens/s are dominated by the server. The client flagged itself as limited in "
                   f"{len(limited)} cells (those are excluded). Baseline repeat-to-repeat variability (mean SD of "
                   f"log throughput within a workload × concurrency series): {fmt(dr.get('baseline_repeat_cv'), '{:.2%}')}."))
    B.append(("table", ["node", "baseline cells", "mean deviation from series mean"],
              [[n["node"], n["n"], fmt(n["mean_resid_fraction"], "{:+.2%}")] for n in dr.get("nodes") or []]))


def drift_section(B, dr):
    B.append(("h", 2, "Drift"))
    by_kind = dr.get("n_by_kind") or {}
    if by_kind.get("drift"):
        used = sum(1 for p in dr.get("points") or [] if p.get("kind") == "drift")
        B.append(("p", f"Interleaved drift baseline deployments ({', '.join(dr.get('drift_deployments') or [])}): "
                       f"{by_kind['drift']} valid cell(s), {used} in the trend below, beside "
                       f"{by_kind.get('repeat', 0)} valid baseline repeat cell(s)."))
    else:
        B.append(("p", "No interleaved drift baseline deployment (drift<n>) has a valid cell: the trend uses the "
                       f"baseline repeats only ({by_kind.get('repeat', dr.get('n', 0))} valid cell(s)); "
                       "plan.drift_baselines_per_block adds them."))
    if dr.get("detected") is None:
        B.append(("p", f"Not estimable: {dr.get('note')}"))
        return
    B.append(("p", f"Baseline throughput trend over {dr['x_unit']}: {fmt(dr['total_fraction'], '{:+.2%}')} over the "
                   f"study span (p = {fmt(dr['p_value'], '{:.3g}')}, n = {len(dr['points'])}). Drift detected: "
                   f"{'YES' if dr['detected'] else 'no'}. Median |effect| of the comparisons: "
                   f"{fmt(dr.get('median_abs_effect_fraction'), '{:.2%}')}; drift/effect = {fmt(dr.get('drift_to_effect'), '{:.2f}')}. "
                   "Pairing arm and baseline by rep (interleaved blocks) removes drift between blocks."))
