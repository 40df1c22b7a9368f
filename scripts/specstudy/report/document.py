"""The study report: Markdown + self-contained HTML (PNG plots referenced), recommendation and patch.

``specstudy report --table-files <the four tables> --selection … --config <resolved config json> --out results/report``
(the workflow names every file; rules/report.smk), or ``specstudy report --results results`` (the same files found
under a results root: :func:`specstudy.report.files.from_root`).

The report is built from the files it is given (:class:`specstudy.report.files.ReportFiles`): the Parquet tables
(:mod:`specstudy.analysis.tables`), a few raw JSON files (selection, rounds, final candidate, corpora, capacity,
deployment records) and the resolved config. Every section works with missing pieces
and says what is missing. Section meanings: docs/report.md.

:func:`build` computes the study's figures once and reads as the report's table of contents; each section
lives in :mod:`specstudy.report.sections` (or beside the figures it explains: :mod:`specstudy.analysis.jit`,
:mod:`specstudy.report.efficiency`, :mod:`specstudy.report.costmodel`, :mod:`specstudy.study.duty`), the
blocks and their renderings in :mod:`specstudy.report.blocks`, the figures in :mod:`specstudy.report.plots`.
"""

from __future__ import annotations

from pathlib import Path

from specstudy.core.records import read_selection
from specstudy.report import model_launch
from specstudy.report.blocks import Block, label_blocks, render_html, render_markdown
from specstudy.report.files import ReportFiles, knee_arms, records_by_phase, rounds_in_order
from specstudy.report.sections.candidates import candidates_section, memory_rows
from specstudy.report.sections.capacity import capacity_section
from specstudy.report.sections.engines import engines_section
from specstudy.report.sections.extensions import extension_sections
from specstudy.report.sections.gpu import gpu_section
from specstudy.report.sections.inputs import corpus_section, heldout_section, selection_check, selection_section
from specstudy.report.sections.method import (
    coverage,
    declared_hypotheses,
    hypotheses_section,
    method_section,
    model_section,
)
from specstudy.report.sections.missing import confirmation_progress, missing_pieces
from specstudy.report.sections.recommendation import (
    decision_evidence_section,
    recommendation_section,
    with_capacity_half,
)
from specstudy.report.sections.results import no_comparisons_reason, plots_section, results_tables
from specstudy.report.sections.validity import drift_section, network_section, validity_section
from specstudy.study.plan import CORE_PHASES


