"""Duty cycle: where the study's deployment time goes, per phase (the study's own efficiency figure).

For every deployment record (``results/{screen,confirm,capacity}/…/deployment.json``) the job's wall
time is ``times.stop − times.start``; its phase timeline (``phases``, written by
:mod:`specstudy.measure.progress`) splits it into starting the server (launch → ready), smoke captures,
warm-up, measuring, draining, the capacity search and stopping; what no phase covers (corpus
checks, provenance, writing records) is ``other``. Records written before the timeline existed
contribute start-up (``times.ready − times.start``) and the rest as ``other``.

A record republished by a later job that reused every cell (``reused_by``) is the earlier
deployment's own record: it is counted once, under its own deployment id.
"""

from __future__ import annotations

import json
from pathlib import Path

from specstudy.core import layout
from specstudy.core.timestamps import to_unix
from specstudy.study.plan import CORE_PHASES

SHARES = ("launch", "smoke", "warmup", "measure", "drain", "capacity", "stop", "other")
LABELS = {"launch": "starting", "smoke": "smoke", "warmup": "warm-up", "measure": "measuring", "drain": "drain",
          "capacity": "capacity search", "stop": "stopping", "other": "other"}
PHASE_DIRS = (*CORE_PHASES, "capacity")


def records(results: str | Path) -> list[dict]:
    """Deployment records of the study under ``results``, one per deployment id (declared outputs first)."""
    results = Path(results)
    return read_records({ph: sorted((results / ph).glob(f"**/{layout.DEPLOYMENT_RECORD}")) for ph in PHASE_DIRS})


def read_records(files: dict[str, list[str | Path]]) -> list[dict]:
    """The deployment records given by phase folder (``PHASE_DIRS`` order), one per deployment id; an unreadable
    file is skipped."""
    seen: set[str] = set()
    out = []
    for ph in PHASE_DIRS:
        for p in files.get(ph) or []:
            try:
                rec = json.loads(Path(p).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(rec, dict) or rec.get("deployment_id") in seen:
                continue
            seen.add(rec.get("deployment_id"))
            rec["_phase_dir"] = ph
            out.append(rec)
    return out


def split(rec: dict) -> dict | None:
    """Seconds of one deployment per share (``SHARES``) plus ``total``; None without start/stop."""
    times = rec.get("times") or {}
    t0, t1 = to_unix(times.get("start")), to_unix(times.get("stop"))
    if t0 is None or t1 is None or t1 < t0:
        return None
    parts = {k: 0.0 for k in SHARES}
    phases = rec.get("phases")
    if phases:
        for ev in phases:
            if ev.get("phase") in parts:
                parts[ev["phase"]] += float(ev.get("seconds") or 0.0)
        timeline = True
    else:
        ready = to_unix(times.get("ready"))
        if ready is not None and ready >= t0:
            parts["launch"] = ready - t0
        timeline = False
    total = t1 - t0
    # "stop" ends at times.stop; the record is written a moment later: anything left is "other".
    parts["other"] = max(total - sum(v for k, v in parts.items() if k != "other"), 0.0)
    return {**parts, "total": total, "timeline": timeline}


def duty_cycle(recs: list[dict]) -> list[dict]:
    """One row per phase directory with deployments (of the records :func:`records` / :func:`read_records`
    read): counts, total seconds and the share of each part."""
    rows = []
    by: dict[str, list[dict]] = {}
    for rec in recs:
        s = split(rec)
        if s is not None:
            by.setdefault(rec["_phase_dir"], []).append(s)
    for ph in PHASE_DIRS:
        ss = by.get(ph)
        if not ss:
            continue
        total = sum(s["total"] for s in ss)
        row = {"phase": ph, "deployments": len(ss), "with_timeline": sum(s["timeline"] for s in ss),
               "deployment_seconds": total}
        for k in SHARES:
            secs = sum(s[k] for s in ss)
            row[f"{k}_seconds"] = secs
            row[f"{k}_share"] = secs / total if total > 0 else None
        rows.append(row)
    if rows:
        total = sum(r["deployment_seconds"] for r in rows)
        allrow = {"phase": "all", "deployments": sum(r["deployments"] for r in rows),
                  "with_timeline": sum(r["with_timeline"] for r in rows), "deployment_seconds": total}
        for k in SHARES:
            secs = sum(r[f"{k}_seconds"] for r in rows)
            allrow[f"{k}_seconds"] = secs
            allrow[f"{k}_share"] = secs / total if total > 0 else None
        rows.append(allrow)
    return rows


def report_section(B: list, recs: list[dict]) -> list[dict]:
    """Append the report's "Duty cycle" section of the deployment records ``recs`` to the block list ``B``
    (see specstudy.report.document)."""
    rows = duty_cycle(recs)
    B.append(("h", 2, "Duty cycle: where the deployment time went"))
    if not rows:
        B.append(("p", "Missing: no deployment record with start and stop times under results/{screen,confirm,capacity}."))
        return rows
    B.append(("p", "Share of each phase's deployment wall time (job start → server stopped) spent starting servers, "
                   "in smoke captures, warm-up, measuring, draining, the capacity search and stopping; 'other' is what "
                   "no timed phase covers. Measuring is the study's own efficiency figure. Records without a phase "
                   "timeline (written before it existed) count only their start-up; the rest of their time is 'other'."))

    def pct(v):
        return "–" if v is None else f"{v:.1%}"

    B.append(("table", ["phase", "deployments (with timeline)", "deployment time"] + [LABELS[k] for k in SHARES],
              [[r["phase"], f"{r['deployments']} ({r['with_timeline']})", _dur(r["deployment_seconds"])]
               + [pct(r[f"{k}_share"]) for k in SHARES] for r in rows]))
    return rows


def _dur(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
