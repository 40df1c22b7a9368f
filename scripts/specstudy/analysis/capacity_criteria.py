"""The capacity half of the recommendation rule (issue 28): pre-registered limits on what enabling costs.

The seed's rule: enable only if confirmation shows a repeatable gain "**and the capacity study shows no
unacceptable tail-latency or KV-cache penalty**". The pre-registration declares (``capacity_criteria``):

- ``min_knee_ratio``: the candidate's knee ÷ the baseline's. Its interval comes from the two searches'
  brackets, confirmed by the soaks: [candidate knee ÷ baseline step above, candidate step above ÷ baseline
  knee]. *Missed* when the whole interval lies below the limit (a lower knee is shown).
- ``matched_load_fraction``, ``max_ttft_p95_ratio``, ``max_tpot_p95_ratio``: at the matched load — the highest
  offered rate at or below ``matched_load_fraction`` × the baseline's knee at which both searches ran a step
  that was not client-limited — the candidate's TTFT p95 and TPOT p95 ÷ the baseline's. *Missed* above the limit.
- ``max_kv_tokens_lost_fraction``: 1 − candidate KV-cache tokens ÷ baseline's (deployment records).
  *Missed* above the limit.

A criterion without the data to judge it is ``no_data`` and counts as missed: the study cannot show that
there is no penalty. Everything here is pure: knee and step records in, plain dicts out.
"""

from __future__ import annotations

from typing import Any

from specstudy.core.stat_util import finite_or_none as _num

CRITERIA = ("knee_ratio", "ttft_p95_at_matched_load", "tpot_p95_at_matched_load", "kv_tokens_lost")


def _get(rec, key):
    return rec.get(key) if isinstance(rec, dict) else getattr(rec, key, None)


def _kv(knee) -> float | None:
    from specstudy.measure.capacity.knee import kv_capacity_tokens

    dep = _get(knee, "deployment")
    return kv_capacity_tokens(dep) if dep else None


def _steps_by_rate(steps) -> dict[float, Any]:
    out = {}
    for s in steps or []:
        if _get(s, "phase") in ("bracket", "bisect") and not _get(s, "client_limited"):
            out[round(float(_get(s, "offered_rate")), 9)] = s
    return out


def evaluate(criteria: dict, baseline_knee, candidate_knee, baseline_steps, candidate_steps) -> dict:
    """Each criterion's figure, interval or matched load, limit and verdict (``met``/``missed``/``no_data``)."""
    rows: list[dict[str, Any]] = []
    bk, bu = _num(_get(baseline_knee, "knee_rps")), _num(_get(baseline_knee, "step_above_rps"))
    ck, cu = _num(_get(candidate_knee, "knee_rps")), _num(_get(candidate_knee, "step_above_rps"))
    limit = float(criteria["min_knee_ratio"])
    if bk and ck is not None:
        lo = ck / bu if bu else None
        hi = cu / bk if cu is not None else None
        verdict = "missed" if hi is not None and hi < limit else "met"
        rows.append({"criterion": "knee_ratio", "value": ck / bk, "interval": [lo, hi], "limit": f">= {limit:g}",
                     "verdict": verdict, "why": f"candidate knee {ck:.3g} req/s vs baseline {bk:.3g} req/s (statuses "
                     f"{_get(candidate_knee, 'status')} / {_get(baseline_knee, 'status')}); missed only when the "
                     "whole bracket interval lies below the limit"})
    else:
        rows.append({"criterion": "knee_ratio", "value": None, "interval": None, "limit": f">= {limit:g}",
                     "verdict": "no_data", "why": "a knee is missing (baseline or candidate search refused or absent)"})
    matched = None
    if bk:
        bs, cs = _steps_by_rate(baseline_steps), _steps_by_rate(candidate_steps)
        cap = float(criteria["matched_load_fraction"]) * bk
        common = sorted(r for r in bs if r in cs and r <= cap + 1e-9)
        matched = common[-1] if common else None
    for crit, key, lim in (("ttft_p95_at_matched_load", "ttft_p95_ms", "max_ttft_p95_ratio"),
                           ("tpot_p95_at_matched_load", "tpot_p95_ms", "max_tpot_p95_ratio")):
        limit = float(criteria[lim])
        if matched is None:
            rows.append({"criterion": crit, "value": None, "matched_rps": None, "limit": f"<= {limit:g}",
                         "verdict": "no_data", "why": "no offered rate at or below "
                         f"{criteria['matched_load_fraction']:g} × the baseline knee ran in both searches"})
            continue
        b, c = _num(_get(bs[matched], key)), _num(_get(cs[matched], key))
        if not b or c is None:
            rows.append({"criterion": crit, "value": None, "matched_rps": matched, "limit": f"<= {limit:g}",
                         "verdict": "no_data", "why": f"no {key} at {matched:g} req/s in one of the searches"})
            continue
        rows.append({"criterion": crit, "value": c / b, "matched_rps": matched, "limit": f"<= {limit:g}",
                     "verdict": "met" if c / b <= limit else "missed",
                     "why": f"{key} {c:.4g} vs baseline {b:.4g} at {matched:g} req/s"})
    limit = float(criteria["max_kv_tokens_lost_fraction"])
    kb, kc = _kv(baseline_knee), _kv(candidate_knee)
    if kb and kc is not None:
        lost = 1 - kc / kb
        rows.append({"criterion": "kv_tokens_lost", "value": lost, "limit": f"<= {limit:g}",
                     "verdict": "met" if lost <= limit else "missed",
                     "why": f"KV cache {kc:,.0f} vs baseline {kb:,.0f} tokens"})
    else:
        rows.append({"criterion": "kv_tokens_lost", "value": None, "limit": f"<= {limit:g}", "verdict": "no_data",
                     "why": "no KV-cache capacity in a deployment record"})
    return {"criteria": rows, "met": all(r["verdict"] == "met" for r in rows),
            "missed": [r["criterion"] for r in rows if r["verdict"] != "met"]}


def apply(rec: dict, evaluation: dict | None, arm: str | None, capacity_enabled: bool) -> dict:
    """The recommendation with its capacity half: an enabled arm that misses a criterion is not enabled."""
    out = dict(rec)
    half: dict[str, Any] = {"arm": arm, "evaluated": evaluation is not None, "evaluation": evaluation}
    if not capacity_enabled:
        half["note"] = "the study runs no capacity search (capacity.enabled false): the capacity half is not evaluated"
    elif rec.get("decision") == "enable":
        if evaluation is None or arm != rec.get("enable"):
            half["note"] = f"no capacity search of the enabled arm {rec.get('enable')}: the capacity half cannot be shown"
            out.update(decision="do_not_enable", enable=None,
                       capacity_blocker=half["note"])
        elif not evaluation["met"]:
            out.update(decision="do_not_enable", enable=None,
                       capacity_blocker="capacity criteria missed: " + ", ".join(evaluation["missed"]))
    out["capacity_half"] = half
    out["confirmation_decision"] = rec.get("decision")
    return out
