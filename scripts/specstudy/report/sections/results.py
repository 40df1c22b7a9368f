"""The report's results: the table per workload × concurrency of each phase (speedup, TPOT and TTFT ratios,
absolute medians, each repeat) and the plots section (speedup, TPOT, acceptance, memory, latency, drift)."""

from __future__ import annotations

from pathlib import Path

from specstudy.report.blocks import fmt, fmt_ci, fmt_reps
from specstudy.report.plots import (
    plot_acceptance,
    plot_caption,
    plot_drift,
    plot_latency,
    plot_memory,
    plot_per_position,
    plot_ratio,
)


def _arms_text(rows: list[dict]) -> str:
    counts: dict[str, set] = {}
    for r in rows:
        counts.setdefault(r["arm"], set()).add((r.get("rep"), r["workload"], r["concurrency"]))
    return ", ".join(f"{arm} ({len(k)} cell{'s' if len(k) != 1 else ''})" for arm, k in sorted(counts.items()))


def no_comparisons_reason(phase: str, cells: list[dict], comps: list[dict]) -> str | None:
    """Why there is no ``phase`` comparison, from the cells table: which cells were left out and what would make
    them comparable; None when ``phase`` has comparisons."""
    if any(c["phase"] == phase for c in comps):
        return None
    rows = [c for c in cells if (c.get("kind") or "repeat") != "drift"]
    here = [c for c in rows if c["phase"] == phase]
    if not cells:
        return (f"no {phase} comparisons: the cells table is empty (no cell summary under the results root: nothing "
                "was measured or imported there)")
    if not here:
        other = sorted({c["phase"] for c in rows} - {phase})
        held = "; ".join(f"{ph}: {_arms_text([c for c in rows if c['phase'] == ph])}" for ph in other)
        return (f"no {phase} comparisons: the cells table holds no {phase} cells, so every cell it holds was left out "
                f"of them ({held or 'drift baselines only'}). The recommendation judges phase {phase} "
                f"(config key recommendation.phase): measure or import these cells as {phase} "
                f"(`specstudy import-upstream ... --phase {phase}`), or judge "
                f"{' / '.join(other) or 'another phase'} by setting recommendation.phase")
    if not any(c["arm"] != "baseline" for c in here):
        return (f"no {phase} comparisons: the {phase} cells are the baseline's only ({_arms_text(here)}); no "
                "speculative arm was measured or imported in this phase")
    return None


def dropped_arms(phase: str, comps: list[dict]) -> list[str]:
    """The ``phase`` comparisons none of whose repeats could be paired, with the reasons their repeats give."""
    out = []
    for c in comps:
        if c["phase"] == phase and not c.get("repeats") and c.get("excluded"):
            why = sorted({e["reason"] for e in c["excluded"]})
            out.append(f"{c['arm']} {c['workload']} c{c['concurrency']}: every repeat left out ({'; '.join(why)})")
    return out


def fmt_boot(d: dict) -> str:
    """The bootstrap interval of a comparison (BCa, else percentile), as ``fmt_ci`` shows the primary one."""
    if not d or not d.get("n"):
        return "–"
    if d.get("boot_low") is None:
        return "–"
    used = str(d.get("boot_method") or "")
    kind = "BCa" if used == "bca" else "percentile" if used.startswith("percentile") else used or "bootstrap"
    return f"[{fmt(d['boot_low'])}, {fmt(d['boot_high'])}] {kind}"


def coverage_note(pc: list[dict], s: dict, cov: list[dict]) -> str:
    """The coverage simulation's verdict on each interval the table shows, at the phase's repeat counts."""
    from specstudy.inference.simulate import METHOD_LABELS, coverage_verdicts

    conf = float(s["analysis"]["confidence"])
    parts = []
    for n in sorted({int(c["speedup"]["n"]) for c in pc if (c["speedup"].get("n") or 0) >= 2}):
        v = coverage_verdicts(cov, n, conf)
        if v is None:
            continue
        where = f"n = {n}" if v["t_log"]["n"] == n else f"n = {n} (simulated at n = {v['t_log']['n']})"
        parts.append(f"{where}: " + "; ".join(
            f"{METHOD_LABELS[m]} {r['verdict']} ({r['min']:.2f}–{r['max']:.2f}"
            + (f", below {conf - 0.03:.2f} under {', '.join(r['under'])})" if r["under"] else ")")
            for m, r in v.items()))
    if not parts:
        return "No coverage simulation covers these repeat counts (fewer than 2 repeats: no interval)."
    return ("Coverage simulation of each interval (section \"Statistical method\"; simulated share of intervals "
            f"covering a known effect over four scenarios, nominal {conf:.0%}) at this phase's repeats: "
            + " | ".join(parts) + ".")


