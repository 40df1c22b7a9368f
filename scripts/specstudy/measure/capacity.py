"""Capacity: the sustainable open-loop request rate of one arm under declared gates.

The question differs from the fixed-concurrency cells: *how many requests per second can this
deployment take (Poisson arrivals) while meeting the latency/error/backlog gates?* Results live
under ``results/capacity/<arm>/`` and are never mixed with cell summaries.

Algorithm (see ``docs/capacity.md``):

1. ``gates.json`` is written before the first step (gates and search settings as resolved).
2. *Bracket*: rate ``r = start`` and ``r *= growth`` while the step passes (up to ``max_rate_rps``);
   if the start rate fails, ``r /= growth`` down to ``min_rate_rps`` until a step passes.
3. *Bisect* geometrically between the highest pass ``lo`` and the lowest failing/limited rate ``hi``
   until ``(hi - lo)/lo <= resolution_frac``. The knee is ``lo``.
4. A step whose load-generator gates fail is ``client_limited``: it says nothing about the server
   and bounds the search as the *client ceiling*, never as server saturation. A knee above the
   proven client capacity (configured, or the highest rate the client drove without limitation)
   is refused.
5. *Confirmation*: ``soak.count`` soaks of ``soak.duration_s`` at the knee, then at the step above
   (``hi``), on the same deployment. A rate is *sustained* when every soak there passes the server
   gates; the knee stands (``confirmed``) when the knee is sustained and the step above is not (at
   least one soak fails). When they disagree the knee moves by one step, at most ``soak.max_moves``
   times: down (the failed knee becomes the step above, its soaks reused) or up (the sustained step
   above becomes the knee). Client-limited soaks stop the confirmation.

The search logic (:func:`search`) only needs ``step_runner(rate) -> StepResult``; the real runner
(:func:`make_step_runner`) drives :func:`specstudy.measure.loadgen.run_open_loop` and samples ``/metrics``.

Kept as one module (over ~700 lines): the gates, the judgment of a step, the search, the records it writes
(steps, soaks, knee) and their plot are one procedure (``docs/capacity.md``); the measuring runner
(:class:`MetricsSampler`, :func:`summarize_step`, :func:`make_step_runner`) is the part that could stand
alone, kept here because it fills exactly the :class:`StepResult` the judgment reads.
"""

from __future__ import annotations

import copy
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specstudy.core import atomic
from specstudy.core.records import (
    CapacityKnee,
    CapacityStep,
    kv_cache_tokens,
    read_capacity_steps,
    read_knee,
    to_record,
)
from specstudy.core.stat_util import finite_or_none as _num
from specstudy.core.stat_util import percentile

SCHEMA_GATES = "specstudy.capacity-gates/1"
SCHEMA_STEP = "specstudy.capacity-step/1"
SCHEMA_KNEE = "specstudy.capacity-knee/1"

DEFAULT_GATES: dict[str, Any] = {
    "ttft_p95_ms": 2000.0,
    "tpot_p95_ms": 200.0,
    "max_error_rate": 0.01,
    "backlog": {
        "max_waiting_slope_frac": 0.05,
        "slope_t_min": 3.0,
        "max_preemptions": 0,
        "max_kv_cache_usage": 0.98,
    },
    "client": {
        "max_lateness_p99_ms": 2.0,  # a measured send later than this is "late" (see judge_lateness)
        "max_late_fraction": 0.01,  # ... and at most this fraction of them may be (1 %: the p99 statement)
        "max_cpu_share": 0.9,
        "max_pool_wait_p99_ms": 5.0,
        "max_event_loop_lag_p99_ms": 20.0,
        "honour_loadgen_flag": True,
        "capacity_rps": None,
    },
}

DEFAULT_SEARCH: dict[str, Any] = {
    "start_rate_rps": 1.0,
    "growth": 2.0,
    "max_rate_rps": 256.0,
    "min_rate_rps": 0.05,
    "resolution_frac": 0.1,
    "max_steps": 20,
    "warmup_s": 10.0,
    "step_duration_s": 60.0,
    "sample_interval_s": 1.0,
    "arrival_seed": 0,
    "request_timeout_s": 600.0,
    "soak": {"count": 3, "duration_s": 300.0, "max_moves": 2},
}

SERVER_GATES = ("ttft_p95", "tpot_p95", "error_rate", "backlog_slope", "preemptions", "kv_cache_usage")
CLIENT_GATES = ("client_lateness", "client_cpu", "client_pool_wait", "client_loop_lag", "client_flag")


# --------------------------------------------------------------------------------------------
# configuration


def _merge(defaults: dict, given: dict | None) -> dict:
    out = copy.deepcopy(defaults)
    for k, v in (given or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def resolve_gates(gates: dict | None, source: str = "<gates>") -> dict:
    """Validate user gates (schema ``capacity-gates``) and fill defaults."""
    from specstudy.core import schemas

    schemas.validate(gates or {}, "capacity-gates", source)
    return _merge(DEFAULT_GATES, gates)


def resolve_search(search_cfg: dict | None, source: str = "<search>") -> dict:
    """Validate user search settings (schema ``capacity-search``) and fill defaults."""
    from specstudy.core import schemas

    schemas.validate(search_cfg or {}, "capacity-search", source)
    cfg = _merge(DEFAULT_SEARCH, search_cfg)
    if cfg["min_rate_rps"] > cfg["start_rate_rps"] or cfg["start_rate_rps"] > cfg["max_rate_rps"]:
        raise ValueError(
            f"{source}: field 'start_rate_rps' must lie in [min_rate_rps, max_rate_rps] "
            f"(got {cfg['min_rate_rps']} <= {cfg['start_rate_rps']} <= {cfg['max_rate_rps']}); fix one of the three"
        )
    return cfg


def load_json_or_file(arg: str | dict | None, what: str) -> dict:
    """``arg`` is a dict, inline JSON, or a path to a JSON/YAML file (``{"gates": …}`` and a study
    config's ``capacity.<what>`` are unwrapped)."""
    if arg is None:
        return {}
    if isinstance(arg, dict):
        return arg
    text = arg.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--{what}: inline JSON is invalid ({exc}); pass a JSON object or a file path") from exc
    path = Path(arg)
    if not path.exists():
        raise ValueError(f"--{what}: {arg!r} is neither inline JSON nor an existing file")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    else:
        data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict) and isinstance(data.get("capacity"), dict) and what in data["capacity"]:
        data = data["capacity"][what]  # a whole study config: capacity.<what>
    elif isinstance(data, dict) and set(data) == {what}:
        data = data[what]
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of {what} settings")
    return data