def build(files: ReportFiles, config: dict | None, out: str | Path) -> dict:
    """Compute everything from ``files`` and write report.md, report.html, plots/, recommendation.json, the
    vLLM argument patches and the model-launch pull request (:mod:`specstudy.report.model_launch`)."""
    from specstudy.analysis import jit
    from specstudy.analysis.tables import read_table_files
    from specstudy.core import atomic
    from specstudy.inference import stats
    from specstudy.inference.decision import recommend
    from specstudy.inputs.scale_model import LABEL, report_note
    from specstudy.report import costmodel, efficiency
    from specstudy.study import duty
    from specstudy.study.prereg import load_prereg

    out = Path(out)
    config = config or {}
    # --- the figures every section reads
    s = stats.settings(config)
    t = read_table_files(files.tables)
    cells = stats._records(t["cells"])
    deps = stats._records(t["deployments"])
    gates = stats._records(t["gates"])
    comps = stats.comparisons(t["cells"], config)
    phases_present = sorted({c["phase"] for c in cells})
    prereg = load_prereg(config) if (config.get("study") or {}).get("preregistration") else None
    rec = with_capacity_half(recommend(comps, gates, config, prereg), files, config)
    # the rule knows only the comparisons; what was left out of them, and why, comes from the cells
    why = no_comparisons_reason(rec["phase"], cells, comps)
    if why:
        rec["missing"] = [why if m.startswith(f"no {rec['phase']} comparisons") else m for m in rec["missing"]]
    progress = confirmation_progress(cells, rec.get("rule"))
    missing = missing_pieces(files, config, cells, gates, progress, (rec.get("capacity_half") or {}).get("arm"))
    model = stats.explanatory_model([c for c in comps if c["phase"] == s["analysis"]["hypothesis_phase"]] or comps)
    model["phase"] = s["analysis"]["hypothesis_phase"]
    declared, hyp_source = declared_hypotheses(config)
    if declared is None:
        missing.append("no pre-registration in the config (study.preregistration): hypotheses not evaluated")
    hyps = stats.hypotheses(comps, t["deployments"], declared, model)
    dr = stats.drift(t["cells"], t["deployments"], comps, config)
    mem = stats.memory_costs(t["deployments"])
    sel = selection_check(read_selection(files.selection) if files.selection is not None else None)
    if not sel["present"]:
        missing.append("no selection (results/selection/selection.json)")
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)  # a declared output directory of the report rule, even when empty
    mem_rows = memory_rows(deps, mem)

    # --- the report, in order
    B: list[Block] = []
    scale = report_note(config, files.scale)  # the scale-model study labels its report (issue 27)
    B.append(("h", 1, "Speculative decoding study report" + (f" ({LABEL})" if scale else "")))
    if scale:
        B.append(("p", scale))
    B.append(("p", f"Built from {files.tables_dir} (tables rebuilt from raw artifacts under {files.results_root}). "
                   f"Phases present: {', '.join(phases_present) or 'none'}. Section meanings: docs/report.md."))
    B.append(("h", 2, "Recommendation"))
    patches = recommendation_section(B, rec, deps, s, out, progress)
    launch = model_launch.write(out, rec, comps, deps, config)
    B.append(("p", f"model-launch pull request ({model_launch.PR_FILE}): "
                   + (f"{model_launch.PATCH_FILE} sets {launch['arm']} in {launch['example']['path']} at "
                      f"{launch['example']['repository']}@{launch['example']['commit'][:12]}." if launch["patch"]
                      else f"nothing proposed ({launch['why']}); {model_launch.PATCH_FILE} is empty.")))
    decision_evidence_section(B, rec, rounds_in_order(files))
    B.append(("h", 2, "Missing pieces"))
    B.append(("ul", missing or ["nothing: all inputs present"]))
    cov = coverage(comps)  # one coverage simulation: judged beside the results' intervals, shown in the method
    results_tables(B, comps, s, cells, cov)
    engines = stats.engine_effects(t["cells"], config, comps, list(config.get("engines") or {}))
    engines_section(B, engines, {k: v.get("label") for k, v in (config.get("engines") or {}).items()}, s)
    plots_section(B, plots, rec, comps, cells, mem_rows, t["requests"], dr)
    candidates_section(B, rec, comps, gates, deps, mem, mem_rows)
    selection_section(B, sel)
    corpus_section(B, list(files.corpora))
    heldout = heldout_section(B, files.heldout, cells)
    validity_section(B, cells, deps, comps)
    jit.report_section(B, cells, [r for ph in CORE_PHASES for r in records_by_phase(files).get(ph, [])])
    gpu_section(B, cells, deps)
    energy = efficiency.energy_section(B, cells)
    interactivity = efficiency.interactivity_section(B, cells, plots, deps)
    network_section(B, cells, dr)
    drift_section(B, dr)
    model_section(B, model)
    cost = costmodel.report_section(B, cells, deps, (files.mechanics, files.profile), comps)
    hypotheses_section(B, declared, hyp_source, hyps)
    method_section(B, s, cov)
    capacity_section(B, knee_arms(files), out)
    duty_rows = duty.report_section(B, duty.read_records(records_by_phase(files)))
    extension_sections(B, list(files.sections))

    if scale:  # every heading, table and figure of the scale-model study says so (docs/gpu.md)
        B = label_blocks(B, LABEL)

    # --- written
    atomic.write_text(out / "report.md", render_markdown(B))
    atomic.write_text(out / "report.html", render_html(B, "specstudy report" + (f" ({LABEL})" if scale else "")))
    summary = {"recommendation": rec, "hypotheses": hyps, "drift": {k: v for k, v in dr.items() if k != "points"},
               "selection": sel, "missing": missing, "confirmation_progress": progress, "patches": patches,
               "model_launch": launch,
               "model": model, "comparisons": comps, "memory_costs": mem, "duty_cycle": duty_rows,
               "fixture_heldout": heldout, "energy": energy, "interactivity": interactivity,
               "cost_model": cost, **({"engine_builds": engines} if engines else {})}
    atomic.write_json(out / "recommendation.json", summary)
    return summary
