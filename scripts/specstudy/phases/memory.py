"""Memory capacity phase (issue #20 item 3): KV cost, advertised KV pool, a no-preemption concurrency sweep.

Per arm this measures what the engine's memory allows, beside the capacity knee (``capacity``):

- :func:`kv_cost`: KV-cache bytes per token from the HF ``config.json`` (2 × layers × KV heads × head dim
  × dtype bytes) for the target and, for a ``draft_model`` arm, the draft. vLLM puts the draft's attention
  layers into the *same* KV pool as the target's (``llm_base_proposer.load_model`` registers them in the
  forward context; ``get_kv_cache_groups`` puts all full-attention layers into one group whose block
  holds every layer's page), so one pool token of a draft arm costs target + draft bytes.
- :func:`advertised`: the KV pool as the launch log states it (``<device> KV cache size: N tokens``, the
  KV memory in GiB) and as ``/metrics`` states it (``vllm:cache_config_info``: blocks × block size), both
  kept, labelled, never converted into each other.
- :func:`run_sweep`: for each context length L and each concurrency c (ascending), c simultaneous
  ``/v1/completions`` requests whose prompts are exactly L tokens (token-id prompts: vLLM's completions
  endpoint accepts ``prompt: list[int]`` and adds nothing to it), ``ignore_eos`` with ``max_tokens`` =
  ``output_tokens``; ``/metrics`` before/after (preemption counter) and sampled during the step (running,
  waiting, KV usage). The result at L is the largest c whose step had every request successful, zero
  preemptions and all c running at once; the ascent at L stops after the first step that fails that.
- :func:`nvml_memory`: per-GPU used/total bytes, or the reason there are none.
- :func:`summarize`: every arm's record joined to its capacity knee: ``summary.json`` + ``section.md``.

Registered as the ``memory`` phase (:mod:`specstudy.phases.registry`; its design in
:mod:`specstudy.study.phase_decl`): a deployment runs the sweep before (instead of) cells, and the phase's
summary joins every arm's sweep to its capacity knee. CLI: ``specstudy phase summary memory`` and
``specstudy phase memory kv-cost``. Imports ``core``, ``measure``, ``deployment.launchlog`` and the registry.
docs/memory.md has the definitions and the embedded settings.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from specstudy.core import atomic, schemas
from specstudy.core.errors import UserError
from specstudy.core.timestamps import utc_iso, utc_now
from specstudy.measure import prom
from specstudy.phases.registry import Phase, register_phase

SCHEMA = "specstudy.memory/1"
STEP_SCHEMA = "specstudy.memory-step/1"
SUMMARY_SCHEMA = "specstudy.memory-summary/1"
GIB = 2**30

# Bytes per element of a KV-cache dtype (vLLM's --dtype / --kv-cache-dtype spellings).
DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4,
               "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "int8": 1, "uint8": 1}
POOL_RULE = ("vLLM keeps the draft's attention layers in the target's KV pool (one KV-cache group; a block holds "
             "every layer's page: vllm/v1/spec_decode/llm_base_proposer.py load_model, "
             "vllm/v1/core/kv_cache_utils.py get_kv_cache_groups and _get_kv_cache_bytes_per_block), so one pool "
             "token of a draft_model arm costs the target's bytes plus the draft's")


# --------------------------------------------------------------------------------------------------
# KV cost
# --------------------------------------------------------------------------------------------------
def _read_config(model_dir: str | os.PathLike, role: str) -> tuple[dict, Path]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise UserError(f"{path}: no config.json for the {role} model; pass the model's directory "
                        f"(the one holding config.json) as {'draft_dir' if role == 'draft' else 'model_dir'}")
    cfg = atomic.read_json(path)
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: config.json is not a JSON object")
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        inner = dict(cfg["text_config"])
        for key in ("dtype", "torch_dtype"):
            inner.setdefault(key, cfg.get(key))
        return inner, path
    return cfg, path


def _resolve_dtype(dtype: str | None, config_dtype: str | None, kv_cache_dtype: str | None,
                   source: Path) -> tuple[str, int, str]:
    """(dtype name, bytes per element, how it was chosen) of the KV cache, as vLLM resolves it."""
    if kv_cache_dtype not in (None, "auto"):
        name = str(kv_cache_dtype).lower()
        if name not in DTYPE_BYTES:
            raise UserError(f"kv_cache_dtype {kv_cache_dtype!r}: unknown; use one of {sorted(DTYPE_BYTES)} or 'auto'")
        return name, DTYPE_BYTES[name], "kv_cache_dtype given"
    if dtype not in (None, "auto"):
        name = str(dtype).lower().replace("torch.", "")
        if name not in DTYPE_BYTES:
            raise UserError(f"dtype {dtype!r}: unknown; use one of {sorted(DTYPE_BYTES)} or 'auto' (the engine's --dtype)")
        return name, DTYPE_BYTES[name], "engine dtype given"
    cfg_name = str(config_dtype or "float32").lower().replace("torch.", "")
    if cfg_name not in DTYPE_BYTES:
        raise UserError(f"{source}: field 'dtype' (or 'torch_dtype') is {config_dtype!r}, not a known dtype; "
                        f"pass dtype= the engine's --dtype")
    if DTYPE_BYTES[cfg_name] == 4:
        # vllm/config/model.py _resolve_auto_dtype: dtype=auto downcasts a float32 model to the platform's
        # first supported dtype (a 16-bit type on CUDA and on CPU).
        return "16-bit (auto)", 2, f"dtype=auto: config.json says {cfg_name}, which vLLM downcasts to 16 bit"
    return cfg_name, DTYPE_BYTES[cfg_name], f"dtype=auto: config.json says {cfg_name}"


def _model_kv(model_dir, role: str, dtype, kv_cache_dtype, tp: int) -> dict:
    cfg, path = _read_config(model_dir, role)
    if cfg.get("kv_lora_rank") is not None:
        raise UserError(f"{path}: field 'kv_lora_rank' is set (multi-head latent attention); its KV cost is not "
                        f"2 × layers × KV heads × head dim: read the pool from the launch log (memory.advertised)")
    for key in ("num_hidden_layers", "num_attention_heads"):
        if not isinstance(cfg.get(key), int) or cfg[key] < 1:
            raise UserError(f"{path}: field '{key}' is missing or not a positive integer; a decoder config.json is needed")
    layers, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or (cfg.get("hidden_size", 0) // heads)
    if not head_dim:
        raise UserError(f"{path}: neither 'head_dim' nor 'hidden_size' gives the head dimension")
    name, nbytes, how = _resolve_dtype(dtype, cfg.get("dtype") or cfg.get("torch_dtype"), kv_cache_dtype, path)
    per_rank_heads = max(1, kv_heads // tp)  # fewer KV heads than ranks: vLLM replicates one per rank
    notes = []
    if cfg.get("sliding_window") or any(t != "full_attention" for t in cfg.get("layer_types") or []):
        notes.append("config.json declares sliding-window layers: their KV is bounded by the window, so the per-token "
                     "cost here is an upper bound for long contexts")
    return {"path": str(model_dir), "config": str(path), "num_hidden_layers": layers, "num_key_value_heads": kv_heads,
            "head_dim": head_dim, "dtype": name, "dtype_bytes": nbytes, "dtype_source": how,
            "bytes_per_token": 2 * layers * kv_heads * head_dim * nbytes,
            "bytes_per_token_per_rank": 2 * layers * per_rank_heads * head_dim * nbytes, "notes": notes}


def kv_cost(model_dir: str | os.PathLike, *, dtype: str | None = None, draft_dir: str | os.PathLike | None = None,
            kv_cache_dtype: str | None = None, tensor_parallel_size: int = 1) -> dict:
    """KV-cache bytes per token of the target and (``draft_dir``) the draft, and of one pool token.

    ``dtype``: the engine's ``--dtype`` (None or ``auto``: vLLM's rule on config.json's dtype, which
    downcasts float32 to 16 bit); ``kv_cache_dtype``: the engine's ``--kv-cache-dtype`` when not auto.
    ``pool_bytes_per_token`` = target + draft (see ``POOL_RULE``); ``*_per_rank`` divides the KV heads
    over ``tensor_parallel_size`` ranks (vLLM requires the draft's TP to equal the target's).
    """
    tp = int(tensor_parallel_size)
    if tp < 1:
        raise UserError(f"tensor_parallel_size {tensor_parallel_size!r}: must be a positive integer")
    target = _model_kv(model_dir, "target", dtype, kv_cache_dtype, tp)
    draft = _model_kv(draft_dir, "draft", dtype, kv_cache_dtype, tp) if draft_dir is not None else None
    pool = target["bytes_per_token"] + (draft["bytes_per_token"] if draft else 0)
    pool_rank = target["bytes_per_token_per_rank"] + (draft["bytes_per_token_per_rank"] if draft else 0)
    return {"target": target, "draft": draft, "tensor_parallel_size": tp, "pool_bytes_per_token": pool,
            "pool_bytes_per_token_per_rank": pool_rank, "pool_rule": POOL_RULE if draft else None,
            "formula": "2 (K and V) x layers x KV heads x head dim x dtype bytes"}


# --------------------------------------------------------------------------------------------------
# Advertised KV pool
# --------------------------------------------------------------------------------------------------
def advertised(launch_log_text: str | None, metrics_text: str | None) -> dict:
    """The KV pool as the launch log and as ``/metrics`` state it; either side None when absent.

    ``log``: ``tokens`` (``<device> KV cache size: N tokens``), ``memory_gib`` (``Available KV cache
    memory`` on GPU, ``Explicitly set (X/…) GiB for KV cache`` on CPU: the budget *offered* to the pool,
    before any ``--num-gpu-blocks-override``), the override line's figures, the evidence lines.
    ``metrics``: ``num_gpu_blocks × block_size`` as ``tokens``, beside the ``kv_cache_size_tokens`` and
    ``kv_cache_memory_bytes`` labels when the engine exports them. No figure is derived from the other side.
    """
    import re

    from specstudy.deployment import launchlog

    log = None
    if launch_log_text:
        parsed = launchlog.parse_launch_log(launch_log_text)
        kv, ev = parsed["kv_cache"], parsed["evidence"]
        override = None
        for raw in launch_log_text.splitlines():
            if (m := re.search(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)", raw)):
                override = {"profiled_blocks": int(m.group(1)), "override_blocks": int(m.group(2)), "evidence": raw.strip()}
        log = {"device": kv.get("device"), "tokens": kv.get("tokens"), "memory_gib": kv.get("available_memory_gib"),
               "memory_is": ("the budget offered to the KV cache, stated before the block override"
                             if override else "the budget offered to the KV cache"),
               "max_concurrency": kv.get("max_concurrency"), "tokens_per_request": kv.get("tokens_per_request"),
               "block_override": override,
               "evidence": {k: ev.get(k) for k in ("kv_cache", "kv_cache_memory") if ev.get(k)}}
        if log["tokens"] is None and log["memory_gib"] is None:
            log = None
    metrics = None
    if metrics_text:
        cc = prom.kv_cache_config(metrics_text)
        if cc is not None:
            labels = cc.get("labels") or {}
            blocks, size = cc.get("num_gpu_blocks"), cc.get("block_size")

            def lab(key):
                v = labels.get(key)
                try:
                    return None if v in (None, "None") else (int(v) if str(v).lstrip("-").isdigit() else float(v))
                except ValueError:
                    return None

            metrics = {"num_gpu_blocks": blocks, "block_size": size,
                       "tokens": blocks * size if blocks is not None and size is not None else None,
                       "tokens_is": "num_gpu_blocks x block_size",
                       "kv_cache_size_tokens": lab("kv_cache_size_tokens"),
                       "kv_cache_memory_bytes": cc.get("kv_cache_memory_bytes"),
                       "kv_cache_max_concurrency": cc.get("kv_cache_max_concurrency"),
                       "num_gpu_blocks_override": lab("num_gpu_blocks_override"),
                       "cache_dtype": cc.get("cache_dtype"), "enable_prefix_caching": cc.get("enable_prefix_caching")}
    agree = None
    if log and metrics and log.get("tokens") is not None and metrics.get("tokens") is not None:
        agree = log["tokens"] == metrics["tokens"]
    return {"log": log, "metrics": metrics, "tokens_agree": agree}


# --------------------------------------------------------------------------------------------------
# NVML
# --------------------------------------------------------------------------------------------------
def nvml_memory(nvml: Any = None) -> dict:
    """Per-GPU used/total bytes through NVML (``nvidia-ml-py``): {gpus: [...], reason: None}, or
    {gpus: None, reason} where there is no NVIDIA driver, device or module. ``nvml``: a ``pynvml`` stand-in."""
    from specstudy.measure.telemetry import NvmlGpus, _text

    g = NvmlGpus(nvml=nvml)
    if not g.available:
        return {"gpus": None, "reason": g.error, "at": utc_now()}
    try:
        gpus = []
        for i, h in g.handles.items():
            m = g.nvml.nvmlDeviceGetMemoryInfo(h)
            try:
                name = _text(g.nvml.nvmlDeviceGetName(h))
            except Exception:  # noqa: BLE001 - a name is only a label
                name = None
            gpus.append({"index": i, "name": name, "used_bytes": int(m.used), "total_bytes": int(m.total)})
        return {"gpus": gpus, "reason": None, "at": utc_now()}
    except Exception as exc:  # noqa: BLE001 - NVMLError_*: report, never crash a measurement
        return {"gpus": None, "reason": f"NVML memory query failed: {type(exc).__name__}: {exc}", "at": utc_now()}
    finally:
        g.close()


# --------------------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------------------
def _source_text(prompts_source: str | os.PathLike) -> str:
    path = Path(prompts_source)
    if not path.is_file():
        raise UserError(f"prompts_source {path}: not a file; pass a corpus prompts.jsonl (or a plain text file)")
    if path.suffix == ".jsonl":
        parts = []
        for row in atomic.read_jsonl(path):
            for msg in (row or {}).get("messages") or []:
                content = msg.get("content") if isinstance(msg, dict) else None
                if isinstance(content, str):
                    parts.append(content)
                elif isinstance(content, list):
                    parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
            if isinstance((row or {}).get("text"), str):
                parts.append(row["text"])
        text = "\n\n".join(p for p in parts if p)
    else:
        text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise UserError(f"prompts_source {path}: no text (rows need messages[].content); pass a built corpus")
    return text


def token_stream(prompts_source: str | os.PathLike, tokenizer_dir: str | os.PathLike) -> list[int]:
    """The corpus text as one token-id sequence (the served model's tokenizer, no special tokens)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = list(tok.encode(_source_text(prompts_source), add_special_tokens=False, verbose=False))
    if len(ids) < 2:
        raise UserError(f"prompts_source {prompts_source}: the text is {len(ids)} token(s); a longer corpus is needed")
    return ids


def _prompt(stream: list[int], index: int, length: int) -> list[int]:
    """Request ``index``'s prompt: ``length`` tokens from offset index × (length + 1), wrapping around the
    stream, so prompts of one sweep start at different places (no shared prefix block)."""
    n = len(stream)
    start = (index * (length + 1)) % n
    return [stream[(start + i) % n] for i in range(length)]


def _headers(api_key: str | None) -> dict:
    h = {"Content-Type": "application/json"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def _max_model_len(base_url: str, model: str, api_key: str | None, timeout: float = 30.0) -> int | None:
    try:
        req = urllib.request.Request(base_url.rstrip("/") + "/v1/models", headers=_headers(api_key))
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = json.loads(r.read())
    except (OSError, ValueError) as exc:
        raise UserError(f"{base_url}/v1/models: unreachable ({exc}); start the server first") from None
    for m in data.get("data") or []:
        if m.get("id") == model:
            return m.get("max_model_len")
    raise UserError(f"{base_url}/v1/models: no model {model!r} served (served: "
                    f"{[m.get('id') for m in data.get('data') or []]}); pass the served model name")


def _complete(base_url: str, model: str, prompt: list[int], output_tokens: int, api_key: str | None,
              timeout: float, t0: float) -> dict:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": output_tokens, "ignore_eos": True,
                       "temperature": 0.0, "stream": False}).encode()
    row: dict[str, Any] = {"start_s": round(time.monotonic() - t0, 4), "status_code": None, "prompt_tokens": None,
                           "completion_tokens": None, "finish_reason": None, "error": None}
    try:
        req = urllib.request.Request(base_url.rstrip("/") + "/v1/completions", data=body, headers=_headers(api_key))
        with urllib.request.urlopen(req, timeout=timeout) as r:
            row["status_code"] = r.status
            data = json.loads(r.read())
        usage = data.get("usage") or {}
        row["prompt_tokens"], row["completion_tokens"] = usage.get("prompt_tokens"), usage.get("completion_tokens")
        row["finish_reason"] = ((data.get("choices") or [{}])[0]).get("finish_reason")
    except urllib.error.HTTPError as exc:
        row["status_code"] = exc.code
        row["error"] = f"HTTP {exc.code}: {exc.read()[:300].decode('utf-8', 'replace')}"
    except Exception as exc:  # noqa: BLE001 - timeouts, resets: the request failed, which is data
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    row["end_s"] = round(time.monotonic() - t0, 4)
    row["success"] = (row["error"] is None and row["status_code"] == 200 and row["completion_tokens"] == output_tokens
                      and row["finish_reason"] == "length")
    return row


