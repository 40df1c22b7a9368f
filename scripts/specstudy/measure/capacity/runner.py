"""Measuring one capacity step against a live (or fake) server: the open-loop run through
:func:`specstudy.measure.loadgen.run_open_loop`, the ``/metrics`` sampler of the scheduler gauges during its
window, and the summary that fills a :class:`~specstudy.measure.capacity.step.StepResult` (and the step's raw
artifacts).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specstudy.core import atomic
from specstudy.core.stat_util import percentile
from specstudy.measure import prom
from specstudy.measure.capacity.step import StepResult, finite


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
    """Polls ``/metrics`` every ``interval`` s in a thread (:class:`~specstudy.measure.prom.MetricsPoller`);
    records scheduler gauges with monotonic time.

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
        self._poller = prom.MetricsPoller(url, interval, self._take, timeout=max(1.0, interval * 2),
                                          name="capacity-sampler")

    def _take(self, t: float, text: str) -> None:
        g = prom.scan_gauges(text)
        self.samples.append({"t": t, "waiting": g["num_requests_waiting"],
                             "running": g["num_requests_running"], "kv_cache_usage": g["kv_cache_usage"]})
        if self.keep_pages:
            self.pages.append((t, text))

    @property
    def errors(self) -> int:
        """Scrapes that failed (missing samples)."""
        return self._poller.errors

    def start(self) -> MetricsSampler:
        self._poller.start()
        return self

    def stop(self) -> list[dict]:
        self._poller.stop(join_timeout=10)
        return self.samples


def summarize_step(rate: float, rows: list[dict], client: dict, samples: list[dict], *, t_call: float,
                   warmup_s: float, duration_s: float, before: str | None, after: str | None) -> StepResult:
    """Turn request rows + sampler output + two scrapes into a :class:`StepResult`.

    Measured requests are those scheduled at or after ``warmup_s``; the window is
    ``[warmup_s, warmup_s + duration_s]`` of the load generator's timeline (approximated for the
    sampler by the monotonic time just before ``run_open_loop`` was called).
    """
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
    out["tail_alpha"] = float(c.get("tail_alpha", 0.05))
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
            atomic.write_json(d / "client.json", finite(result.client))
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
