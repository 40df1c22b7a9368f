"""Asyncio load generator: the measuring instrument of the study.

One process, one event loop, aiohttp. Two drivers share one per-request coroutine:

* :func:`run_closed_loop` — ``concurrency`` workers take the next request in list order until all are issued.
* :func:`run_open_loop` — Poisson arrivals (exponential gaps from ``arrival_seed``) on an absolute timeline:
  request *i* is sent at ``t0 + sum(gaps[:i+1])``, never "sleep after the previous one".

Every request is one streamed ``POST /v1/chat/completions`` with ``stream_options: {include_usage: true,
continuous_usage_stats: true}``. Each request yields one *request row* (``docs/DESIGN.md``, "Request row").
While it runs the generator measures itself (event-loop lag, CPU share, schedule lateness, connection-pool
waits, achieved vs offered rate) and sets ``client["limited"]`` when it may have distorted the measurement.
See ``docs/loadgen.md`` for the definitions.

Only the standard library (and msgspec, when installed; and specstudy.core.stat_util, stdlib only) are imported at
module import; aiohttp is imported when a run starts. Events are decoded with msgspec when it is installed (it is a vLLM dependency), ``json`` otherwise.

Kept as one module (over ~700 lines): it is one instrument; both drivers share the per-request coroutine,
the self-measurement and the timer thread, and the module must import with no third-party package required
(aiohttp only when a run starts), which is easiest to keep true of one file.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from specstudy.core.stat_util import percentile, tail_test  # stdlib only

# ----------------------------------------------------------------------------------------- event decoding
# One SSE event is decoded straight into the few fields the row needs. With msgspec (a vLLM dependency) this is
# a typed decode into Structs (~3x faster than json.loads, unknown fields skipped); without it, json.loads plus
# a small converter with the same attributes and the same type checks.


class EventShapeError(ValueError):
    """The event is valid JSON but not shaped like a chat.completion.chunk."""


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _opt(d: dict, key: str, types) -> Any:
    v = d.get(key)
    if v is not None and not isinstance(v, types):
        raise EventShapeError(f"field {key!r} has type {type(v).__name__}")
    return v


def _event_from_dict(d: Any) -> _Obj:
    if not isinstance(d, dict):
        raise EventShapeError(f"event is a JSON {type(d).__name__}, not an object")
    choices = _opt(d, "choices", list)
    if choices is not None:
        conv = []
        for c in choices:
            if not isinstance(c, dict):
                raise EventShapeError("choice is not an object")
            delta = _opt(c, "delta", dict)
            if delta is not None:
                delta = _Obj(
                    content=_opt(delta, "content", str),
                    reasoning_content=_opt(delta, "reasoning_content", str),
                    reasoning=_opt(delta, "reasoning", str),
                    tool_calls=delta.get("tool_calls"),
                )
            token_ids = _opt(c, "token_ids", list)
            if token_ids is not None and not all(isinstance(t, int) and not isinstance(t, bool) for t in token_ids):
                raise EventShapeError("field 'token_ids' holds a non-integer")
            conv.append(_Obj(delta=delta, finish_reason=_opt(c, "finish_reason", str), token_ids=token_ids))
        choices = conv
    usage = _opt(d, "usage", dict)
    if usage is not None:
        usage = _Obj(completion_tokens=_opt(usage, "completion_tokens", int),
                     prompt_tokens=_opt(usage, "prompt_tokens", int))  # fmt: skip
    return _Obj(choices=choices, usage=usage, error=d.get("error"), object=d.get("object"), message=d.get("message"))


def _json_decode_event(data: bytes) -> _Obj:
    return _event_from_dict(json.loads(data))


try:
    import msgspec as _msgspec

    class _Delta(_msgspec.Struct):
        content: str | None = None
        reasoning_content: str | None = None
        reasoning: str | None = None
        tool_calls: Any = None

    class _Choice(_msgspec.Struct):
        delta: _Delta | None = None
        finish_reason: str | None = None
        token_ids: list[int] | None = None  # vLLM, when the request asks for return_token_ids

    class _Usage(_msgspec.Struct):
        completion_tokens: int | None = None
        prompt_tokens: int | None = None

    class _Event(_msgspec.Struct):
        choices: list[_Choice] | None = None
        usage: _Usage | None = None
        error: Any = None
        object: Any = None
        message: Any = None

    _decode_event = _msgspec.json.Decoder(_Event).decode
    _ShapeErrors: tuple = (EventShapeError, _msgspec.ValidationError)
    JSON_DECODER = f"msgspec {_msgspec.__version__}"
except ImportError:  # pragma: no cover - exercised by a test that forces the fallback
    _decode_event = _json_decode_event
    _ShapeErrors = (EventShapeError,)
    JSON_DECODER = "json"


__all__ = [
    "DEFAULT_LIMITS",
    "LoadResult",
    "RequestSpec",
    "arun_closed_loop",
    "arun_open_loop",
    "judge_limits",
    "poisson_schedule",
    "run_closed_loop",
    "run_open_loop",
]

#: The limits that set ``client["limited"]`` (``limits=`` overrides individual keys). A ``*_p99_ms`` key states
#: "the p99 of these samples is at most this", judged with the run's sample size (:func:`judge_limits`); the
#: test level of those judgements is ``tail_alpha``. ``cpu_share`` is one figure per run, compared directly.
DEFAULT_LIMITS: dict[str, float] = {
    "event_loop_lag_p99_ms": 20.0,
    "cpu_share": 0.9,
    "lateness_p99_ms": 2.0,  # open loop only
    "pool_wait_p99_ms": 5.0,
    "tail_alpha": 0.05,
}

#: The share of samples a ``*_p99_ms`` limit lets exceed it: the p99 statement.
P99_FRACTION = 0.01

#: Each ``*_p99_ms`` limit and the self-measurement (key of ``client``, samples in ms) it bounds.
TAIL_LIMITS: dict[str, str] = {
    "event_loop_lag_p99_ms": "event_loop_lag_ms",
    "pool_wait_p99_ms": "pool_wait_ms",
    "lateness_p99_ms": "lateness_ms",
}

#: Interval of the event-loop lag ticker.
LAG_TICK_S = 0.010
#: A lag sample above this is a stall worth its time stamp in ``client["event_loop_stalls"]``; at most MAX_STALLS kept.
STALL_MS = 5.0
MAX_STALLS = 20

_SUCCESS_FINISH = frozenset(("stop", "length"))


@dataclass
class RequestSpec:
    prompt_id: str
    workload: str
    messages: list[dict]  # OpenAI chat messages
    max_tokens: int
    extra_body: dict = field(default_factory=dict)  # e.g. {"ignore_eos": False}


@dataclass
class LoadResult:
    rows: list[dict]  # request rows, in request_index order
    client: dict  # self-measurement and the `limited` flag


# --------------------------------------------------------------------------------------------- helpers


def _dist(values: list[float]) -> dict:
    """``{p50, p99, max}`` in the values' unit, ``None`` entries when there are no values."""
    if not values:
        return {"count": 0, "p50": None, "p99": None, "max": None}
    s = sorted(values)
    return {"count": len(s), "p50": round(percentile(s, 50), 4), "p99": round(percentile(s, 99), 4), "max": round(s[-1], 4)}


