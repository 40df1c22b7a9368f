"""The study report: Markdown + self-contained HTML (PNG plots referenced), recommendation and patch.

``specstudy report --results results --tables results/tables --config <resolved config json> --out results/report``

The report is built from the Parquet tables (:mod:`specstudy.analysis.tables`), a few raw JSON files
(selection, corpora, capacity) and the resolved config. Every section works with missing pieces
and says what is missing. Section meanings: docs/report.md.

Kept as one module (over ~700 lines): it is one document; each section owns its wording, its plot and what
it says when an input is missing, and they share the formatting helpers and the plot captions (also used by
``snakemake --report``); the plot functions are the part that could stand alone.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from specstudy.core.records import SelectionRecord, read_selection
from specstudy.core.stat_util import median
from specstudy.deployment.launchlog import STARTUP_PHASES
from specstudy.report.plots import _plt, _save, plot_caption
from specstudy.study.plan import CORE_PHASES

Block = tuple


# ---------------------------------------------------------------------------------------------
# Formatting helpers
# ---------------------------------------------------------------------------------------------
def _f(v: Any, fmt: str = "{:.3f}") -> str:
    if v is None:
        return "–"
    try:
        return fmt.format(v)
    except (TypeError, ValueError):
        return str(v)


def _ci(d: dict) -> str:
    if not d or not d.get("n"):
        return "–"
    s = f"{_f(d['geomean'])}"
    if d.get("ci_low") is not None:
        s += f" [{_f(d['ci_low'])}, {_f(d['ci_high'])}]"
    return s


def _reps(d: dict) -> str:
    return ", ".join(_f(v) for v in (d or {}).get("values", [])) or "–"


def render_markdown(blocks: list[Block]) -> str:
    out = []
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out.append("#" * b[1] + " " + b[2] + "\n")
        elif kind == "p":
            out.append(b[1] + "\n")
        elif kind == "ul":
            out.append("".join(f"- {x}\n" for x in b[1]) if b[1] else "- (none)\n")
        elif kind == "table":
            headers, rows = b[1], b[2]
            if not rows:
                out.append("_(no rows)_\n")
                continue
            esc = [[str(c).replace("|", "\\|").replace("\n", " ") for c in r] for r in rows]
            out.append("| " + " | ".join(headers) + " |\n|" + "---|" * len(headers) + "\n"
                       + "".join("| " + " | ".join(r) + " |\n" for r in esc))
        elif kind == "img":
            out.append(f"![{b[2]}]({b[1]})\n\n*Figure: {b[2]}*\n")
        elif kind == "pre":
            out.append("```\n" + b[1].rstrip("\n") + "\n```\n")
        elif kind == "md":  # a section written as Markdown by another step (an extension phase's section.md)
            out.append(b[1].rstrip("\n") + "\n")
    return "\n".join(out)


def render_html(blocks: list[Block], title: str) -> str:
    e = html.escape
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>"
             "body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px}"
             "th{background:#eee}img{max-width:100%}pre{background:#f6f6f6;padding:8px;overflow-x:auto}"
             "figure{margin:1em 0}figcaption{font-size:90%;color:#444}"
             "</style></head><body>"]
    for b in blocks:
        kind = b[0]
        if kind == "h":
            parts.append(f"<h{b[1]}>{e(b[2])}</h{b[1]}>")
        elif kind == "p":
            parts.append(f"<p>{e(b[1])}</p>")
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{e(str(x))}</li>" for x in (b[1] or ["(none)"])) + "</ul>")
        elif kind == "table":
            if not b[2]:
                parts.append("<p><em>(no rows)</em></p>")
                continue
            parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in b[1]) + "</tr>"
                         + "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in b[2])
                         + "</table>")
        elif kind == "img":
            parts.append(f"<figure><img src='{e(b[1])}' alt='{e(b[2])}'><figcaption>{e(b[2])}</figcaption></figure>")
        elif kind == "pre":
            parts.append(f"<pre>{e(b[1])}</pre>")
        elif kind == "md":
            from markdown_it import MarkdownIt

            parts.append(MarkdownIt("commonmark", {"html": False}).enable("table").render(b[1]))
    parts.append("</body></html>\n")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Raw inputs besides the tables
# ---------------------------------------------------------------------------------------------
def _load(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, json.JSONDecodeError):
        return None


def corpora(results: Path) -> list[dict]:
    out = []
    for p in sorted(results.glob("corpora/*/*/corpus.json")):
        c = _load(p) or {}
        out.append({"dir": p.parent, "corpus": c, "token_stats": _load(p.parent / "token_stats.json")})
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


def plot_ratio(comps: list[dict], metric: str, path: Path, title: str) -> bool:
    if not comps:
        return False
    plt = _plt()
    workloads = sorted({c["workload"] for c in comps})
    arms = sorted({c["arm"] for c in comps})
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 3.5), squeeze=False, sharey=True)
    for ax, w in zip(axes[0], workloads, strict=True):
        for i, arm in enumerate(arms):
            cs = sorted((c for c in comps if c["workload"] == w and c["arm"] == arm and c[metric]["n"]),
                        key=lambda c: c["concurrency"])
            if not cs:
                continue
            x = [c["concurrency"] * (1 + 0.04 * (i - len(arms) / 2)) for c in cs]
            y = [c[metric]["geomean"] for c in cs]
            lo = [y_ - (c[metric]["ci_low"] or y_) for y_, c in zip(y, cs, strict=True)]
            hi = [(c[metric]["ci_high"] or y_) - y_ for y_, c in zip(y, cs, strict=True)]
            ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, label=arm)
            for xx, c in zip(x, cs, strict=True):
                ax.scatter([xx] * len(c[metric]["values"]), c[metric]["values"], s=8, color="k", alpha=0.5)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_title(w)
        ax.set_xlabel("concurrency")
    axes[0][0].set_ylabel(f"{metric} (arm / baseline)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title, y=1.04)
    _save(fig, path)
    return True


def plot_acceptance(rows: list[dict], path: Path) -> bool:
    rows = [r for r in rows if r["acceptance_rate"] is not None]
    if not rows:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4))
    for arm in sorted({r["arm"] for r in rows}):
        rr = [r for r in rows if r["arm"] == arm]
        ax.scatter([r["acceptance_rate"] for r in rr], [r["speedup"] for r in rr], label=arm, s=14)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("acceptance rate")
    ax.set_ylabel("speedup (deployment repeat)")
    ax.legend(fontsize=7)
    _save(fig, path)
    return True


def plot_per_position(cells: list[dict], path: Path) -> bool:
    import numpy as np

    by_arm: dict[str, list[list[float]]] = {}
    for c in cells:
        pp = c.get("per_position_acceptance")
        if pp and c.get("valid"):
            by_arm.setdefault(c["arm"], []).append([v for v in pp if v is not None])
    if not by_arm:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4))
    for arm, lists in sorted(by_arm.items()):
        k = max(len(x) for x in lists)
        mean = [float(np.mean([x[i] for x in lists if len(x) > i])) for i in range(k)]
        ax.plot(range(1, k + 1), mean, marker="o", label=arm)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (mean over valid cells)")
    ax.legend(fontsize=7)
    _save(fig, path)
    return True


def plot_memory(mem_rows: list[dict], path: Path) -> bool:
    rows = [r for r in mem_rows if r["kv_cache_tokens"] is not None]
    if not rows:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(4, len(rows)), 3.5))
    ax.bar([r["arm"] for r in rows], [r["kv_cache_tokens"] for r in rows])
    ax.set_ylabel("KV cache capacity (tokens, median)")
    ax.tick_params(axis="x", rotation=30)
    _save(fig, path)
    return True


def plot_latency(reqs, path: Path) -> bool:
    if reqs is None or len(reqs) == 0:
        return False
    r = reqs[reqs["chosen"].fillna(False).astype(bool) & reqs["success"].fillna(False).astype(bool)]
    if len(r) == 0:
        return False
    plt = _plt()
    arms = sorted(r["arm"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, col in zip(axes, ("ttft_ms", "tpot_ms"), strict=True):
        data = [r.loc[r["arm"] == a, col].dropna().to_numpy() for a in arms]
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(arms) + 1), arms, rotation=30, fontsize=7)
        ax.set_ylabel(col)
        ax.set_yscale("log")
    fig.suptitle("per-request latency distributions (all workloads and concurrencies pooled)")
    _save(fig, path)
    return True


def plot_drift(dr: dict, path: Path) -> bool:
    pts = dr.get("points") or []
    if not pts:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for node in sorted({str(p["node"]) for p in pts}):
        pp = [p for p in pts if str(p["node"]) == node]
        ax.scatter([p["x"] for p in pp], [p["resid"] for p in pp], s=12, label=f"node {node}")
    if dr.get("slope_per_unit") is not None:
        xs = sorted(p["x"] for p in pts)
        mean_x = sum(xs) / len(xs)
        ax.plot([xs[0], xs[-1]], [dr["slope_per_unit"] * (xs[0] - mean_x), dr["slope_per_unit"] * (xs[-1] - mean_x)],
                color="k", lw=1)
    ax.axhline(0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(dr.get("x_unit", "time"))
    ax.set_ylabel("baseline log throughput − series mean")
    ax.legend(fontsize=7)
    _save(fig, path)
    return True


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------
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
    return " / ".join("disabled" if v is False else "enabled" if v is True else _f(v, "{:.0f}") for v in vals)


def build(results: str | Path, tables_dir: str | Path, config: dict | None, out: str | Path,
          sections: list[str] | None = None) -> dict:
    """Compute everything and write report.md, report.html, plots/, recommendation.json and patches."""
    from specstudy.analysis.tables import read_tables
    from specstudy.core import atomic
    from specstudy.inference import stats

    results, out = Path(results), Path(out)
    config = config or {}
    s = stats.settings(config)
    t = read_tables(tables_dir)
    cells = stats._records(t["cells"])
    deps = stats._records(t["deployments"])
    gates = stats._records(t["gates"])
    comps = stats.comparisons(t["cells"], config)
    missing: list[str] = []
    phases_present = sorted({c["phase"] for c in cells})
    for ph in CORE_PHASES:
        if ph not in phases_present:
            missing.append(f"no {ph} cells (results/{ph}/ empty or not run yet)")
    if not gates:
        missing.append("no gate verdicts (results/gates/)")
    from specstudy.inference.decision import recommend
    from specstudy.study.prereg import load_prereg

    prereg = load_prereg(config) if (config.get("study") or {}).get("preregistration") else None
    rec = _with_capacity_half(recommend(comps, gates, config, prereg), results, config)
    model = stats.explanatory_model([c for c in comps if c["phase"] == s["analysis"]["hypothesis_phase"]] or comps)
    model["phase"] = s["analysis"]["hypothesis_phase"]
    declared, hyp_source = _declared_hypotheses(config)
    if declared is None:
        missing.append("no pre-registration in the config (study.preregistration): hypotheses not evaluated")
    hyps = stats.hypotheses(comps, t["deployments"], declared, model)
    dr = stats.drift(t["cells"], t["deployments"], comps, config)
    mem = stats.memory_costs(t["deployments"])
    sel = selection_check(read_selection(results / "selection" / "selection.json"))
    if not sel["present"]:
        missing.append("no selection (results/selection/selection.json)")
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)  # a declared output directory of the report rule, even when empty
    B: list[Block] = []
    from specstudy.inputs.scale_model import LABEL, report_note

    scale = report_note(config, results)  # the scale-model study labels its report (issue 27)
    B.append(("h", 1, "Speculative decoding study report" + (f" ({LABEL})" if scale else "")))
    if scale:
        B.append(("p", scale))
    B.append(("p", f"Built from {tables_dir} (tables rebuilt from raw artifacts under {results}). "
                   f"Phases present: {', '.join(phases_present) or 'none'}. Section meanings: docs/report.md."))
    # --- recommendation first
    B.append(("h", 2, "Recommendation"))
    patches = _recommendation_section(B, rec, deps, s, out)
    _decision_evidence_section(B, rec, results)
    B.append(("h", 2, "Missing pieces"))
    B.append(("ul", missing or ["nothing: all inputs present"]))

    # --- results tables
    for phase in ("confirm", "screen"):
        pc = [c for c in comps if c["phase"] == phase]
        B.append(("h", 2, f"Results per workload × concurrency ({phase})"))
        if not pc:
            B.append(("p", f"No {phase} comparisons."))
            continue
        B.append(("p", "Speedup = arm output tokens/s ÷ baseline output tokens/s of the same rep (pairs by rep "
                       f"index). Cells show geometric mean [{int(s['analysis']['confidence'] * 100)}% CI, "
                       f"{s['analysis']['ci_method']}], median and each repeat; absolute values are medians."))
        rows = []
        for c in sorted(pc, key=lambda c: (c["workload"], c["concurrency"], c["arm"])):
            ab = c["absolute"]
            rows.append([c["workload"], c["concurrency"], c["arm"], _f(ab["base_otps"], "{:.1f}"),
                         _f(ab["arm_otps"], "{:.1f}"), _ci(c["speedup"]), _f(c["speedup"]["median"]),
                         _reps(c["speedup"]), _ci(c["tpot_ratio"]), _f(ab["base_tpot_ms"], "{:.2f}"),
                         _f(ab["arm_tpot_ms"], "{:.2f}"), _ci(c["ttft_ratio"]), _f(ab["acceptance_rate"]),
                         f"{c['speedup']['n']}/{c['n_excluded']}"])
        B.append(("table", ["workload", "c", "arm", "base tok/s", "arm tok/s", "speedup gm [CI]", "median",
                            "repeats", "TPOT ratio [CI]", "base TPOT ms", "arm TPOT ms", "TTFT ratio [CI]",
                            "acceptance", "n/excluded"], rows))

    # --- plots
    B.append(("h", 2, "Plots"))
    main_phase = rec["phase"] if any(c["phase"] == rec["phase"] for c in comps) else "screen"
    mc = [c for c in comps if c["phase"] == main_phase]
    mem_rows = _memory_rows(deps, mem)
    plot_specs = [
        ("speedup.png", plot_caption("speedup", f"{main_phase} phase"),
         lambda p: plot_ratio(mc, "speedup", p, f"speedup ({main_phase})")),
        ("tpot.png", plot_caption("tpot", f"{main_phase} phase"),
         lambda p: plot_ratio(mc, "tpot_ratio", p, f"TPOT ratio ({main_phase})")),
        ("acceptance_vs_speedup.png", plot_caption("acceptance_vs_speedup"),
         lambda p: plot_acceptance(stats.effect_rows(comps), p)),
        ("per_position.png", plot_caption("per_position"), lambda p: plot_per_position(cells, p)),
        ("memory.png", plot_caption("memory"), lambda p: plot_memory(mem_rows, p)),
        ("latency.png", plot_caption("latency"), lambda p: plot_latency(t["requests"], p)),
        ("drift.png", plot_caption("drift"), lambda p: plot_drift(dr, p)),
    ]
    for name, alt, fn in plot_specs:
        if fn(plots / name):
            B.append(("img", f"plots/{name}", alt))
        else:
            B.append(("p", f"(plots/{name}: no data) {alt}"))

    _candidates_section(B, rec, comps, gates, deps, mem, mem_rows)
    _selection_section(B, sel)
    _corpus_section(B, results)
    heldout = _heldout_section(B, results, cells)
    _validity_section(B, cells, deps, comps)
    from specstudy.analysis import jit

    jit.report_section(B, cells)
    _gpu_section(B, cells, deps)
    from specstudy.report import efficiency

    energy = efficiency.energy_section(B, cells)
    interactivity = efficiency.interactivity_section(B, cells, plots, deps)
    _network_section(B, cells, dr)
    _drift_section(B, dr)
    _model_section(B, model)
    from specstudy.report import costmodel

    cost = costmodel.report_section(B, cells, deps, results, comps)
    B.append(("h", 2, "Hypotheses"))
    if declared is None:
        B.append(("p", "No pre-registration was given: no hypothesis is evaluated (hypotheses are declared in the "
                       "pre-registration's `hypotheses:` list, with their phase, test and workload roles)."))
    else:
        B.append(("p", f"As declared in the pre-registration ({hyp_source}): each hypothesis is evaluated on its "
                       "declared phase with its declared test and workload roles."))
        B.append(("table", ["id", "statement", "phase", "test", "roles", "verdict", "evidence", "reason"],
                  [[h["id"], h["statement"], h["phase_used"], h["test"],
                    "; ".join(f"{k}: {', '.join(v) if isinstance(v, list) else v}" for k, v in h["roles"].items()) or "–",
                    h["verdict"], h["evidence"], h["reason"]] for h in hyps]))
    _method_section(B, s)
    _capacity_section(B, results, out)
    from specstudy.study import duty

    duty_rows = duty.report_section(B, results)
    _extension_sections(B, sections or [])

    md = render_markdown(B)
    atomic.write_text(out / "report.md", md)
    atomic.write_text(out / "report.html", render_html(B, "specstudy report"))
    summary = {"recommendation": rec, "hypotheses": hyps, "drift": {k: v for k, v in dr.items() if k != "points"},
               "selection": sel, "missing": missing, "patches": patches,
               "model": model, "comparisons": comps, "memory_costs": mem, "duty_cycle": duty_rows,
               "fixture_heldout": heldout, "energy": energy, "interactivity": interactivity,
               "cost_model": cost}
    atomic.write_json(out / "recommendation.json", summary)
    return summary


def _declared_hypotheses(config: dict) -> tuple[list[dict] | None, str | None]:
    """The pre-registered hypotheses of the study config (None without a pre-registration)."""
    from specstudy.study.prereg import load_prereg, prereg_path

    if not (config.get("study") or {}).get("preregistration"):
        return None, None
    prereg = load_prereg(config)
    return list(prereg.get("hypotheses") or []), str(prereg_path(config))


def _capacity_section(B, results: Path, out: Path) -> None:
    """Open-loop capacity (docs/capacity.md): knees per arm, kept apart from fixed-concurrency results."""
    import shutil

    from specstudy.core.records import read_knee
    from specstudy.measure.capacity.knee import compare_knees, kv_capacity_tokens

    B.append(("h", 2, "Capacity (separate from the fixed-concurrency results)"))
    knees = {p.parent.name: read_knee(p) for p in sorted((results / "capacity").glob("*/knee.json"))}
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
        notes += [f"knee moved {m.direction} from {_f(m.from_knee_rps, '{:.3g}')}"
                  for m in k.confirmation.moves or []]
        rows.append([arm, _f(k.knee_rps, "{:.3g}"), _f(k.step_above_rps, "{:.3g}"), k.status, soaks,
                     _f(k.client_capacity.rps, "{:.3g}"),
                     _f(kv_capacity_tokens(k.deployment) if k.deployment else None, "{:,.0f}"),
                     "; ".join(notes) or "–"])
    B.append(("table", ["arm", "knee (req/s)", "step above (req/s)", "status", "soaks: knee, above",
                        "client capacity (req/s)", "KV capacity (tokens)", "notes"], rows))
    if "baseline" in knees:
        for arm, k in knees.items():
            if arm != "baseline":
                B.append(("p", f"**{arm}**: " + compare_knees(knees["baseline"], k) + "."))
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    for arm in knees:
        src = results / "capacity" / arm / "capacity.png"
        if src.exists():
            shutil.copyfile(src, plots / f"capacity-{arm}.png")
            B.append(("img", f"plots/capacity-{arm}.png", plot_caption(f"capacity-{arm}", arm)))




def _gpu_section(B, cells: list[dict], deps: list[dict]) -> None:
    """GPU telemetry per arm, start-up phases per deployment, memory/KV cost per arm (docs/report.md)."""
    B.append(("h", 2, "GPU, start-up and memory"))
    B.append(("h", 3, "GPU telemetry (NVML, measurement windows)"))
    gpu_cells = [c for c in cells if c.get("gpu_count")]
    if not gpu_cells:
        B.append(("p", "No GPU telemetry (CPU run): no cell recorded NVML or nvidia-smi series."))
    else:
        B.append(("p", "Per GPU: mean = mean over the deployment's GPUs of each GPU's mean over the measurement "
                       "window, then the median over the arm's cells; max = the largest value any GPU reached in "
                       "any of the arm's cells."))
        rows = []
        for (phase, arm), cs in sorted(_group(gpu_cells, ("phase", "arm")).items()):
            rows.append([phase, arm, len(cs), "/".join(sorted({str(c.get("gpu_telemetry_source")) for c in cs})),
                         _f(max(c["gpu_count"] for c in cs), "{:.0f}"),
                         _f(median([c.get("gpu_memory_used_mib_mean") for c in cs]), "{:,.0f}"),
                         _f(max((c.get("gpu_memory_used_mib_max") or 0) for c in cs) or None, "{:,.0f}"),
                         _f(median([c.get("gpu_utilization_pct_mean") for c in cs]), "{:.1f}"),
                         _f(median([c.get("gpu_power_w_mean") for c in cs]), "{:.0f}"),
                         _f(max((c.get("gpu_power_w_max") or 0) for c in cs) or None, "{:.0f}"),
                         _f(median([c.get("gpu_sm_clock_mhz_mean") for c in cs]), "{:.0f}"),
                         _f(max((c.get("gpu_temperature_c_max") or 0) for c in cs) or None, "{:.0f}")])
        B.append(("table", ["phase", "arm", "cells", "source", "GPUs", "memory used MiB (mean)", "memory used MiB (max)",
                            "util % (mean)", "power W (mean)", "power W (max)", "SM clock MHz (mean)",
                            "temperature °C (max)"], rows))

    B.append(("h", 3, "Start-up per deployment"))
    with_startup = [d for d in deps if d.get("startup_total_s") is not None
                    or any(d.get(f"startup_{p}_s") is not None for p in STARTUP_PHASES)]
    if not with_startup:
        B.append(("p", "No start-up phases recorded (no deployment record carries `startup`)."))
    else:
        B.append(("p", "Seconds from our launch to our readiness check, split at the engine's log lines "
                       "(1 s resolution; compile and graph capture are the engine's own figures; docs/deployments.md). "
                       "Cache: the vLLM cache root at launch (cold = empty). Start share / measure share: start-up and "
                       "measured cells as fractions of the deployment's whole time (start to stop)."))
        rows = []
        for d in sorted(with_startup, key=lambda d: (d.get("start_unix") or 0, d.get("deployment_id") or "")):
            rows.append([d.get("deployment_id"), d.get("arm"), d.get("rep"), d.get("startup_cache") or "–",
                         d.get("compile_cache") or "–", _f(d.get("startup_total_s"), "{:.1f}")]
                        + [_f(d.get(f"startup_{p}_s"), "{:.1f}") for p in STARTUP_PHASES]
                        + [_f(d.get("startup_share"), "{:.0%}"), _f(d.get("measuring_share"), "{:.0%}")])
        B.append(("table", ["deployment", "arm", "rep", "cache", "compile cache", "total s"] + list(STARTUP_PHASES)
                  + ["start share", "measure share"], rows))

    B.append(("h", 3, "Memory and KV cost per arm"))
    ok = [d for d in deps if d.get("status") != "failed"]
    if not ok:
        B.append(("p", "No successful deployment."))
        return
    gpu_by_arm = _group(gpu_cells, ("arm",))
    rows = []
    for (arm,), ds in sorted(_group(ok, ("arm",)).items()):
        gc = gpu_by_arm.get((arm,), [])
        rows.append([arm, _f(median([d.get("tensor_parallel_size") for d in ds]), "{:.0f}"),
                     _f(median([d.get("model_loading_gib") for d in ds]), "{:.2f}"),
                     _f(median([d.get("kv_available_gib") for d in ds]), "{:.2f}"),
                     _f(median([d.get("kv_log_tokens") for d in ds]), "{:,.0f}"),
                     _f(median([d.get("kv_cache_tokens") for d in ds]), "{:,.0f}"),
                     _f(max((c.get("gpu_memory_used_mib_max") or 0) for c in gc) or None, "{:,.0f}") if gc
                     else "no GPU telemetry"])
    B.append(("p", "Medians over the arm's deployments: weights loaded (target and, for draft arms, the draft), the "
                   "memory left for the KV cache and its token capacity (engine log; and from /metrics "
                   "cache_config where scraped); NVML: the most memory any GPU used in any of the arm's cells."))
    B.append(("table", ["arm", "TP", "model loading GiB", "available KV GiB", "KV tokens (log)", "KV tokens (metrics)",
                        "GPU memory used MiB (max)"], rows))


def _group(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return out


def _memory_rows(deps: list[dict], mem: dict) -> list[dict]:
    import numpy as np

    by: dict[str, list[dict]] = {}
    for d in deps:
        if d.get("status") != "failed":
            by.setdefault(d["arm"], []).append(d)
    rows = []
    for arm, ds in sorted(by.items()):
        kv = [d["kv_cache_tokens"] for d in ds if d.get("kv_cache_tokens") is not None]
        init = [d["init_seconds"] for d in ds if d.get("init_seconds") is not None]
        rows.append({"arm": arm, "kv_cache_tokens": float(np.median(kv)) if kv else None,
                     "kv_lost": mem.get(arm), "init_s": float(np.median(init)) if init else None})
    return rows


def _with_capacity_half(rec: dict, results: Path, config: dict) -> dict:
    """The confirmation decision with the seed's second half: the pre-registered capacity criteria."""
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
        fc = results / "selection" / "final-candidate.json"
        arm = atomic.read_json(fc).get("arm") if fc.exists() else None
    ev = None
    cap = results / "capacity"
    if crit and arm and (cap / "baseline" / "knee.json").exists() and (cap / arm / "knee.json").exists():
        def steps(a):
            p = cap / a / "steps.jsonl"
            return read_capacity_steps(p) if p.exists() else []

        ev = capacity_criteria.evaluate(crit, read_knee(cap / "baseline" / "knee.json"), read_knee(cap / arm / "knee.json"),
                                        steps("baseline"), steps(arm))
    return capacity_criteria.apply(rec, ev, arm, enabled and crit is not None)