class _Sampler:
    """Polls ``/metrics`` every ``interval`` s (running, waiting, KV usage) until stopped
    (:class:`~specstudy.measure.prom.MetricsPoller`)."""

    def __init__(self, url: str, interval: float, api_key: str | None):
        self.url, self.interval, self.api_key = url, interval, api_key
        self.samples: list[dict] = []
        self._poller = prom.MetricsPoller(url, interval, self._take, timeout=max(1.0, 4 * interval), api_key=api_key,
                                          name="memory-sampler")

    def _take(self, t: float, text: str) -> None:
        g = prom.gauges(text)
        self.samples.append({"t": t, "running": g["num_requests_running"], "waiting": g["num_requests_waiting"],
                             "kv_cache_usage": g["kv_cache_usage"]})

    @property
    def errors(self) -> int:
        """Scrapes that failed (missing samples)."""
        return self._poller.errors

    def __enter__(self) -> _Sampler:
        self._poller.start()
        return self

    def __exit__(self, *exc) -> None:
        self._poller.stop(join_timeout=30)


def _scrape(url: str, api_key: str | None) -> str | None:
    try:
        return prom.fetch_metrics(url, api_key=api_key)
    except prom.MetricsUnavailable:
        return None


def _drain(url: str, api_key: str | None, timeout_s: float = 60.0) -> bool:
    """Wait until the server has nothing running or waiting (a timed-out request of an earlier step)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = _scrape(url, api_key)
        if text is not None:
            g = prom.gauges(text)
            if not (g["num_requests_running"] or 0) and not (g["num_requests_waiting"] or 0):
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _peak(samples: list[dict], key: str) -> float | None:
    vals = [s[key] for s in samples if s.get(key) is not None]
    return max(vals) if vals else None


def _step(base_url: str, model: str, stream: list[int], first_index: int, L: int, c: int, output_tokens: int,
          metrics_url: str, api_key: str | None, timeout: float, interval: float) -> tuple[dict, list[dict]]:
    prompts = [_prompt(stream, first_index + j, L) for j in range(c)]
    drained = _drain(metrics_url, api_key)
    before = _scrape(metrics_url, api_key)
    barrier = threading.Barrier(c)
    t0 = time.monotonic()

    def one(p):
        barrier.wait()
        return _complete(base_url, model, p, output_tokens, api_key, timeout, t0)

    with _Sampler(metrics_url, interval, api_key) as sampler, \
            concurrent.futures.ThreadPoolExecutor(max_workers=c, thread_name_prefix="memory-req") as pool:
        rows = list(pool.map(one, prompts))
    wall = time.monotonic() - t0
    after = _scrape(metrics_url, api_key)
    win = [s for s in sampler.samples if s["t"] >= t0]
    reasons: list[dict] = []
    notes: list[dict] = []
    ok_rows = [r for r in rows if r["success"]]
    if len(ok_rows) < c:
        first = next(r for r in rows if not r["success"])
        reasons.append({"code": "failed_requests", "detail": f"{c - len(ok_rows)} of {c} failed; first: "
                        f"{first['error'] or (first['finish_reason'], first['completion_tokens'])}"})
    exact = all(r["prompt_tokens"] == L for r in ok_rows)
    if ok_rows and not exact:
        got = sorted({r["prompt_tokens"] for r in ok_rows if r["prompt_tokens"] != L}, key=str)
        reasons.append({"code": "prompt_length", "detail": f"server counted {got} prompt tokens, {L} sent"})
    preemptions = prefix_hits = finished = None
    if before is None or after is None:
        reasons.append({"code": "metrics_unreachable", "detail": f"{metrics_url} did not answer before/after the step"})
    else:
        preemptions = prom.counter_delta(before, after, prom.PREEMPTIONS)
        prefix_hits = prom.counter_delta(before, after, "vllm:prefix_cache_hits_total")
        finished = prom.counter_delta(before, after, prom.REQUEST_SUCCESS)
        if preemptions is None:
            reasons.append({"code": "metrics_unreachable", "detail": f"{prom.PREEMPTIONS} is not exported"})
        elif preemptions > 0:
            reasons.append({"code": "preempted", "detail": f"{prom.PREEMPTIONS} rose by {preemptions:g}"})
        if (ev := prom.restart_evidence(before, after)) or prom.decreased_counters(before, after):
            reasons.append({"code": "server_restarted", "detail": "; ".join(ev) or "a counter decreased"})
        if finished is not None and finished != c:
            notes.append({"code": "foreign_traffic", "detail": f"{finished:g} requests finished during the step, {c} sent"})
    peak_running = _peak(win, "running")
    if peak_running is None or peak_running < c:
        reasons.append({"code": "not_all_running", "detail": f"peak sampled running {peak_running} < {c} "
                        f"({len(win)} samples every {interval:g} s)"})
    if not drained:
        notes.append({"code": "not_drained", "detail": "requests were still running or waiting before the step"})
    if prefix_hits:
        notes.append({"code": "prefix_cache_hits", "detail": f"{prefix_hits:g} prompt tokens came from the prefix cache"})
    row = {"schema": STEP_SCHEMA, "context_tokens": L, "concurrency": c, "output_tokens": output_tokens,
           "attempted": c, "successful": len(ok_rows), "prompt_tokens_exact": exact if ok_rows else None,
           "preemptions": preemptions, "peak_running": peak_running, "peak_waiting": _peak(win, "waiting"),
           "peak_kv_cache_usage": _peak(win, "kv_cache_usage"), "samples": len(win), "sample_errors": sampler.errors,
           "sample_interval_s": interval, "requests_finished": finished, "prefix_cache_hit_tokens": prefix_hits,
           "wall_s": round(wall, 4), "ok": not reasons, "reasons": reasons, "notes": notes,
           "started_at": utc_iso(time.time() - wall)}
    return row, rows


def _check_sweep_args(context_tokens, concurrency, output_tokens, max_len) -> tuple[list[int], list[int]]:
    def ints(name, values):
        if not isinstance(values, (list, tuple)) or not values:
            raise UserError(f"{name} {values!r}: give a non-empty list of positive integers")
        for v in values:
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UserError(f"{name}: {v!r} is not a positive integer; give a list such as [1, 2, 4]")
        return sorted(set(values))

    ctx, conc = ints("context_tokens", context_tokens), ints("concurrency", concurrency)
    if not isinstance(output_tokens, int) or isinstance(output_tokens, bool) or output_tokens < 1:
        raise UserError(f"output_tokens {output_tokens!r}: must be a positive integer")
    if max_len is not None:
        too_long = [L for L in ctx if L + output_tokens > max_len]
        if too_long:
            raise UserError(f"context_tokens {too_long} + output_tokens {output_tokens} exceed the server's max_model_len "
                            f"{max_len}; lower context_tokens (at most {max_len - output_tokens}) or raise the engine's "
                            f"max_model_len")
    return ctx, conc


def run_sweep(base_url: str, model: str, *, prompts_source: str | os.PathLike, tokenizer_dir: str | os.PathLike,
              context_tokens: list[int], output_tokens: int, concurrency: list[int], metrics_url: str,
              out_dir: str | os.PathLike, api_key: str | None = None, request_timeout_s: float = 300.0,
              sample_interval_s: float = 0.1, arm: str | None = None, launch_log: str | os.PathLike | None = None,
              kv: dict | None = None, progress=None) -> dict:
    """The no-preemption concurrency sweep on a running server; writes ``steps.jsonl`` and ``memory.json``.

    Context lengths run in ascending order, each with concurrency ascending from the smallest; a step
    passes with every request successful (HTTP 200, ``output_tokens`` generated, finish ``length``),
    the server counting exactly L prompt tokens, ``vllm:num_preemptions_total`` unchanged and the
    sampled ``vllm:num_requests_running`` reaching c. The result at L is the largest passing c below the
    first failing step (``max_concurrency``; None when the first step fails; ``top_reached`` when every
    listed c passed, so the result is a lower bound). ``arm``, ``launch_log`` (the server's launch log)
    and ``kv`` (:func:`kv_cost`) go into the record for :func:`summarize`; the advertised pool is read
    from the launch log and one ``/metrics`` scrape at the start, NVML memory at the start and the end.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ctx, conc = _check_sweep_args(context_tokens, concurrency, output_tokens, _max_model_len(base_url, model, api_key))
    stream = token_stream(prompts_source, tokenizer_dir)
    log_text = Path(launch_log).read_text(encoding="utf-8", errors="replace") if launch_log else None
    started, t_start = utc_now(), time.monotonic()
    first_scrape = _scrape(metrics_url, api_key)
    nvml_start = nvml_memory()
    steps: list[dict] = []
    results = []
    index = 0
    steps_path = out / "steps.jsonl"
    for L in ctx:
        best, failing, ran = None, None, 0
        for c in conc:
            row, rows = _step(base_url, model, stream, index, L, c, output_tokens, metrics_url, api_key,
                              float(request_timeout_s), float(sample_interval_s))
            index += c
            ran += 1
            row["requests"] = rows
            schemas.validate(row, "memory-step", f"{steps_path} (L={L}, c={c})")
            steps.append(row)
            atomic.write_jsonl(steps_path, steps)
            if progress is not None:
                progress(f"memory L={L} c={c}: {'ok' if row['ok'] else 'FAIL ' + ','.join(r['code'] for r in row['reasons'])}"
                         f" (preemptions {row['preemptions']}, peak running {row['peak_running']}, {row['wall_s']:.1f} s)")
            if not row["ok"]:
                failing = {"concurrency": c, "reasons": row["reasons"]}
                break
            best = c
        results.append({"context_tokens": L, "max_concurrency": best, "first_failing": failing,
                        "top_reached": failing is None, "steps": ran})
    record = {"schema": SCHEMA, "arm": arm, "model": model, "base_url": base_url,
              "settings": {"context_tokens": ctx, "output_tokens": output_tokens, "concurrency": conc,
                           "request_timeout_s": float(request_timeout_s), "sample_interval_s": float(sample_interval_s),
                           "prompts_source": str(prompts_source), "tokenizer_dir": str(tokenizer_dir),
                           "prompt": "token-id prompts on /v1/completions, exact length (tolerance 0 tokens)",
                           "ignore_eos": True, "temperature": 0.0},
              "advertised": advertised(log_text, first_scrape), "launch_log": str(launch_log) if launch_log else None,
              "kv_cost": kv, "nvml": {"start": nvml_start, "end": nvml_memory()},
              "results": results, "steps_file": str(steps_path),
              "times": {"started_at": started, "ended_at": utc_now(), "wall_s": round(time.monotonic() - t_start, 3)}}
    schemas.validate(record, "memory", out / "memory.json")
    atomic.write_json(out / "memory.json", record)
    return record


# --------------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------------
def read_record(path: str | os.PathLike) -> dict:
    rec = atomic.read_json(path)
    schemas.validate(rec, "memory", path)
    return rec


def _gib(nbytes: float | None) -> float | None:
    return None if nbytes is None else nbytes / GIB


def _arm_summary(rec: dict, path: str, knee_path) -> dict:
    from specstudy.core.records import read_knee

    adv = rec.get("advertised") or {}
    log, met = adv.get("log") or {}, adv.get("metrics") or {}
    kv = rec.get("kv_cost") or {}
    bpt = kv.get("pool_bytes_per_token_per_rank") if kv else None
    tokens_log, tokens_met = log.get("tokens"), met.get("tokens")
    knee = None
    if knee_path is not None:
        k = read_knee(knee_path)
        knee = {"path": str(knee_path), "status": k.status, "knee_rps": k.knee_rps}
    nv = (rec.get("nvml") or {}).get("start") or {}
    nv_used = sum(g["used_bytes"] for g in nv["gpus"]) if nv.get("gpus") else None
    return {
        "arm": rec["arm"], "record": path,
        "kv_tokens": {"log": tokens_log, "metrics": tokens_met},
        "kv_bytes_per_token": bpt, "tensor_parallel_size": kv.get("tensor_parallel_size") if kv else None,
        "kv_gib": {"log_stated": log.get("memory_gib"),
                   "metrics_stated": _gib(met.get("kv_cache_memory_bytes")),
                   "computed_for_log_tokens": _gib(tokens_log * bpt) if tokens_log is not None and bpt else None,
                   "computed_for_metrics_tokens": _gib(tokens_met * bpt) if tokens_met is not None and bpt else None},
        "block_override": (log.get("block_override") or {}).get("override_blocks"),
        "max_concurrency": {str(r["context_tokens"]): {"max_concurrency": r["max_concurrency"], "top_reached": r["top_reached"],
                                                       "first_failing": r["first_failing"]} for r in rec["results"]},
        "knee": knee,
        "nvml": {"used_bytes": nv_used, "gpus": nv.get("gpus"), "reason": nv.get("reason")},
        "output_tokens": rec["settings"]["output_tokens"], "wall_s": rec["times"]["wall_s"],
    }


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.{digits}f}" if abs(v) < 1e6 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _cell(entry: dict | None) -> str:
    if entry is None:
        return "not measured"
    mc, fail = entry["max_concurrency"], entry["first_failing"]
    if entry["top_reached"]:
        return f"≥ {mc} (every step passed)"
    codes = ", ".join(r["code"] for r in fail["reasons"]) if fail else ""
    return f"{mc if mc is not None else 'none'} (c={fail['concurrency']}: {codes})"