def poisson_schedule(n: int, rate_rps: float, seed: int) -> list[float]:
    """Send offsets (seconds after the window start) of ``n`` Poisson arrivals at ``rate_rps``.

    Offset *i* is the cumulative sum of the first *i+1* exponential gaps drawn from ``random.Random(seed)``,
    so the schedule depends only on ``(n, rate_rps, seed)``.
    """
    if not rate_rps > 0:
        raise ValueError(f"open loop: rate_rps must be > 0, got {rate_rps!r}; pass a positive request rate")
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(rate_rps)
        out.append(t)
    return out


def _resolve_limits(limits: dict | None) -> dict[str, float]:
    out = dict(DEFAULT_LIMITS)
    for key, value in (limits or {}).items():
        if key not in DEFAULT_LIMITS:
            raise ValueError(
                f"loadgen limits: unknown key {key!r}; valid keys are {sorted(DEFAULT_LIMITS)} (fix the `limits` dict)"
            )
        out[key] = float(value)
    if not 0.0 < out["tail_alpha"] < 1.0:
        raise ValueError(f"loadgen limits: 'tail_alpha' must lie strictly between 0 and 1, got {out['tail_alpha']!r} "
                         "(the level of the tests of the *_p99_ms limits; the default is 0.05)")
    return out


