"""The opt-in sampling phase (temperature > 0; docs/sampling.md): its deployment step, summary and report section.

Registered as the ``sampling`` phase (:mod:`specstudy.phases.registry`; its declaration and design are
:data:`specstudy.study.phase_decl.DECLS`): a deployment runs one sampled capture after its smoke captures
(:mod:`specstudy.phases.sampling_capture`), then its cells at the pre-registered temperature; the phase's
summary first judges every speculative arm from the planned deployments' captures
(:mod:`specstudy.phases.sampling_judge`, ``results/sampling/gates/<arm>.json``), so the section is never
built without its verdicts.

:func:`summarize` reads the phase's verdicts (``sampling-gate`` records, :func:`specstudy.phases.sampling_judge.judge`),
its cell summaries (``results/sampling/<arm>/<rep>/<workload>/c<c>/summary.json``, ``keys.phase ==
"sampling"``) and the greedy confirmation cell summaries (``keys.phase == "confirm"``), and writes
``summary.json`` (schema ``sampling-summary``) and ``section.md`` (the report section "Sampling (temperature T)"):

* per arm, the verdict, its reasons and per statistic the treatment and control means, the effect, the
  margin, the p-value and the corrected alpha;
* per arm x workload x concurrency the median over deployments of TPOT p50 and of output tokens/s, and
  their ratio to the baseline's median at the same temperature (arm median / baseline median, same
  workload and concurrency), beside the same figures from the greedy confirmation cells. Only valid cells
  count; every cell (or figure) left out is listed with its reason codes.

The sampling results are kept apart from the greedy study and never pooled with it: the two sets of
figures are shown side by side, each against its own baseline, and nothing here feeds the decision.

CLI: ``specstudy phase summary sampling`` and ``specstudy phase sampling capture | judge`` (the judge's file
options are the gate judge's, :func:`specstudy.analysis.gate_cli.add_judge_inputs`). Imports ``core``,
``study``, ``inputs.corpus``, ``analysis.gate_cli`` and the phases' registry, capture and judge.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from specstudy.core import atomic, records, schemas
from specstudy.core.capture_file import corpus_ref
from specstudy.core.stat_util import median
from specstudy.phases.registry import Phase, register_phase
from specstudy.phases.sampling_judge import STATISTICS, SamplingInputError

SUMMARY_SCHEMA = "specstudy.sampling-summary/1"
SAMPLED_PHASE = "sampling"
GREEDY_PHASE = "confirm"
NOT_POOLED = ("The sampling phase's results are kept apart from the greedy (temperature 0) study and never pooled "
              "with it: its verdicts and figures feed neither the selection, the confirmation decision nor the "
              "recommendation's effect estimates. Greedy figures are shown beside them for reference only; each "
              "ratio is against the baseline of its own phase.")
PASS_MEANS = "no material distribution shift detected; not a proof"
DEFINITIONS = {
    "tpot_p50_ms": "median over the arm's valid deployments (cells) of the cell's TPOT p50 (ms)",
    "output_tokens_per_second": "median over the arm's valid deployments (cells) of the cell's output tokens/s",
    "ratio_to_baseline": "the arm's median / the baseline's median in the same phase, workload and concurrency "
                         "(TPOT: < 1 is faster; tokens/s: > 1 is faster); null for the baseline itself or when "
                         "either median is missing",
    "excluded": "a cell that is not valid (validity.valid false) is left out whole; a valid cell whose TPOT "
                "(validity.tpot_valid, else throughput_valid) or throughput (validity.throughput_valid) is not "
                "valid, or has no value, is left out of that figure only; a drift baseline deployment (kind "
                "drift) is left out as in the study's comparisons",
}


# --------------------------------------------------------------------------- reading


def _read_cells(paths, phase: str, role: str) -> list[tuple[str, records.CellSummary]]:
    out = []
    for p in paths or []:
        cell = records.read_cell_summary(p)
        if cell.keys.phase != phase:
            raise SamplingInputError(f"{p}: field 'keys.phase' is {cell.keys.phase!r}; the {role} cell summaries "
                                     f"must be of phase {phase!r} (pass sampling cells to --cells and confirmation "
                                     "cells to --greedy-cells)")
        out.append((str(p), cell))
    return out


def _read_gates(paths) -> list[tuple[str, records.SamplingGateRecord]]:
    out, seen = [], {}
    for p in paths or []:
        rec = records.read_sampling_gate(p)
        if rec.arm in seen:
            raise SamplingInputError(f"{p}: field 'arm' is {rec.arm!r}, already judged in {seen[rec.arm]}; pass one "
                                     "sampling gate record per arm")
        seen[rec.arm] = p
        out.append((str(p), rec))
    return out


# --------------------------------------------------------------------------- verdicts


def _verdict_row(path: str, g: records.SamplingGateRecord) -> dict:
    checks = []
    for c in g.checks:
        if c.name not in STATISTICS:
            continue
        checks.append({"name": c.name, "test": c.test, "treatment_mean": c.treatment.mean if c.treatment else None,
                       "control_mean": c.control.mean if c.control else None, "effect": c.effect,
                       "margin": c.margin, "p_value": c.p_value, "alpha": c.alpha, "significant": c.significant,
                       "material": c.material, "passed": c.passed})
    succeeded = next((c.passed for c in g.checks if c.name == "all_requests_succeeded"), None)
    return {"arm": g.arm, "verdict": g.verdict, "blocks_recommendation": g.blocks_recommendation,
            "reasons": [{"code": r.code, "detail": r.detail} for r in g.reasons], "claim": g.claim,
            "unit": g.unit, "n_prompts": g.n_prompts, "all_requests_succeeded": succeeded,
            "temperature": (g.settings or {}).get("temperature"), "checks": checks, "source": path}


# --------------------------------------------------------------------------- performance


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not (a > 0 and b > 0):
        return None
    return a / b


def _figures(cells: list[tuple[str, records.CellSummary]], source: str, excluded: list[dict]) -> dict:
    """(arm, workload, concurrency) -> {tpot: [...], tps: [...], deployments: set}; exclusions appended."""
    acc: dict[tuple, dict] = {}

    def exclude(path, cell, scope, reasons):
        k = cell.keys
        excluded.append({"source": source, "path": path, "arm": k.arm, "workload": k.workload,
                         "concurrency": k.concurrency, "rep": k.rep_label or k.rep, "deployment_id": k.deployment_id,
                         "scope": scope, "codes": [r["code"] for r in reasons],
                         "detail": "; ".join(r["detail"] for r in reasons)})

    for path, cell in cells:
        k, v = cell.keys, cell.validity
        if (k.kind or "repeat") == "drift":
            exclude(path, cell, "cell", [{"code": "drift_baseline", "detail": "an interleaved drift baseline "
                                          "deployment: used for the drift analysis only, never compared with arms"}])
            continue
        if not v.valid:
            exclude(path, cell, "cell", [{"code": r.code, "detail": r.detail} for r in v.reasons]
                    or [{"code": "invalid", "detail": "validity.valid is false"}])
            continue
        slot = acc.setdefault((k.arm, k.workload, k.concurrency), {"tpot": [], "tps": [], "deployments": set()})
        slot["deployments"].add(k.deployment_id or path)
        codes = [{"code": r.code, "detail": r.detail} for r in v.reasons]
        tpot_ok = v.tpot_valid if v.tpot_valid is not None else v.throughput_valid
        tpot = cell.latency_ms.get("tpot")
        tpot_p50 = tpot.p50 if tpot is not None else None
        if not tpot_ok:
            exclude(path, cell, "tpot", codes or [{"code": "tpot_invalid", "detail": "validity.tpot_valid is false"}])
        elif tpot_p50 is None or not math.isfinite(tpot_p50):
            exclude(path, cell, "tpot", [{"code": "no_value", "detail": "latency_ms.tpot.p50 is null"}])
        else:
            slot["tpot"].append(float(tpot_p50))
        tps = cell.tokens.output_tokens_per_second
        if not v.throughput_valid:
            exclude(path, cell, "throughput", codes or [{"code": "throughput_invalid",
                                                        "detail": "validity.throughput_valid is false"}])
        elif tps is None or not math.isfinite(tps):
            exclude(path, cell, "throughput", [{"code": "no_value",
                                                "detail": "tokens.output_tokens_per_second is null"}])
        else:
            slot["tps"].append(float(tps))
    return acc


def _side(acc: dict, arm: str, workload: str, concurrency: int) -> dict:
    slot = acc.get((arm, workload, concurrency)) or {"tpot": [], "tps": [], "deployments": set()}
    base = acc.get(("baseline", workload, concurrency)) or {"tpot": [], "tps": []}
    tpot, tps = median(slot["tpot"]), median(slot["tps"])
    is_base = arm == "baseline"
    return {"n_deployments": len(slot["deployments"]), "n_tpot": len(slot["tpot"]), "n_throughput": len(slot["tps"]),
            "tpot_p50_ms": tpot, "output_tokens_per_second": tps,
            "tpot_ratio_to_baseline": None if is_base else _ratio(tpot, median(base["tpot"])),
            "throughput_ratio_to_baseline": None if is_base else _ratio(tps, median(base["tps"]))}


def _arm_order(arm: str) -> tuple:
    return (arm != "baseline", arm)


# --------------------------------------------------------------------------- summary


def summarize(gates: list, cells: list, greedy_cells: list, out_dir: str | os.PathLike, *,
              temperature: float | None = None) -> dict:
    """Write ``out_dir/summary.json`` and ``out_dir/section.md`` (the report section); return the summary.

    ``gates``: sampling gate records (one per speculative arm); ``cells``: the sampling phase's cell
    summaries; ``greedy_cells``: the confirmation phase's cell summaries. ``temperature`` names the section
    when no gate record carries it (the gates' ``settings.temperature`` otherwise; they must agree).
    """
    gate_recs = _read_gates(gates)
    sampled = _read_cells(cells, SAMPLED_PHASE, "sampling")
    greedy = _read_cells(greedy_cells, GREEDY_PHASE, "greedy (confirmation)")
    temps = {t for t in ((g.settings or {}).get("temperature") for _, g in gate_recs) if t is not None}
    if len(temps) > 1:
        raise SamplingInputError(f"sampling gate records disagree on field 'settings.temperature' ({sorted(temps)}); "
                                 "judge every arm with the same pre-registration")
    temp = temps.pop() if temps else temperature

    excluded: list[dict] = []
    s_acc = _figures(sampled, SAMPLED_PHASE, excluded)
    g_acc = _figures(greedy, GREEDY_PHASE, excluded)
    # rows: every configuration the sampling phase measured (valid or not); greedy figures beside them
    keys = sorted({(c.keys.arm, c.keys.workload, c.keys.concurrency) for _, c in sampled},
                  key=lambda k: (k[1], k[2], _arm_order(k[0])))
    rows = [{"arm": a, "workload": w, "concurrency": c, "sampled": _side(s_acc, a, w, c),
             "greedy": _side(g_acc, a, w, c)} for a, w, c in keys]
    shown = set(keys)
    greedy_not_shown = sorted({(c.keys.arm, c.keys.workload, c.keys.concurrency) for _, c in greedy} - shown)
    summary = {
        "schema": SUMMARY_SCHEMA,
        "phase": SAMPLED_PHASE,
        "temperature": temp,
        "never_pooled": NOT_POOLED,
        "pass_means": PASS_MEANS,
        "verdicts": sorted((_verdict_row(p, g) for p, g in gate_recs), key=lambda r: _arm_order(r["arm"] or "")),
        "performance": rows,
        "excluded": excluded,
        "greedy_configurations_not_in_sampling": [{"arm": a, "workload": w, "concurrency": c}
                                                  for a, w, c in greedy_not_shown],
        "inputs": {"gates": [p for p, _ in gate_recs], "cells": [p for p, _ in sampled],
                   "greedy_cells": [p for p, _ in greedy]},
        "definitions": DEFINITIONS,
    }
    out = Path(out_dir)
    schemas.validate(summary, "sampling-summary", str(out / "summary.json"))
    atomic.write_json(out / "summary.json", summary)
    atomic.write_text(out / "section.md", markdown(summary))
    return summary


# --------------------------------------------------------------------------- markdown


def _f(v: Any, nd: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != 0 and (abs(v) < 10 ** -nd or abs(v) >= 1e6):
            return f"{v:.{nd}g}"
        return f"{v:.{nd}f}"
    return str(v)


def _cell(text: Any) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def markdown(summary: dict) -> str:
    temp = summary["temperature"]
    title = f"Sampling (temperature {temp:g})" if temp is not None else "Sampling (temperature > 0)"
    lines = [f"## {title}", "",
             f"**Kept apart from the greedy study.** {summary['never_pooled']}", "",
             f"A `pass` means: {summary['pass_means']}. A `fail` blocks the recommendation until explained. "
             "`no_verdict` is never a pass.", "",
             "### Verdicts", ""]
    if not summary["verdicts"]:
        lines += ["No sampling gate record was supplied: no arm has a sampling verdict.", ""]
    for v in summary["verdicts"]:
        lines.append(f"- **{v['arm']}: {v['verdict']}** ({v['n_prompts']} prompts, token statistic over "
                     f"{'token ids' if v['unit'] == 'token_id' else 'words'}; all requests succeeded: "
                     f"{_f(v['all_requests_succeeded'])}). {v['claim']}")
        for r in v["reasons"]:
            lines.append(f"  - `{r['code']}`: {_cell(r['detail'])}")
    rows = [(v["arm"], c) for v in summary["verdicts"] for c in v["checks"]]
    if rows:
        lines += ["", "| arm | statistic | treatment mean | control mean | effect | margin | p-value | corrected alpha "
                  "| significant | material | passed |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for arm, c in rows:
            lines.append(f"| {arm} | {c['name']} | {_f(c['treatment_mean'], 4)} | {_f(c['control_mean'], 4)} | "
                         f"{_f(c['effect'], 4)} | {_f(c['margin'], 4)} | {_f(c['p_value'], 3)} | {_f(c['alpha'], 4)} | "
                         f"{_f(c['significant'])} | {_f(c['material'])} | {_f(c['passed'])} |")
        lines += ["", "Effect: treatment mean − control mean for `length_difference` and `token_tvd`, control mean − "
                  "treatment mean for `text_similarity` (positive = the candidate diverges more). A statistic fails "
                  "only when p < corrected alpha and effect > margin."]
    lines += ["", "### Performance at this temperature beside greedy", "",
              "Median over deployments (valid cells only). Ratio = arm median / baseline median of the same phase, "
              "workload and concurrency (TPOT: < 1 is faster; tokens/s: > 1 is faster). The greedy columns are the "
              "confirmation phase's cells, for reference; nothing is pooled.", ""]
    perf = summary["performance"]
    if not perf:
        lines += ["No sampling-phase cell summary was supplied.", ""]
    else:
        lines += ["| workload | c | arm | n (sampled) | TPOT p50 ms | TPOT / baseline | out tok/s | tok/s / baseline "
                  "| n (greedy) | greedy TPOT p50 ms | greedy TPOT / baseline | greedy out tok/s | "
                  "greedy tok/s / baseline |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in perf:
            s, g = r["sampled"], r["greedy"]
            lines.append(f"| {r['workload']} | {r['concurrency']} | {r['arm']} | {s['n_deployments']} | "
                         f"{_f(s['tpot_p50_ms'], 2)} | {_f(s['tpot_ratio_to_baseline'], 3)} | "
                         f"{_f(s['output_tokens_per_second'], 1)} | {_f(s['throughput_ratio_to_baseline'], 3)} | "
                         f"{g['n_deployments']} | {_f(g['tpot_p50_ms'], 2)} | {_f(g['tpot_ratio_to_baseline'], 3)} | "
                         f"{_f(g['output_tokens_per_second'], 1)} | {_f(g['throughput_ratio_to_baseline'], 3)} |")
    exc = summary["excluded"]
    lines += ["", "### Excluded cells and figures", ""]
    if not exc:
        lines.append("None: every supplied cell counted.")
    else:
        lines += ["| phase | arm | rep | workload | c | deployment | left out | reason codes | detail |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for e in exc:
            lines.append(f"| {e['source']} | {e['arm']} | {e['rep']} | {e['workload']} | {e['concurrency']} | "
                         f"{e['deployment_id'] or '—'} | {e['scope']} | {', '.join(e['codes'])} | "
                         f"{_cell(e['detail'])[:200]} |")
    if summary["greedy_configurations_not_in_sampling"]:
        n = len(summary["greedy_configurations_not_in_sampling"])
        lines += ["", f"{n} greedy configuration(s) (arm x workload x concurrency) were not measured in the sampling "
                  "phase and are not shown (listed in summary.json)."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the judge from deployment records


def _one_line(exc: Exception) -> str:
    return str(exc).replace(":\n  - ", ": ").replace("\n  - ", "; ").replace("\n", " ")


def captures_of(paths: list[str]) -> list[str]:
    """Sampled captures from ``paths``: a deployment record stands for the capture it names (one without a
    capture is left out, with a note); any other file is taken as a capture."""
    import sys

    from specstudy.core.capture_file import is_deployment_record, read_capture_json

    caps = []
    for path in paths:
        if not is_deployment_record(read_capture_json(path, SamplingInputError)):
            caps.append(path)
            continue
        rec = records.read_deployment(path)
        cap = rec.extension.sampled_capture if rec.extension is not None else None
        if cap and Path(cap).exists():
            caps.append(cap)
        else:
            print(f"note: {path}: no sampled capture ({'status ' + rec.status}); left out of the judge", file=sys.stderr)
    return caps


def judge_arm(baseline: list[str], candidate: list[str], prereg: str, arm: str, out: str | Path, *,
              control: list[str] | None = None, phase: str = SAMPLED_PHASE) -> dict:
    """The sampling judge of one arm, written to ``out``. ``baseline``, ``candidate``, ``control`` (default: the
    baseline): sampled captures or the deployment records that name them."""
    from specstudy.phases.sampling_judge import judge
    from specstudy.study.config import ConfigError
    from specstudy.study.prereg import load_sampling_settings

    try:  # a missing or bad section names the file and the field, on one line
        settings = load_sampling_settings(prereg)
    except SamplingInputError as exc:
        raise SamplingInputError(_one_line(exc)) from None
    except ConfigError as exc:
        raise ConfigError(_one_line(exc)) from None
    base = captures_of(baseline)
    rec = judge(base, captures_of(candidate), captures_of(control) if control else base, settings, arm=arm,
                phase=phase, settings_source=str(prereg))
    schemas.validate(rec, "sampling-gate", str(out))
    atomic.write_json(out, rec)
    return rec


# --------------------------------------------------------------------------- the phase


@register_phase
class SamplingPhase(Phase):
    name = "sampling"

    def spec_extras(self, design: dict, dirs: dict[str, str]) -> dict:
        cap = design.get("capture")
        return {"sampled_capture": dict(cap, corpus_dir=dirs[cap["workload"]])} if cap else {}

    def after_smoke(self, job) -> None:
        """Every capture prompt x every pre-registered seed at the sampling temperature."""
        sc = job.spec.get("sampled_capture")
        if not sc:
            return
        from specstudy.inputs import corpus as corpusmod
        from specstudy.phases.sampling_capture import capture_sampled

        job.stage = "sampled_capture"
        prompts = corpusmod.load_prompts(sc["corpus_dir"])[: int(sc["prompts"])]
        corpus = corpus_ref(atomic.read_json(Path(sc["corpus_dir"]) / "corpus.json"))
        path = job.attempt / "sampling" / "capture.json"
        job.progress.phase("sampled_capture", f"{len(prompts)} prompts x {len(sc['seeds'])} seeds")
        capture_sampled(job.server.base_url, job.served, prompts, path, seeds=list(sc["seeds"]),
                        temperature=float(sc["temperature"]), top_p=float(sc["top_p"]),
                        concurrency=int(sc["concurrency"]), deployment_id=job.deployment_id,
                        arm=job.arm["name"], corpus=corpus, api_key=job.eng.get("api_key"),
                        request_timeout_s=float(job.settings.get("request_timeout_s", 600)))
        job.progress.end_phase()
        job.extension["sampled_capture"] = str(path)

    def summarize(self, run) -> dict:
        # The judge of every speculative arm, here in the summary step: it reads only the planned deployments'
        # records (their captures), and the summary is then never built without the verdicts.
        arms = sorted({d["arm"] for d in run.deployments if d["arm"] != "baseline"})
        base = [d["record_path"] for d in run.deployments if d["arm"] == "baseline" and d["record"] is not None]
        gates = []
        for arm in arms:
            cand = [d["record_path"] for d in run.deployments if d["arm"] == arm and d["record"] is not None]
            gate = run.out / "gates" / f"{arm}.json"
            rec = judge_arm(base, cand, run.prereg_file, arm, gate)
            print(f"sampling gate {arm}: {rec['verdict']}" + "".join(f"\n  - {r['code']}: {r['detail']}"
                                                                     for r in rec.get("reasons", [])))
            gates.append(str(gate))
        return summarize(gates, run.cells, run.confirm_cells(), run.out,
                         temperature=(run.prereg.get("sampling") or {}).get("temperature"))

    def add_tools(self, sub) -> None:
        k = sub.add_parser("capture", help="sampled capture (every prompt x every pre-registered seed) against a server")
        k.add_argument("--base-url", required=True)
        k.add_argument("--model", required=True, help="served model name")
        k.add_argument("--prompts", required=True, help="prompts.jsonl (rows with prompt_id, messages, max_tokens)")
        k.add_argument("--corpus", help="corpus.json (name, version, digest)")
        k.add_argument("--limit", type=int, default=0, help="use only the first N prompts")
        k.add_argument("--prereg", required=True, help="pre-registration YAML (its sampling section)")
        k.add_argument("--concurrency", type=int, default=1)
        k.add_argument("--deployment-id", required=True)
        k.add_argument("--arm", required=True)
        k.add_argument("--capture-index", type=int, default=1)
        k.add_argument("--api-key-env", help="name of the environment variable holding the API key")
        k.add_argument("--out", required=True)
        k.set_defaults(func=_cmd_capture)

        from specstudy.analysis.gate_cli import add_judge_inputs

        j = sub.add_parser("judge", help="judge a speculative arm's sampled outputs against a baseline-vs-baseline "
                           "control (the phase's summary runs it for every arm)")
        add_judge_inputs(j, baseline="baseline sampled captures, or the deployment records naming them",
                         candidate="the arm's sampled captures, or its deployment records",
                         control="control captures (two or more baseline deployments); default: the baseline ones")
        j.add_argument("--prereg", required=True, help="pre-registration YAML (its sampling section)")
        j.add_argument("--arm", required=True, help="name of the speculative arm")
        j.add_argument("--phase", default=SAMPLED_PHASE, help="recorded phase (default: sampling)")
        j.add_argument("--out", required=True, help="sampling gate record to write")
        j.set_defaults(func=_cmd_judge)


def _cmd_judge(args) -> int:
    rec = judge_arm(args.baseline, args.candidate, args.prereg, args.arm, args.out, control=args.control,
                    phase=args.phase)
    why = "; ".join(r["code"] for r in rec["reasons"])
    print(f"sampling {rec['arm']}: {rec['verdict']}" + (f" ({why})" if why else "") + f" -> {args.out}")
    return 0


def _cmd_capture(args) -> int:
    from specstudy.phases.sampling_capture import capture_sampled
    from specstudy.study.prereg import load_sampling_settings

    try:
        settings = load_sampling_settings(args.prereg)
    except SamplingInputError as exc:
        raise SamplingInputError(_one_line(exc)) from None
    prompts = atomic.read_jsonl(args.prompts)
    if args.limit:
        prompts = prompts[: args.limit]
    corpus = (atomic.read_json(args.corpus) if args.corpus else
              {"name": Path(args.prompts).parent.parent.name, "version": Path(args.prompts).parent.name, "digest": None})
    seeds = [settings["seeds"]["base"] + i for i in range(settings["seeds"]["per_prompt"])]
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    rec = capture_sampled(args.base_url, args.model, prompts, args.out, seeds=seeds,
                          temperature=settings["temperature"], top_p=settings["top_p"], concurrency=args.concurrency,
                          deployment_id=args.deployment_id, arm=args.arm, corpus=corpus,
                          capture_index=args.capture_index, api_key=api_key)
    ok = sum(r["success"] for r in rec["prompts"])
    print(f"sampled capture: {ok}/{len(rec['prompts'])} requests succeeded -> {args.out}")
    return 0
