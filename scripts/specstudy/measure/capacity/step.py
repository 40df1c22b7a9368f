"""One step of the capacity search: what an open-loop step at one offered rate measured
(:class:`StepResult`), its verdict under the declared gates (:func:`judge`: server gates, load-generator
gates, the schedule-lateness test) and its record, a ``steps.jsonl``/``soaks.jsonl`` row (:func:`step_row`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specstudy.core.stat_util import binom_sf, tail_test
from specstudy.measure.capacity.settings import SCHEMA_STEP
from specstudy.measure.loadgen import P99_FRACTION

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
    alpha = c.get("tail_alpha", LATENESS_ALPHA)
    late = judge_lateness(step.lateness_ms, c.get("max_lateness_p99_ms"), c.get("max_late_fraction"), alpha)
    v["client_lateness"] = late["verdict"]
    upper("client_cpu", None if cl.get("cpu_share") is None else float(cl["cpu_share"]), c.get("max_cpu_share"))
    v["client_pool_wait"] = _tail_gate(cl, "pool_wait_p99_ms", c.get("max_pool_wait_p99_ms"), alpha)
    v["client_loop_lag"] = _tail_gate(cl, "event_loop_lag_p99_ms", c.get("max_event_loop_lag_p99_ms"), alpha)
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


#: Default level of the one-sided exact binomial tests of the client gates (gates ``client.tail_alpha``).
LATENESS_ALPHA = 0.05


def judge_lateness(lateness_ms: list | None, late_ms: float | None, max_fraction: float | None,
                   alpha: float = LATENESS_ALPHA) -> dict:
    """The schedule-lateness gate of one step, over its measured sends only.

    A send is *late* when it left more than ``late_ms`` after its scheduled time. The gate fails when the
    measured sends show, by a one-sided exact binomial test at level ``alpha``, that more than
    ``max_fraction`` of sends are late (``P(X >= late | n, max_fraction) < alpha``,
    :func:`specstudy.core.stat_util.tail_test`). With the default 1 % this is the statement "lateness p99 <=
    late_ms" tested with its sample size: a p99 over 48-96 sends is decided by one hiccup, this test needs 3
    late sends of 48 (or ~74 of 6000) to fail. ``verdict`` is ``skipped`` when either limit is null,
    ``no_data`` when no measured send has a lateness.
    """
    t = tail_test(lateness_ms or [], late_ms, max_fraction, alpha)
    return {"n": t["n"], "late_ms": late_ms, "max_fraction": max_fraction, "late": t["late"],
            "fraction": t["fraction"], "p_value": t["p_value"], "p99_ms": t["p99"], "max_ms": t["max"],
            "verdict": t["verdict"]}


def _tail_gate(client: dict, key: str, limit: float | None, alpha: float) -> str:
    """A client gate on a ``*_p99_ms`` limit, from the load generator's test record (``client["tail_tests"]``).

    The load generator counted its samples above the limit the search passed it (``runner.loadgen_limits``);
    the gate tests that count with the search's own level ``alpha``: ``fail`` when more than 1 % of the
    samples are late by the one-sided exact binomial test, never from the p99 alone. ``skipped`` for a null
    limit, ``no_data`` when the client record holds no test of ``key``.
    """
    if limit is None:
        return "skipped"
    t = (client.get("tail_tests") or {}).get(key)
    if not t or not t.get("n") or t.get("late") is None:
        return "no_data"
    if t.get("limit") is None or float(t["limit"]) != float(limit):
        raise ValueError(f"capacity gate {key}: the load generator counted late samples above {t.get('limit')!r} ms, "
                         f"the gate's limit is {limit!r} ms; pass the gates' limits to the load generator "
                         "(runner.loadgen_limits)")
    return "fail" if binom_sf(int(t["late"]), int(t["n"]), P99_FRACTION) < alpha else "pass"


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
        **_tail_fields(cl, "event_loop_lag", "event_loop_lag_p99_ms"),
        **_tail_fields(cl, "pool_wait", "pool_wait_p99_ms"),
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


def _tail_fields(client: dict, prefix: str, key: str) -> dict:
    """The raw figures of the load generator's test of ``key`` (samples, late, p value, max), for a step row."""
    t = (client.get("tail_tests") or {}).get(key) or {}
    return {f"{prefix}_samples": t.get("n"), f"{prefix}_late": t.get("late"), f"{prefix}_p_value": t.get("p_value"),
            f"{prefix}_max_ms": t.get("max")}


def finite(obj):
    """Replace NaN/inf by None so records stay strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj
