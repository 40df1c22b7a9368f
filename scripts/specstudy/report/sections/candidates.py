"""The report's correctness gates and candidates: each gate verdict with its sizes, where each candidate wins
or loses, its KV and start-up cost, and the confounds of every arm side by side.
"""

from __future__ import annotations

from specstudy.core.arms import baseline_of, is_arm_name, is_baseline
from specstudy.core.stat_util import median
from specstudy.report.blocks import fmt

CONFOUND_COLS = ("async_scheduling", "max_num_scheduled_tokens", "max_num_batched_tokens", "kv_cache_tokens",
                 "model_runner")


def _confounds_by_arm(deps: list[dict]) -> dict[tuple[str, str], dict]:
    out: dict[tuple[str, str], dict] = {}
    for d in deps:
        if d.get("status") == "failed":
            continue
        cur = out.setdefault((d["phase"], d["arm"]), {k: set() for k in CONFOUND_COLS})
        for k in CONFOUND_COLS:
            cur[k].add(d.get(k))
    return out


def _fmt_set(vals: set) -> str:
    vals = sorted((v for v in vals if v is not None), key=str)
    if not vals:
        return "unknown"
    return " / ".join("disabled" if v is False else "enabled" if v is True else fmt(v, "{:.0f}") for v in vals)


def memory_rows(deps: list[dict], mem: dict) -> list[dict]:

    by: dict[str, list[dict]] = {}
    for d in deps:
        if d.get("status") != "failed":
            by.setdefault(d["arm"], []).append(d)
    rows = []
    for arm, ds in sorted(by.items()):
        kv = [d["kv_cache_tokens"] for d in ds if d.get("kv_cache_tokens") is not None]
        init = [d["init_seconds"] for d in ds if d.get("init_seconds") is not None]
        rows.append({"arm": arm, "kv_cache_tokens": median(kv),
                     "kv_lost": mem.get(arm), "init_s": median(init)})
    return rows


def _count(v) -> str:
    return "?" if v is None or v != v else str(int(v))


def _gate_sizes(g: dict) -> str:
    """The sizes a gate verdict rests on: treatment pairs vs control pairs (of how many deployments)."""
    n = _count
    return (f"treatment worst case over {n(g.get('treatment_pairs'))} pair(s); control worst case over "
            f"{n(g.get('control_pairs'))} pair(s) of {n(g.get('control_deployments'))} baseline deployment(s)")


def _gates_table(B, gates):
    B.append(("h", 2, "Correctness gates"))
    if not gates:
        B.append(("p", "No gate verdicts."))
        return
    B.append(("p", "Each candidate repeat is compared with the baseline of the same repeat (treatment); the control "
                   "is every pair of baseline repeats. A worst case over more pairs is larger by chance alone, so "
                   "both sizes stand beside each verdict."))
    B.append(("table", ["phase", "arm", "verdict", "treatment pairs", "control pairs", "control deployments",
                        "reasons"],
              [[g["phase"], g["arm"], g["verdict"], _count(g.get("treatment_pairs")), _count(g.get("control_pairs")),
                _count(g.get("control_deployments")), g.get("reason_codes") or "–"]
               for g in sorted(gates, key=lambda g: (g["phase"], g["arm"]))]))


def candidates_section(B, rec, comps, gates, deps, mem, mem_rows):
    _gates_table(B, gates)
    B.append(("h", 2, "Candidates: where each wins or loses, cost, gate, confounds"))
    gate_by = {(g["phase"], g["arm"]): g for g in gates}
    conf = _confounds_by_arm(deps)
    memr = {m["arm"]: m for m in mem_rows}
    for c in rec["candidates"]:
        arm = c["arm"]
        B.append(("h", 3, arm))
        def having(*verdicts, st=c["status"]):
            return ", ".join(k for k, v in st.items() if v in verdicts) or "none"

        B.append(("ul", [f"gain shown: {having('gain')}",
                         f"regression shown: {having('regression')}",
                         f"non-inferior: {having('non_inferior')}",
                         f"inconclusive/missing: {having('inconclusive', 'missing')}",
                         f"KV capacity: {fmt((memr.get(arm) or {}).get('kv_cache_tokens'), '{:.0f}')} tokens; "
                         f"lost vs baseline: {fmt(mem.get(arm), '{:.1%}')}; "
                         f"median init time {fmt((memr.get(arm) or {}).get('init_s'), '{:.0f}')} s"]))
        g = gate_by.get((rec["phase"], arm))
        other = None if g else next((gg for (p, a), gg in sorted(gate_by.items()) if a == arm), None)
        if other:  # the decision's phase has no verdict: say so first, then what another phase's gate found
            B.append(("p", f"Gate ({rec['phase']}): missing (blocks the recommendation; the {other['phase']} gate "
                           "does not stand in for it)."))
            g = other
        if g:
            B.append(("p", f"Gate ({g['phase']}): {g['verdict']} ({_gate_sizes(g)}); reasons: "
                           f"{g.get('reason_codes') or 'none'}; blocks recommendation: {g.get('blocks_recommendation')}."))
            B.append(("p", f"Control's worst case: {g.get('control_worst') or 'unknown'}"))
            B.append(("p", f"Treatment's worst case: {g.get('treatment_worst') or 'unknown'}"))
        else:
            B.append(("p", f"Gate ({rec['phase']}): missing (blocks the recommendation)."))
    B.append(("h", 3, "Confounds of each arm side by side"))
    rows = [[ph, arm] + [_fmt_set(v[k]) for k in CONFOUND_COLS] for (ph, arm), v in sorted(conf.items())]
    B.append(("table", ["phase", "arm", "async scheduling", "max_num_scheduled_tokens", "max_num_batched_tokens",
                        "KV cache tokens", "model runner"], rows))
    pairs = []
    for (ph, arm), v in sorted(conf.items()):
        own = baseline_of(arm) if is_arm_name(arm) else "baseline"  # the baseline of the arm's own engine build
        b = conf.get((ph, own))
        if is_baseline(arm) or not b:
            continue
        diffs = [k for k in CONFOUND_COLS if v[k] != b[k]]
        pairs.append(f"{ph} {arm} vs {own}: differs in {', '.join(diffs) or 'nothing recorded'}")
    B.append(("p", "Every comparison against its baseline (a difference here is part of the measured effect, "
                   "not speculation alone):"))
    B.append(("ul", pairs))
