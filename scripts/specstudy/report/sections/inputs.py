"""The report's sections on what the study was built from: the selection (did it read confirmation data?), the
workloads' licences and token lengths, and the fixture draft's acceptance on held-out text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specstudy.core.records import SelectionRecord
from specstudy.report.blocks import fmt


def read_json_or_none(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, json.JSONDecodeError):
        return None


def corpora(files: list[str]) -> list[dict]:
    """The built corpora ``files`` (``corpus.json``), each with the ``token_stats.json`` beside it."""
    out = []
    for p in map(Path, sorted(files)):
        c = read_json_or_none(p) or {}
        out.append({"dir": p.parent, "corpus": c, "token_stats": read_json_or_none(p.parent / "token_stats.json")})
    return out


def selection_check(selection: SelectionRecord | None) -> dict:
    """Did the selection use confirmation samples? Inspects every input path it lists and its phase of inputs."""
    if selection is None:
        return {"present": False, "used_confirmation": None, "inputs": []}
    used = any("/confirm/" in i.path or i.path.startswith("confirm/") for i in selection.inputs)
    used = used or selection.phase_of_inputs != "screen"
    return {"present": True, "used_confirmation": used,
            "inputs": [f"{i.path} (sha256 {i.sha256})" for i in selection.inputs],
            "candidates": [c.arm for c in selection.candidates]}


def selection_section(B, sel):
    B.append(("h", 2, "Selection"))
    if not sel["present"]:
        B.append(("p", "Missing: results/selection/selection.json not found; no selection has run."))
        return
    B.append(("p", "Did the selection use the confirmation samples? "
              + ("NO — every selection input comes from screening." if not sel["used_confirmation"]
                 else "YES — the selection read confirmation data: the confirmation is NOT independent.")))
    B.append(("p", f"Selected candidates: {', '.join(map(str, sel['candidates'])) or 'none'}. Selection inputs:"))
    B.append(("ul", sel["inputs"] or ["(selection.json lists no inputs)"]))
    B.append(("p", "Selection bias: the candidates were picked as the best of many screened arms, so their screening "
                   "effects are biased upward (winner's curse). Only the confirmation phase, measured on fresh "
                   "deployments after selection, is used for the recommendation."))


def corpus_section(B, files: list[str]):
    B.append(("h", 2, "Workloads: licensing and token lengths"))
    cs = corpora(files)
    if not cs:
        B.append(("p", "Missing: no results/corpora/*/*/corpus.json."))
        return
    for c in cs:
        corp = c["corpus"]
        B.append(("h", 3, f"{corp.get('name', '?')} {corp.get('version', '?')} (digest {corp.get('digest', '?')})"))
        B.append(("table", ["source", "sha256", "license"],
                  [[s.get("path"), s.get("sha256"), s.get("license") or "UNKNOWN"] for s in corp.get("sources") or []]))
        ts = c["token_stats"]
        if ts:
            from specstudy.analysis.tables import flatten

            flat = flatten(ts, "")
            B.append(("table", ["statistic", "value"], [[k, fmt(v, "{:.1f}")] for k, v in flat.items()]))
        else:
            B.append(("p", "Missing: token_stats.json."))


def measured_acceptance(cells: list[dict], k: int, workload: str | None = None) -> dict:
    """vLLM's acceptance rate of the valid draft-model cells of depth ``k`` (ratio of the summed counters)."""
    rows = [c for c in cells if c.get("method") == "draft_model" and c.get("num_speculative_tokens") == k
            and c.get("valid") and c.get("draft_tokens") and (workload is None or c.get("workload") == workload)]
    dt = sum(c["draft_tokens"] for c in rows)
    acc = sum(c.get("accepted_tokens") or 0 for c in rows)
    return {"cells": len(rows), "acceptance_rate": acc / dt if dt else None}