def section_markdown(summary: dict) -> str:
    arms = summary["arms"]
    lines = ["## Memory capacity", "",
             "KV pool per arm as the launch log and `/metrics` state it (never converted into each other), the KV "
             "cost per pool token from the models' config.json (target + draft for a draft arm), and the largest "
             "number of simultaneous requests of exactly L prompt tokens (+ "
             f"{', '.join(sorted({str(a['output_tokens']) for a in arms}))} generated, `ignore_eos`) served with every "
             "request successful, zero preemptions and all of them running at once. docs/memory.md.", "",
             "| arm | KV tokens (log) | KV tokens (/metrics blocks × block size) | KV bytes/token (per GPU) | KV GiB (log stated) "
             "| KV GiB for log tokens (computed) | KV GiB for /metrics tokens (computed) | NVML used GiB (sweep start) | capacity knee |",
             "|---|---|---|---|---|---|---|---|---|"]
    for a in arms:
        k = a["knee"]
        knee = "no capacity search for this arm" if k is None else f"{_fmt(k['knee_rps'], 2)} rps ({k['status']})"
        nv = a["nvml"]
        if nv["used_bytes"] is None:
            nv_s = f"— ({nv['reason'] or 'not sampled'})"
        else:
            n = len(nv["gpus"] or [])
            nv_s = _fmt(_gib(nv["used_bytes"]), 2) + (f" (sum of {n} GPUs)" if n > 1 else "")
        lines.append(f"| {a['arm']} | {_fmt(a['kv_tokens']['log'])} | {_fmt(a['kv_tokens']['metrics'])} | "
                     f"{_fmt(a['kv_bytes_per_token'])} | {_fmt(a['kv_gib']['log_stated'], 2)} | "
                     f"{_fmt(a['kv_gib']['computed_for_log_tokens'], 4)} | {_fmt(a['kv_gib']['computed_for_metrics_tokens'], 4)} | "
                     f"{nv_s} | {knee} |")
    overrides = [a for a in arms if a.get("block_override") is not None]
    if overrides:
        lines += ["", "Arms served with `--num-gpu-blocks-override` (the log's GiB is the budget before the override): "
                  + ", ".join(f"{a['arm']} ({a['block_override']} blocks)" for a in overrides) + "."]
    ctx = summary["context_tokens"]
    lines += ["", "Largest concurrency without preemption, per context length L (prompt tokens); in brackets the first "
              "failing step and why:", "",
              "| arm | " + " | ".join(f"L={L}" for L in ctx) + " |", "|---|" + "---|" * len(ctx)]
    for a in arms:
        lines.append(f"| {a['arm']} | " + " | ".join(_cell(a["max_concurrency"].get(str(L))) for L in ctx) + " |")
    return "\n".join(lines) + "\n"


