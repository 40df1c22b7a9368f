"""One step of the capacity search: what an open-loop step at one offered rate measured
(:class:`StepResult`), its verdict under the declared gates (:func:`judge`: server gates, load-generator
gates, the schedule-lateness test) and its record, a ``steps.jsonl``/``soaks.jsonl`` row (:func:`step_row`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from specstudy.core.stat_util import percentile
from specstudy.measure.capacity.settings import SCHEMA_STEP

SERVER_GATES = ("ttft_p95", "tpot_p95", "error_rate", "backlog_slope", "preemptions", "kv_cache_usage")
CLIENT_GATES = ("client_lateness", "client_cpu", "client_pool_wait", "client_loop_lag", "client_flag")



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
    return finite(row)


def finite(obj):
    """Replace NaN/inf by None so records stay strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj
