"""Cost preview of a study before launch: ``specstudy plan --cost --config <study> --profile <profile>``.

Counts come from the plan itself (:func:`specstudy.study.plan.make_plan`): deployments, cells and requests
per phase. Times come, for each quantity separately, from this study's own earlier records under
``--results`` when they exist (``measured``), otherwise from the ``cost`` section of the config
(``declared``); the output names the source of every figure.

Model of one deployment (the phases of :mod:`specstudy.measure.progress`):

    start-up + smoke + Σ_cells [(warm-up + measured requests) × seconds/request(c) + drain] + stop/other

seconds/request(w, c) is the wall time of a closed-loop window divided by its request count, per workload w
(a 16k–64k-token summarization request costs far more than an open-chat one) and concurrency c: measured =
median over this study's valid cells of that workload at that concurrency; declared =
``cost.seconds_per_request.<w>`` × c^(−``cost.concurrency_exponent``) (``config.check_config`` requires a
figure for every workload). A capacity deployment is
start-up + smoke + the search (measured: median ``capacity`` phase; declared: ``cost.capacity_search_s``).

Wall time: phases run one after the other (confirmation needs the selection, capacity the final
candidate); inside a phase, as the DAG runs them: the first deployment alone (the others wait for it),
then the rest in plan order, each on the first of the profile's parallel slots to come free (Slurm:
``jobs``; local: ``cores`` ÷ 2 threads per deployment job; either capped by the profile's
``resources: deployments``). Node-hours = Σ deployment
time × nodes per deployment job (``set-resources.<rule>.nodes`` of the profile, else 1). Queue
waits and the short local steps (models, corpora, gates, report: ``cost.other_steps_s``) are added
as declared.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from specstudy.core import layout
from specstudy.core.stat_util import median
from specstudy.core.timestamps import to_unix
from specstudy.study import plan as planmod
from specstudy.study.plan import CORE_PHASES, request_counts

DEFAULTS = {
    "startup_s": 60.0,
    "smoke_s": 10.0,
    "stop_s": 10.0,
    "seconds_per_request": None,  # per workload: 1.0 s for each (built-in default) when the config has no cost section
    "concurrency_exponent": 0.8,
    "drain_s": 1.0,
    "capacity_search_s": 300.0,
    "confirmation_arms": 3,
    "other_steps_s": 0.0,
}
RULES = {"screen": "deploy_screen", "confirm": "deploy_confirm", "capacity": "capacity_search"}


# ------------------------------------------------------------------------------- measured figures
def measured(results: str | Path) -> dict:
    """Figures measured in this study's own earlier records (each None when no record has it)."""
    from specstudy.study import duty

    results = Path(results)
    startup, smoke, stop, cap = [], [], [], []
    recs = duty.records(results) if results.exists() else []
    for rec in recs:
        t = rec.get("times") or {}
        t0, tr = to_unix(t.get("start")), to_unix(t.get("ready"))
        if rec.get("status") == "ok" and t0 is not None and tr is not None and tr >= t0:
            startup.append(tr - t0)
        s = duty.split(rec) if rec.get("phases") else None
        if s and rec.get("status") == "ok":
            if s["smoke"]:
                smoke.append(s["smoke"])
            stop.append(s["stop"] + s["other"])
            if s["capacity"]:
                cap.append(s["capacity"])
    per_req: dict[tuple[str, int], list[float]] = {}
    drains = []
    for p in sorted(results.glob(layout.glob_pattern("cell", ""))) if results.exists() else []:
        if not layout.matches("cell", p) or layout.parse("cell", p)["phase"] not in CORE_PHASES:
            continue
        try:
            s = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        n = (s.get("requests") or {}).get("attempted")
        if (s.get("validity") or {}).get("valid") and s.get("wall_seconds") and n:
            per_req.setdefault((str(s["keys"]["workload"]), int(s["keys"]["concurrency"])), []).append(
                float(s["wall_seconds"]) / n)
            d = (s.get("drain") or {}).get("seconds")
            if d is not None:
                drains.append(float(d))
    return {"deployments": len(recs), "startup_s": median(startup), "smoke_s": median(smoke),
            "stop_s": median(stop), "capacity_search_s": median(cap), "drain_s": median(drains),
            "seconds_per_request": {k: median(v) for k, v in sorted(per_req.items())},
            "n": {"startup": len(startup), "smoke": len(smoke), "stop": len(stop), "capacity": len(cap),
                  "cells": sum(len(v) for v in per_req.values()), "drain": len(drains)}}