def heldout_section(B, heldout: str | None, cells: list[dict]) -> dict | None:
    """Acceptance of the fixture draft on held-out text vs the workloads' training text (#16 item 11), from the
    fixture's ``heldout.json`` (None: not measured)."""
    rec = read_json_or_none(Path(heldout)) if heldout is not None else None
    B.append(("h", 2, "Fixture acceptance on held-out text"))
    if rec is None:
        B.append(("p", "Not measured: no results/models/fixture/heldout.json (the study does not build the fixture "
                       "models, or rule fixture_heldout has not run)."))
        return None
    sets = rec["sets"]
    B.append(("p", "The embedded workloads come from the text the fixture models trained on (corpora/data/), so the "
                   "acceptance measured above is acceptance on training text. The same procedure was run on "
                   f"{sets['heldout']['prompts']} held-out prompts (corpora/heldout/, never trained on) and on the "
                   f"{sets['workloads']['prompts']} workload prompts: the target's greedy path of "
                   f"{rec['max_new_tokens']} tokens (end-of-sequence suppressed) and the draft's greedy proposals "
                   "along it, in vLLM's draft-model rounds. 'vLLM measured' is the study's own counter ratio on "
                   "the valid draft-model cells of that depth, for comparison with the offline figure on the same "
                   "prompts. Drop = training − held-out acceptance rate, 95% bootstrap interval over prompts."))
    nat_w, nat_h = sets["workloads"].get("natural") or {}, sets["heldout"].get("natural") or {}

    def nat_rate(which, k, st=None):
        byk = ((sets[which].get("natural") or {}).get("by_k") or {}).get(str(k)) or {}
        return (byk if st is None else (byk.get("strata") or {}).get(st) or {}).get("acceptance_rate")

    def drop_ci(d):
        ci = (d or {}).get("ci") or [None, None]
        return f"{fmt((d or {}).get('drop'))} [{fmt(ci[0])}, {fmt(ci[1])}]"

    if nat_w and nat_h:
        short_h = nat_h.get("answered_fewer_than_2") or 0
        B.append(("p", f"The target's own greedy answers (natural end-of-sequence, at most {rec['max_new_tokens']} "
                       f"tokens): mean {fmt(nat_w.get('mean_tokens'), '{:.1f}')} tokens on the workload prompts "
                       f"({nat_w.get('answered_fewer_than_2')} of {nat_w.get('prompts')} shorter than 2 tokens), "
                       f"{fmt(nat_h.get('mean_tokens'), '{:.1f}')} on the held-out prompts "
                       f"({short_h} of {nat_h.get('prompts')} shorter than 2 tokens). Acceptance over the natural "
                       "answer is the figure comparable with vLLM's counters; the EOS-suppressed figures compare both "
                       "sets over the same number of tokens per prompt."
                       + (" On held-out text the target mostly ends at once, so only the EOS-suppressed comparison "
                          "measures it." if short_h * 2 > (nat_h.get("prompts") or 0) else "")))
        dn = rec.get("drop_natural") or {}
        if dn:
            B.append(("p", "Over the natural answers: " + "; ".join(
                f"k={k}: training {fmt(nat_rate('workloads', k))}, held-out {fmt(nat_rate('heldout', k))}, "
                f"drop {drop_ci(dn.get(str(k)))}" for k in rec["k"]) + "."))

    rows = []
    for k in rec["k"]:
        tr, he = sets["workloads"]["by_k"][str(k)], sets["heldout"]["by_k"][str(k)]
        d = rec["drop"].get(str(k)) or {}
        rows.append(["all", k, fmt(measured_acceptance(cells, k)["acceptance_rate"]), fmt(nat_rate("workloads", k)),
                     fmt(tr["acceptance_rate"]), fmt(he["acceptance_rate"]), drop_ci(d),
                     fmt(tr["mean_acceptance_length"], "{:.2f}"), fmt(he["mean_acceptance_length"], "{:.2f}")])
        for st, dd in sorted((d.get("strata") or {}).items()):
            trs, hes = tr["strata"].get(st) or {}, he["strata"].get(st) or {}
            rows.append([st, k, fmt(measured_acceptance(cells, k, st)["acceptance_rate"]), fmt(nat_rate("workloads", k, st)),
                         fmt(trs.get("acceptance_rate")), fmt(hes.get("acceptance_rate")), drop_ci(dd),
                         fmt(trs.get("mean_acceptance_length"), "{:.2f}"), fmt(hes.get("mean_acceptance_length"), "{:.2f}")])
    B.append(("table", ["stratum", "k", "vLLM measured (workloads)", "offline, workloads, natural EOS",
                        "offline, workloads, EOS suppressed", "offline, held-out, EOS suppressed", "drop [95% CI]",
                        "mean acc. length, workloads", "mean acc. length, held-out"], rows))
    if sets["heldout"].get("skipped") or sets["workloads"].get("skipped"):
        B.append(("p", "Skipped (prompt fills max_model_len): "
                       + ", ".join(sets["workloads"]["skipped"] + sets["heldout"]["skipped"])))
    return {"k": rec["k"], "drop": {k: v.get("drop") for k, v in rec["drop"].items()},
            "ci": {k: v.get("ci") for k, v in rec["drop"].items()}}