def summarize(records: list[str | os.PathLike], knees: dict[str, str | os.PathLike | None],
              out_dir: str | os.PathLike) -> dict:
    """Join every arm's ``memory.json`` to its capacity knee (``knees[arm]``: a ``knee.json`` path, or None
    for an arm without a capacity search); write ``summary.json`` (schema ``memory-summary``) and
    ``section.md`` under ``out_dir``."""
    if not records:
        raise UserError("memory summary: no records given; pass --records <results/memory/<arm>/memory.json> ...")
    arms, seen = [], set()
    for p in records:
        rec = read_record(p)
        if not rec.get("arm"):
            raise UserError(f"{p}: field 'arm' is null; run the sweep with arm=<arm name> so the summary can name it")
        if rec["arm"] in seen:
            raise UserError(f"{p}: arm {rec['arm']!r} appears in two records; pass one record per arm")
        seen.add(rec["arm"])
        arms.append(_arm_summary(rec, str(p), knees.get(rec["arm"])))
    arms.sort(key=lambda a: (a["arm"] != "baseline", a["arm"]))
    ctx = sorted({int(L) for a in arms for L in a["max_concurrency"]})
    summary = {"schema": SUMMARY_SCHEMA, "arms": arms, "context_tokens": ctx, "created_at": utc_now()}
    out = Path(out_dir)
    schemas.validate(summary, "memory-summary", out / "summary.json")
    atomic.write_json(out / "summary.json", summary)
    atomic.write_text(out / "section.md", section_markdown(summary))
    return summary