def judge_limits(samples_ms: dict[str, list[float] | None], cpu_share: float | None,
                 thresholds: dict[str, float]) -> tuple[dict[str, dict], list[str]]:
    """The ``limited`` verdict of one run: ``(tail_tests, reasons)``; the run is limited when ``reasons``.

    ``samples_ms`` maps a self-measurement (``event_loop_lag_ms``, ``pool_wait_ms``, ``lateness_ms``) to its
    samples in ms (``None``: not measured, e.g. lateness in a closed loop). A ``*_p99_ms`` limit *L* is never
    decided by the p99 itself: over the tens to hundreds of samples of a cell the p99 is the largest sample or
    two, so one hiccup would decide it. It is judged by :func:`specstudy.core.stat_util.tail_test`: a sample
    above *L* is late, and the limit fails only when a one-sided exact binomial test at ``tail_alpha`` shows
    that more than :data:`P99_FRACTION` (1 %) of the samples are late. ``tail_tests`` keeps each test's raw
    figures (``n``, ``late``, ``fraction``, ``p_value``, ``p99``, ``max``, ``verdict``). ``cpu_share`` is
    compared with its limit directly.
    """
    tests: dict[str, dict] = {}
    reasons: list[str] = []
    for key, name in TAIL_LIMITS.items():
        values = samples_ms.get(name)
        if values is None:
            continue
        t = tail_test(values, thresholds[key], P99_FRACTION, thresholds["tail_alpha"])
        t["p99"] = None if t["p99"] is None else round(t["p99"], 4)
        t["max"] = None if t["max"] is None else round(t["max"], 4)
        tests[key] = t
    order = ["event_loop_lag_p99_ms", "cpu_share", "pool_wait_p99_ms", "lateness_p99_ms"]
    for key in order:
        if key == "cpu_share":
            if cpu_share is not None and cpu_share > thresholds["cpu_share"]:
                reasons.append(f"cpu_share={cpu_share:.4g} > {thresholds['cpu_share']:g}")
            continue
        t = tests.get(key)
        if t is not None and t["verdict"] == "fail":
            reasons.append(
                f"{key}: {t['late']} of {t['n']} samples > {t['limit']:g} ms ({t['fraction']:.1%}, more than "
                f"{P99_FRACTION:.0%} at p = {t['p_value']:.2g} < {t['alpha']:g}); p99 {t['p99']:.4g}, max {t['max']:.4g}"
            )
    return tests, reasons


def _payload(model: str, spec: RequestSpec, temperature: float, seed: int | None) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "messages": spec.messages,
        "max_tokens": spec.max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if seed is not None:
        body["seed"] = seed
    body.update(spec.extra_body or {})
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


def _raise_nofile(needed: int) -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):  # best effort
        pass


# --------------------------------------------------------------------------------------------- one request