def _capacity_half_blocks(B, rec) -> None:
    half = rec.get("capacity_half") or {}
    ev = half.get("evaluation")
    if half.get("note"):
        second = half["note"]
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
            where = (f"[{_f(iv[0])}, {_f(iv[1])}]" if iv else (f"at {r['matched_rps']:g} req/s" if r.get("matched_rps")
                                                              else "–"))
            rows.append([r["criterion"], _f(r["value"]), where, r["limit"], r["verdict"], r["why"]])
        B.append(("table", ["capacity criterion", "figure", "interval / matched load", "limit", "verdict", "evidence"],
                  rows))


def _recommendation_section(B, rec, deps, s, out: Path) -> dict:
    from specstudy.core import atomic
    from specstudy.deployment.command import recommended_speculative_config, vllm_args_patch
    from specstudy.inference import decision

    r = s["recommendation"]
    rule = rec.get("rule") or {}
    B.append(("p", f"Decision: {rec['decision']}" + (f" — enable {rec['enable']}" if rec.get("enable") else "")
                   + f" (evaluated on the {rec['phase']} phase; gain shown: interval above {1 + rec['min_gain']:.2f}; "
                     f"material regression: {rec['max_regression']:.0%}; "
                   + ("traffic routed by workload" if rec["route_by_workload"]
                      else "single deployment: the declared traffic mixture is evaluated") + ")."))
    _capacity_half_blocks(B, rec)
    stab = rec.get("stability") or {}
    if stab:
        B.append(("p", f"Stability: {decision.format_outcomes(stab)} ({stab.get('resamples', 0)} bootstrap resamples of "
                       f"the {stab.get('rounds', 0)} rounds; the whole rule recomputed on each)."))
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
        B.append(("ul", [f"{u['arm']} {u['what']}: {u['verdict']} [{_f(u['lo'])}, {_f(u['hi'])}] after {u['n']} rounds — "
                         f"{u['why']}; " + (f"≈ {u['extra_repeats']} more round(s)" if u.get("extra_repeats")
                                            else "not settled within 100 more rounds (effect at the margin)")
                         for u in rec["undecided"]]))
    if rec.get("gate_rule"):
        B.append(("p", f"Gate rule: {rec['gate_rule']}"))
    rows = []
    for c in rec["candidates"]:
        if rec["route_by_workload"]:
            detail = "; ".join(f"{w}: {'enable' if v['enable'] else 'no'} ({', '.join(v['statuses'])})"
                               for w, v in c["workloads"].items())
        else:
            detail = "; ".join(f"{k}: {m['verdict']} [{_f(m['lo'])}, {_f(m['hi'])}]" for k, m in c["mixture"].items())
        rows.append([c["arm"], c["gate_verdict"], "yes" if c.get("enable") else "no", detail,
                     "; ".join(c["blockers"]) or "–"])
    B.append(("table", ["candidate", "gate", "enable", "traffic mixture", "blockers"], rows))
    cell_rows = []
    for c in rec["candidates"]:
        for k, j in (c.get("cells") or {}).items():
            cell_rows.append([c["arm"], k, j["n"], _f(j["geomean"]), f"[{_f(j['lo'])}, {_f(j['hi'])}]", j["verdict"],
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


def _decision_evidence_section(B, rec, results: Path) -> None:
    """Rounds run (the checkpoints' records) and the cells that drive the decision's stability."""
    rounds = []
    for p in sorted((results / "confirm" / "rounds").glob("round*.json"), key=lambda p: int(p.stem[5:] or 0)):
        st = _load(p)
        if isinstance(st, dict):
            rounds.append(st)
    if rounds:
        B.append(("p", "Adaptive confirmation — rounds run and why (one checkpoint per round, "
                       "results/confirm/rounds/round<n>.json):"))
        B.append(("table", ["after round", "decision at checkpoint", "next", "why", "stability at checkpoint"],
                  [[st.get("round"), st.get("decision"), "one more round" if st.get("continue") else "stop",
                    st.get("why"), _stab_short(st.get("stability"))] for st in rounds]))
    elif rec.get("phase") == "confirm":
        B.append(("p", "Rounds: no checkpoint records under results/confirm/rounds/ (confirmation not run by the "
                       "workflow)."))
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


def _candidates_section(B, rec, comps, gates, deps, mem, mem_rows):
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
                         f"KV capacity: {_f((memr.get(arm) or {}).get('kv_cache_tokens'), '{:.0f}')} tokens; "
                         f"lost vs baseline: {_f(mem.get(arm), '{:.1%}')}; "
                         f"median init time {_f((memr.get(arm) or {}).get('init_s'), '{:.0f}')} s"]))
        g = gate_by.get((rec["phase"], arm)) or next((gg for (p, a), gg in gate_by.items() if a == arm), None)
        if g:
            B.append(("p", f"Gate ({g['phase']}): {g['verdict']} ({_gate_sizes(g)}); reasons: "
                           f"{g.get('reason_codes') or 'none'}; blocks recommendation: {g.get('blocks_recommendation')}."))
            B.append(("p", f"Control's worst case: {g.get('control_worst') or 'unknown'}"))
            B.append(("p", f"Treatment's worst case: {g.get('treatment_worst') or 'unknown'}"))
        else:
            B.append(("p", "Gate: missing (blocks the recommendation)."))
    B.append(("h", 3, "Confounds of each arm side by side"))
    rows = [[ph, arm] + [_fmt_set(v[k]) for k in CONFOUND_COLS] for (ph, arm), v in sorted(conf.items())]
    B.append(("table", ["phase", "arm", "async scheduling", "max_num_scheduled_tokens", "max_num_batched_tokens",
                        "KV cache tokens", "model runner"], rows))
    pairs = []
    for (ph, arm), v in sorted(conf.items()):
        b = conf.get((ph, "baseline"))
        if arm == "baseline" or not b:
            continue
        diffs = [k for k in CONFOUND_COLS if v[k] != b[k]]
        pairs.append(f"{ph} {arm} vs baseline: differs in {', '.join(diffs) or 'nothing recorded'}")
    B.append(("p", "Every comparison against its baseline (a difference here is part of the measured effect, "
                   "not speculation alone):"))
    B.append(("ul", pairs))


def _selection_section(B, sel):
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


def _corpus_section(B, results: Path):
    B.append(("h", 2, "Workloads: licensing and token lengths"))
    cs = corpora(results)
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
            B.append(("table", ["statistic", "value"], [[k, _f(v, "{:.1f}")] for k, v in flat.items()]))
        else:
            B.append(("p", "Missing: token_stats.json."))


def measured_acceptance(cells: list[dict], k: int, workload: str | None = None) -> dict:
    """vLLM's acceptance rate of the valid draft-model cells of depth ``k`` (ratio of the summed counters)."""
    rows = [c for c in cells if c.get("method") == "draft_model" and c.get("num_speculative_tokens") == k
            and c.get("valid") and c.get("draft_tokens") and (workload is None or c.get("workload") == workload)]
    dt = sum(c["draft_tokens"] for c in rows)
    acc = sum(c.get("accepted_tokens") or 0 for c in rows)
    return {"cells": len(rows), "acceptance_rate": acc / dt if dt else None}


def _heldout_section(B, results: Path, cells: list[dict]) -> dict | None:
    """Acceptance of the fixture draft on held-out text vs the workloads' training text (#16 item 11)."""
    rec = _load(results / "models" / "fixture" / "heldout.json")
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
        return f"{_f((d or {}).get('drop'))} [{_f(ci[0])}, {_f(ci[1])}]"

    if nat_w and nat_h:
        short_h = nat_h.get("answered_fewer_than_2") or 0
        B.append(("p", f"The target's own greedy answers (natural end-of-sequence, at most {rec['max_new_tokens']} "
                       f"tokens): mean {_f(nat_w.get('mean_tokens'), '{:.1f}')} tokens on the workload prompts "
                       f"({nat_w.get('answered_fewer_than_2')} of {nat_w.get('prompts')} shorter than 2 tokens), "
                       f"{_f(nat_h.get('mean_tokens'), '{:.1f}')} on the held-out prompts "
                       f"({short_h} of {nat_h.get('prompts')} shorter than 2 tokens). Acceptance over the natural "
                       "answer is the figure comparable with vLLM's counters; the EOS-suppressed figures compare both "
                       "sets over the same number of tokens per prompt."
                       + (" On held-out text the target mostly ends at once, so only the EOS-suppressed comparison "
                          "measures it." if short_h * 2 > (nat_h.get("prompts") or 0) else "")))
        dn = rec.get("drop_natural") or {}
        if dn:
            B.append(("p", "Over the natural answers: " + "; ".join(
                f"k={k}: training {_f(nat_rate('workloads', k))}, held-out {_f(nat_rate('heldout', k))}, "
                f"drop {drop_ci(dn.get(str(k)))}" for k in rec["k"]) + "."))

    rows = []
    for k in rec["k"]:
        tr, he = sets["workloads"]["by_k"][str(k)], sets["heldout"]["by_k"][str(k)]
        d = rec["drop"].get(str(k)) or {}
        rows.append(["all", k, _f(measured_acceptance(cells, k)["acceptance_rate"]), _f(nat_rate("workloads", k)),
                     _f(tr["acceptance_rate"]), _f(he["acceptance_rate"]), drop_ci(d),
                     _f(tr["mean_acceptance_length"], "{:.2f}"), _f(he["mean_acceptance_length"], "{:.2f}")])
        for st, dd in sorted((d.get("strata") or {}).items()):
            trs, hes = tr["strata"].get(st) or {}, he["strata"].get(st) or {}
            rows.append([st, k, _f(measured_acceptance(cells, k, st)["acceptance_rate"]), _f(nat_rate("workloads", k, st)),
                         _f(trs.get("acceptance_rate")), _f(hes.get("acceptance_rate")), drop_ci(dd),
                         _f(trs.get("mean_acceptance_length"), "{:.2f}"), _f(hes.get("mean_acceptance_length"), "{:.2f}")])
    B.append(("table", ["stratum", "k", "vLLM measured (workloads)", "offline, workloads, natural EOS",
                        "offline, workloads, EOS suppressed", "offline, held-out, EOS suppressed", "drop [95% CI]",
                        "mean acc. length, workloads", "mean acc. length, held-out"], rows))
    if sets["heldout"].get("skipped") or sets["workloads"].get("skipped"):
        B.append(("p", "Skipped (prompt fills max_model_len): "
                       + ", ".join(sets["workloads"]["skipped"] + sets["heldout"]["skipped"])))
    return {"k": rec["k"], "drop": {k: v.get("drop") for k, v in rec["drop"].items()},
            "ci": {k: v.get("ci") for k, v in rec["drop"].items()}}


