"""A phase's summary step: what ran (its plan and the deployment records) -> the phase's summary and section.

:func:`summarize` reads what ran from the phase's plan and the deployment records (the records name their
artifacts: the sampled capture, the memory sweep, the profile), never by globbing results/, so a summary
covers exactly the planned deployments; it hands a :class:`PhaseRun` to the phase's registered
:meth:`~specstudy.phases.registry.Phase.summarize` and then names, in the summary and at the top of the
section, every planned deployment that produced nothing usable instead of dropping it.

Imports ``core``, ``study`` and :mod:`specstudy.phases.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specstudy.core import atomic, layout
from specstudy.core.errors import UserError
from specstudy.core.records import read_deployment, read_plan
from specstudy.phases import registry
from specstudy.study.phase_decl import DECLS

__all__ = ["PhaseRun", "failed_deployments", "planned_files", "summarize"]


def planned_files(plan_path: str | Path, results: str | Path = "results") -> dict:
    """The planned deployments of a phase: their record paths, cell paths and the records themselves."""
    plan = read_plan(plan_path)
    deployments = []
    for dep in plan.deployments:
        rec_path = Path(layout.deployment_record(plan.phase, dep.arm, dep.rep, root=Path(results)))
        rec = read_deployment(rec_path) if rec_path.exists() else None
        deployments.append({"arm": dep.arm, "rep": dep.rep, "record_path": str(rec_path), "record": rec,
                            "cells": [layout.cell_summary(plan.phase, dep.arm, dep.rep, c.workload, c.concurrency, root=Path(results))
                                      for c in dep.cells]})
    return {"plan": plan, "deployments": deployments}


def artifact(dep: dict, name: str) -> str | None:
    """The file a planned deployment's record names as its ``extension.<name>``, if it exists."""
    rec = dep["record"]
    ext = getattr(rec, "extension", None) if rec is not None else None
    path = getattr(ext, name, None) if ext is not None else None
    return path if path and Path(path).exists() else None


def failed_deployments(files: dict, artifact_name: str | None = None) -> list[dict]:
    """Planned deployments that produced nothing usable (no record, a failed one, or no ``artifact_name``)."""
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
        elif artifact_name and not artifact(dep, artifact_name):
            out.append({"arm": dep["arm"], "rep": dep["rep"], "deployment_id": rec.deployment_id,
                        "reason": f"the deployment record names no {artifact_name} (or the file is gone)"})
    return out


@dataclass
class PhaseRun:
    """What a phase's summary reads: its planned deployments (``files``: :func:`planned_files`), the cells that
    exist, the study config and pre-registration, and where the summary goes (``out``)."""

    phase: str
    files: dict
    cells: list[str]
    cfg: dict
    prereg: dict
    prereg_file: str | None
    results: Path
    out: Path

    @property
    def deployments(self) -> list[dict]:
        return self.files["deployments"]

    def artifacts(self, name: str) -> list[str]:
        """The existing ``extension.<name>`` files of the planned deployments, in plan order."""
        return [a for a in (artifact(d, name) for d in self.deployments) if a]

    def confirm_cells(self) -> list[str]:
        """The confirmation plan's existing cells (greedy, natural EOS): shown beside a phase, never pooled."""
        plan = Path(layout.plan("confirm", self.results))
        if not plan.exists():
            return []
        files = planned_files(plan, self.results)
        return [c for d in files["deployments"] for c in d["cells"] if Path(c).exists()]

    def knee(self, arm: str) -> str | None:
        """The arm's capacity knee when the phase's declaration joins the knees and the file exists."""
        if "knees" not in DECLS[self.phase].joins(self.cfg):
            return None
        path = Path(layout.capacity_knee(arm, self.results))
        return str(path) if path.exists() else None


def summarize(phase: str, plan_path: str | Path, cfg: dict, prereg: dict, results: str | Path, out: str | Path,
              prereg_file: str | None = None) -> dict:
    """Summarise one phase into ``out/summary.json`` and ``out/section.md`` (the sampling phase: also its
    judges, ``out/gates/<arm>.json``) by its registered behaviour; failed deployments are named."""
    files = planned_files(plan_path, results)
    if files["plan"].phase != phase:
        raise UserError(f"{plan_path}: a plan of phase {files['plan'].phase!r}, not {phase!r}; pass results/plan/{phase}.json")
    behaviour = registry.get(phase)
    cells = [c for d in files["deployments"] for c in d["cells"] if Path(c).exists()]
    run = PhaseRun(phase=phase, files=files, cells=cells, cfg=cfg, prereg=prereg, prereg_file=prereg_file,
                   results=Path(results), out=Path(out))
    summary = behaviour.summarize(run)
    failed = failed_deployments(files, behaviour.decl.artifact)
    if failed:  # never silently dropped: named in the summary and at the top of the section
        summary["failed_deployments"] = failed
        atomic.write_json(run.out / "summary.json", summary)
        section = run.out / "section.md"
        lines = section.read_text(encoding="utf-8").splitlines()
        note = ["", f"**{len(failed)} planned deployment(s) produced nothing usable** (not in the figures above):", ""]
        note += [f"- {f['arm']}/{f['rep']}: {f['reason']}" for f in failed]
        atomic.write_text(section, "\n".join(lines + note) + "\n")
    return summary