# --------------------------------------------------------------------------------------------
# one step


@dataclass
class StepResult:
    """What one open-loop step at ``offered_rate`` measured. ``None`` means not measured."""

    offered_rate: float
    achieved_rate: float | None = None  # successful completions per second inside the window
    send_rate: float | None = None  # requests sent per second inside the window
    n_requests: int = 0  # measured (post warm-up) requests
    n_errors: int = 0
    error_rate: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p95_ms: float | None = None
    backlog_slope: float | None = None  # d(num_requests_waiting)/dt, requests per second
    backlog_slope_t: float | None = None  # t statistic of the slope (None: zero residual variance)
    waiting_max: float | None = None
    waiting_samples: int = 0
    preemptions: float | None = None  # vllm:num_preemptions_total delta over the step
    kv_cache_usage_max: float | None = None
    client: dict = field(default_factory=dict)  # LoadResult.client
    # schedule lateness (ms) of the measured sends only (scheduled at or after the warm-up); None: not measured
    lateness_ms: list | None = None
    duration_s: float | None = None
    notes: list = field(default_factory=list)
    artifacts: str | None = None


def _p(client: dict, key: str, stat: str = "p99") -> float | None:
    v = client.get(key)
    if isinstance(v, dict):
        v = v.get(stat)
    return None if v is None else float(v)


def judge(step: StepResult, gates: dict) -> dict:
    """Verdict per gate (``pass``/``fail``/``no_data``/``skipped``), overall verdict, client_limited.

    Server gates with ``no_data`` fail (the step cannot prove it passed). Load-generator gates with
    ``no_data`` do not fail. Any failing load-generator gate makes the step ``client_limited``,
    whatever the server gates say: its measurements neither prove a pass nor a saturation.
    """
    g = gates
    b = g["backlog"]
    c = g["client"]
    v: dict[str, str] = {}

    def upper(name, value, limit, missing="no_data"):
        if limit is None:
            v[name] = "skipped"
        elif value is None:
            v[name] = missing
        else:
            v[name] = "pass" if value <= limit else "fail"

    upper("ttft_p95", step.ttft_p95_ms, g.get("ttft_p95_ms"))
    upper("tpot_p95", step.tpot_p95_ms, g.get("tpot_p95_ms"))
    upper("error_rate", step.error_rate, g.get("max_error_rate"))
    frac = b.get("max_waiting_slope_frac")
    if frac is None:
        v["backlog_slope"] = "skipped"
    elif step.backlog_slope is None:
        v["backlog_slope"] = "no_data"
    else:
        limit = frac * step.offered_rate
        significant = step.backlog_slope_t is None or step.backlog_slope_t >= b.get("slope_t_min", 0.0)
        v["backlog_slope"] = "fail" if (step.backlog_slope > limit and significant) else "pass"
    upper("preemptions", step.preemptions, b.get("max_preemptions"))
    upper("kv_cache_usage", step.kv_cache_usage_max, b.get("max_kv_cache_usage"))

    cl = step.client or {}
    late = judge_lateness(step.lateness_ms, c.get("max_lateness_p99_ms"), c.get("max_late_fraction"))
    v["client_lateness"] = late["verdict"]
    upper("client_cpu", None if cl.get("cpu_share") is None else float(cl["cpu_share"]), c.get("max_cpu_share"))
    upper("client_pool_wait", _p(cl, "pool_wait_ms"), c.get("max_pool_wait_p99_ms"))
    upper("client_loop_lag", _p(cl, "event_loop_lag_ms"), c.get("max_event_loop_lag_p99_ms"))
    if not c.get("honour_loadgen_flag", True):
        v["client_flag"] = "skipped"
    elif "limited" not in cl:
        v["client_flag"] = "no_data"
    else:
        v["client_flag"] = "fail" if cl.get("limited") else "pass"

    client_limited = any(v[k] == "fail" for k in CLIENT_GATES)
    server_failed = [k for k in SERVER_GATES if v[k] in ("fail", "no_data")]
    if client_limited:
        verdict = "client_limited"
    elif server_failed:
        verdict = "fail"
    else:
        verdict = "pass"
    return {
        "gates": v,
        "verdict": verdict,
        "client_limited": client_limited,
        "lateness": late,
        "failed_gates": [k for k in SERVER_GATES + CLIENT_GATES if v[k] in ("fail",)]
        + [k for k in SERVER_GATES if v[k] == "no_data"],
    }


#: Level of the one-sided exact binomial test of the lateness gate.
LATENESS_ALPHA = 0.05


def judge_lateness(lateness_ms: list | None, late_ms: float | None, max_fraction: float | None) -> dict:
    """The schedule-lateness gate of one step, over its measured sends only.

    A send is *late* when it left more than ``late_ms`` after its scheduled time. The gate fails when the
    measured sends show, by a one-sided exact binomial test at level :data:`LATENESS_ALPHA`, that more than
    ``max_fraction`` of sends are late (``P(X >= late | n, max_fraction) < alpha``). With the default 1 % this
    is the statement "lateness p99 <= late_ms" tested with its sample size: a p99 over 48-96 sends is decided
    by one hiccup, this test needs 3 late sends of 48 (or ~74 of 6000) to fail. ``verdict`` is ``skipped``
    when either limit is null, ``no_data`` when no measured send has a lateness.
    """
    vals = [float(x) for x in (lateness_ms or []) if x is not None]
    n = len(vals)
    out: dict[str, Any] = {"n": n, "late_ms": late_ms, "max_fraction": max_fraction, "late": None,
                           "fraction": None, "p_value": None,
                           "p99_ms": percentile(vals, 99) if vals else None, "max_ms": max(vals) if vals else None}
    if late_ms is None or max_fraction is None:
        out["verdict"] = "skipped"
        return out
    if n == 0:
        out["verdict"] = "no_data"
        return out
    from scipy.stats import binom

    k = sum(1 for x in vals if x > late_ms)
    p = float(binom.sf(k - 1, n, max_fraction)) if k > 0 else 1.0
    out.update(late=k, fraction=k / n, p_value=p, verdict="fail" if p < LATENESS_ALPHA else "pass")
    return out


