"""Triton JIT compilations the engine logs inside a cell's measurement window (a per-cell confound).

vLLM 0.23's kernel JIT monitor (``jit_monitor.py``) logs, once warm-up is over,

    WARNING 12-02 03:17:13 [jit_monitor.py:103] Triton kernel JIT compilation during inference:
    _compute_slot_mapping_kernel. This causes a latency spike; consider extending warmup to cover ...

A compilation inside a measurement window costs that window a latency spike that has nothing to do with
speculation. :func:`jit_events` reads them from an arm's own launch log; :func:`in_window` keeps those whose
log second overlaps the cell's window (``times.started_at`` → ``times.ended_at``); :func:`apply` marks the
cell with the pre-registered consequence (``confounds.jit_in_window`` of the pre-registration):

- ``flag`` (default): a validity note ``jit_in_window`` naming the kernels and their log times; the cell
  stays valid and the report lists it;
- ``reject``: a validity reason ``jit_in_window`` that rejects the cell, so re-running the deployment job
  (``specstudy rerun <summary path>``) measures it again on a fresh server.

vLLM's stamps are the server's local time with one-second resolution (truncated) and no year or zone: the
log's clock is the one :func:`specstudy.deployment.launchlog.startup_steps` aligned to ours
(``log_clock``: ``utc`` or ``utc±Hh``). A stamp ``s`` means a time in ``[s, s + 1)``; the event counts as
inside the window when that second overlaps it (a conservative mark: it may have fallen just outside).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from specstudy.core.timestamps import parse, to_unix, utc_iso
from specstudy.deployment.launchlog import _strip_prefix

CONSEQUENCES = ("flag", "reject")
DEFAULT_CONSEQUENCE = "flag"
CODE = "jit_in_window"
_JIT_RE = re.compile(r"Triton kernel JIT compilation during inference: (?P<kernel>[A-Za-z_][\w.]*?)\.?(?:\s|$)")
_CLOCK_RE = re.compile(r"^utc(?:(?P<sign>[+-])(?P<hours>\d+(?:\.\d+)?)h)?$")


def read_log(path) -> str:
    """A launch log as written: no newline translation, so a progress bar's ``\\r`` does not start a line and
    :func:`jit_events`' line numbers are the ones ``grep -n`` shows."""
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        return fh.read()


def jit_events(log_text: str) -> list[dict]:
    """Every JIT compilation the engine logged: ``{kernel, log_time ('MM-DD HH:MM:SS'), proc, line}``
    (``line``: 1-based line number in the log)."""
    out = []
    for n, raw in enumerate(log_text.split("\n"), 1):  # numbered as grep -n does (progress bars hold \r)
        if "JIT compilation during inference" not in raw:
            continue
        msg, meta = _strip_prefix(raw)
        m = _JIT_RE.search(msg)
        if m and meta.get("ts"):
            out.append({"kernel": m.group("kernel"), "log_time": meta["ts"], "proc": meta.get("proc"), "line": n})
    return out


def clock_offset_s(log_clock: str | None) -> float | None:
    """Seconds the log's clock is ahead of UTC (``utc`` → 0, ``utc+1h`` → 3600); None when not aligned."""
    m = _CLOCK_RE.match(log_clock or "")
    if not m:
        return None
    if not m.group("sign"):
        return 0.0
    return (1 if m.group("sign") == "+" else -1) * float(m.group("hours")) * 3600.0


