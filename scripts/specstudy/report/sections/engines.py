"""The report's "Engine builds" section (a study of several engine builds, docs/engines.md): per speculative arm,
workload and concurrency, the build's own effect on the baseline, the arm's speedup on each build over that
build's own baseline, and their difference (:func:`specstudy.inference.stats.engine_effects`). No section for a
study of one engine."""

from __future__ import annotations

from specstudy.report.blocks import fmt_ci, fmt_reps


def engines_section(B, effects: list[dict], labels: dict[str, str], s: dict) -> None:
    if not effects:
        return
    conf = int(s["analysis"]["confidence"] * 100)
    B.append(("h", 2, "Engine builds"))
    B.append(("p", "Each speculative arm is compared with the baseline of its own engine build. Engine effect = "
                   "baseline tok/s on build B ÷ baseline tok/s on the reference build A (the build alone, no "
                   "speculation); speedup on A / on B = the arm's tok/s ÷ that build's baseline; difference = "
                   "speedup on B ÷ speedup on A (above 1: speculation gains more on B). All are paired by rep "
                   f"(the same round); cells show geometric mean [{conf}% CI, {s['analysis']['ci_method']}] and "
                   "each repeat. Builds: " + "; ".join(f"{b} = {labels.get(b) or b}" for b in sorted(
                       {e["reference"] for e in effects} | {e["build"] for e in effects})) + "."))
    for phase in ("confirm", "screen"):
        rows = [e for e in effects if e["phase"] == phase]
        if not rows:
            continue
        B.append(("h", 3, f"Engine builds ({phase})"))
        B.append(("table", ["arm", "workload", "c", "A", "B", "engine effect B/A [CI]", "repeats",
                            "speedup on A [CI]", "speedup on B [CI]", "difference B/A [CI]", "repeats"],
                  [[e["arm"], e["workload"], e["concurrency"], e["reference"], e["build"], fmt_ci(e["engine"]),
                    fmt_reps(e["engine"]), fmt_ci(e["speedup_a"]), fmt_ci(e["speedup_b"]), fmt_ci(e["difference"]),
                    fmt_reps(e["difference"])]
                   for e in sorted(rows, key=lambda e: (e["arm"], e["workload"], e["concurrency"], e["build"]))]))