def step_row(step: StepResult, judged: dict, *, index: int, phase: str, arm: str | None) -> dict:
    cl = step.client or {}
    late = judged.get("lateness") or judge_lateness(step.lateness_ms, None, None)
    row = {
        "schema": SCHEMA_STEP,
        "arm": arm,
        "index": index,
        "phase": phase,
        "offered_rate": step.offered_rate,
        "achieved_rate": step.achieved_rate,
        "send_rate": step.send_rate,
        "n_requests": step.n_requests,
        "n_errors": step.n_errors,
        "error_rate": step.error_rate,
        "ttft_p50_ms": step.ttft_p50_ms,
        "ttft_p95_ms": step.ttft_p95_ms,
        "tpot_p50_ms": step.tpot_p50_ms,
        "tpot_p95_ms": step.tpot_p95_ms,
        "backlog_slope": step.backlog_slope,
        "backlog_slope_t": step.backlog_slope_t,
        "waiting_max": step.waiting_max,
        "waiting_samples": step.waiting_samples,
        "preemptions": step.preemptions,
        "kv_cache_usage_max": step.kv_cache_usage_max,
        "lateness_p99_ms": late["p99_ms"],  # measured sends only (not the warm-up's)
        "lateness_max_ms": late["max_ms"],
        "lateness_sends": late["n"],
        "late_sends": late["late"],
        "late_fraction": late["fraction"],
        "late_p_value": late["p_value"],
        "client_cpu_share": cl.get("cpu_share"),
        "pool_wait_p99_ms": _p(cl, "pool_wait_ms"),
        "event_loop_lag_p99_ms": _p(cl, "event_loop_lag_ms"),
        "loadgen_limited": cl.get("limited"),
        "loadgen_limited_reasons": cl.get("limited_reasons"),
        "duration_s": step.duration_s,
        "gates": judged["gates"],
        "failed_gates": judged["failed_gates"],
        "verdict": judged["verdict"],
        "client_limited": judged["client_limited"],
        "notes": list(step.notes),
        "artifacts": step.artifacts,
    }
    return _finite(row)