def _validity_section(B, cells, deps, comps):
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
    B.append(("h", 2, "Unservable configurations (deployment failures)"))
    fails = [d for d in deps if d.get("status") == "failed"]
    B.append(("table", ["phase", "arm", "rep", "deployment", "stage", "reason", "error excerpt"],
              [[d["phase"], d["arm"], d["rep"], d["deployment_id"], d.get("failure_stage") or "–",
                d.get("failure_reason") or "–", (d.get("failure_error_excerpt") or "–")[:200]] for d in fails]))


def _network_section(B, cells, dr):
    B.append(("h", 2, "Gateway/network effects and node-to-node variability"))
    limited = [c for c in cells if c.get("loadgen_limited")]
    B.append(("p", "TTFT and end-to-end latency are measured at the client and include the gateway/network path; "
                   "TPOT and output tokens/s are dominated by the server. The client flagged itself as limited in "
                   f"{len(limited)} cells (those are excluded). Baseline repeat-to-repeat variability (mean SD of "
                   f"log throughput within a workload × concurrency series): {_f(dr.get('baseline_repeat_cv'), '{:.2%}')}."))
    B.append(("table", ["node", "baseline cells", "mean deviation from series mean"],
              [[n["node"], n["n"], _f(n["mean_resid_fraction"], "{:+.2%}")] for n in dr.get("nodes") or []]))