class _Run:
    """State shared by all requests of one run (session, timing origin, self-measurement)."""

    def __init__(self, base_url: str, model: str, request_timeout_s: float, keep_text: bool, api_key: str | None):
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self.model = model
        self.request_timeout_s = request_timeout_s
        self.keep_text = keep_text
        self.api_key = api_key or None
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            self.headers["Authorization"] = f"Bearer {self.api_key}"
        self.t0 = 0.0
        self.unix0 = 0.0
        self.session = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.pool_waits: list[float] = []  # seconds queued for a free connection, one per request

    def _scrub(self, text: str) -> str:
        if self.api_key and self.api_key in text:
            text = text.replace(self.api_key, "***")
        return text

    async def one(self, index: int, spec: RequestSpec, body: bytes, scheduled_s: float | None) -> dict:
        perf = time.perf_counter
        status = None
        error = None
        finish_reason = None
        done = False
        usage = None
        times: list[float] = []  # arrival time (perf_counter) of each content event
        cums: list[Any] = []  # cumulative completion_tokens at each content event (None when absent)
        parts: list[str] = []
        token_ids: list[int] | None = None  # generated ids, when the server streams them (vLLM return_token_ids)
        trace_ctx: dict = {}
        self.in_flight += 1
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight
        start = perf()
        try:
            async with self.session.post(
                self.url, data=body, headers=self.headers, trace_request_ctx=trace_ctx
            ) as resp:
                status = resp.status
                if status != 200:
                    raw = await resp.content.read(1024)
                    error = f"HTTP {status}: {raw.decode('utf-8', 'replace').strip()}"
                else:
                    buf = b""
                    decode = _decode_event
                    stream = resp.content
                    eof = False
                    while not eof and error is None:
                        chunk = await stream.readany()
                        now = perf()
                        if not chunk:
                            eof = True
                            if not buf:
                                break
                            lines = [buf]  # unterminated last line
                            buf = b""
                        else:
                            if buf:
                                chunk = buf + chunk
                            lines = chunk.split(b"\n")
                            buf = lines.pop()
                        for line in lines:
                            if not line or not line.startswith(b"data:"):
                                continue  # blank separators, comments (":"), event:/id: fields
                            data = line[5:].strip()
                            if data == b"[DONE]":
                                done = True
                                continue
                            try:
                                ev = decode(data)
                            except _ShapeErrors as exc:
                                error = f"unexpected SSE event shape ({exc}): {data.decode('utf-8', 'replace')!r}"
                                break
                            except Exception:  # malformed JSON is data, never a crash
                                error = f"malformed JSON in SSE event: {data.decode('utf-8', 'replace')!r}"
                                break
                            if ev.error is not None or ev.object == "error":
                                err = ev.error if ev.error is not None else ev.message
                                msg = err.get("message", err) if isinstance(err, dict) else err
                                error = f"error event in stream: {msg}"
                                break
                            u = ev.usage
                            if u is not None:
                                usage = u
                            choices = ev.choices
                            if choices:
                                choice = choices[0]
                                if choice.token_ids is not None:
                                    if token_ids is None:
                                        token_ids = []
                                    token_ids.extend(choice.token_ids)
                                delta = choice.delta
                                if delta is not None:
                                    content = delta.content
                                    reasoning = delta.reasoning_content or delta.reasoning
                                    if content or reasoning or delta.tool_calls:
                                        times.append(now)
                                        cums.append(None if u is None else u.completion_tokens)
                                        if reasoning:
                                            parts.append(reasoning)
                                        if content:
                                            parts.append(content)
                                if choice.finish_reason:
                                    finish_reason = choice.finish_reason
                    if error is None and not done:
                        error = "stream ended before data: [DONE]"
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            error = f"request timed out after {self.request_timeout_s} s"
        except Exception as exc:  # connection errors etc. are data
            error = f"{type(exc).__name__}: {exc}"
        end = perf()
        self.in_flight -= 1
        self.pool_waits.append(trace_ctx.get("queued", 0.0))

        # ---- row (all bookkeeping happens once per request, after the stream)
        n_events = len(times)
        ttft_ms = (times[0] - start) * 1e3 if n_events else None
        e2e_ms = (times[-1] - start) * 1e3 if n_events else None
        completion_tokens = prompt_tokens = None
        if usage is not None:
            completion_tokens = usage.completion_tokens
            prompt_tokens = usage.prompt_tokens
        usage_present = completion_tokens is not None
        tpot_ms = None
        if usage_present and completion_tokens > 1 and n_events:
            tpot_ms = (e2e_ms - ttft_ms) / (completion_tokens - 1)
        tokens_per_event = None
        if n_events and all(c is not None for c in cums):
            tokens_per_event = []
            prev = 0
            for c in cums:
                tokens_per_event.append(c - prev)
                prev = c
        if error is None and finish_reason not in _SUCCESS_FINISH:
            error = f"finish_reason {finish_reason!r} is not 'stop' or 'length'"
        success = error is None and status == 200 and done
        if error is not None:  # scrub the key first, then bound the length
            error = self._scrub(error)[:400]
        text = "".join(parts)
        text_bytes = text.encode("utf-8")
        row = {
            "request_index": index,
            "prompt_id": spec.prompt_id,
            "workload": spec.workload,
            "scheduled_s": None if scheduled_s is None else round(scheduled_s, 6),
            "start_s": round(start - self.t0, 6),
            "end_s": round(end - self.t0, 6),
            "start_unix": round(self.unix0 + (start - self.t0), 6),
            "ttft_ms": None if ttft_ms is None else round(ttft_ms, 3),
            "e2e_ms": None if e2e_ms is None else round(e2e_ms, 3),
            "tpot_ms": None if tpot_ms is None else round(tpot_ms, 4),
            "completion_tokens": completion_tokens,
            "prompt_tokens": prompt_tokens,
            "usage_present": usage_present,
            "finish_reason": finish_reason,
            "status_code": status,
            "error": error,
            "success": success,
            "n_content_events": n_events,
            "stream_event_gaps_ms": [round((b - a) * 1e3, 3) for a, b in zip(times, times[1:], strict=False)],
            "tokens_per_event": tokens_per_event,
            "output_sha256": hashlib.sha256(text_bytes).hexdigest(),
            "output_chars": len(text),
        }
        if spec.extra_body:  # what this request set on its own (a per-request seed, ignore_eos): kept with it
            row["request_params"] = dict(spec.extra_body)
        if self.keep_text:
            row["output_text"] = text
            if token_ids is not None:  # only when the server streamed them (the request asked for them)
                row["completion_token_ids"] = token_ids
        return row