def _finite(obj):
    """Replace NaN/inf by None so records stay strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


# --------------------------------------------------------------------------------------------
# the search (pure: only the step runner touches the world)


@dataclass
class SearchOutcome:
    steps: list[dict]
    soaks: list[dict]
    knee: dict


def _client_capacity(steps: list[dict], gates: dict) -> dict:
    declared = gates["client"].get("capacity_rps")
    limited = [s["offered_rate"] for s in steps if s["client_limited"]]
    ceiling = min(limited) if limited else None
    driven = [s["offered_rate"] for s in steps if not s["client_limited"] and (ceiling is None or s["offered_rate"] < ceiling)]
    measured = max(driven) if driven else None
    if declared is not None:
        return {"rps": float(declared), "source": "config", "measured_rps": measured, "ceiling_rps": ceiling}
    return {"rps": measured, "source": "measured", "measured_rps": measured, "ceiling_rps": ceiling}


def search(
    step_runner: Callable[[float], StepResult],
    gates: dict,
    search_cfg: dict,
    *,
    soak_runner: Callable[[float], StepResult] | None = None,
    on_step: Callable[[dict], None] | None = None,
    on_soak: Callable[[dict], None] | None = None,
    arm: str | None = None,
) -> SearchOutcome:
    """Bracket, bisect and confirm. ``gates``/``search_cfg`` must be resolved (defaults filled)."""
    cfg = search_cfg
    steps: list[dict] = []
    soaks: list[dict] = []
    reasons: list[dict] = []

    def run(rate: float, phase: str) -> dict:
        res = step_runner(rate)
        row = step_row(res, judge(res, gates), index=len(steps), phase=phase, arm=arm)
        steps.append(row)
        if on_step:
            on_step(row)
        return row

    def budget() -> bool:
        return len(steps) < cfg["max_steps"]

    lo: float | None = None  # highest passing rate
    hi: float | None = None  # lowest server-failing rate
    ceiling: float | None = None  # lowest client-limited rate
    growth = float(cfg["growth"])
    rate = float(cfg["start_rate_rps"])
    top_reached = False
    # 1. bracket upwards
    while budget():
        row = run(rate, "bracket")
        if row["verdict"] == "pass":
            lo = rate
            if rate >= cfg["max_rate_rps"]:
                top_reached = True
                break
            rate = min(rate * growth, float(cfg["max_rate_rps"]))
        elif row["verdict"] == "fail":
            hi = rate
            break
        else:
            ceiling = rate
            break
    # 1b. the start rate failed: bracket downwards
    if lo is None and hi is not None:
        rate = hi / growth
        while budget() and rate >= cfg["min_rate_rps"]:
            row = run(rate, "bracket")
            if row["verdict"] == "pass":
                lo = rate
                break
            if row["verdict"] == "fail":
                hi = rate
            else:
                ceiling = rate if ceiling is None else min(ceiling, rate)
                break
            rate /= growth

    def upper() -> float | None:
        cands = [x for x in (hi, ceiling) if x is not None]
        return min(cands) if cands else None

    # 2. bisect (geometric midpoint) between lo and the nearest upper bound
    while lo is not None and upper() is not None and (upper() - lo) / lo > cfg["resolution_frac"]:
        if not budget():
            reasons.append({"code": "step_budget_exhausted",
                            "detail": f"max_steps={cfg['max_steps']} reached before resolution {cfg['resolution_frac']}"})
            break
        mid = math.sqrt(lo * upper())
        row = run(mid, "bisect")
        if row["verdict"] == "pass":
            lo = mid
        elif row["verdict"] == "fail":
            hi = mid
        else:
            ceiling = mid if ceiling is None else min(ceiling, mid)

    # 3. classify
    capacity = _client_capacity(steps, gates)
    status = "candidate"
    knee = lo
    above = upper()
    if lo is None:
        status = "no_passing_rate"
        if ceiling is not None and hi is None:
            status = "refused"
            reasons.append({"code": "client_limited_at_low_rate",
                            "detail": f"the load generator was limited at {ceiling:.4g} rps before any step passed"})
        else:
            reasons.append({"code": "no_passing_rate",
                            "detail": f"every step down to {cfg['min_rate_rps']} rps failed the server gates"})
    elif top_reached or above is None:
        status = "no_knee_below_max"
        reasons.append({"code": "no_failing_rate",
                        "detail": f"every step up to {lo:.4g} rps passed (max_rate_rps={cfg['max_rate_rps']})"})
    elif hi is None or (ceiling is not None and ceiling <= hi):
        status = "refused"
        reasons.append({"code": "client_limited",
                        "detail": f"the first rate above the last pass ({above:.4g} rps) was client-limited; the server's "
                                  f"knee is >= {lo:.4g} rps, beyond what this load generator can prove"})
    if status == "candidate" and capacity["rps"] is not None and knee > capacity["rps"] * (1 + 1e-9):
        status = "refused"
        reasons.append({"code": "knee_above_client_capacity",
                        "detail": f"knee {knee:.4g} rps > proven client capacity {capacity['rps']:.4g} rps "
                                  f"({capacity['source']})"})
    if status == "candidate" and capacity["rps"] is None:
        status = "refused"
        reasons.append({"code": "client_capacity_unknown", "detail": "no step proved the client could drive any rate"})

    # 4. confirm with soaks at the knee and at the step above; move by one step when they disagree
    soak_cfg = cfg["soak"]
    count = int(soak_cfg["count"])
    moves_left = int(soak_cfg.get("max_moves", DEFAULT_SEARCH["soak"]["max_moves"]))
    confirmation = {"count": count, "duration_s": soak_cfg["duration_s"], "knee_verdicts": [],
                    "above_verdicts": [], "knee_all_pass": None, "above_any_fail": None, "above_fail_majority": None,
                    "confirmed": False, "moves": [], "soaked": []}
    if status == "candidate":
        srun = soak_runner or step_runner
        verdicts: dict[float, list[str]] = {}  # rate -> soak verdicts, reused when the knee moves
        rnd = [0]

        def soak(pairs: list[tuple[float, str]]) -> None:
            """``count`` rounds over the rates not soaked yet, alternating between them."""
            todo = [(r, w) for r, w in pairs if r not in verdicts]
            for r, _ in todo:
                verdicts[r] = []
            for i in range(count):
                for r, where in todo:
                    res = srun(r)
                    row = step_row(res, judge(res, gates), index=len(soaks), phase=f"soak_{where}", arm=arm)
                    row["soak_round"] = i
                    row["confirm_round"] = rnd[0]
                    soaks.append(row)
                    verdicts[r].append(row["verdict"])
                    if on_soak:
                        on_soak(row)

        step = 1.0 + float(cfg["resolution_frac"])
        passed = sorted(s["offered_rate"] for s in steps if s["verdict"] == "pass")
        failed = sorted(s["offered_rate"] for s in steps if s["verdict"] == "fail")
        while True:
            soak([(knee, "knee"), (above, "above")])
            kv, av = verdicts[knee], verdicts[above]
            k_ok = bool(kv) and all(x == "pass" for x in kv)
            a_fail = any(x == "fail" for x in av)
            limited = any(x == "client_limited" for x in kv + av)
            if (k_ok and a_fail) or limited or not kv or moves_left <= 0:
                break
            if not k_ok:  # the knee is not sustained: the next lower rate, within one step
                below = [r for r in passed if r < knee * (1 - 1e-9)]
                new_knee = max(below[-1], knee / step) if below else knee / step
                move = {"from_knee_rps": knee, "to_knee_rps": new_knee, "direction": "down",
                        "why": f"a knee soak failed at {knee:.4g} rps: {kv}"}
                knee, above = new_knee, knee
            else:  # every soak above passed: the knee is higher, by one step
                if above >= cfg["max_rate_rps"] or (capacity["rps"] is not None and above > capacity["rps"] * (1 + 1e-9)):
                    break  # the new knee would lie beyond what is testable: stays unconfirmed
                # (the new step above may exceed the client capacity proven so far: its soaks prove or
                # refute the client there, and a client-limited soak stops the confirmation)
                higher = [r for r in failed if r > above * (1 + 1e-9)]
                new_above = min(higher[0], above * step) if higher else above * step
                move = {"from_knee_rps": knee, "to_knee_rps": above, "direction": "up",
                        "why": f"every soak passed at the step above, {above:.4g} rps: {av}"}
                knee, above = above, min(new_above, float(cfg["max_rate_rps"]))
            confirmation["moves"].append(move)
            moves_left -= 1
            rnd[0] += 1
        kv, av = verdicts.get(knee, []), verdicts.get(above, [])
        limited = any(x == "client_limited" for x in kv + av)
        confirmation.update(knee_verdicts=kv, above_verdicts=av,
                            knee_all_pass=bool(kv) and all(x == "pass" for x in kv),
                            above_any_fail=any(x == "fail" for x in av),
                            above_fail_majority=bool(av) and sum(x == "fail" for x in av) * 2 > len(av),
                            soaked=[{"rate_rps": r, "verdicts": v} for r, v in sorted(verdicts.items())])
        confirmation["confirmed"] = confirmation["knee_all_pass"] and confirmation["above_any_fail"] and not limited
        if confirmation["confirmed"]:
            status = "confirmed"
        else:
            status = "unconfirmed"
            if not kv:
                reasons.append({"code": "no_soaks", "detail": "soak.count is 0: the knee was not confirmed"})
            else:
                if not confirmation["knee_all_pass"]:
                    reasons.append({"code": "knee_soak_failed",
                                    "detail": f"soaks at {knee:.4g} rps: {kv} (all must pass)"})
                if not confirmation["above_any_fail"]:
                    reasons.append({"code": "above_soak_passed",
                                    "detail": f"soaks at {above:.4g} rps: {av} (at least one must fail the server gates)"})
            if limited:
                reasons.append({"code": "soak_client_limited", "detail": "a soak was client-limited"})
            if confirmation["moves"] and moves_left <= 0:
                reasons.append({"code": "soak_moves_exhausted",
                                "detail": f"the knee moved {len(confirmation['moves'])} time(s) (soak.max_moves) "
                                          "without the soaks agreeing"})

    # every step and soak must have run on one uninterrupted server process
    restarted = [f"{r['phase']}#{r['index']}" for r in steps + soaks
                 if any(str(n).startswith(("server_restarted", "counter_decreased")) for n in r.get("notes") or [])]
    if restarted:
        reasons.append({"code": "server_restarted",
                        "detail": f"restart/counter reset seen in {', '.join(restarted)}: not one deployment"})
        if status == "confirmed":
            status = "unconfirmed"
            confirmation["confirmed"] = False

    # non-monotone evidence: a passing step above a failing one
    fails = [s["offered_rate"] for s in steps if s["verdict"] == "fail"]
    passes = [s["offered_rate"] for s in steps if s["verdict"] == "pass"]
    if fails and passes and max(passes) > min(fails):
        reasons.append({"code": "non_monotone",
                        "detail": f"a step passed at {max(passes):.4g} rps above a failure at {min(fails):.4g} rps"})

    knee_rec = {
        "schema": SCHEMA_KNEE,
        "arm": arm,
        "status": status,
        "knee_rps": knee if status in ("confirmed", "unconfirmed", "refused", "no_knee_below_max") else None,
        "step_above_rps": above if lo is not None else None,
        "bracket": {"last_pass_rps": lo, "first_fail_rps": hi, "client_limited_rps": ceiling},
        "resolution_frac": cfg["resolution_frac"],
        "n_steps": len(steps),
        "n_soaks": len(soaks),
        "client_capacity": capacity,
        "confirmation": confirmation,
        "reasons": reasons,
    }
    return SearchOutcome(steps, soaks, _finite(knee_rec))


# --------------------------------------------------------------------------------------------
# measuring one step against a real (or fake) server


def ols_slope(ts: list[float], ys: list[float]) -> tuple[float | None, float | None]:
    """Least-squares slope of ys on ts and its t statistic (None when residuals are all zero)."""
    n = len(ts)
    if n < 3:
        return None, None
    mt, my = sum(ts) / n, sum(ys) / n
    sxx = sum((t - mt) ** 2 for t in ts)
    if sxx <= 0:
        return None, None
    slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / sxx
    resid = sum((y - my - slope * (t - mt)) ** 2 for t, y in zip(ts, ys, strict=True))
    se = math.sqrt(resid / (n - 2) / sxx) if resid > 0 else 0.0
    if se == 0.0:
        return slope, None
    return slope, slope / se


class MetricsSampler:
    """Polls ``/metrics`` every ``interval`` s in a thread; records scheduler gauges with monotonic time.

    It runs in the load generator's process during the measured window, so it must not hold the GIL for
    milliseconds: the gauges come from :func:`specstudy.measure.prom.scan_gauges` (a line-prefix scan, tens of
    microseconds on a real 57-KB vLLM page) and never from a full parse (~13 ms of CPU per page, which made
    the open-loop dispatch late at 100 req/s on the H200). The raw pages are kept (``pages``: (t, text)
    pairs, references only) so that the step's artifacts hold what was scraped.
    """

    def __init__(self, url: str, interval: float, *, keep_pages: bool = True):
        self.url, self.interval = url, interval
        self.samples: list[dict] = []
        self.pages: list[tuple[float, str]] = []
        self.keep_pages = keep_pages
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="capacity-sampler", daemon=True)

    def _loop(self) -> None:
        from specstudy.measure import prom

        while not self._stop.is_set():
            t = time.monotonic()
            try:
                text = prom.fetch_metrics(self.url, timeout=max(1.0, self.interval * 2))
                g = prom.scan_gauges(text)
                self.samples.append({"t": t, "waiting": g["num_requests_waiting"],
                                     "running": g["num_requests_running"], "kv_cache_usage": g["kv_cache_usage"]})
                if self.keep_pages:
                    self.pages.append((t, text))
            except Exception:  # an unreachable or unreadable scrape is a missing sample, counted
                self.errors += 1
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t)))

    def start(self) -> MetricsSampler:
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.samples


def summarize_step(rate: float, rows: list[dict], client: dict, samples: list[dict], *, t_call: float,
                   warmup_s: float, duration_s: float, before: str | None, after: str | None) -> StepResult:
    """Turn request rows + sampler output + two scrapes into a :class:`StepResult`.

    Measured requests are those scheduled at or after ``warmup_s``; the window is
    ``[warmup_s, warmup_s + duration_s]`` of the load generator's timeline (approximated for the
    sampler by the monotonic time just before ``run_open_loop`` was called).
    """
    from specstudy.measure import prom

    notes = []
    w0, w1 = warmup_s, warmup_s + duration_s
    measured = [r for r in rows if (r.get("scheduled_s") if r.get("scheduled_s") is not None else r.get("start_s", 0)) >= w0]
    ok = [r for r in measured if r.get("success")]
    n = len(measured)
    n_err = n - len(ok)
    window = duration_s
    done = [r for r in rows if r.get("success") and r.get("end_s") is not None and w0 <= r["end_s"] <= w1]
    achieved = len(done) / window if window > 0 else None
    sent = sum(1 for r in measured if r.get("start_s") is not None and w0 <= r["start_s"] <= w1) / window if window > 0 else None
    lateness = [(r["start_s"] - r["scheduled_s"]) * 1e3 for r in measured
                if r.get("start_s") is not None and r.get("scheduled_s") is not None]
    ttft = [r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None]
    tpot = [r["tpot_ms"] for r in ok if r.get("tpot_ms") is not None]
    win = [s for s in samples if w0 <= s["t"] - t_call <= w1 and s.get("waiting") is not None]
    slope, tstat = ols_slope([s["t"] - t_call for s in win], [float(s["waiting"]) for s in win])
    kvs = [s["kv_cache_usage"] for s in win if s.get("kv_cache_usage") is not None]
    preempt = None
    if before is not None and after is not None:
        try:
            preempt = prom.counter_delta(before, after, prom.PREEMPTIONS)
            if prom.restart_evidence(before, after):
                notes.append("server_restarted")
            if prom.decreased_counters(before, after):
                notes.append("counter_decreased")
        except prom.MetricsParseError as exc:
            notes.append(f"metrics_unparseable: {exc}")
    else:
        notes.append("metrics_unreachable")
    if len(win) < 3:
        notes.append(f"too_few_waiting_samples: {len(win)}")
    return StepResult(
        offered_rate=rate,
        achieved_rate=achieved,
        send_rate=sent,
        n_requests=n,
        n_errors=n_err,
        error_rate=(n_err / n) if n else None,
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p95_ms=percentile(ttft, 95),
        tpot_p50_ms=percentile(tpot, 50),
        tpot_p95_ms=percentile(tpot, 95),
        backlog_slope=slope,
        backlog_slope_t=tstat,
        waiting_max=max((float(s["waiting"]) for s in win), default=None),
        waiting_samples=len(win),
        preemptions=preempt,
        kv_cache_usage_max=max(kvs) if kvs else None,
        client=dict(client or {}),
        lateness_ms=lateness if any(r.get("scheduled_s") is not None for r in measured) else None,
        duration_s=duration_s,
        notes=notes,
    )


def loadgen_limits(gates: dict) -> dict:
    """The load generator's ``limits`` matching our client gates (keys as in ``specstudy.measure.loadgen``)."""
    c = gates["client"]
    out = {}
    for ours, theirs in (("max_event_loop_lag_p99_ms", "event_loop_lag_p99_ms"), ("max_cpu_share", "cpu_share"),
                         ("max_pool_wait_p99_ms", "pool_wait_p99_ms")):
        # a disabled gate (null) must not flag through the load generator's default threshold either
        out[theirs] = float(c[ours]) if c.get(ours) is not None else 1e18
    # Lateness is judged by the search itself over the measured sends (judge_lateness); the load generator's
    # own check would take a p99 over the warm-up arrivals too and flag the step through client_flag.
    out["lateness_p99_ms"] = 1e18
    return out


def load_requests(prompts: str | os.PathLike | list, workload: str = "capacity") -> list:
    """``prompts.jsonl`` rows (or a list of rows / RequestSpec) as ``loadgen.RequestSpec``."""
    from specstudy.measure.loadgen import RequestSpec

    if isinstance(prompts, (str, os.PathLike)):
        path = Path(prompts)
        if not path.exists():
            raise ValueError(f"--prompts: {path} does not exist; build the corpus first (prompts.jsonl)")
        rows = atomic.read_jsonl(path)
        src = str(path)
    else:
        rows, src = list(prompts), "<prompts>"
    out = []
    for i, r in enumerate(rows):
        if isinstance(r, RequestSpec):
            out.append(r)
            continue
        for key in ("prompt_id", "messages", "max_tokens"):
            if key not in r:
                raise ValueError(f"{src}: row {i + 1} lacks field '{key}' (rows need prompt_id, messages, max_tokens)")
        out.append(RequestSpec(prompt_id=str(r["prompt_id"]), workload=r.get("workload") or r.get("stratum") or workload,
                               messages=r["messages"], max_tokens=int(r["max_tokens"]),
                               extra_body=dict(r.get("extra_body") or {})))
    if not out:
        raise ValueError(f"{src}: no prompts")
    return out


def make_step_runner(base_url: str, model: str, requests: list, metrics_url: str | None, search_cfg: dict,
                     gates: dict, *, duration_s: float | None = None, artifacts_dir: str | os.PathLike | None = None,
                     kind: str = "step", api_key: str | None = None) -> Callable[[float], StepResult]:
    """A ``step_runner(rate)`` that runs warm-up + window open-loop on the server and samples /metrics.

    Each call draws its arrivals from ``arrival_seed + call index`` and continues the prompt list
    where the previous call stopped (round robin). Raw artifacts go to ``artifacts_dir/<kind>-NNN/``.
    """
    from specstudy.measure import prom

    duration = float(duration_s if duration_s is not None else search_cfg["step_duration_s"])
    warm = float(search_cfg["warmup_s"])
    state: dict[str, Any] = {"calls": 0, "offset": 0, "last_after": None}
    seed0 = int(search_cfg["arrival_seed"]) + (0 if kind == "step" else 100_000)

    def fetch() -> str | None:
        if not metrics_url:
            return None
        try:
            return prom.fetch_metrics(metrics_url)
        except prom.MetricsUnavailable:
            return None

    def runner(rate: float) -> StepResult:
        from specstudy.measure.loadgen import run_open_loop

        idx = state["calls"]
        state["calls"] += 1
        n = max(1, math.ceil(rate * (warm + duration)))
        reqs = [requests[(state["offset"] + i) % len(requests)] for i in range(n)]
        state["offset"] = (state["offset"] + n) % len(requests)
        before = fetch()
        sampler = MetricsSampler(metrics_url, float(search_cfg["sample_interval_s"])).start() if metrics_url else None
        t_call = time.monotonic()
        result = run_open_loop(base_url, model, reqs, rate, arrival_seed=seed0 + idx,
                               request_timeout_s=float(search_cfg["request_timeout_s"]), api_key=api_key,
                               limits=loadgen_limits(gates))
        samples = sampler.stop() if sampler else []
        after = fetch()
        step = summarize_step(rate, result.rows, result.client, samples, t_call=t_call, warmup_s=warm,
                              duration_s=duration, before=before, after=after)
        last = state.get("last_after")
        if last is not None and before is not None:
            try:
                if prom.restart_evidence(last, before):
                    step.notes.append("server_restarted_between_steps")
            except prom.MetricsParseError:
                pass
        if after is not None:
            state["last_after"] = after
        if sampler is not None and sampler.errors:
            step.notes.append(f"sampler_scrape_errors: {sampler.errors}")
        if artifacts_dir is not None:
            d = Path(artifacts_dir) / f"{kind}-{idx:03d}"
            atomic.write_jsonl(d / "requests.jsonl", result.rows)
            atomic.write_jsonl(d / "samples.jsonl", [dict(s, t=s["t"] - t_call) for s in samples])
            if sampler is not None and sampler.pages:
                write_sampled_pages(d / "samples.prom.gz", sampler.pages, t_call)
            atomic.write_json(d / "client.json", _finite(result.client))
            if before is not None:
                atomic.write_text(d / "metrics_before.prom", before)
            if after is not None:
                atomic.write_text(d / "metrics_after.prom", after)
            step.artifacts = str(d)
        return step

    return runner