def _drift_section(B, dr):
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
    B.append(("p", f"Baseline throughput trend over {dr['x_unit']}: {_f(dr['total_fraction'], '{:+.2%}')} over the "
                   f"study span (p = {_f(dr['p_value'], '{:.3g}')}, n = {len(dr['points'])}). Drift detected: "
                   f"{'YES' if dr['detected'] else 'no'}. Median |effect| of the comparisons: "
                   f"{_f(dr.get('median_abs_effect_fraction'), '{:.2%}')}; drift/effect = {_f(dr.get('drift_to_effect'), '{:.2f}')}. "
                   "Pairing arm and baseline by rep (interleaved blocks) removes drift between blocks."))


def _model_section(B, model):
    B.append(("h", 2, "Explanatory model"))
    B.append(("p", model["label"] + ". Deployment-level effects; coefficients describe associations in the screened "
                   "design and are not tests of the recommendation."))
    if not model.get("fitted"):
        B.append(("p", f"Not fitted: {model.get('note')}"))
        return
    B.append(("p", f"{model['formula']}; n = {model['n']}, R² = {model['r2']:.3f} (adj. {model['adj_r2']:.3f}); "
                   f"acceptance alone R² = {model['acceptance_only']['r2']:.3f}."))
    B.append(("table", ["term", "coef", "95% CI", "p"],
              [[p["term"], _f(p["coef"], "{:.4f}"), f"[{_f(p['ci_low'], '{:.4f}')}, {_f(p['ci_high'], '{:.4f}')}]",
                _f(p["p"], "{:.3g}")] for p in model["params"]]))


