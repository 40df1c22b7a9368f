"""The report's capacity section: knees per arm from ``results/capacity/<arm>/knee.json``, kept apart from the
fixed-concurrency results, with the knees compared and each arm's ``capacity.png``.
"""

from __future__ import annotations

from pathlib import Path

from specstudy.core.arms import baseline_of, is_arm_name, is_baseline
from specstudy.measure.capacity.run import PLOT_FILE
from specstudy.report.blocks import fmt
from specstudy.report.plots import plot_caption


def capacity_section(B, knee_files: dict[str, str], out: Path) -> None:
    """Open-loop capacity (docs/capacity.md): knees per arm (``knee_files``, arm → ``knee.json``; each search's plot
    beside its knee), kept apart from fixed-concurrency results."""
    import shutil

    from specstudy.core.records import read_knee
    from specstudy.measure.capacity.knee import compare_knees, kv_capacity_tokens

    B.append(("h", 2, "Capacity (separate from the fixed-concurrency results)"))
    knee_files = {arm: Path(p) for arm, p in sorted(knee_files.items()) if Path(p).exists()}
    knees = {arm: read_knee(p) for arm, p in knee_files.items()}
    if not knees:
        B.append(("p", "Missing: no results/capacity/*/knee.json (run `snakemake capacity`)."))
        return
    B.append(("p", "Open-loop Poisson arrivals on an absolute timeline; each step is judged against the gates declared "
                   "before the search (gates.json); the knee is the highest rate passing every gate, confirmed by "
                   "repeated soaks: every soak at the knee passes, at least one soak one step above fails "
                   "(docs/capacity.md). Steps that failed only the load-generator gate are client-limited and never "
                   "count as server saturation."))
    rows = []
    for arm, k in knees.items():
        kv, av = k.confirmation.knee_verdicts, k.confirmation.above_verdicts
        soaks = (f"{sum(v == 'pass' for v in kv)}/{len(kv)} pass, {sum(v == 'fail' for v in av)}/{len(av)} fail"
                 if kv or av else "–")
        notes = [r.code for r in k.reasons]
        notes += [f"knee moved {m.direction} from {fmt(m.from_knee_rps, '{:.3g}')}"
                  for m in k.confirmation.moves or []]
        rows.append([arm, fmt(k.knee_rps, "{:.3g}"), fmt(k.step_above_rps, "{:.3g}"), k.status, soaks,
                     fmt(k.client_capacity.rps, "{:.3g}"),
                     fmt(kv_capacity_tokens(k.deployment) if k.deployment else None, "{:,.0f}"),
                     "; ".join(notes) or "–"])
    B.append(("table", ["arm", "knee (req/s)", "step above (req/s)", "status", "soaks: knee, above",
                        "client capacity (req/s)", "KV capacity (tokens)", "notes"], rows))
    for arm, k in knees.items():  # each arm against the baseline of its own engine build
        own = baseline_of(arm) if is_arm_name(arm) else "baseline"
        if not is_baseline(arm) and own in knees:
            B.append(("p", f"**{arm}**: " + compare_knees(knees[own], k) + "."))
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    for arm in knees:
        src = knee_files[arm].parent / PLOT_FILE
        if src.exists():
            shutil.copyfile(src, plots / f"capacity-{arm}.png")
            B.append(("img", f"plots/capacity-{arm}.png", plot_caption(f"capacity-{arm}", arm)))