def write_sampled_pages(path: str | os.PathLike, pages: list[tuple[float, str]], t_call: float) -> None:
    """The sampler's raw ``/metrics`` pages, gzip-compressed, each preceded by ``# specstudy-sample t=<s>``
    (seconds after the step's load generator started; the same clock as ``samples.jsonl``). Written after
    the window, atomically."""
    import gzip

    parts = []
    for t, text in pages:
        parts.append(f"# specstudy-sample t={t - t_call:.6f}\n")
        parts.append(text if text.endswith("\n") else text + "\n")
    atomic.write_bytes(path, gzip.compress("".join(parts).encode("utf-8"), compresslevel=6))


# --------------------------------------------------------------------------------------------
# deployment record, knee comparison




def kv_capacity_tokens(record: dict | None) -> float | None:
    """KV pool in tokens of a deployment record or a knee's deployment summary: the launch log's figure,
    else the ``/metrics`` one (records.kv_cache_tokens), else the summary's own ``kv_capacity_tokens``."""
    tokens = kv_cache_tokens(record, sources=("log", "metrics"))
    return tokens if tokens is not None or not record else _num(record.get("kv_capacity_tokens"))


def _kv_memory_gib(record: dict) -> float | None:
    kv = (record.get("confounds") or {}).get("kv_cache") or {}
    if isinstance(kv, dict) and _num(kv.get("available_memory_gib")) is not None:
        return _num(kv["available_memory_gib"])
    b = _num((record.get("cache_config") or {}).get("kv_cache_memory_bytes"))
    return b / 2**30 if b is not None else None


def deployment_summary(record: dict | str | os.PathLike | None) -> dict | None:
    """The knee's view of the arm's deployment record: id, KV capacity, KV/memory confounds."""
    if record is None:
        return None
    path = None
    if not isinstance(record, dict):
        path = str(record)
        record = atomic.read_json(record)
    conf = record.get("confounds") or {}
    kv_conf = {k: v for k, v in conf.items()
               if any(w in k.lower() for w in ("kv", "cache", "memory", "block", "gpu_mem"))}
    return _finite({
        "path": path,
        "deployment_id": record.get("deployment_id"),
        "phase": record.get("phase"),
        "rep": record.get("rep"),
        "arm": record.get("arm"),
        "kv_capacity_tokens": kv_capacity_tokens(record),
        "kv_cache_memory_gib": _kv_memory_gib(record),
        "cache_config": record.get("cache_config"),
        "confounds": kv_conf,
    })