def event_utc(log_time: str, offset_s: float, near: datetime) -> datetime:
    """A log stamp as UTC, its year taken from ``near`` (the window), across a new year if need be."""
    best = None
    for year in (near.year - 1, near.year, near.year + 1):
        t = datetime.strptime(f"{year}-{log_time}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        t -= timedelta(seconds=offset_s)
        if best is None or abs((t - near).total_seconds()) < abs((best - near).total_seconds()):
            best = t
    return best


def in_window(events: list[dict], started_at: str | None, ended_at: str | None, log_clock: str | None) -> dict:
    """The events whose log second overlaps the window. ``checked`` False (with ``why``) when the window's
    times or the log's clock are unknown: then nothing is claimed either way."""
    t0, t1 = parse(started_at), parse(ended_at)
    offset = clock_offset_s(log_clock)
    if t0 is None or t1 is None:
        return {"checked": False, "why": "the cell has no window times (times.started_at/ended_at)", "events": []}
    if offset is None:
        return {"checked": False, "why": f"the launch log's clock is not aligned to ours (log_clock {log_clock!r})",
                "events": []}
    hits = []
    for e in events:
        t = event_utc(e["log_time"], offset, t0)
        if t < t1 and t + timedelta(seconds=1) > t0:
            hits.append(dict(e, utc=utc_iso(t.timestamp())))
    return {"checked": True, "why": None, "events": hits}


def detail(found: dict, started_at: str, ended_at: str) -> str:
    ks = ", ".join(f"{e['kernel']} at {e['log_time']} (log line {e['line']})" for e in found["events"])
    return (f"{len(found['events'])} Triton JIT compilation(s) logged inside the measurement window "
            f"{started_at} → {ended_at} (log stamps have 1 s resolution): {ks}")


def consequence_of(prereg: dict | None) -> str:
    """The pre-registered consequence (``confounds.jit_in_window``), ``flag`` when not declared."""
    c = ((prereg or {}).get("confounds") or {}).get("jit_in_window") or DEFAULT_CONSEQUENCE
    if c not in CONSEQUENCES:
        raise ValueError(f"pre-registration: confounds.jit_in_window is {c!r}; use one of {list(CONSEQUENCES)}")
    return c


def apply(summary: dict, log_text: str, log_clock: str | None, consequence: str = DEFAULT_CONSEQUENCE) -> dict:
    """Mark a measured cell summary (in place, and returned) whose window holds a JIT compilation.

    ``flag``: a validity note; ``reject``: a validity reason that rejects the cell. Returns the finding
    (``checked``, ``why``, ``events``)."""
    from specstudy.measure.cell import _note, _reason, _validity

    if consequence not in CONSEQUENCES:
        raise ValueError(f"JIT consequence {consequence!r}; use one of {list(CONSEQUENCES)}")
    times = summary.get("times") or {}
    found = in_window(jit_events(log_text), times.get("started_at"), times.get("ended_at"), log_clock)
    if not found["events"]:
        return found
    v = summary["validity"]
    text = detail(found, times["started_at"], times["ended_at"])
    reasons, notes = list(v.get("reasons") or []), list(v.get("notes") or [])
    if consequence == "reject":
        reasons.append(_reason(CODE, text + "; pre-registered consequence: reject (re-run the cell)"))
    else:
        notes.append(_note(CODE, text + "; pre-registered consequence: flag (cell kept, reported)"))
    wall = summary.get("wall_seconds")
    summary["validity"] = _validity(reasons, wall_ok=wall is not None and wall > 0, notes=notes)
    return found


def launch_log_account(records: list[str]) -> list[dict]:
    """What each deployment's own launch log shows (the log beside its record: ``attempts/<id>/launch.log``):
    the JIT compilations it logged, the first and last one's log time, and the first measurement window's start
    (the record's phase timeline, our clock). A record without its launch log gives ``log`` None."""
    from pathlib import Path

    from specstudy.core import atomic, layout

    out = []
    for rec_path in records:
        rec = atomic.read_json(rec_path)
        dep = layout.parse_deployment(rec_path)
        did = rec.get("deployment_id")
        log_path = Path(layout.attempt_dir(dep.phase, dep.arm, dep.rep, did, root=dep.root), layout.LAUNCH_LOG) if did else None
        events = jit_events(read_log(log_path)) if log_path is not None and log_path.exists() else None
        measures = sorted(t for p in (rec.get("phases") or []) if isinstance(p, dict) and p.get("phase") == "measure"
                          and (t := to_unix(p.get("start"))) is not None)
        out.append({"phase": dep.phase, "arm": dep.arm, "rep": dep.rep, "deployment_id": did,
                    "log": str(log_path) if events is not None else None,
                    "compilations": None if events is None else len(events),
                    "first": events[0]["log_time"] if events else None, "last": events[-1]["log_time"] if events else None,
                    "log_clock": (rec.get("startup") or {}).get("log_clock"),
                    "first_window": utc_iso(measures[0]) if measures else None})
    return out


def report_section(B: list, cells: list[dict], records: list[str] | None = None) -> list[dict]:
    """The report's "JIT compilations in measurement windows" section (specstudy.report.document blocks): the
    cells marked at measurement time and, from ``records`` (deployment records, their launch logs beside them),
    how many compilations each deployment logged and when; returns the marked cells' rows."""
    import json

    B.append(("h", 2, "JIT compilations in measurement windows"))
    rows = []
    for c in cells:
        for field, kind in (("validity_note_details", "flag"), ("invalid_details", "reject")):
            for item in json.loads(c.get(field) or "[]"):
                if item.get("code") == CODE:
                    rows.append({"phase": c.get("phase"), "arm": c.get("arm"), "rep": c.get("rep"),
                                 "workload": c.get("workload"), "concurrency": c.get("concurrency"),
                                 "consequence": kind, "detail": item.get("detail", "")})
    B.append(("p", "A Triton JIT compilation that an arm's own launch log (vLLM's jit_monitor) stamps inside a cell's "
                   "measurement window costs that window a latency spike unrelated to speculation. Consequence, "
                   "pre-registered (`confounds.jit_in_window`): flag = the cell is kept and listed here; reject = "
                   "the cell is invalid and is measured again by re-running its deployment job."))
    account = launch_log_account(records or [])
    read = [a for a in account if a["log"] is not None]
    logged = sum(a["compilations"] for a in read)
    if not rows:
        if not account:
            why = "no deployment record was given, so no launch log was read"
        elif not read:
            why = f"none of the {len(account)} deployment records has its launch log beside it"
        elif logged == 0:
            why = (f"the launch logs of all {len(read)} deployments log no JIT compilation (an engine without vLLM's "
                   "JIT monitor, the CPU engine for one, logs none)")
        else:
            why = (f"{logged} compilation(s) logged by {sum(1 for a in read if a['compilations'])} of {len(read)} "
                   "deployments' launch logs, none inside a cell's window (the check ran on every cell as it was "
                   "measured; below: when each deployment logged them and when its first window opened)")
        B.append(("p", f"No cell's window holds a logged JIT compilation: {why}."))
    else:
        B.append(("table", ["phase", "arm", "rep", "workload", "c", "consequence", "compilations"],
                  [[r["phase"], r["arm"], r["rep"], r["workload"], r["concurrency"], r["consequence"], r["detail"][:400]]
                   for r in sorted(rows, key=lambda r: (str(r["phase"]), str(r["arm"]), r["rep"] or 0,
                                                        str(r["workload"]), r["concurrency"] or 0))]))
    if logged:
        B.append(("p", "JIT compilations each deployment's launch log shows (log times: the server's clock, 1 s "
                       "resolution; log clock: its alignment to ours; first window: the first measurement window's "
                       "start, our clock, UTC):"))
        B.append(("table", ["phase", "arm", "rep", "deployment", "compilations logged", "first", "last", "log clock",
                            "first window"],
                  [[a["phase"], a["arm"], a["rep"], a["deployment_id"], a["compilations"], a["first"] or "–",
                    a["last"] or "–", a["log_clock"] or "–", a["first_window"] or "–"]
                   for a in sorted(read, key=lambda a: (a["phase"], a["arm"], a["rep"]))]))
    return rows