def _method_section(B, s):
    from specstudy.inference import simulate

    a = s["analysis"]
    B.append(("h", 2, "Statistical method"))
    methods = ("t_log", "bootstrap_percentile", "bootstrap_bca")
    cov = simulate.coverage_table(ns=(3, 5), methods=methods, sims=300, seed=7)
    B.append(("p", "The independent unit is the deployment repeat. Arm repeat r is paired with the baseline repeat r "
                   "of the same phase, workload and concurrency. Interval: "
                   f"{a['ci_method']} at {a['confidence']:.0%} on the geometric mean of per-repeat ratios; the bootstrap "
                   "(exact enumeration for n ≤ 6, BCa falling back to percentile) is shown in recommendation.json. "
                   "Simulated coverage of a known effect under four deployment-effect scenarios (300 simulated "
                   "studies for t, 150 for the bootstraps; scenarios: "
                   + "; ".join(f"{k}: {v}" for k, v in simulate.SCENARIOS.items()) + "):"))
    B.append(("table", ["scenario", "repeats", "t interval on log ratios", "percentile bootstrap", "BCa bootstrap"],
              [[r["scenario"], r["n"]] + [_f(r[m], "{:.2f}") for m in methods] for r in cov]))


def _extension_sections(B: list, sections: list[str]) -> None:
    """The opt-in extension phases' own sections (results/<phase>/section.md, config extensions.report),
    after everything above and under their own heading: none of them feeds the recommendation."""
    if not sections:
        return
    B.append(("h", 2, "Extensions (opt-in phases, kept apart: none of them feeds the recommendation above)"))
    for path in sections:
        text = Path(path).read_text(encoding="utf-8")
        # each section starts at level 2; nest it one level under the heading above
        lines = ["#" + line if line.startswith("#") else line for line in text.splitlines()]
        B.append(("md", "\n".join(lines) + f"\n\n*Source: `{path}`*"))


def _cmd_report(args) -> int:
    config = {}
    if args.config:
        p = Path(args.config)
        if not p.exists():
            print(f"{p}: config file not found (pass the resolved config JSON written by the workflow)")
            return 2
        config = json.loads(p.read_text()) if p.suffix == ".json" else __import__("yaml").safe_load(p.read_text())
    summary = build(args.results, args.tables, config, args.out, sections=args.sections)
    rec = summary["recommendation"]
    print(f"report: {Path(args.out) / 'report.md'}; decision: {rec['decision']} {rec.get('enable') or ''}".rstrip())
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="write the study report (Markdown + HTML + plots + recommendation)")
    p.add_argument("--results", default="results")
    p.add_argument("--tables", default="results/tables")
    p.add_argument("--config", default=None, help="resolved study config (JSON or YAML)")
    p.add_argument("--out", default="results/report")
    p.add_argument("--sections", nargs="*", default=[],
                   help="extension phases' sections (results/<phase>/section.md) appended under 'Extensions'")
    p.set_defaults(func=_cmd_report)