def _knee(knee: CapacityKnee | dict | str | os.PathLike) -> CapacityKnee:
    """A typed knee from a record, its dict (capacity.run_capacity's return) or its ``knee.json``."""
    if isinstance(knee, CapacityKnee):
        return knee
    return to_record(knee, CapacityKnee, "<knee>") if isinstance(knee, dict) else read_knee(knee)


def compare_knees(baseline_knee: CapacityKnee | dict | str | os.PathLike,
                  candidate_knee: CapacityKnee | dict | str | os.PathLike) -> str:
    """"the draft costs X% of the KV pool and moves the knee by Y" from two ``knee.json`` records."""
    b, c = _knee(baseline_knee), _knee(candidate_knee)
    kb, kc = kv_capacity_tokens(b.deployment), kv_capacity_tokens(c.deployment)
    if kb and kc is not None:
        cost = f"costs {100.0 * (kb - kc) / kb:.1f}% of the KV pool ({kb:,.0f} -> {kc:,.0f} tokens)"
    else:
        cost = "costs an unknown share of the KV pool (no KV capacity in the deployment records)"
    qb, qc = _num(b.knee_rps), _num(c.knee_rps)
    if qb is not None and qc is not None:
        d = qc - qb
        pct = f", {100.0 * d / qb:+.1f}%" if qb else ""
        move = f"moves the knee by {d:+.3g} req/s ({qb:.3g} -> {qc:.3g} req/s{pct})"
    else:
        move = "moves the knee by an unknown amount (a knee is missing)"
    caveats = [f"{name} knee {rec.status}" for name, rec in (("baseline", b), ("candidate", c))
               if rec.status != "confirmed"]
    tail = f" [{'; '.join(caveats)}]" if caveats else ""
    method = ((c.deployment or {}).get("arm") or {}).get("method")  # the summary's arm: the record's, or None
    subject = {None: "the draft", "draft_model": "the draft", "ngram": "n-gram speculation (no draft model)"}.get(
        method, f"the {method} arm")
    return f"{subject} {cost} and {move}{tail}"


# --------------------------------------------------------------------------------------------
# plot