def results_tables(B, comps: list[dict], s: dict, cells: list[dict] | None = None,
                   cov: list[dict] | None = None) -> None:
    for phase in ("confirm", "screen"):
        pc = [c for c in comps if c["phase"] == phase]
        B.append(("h", 2, f"Results per workload × concurrency ({phase})"))
        if not pc:
            why = no_comparisons_reason(phase, cells, comps) if cells is not None else None
            B.append(("p", f"No {phase} comparisons" + (f": {why.split(': ', 1)[1]}." if why else ".")))
            continue
        dropped = dropped_arms(phase, comps)
        if dropped:
            B.append(("p", "Left out of the comparisons (no repeat could be paired with a baseline repeat):"))
            B.append(("ul", dropped))
        B.append(("p", "Speedup = arm output tokens/s ÷ baseline output tokens/s of the same rep (pairs by rep "
                       f"index). Cells show geometric mean [{int(s['analysis']['confidence'] * 100)}% CI, "
                       f"{s['analysis']['ci_method']}], beside it the {int(s['analysis']['confidence'] * 100)}% "
                       "bootstrap interval over the same deployment-level ratios, median and each repeat; absolute "
                       "values are medians."))
        rows = []
        for c in sorted(pc, key=lambda c: (c["workload"], c["concurrency"], c["arm"])):
            ab = c["absolute"]
            rows.append([c["workload"], c["concurrency"], c["arm"], fmt(ab["base_otps"], "{:.1f}"),
                         fmt(ab["arm_otps"], "{:.1f}"), fmt_ci(c["speedup"]), fmt_boot(c["speedup"]),
                         fmt(c["speedup"]["median"]),
                         fmt_reps(c["speedup"]), fmt_ci(c["tpot_ratio"]), fmt(ab["base_tpot_ms"], "{:.2f}"),
                         fmt(ab["arm_tpot_ms"], "{:.2f}"), fmt_ci(c["ttft_ratio"]), fmt(ab["acceptance_rate"]),
                         f"{c['speedup']['n']}/{c['n_excluded']}"])
        B.append(("table", ["workload", "c", "arm", "base tok/s", "arm tok/s", "speedup gm [CI]",
                            "speedup bootstrap CI", "median",
                            "repeats", "TPOT ratio [CI]", "base TPOT ms", "arm TPOT ms", "TTFT ratio [CI]",
                            "acceptance", "n/excluded"], rows))
        if cov is not None:
            B.append(("p", coverage_note(pc, s, cov)))


def plots_section(B, plots: Path, rec: dict, comps: list[dict], cells: list[dict], mem_rows: list[dict], requests,
                  dr: dict) -> None:
    """Every figure of ``plots/`` (or the line saying it had no data), with its caption."""
    from specstudy.inference import stats

    B.append(("h", 2, "Plots"))
    main_phase = rec["phase"] if any(c["phase"] == rec["phase"] for c in comps) else "screen"
    mc = [c for c in comps if c["phase"] == main_phase]
    plot_specs = [
        ("speedup.png", plot_caption("speedup", f"{main_phase} phase"),
         lambda p: plot_ratio(mc, "speedup", p, f"speedup ({main_phase})")),
        ("tpot.png", plot_caption("tpot", f"{main_phase} phase"),
         lambda p: plot_ratio(mc, "tpot_ratio", p, f"TPOT ratio ({main_phase})")),
        ("acceptance_vs_speedup.png", plot_caption("acceptance_vs_speedup"),
         lambda p: plot_acceptance(stats.effect_rows(comps), p)),
        ("per_position.png", plot_caption("per_position"), lambda p: plot_per_position(cells, p)),
        ("memory.png", plot_caption("memory"), lambda p: plot_memory(mem_rows, p)),
        ("latency.png", plot_caption("latency"), lambda p: plot_latency(requests, p)),
        ("drift.png", plot_caption("drift"), lambda p: plot_drift(dr, p)),
    ]
    for name, alt, fn in plot_specs:
        if fn(plots / name):
            B.append(("img", f"plots/{name}", alt))
        else:
            B.append(("p", f"(plots/{name}: no data) {alt}"))
