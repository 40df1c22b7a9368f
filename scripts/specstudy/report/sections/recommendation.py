"""The report's first sections: the recommendation (both halves of the rule, the rule's wording, the
inconclusive cells, the candidates' verdicts, the ready-to-apply patch of the launch arguments) and the
evidence behind it (the confirmation rounds run, the cells that drive its stability).
"""

from __future__ import annotations

import json
from pathlib import Path

from specstudy.core import layout
from specstudy.core.arms import baseline_of, is_arm_name
from specstudy.measure.capacity.run import STEPS_FILE
from specstudy.report.blocks import fmt
from specstudy.report.files import ReportFiles, knee_arms
from specstudy.report.sections.inputs import read_json_or_none


def with_capacity_half(rec: dict, files: ReportFiles, config: dict) -> dict:
    """The confirmation decision with the seed's second half: the pre-registered capacity criteria (of the
    final candidate and the capacity knees in ``files``; each search's steps beside its knee)."""
    from specstudy.analysis import capacity_criteria
    from specstudy.core import atomic
    from specstudy.core.records import read_capacity_steps, read_knee

    enabled = bool((config.get("capacity") or {}).get("enabled"))
    crit = None
    if (config.get("study") or {}).get("preregistration"):
        from specstudy.study.prereg import load_prereg

        crit = load_prereg(config).get("capacity_criteria")
    arm = rec.get("enable")
    if arm is None:
        fc = files.final_candidate
        arm = atomic.read_json(fc).get("arm") if fc is not None and Path(fc).exists() else None
    knees = {a: p for a, p in knee_arms(files).items() if Path(p).exists()}
    ev = None
    base = baseline_of(arm) if arm and is_arm_name(arm) else "baseline"  # the baseline of the arm's own build
    if crit and arm and base in knees and arm in knees:
        def steps(a):
            p = Path(knees[a]).parent / STEPS_FILE
            return read_capacity_steps(p) if p.exists() else []

        ev = capacity_criteria.evaluate(crit, read_knee(knees[base]), read_knee(knees[arm]), steps(base), steps(arm))
    return capacity_criteria.apply(rec, ev, arm, enabled and crit is not None)


def capacity_half_blocks(B, rec) -> None:
    half = rec.get("capacity_half") or {}
    ev = half.get("evaluation")
    if half.get("note"):
        second = half["note"]
    elif ev is None and half.get("arm") is None:
        second = f"not evaluated: no final candidate ({layout.final_candidate()}) and no capacity results"
    elif ev is None:
        second = f"not evaluated for {half.get('arm')} (no capacity results)"
    elif ev["met"]:
        second = f"{half.get('arm')}: every pre-registered criterion met"
    else:
        second = f"{half.get('arm')}: missed " + ", ".join(ev["missed"])
    first = str(rec.get("confirmation_decision"))
    if rec.get("capacity_blocker"):
        first += f" (not enabled: {rec['capacity_blocker']})"
    B.append(("p", f"Both halves of the rule: (1) confirmation — {first}; (2) capacity — {second}."))
    ev = half.get("evaluation")
    if ev:
        rows = []
        for r in ev["criteria"]:
            iv = r.get("interval")
            where = (f"[{fmt(iv[0])}, {fmt(iv[1])}]" if iv else (f"at {r['matched_rps']:g} req/s" if r.get("matched_rps")
                                                              else "–"))
            rows.append([r["criterion"], fmt(r["value"]), where, r["limit"], r["verdict"], r["why"]])
        B.append(("table", ["capacity criterion", "figure", "interval / matched load", "limit", "verdict", "evidence"],
                  rows))