# ------------------------------------------------------------------------------- profile
def read_profile(profile: str | Path) -> tuple[dict, Path]:
    """A Snakemake profile's ``config.yaml`` (a directory or the file) as a mapping, and its path; a missing
    file, a YAML error or a non-mapping name the file."""
    from specstudy.core.errors import UserError
    from specstudy.core.studyyaml import StudyYamlError, load

    path = Path(profile)
    path = path / "config.yaml" if path.is_dir() else path
    try:
        raw = load(path, "Snakemake profile") or {}
    except StudyYamlError as exc:
        raise UserError(f"--profile: {exc}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: the Snakemake profile must be a mapping of options (executor, cores, jobs, ...)")
    return raw, path


def _profile_int(raw: dict, key: str, path: Path, default: int) -> int:
    from specstudy.core.errors import UserError

    v = raw.get(key)
    if v is None:
        return default
    if key == "cores" and v == "all":  # Snakemake's own spelling: every CPU of the machine
        return os.cpu_count() or 1
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise UserError(f"{path}: field '{key}': {v!r} is not a positive whole number; write e.g. {key}: 2"
                        + (" (or cores: all)" if key == "cores" else ""))
    return v


def profile_info(profile: str | Path | None) -> dict:
    """Parallel deployment slots and nodes per deployment job of a Snakemake profile directory."""
    if not profile:
        return {"name": "(none)", "executor": "local", "slots": 1, "nodes": {}}
    raw, path = read_profile(profile)
    executor = raw.get("executor", "local")
    if executor == "slurm":
        slots = _profile_int(raw, "jobs", path, 1)
    else:
        slots = max(1, _profile_int(raw, "cores", path, 1) // 2)  # deployment jobs take threads: 2
    cap = (raw.get("resources") or {}).get("deployments")  # each deployment job takes one unit
    if isinstance(cap, int) and cap > 0:
        slots = min(slots, cap)
    nodes = {}
    for rule, res in (raw.get("set-resources") or {}).items():
        if isinstance(res, dict) and isinstance(res.get("nodes"), int):
            nodes[rule] = res["nodes"]
    return {"name": str(profile), "executor": executor, "slots": slots, "nodes": nodes}


# ------------------------------------------------------------------------------- the preview
def _makespan(durations: list[float], slots: int, first_alone: bool = True) -> float:
    """Wall time of deployments (``durations`` in plan order) as the DAG runs them: the phase's first deployment
    alone (rules/common.smk: the others wait for it), then the rest in plan order (their job priorities), each
    on the first of ``slots`` parallel slots to come free. ``first_alone=False``: all start together."""
    if not durations:
        return 0.0
    start = durations[0] if first_alone else 0.0
    lanes = [start] * max(1, slots)
    for d in durations[1:] if first_alone else durations:
        i = lanes.index(min(lanes))
        lanes[i] += d
    return max(max(lanes), start)


def preview(cfg: dict, profile: str | Path | None = None, results: str | Path = "results") -> dict:
    declared = {**DEFAULTS, **(cfg.get("cost") or {})}
    meas = measured(results)
    prof = profile_info(profile)
    sources: dict[str, str] = {}

    def pick(key: str, n_key: str | None = None) -> float:
        v = meas.get(key)
        if v is not None:
            sources[key] = f"measured: median of {meas['n'].get(n_key or key, '?')} record(s) under {results}"
            return float(v)
        sources[key] = f"declared: cost.{key} = {declared[key]}" + ("" if "cost" in cfg and key in cfg["cost"]
                                                                    else " (built-in default)")
        return float(declared[key])

    startup = pick("startup_s", "startup")
    smoke = pick("smoke_s", "smoke")
    stop = pick("stop_s", "stop")
    drain = pick("drain_s", "drain")
    cap_search = pick("capacity_search_s", "capacity")
    mreq = meas["seconds_per_request"]
    declared_req = declared["seconds_per_request"] or {w: 1.0 for w in cfg["corpora"]["workloads"]}
    req_sources: dict[tuple[str, int], str] = {}

    def per_request(workload: str, c: int) -> float:
        if (workload, c) in mreq:
            req_sources[workload, c] = f"measured: median of valid {workload} cells at c={c} under {results}"
            return mreq[workload, c]
        base = float(declared_req[workload])
        req_sources[workload, c] = (f"declared: cost.seconds_per_request.{workload} {base} × "
                                    f"c^-{declared['concurrency_exponent']}"
                                    + ("" if declared["seconds_per_request"] else " (built-in default)"))
        return base * c ** (-float(declared["concurrency_exponent"]))

    cells_cfg = cfg["cells"]
    phases = []
    screen = planmod.make_plan(cfg, "screen")
    sel_path = Path(layout.selection(results))
    if sel_path.exists():
        conf_arms = json.loads(sel_path.read_text())["confirmation_arms"]
        conf_note = f"arms from {sel_path}: {', '.join(conf_arms)}"
    else:
        from specstudy.core.arms import is_baseline

        servable = planmod.servable_arms(cfg)
        baselines = [a["name"] for a in servable if is_baseline(a["name"])]  # one per engine build
        others = [a for a in servable if not is_baseline(a["name"])]
        k = max(0, int(declared["confirmation_arms"]) - 1)
        # in a study of several engine builds: the first k speculative settings, each on every build
        picked = list(dict.fromkeys(a["name"].split("@")[0] for a in others))[:k]
        conf_arms = baselines + [a["name"] for a in others if a["name"].split("@")[0] in picked]
        conf_note = (f"selection not made yet: assumed {len(conf_arms)} arms (cost.confirmation_arms, baseline "
                     "included); the real count is known after screening")
    confirm = planmod.make_plan(cfg, "confirm", arms=conf_arms)
    for name, p, note in (("screen", screen, f"{len(p_arms(screen))} arms"), ("confirm", confirm, conf_note)):
        durs, cells, reqs, warm = [], 0, 0, 0
        for dep in p["deployments"]:
            t = startup + smoke + stop
            for cell in dep["cells"]:
                c = int(cell["concurrency"])
                n_req, n_warm = request_counts(cells_cfg, c)  # the counts the deployment job itself sends
                t += (n_req + n_warm) * per_request(cell["workload"], c) + drain
                cells += 1
                reqs += n_req
                warm += n_warm
            durs.append(t)
        phases.append(_phase_row(name, durs, cells, reqs, warm, prof, note))
    cap = cfg.get("capacity") or {}
    if cap.get("enabled"):
        durs = [startup + smoke + cap_search + stop] * 2
        phases.append(_phase_row("capacity", durs, 0, None, None, prof,
                                 "baseline + the final candidate, open-loop search (requests depend on the knee)"))
    other = float(declared["other_steps_s"])
    total_wall = sum(r["wall_s"] for r in phases) + other
    return {"study": cfg["study"]["name"], "profile": prof, "phases": phases,
            "total": {"deployments": sum(r["deployments"] for r in phases), "cells": sum(r["cells"] for r in phases),
                      "requests": sum(r["requests"] or 0 for r in phases),
                      "warmup_requests": sum(r["warmup_requests"] or 0 for r in phases),
                      "deployment_s": sum(r["deployment_s"] for r in phases), "other_steps_s": other,
                      "wall_s": total_wall, "node_hours": sum(r["node_hours"] for r in phases)},
            "figures": {"startup_s": startup, "smoke_s": smoke, "stop_s": stop, "drain_s": drain,
                        "capacity_search_s": cap_search,
                        "seconds_per_request": _nested({k: per_request(*k) for k in sorted(req_sources)})},
            "sources": {**sources, **{f"seconds_per_request[{w}, c={c}]": v for (w, c), v in sorted(req_sources.items())},
                        "other_steps_s": f"declared: cost.other_steps_s = {other}"},
            "measured_deployments": meas["deployments"]}


def _nested(flat: dict[tuple[str, int], float]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for (w, c), v in flat.items():
        out.setdefault(w, {})[c] = v
    return out


def p_arms(p: dict) -> list[str]:
    return sorted({d["arm"] for d in p["deployments"]})


def _phase_row(name, durs, cells, reqs, warm, prof, note) -> dict:
    nodes = prof["nodes"].get(RULES[name], 1)
    return {"phase": name, "deployments": len(durs), "cells": cells, "requests": reqs, "warmup_requests": warm,
            "deployment_s": sum(durs), "wall_s": _makespan(durs, prof["slots"], first_alone=name != "capacity"),
            "node_hours": sum(durs) * nodes / 3600.0, "nodes_per_deployment": nodes, "note": note}


def _dur(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def render(pv: dict, config_path: str = "") -> str:
    prof = pv["profile"]
    unit = "node-hours" if prof["executor"] == "slurm" else "machine-hours"
    lines = [f"Cost preview: study {pv['study']} ({config_path}), profile {prof['name']} "
             f"({prof['executor']}, {prof['slots']} deployment(s) at a time)",
             "",
             f"{'phase':<9} {'deployments':>11} {'cells':>6} {'requests (+warm-up)':>20} {'deployment time':>16} "
             f"{'wall time':>10} {unit:>14}"]
    for r in pv["phases"] + [dict(pv["total"], phase="total")]:
        req = "–" if r["requests"] is None else f"{r['requests']} (+{r['warmup_requests']})"
        lines.append(f"{r['phase']:<9} {r['deployments']:>11} {r['cells'] or '–':>6} {req:>20} "
                     f"{_dur(r['deployment_s']):>16} {_dur(r['wall_s']):>10} {r['node_hours']:>14.2f}")
    lines.append(f"(wall time of a phase: its first deployment alone, then {prof['slots']} at a time in plan order, "
                 "as the DAG runs them; the profile's jobs / resources: deployments set how many)")
    lines.append(f"(total wall time includes {pv['total']['other_steps_s']:.0f} s of local steps: models, corpora, "
                 "gates, report; Slurm queue waits are not included)")
    lines.append("")
    for r in pv["phases"]:
        lines.append(f"{r['phase']}: {r['note']}; {r['nodes_per_deployment']} node(s) per deployment job")
    f = pv["figures"]
    lines.append("")
    lines.append("Figures used (per deployment unless said otherwise):")
    for key, label in (("startup_s", "server start-up (launch -> ready)"), ("smoke_s", "smoke captures"),
                       ("stop_s", "stop + bookkeeping"), ("drain_s", "drain per cell"),
                       ("capacity_search_s", "capacity search")):
        lines.append(f"  {label:<40} {f[key]:>8.1f} s   {pv['sources'][key]}")
    for w, by_c in f["seconds_per_request"].items():
        for c, v in by_c.items():
            lines.append(f"  {f'seconds per request, {w} c={c}':<40} {v:>8.3f} s   "
                         f"{pv['sources'][f'seconds_per_request[{w}, c={c}]']}")
    if not pv["measured_deployments"]:
        lines.append("No earlier deployment of this study found: every time above is a declared default.")
    return "\n".join(lines) + "\n"


#: A study whose preview exceeds this is a mistake in the config (a count off by orders of magnitude), not a plan.
MAX_WALL_S = 365 * 86400.0


def check_sane(pv: dict, config_path: str = "the study config") -> None:
    """Refuse a preview beyond :data:`MAX_WALL_S` of wall time, naming the fields that drive it."""
    from specstudy.core.errors import UserError

    wall = pv["total"]["wall_s"]
    if wall > MAX_WALL_S:
        raise UserError(f"{config_path}: the study would take {wall / 86400:.3g} days of wall time "
                        f"({pv['total']['requests']} requests in {pv['total']['cells']} cells, "
                        f"{pv['total']['node_hours']:.3g} node-hours), more than {MAX_WALL_S / 86400:.0f} days: check "
                        "cells.requests, cells.warmup_requests, screen.repeats and screen.concurrency (a count off "
                        "by orders of magnitude?)")


def cmd(args) -> int:
    from specstudy.study.config import load_config

    cfg = load_config(args.config)
    pv = preview(cfg, args.profile, args.results)
    print(render(pv, args.config), end="")
    check_sane(pv, args.config)
    if getattr(args, "json", None):
        from specstudy.core import atomic

        atomic.write_json(args.json, pv)
    return 0