def plot_capacity(steps: list[CapacityStep], soaks: list[CapacityStep], knee: CapacityKnee, gates: dict,
                  path: str | os.PathLike) -> Path:
    """Achieved rate and latency percentiles vs offered rate, gates drawn (matplotlib Agg)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"pass": "tab:green", "fail": "tab:red", "client_limited": "tab:gray"}
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    pts = steps + soaks
    xs = [s.offered_rate for s in pts]
    if xs:
        lim = max(xs) * 1.1
        ax1.plot([0, lim], [0, lim], ls=":", color="k", lw=0.8, label="achieved = offered")
    for verdict, col in colors.items():
        sel = [s for s in pts if s.verdict == verdict and s.achieved_rate is not None]
        ax1.scatter([s.offered_rate for s in sel], [s.achieved_rate for s in sel], c=col, label=verdict,
                    marker="o", s=30)
    ordered = sorted(steps, key=lambda s: s.offered_rate)
    for key, style, gate in (("ttft_p95_ms", "-", gates.get("ttft_p95_ms")), ("ttft_p50_ms", "--", None),
                             ("tpot_p95_ms", "-", gates.get("tpot_p95_ms")), ("tpot_p50_ms", "--", None)):
        sel = [s for s in ordered if getattr(s, key) is not None]
        if sel:
            line = ax2.plot([s.offered_rate for s in sel], [getattr(s, key) for s in sel], style, marker=".",
                            label=key)[0]
            if gate is not None:
                ax2.axhline(gate, color=line.get_color(), lw=0.8, ls=":", label=f"gate {key} = {gate:g}")
    for ax in (ax1, ax2):
        if knee.knee_rps is not None:
            ax.axvline(knee.knee_rps, color="tab:blue", lw=1, label=f"knee {knee.knee_rps:.3g} ({knee.status})")
        cap = knee.client_capacity.rps
        if cap is not None:
            ax.axvline(cap, color="tab:gray", lw=1, ls="--", label=f"client capacity {cap:.3g}")
    ax1.set_ylabel("achieved completions/s")
    ax2.set_ylabel("latency (ms)")
    ax2.set_yscale("log")
    ax2.set_xlabel("offered rate (requests/s, Poisson)")
    ax1.set_title(f"capacity {knee.arm or ''}: {knee.status}")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return atomic.write_bytes(path, buf.getvalue())


# --------------------------------------------------------------------------------------------
# entry points


def run_capacity(base_url: str, model: str, prompts, gates, search_cfg, out_dir, metrics_url: str | None,
                 deployment_record=None, *, arm: str | None = None, api_key: str | None = None,
                 step_runner: Callable[[float], StepResult] | None = None,
                 soak_runner: Callable[[float], StepResult] | None = None, progress=None) -> dict:
    """Run the whole capacity search for one arm against a running server; return ``knee.json``.

    ``gates``/``search_cfg``: dicts, inline JSON or file paths (defaults filled). ``prompts``: a
    ``prompts.jsonl`` path or rows. ``deployment_record``: dict or path of the arm's
    ``deployment.json`` (copied into knee.json: KV capacity, memory confounds). ``step_runner`` /
    ``soak_runner`` replace the real runners (tests). Every step and soak is announced before it
    runs and printed with its verdict after (``progress``: a :class:`specstudy.measure.progress.Progress`,
    else flushed lines on stdout).
    """
    from specstudy.core import schemas

    out = Path(out_dir)
    arm = arm or out.name
    g = resolve_gates(load_json_or_file(gates, "gates"), "gates")
    s = resolve_search(load_json_or_file(search_cfg, "search"), "search")
    dep = deployment_summary(deployment_record)
    for stale in ("steps.jsonl", "soaks.jsonl", "knee.json", "capacity.png"):
        (out / stale).unlink(missing_ok=True)
    prompts_info = None
    if isinstance(prompts, (str, os.PathLike)) and Path(prompts).exists():
        prompts_info = {"path": str(prompts), "sha256": atomic.sha256_file(prompts)}
    atomic.write_json(out / "gates.json", {
        "schema": SCHEMA_GATES, "arm": arm, "gates": g, "search": s, "base_url": base_url, "model": model,
        "metrics_url": metrics_url, "prompts": prompts_info,
        "deployment_id": (dep or {}).get("deployment_id"),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    if step_runner is None:
        requests = load_requests(prompts)
        step_runner = make_step_runner(base_url, model, requests, metrics_url, s, g, artifacts_dir=out / "raw",
                                       kind="step", api_key=api_key)
        soak_runner = soak_runner or make_step_runner(base_url, model, requests, metrics_url, s, g,
                                                      duration_s=s["soak"]["duration_s"], artifacts_dir=out / "raw",
                                                      kind="soak", api_key=api_key)
    steps: list[dict] = []
    soaks: list[dict] = []
    step_runner, soak_runner = _announced(step_runner, "step", s, progress), _announced(soak_runner, "soak", s, progress)

    def on_step(row):
        schemas.validate(row, "capacity-step", out / "steps.jsonl")
        steps.append(row)
        atomic.write_jsonl(out / "steps.jsonl", steps)
        _say(progress, _verdict_line(row, "step"))

    def on_soak(row):
        schemas.validate(row, "capacity-step", out / "soaks.jsonl")
        soaks.append(row)
        atomic.write_jsonl(out / "soaks.jsonl", soaks)
        _say(progress, _verdict_line(row, "soak"))

    outcome = search(step_runner, g, s, soak_runner=soak_runner, on_step=on_step, on_soak=on_soak, arm=arm)
    _say(progress, f"[capacity] {arm}: knee {_fmt(outcome.knee.get('knee_rps'))} req/s, status {outcome.knee.get('status')}")
    if not soaks:
        atomic.write_jsonl(out / "soaks.jsonl", [])
    knee = dict(outcome.knee)
    knee["deployment"] = dep
    knee["gates_file"] = str(out / "gates.json")
    schemas.validate(knee, "capacity-knee", out / "knee.json")
    atomic.write_json(out / "knee.json", knee)
    try:
        plot_capacity([to_record(r, CapacityStep) for r in outcome.steps],
                      [to_record(r, CapacityStep) for r in outcome.soaks], _knee(knee), g, out / "capacity.png")
    except Exception as exc:  # a plot failure must not lose the measurement
        knee["reasons"].append({"code": "plot_failed", "detail": f"{type(exc).__name__}: {exc}"})
        atomic.write_json(out / "knee.json", knee)
    return knee


def _say(progress, message: str) -> None:
    if progress is not None:
        progress.log(message)
    else:
        print(message, flush=True)


def _announced(runner, kind: str, search_cfg: dict, progress):
    """``runner`` that first says which step/soak starts, at what rate and for how long."""
    if runner is None:
        return None
    count = {"n": 0}
    duration = search_cfg["soak"]["duration_s"] if kind == "soak" else search_cfg["step_duration_s"]

    def wrapped(rate: float):
        count["n"] += 1
        if progress is not None:
            progress.detail = f"{kind} {count['n']} at {rate:.4g} req/s"
        _say(progress, f"[capacity] {kind} {count['n']}: offering {rate:.4g} req/s for "
                       f"{search_cfg['warmup_s']:g} s warm-up + {duration:g} s")
        return runner(rate)

    return wrapped


def _verdict_line(row: dict, kind: str) -> str:
    failed = ", ".join(row.get("failed_gates") or []) or "none"
    return (f"[capacity] {kind} {row.get('phase')} #{row.get('index')}: {_fmt(row.get('offered_rate'))} req/s offered, "
            f"{_fmt(row.get('achieved_rate'))} achieved, TTFT p95 {_fmt(row.get('ttft_p95_ms'))} ms, "
            f"TPOT p95 {_fmt(row.get('tpot_p95_ms'))} ms -> {str(row.get('verdict')).upper()}"
            f"{' (client-limited)' if row.get('client_limited') else ''}; failed gates: {failed}")


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.4g}"


# --------------------------------------------------------------------------------------------
# CLI


def _cmd_search(args) -> int:
    try:
        knee = run_capacity(args.base_url, args.model, args.prompts, args.gates, args.search, args.out,
                            args.metrics_url or args.base_url.rstrip("/") + "/metrics",
                            deployment_record=args.deployment_record, arm=args.arm,
                            api_key=os.environ.get(args.api_key_env) if args.api_key_env else None)
    except ValueError as exc:  # bad input (schemas.ValidationError is a ValueError)
        print(f"specstudy capacity search: {exc}")
        return 2
    print(f"{args.out}: knee {knee['knee_rps']} rps, status {knee['status']}")
    return 0


def _cmd_compare(args) -> int:
    print(compare_knees(args.baseline, args.candidate))
    return 0


def _cmd_plot(args) -> int:
    out = Path(args.dir)
    g = atomic.read_json(out / "gates.json")["gates"]
    plot_capacity(read_capacity_steps(out / "steps.jsonl"), read_capacity_steps(out / "soaks.jsonl"),
                  read_knee(out / "knee.json"), g, out / "capacity.png")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("capacity", help="open-loop arrival-rate search (sustainable rate under gates)")
    sub = p.add_subparsers(dest="capacity_command", required=True)
    s = sub.add_parser("search", help="bracket + bisect the Poisson rate of one arm's running server, confirm with soaks")
    s.add_argument("--base-url", required=True, help="OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    s.add_argument("--model", required=True, help="served model name")
    s.add_argument("--prompts", required=True, help="prompts.jsonl of a built corpus")
    s.add_argument("--gates", required=True, help="gates as inline JSON or a JSON/YAML file")
    s.add_argument("--search", default="{}", help="search settings as inline JSON or a JSON/YAML file")
    s.add_argument("--out", required=True, help="output directory, results/capacity/<arm>")
    s.add_argument("--metrics-url", default=None, help="default: <base-url>/metrics")
    s.add_argument("--deployment-record", default=None, help="the arm's deployment.json (KV capacity, memory)")
    s.add_argument("--arm", default=None, help="arm name (default: the --out directory name)")
    s.add_argument("--api-key-env", default=None, help="environment variable holding the API key")
    s.set_defaults(func=_cmd_search)
    c = sub.add_parser("compare", help="'the draft costs X%% of the KV pool and moves the knee by Y'")
    c.add_argument("baseline", help="baseline knee.json")
    c.add_argument("candidate", help="candidate knee.json")
    c.set_defaults(func=_cmd_compare)
    pl = sub.add_parser("plot", help="redraw capacity.png from a capacity output directory")
    pl.add_argument("dir")
    pl.set_defaults(func=_cmd_plot)


__all__ = ["StepResult", "SearchOutcome", "judge", "search", "run_capacity", "compare_knees", "make_step_runner",
           "summarize_step", "plot_capacity", "resolve_gates", "resolve_search", "register"]
