"""The report's missing pieces: what the study's design expects that the files given lack, each naming its file —
a phase not run, confirmation rounds short of the pre-registered initial rounds (a study stopped part-way, or a
report built offline on partial results), gate verdicts, round checkpoints, the final candidate, the capacity
knees, the scale model's and the fixture's records.
"""

from __future__ import annotations

from specstudy.core import layout
from specstudy.core.arms import baseline_of, is_baseline
from specstudy.study.plan import CORE_PHASES


def confirmation_progress(cells: list[dict], rule: dict | None) -> dict | None:
    """The confirmation rounds measured so far: per arm the repeats with a cell summary, against the
    pre-registered initial rounds (``rule['initial_repeats']``), and the deployments with fewer cells than the
    phase's grid. None without confirmation cells."""
    conf = [c for c in cells if c.get("phase") == "confirm" and (c.get("kind") or "repeat") == "repeat"]
    if not conf:
        return None
    reps: dict[str, set[int]] = {}
    per_dep: dict[tuple[str, int], set] = {}
    for c in conf:
        reps.setdefault(c["arm"], set()).add(int(c["rep"]))
        per_dep.setdefault((c["arm"], int(c["rep"])), set()).add((c["workload"], int(c["concurrency"])))
    grid = {k for ks in per_dep.values() for k in ks}
    initial = (rule or {}).get("initial_repeats")
    measured = min(len(r) for r in reps.values())
    partial = {f"{arm} rep{rep}": f"{len(ks)} of {len(grid)} cells" for (arm, rep), ks in sorted(per_dep.items())
               if len(ks) < len(grid)}
    return {"initial": initial, "rounds": {arm: sorted(r) for arm, r in sorted(reps.items())},
            "measured": measured, "partial": partial,
            "complete": (initial is None or measured >= int(initial)) and not partial}


def progress_text(p: dict) -> str:
    """One sentence: how far confirmation got (what the recommendation and the missing pieces say)."""
    rounds = "; ".join(f"{arm}: {', '.join(f'rep{r}' for r in rs)}" for arm, rs in p["rounds"].items())
    of = f" of the {p['initial']} pre-registered initial rounds" if p.get("initial") is not None else ""
    text = f"confirmation incomplete: {p['measured']}{of} measured for every arm ({rounds})"
    if p["partial"]:
        text += "; deployments measured in part: " + ", ".join(f"{k} ({v})" for k, v in p["partial"].items())
    return text


def missing_pieces(files, config: dict, cells: list[dict], gates: list[dict], progress: dict | None,
                   final_candidate_arm: str | None) -> list[str]:
    """Every expected input the files given lack, in the report's words (empty: nothing is missing)."""
    from specstudy.inputs.scale_model import RECORD_NAME

    missing: list[str] = []
    present = sorted({c["phase"] for c in cells})
    for ph in CORE_PHASES:
        if ph not in present:
            missing.append(f"no {ph} cells ({layout.ROOT}/{ph}/ empty or not run yet)")
    if progress is not None and not progress["complete"]:
        missing.append(progress_text(progress))
    judged = {(g["phase"], g["arm"]) for g in gates}
    for ph in present:
        arms = sorted({c["arm"] for c in cells if c["phase"] == ph and not is_baseline(c["arm"])})
        lacking = [a for a in arms if (ph, a) not in judged]
        if lacking:
            missing.append(f"no {ph} gate verdict for {', '.join(lacking)} "
                           f"({', '.join(layout.gate(ph, a) for a in lacking)})")
    if not gates and not any(m.startswith("no ") and "gate verdict for" in m for m in missing):
        missing.append(f"no gate verdicts ({layout.gates_dir()}/)")
    if "confirm" in present and not files.rounds:
        missing.append(f"no confirmation round checkpoint ({layout.confirm_rounds_dir()}/round<n>.json): the rounds' record "
                       "is written once the initial rounds are measured")
    if (config.get("capacity") or {}).get("enabled"):
        if files.final_candidate is None:
            missing.append(f"no final candidate ({layout.final_candidate()}): the capacity search has no arm yet")
        knees = {layout.parse("knee", k)["arm"] for k in files.knees}
        first = next(iter(config.get("engines") or {}), None)  # no candidate: the first engine build's baseline
        wanted = ([baseline_of(final_candidate_arm), final_candidate_arm] if final_candidate_arm else
                  [f"baseline@{first}" if first else "baseline"])
        lacking = [a for a in wanted if a not in knees]
        if lacking:
            missing.append(f"no capacity knee for {', '.join(lacking)} "
                           f"({', '.join(layout.capacity_knee(a) for a in lacking)}): the capacity half is not "
                           "evaluated")
    if (config.get("scale_model") or {}).get("build") and files.scale is None:
        missing.append(f"no scale model record ({layout.models_dir('scale', RECORD_NAME)})")
    if (config.get("fixture_models") or {}).get("build") and files.heldout is None:
        missing.append(f"no fixture held-out acceptance ({layout.models_dir('fixture', 'heldout.json')})")
    return missing
