"""One benchmark cell: warm-up, ``/metrics`` snapshots, measured closed-loop run, summary, validity.

:func:`summarize` is a pure function of the request rows and the two scrapes; every number in
``summary.json`` can be recomputed from ``requests.jsonl`` + ``metrics_{before,after}.prom``.
Definitions and validity rules: ``docs/metrics.md``.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

from specstudy.core import atomic
from specstudy.core.stat_util import percentile
from specstudy.core.timestamps import utc_iso
from specstudy.measure import prom

SCHEMA = "specstudy.cell/1"
SCHEMA_NAME = "cell-summary"
PERCENTILE_METHOD = "numpy.percentile(method='linear') (Hyndman-Fan type 7); mean = math.fsum/n"
OK_FINISH_REASONS = ("stop", "length")

# code -> effect. "reject": the cell is invalid; "throughput": throughput and TPOT are invalid.
REASON_EFFECT = {
    "low_success_rate": "reject",
    "counter_decreased": "reject",
    "metrics_unreachable": "reject",
    "server_restarted": "reject",
    "loadgen_limited": "reject",
    "deployment_failed": "reject",
    "corpus_mismatch": "reject",
    "cell_error": "reject",
    "jit_in_window": "reject",  # only under the pre-registered consequence ``reject`` (specstudy.analysis.jit)
    "missing_usage": "throughput",
    "foreign_traffic": "throughput",
}

DEFAULT_THRESHOLDS = {
    "min_success_rate": 0.99,
    # |server generation-token delta − client completion-token sum| allowed before foreign_traffic
    "foreign_traffic_rel_tol": 0.01,
    "foreign_traffic_abs_tokens": 8,
}

KEY_FIELDS = (
    "phase",
    "arm",
    "method",
    "num_speculative_tokens",
    "draft_tensor_parallel_size",
    "rep",
    "workload",
    "concurrency",
    "deployment_id",
)


# ----------------------------------------------------------------------------- small helpers


def cell_fingerprint(spec: dict) -> str:
    """sha256 (hex) of the canonical JSON of the cell spec (sorted keys, no whitespace, UTF-8)."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def distribution(values) -> dict:
    """count, mean, p50, p95, p99 of ``values`` (linear interpolation, numpy's; stat_util); Nones when empty."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None}
    p50, p95, p99 = (percentile(vals, q) for q in (50, 95, 99))
    return {"count": len(vals), "mean": math.fsum(vals) / len(vals), "p50": p50, "p95": p95, "p99": p99}


def is_success(row: dict) -> bool:
    """Row success as the summary counts it: the loadgen's ``success`` flag AND HTTP 200 AND no
    error AND finish reason ``stop``/``length`` (anything else — abort, error, None — is a failure)."""
    return (
        bool(row.get("success"))
        and row.get("status_code") in (200, None)
        and row.get("error") is None
        and row.get("finish_reason") in OK_FINISH_REASONS
    )


def has_usage(row: dict) -> bool:
    return bool(row.get("usage_present", row.get("completion_tokens") is not None)) and row.get("completion_tokens") is not None


def _reason(code: str, detail: str) -> dict:
    if code not in REASON_EFFECT:
        raise ValueError(f"unknown validity reason code {code!r}; known: {sorted(REASON_EFFECT)}")
    return {"code": code, "detail": detail}


# Disclosed limits of a check that could only be made in part; they change no validity flag.
NOTE_CODES = ("foreign_traffic_partial", "foreign_traffic_unchecked", "jit_in_window", "summary_only")


def _note(code: str, detail: str) -> dict:
    if code not in NOTE_CODES:
        raise ValueError(f"unknown validity note code {code!r}; known: {list(NOTE_CODES)}")
    return {"code": code, "detail": detail}


def _validity(reasons: list[dict], *, wall_ok: bool = True, notes: list[dict] | None = None) -> dict:
    codes = {r["code"] for r in reasons}
    rejected = any(REASON_EFFECT[c] == "reject" for c in codes)
    tput_bad = any(REASON_EFFECT[c] == "throughput" for c in codes)
    return {
        "valid": not rejected,
        "reasons": reasons,
        "notes": list(notes or []),
        "latency_valid": not rejected,
        "tpot_valid": not rejected and not tput_bad,
        "throughput_valid": not rejected and not tput_bad and wall_ok,
    }


# kind: repeat | drift | upstream; rep_label: the rep<n>/drift<n> path component; chat_template_kwargs: the
# workload's chat-template switch (docs/thinking.md)
OPTIONAL_KEY_FIELDS = ("kind", "rep_label", "chat_template_kwargs")


def _keys(keys: dict) -> dict:
    missing = [k for k in KEY_FIELDS if k not in keys]
    if missing:
        raise ValueError(f"cell keys: missing field(s) {missing}; required: {list(KEY_FIELDS)}")
    out = {k: keys[k] for k in KEY_FIELDS}
    if keys.get("tensor_parallel_size") is not None:  # the target's TP (the draft's is draft_tensor_parallel_size)
        out["tensor_parallel_size"] = int(keys["tensor_parallel_size"])
    # A drift baseline (drift<n>) shares its rep number with rep<n>: kind and rep_label tell them apart.
    out.update({k: keys[k] for k in OPTIONAL_KEY_FIELDS if keys.get(k) is not None})
    return out


def _iso(ts: float | None) -> str | None:
    return None if ts is None else utc_iso(ts)


def _tokens_per_event(ok_rows: list[dict]) -> dict:
    """Histogram of tokens carried per content event (continuous usage) + the usage-based ratio."""
    hist: dict[str, int] = {}
    n = 0
    tot = 0
    for r in ok_rows:
        tpe = r.get("tokens_per_event")
        if not tpe:
            continue
        for t in tpe:
            t = int(t)
            hist[str(t)] = hist.get(str(t), 0) + 1
            n += 1
            tot += t
    events = sum(int(r.get("n_content_events") or 0) for r in ok_rows if has_usage(r))
    comp = sum(int(r["completion_tokens"]) for r in ok_rows if has_usage(r))
    return {
        "source": "continuous_usage" if n else "unavailable",
        "count": n,
        "histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "mean": tot / n if n else None,
        "multi_token_events": sum(c for k, c in hist.items() if int(k) > 1),
        "completion_tokens_per_content_event": comp / events if events else None,
    }


def _summ_telemetry(telemetry) -> dict | None:
    """``telemetry`` is a ready dict (kept) or a list of sample dicts (mean/max of numeric fields)."""
    if telemetry is None or isinstance(telemetry, dict):
        return telemetry
    fields: dict[str, list[float]] = {}
    for s in telemetry:
        for k, v in s.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                fields.setdefault(k, []).append(float(v))
    return {
        "samples": len(telemetry),
        "fields": {k: {"mean": math.fsum(v) / len(v), "max": max(v)} for k, v in sorted(fields.items())},
    }


# ----------------------------------------------------------------------------- summary


def summarize(
    rows: list[dict],
    before_text: str | None,
    after_text: str | None,
    *,
    keys: dict,
    corpus: dict,
    client: dict | None,
    telemetry=None,
    confounds: dict | None = None,
    warmup_counts: dict | None = None,
    thresholds: dict | None = None,
    fingerprint: str | None = None,
    wall_seconds: float | None = None,
    wall_source: str | None = None,
    metrics_errors: dict | None = None,
    times: dict | None = None,
) -> dict:
    """The cell summary (schema ``cell-summary``) of one measured window.

    ``before_text``/``after_text`` are the raw ``/metrics`` scrapes (None when unreachable;
    ``metrics_errors`` {"before"/"after": message} adds the cause). ``wall_seconds`` overrides the
    wall time only when the rows carry no ``start_s``/``end_s`` (imported upstream cells).
    """
    th = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    metrics_errors = metrics_errors or {}
    reasons: list[dict] = []
    notes: list[dict] = []

    attempted = len(rows)
    ok = [r for r in rows if is_success(r)]
    failed = [r for r in rows if not is_success(r)]
    success_rate = len(ok) / attempted if attempted else None
    no_usage = [r for r in ok if not has_usage(r)]
    failures_by: dict[str, int] = {}
    for r in failed:
        why = r.get("finish_reason") if r.get("error") is None else "error"
        if r.get("status_code") not in (200, None):
            why = f"http_{r.get('status_code')}"
        failures_by[str(why)] = failures_by.get(str(why), 0) + 1

    if success_rate is None or success_rate < th["min_success_rate"]:
        reasons.append(
            _reason(
                "low_success_rate",
                f"{len(ok)}/{attempted} requests succeeded (finish reason stop/length, HTTP 200); "
                f"minimum success rate {th['min_success_rate']}; failures by cause {failures_by}",
            )
        )
    if no_usage:
        reasons.append(
            _reason(
                "missing_usage",
                f"{len(no_usage)} of {len(ok)} successful requests carried no usage record "
                f"(request_index {[r.get('request_index') for r in no_usage][:10]}); throughput and TPOT invalid",
            )
        )

    # wall time: first request start -> last request end (all attempted requests)
    starts = [r["start_s"] for r in rows if r.get("start_s") is not None]
    ends = [r["end_s"] for r in rows if r.get("end_s") is not None]
    if rows and len(starts) == attempted and len(ends) == attempted:
        wall = max(ends) - min(starts)
        wall_src = "rows: max(end_s) - min(start_s)"
    elif wall_seconds is not None:
        wall = float(wall_seconds)
        wall_src = wall_source or "given"
    else:
        wall, wall_src = None, None

    prompt_sum = sum(int(r["prompt_tokens"]) for r in ok if r.get("prompt_tokens") is not None)
    comp_sum = sum(int(r["completion_tokens"]) for r in ok if has_usage(r))
    tput = comp_sum / wall if wall else None

    # server side
    snaps: dict[str, prom.Snapshot | None] = {}
    for side, text in (("before", before_text), ("after", after_text)):
        if text is None:
            snaps[side] = None
            continue
        try:
            snaps[side] = prom.parse(text)
        except prom.MetricsParseError as exc:
            snaps[side] = None
            metrics_errors = {**metrics_errors, side: str(exc)}
    unreachable = [s for s in ("before", "after") if snaps[s] is None]
    speculative: dict[str, Any] = {"enabled": None}
    server: dict[str, Any] = {"available": False}
    if unreachable:
        reasons.append(
            _reason(
                "metrics_unreachable",
                "; ".join(f"{s}: {metrics_errors.get(s, 'no scrape')}" for s in unreachable),
            )
        )
    else:
        b, a = snaps["before"], snaps["after"]
        evidence = prom.restart_evidence(b, a)
        if evidence:
            reasons.append(_reason("server_restarted", "; ".join(evidence[:5])))
        dec = prom.decreased_counters(b, a)
        if dec:
            shown = ", ".join(f"{d['name']}{d['labels']} {d['before']}->{d['after']}" for d in dec[:5])
            reasons.append(_reason("counter_decreased", f"{len(dec)} cumulative series decreased: {shown}"))
        speculative = prom.speculative_block(b, a)
        server = {"available": True, **prom.server_deltas(b, a)}

        # foreign traffic: server-side generated tokens / finished requests vs what our clients saw.
        # Known tokens: every row with usage (successful rows, and failed rows that still reported usage);
        # a request the server answered with an HTTP error generated nothing. Tokens of any other failed
        # request without usage are unknown: then only "server generated fewer than the clients received"
        # can be checked, and the summary says so in a validity note.
        def _known_zero(r: dict) -> bool:
            return r.get("status_code") not in (200, None)

        client_comp_all = sum(int(r["completion_tokens"]) for r in rows if r.get("completion_tokens") is not None)
        unknown_rows = [r for r in rows if r.get("completion_tokens") is None and not _known_zero(r)]
        rows_without_usage = sum(1 for r in rows if r.get("completion_tokens") is None)
        gen = server["generation_tokens"]
        tol = max(th["foreign_traffic_abs_tokens"], th["foreign_traffic_rel_tol"] * client_comp_all)
        server["client_completion_tokens"] = client_comp_all
        server["client_rows_without_usage"] = rows_without_usage
        server["client_rows_unknown_tokens"] = len(unknown_rows)
        server["generation_tokens_minus_client"] = None if gen is None else gen - client_comp_all
        server["foreign_traffic_tolerance_tokens"] = tol
        foreign = []
        if dec or evidence:
            server["foreign_traffic_token_check"] = "not made: counters decreased or the server restarted (see reasons)"
        elif gen is None:
            server["foreign_traffic_token_check"] = "not made: no generation-token counter"
            notes.append(_note("foreign_traffic_unchecked",
                               "the server exposes no vllm:generation_tokens_total counter: the foreign-traffic "
                               "token check was not made (only the finished-request count was compared)"))
        else:
            diff = gen - client_comp_all
            if unknown_rows:
                server["foreign_traffic_token_check"] = "lower bound only"
                notes.append(_note(
                    "foreign_traffic_partial",
                    f"{len(unknown_rows)} failed request(s) without usage (request_index "
                    f"{[r.get('request_index') for r in unknown_rows][:10]}) may have generated tokens the client "
                    f"never saw: only 'server generated fewer tokens than the clients received' was checked "
                    f"({client_comp_all} tokens from {len(rows) - rows_without_usage} request(s) with usage, server "
                    f"{gen:g}); extra server tokens up to any amount are attributed to those requests"))
            else:
                server["foreign_traffic_token_check"] = "done"
            if diff > tol and not unknown_rows:
                foreign.append(
                    f"server generated {gen:g} tokens in the window, clients received {client_comp_all} "
                    f"(+{diff:g} > tolerance {tol:g}): traffic from another client or unfinished requests"
                )
            elif diff < -tol:
                foreign.append(
                    f"server counted {gen:g} generated tokens, clients received {client_comp_all} "
                    f"({diff:g} < -{tol:g}): counters do not cover the window or another server answered"
                )
        fin = server["requests_finished"]
        if fin is not None and not dec and not evidence and fin > attempted:
            foreign.append(f"server finished {fin:g} requests in the window, clients sent {attempted}")
        # requests the load generator did not send: the server's API request count against the rows (a request of
        # another client is counted whatever became of it: refused, failed or served)
        recv = server["requests_received"]
        server["requests_sent"] = attempted
        server["requests_not_sent_by_loadgen"] = None
        if dec or evidence:
            server["foreign_request_check"] = "not made: counters decreased or the server restarted (see reasons)"
        elif recv is None:
            server["foreign_request_check"] = "not made: the server exposes no http_requests_total counter"
        else:
            server["foreign_request_check"] = "done"
            server["requests_not_sent_by_loadgen"] = max(0.0, recv - attempted)
            if recv > attempted:
                foreign.append(f"server answered {recv:g} API requests in the window, the load generator sent "
                               f"{attempted}: {recv - attempted:g} came from another client")
        if foreign:
            reasons.append(_reason("foreign_traffic", "; ".join(foreign)))

    client = dict(client or {})
    if client.get("limited"):
        why = client.get("limited_reasons") or ["limited flag set"]
        reasons.append(
            _reason(
                "loadgen_limited",
                "the load generator, not the server, limited the offered load: " + "; ".join(map(str, why)),
            )
        )

    # a cell where the speculative counters cannot be attributed to our requests
    if speculative.get("enabled"):
        speculative["attributable"] = not any(
            r["code"] in ("foreign_traffic", "counter_decreased", "server_restarted", "metrics_unreachable")
            for r in reasons
        )

    starts_unix = [r["start_unix"] for r in rows if r.get("start_unix") is not None]
    if times is None:
        t0 = min(starts_unix) if starts_unix else None
        times = {
            "started_at": _iso(t0),
            "ended_at": _iso(t0 + wall) if (t0 is not None and wall is not None) else None,
        }

    summary = {
        "schema": SCHEMA,
        "keys": _keys(keys),
        "fingerprint": fingerprint,
        "corpus": {k: corpus.get(k) for k in ("name", "version", "digest")},
        "validity": _validity(reasons, wall_ok=wall is not None and wall > 0, notes=notes),
        "requests": {
            "attempted": attempted,
            "successful": len(ok),
            "failed": len(failed),
            "success_rate": success_rate,
            "missing_usage": len(no_usage),
            "failures_by_cause": failures_by,
            "requests_per_second": len(ok) / wall if wall else None,
        },
        "tokens": {"prompt": prompt_sum, "completion": comp_sum, "output_tokens_per_second": tput},
        "wall_seconds": wall,
        "wall_source": wall_src,
        "percentile_method": PERCENTILE_METHOD,
        "latency_ms": {
            "ttft": distribution(r.get("ttft_ms") for r in ok),
            "tpot": distribution(r.get("tpot_ms") for r in ok),
            "e2e": distribution(r.get("e2e_ms") for r in ok),
            "stream_event_gap": distribution(g for r in ok for g in (r.get("stream_event_gaps_ms") or [])),
        },
        "tokens_per_event": _tokens_per_event(ok),
        "speculative": speculative,
        "server_deltas": server,
        "loadgen": client,
        "telemetry": _summ_telemetry(telemetry),
        "confounds": confounds,
        "warmup": warmup_counts,
        "times": times,
    }
    return summary


def failed_summary(keys: dict, corpus: dict, reason_code: str, detail: str, *, fingerprint: str | None = None) -> dict:
    """Summary of a cell that could not be measured (``deployment_failed``, ``corpus_mismatch``,
    ``cell_error``: the measurement raised; the exception is the detail)."""
    empty = {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None}
    return {
        "schema": SCHEMA,
        "keys": _keys(keys),
        "fingerprint": fingerprint,
        "corpus": {k: (corpus or {}).get(k) for k in ("name", "version", "digest")},
        "validity": _validity([_reason(reason_code, detail)], wall_ok=False),
        "requests": {
            "attempted": 0,
            "successful": 0,
            "failed": 0,
            "success_rate": None,
            "missing_usage": 0,
            "failures_by_cause": {},
            "requests_per_second": None,
        },
        "tokens": {"prompt": 0, "completion": 0, "output_tokens_per_second": None},
        "wall_seconds": None,
        "wall_source": None,
        "percentile_method": PERCENTILE_METHOD,
        "latency_ms": {k: dict(empty) for k in ("ttft", "tpot", "e2e", "stream_event_gap")},
        "tokens_per_event": _tokens_per_event([]),
        "speculative": {"enabled": None},
        "server_deltas": {"available": False},
        "loadgen": {},
        "telemetry": None,
        "confounds": None,
        "warmup": None,
        "times": {"started_at": None, "ended_at": None},
    }


def validate_summary(summary: dict, source: str | Path = "<cell summary>") -> dict:
    from specstudy.core import schemas

    return schemas.validate(summary, SCHEMA_NAME, source)


# ----------------------------------------------------------------------------- running a cell


def _scrape(url: str | None, timeout: float) -> tuple[str | None, str | None]:
    if not url:
        return None, "no metrics URL configured"
    try:
        return prom.fetch_metrics(url, timeout), None
    except prom.MetricsUnavailable as exc:
        return None, str(exc)


def drain(metrics_url: str | None, timeout_s: float, *, poll_s: float = 0.5, fetch_timeout_s: float = 5.0,
          alive=None) -> dict:
    """Wait until vllm:num_requests_running + waiting == 0 (or ``timeout_s``); report what happened.

    ``alive`` (optional callable): when it returns False the server is gone and waiting stops at once.
    """
    t0 = time.monotonic()
    last = None
    err = None
    while True:
        if alive is not None and not alive():
            return {"drained": False, "seconds": time.monotonic() - t0, "running_plus_waiting": last,
                    "error": "server exited"}
        text, err = _scrape(metrics_url, fetch_timeout_s)
        if text is not None:
            try:
                g = prom.gauges(text)
                last = (g["num_requests_running"] or 0.0) + (g["num_requests_waiting"] or 0.0)
                err = None
            except prom.MetricsParseError as exc:
                err = str(exc)
            if last == 0:
                return {"drained": True, "seconds": time.monotonic() - t0, "running_plus_waiting": 0.0, "error": None}
        if time.monotonic() - t0 >= timeout_s:
            return {"drained": False, "seconds": time.monotonic() - t0, "running_plus_waiting": last, "error": err}
        time.sleep(poll_s)


def run_cell(
    base_url: str,
    model: str,
    requests: list,
    warmup_requests: list,
    concurrency: int,
    out_dir: str | Path,
    *,
    keys: dict,
    corpus: dict,
    metrics_url: str | None,
    fingerprint: str,
    api_key: str | None = None,
    sampler=None,
    drain_timeout_s: float = 120.0,
    temperature: float = 0.0,
    seed: int | None = None,
    request_timeout_s: float = 600.0,
    limits: dict | None = None,
    confounds: dict | None = None,
    thresholds: dict | None = None,
    metrics_timeout_s: float = 10.0,
    progress=None,
    alive=None,
) -> dict:
    """Measure one cell and write its raw artifacts + ``summary.json`` atomically into ``out_dir``.

    Order: warm-up (same requests shape and concurrency) → scrape ``metrics_before`` → closed-loop
    run of ``requests`` → scrape ``metrics_after`` → drain. An unreachable ``/metrics`` becomes the
    reason ``metrics_unreachable``, never an exception. ``sampler`` (optional) has ``start()`` and
    ``stop()``; ``stop()`` returns a list of telemetry sample dicts (written to telemetry.jsonl) or a
    ready summary dict. ``progress`` (optional, :class:`specstudy.measure.progress.Progress`) is told the
    warm-up/measure/drain phases and every finished request. ``alive`` (optional callable) tells the drain that the server died, so a
    dead server is not waited for.
    """
    from specstudy.measure import loadgen

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    common = dict(temperature=temperature, seed=seed, request_timeout_s=request_timeout_s, api_key=api_key, limits=limits)
    if progress is not None:
        common["on_row"] = progress.request_done

    def mark(phase: str, n: int | None = None) -> None:
        if progress is not None:
            if n is not None:
                progress.start_requests(n)
            progress.phase(phase, cell=f"{keys.get('workload')}/c{keys.get('concurrency')}")

    warm_counts = {"attempted": 0, "successful": 0}
    warm_rows: list[dict] = []
    if warmup_requests:
        mark("warmup", len(warmup_requests))
        warm = loadgen.run_closed_loop(base_url, model, list(warmup_requests), concurrency, **common)
        warm_rows = warm.rows
        warm_counts = {"attempted": len(warm.rows), "successful": sum(1 for r in warm.rows if is_success(r))}
    atomic.write_jsonl(out / "warmup.jsonl", warm_rows)

    errors: dict[str, str] = {}
    before, err = _scrape(metrics_url, metrics_timeout_s)
    if err:
        errors["before"] = err
    if sampler is not None:
        sampler.start()
    mark("measure", len(requests))
    started = time.time()
    try:
        result = loadgen.run_closed_loop(base_url, model, list(requests), concurrency, **common)
    finally:
        samples = sampler.stop() if sampler is not None else None
    after, err = _scrape(metrics_url, metrics_timeout_s)
    if err:
        errors["after"] = err
    mark("drain")
    drained = drain(metrics_url, drain_timeout_s, alive=alive)
    if progress is not None:
        progress.end_phase()

    atomic.write_jsonl(out / "requests.jsonl", result.rows)
    if before is not None:
        atomic.write_text(out / "metrics_before.prom", before)
    if after is not None:
        atomic.write_text(out / "metrics_after.prom", after)
    if isinstance(samples, list):
        atomic.write_jsonl(out / "telemetry.jsonl", samples)

    client = dict(result.client or {})
    wall = None
    if result.rows and all(r.get("start_s") is not None for r in result.rows):
        wall = max(r["end_s"] for r in result.rows) - min(r["start_s"] for r in result.rows)
    t0 = min((r.get("start_unix") for r in result.rows if r.get("start_unix")), default=started)
    times = {"started_at": _iso(t0), "ended_at": _iso(t0 + wall) if (t0 is not None and wall is not None) else None}
    summary = summarize(
        result.rows,
        before,
        after,
        keys=keys,
        corpus=corpus,
        client=client,
        telemetry=samples,
        confounds=confounds,
        warmup_counts=warm_counts,
        thresholds=thresholds,
        fingerprint=fingerprint,
        metrics_errors=errors,
        times=times,
    )
    summary["drain"] = drained
    from specstudy.core.integrity import seal

    seal(summary)  # tables re-computes this digest: an edited summary is refused (issue 29)
    validate_summary(summary, out / "summary.json")
    atomic.write_json(out / "summary.json", summary)
    return summary