def _trace_config():
    import aiohttp

    tc = aiohttp.TraceConfig()

    async def queued_start(session, ctx, params):
        ctx.trace_request_ctx["q0"] = time.perf_counter()

    async def queued_end(session, ctx, params):
        t = ctx.trace_request_ctx
        t["queued"] = time.perf_counter() - t.get("q0", time.perf_counter())

    tc.on_connection_queued_start.append(queued_start)
    tc.on_connection_queued_end.append(queued_end)
    return tc


async def _lag_ticker(lags: list[float], stop: asyncio.Event, ticks: list[float] | None = None) -> None:
    perf = time.perf_counter
    nxt = perf() + LAG_TICK_S
    while not stop.is_set():
        await asyncio.sleep(max(0.0, nxt - perf()))
        now = perf()
        lags.append(max(0.0, now - nxt))
        if ticks is not None:
            ticks.append(now)
        nxt = now + LAG_TICK_S


def _stalls(lags: list[float], ticks: list[float], t0: float, unix0: float) -> list[dict]:
    """The worst event-loop stalls (lag above :data:`STALL_MS`, at most :data:`MAX_STALLS`, largest first), each
    with when the loop woke from it: ``at_s`` into the run and ``unix``, so that a stall can be set against
    what else ran then (the cell's telemetry rows carry ``unix`` too)."""
    worst = sorted(((lag, t) for lag, t in zip(lags, ticks, strict=True) if lag * 1e3 > STALL_MS), reverse=True)
    return [{"ms": round(lag * 1e3, 3), "at_s": round(t - t0, 4), "unix": round(unix0 + (t - t0), 4)}
            for lag, t in worst[:MAX_STALLS]]


def _timer_thread(loop, t0: float, schedule: list[float], fire, stop: threading.Event) -> None:
    """Wake at each scheduled send time with ``clock_nanosleep`` precision and hand the index to the loop.

    asyncio timers wake through ``epoll_wait`` whose timeout has 1 ms granularity (rounded up), which alone
    makes ~0.5 ms mean and ~1 ms p99 lateness. ``call_soon_threadsafe`` wakes the loop through its self-pipe at
    once, so the send time is limited only by the thread's wake-up (~0.1 ms) and by how busy the loop is.
    """
    perf = time.perf_counter
    for i, offset in enumerate(schedule):
        target = t0 + offset
        while True:
            remaining = target - perf()
            if remaining <= 0:
                break
            time.sleep(remaining)
        if stop.is_set():
            return
        try:
            loop.call_soon_threadsafe(fire, i)
        except RuntimeError:  # loop closed: the run was abandoned
            return


