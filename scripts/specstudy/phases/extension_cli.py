"""``specstudy extension gate|summary``: the analysis steps of the extension phases (specstudy.study.extensions).

Both read what ran from the phase's plan and the deployment records (the records name their
artifacts: the sampled capture, the memory sweep, the profile), never by globbing results/, so a
summary covers exactly the planned deployments and lists the ones that failed instead of dropping
them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specstudy.core import atomic
from specstudy.core.errors import UserError
from specstudy.core.records import read_deployment, read_plan
from specstudy.study import extensions


def record_path(results: str | Path, phase: str, arm: str, rep: str) -> Path:
    return Path(results) / phase / arm / rep / "deployment.json"


def cell_path(results: str | Path, phase: str, arm: str, rep: str, workload: str, concurrency: int) -> Path:
    return Path(results) / phase / arm / rep / workload / f"c{int(concurrency)}" / "summary.json"


def planned_files(plan_path: str | Path, results: str | Path = "results") -> dict:
    """The planned deployments of a phase: their record paths, cell paths and the records themselves."""
    plan = read_plan(plan_path)
    deployments = []
    for dep in plan.deployments:
        rec_path = record_path(results, plan.phase, dep.arm, dep.rep)
        rec = read_deployment(rec_path) if rec_path.exists() else None
        deployments.append({"arm": dep.arm, "rep": dep.rep, "record_path": str(rec_path), "record": rec,
                            "cells": [str(cell_path(results, plan.phase, dep.arm, dep.rep, c.workload, c.concurrency))
                                      for c in dep.cells]})
    return {"plan": plan, "deployments": deployments}


def _artifact(dep: dict, name: str) -> str | None:
    rec = dep["record"]
    ext = getattr(rec, "extension", None) if rec is not None else None
    path = getattr(ext, name, None) if ext is not None else None
    return path if path and Path(path).exists() else None


def failed_deployments(files: dict, artifact: str | None = None) -> list[dict]:
    """Planned deployments that produced nothing usable (no record, a failed one, or no ``artifact``)."""
    out = []
    for dep in files["deployments"]:
        rec = dep["record"]
        if rec is None:
            out.append({"arm": dep["arm"], "rep": dep["rep"], "reason": f"no deployment record ({dep['record_path']})"})
        elif rec.status != "ok":
            failure = rec.failure
            out.append({"arm": dep["arm"], "rep": dep["rep"], "deployment_id": rec.deployment_id,
                        "reason": f"deployment failed at {failure.stage if failure else '?'}: "
                                  f"{failure.reason if failure else '?'}"})
        elif artifact and not _artifact(dep, artifact):
            out.append({"arm": dep["arm"], "rep": dep["rep"], "deployment_id": rec.deployment_id,
                        "reason": f"the deployment record names no {artifact} (or the file is gone)"})
    return out


def _captures_of(records: list[str]) -> list[str]:
    caps = []
    for path in records:
        rec = read_deployment(path)
        cap = rec.extension.sampled_capture if rec.extension is not None else None
        if cap and Path(cap).exists():
            caps.append(cap)
        else:
            print(f"note: {path}: no sampled capture ({'status ' + rec.status}); left out of the judge", file=sys.stderr)
    return caps


def judge_arm(baseline_records: list[str], candidate_records: list[str], prereg: str, arm: str, out: str | Path) -> dict:
    """The sampling judge of one arm from deployment records (their sampled captures), written to ``out``."""
    from specstudy.core import schemas
    from specstudy.phases import sampling
    from specstudy.study.prereg import load_sampling_settings

    settings = load_sampling_settings(prereg)  # a missing or bad section names the file and the field
    base = _captures_of(baseline_records)
    cand = _captures_of(candidate_records)
    rec = sampling.judge(base, cand, base, settings, arm=arm, phase="sampling", settings_source=f"{prereg}: sampling")
    schemas.validate(rec, "sampling-gate", str(out))
    atomic.write_json(out, rec)
    print(f"sampling gate {arm}: {rec['verdict']}" + "".join(f"\n  - {r['code']}: {r['detail']}"
                                                             for r in rec.get("reasons", [])))
    return rec


def _cmd_gate(args) -> int:
    judge_arm(args.baseline, args.candidate, args.prereg, args.arm, args.out)
    return 0


def _confirm_cells(results: str | Path) -> list[str]:
    plan = Path(results) / "plan" / "confirm.json"
    if not plan.exists():
        return []
    files = planned_files(plan, results)
    return [c for d in files["deployments"] for c in d["cells"] if Path(c).exists()]


def summarize(phase: str, plan_path: str | Path, cfg: dict, prereg: dict, results: str | Path, out: str | Path,
              prereg_file: str | None = None) -> dict:
    """Summarise one extension phase into ``out/summary.json`` and ``out/section.md`` (the sampling phase:
    also its judges, ``out/gates/<arm>.json``)."""
    files = planned_files(plan_path, results)
    if files["plan"].phase != phase:
        raise UserError(f"{plan_path}: a plan of phase {files['plan'].phase!r}, not {phase!r}; pass results/plan/{phase}.json")
    cells = [c for d in files["deployments"] for c in d["cells"] if Path(c).exists()]
    out = Path(out)
    if phase == "sampling":
        from specstudy.phases import sampling_phase

        # The judge of every speculative arm, here in the summary step: it reads only the planned deployments'
        # records (their captures), and the summary is then never built without the verdicts.
        arms = sorted({d["arm"] for d in files["deployments"] if d["arm"] != "baseline"})
        base = [d["record_path"] for d in files["deployments"] if d["arm"] == "baseline" and d["record"] is not None]
        gates = []
        for arm in arms:
            cand = [d["record_path"] for d in files["deployments"] if d["arm"] == arm and d["record"] is not None]
            gate = out / "gates" / f"{arm}.json"
            judge_arm(base, cand, prereg_file, arm, gate)
            gates.append(str(gate))
        summary = sampling_phase.summarize(gates, cells, _confirm_cells(results), out,
                                           temperature=(prereg.get("sampling") or {}).get("temperature"))
    elif phase == "ignore_eos":
        from specstudy.phases import ignore_eos

        summary = ignore_eos.summarize(cells, _confirm_cells(results),
                                       output_tokens=int(cfg["extensions"]["ignore_eos"]["output_tokens"]),
                                       decision=prereg["confirmation"]["decision"], out_dir=out)
    elif phase == "memory":
        from specstudy.phases import memory

        recs = [_artifact(d, "memory") for d in files["deployments"]]
        knees = {}
        join = (cfg.get("capacity") or {}).get("enabled") and cfg["extensions"]["memory"].get("join_capacity", True)
        for d in files["deployments"]:
            knee = Path(results) / "capacity" / d["arm"] / "knee.json"
            knees[d["arm"]] = str(knee) if join and knee.exists() else None
        summary = memory.summarize([r for r in recs if r], knees, out)
    else:
        from specstudy.phases import profile as profiling

        recs = [_artifact(d, "profile") for d in files["deployments"]]
        summary = profiling.summary([r for r in recs if r], out)
    failed = failed_deployments(files, {"sampling": "sampled_capture", "memory": "memory",
                                        "profile": "profile"}.get(phase))
    if failed:  # never silently dropped: named in the summary and at the top of the section
        summary["failed_deployments"] = failed
        atomic.write_json(out / "summary.json", summary)
        section = out / "section.md"
        lines = section.read_text(encoding="utf-8").splitlines()
        note = ["", f"**{len(failed)} planned deployment(s) produced nothing usable** (not in the figures above):", ""]
        note += [f"- {f['arm']}/{f['rep']}: {f['reason']}" for f in failed]
        atomic.write_text(section, "\n".join(lines + note) + "\n")
    return summary


def _cmd_summary(args) -> int:
    from specstudy.study.config import load_config
    from specstudy.study.prereg import load_prereg

    cfg = load_config(args.config)
    if args.prereg:
        cfg = dict(cfg, study=dict(cfg["study"], preregistration=args.prereg))
    prereg = load_prereg(cfg)
    if args.phase not in extensions.declared(cfg):
        raise UserError(f"{args.config}: field 'extensions.{args.phase}' is missing; declare the phase to summarise it")
    from specstudy.study.prereg import prereg_path

    summarize(args.phase, args.plan, cfg, prereg, args.results, args.out, prereg_file=str(prereg_path(cfg)))
    print(f"{args.phase}: summary -> {args.out}/summary.json, section -> {args.out}/section.md")
    return 0


def register(sub) -> None:
    p = sub.add_parser("extension", help="analysis of the opt-in extension phases (docs/extensions.md)")
    esub = p.add_subparsers(dest="extension_command", required=True)
    g = esub.add_parser("gate", help="the sampling phase's distribution judge of one arm, from deployment records "
                        "(the summary of the phase runs it for every arm)")
    g.add_argument("--baseline", nargs="+", required=True, help="the baseline's sampling deployment records")
    g.add_argument("--candidate", nargs="+", required=True, help="the arm's sampling deployment records")
    g.add_argument("--prereg", required=True, help="the pre-registration (its 'sampling' section)")
    g.add_argument("--arm", required=True)
    g.add_argument("--out", required=True)
    g.set_defaults(func=_cmd_gate)
    s = esub.add_parser("summary", help="summary.json and the report section of one extension phase")
    s.add_argument("--phase", required=True, choices=extensions.PHASES)
    s.add_argument("--plan", required=True, help="results/plan/<phase>.json")
    s.add_argument("--config", required=True, help="the effective study config")
    s.add_argument("--prereg", help="the pre-registration (default: the config's study.preregistration)")
    s.add_argument("--results", default="results")
    s.add_argument("--out", required=True, help="results/<phase>")
    s.set_defaults(func=_cmd_summary)