def recommendation_section(B, rec, deps, s, out: Path, progress: dict | None = None) -> dict:
    """The decision and its rule, the verdicts and the patch; ``progress`` (sections.missing.confirmation_progress):
    a confirmation short of its initial rounds makes the decision provisional, and the section says so first."""
    from specstudy.core import atomic
    from specstudy.deployment.command import recommended_speculative_config, vllm_args_patch
    from specstudy.inference import decision
    from specstudy.report.sections.missing import progress_text

    r = s["recommendation"]
    rule = rec.get("rule") or {}
    if progress is not None and not progress["complete"] and rec.get("phase") == "confirm":
        B.append(("p", f"PROVISIONAL — {progress_text(progress)}. The decision below applies the rule to the rounds "
                       "measured so far; the pre-registered rule decides only once every initial round is measured."))
    B.append(("p", f"Decision: {rec['decision']}" + (f" — enable {rec['enable']}" if rec.get("enable") else "")
                   + f" (evaluated on the {rec['phase']} phase; gain shown: interval above {1 + rec['min_gain']:.2f}; "
                     f"material regression: {rec['max_regression']:.0%}; "
                   + ("traffic routed by workload" if rec["route_by_workload"]
                      else "single deployment: the declared traffic mixture is evaluated") + ")."))
    capacity_half_blocks(B, rec)
    stab = rec.get("stability") or {}
    if stab and stab.get("resamples"):
        B.append(("p", f"Stability: {decision.format_outcomes(stab)} ({stab['resamples']} bootstrap resamples of "
                       f"the {stab.get('rounds', 0)} rounds; the whole rule recomputed on each)."))
        if stab.get("cell_degenerate_excluded"):
            B.append(("p", f"{stab['cell_degenerate_excluded']} draws were redrawn because they left a cell or mixture "
                           "level with fewer than two distinct valid rounds (rounds excluded as invalid)."))
    elif stab:
        B.append(("p", f"Stability: {decision.format_outcomes(stab)}."))
    if rule:
        B.append(("p", f"Rule ({rule.get('source')}): intervals of the geometric-mean speedup (t on per-round log ratios) "
                       f"at {rule.get('look_confidence', 0):.4f} per look = {rule.get('confidence', 0):.0%} "
                       + (f"Bonferroni-corrected over {rule.get('looks')} possible looks "
                          f"({rule.get('initial_repeats')} initial rounds, cap {rule.get('max_repeats')})"
                          if rule.get("correction") == "bonferroni"
                          else (f"at the last look, O'Brien–Fleming alpha spending over {rule.get('looks')} possible looks "
                                f"({rule.get('initial_repeats')} initial rounds, cap {rule.get('max_repeats')}; earlier "
                                "looks spend less)" if rule.get("correction") == "obrien_fleming"
                                else f"without a correction for looks ({rule.get('looks')})"))
                       + f"; non-inferiority required on {rule.get('non_inferiority_on')}. Verdicts: gain (interval "
                         f"above {1 + rec['min_gain']:.2f}), regression (below {1 - rec['max_regression']:.2f}), "
                         f"non-inferior (above {1 - rec['max_regression']:.2f}), otherwise inconclusive."))
        if rule.get("notes"):
            B.append(("ul", rule["notes"]))
    if rec.get("missing"):
        B.append(("ul", rec["missing"]))
    if rec.get("undecided"):
        B.append(("p", "Inconclusive cells blocking the decision (extra rounds expected to settle each, if its mean "
                       "and SD stay as observed):"))
        B.append(("ul", [f"{u['arm']} {u['what']}: {u['verdict']} [{fmt(u['lo'])}, {fmt(u['hi'])}] after {u['n']} rounds — "
                         f"{u['why']}" + (f"; ≈ {u['extra_repeats']} more round(s)" if u.get("extra_repeats")
                                          else "" if u["verdict"] == "missing"
                                          else "; not settled within 100 more rounds (effect at the margin)")
                         for u in rec["undecided"]]))
    if rec.get("gate_rule"):
        B.append(("p", f"Gate rule: {rec['gate_rule']}"))
    rows = []
    for c in rec["candidates"]:
        if rec["route_by_workload"]:
            detail = "; ".join(f"{w}: {'enable' if v['enable'] else 'no'} ({', '.join(v['statuses'])})"
                               for w, v in c["workloads"].items())
        else:
            detail = "; ".join(f"{k}: {m['verdict']} [{fmt(m['lo'])}, {fmt(m['hi'])}]" for k, m in c["mixture"].items())
        rows.append([c["arm"], c["gate_verdict"], "yes" if c.get("enable") else "no", detail,
                     "; ".join(c["blockers"]) or "–"])
    B.append(("table", ["candidate", "gate", "enable", "traffic mixture", "blockers"], rows))
    cell_rows = []
    for c in rec["candidates"]:
        for k, j in (c.get("cells") or {}).items():
            cell_rows.append([c["arm"], k, j["n"], fmt(j["geomean"]), f"[{fmt(j['lo'])}, {fmt(j['hi'])}]", j["verdict"],
                              j["extra_repeats"] if j.get("extra_repeats") else "–"])
    if cell_rows:
        B.append(("p", "Per-cell verdicts (speedup = arm ÷ baseline output tokens/s, paired by round):"))
        B.append(("table", ["candidate", "cell", "rounds", "geomean", "interval", "verdict", "extra rounds to settle"],
                  cell_rows))
    targets = ({w: a for w, a in rec["per_workload"].items() if a} if rec["route_by_workload"]
               else ({"all": rec["enable"]} if rec.get("enable") else {}))
    patches = {}
    for label, arm in targets.items():
        dep = next((d for d in deps if d["arm"] == arm and d.get("status") != "failed"
                    and d.get("phase") == rec["phase"]), None) or next((d for d in deps if d["arm"] == arm), {})
        spec = json.loads(dep["arm_spec"]) if dep.get("arm_spec") else None
        cfg = recommended_speculative_config(spec, dep.get("speculative_config"), r["draft_model"])
        args, diff = vllm_args_patch(list(r["launch_args"] or []), cfg)
        name = "vllm-args.patch" if label == "all" else f"vllm-args-{label}.patch"
        atomic.write_text(out / name, diff)
        atomic.write_json(out / name.replace(".patch", ".json"), {"arm": arm, "workload": label, "args": args,
                                                                  "speculative_config": cfg})
        patches[label] = name
        B.append(("p", f"Ready-to-apply patch of the launch arguments ({label}: {arm}) — {name}:"))
        B.append(("pre", diff or "(no change)"))
    if not targets:
        B.append(("p", "No patch: nothing is recommended for enabling."))
    if not r["launch_args"]:
        B.append(("p", "Note: recommendation.launch_args is empty in the config; the patch only adds the "
                       "speculative config line."))
    return patches


def decision_evidence_section(B, rec, rounds: list[str]) -> None:
    """Rounds run (the checkpoints' records ``rounds``, in round order) and the cells that drive the decision's
    stability."""
    rounds = [st for st in (read_json_or_none(p) for p in rounds) if isinstance(st, dict)]
    if rounds:
        B.append(("p", "Adaptive confirmation — rounds run and why (one checkpoint per round, "
                       "results/confirm/rounds/round<n>.json). A checkpoint is an interim look: the confirmation "
                       "gates need the complete rounds, so it judges with the screening gates (one without a cross-"
                       "deployment control gives no verdict and blocks its arm there only); what it decides is "
                       "whether another round is measured, not the recommendation above."))
        B.append(("table", ["after round", "interim decision (screening gates)", "next", "why",
                            "stability at checkpoint"],
                  [[st.get("round"), st.get("decision"), "one more round" if st.get("continue") else "stop",
                    st.get("why"), _stab_short(st.get("stability"))] for st in rounds]))
    elif rec.get("phase") == "confirm":
        B.append(("p", f"Rounds: no checkpoint records under {layout.confirm_rounds_dir()}/ (confirmation incomplete, "
                       "or not run by the workflow)."))
    drivers = (rec.get("stability") or {}).get("drivers") or []
    if drivers:
        B.append(("p", "Cells that drive the decision's stability (share of resamples in which the cell's verdict "
                       "differs from the observed one, overall and among resamples whose decision differs):"))
        B.append(("table", ["candidate", "cell", "observed verdict", "verdict flips", "flips when the decision changes"],
                  [[d["arm"], d["cell"], d["observed"], f"{d['flip_rate']:.0%}",
                    f"{d['flip_rate_when_decision_changes']:.0%}"] for d in drivers]))


def _stab_short(stab) -> str:
    from specstudy.inference import decision

    return decision.format_outcomes(stab) if isinstance(stab, dict) else "–"