async def _open_loop_dispatch(run: _Run, requests: list[RequestSpec], bodies: list[bytes], schedule: list[float]):
    loop = asyncio.get_running_loop()
    n = len(requests)
    tasks: list[asyncio.Task] = []
    all_fired = loop.create_future()

    def fire(i: int) -> None:
        tasks.append(loop.create_task(run.one(i, requests[i], bodies[i], schedule[i])))
        if i == n - 1 and not all_fired.done():
            all_fired.set_result(None)

    if n == 0:
        return []
    stop = threading.Event()
    thread = threading.Thread(
        target=_timer_thread, args=(loop, run.t0, schedule, fire, stop), name="loadgen-timer", daemon=True
    )
    thread.start()
    try:
        await all_fired
        return await asyncio.gather(*tasks)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()


async def _run(
    mode: str,
    base_url: str,
    model: str,
    requests: list[RequestSpec],
    *,
    concurrency: int | None,
    rate_rps: float | None,
    arrival_seed: int | None,
    temperature: float,
    seed: int | None,
    request_timeout_s: float,
    keep_text: bool,
    api_key: str | None,
    limits: dict | None,
    on_row=None,
) -> LoadResult:
    import aiohttp

    thresholds = _resolve_limits(limits)
    n = len(requests)
    bodies = [_payload(model, spec, temperature, seed) for spec in requests]  # encoded before the window
    schedule = poisson_schedule(n, rate_rps, arrival_seed) if mode == "open" else None
    conn_limit = concurrency if mode == "closed" else 0  # 0 = unlimited: an open loop must never queue
    _raise_nofile((concurrency or n) + 256)

    run = _Run(base_url, model, request_timeout_s, keep_text, api_key)
    connector = aiohttp.TCPConnector(limit=conn_limit, limit_per_host=0, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    rows: list[dict | None] = [None] * n
    lags: list[float] = []
    ticks: list[float] = []
    stop = asyncio.Event()
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trace_configs=[_trace_config()], auto_decompress=False
    ) as session:
        run.session = session
        # A full collection that traverses every object of the process (all imported modules) stalls the loop for
        # ~20 ms; freezing what exists now limits collections during the window to the run's own objects.
        gc.collect()
        gc.freeze()
        ticker = asyncio.create_task(_lag_ticker(lags, stop, ticks))
        try:
            cpu0 = time.process_time()
            run.unix0 = time.time()
            run.t0 = t0 = time.perf_counter()
            if mode == "closed":
                it = iter(range(n))

                async def worker() -> None:
                    for i in it:
                        rows[i] = await run.one(i, requests[i], bodies[i], None)
                        if on_row is not None:  # progress display; never part of the measured row
                            on_row(rows[i])

                await asyncio.gather(*(worker() for _ in range(min(concurrency, n) if n else 0)))
            else:
                done_rows = await _open_loop_dispatch(run, requests, bodies, schedule)
                for i, row in enumerate(done_rows):
                    rows[i] = row
            t_end = time.perf_counter()
            cpu = time.process_time() - cpu0
        finally:
            stop.set()
            await ticker
            gc.unfreeze()
    wall = t_end - t0

    client: dict[str, Any] = {
        "mode": mode,
        "concurrency": concurrency,
        "connector_limit": conn_limit,
        "json_decoder": JSON_DECODER,
        "event_loop": type(asyncio.get_running_loop()).__module__,
        "n_requests": n,
        "wall_seconds": round(wall, 6),
        "cpu_seconds": round(cpu, 6),
        "cpu_share": round(cpu / wall, 4) if wall > 0 else None,
        "event_loop_lag_ms": _dist([x * 1e3 for x in lags]),
        "event_loop_stalls": _stalls(lags, ticks, t0, run.unix0),
        "pool_wait_ms": _dist([x * 1e3 for x in run.pool_waits]),
        "max_in_flight": run.max_in_flight,
    }
    starts = [r["start_s"] for r in rows]
    if mode == "open":
        lateness = [r["start_s"] - r["scheduled_s"] for r in rows]
        client["arrival_seed"] = arrival_seed
        client["lateness_ms"] = _dist([x * 1e3 for x in lateness])
        client["offered_rate"] = rate_rps
        client["scheduled_rate"] = round(n / schedule[-1], 4) if n and schedule[-1] > 0 else None
        client["achieved_rate"] = round(n / max(starts), 4) if n and max(starts) > 0 else None
    else:
        client["lateness_ms"] = None
        client["offered_rate"] = None
        client["scheduled_rate"] = None
        done = [r["end_s"] for r in rows]
        client["achieved_rate"] = round(n / max(done), 4) if n and max(done) > 0 else None

    tests: dict[str, dict] = {}
    reasons: list[str] = []
    if n:  # an empty run measured nothing and cannot be limited
        samples = {"event_loop_lag_ms": [x * 1e3 for x in lags], "pool_wait_ms": [x * 1e3 for x in run.pool_waits],
                   "lateness_ms": [x * 1e3 for x in lateness] if mode == "open" else None}
        tests, reasons = judge_limits(samples, client["cpu_share"], thresholds)
    client["limits"] = thresholds
    client["tail_tests"] = tests
    client["limited"] = bool(reasons)
    client["limited_reasons"] = reasons
    return LoadResult(rows=rows, client=client)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------- public API


async def arun_closed_loop(
    base_url: str,
    model: str,
    requests: list[RequestSpec],
    concurrency: int,
    *,
    temperature: float = 0.0,
    seed: int | None = None,
    request_timeout_s: float = 600,
    keep_text: bool = False,
    api_key: str | None = None,
    limits: dict | None = None,
    on_row=None,
) -> LoadResult:
    """Async form of :func:`run_closed_loop` (for callers that already run an event loop)."""
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"closed loop: concurrency must be an integer >= 1, got {concurrency!r}")
    return await _run(
        "closed", base_url, model, requests, concurrency=concurrency, rate_rps=None, arrival_seed=None,
        temperature=temperature, seed=seed, request_timeout_s=request_timeout_s, keep_text=keep_text,
        api_key=api_key, limits=limits, on_row=on_row,
    )  # fmt: skip


async def arun_open_loop(
    base_url: str,
    model: str,
    requests: list[RequestSpec],
    rate_rps: float,
    *,
    arrival_seed: int,
    temperature: float = 0.0,
    seed: int | None = None,
    request_timeout_s: float = 600,
    keep_text: bool = False,
    api_key: str | None = None,
    limits: dict | None = None,
) -> LoadResult:
    """Async form of :func:`run_open_loop`."""
    if not (isinstance(rate_rps, int | float) and rate_rps > 0):
        raise ValueError(f"open loop: rate_rps must be a number > 0, got {rate_rps!r}")
    return await _run(
        "open", base_url, model, requests, concurrency=None, rate_rps=float(rate_rps), arrival_seed=arrival_seed,
        temperature=temperature, seed=seed, request_timeout_s=request_timeout_s, keep_text=keep_text,
        api_key=api_key, limits=limits,
    )  # fmt: skip


def _asyncio_run(coro):
    if os.environ.get("SPECSTUDY_LOADGEN_UVLOOP") == "1":  # opt-in; the default loop is the stdlib one
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def run_closed_loop(
    base_url: str,
    model: str,
    requests: list[RequestSpec],
    concurrency: int,
    *,
    temperature: float = 0.0,
    seed: int | None = None,
    request_timeout_s: float = 600,
    keep_text: bool = False,
    api_key: str | None = None,
    limits: dict | None = None,
    on_row=None,
) -> LoadResult:
    """Send ``requests`` with ``concurrency`` workers, each taking the next request in list order.

    ``on_row(row)``, if given, is called in the event loop as each request finishes (live progress)."""
    return _asyncio_run(
        arun_closed_loop(
            base_url, model, requests, concurrency, temperature=temperature, seed=seed,
            request_timeout_s=request_timeout_s, keep_text=keep_text, api_key=api_key, limits=limits,
            on_row=on_row,
        )
    )  # fmt: skip


def run_open_loop(
    base_url: str,
    model: str,
    requests: list[RequestSpec],
    rate_rps: float,
    *,
    arrival_seed: int,
    temperature: float = 0.0,
    seed: int | None = None,
    request_timeout_s: float = 600,
    keep_text: bool = False,
    api_key: str | None = None,
    limits: dict | None = None,
) -> LoadResult:
    """Send ``requests`` at Poisson arrivals of ``rate_rps`` on an absolute timeline seeded by ``arrival_seed``."""
    return _asyncio_run(
        arun_open_loop(
            base_url, model, requests, rate_rps, arrival_seed=arrival_seed, temperature=temperature, seed=seed,
            request_timeout_s=request_timeout_s, keep_text=keep_text, api_key=api_key, limits=limits,
        )
    )  # fmt: skip


# --------------------------------------------------------------------------------------------- CLI


def register(subparsers) -> None:
    """``specstudy loadgen``: run one closed- or open-loop measurement against a running server."""
    p = subparsers.add_parser(
        "loadgen",
        help="stream a corpus at a running OpenAI-compatible server (manual measurement / debugging)",
        description="Writes <out>/requests.jsonl (request rows) and <out>/client.json (self-measurement).",
    )
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="served model name")
    p.add_argument("--prompts", required=True, help="corpus prompts.jsonl (prompt_id, messages, max_tokens)")
    p.add_argument("--workload", default=None, help="workload name (default: the row's stratum)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--concurrency", type=int, help="closed loop with this many workers")
    mode.add_argument("--rate", type=float, help="open loop: Poisson arrivals at this many requests/s")
    p.add_argument("--arrival-seed", type=int, default=0)
    p.add_argument("--num-requests", type=int, default=None, help="cycle/truncate the corpus to this many requests")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--request-timeout-s", type=float, default=600.0)
    p.add_argument("--keep-text", action="store_true")
    p.add_argument("--api-key-env", default=None, help="name of an environment variable holding the API key")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    from specstudy.core import atomic

    rows = atomic.read_jsonl(args.prompts)
    specs = []
    for i, r in enumerate(rows):
        missing = [k for k in ("prompt_id", "messages", "max_tokens") if k not in r]
        if missing:
            raise SystemExit(f"{args.prompts}: row {i + 1} lacks field(s) {missing}; corpus rows need prompt_id, "
                             "messages, max_tokens")  # fmt: skip
        workload = args.workload or r.get("workload") or r.get("stratum") or "default"
        specs.append(RequestSpec(str(r["prompt_id"]), workload, r["messages"], int(r["max_tokens"]),
                                 dict(r.get("extra_body") or {})))  # fmt: skip
    if not specs:
        raise SystemExit(f"{args.prompts}: no prompts")
    if args.num_requests is not None:
        specs = [specs[i % len(specs)] for i in range(args.num_requests)]
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise SystemExit(f"--api-key-env: environment variable {args.api_key_env} is not set")
    common = dict(temperature=args.temperature, seed=args.seed, request_timeout_s=args.request_timeout_s,
                  keep_text=args.keep_text, api_key=api_key)  # fmt: skip
    if args.concurrency is not None:
        res = run_closed_loop(args.base_url, args.model, specs, args.concurrency, **common)
    else:
        res = run_open_loop(args.base_url, args.model, specs, args.rate, arrival_seed=args.arrival_seed, **common)
    atomic.write_jsonl(os.path.join(args.out, "requests.jsonl"), res.rows)
    atomic.write_json(os.path.join(args.out, "client.json"), res.client)
    ok = sum(r["success"] for r in res.rows)
    print(f"{ok}/{len(res.rows)} requests succeeded; limited={res.client['limited']} {res.client['limited_reasons']}")
    if res.rows and not ok:
        first = next((r["error"] for r in res.rows if r.get("error")), "unsuccessful")
        print(f"specstudy loadgen: error: none of the {len(res.rows)} requests to {args.base_url} succeeded; first "
              f"error: {first}. Check --base-url and --model (the rows in {args.out}/requests.jsonl keep every error).",
              file=sys.stderr)
        return 1
    return 0