# --------------------------------------------------------------------------------------------------
# The phase: its deployment step, summary and tools
# --------------------------------------------------------------------------------------------------
@register_phase
class MemoryPhase(Phase):
    name = "memory"
    serves_without_cells = True  # its deployments run the sweep, not cells

    def spec_extras(self, design: dict, dirs: dict[str, str]) -> dict:
        sweep = design.get("sweep")
        return {"memory": dict(sweep, corpus_dir=dirs[sweep["workload"]])} if sweep else {}

    def before_cells(self, job) -> None:
        """The KV-cache sweep (largest concurrency without preemption per context length)."""
        m = job.spec["memory"]
        work = job.attempt / "memory"
        draft = job.eng.get("draft_model") if job.arm["method"] == "draft_model" else None
        kv = kv_cost(job.eng["model"], dtype=job.eng.get("dtype"), draft_dir=draft,
                     tensor_parallel_size=int(job.eng.get("tensor_parallel_size") or 1))
        job.progress.phase("memory_sweep")
        run_sweep(job.server.base_url, job.served, prompts_source=Path(m["corpus_dir"]) / "prompts.jsonl",
                  tokenizer_dir=job.eng["tokenizer"], context_tokens=list(m["context_tokens"]),
                  output_tokens=int(m["output_tokens"]), concurrency=list(m["concurrency"]),
                  metrics_url=job.server.base_url + "/metrics", out_dir=work, api_key=job.eng.get("api_key"),
                  request_timeout_s=float(job.settings.get("request_timeout_s", 600)), arm=job.arm["name"],
                  launch_log=job.attempt / "launch.log", kv=kv)
        job.progress.end_phase()
        if not job.death.alive():
            raise RuntimeError(f"{work}: the server died during the memory sweep")
        job.extension["memory"] = str(work / "memory.json")

    def summarize(self, run) -> dict:
        """Every arm's sweep joined to its capacity knee (when the declaration joins them:
        ``capacity.enabled`` and ``extensions.memory.join_capacity``)."""
        knees = {d["arm"]: run.knee(d["arm"]) for d in run.deployments}
        return summarize(run.artifacts("memory"), knees, run.out)

    def add_tools(self, sub) -> None:
        k = sub.add_parser("kv-cost", help="KV bytes per token from config.json (target, draft, pool)")
        k.add_argument("--model", required=True)
        k.add_argument("--draft", default=None)
        k.add_argument("--dtype", default=None, help="the engine's --dtype (default auto)")
        k.add_argument("--kv-cache-dtype", default=None)
        k.add_argument("--tensor-parallel-size", type=int, default=1)
        k.set_defaults(func=_cmd_kv_cost)


def _cmd_kv_cost(args) -> int:
    print(json.dumps(kv_cost(args.model, dtype=args.dtype, draft_dir=args.draft, kv_cache_dtype=args.kv_cache_dtype,
                             tensor_parallel_size=args.tensor_parallel_size), indent=2))
    return 0
