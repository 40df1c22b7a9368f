"""Parquet tables rebuilt from raw result artifacts alone.

``specstudy tables --cells ... --deployments ... --gates ... --out results/tables`` (what rule ``tables``
runs) reads the cell ``summary.json`` files, ``deployment.json`` records and ``gates/<phase>/<arm>.json``
judgements it is given, beside each deployment its attempts' ``attempts/*/<workload>/c<c>/requests.jsonl``, and
the ``deployment-failures/`` records of the results root they lie in (found through :mod:`specstudy.core.layout`
from the records' own paths: no rule declares them); it writes ``requests.parquet``, ``cells.parquet``, ``deployments.parquet`` and ``gates.parquet``.
``specstudy tables --results results`` reads every such file of a results tree instead (interactive use).

A cell's keys are those written in its summary (the path must agree: :func:`specstudy.core.integrity.verify_place`
refuses a summary found elsewhere); nothing is read back from the folder names.

The output is deterministic: rows are sorted by their keys, the column order is fixed (declared core
columns first, then any extra flattened fields in sorted order), no timestamps go into the metadata,
so deleting ``results/tables/`` and rebuilding gives the same bytes.

Cell summaries, deployment records and failure records are read as typed records
(:mod:`specstudy.core.records`, one struct per schema in ``config/schemas/``): a record of another shape stops
the build naming the file and the field instead of becoming a row of defaults. Their open sections
(telemetry, confounds, provenance, cache_config, ...) are flattened into extra columns as written.
Statistics and the report only ever read the tables.

Kept as one module (over ~700 lines): the core column declarations, the row builders, discovery and the
Arrow writer together define each table's columns, types and byte-deterministic output; split, a column would
be declared in one file and filled and typed in others.
"""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path
from typing import Any

import msgspec

from specstudy.core import layout
from specstudy.core.arms import ARM_RE, is_arm_name, parse_arm
from specstudy.core.errors import UserError
from specstudy.core.records import (
    CellSummary,
    DeploymentRecord,
    DeploymentTimes,
    Failure,
    GateRecord,
    RecordError,
    kv_cache_tokens,
    read_cell_summary,
    read_deployment,
    read_gate,
    to_record,
)
from specstudy.core.timestamps import to_unix
from specstudy.deployment.launchlog import STARTUP_STEPS
from specstudy.measure.telemetry import GPM_SERIES
from specstudy.study.plan import CORE_PHASES

PHASES = CORE_PHASES
WORKLOAD_RE = re.compile(f"^(?:{layout.WORKLOAD_PATTERN})$")

TABLE_NAMES = ("requests", "cells", "deployments", "gates")

# ---------------------------------------------------------------------------------------------
# Core columns per table: (name, arrow type name). Extra flattened fields follow in sorted order.
# ---------------------------------------------------------------------------------------------
KEY_COLUMNS = [
    ("phase", "string"),
    ("arm", "string"),
    ("method", "string"),
    ("num_speculative_tokens", "int64"),
    ("draft_tensor_parallel_size", "int64"),
    ("rep", "int64"),
]

#: NVML series summarised per cell: per GPU, ``_mean`` = mean over GPUs of the time mean, ``_max`` = max over GPUs.
GPU_SERIES = ("memory_used_mib", "utilization_pct", "power_w", "sm_clock_mhz", "temperature_c")
GPU_COLUMNS: list[tuple[str, str]] = [("gpu_telemetry_source", "string"), ("gpu_count", "int64")] + [
    (f"gpu_{name}_{stat}", "float64") for name in GPU_SERIES for stat in ("mean", "max")] + [
    # NVML's total-energy counter over the measurement window, summed over the GPUs, and per output token
    # (null without a GPU counter: a CPU run has none, never zero)
    ("gpu_energy_j", "float64"), ("gpu_energy_window_s", "float64"), ("energy_j_per_output_token", "float64")] + [
    # NVML GPM figures (telemetry.gpm): mean over GPUs of each GPU's mean / p50 over the window; null unless
    # every GPU of the job has the figure, and then gpu_gpm_unavailable says why
    (f"gpu_{name}_{stat}", "float64") for name in GPM_SERIES for stat in ("mean", "p50")] + [
    ("gpu_gpm_unavailable", "string")]

CORE_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "requests": KEY_COLUMNS
    + [
        ("workload", "string"),
        ("concurrency", "int64"),
        ("deployment_id", "string"),
        ("chosen", "bool"),
        ("request_index", "int64"),
        ("prompt_id", "string"),
        ("scheduled_s", "float64"),
        ("start_s", "float64"),
        ("end_s", "float64"),
        ("start_unix", "float64"),
        ("ttft_ms", "float64"),
        ("e2e_ms", "float64"),
        ("tpot_ms", "float64"),
        ("completion_tokens", "int64"),
        ("prompt_tokens", "int64"),
        ("usage_present", "bool"),
        ("finish_reason", "string"),
        ("status_code", "int64"),
        ("error", "string"),
        ("success", "bool"),
        ("n_content_events", "int64"),
        ("stream_event_gaps_ms", "list<float64>"),
        ("tokens_per_event", "list<int64>"),
        ("output_sha256", "string"),
        ("output_chars", "int64"),
    ],
    "cells": KEY_COLUMNS
    + [
        ("workload", "string"),
        ("concurrency", "int64"),
        ("deployment_id", "string"),
        ("kind", "string"),
        ("rep_label", "string"),
        ("fingerprint", "string"),
        ("corpus_name", "string"),
        ("corpus_version", "string"),
        ("corpus_digest", "string"),
        ("valid", "bool"),
        ("throughput_valid", "bool"),
        ("latency_valid", "bool"),
        ("invalid_reasons", "string"),
        ("invalid_details", "string"),
        ("validity_notes", "string"),
        ("validity_note_details", "string"),
        ("requests_attempted", "int64"),
        ("requests_successful", "int64"),
        ("requests_failed", "int64"),
        ("success_rate", "float64"),
        ("missing_usage", "int64"),
        ("prompt_tokens", "int64"),
        ("completion_tokens", "int64"),
        ("output_tokens_per_second", "float64"),
        ("wall_seconds", "float64"),
        ("ttft_p50_ms", "float64"),
        ("ttft_p95_ms", "float64"),
        ("ttft_mean_ms", "float64"),
        ("tpot_p50_ms", "float64"),
        ("tpot_p95_ms", "float64"),
        ("tpot_mean_ms", "float64"),
        ("e2e_p50_ms", "float64"),
        ("e2e_p95_ms", "float64"),
        ("spec_enabled", "bool"),
        ("acceptance_rate", "float64"),
        ("mean_acceptance_length", "float64"),
        ("draft_tokens", "float64"),
        ("accepted_tokens", "float64"),
        ("per_position_acceptance", "list<float64>"),
        ("loadgen_limited", "bool"),
        ("started_at", "string"),
        ("ended_at", "string"),
        ("started_unix", "float64"),
        ("tensor_parallel_size", "int64"),
    ]
    + GPU_COLUMNS,
    "deployments": KEY_COLUMNS
    + [
        ("deployment_id", "string"),
        ("kind", "string"),
        ("rep_label", "string"),
        ("source", "string"),
        ("status", "string"),
        ("failure_stage", "string"),
        ("failure_reason", "string"),
        ("failure_error_excerpt", "string"),
        ("failure_log", "string"),
        ("arm_spec", "string"),
        ("command", "string"),
        ("speculative_config", "string"),
        ("hostname", "string"),
        ("kv_cache_tokens", "float64"),
        ("init_seconds", "float64"),
        ("async_scheduling", "bool"),
        ("max_num_batched_tokens", "float64"),
        ("max_num_scheduled_tokens", "float64"),
        ("n_cells", "int64"),
        ("n_cells_ok", "int64"),
        ("time_start", "string"),
        ("time_ready", "string"),
        ("time_stop", "string"),
        ("start_unix", "float64"),
        ("tensor_parallel_size", "int64"),
        ("model_loading_gib", "float64"),
        ("kv_available_gib", "float64"),
        ("kv_log_tokens", "float64"),
        ("compile_cache", "string"),
        ("startup_cache", "string"),
        ("startup_log_clock", "string"),
        ("startup_total_s", "float64"),
    ]
    + [(f"startup_{p}_s", "float64") for p in STARTUP_STEPS]
    + [
        ("deployment_seconds", "float64"),
        ("measuring_seconds", "float64"),
        ("startup_share", "float64"),
        ("measuring_share", "float64"),
    ],
    "gates": [
        ("phase", "string"),
        ("arm", "string"),
        ("verdict", "string"),
        ("blocks_recommendation", "bool"),
        ("reason_codes", "string"),
        ("reasons", "string"),
        ("claim", "string"),
        ("control_kind", "string"),
        ("control_arm", "string"),
        ("control_worst", "string"),
        ("treatment_worst", "string"),
        ("control_pairs", "int64"),
        ("control_deployments", "int64"),
        ("treatment_pairs", "int64"),
        ("detail", "string"),
    ],
}

SORT_KEYS = {
    "requests": ["phase", "arm", "rep", "workload", "concurrency", "deployment_id", "request_index"],
    "cells": ["phase", "arm", "kind", "rep", "workload", "concurrency", "deployment_id"],
    "deployments": ["phase", "arm", "kind", "rep", "deployment_id", "source"],
    "gates": ["phase", "arm"],
}


class TablesError(UserError):
    """A raw artifact cannot be turned into a table row; the message names file, field and fix (bad input:
    ``specstudy tables`` prints it as one line)."""


# ---------------------------------------------------------------------------------------------
# Defensive field access (the only place that knows record shapes)
# ---------------------------------------------------------------------------------------------
def dig(obj: Any, *path: str, default: Any = None) -> Any:
    """``obj[p0][p1]…`` or ``default`` when any step is missing or not a dict."""
    for p in path:
        if not isinstance(obj, dict) or p not in obj:
            return default
        obj = obj[p]
    return default if obj is None else obj


def first(*values: Any) -> Any:
    for v in values:
        if v is not None:
            return v
    return None


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float):
        return None if (isinstance(v, float) and not math.isfinite(v)) else float(v)
    if isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


def _int(v: Any) -> int | None:
    f = _num(v)
    return None if f is None else int(f)


def _bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0", "yes", "no", "enabled", "disabled"):
        return v.lower() in ("true", "1", "yes", "enabled")
    if isinstance(v, int):
        return bool(v)
    return None


def _str(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v
    return json.dumps(v, sort_keys=True, default=str)


def arm_keys(phase: str, arm_name: str, rep: int | None, spec: dict | None = None) -> dict:
    implied = parse_arm(arm_name) if is_arm_name(arm_name) else {}
    spec = dict(implied, **{k: v for k, v in (spec or {}).items() if v is not None})
    keys = {
        "phase": phase,
        "arm": arm_name,
        "method": spec.get("method"),
        "num_speculative_tokens": _int(spec.get("num_speculative_tokens")),
        "draft_tensor_parallel_size": _int(spec.get("draft_tensor_parallel_size")),
        "rep": rep,
    }
    if implied.get("engine"):  # a study of several engine builds: the build is a column (none for one engine)
        keys["engine"] = implied["engine"]
    return keys


def confound_fields(confounds: dict | None, cache_config: dict | None = None) -> dict:
    """The confounds every comparison shows side by side, from a confounds (+cache_config) dict;
    ``kv_cache_tokens`` is the ``/metrics`` KV pool (records.kv_cache_tokens)."""
    c = confounds or {}
    cc = cache_config or {}
    kv = kv_cache_tokens({"confounds": c, "cache_config": cc})
    raw_async = c.get("async_scheduling")
    if isinstance(raw_async, dict):  # deployment.launchlog.parse_launch_log: {enabled, method, source, statement}
        raw_async = raw_async.get("enabled")
    async_sched = _bool(raw_async)
    return {
        "kv_cache_tokens": kv,
        "async_scheduling": async_sched,
        "max_num_batched_tokens": _num(c.get("max_num_batched_tokens")),
        "max_num_scheduled_tokens": _num(c.get("max_num_scheduled_tokens")),
        # V2 vs V1: vLLM 0.23 falls back to the V1 runner for speculative methods V2 lacks (launch log)
        "model_runner": _str(c.get("model_runner")),
    }


def gpu_fields(telemetry: dict | None) -> dict:
    """Per-cell NVML summary: GPU count and, per series, the mean over GPUs of each GPU's time mean and
    the max over GPUs of each GPU's max (``telemetry.series['gpu<i>.<name>']``). None without GPU series."""
    tel = telemetry if isinstance(telemetry, dict) else {}
    series = tel.get("series") if isinstance(tel.get("series"), dict) else {}
    gpus = sorted({k.split(".", 1)[0] for k in series if re.match(r"^gpu\d+\.", k)}, key=lambda g: int(g[3:]))
    out: dict[str, Any] = {"gpu_telemetry_source": _str(dig(tel, "gpu", "source")) if gpus else None,
                           "gpu_count": len(gpus) if gpus else None}
    for name in GPU_SERIES:
        means = [_num(dig(series, f"{g}.{name}", "mean")) for g in gpus]
        maxes = [_num(dig(series, f"{g}.{name}", "max")) for g in gpus]
        means, maxes = [v for v in means if v is not None], [v for v in maxes if v is not None]
        out[f"gpu_{name}_mean"] = sum(means) / len(means) if means else None
        out[f"gpu_{name}_max"] = max(maxes) if maxes else None
    # energy: only when every GPU of the job has the counter over the window (a partial sum would understate it)
    deltas = [_num(dig(series, f"{g}.energy_j", "delta")) for g in gpus]
    known = bool(gpus) and all(d is not None for d in deltas)
    out["gpu_energy_j"] = sum(deltas) if known else None
    out["gpu_energy_window_s"] = _num(tel.get("window_s")) if known else None
    out.update(gpm_fields(tel.get("gpm"), gpus))
    return out


def _unavailable(v: Any) -> str | None:
    return v.removeprefix("unavailable: ") if isinstance(v, str) else None


def gpm_fields(gpm: Any, gpus: list[str]) -> dict:
    """The cell's GPM figures (``telemetry.gpm``): per figure the mean over the job's GPUs of each GPU's mean and
    p50 (null unless every GPU has it) and ``gpu_gpm_unavailable``: what is missing where, and why."""
    out: dict[str, Any] = {f"gpu_{name}_{stat}": None for name in GPM_SERIES for stat in ("mean", "p50")}
    out["gpu_gpm_unavailable"] = None
    if not gpus:
        return out
    if gpm is None:
        out["gpu_gpm_unavailable"] = "not recorded (a summary written before GPM was sampled)"
        return out
    if not isinstance(gpm, dict):
        out["gpu_gpm_unavailable"] = _unavailable(gpm) or "not recorded"
        return out
    missing: dict[str, list[str]] = {}  # "<what>: <reason>" -> GPUs
    for g in gpus:
        if not isinstance(per := gpm.get(g), dict):
            missing.setdefault(f"all figures: {_unavailable(per) or 'not recorded'}", []).append(g)
            continue
        for name in GPM_SERIES:
            if not isinstance(per.get(name), dict):
                missing.setdefault(f"{name}: {_unavailable(per.get(name)) or 'not recorded'}", []).append(g)
    for name in GPM_SERIES:
        for stat in ("mean", "p50"):
            vals = [_num(dig(gpm, g, name, stat)) for g in gpus]
            if all(v is not None for v in vals):
                out[f"gpu_{name}_{stat}"] = sum(vals) / len(vals)
    if missing:
        out["gpu_gpm_unavailable"] = "; ".join(f"{what} ({', '.join(gs)})" for what, gs in sorted(missing.items()))
    return out


def startup_fields(dep: DeploymentRecord) -> dict:
    """Start-up phases, cache state and memory/KV cost of a deployment record (None where absent)."""
    st = dep.startup or {}
    c = dep.confounds or {}
    t0, t1 = to_unix(dep.times.start), to_unix(dep.times.stop)
    out = {"tensor_parallel_size": dep.target_tensor_parallel_size,
           "model_loading_gib": _num(dig(c, "model_loading", "memory_gib")),
           "kv_available_gib": _num(dig(c, "kv_cache", "available_memory_gib")),
           "kv_log_tokens": kv_cache_tokens(dep, sources=("log",)),
           "compile_cache": _str(dig(c, "compilation", "compile_cache")),
           "startup_cache": _str(st.get("cache")), "startup_log_clock": _str(st.get("log_clock")),
           "startup_total_s": _num(st.get("total_s")),
           "deployment_seconds": (t1 - t0) if (t0 is not None and t1 is not None) else None}
    for p in STARTUP_STEPS:
        out[f"startup_{p}_s"] = _num(dig(st, "phases", p))
    d, tot = out["deployment_seconds"], out["startup_total_s"]
    out["startup_share"] = tot / d if (d and tot is not None) else None
    return out


def _flatten(obj: Any, prefix: str, out: dict, depth: int = 0, max_depth: int = 4) -> None:
    if isinstance(obj, dict) and depth < max_depth:
        for k in sorted(obj):
            _flatten(obj[k], f"{prefix}.{k}" if prefix else str(k), out, depth + 1, max_depth)
    elif isinstance(obj, list | dict):
        out[prefix] = json.dumps(obj, sort_keys=True, default=str)
    else:
        out[prefix] = obj


def flatten(obj: Any, prefix: str) -> dict:
    out: dict = {}
    _flatten(obj, prefix, out)
    return out


def cell_row(summary: CellSummary | dict, source: str = "<cell summary>") -> dict:
    """One ``cells`` row from a cell ``summary.json`` (records.read_cell_summary; a dict is read as one)."""
    if isinstance(summary, dict):
        summary = to_record(summary, CellSummary, source)
    keys, validity, spec, times = summary.keys, summary.validity, summary.speculative, summary.times
    reasons = msgspec.to_builtins(validity.reasons)
    notes = msgspec.to_builtins(validity.notes)
    row = arm_keys(keys.phase, keys.arm, keys.rep, {"method": keys.method, "num_speculative_tokens": keys.num_speculative_tokens,
                                                    "draft_tensor_parallel_size": keys.draft_tensor_parallel_size})
    row.update({
        "workload": keys.workload,
        "concurrency": keys.concurrency,
        "deployment_id": keys.deployment_id,
        "kind": keys.kind or "repeat",
        "rep_label": keys.rep_label,
        "fingerprint": summary.fingerprint,
        "corpus_name": summary.corpus.name,
        "corpus_version": _str(summary.corpus.version),
        "corpus_digest": summary.corpus.digest,
        "valid": validity.valid,
        "throughput_valid": validity.throughput_valid,
        "latency_valid": validity.latency_valid,
        "invalid_reasons": ",".join(sorted({r.code for r in validity.reasons})),
        "invalid_details": json.dumps(reasons, sort_keys=True) if reasons else "",
        "validity_notes": ",".join(sorted({n.code for n in validity.notes})),
        "validity_note_details": json.dumps(notes, sort_keys=True) if notes else "",
        "requests_attempted": summary.requests.attempted,
        "requests_successful": summary.requests.successful,
        "requests_failed": summary.requests.failed,
        "success_rate": summary.requests.success_rate,
        "missing_usage": summary.requests.missing_usage,
        "prompt_tokens": summary.tokens.prompt,
        "completion_tokens": summary.tokens.completion,
        "output_tokens_per_second": summary.tokens.output_tokens_per_second,
        "wall_seconds": summary.wall_seconds,
        "ttft_p50_ms": summary.latency("ttft", "p50"),
        "ttft_p95_ms": summary.latency("ttft", "p95"),
        "ttft_mean_ms": summary.latency("ttft", "mean"),
        "tpot_p50_ms": summary.latency("tpot", "p50"),
        "tpot_p95_ms": summary.latency("tpot", "p95"),
        "tpot_mean_ms": summary.latency("tpot", "mean"),
        "e2e_p50_ms": summary.latency("e2e", "p50"),
        "e2e_p95_ms": summary.latency("e2e", "p95"),
        "spec_enabled": spec.enabled,
        "acceptance_rate": spec.acceptance_rate,
        "mean_acceptance_length": spec.mean_acceptance_length,
        "draft_tokens": spec.draft_tokens,
        "accepted_tokens": spec.accepted_tokens,
        "per_position_acceptance": spec.per_position_rates(),
        "loadgen_limited": _bool((summary.loadgen or {}).get("limited")),
        "started_at": _str(times.started_at),
        "ended_at": _str(times.ended_at),
        "started_unix": to_unix(times.started_at),
    })
    # every other summary metric, flattened (latency stats, telemetry, server deltas, confounds, ...)
    for section, val in summary.sections().items():
        row.update(flatten(val, section))
    row.update({f"confound_{k}": v for k, v in confound_fields(summary.confounds).items()})
    row["tensor_parallel_size"] = keys.tensor_parallel_size
    row.update(gpu_fields(summary.telemetry))
    comp = summary.tokens.completion
    row["energy_j_per_output_token"] = (row["gpu_energy_j"] / comp
                                        if (row["gpu_energy_j"] is not None and comp) else None)
    return row


def request_rows(rows: list[dict], cell_keys: dict, deployment_id: str, chosen: bool) -> list[dict]:
    out = []
    for r in rows:
        row = dict(cell_keys)
        row["deployment_id"] = deployment_id
        row["chosen"] = chosen
        for name, _typ in CORE_COLUMNS["requests"]:
            if name in row:
                continue
            v = r.get(name)
            if name == "error":
                v = _str(v)
            row[name] = v
        out.append(row)
    return out


def deployment_row(dep: DeploymentRecord | dict, source: str = "deployment.json", where: dict | None = None) -> dict:
    """One ``deployments`` row from a deployment record or a failure record (``source="failure_record"``).

    ``where`` holds what the record's path says (phase, arm, rep, kind, rep_label); the path decides kind and
    rep_label, the record the rest."""
    if isinstance(dep, dict):
        dep = to_record(dep, DeploymentRecord, source)
    where = where or {}
    failure = dep.failure
    t0, tr = to_unix(dep.times.start), to_unix(dep.times.ready)
    row = arm_keys(dep.phase, dep.arm_name, dep.rep, dep.arm)
    row.update({
        "deployment_id": dep.deployment_id,
        "kind": _str(first(where.get("kind"), dep.kind)) or "repeat",
        "rep_label": _str(first(where.get("rep_label"), dep.rep_label)),
        "source": source,
        "status": dep.status,
        "failure_stage": failure.stage if failure else None,
        "failure_reason": failure.reason if failure else None,
        "failure_error_excerpt": failure.error_excerpt if failure else None,
        "failure_log": failure.log if failure else None,
        "arm_spec": _str(dep.arm) if dep.arm else None,
        "command": _str(dep.command),
        "speculative_config": speculative_config_from_command(dep.command),
        "hostname": dep.hostname,
        "init_seconds": (tr - t0) if (t0 is not None and tr is not None) else None,
        "n_cells": len(dep.cells),
        "n_cells_ok": sum(1 for c in dep.cells if c.status in ("ok", "valid", "reused")),
        "time_start": _str(dep.times.start),
        "time_ready": _str(dep.times.ready),
        "time_stop": _str(dep.times.stop),
        "start_unix": t0,
    })
    row.update(confound_fields(dep.confounds, dep.cache_config))
    row.update(startup_fields(dep))
    for section, val in (("provenance", dep.provenance), ("confounds", dep.confounds), ("cache_config", dep.cache_config)):
        if isinstance(val, dict):
            row.update(flatten(val, section))
    return row


def speculative_config_from_command(command: Any) -> str | None:
    """The ``--speculative-config`` JSON value of a recorded vLLM argument list (or ``None``)."""
    if not isinstance(command, list):
        return None
    for i, a in enumerate(command):
        a = str(a)
        if a.startswith("--speculative-config="):
            return a.split("=", 1)[1]
        if a in ("--speculative-config", "--speculative_config") and i + 1 < len(command):
            return str(command[i + 1])
    return None


def gate_row(gate: GateRecord | dict, phase: str, arm: str) -> dict:
    """One ``gates`` row from ``gates/<phase>/<arm>.json`` (records.read_gate; a dict is read as one); the path
    names phase and arm."""
    if isinstance(gate, dict):
        gate = to_record(gate, GateRecord, f"gate {phase}/{arm}")
    control, treatment = gate.control, gate.treatment
    control_worst = control.worst_case if control else None
    treatment_worst = treatment.worst_case if treatment else None
    reasons = msgspec.to_builtins(gate.reasons)
    row = {
        "phase": phase,
        "arm": arm,
        "verdict": gate.verdict,
        "blocks_recommendation": gate.blocks_recommendation,
        "reason_codes": ",".join(sorted({r.code for r in gate.reasons})),
        "reasons": _str(reasons) if reasons else "",
        "claim": gate.claim,
        "control_kind": control.kind if control else None,
        "control_arm": control.arm if control else None,
        "control_worst": _str(control_worst),
        "treatment_worst": _str(treatment_worst),
        # the sizes each verdict rests on: a worst case over more pairs is larger by chance alone
        "control_pairs": control.n_pairs if control else None,
        "control_deployments": control.n_deployments if control else None,
        "treatment_pairs": treatment.n_pairs if treatment else None,
        "detail": "",
    }
    for name, val in (("control_worst", control_worst), ("treatment_worst", treatment_worst), ("margins", gate.margins)):
        if isinstance(val, dict):
            row.update(flatten({k: v for k, v in val.items() if not isinstance(v, list | dict)}, name))
    return row


# ---------------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------------
def _read(reader, path: Path):
    """A typed record through ``reader`` (specstudy.core.records); a malformed one is a :class:`TablesError`."""
    try:
        return reader(path)
    except RecordError as exc:
        raise TablesError(str(exc)) from exc


def _verify_summary(path: Path, **where) -> None:
    """Results verified, not trusted (specstudy.core.integrity): fields the schema forbids refused, the keys
    against the path, the digest against the content."""
    from specstudy.core import atomic, integrity

    data = path.read_bytes()
    atomic.check_recorded(path, data)  # the bytes its writer recorded (a hand edit that re-computed the seal too)
    raw = json.loads(data)
    integrity.verify_fields(raw, path)
    integrity.verify_place(raw, path, **where)
    integrity.verify_digest(raw, path)


def _read_jsonl(path: Path) -> list[dict]:
    from specstudy.core import atomic

    atomic.check_recorded(path)
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise TablesError(f"{path}:{n}: not valid JSON ({exc}); a truncated requests file means the attempt "
                                  "was interrupted: delete the attempt directory") from exc
    return rows


def _unplaceable(folder: Path, what: str) -> TablesError:
    from specstudy.core.arms import K_METHODS

    return TablesError(
        f"{folder}: {what}, so `specstudy tables` cannot place its cells and would leave them out of every table. "
        f"An arm folder is named baseline, draft-k<N>-tp<N> or <method>-k<N> with <method> one of "
        f"{', '.join(K_METHODS)} (a variant adds +<name>: dspark-k7+e10), and holds rep<N>/drift<N> deployment "
        "folders. Fix: rename the folder to the arm it holds (re-import an upstream set with `specstudy "
        "import-upstream`, which names arms so), add an unregistered method to core/arms.py, or move the folder "
        "out of the results root")


def _arm_dirs(results: Path):
    """Every deployment folder ``<phase>/<arm>/<rep>`` of a results tree (core phases). A folder there that is
    not an arm (besides the confirmation rounds and hidden folders), or an arm's folder that is not a
    deployment, is an error naming it: no cell is left out of the tables in silence."""
    rounds = Path(layout.confirm_rounds_dir(results))
    for phase in PHASES:
        pdir = results / phase
        if not pdir.is_dir():
            continue
        for adir in sorted(pdir.iterdir()):
            if not adir.is_dir() or adir.name.startswith(".") or adir == rounds:
                continue
            if not ARM_RE.match(adir.name):
                raise _unplaceable(adir, f"folder of phase {phase} whose name {adir.name!r} is not an arm name")
            for rdir in sorted(adir.iterdir()):
                if not rdir.is_dir() or rdir.name.startswith("."):
                    continue
                if not layout.matches("deployment_dir", rdir):
                    raise _unplaceable(rdir, f"folder of arm {adir.name} whose name {rdir.name!r} is not a "
                                             "deployment (rep<N> or drift<N>)")
                yield layout.parse_deployment_dir(rdir)


def _cell_summaries(dep: layout.Deployment) -> list[Path]:
    """The declared cell summaries in a deployment's folder (``<workload>/c<c>/summary.json``)."""
    out = []
    for spath in sorted(Path(dep.dir).glob(f"*/*/{layout.CELL_SUMMARY}")):
        if spath.parent.parent.name != layout.ATTEMPTS and layout.matches("cell", spath):
            out.append(spath)
    return out


def _kind_of(label: str) -> str:
    """``drift`` for an interleaved drift baseline (drift<n>), ``repeat`` for rep<n>: the label decides."""
    return layout.rep_kind(label)


def failure_record(ddir: Path) -> DeploymentRecord:
    """The failure record of one ``deployment-failures/<phase>/<arm>/rep<r>/<id>/`` directory: its
    ``failure.json`` (deployment.records.write_failure_record), or, where the job died between copying the launch log and
    writing the record, a record that says so."""
    if (ddir / layout.FAILURE_RECORD).exists():
        return _read(read_deployment, ddir / layout.FAILURE_RECORD)
    k = layout.parse("failure", ddir)
    arm = k["arm"]
    logs = sorted(ddir.glob("*.log"))
    return DeploymentRecord(deployment_id=k["deployment_id"], phase=k["phase"],
                            arm=parse_arm(arm) if is_arm_name(arm) else {"name": arm},
                            rep=layout.rep_number(k["rep"]), status="failed", command=None, times=DeploymentTimes(),
                            failure=Failure(stage=None, reason="no failure record (only logs)",
                                            log=str(logs[0]) if logs else None))


def _failure_dirs(results: str | Path) -> list[Path]:
    """Every failure record of the core phases under a results root
    (``<root>/deployment-failures/<phase>/<arm>/<rep>/<id>/``): no rule declares them, a failed launch leaves them."""
    fdir = Path(layout.failures_dir(results))
    if not fdir.is_dir():
        return []
    return [d for d in sorted(p for p in fdir.glob("*/*/*/*") if p.is_dir())
            if layout.matches("failure", d) and layout.parse("failure", d)["phase"] in PHASES]


def collect(results: str | Path) -> dict[str, list[dict]]:
    """All table rows (unsorted, unvalidated) from a results tree: every deployment folder of the core phases,
    every failure record, every gate."""
    results = Path(results)
    deps = list(_arm_dirs(results))
    cells = [c for d in deps for c in _cell_summaries(d)]
    failures = _failure_dirs(results)
    gates_dir = Path(layout.gates_dir(results))
    gates = sorted(gates_dir.glob("*/*.json")) if gates_dir.is_dir() else []
    return _collect(deps, cells, failures, gates)


def collect_files(cells: list[str | Path], records: list[str | Path], gates: list[str | Path]) -> dict[str, list[dict]]:
    """All table rows from the files given (what rule ``tables`` passes): the cell summaries, the deployment
    records (with their attempts' request files and their failure records, beside them in the layout) and the
    gates; the failure records of the results root those records lie in. A path that is not of its kind is
    refused, naming it."""
    deps: dict[layout.Deployment, None] = {}
    for r in records:
        deps.setdefault(layout.parse_deployment(r))
    cell_paths = [Path(c) for c in cells]
    for c in cell_paths:
        deps.setdefault(layout.parse_cell(c).deployment)
    for g in gates:
        layout.parse("gate", g)
    failures = [f for root in sorted({d.root for d in deps}) for f in _failure_dirs(root)]
    return _collect(list(deps), cell_paths, failures, [Path(g) for g in gates])


def _cell_from_keys(summary: CellSummary, spath: Path, root: str) -> layout.Cell:
    """The cell a summary's own keys name (a summary written before ``keys.rep_label`` existed names its
    repeat by number: the label is the folder's when its number is that repeat's)."""
    keys = summary.keys
    label = keys.rep_label
    if label is None:
        found = layout.parse_cell(spath).rep
        label = found if keys.rep is not None and layout.rep_number(found) == keys.rep else layout.rep_label(keys.rep)
    return layout.Cell(keys.phase, keys.arm, label, keys.workload, int(keys.concurrency), root)


def _collect(deps: list[layout.Deployment], cells: list[Path], failures: list[Path], gates: list[Path]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {t: [] for t in TABLE_NAMES}
    known_deployments: set[str] = set()
    by_dep: dict[layout.Deployment, list[Path]] = {d: [] for d in deps}
    for c in cells:
        by_dep.setdefault(layout.parse_cell(c).deployment, []).append(Path(c))
    for dep in by_dep:
        rdir = Path(dep.dir)
        dep_path = Path(dep.record)
        spec = None
        if dep_path.exists():
            rec = _read(read_deployment, dep_path)
            row = deployment_row(rec, layout.DEPLOYMENT_RECORD, {"kind": dep.kind, "rep_label": dep.rep})
            out["deployments"].append(row)
            known_deployments.add(row["deployment_id"])
            spec = rec.arm
        chosen: dict[tuple[str, int], str] = {}
        for spath in sorted(by_dep[dep]):
            summary = _read(read_cell_summary, spath)
            # the keys written in the summary are the cell; the place it was found must be the one they name
            place = layout.parse_cell(spath)
            _verify_summary(spath, phase=place.phase, arm=place.arm, rep=place.deployment.number, rep_label=place.rep,
                            workload=place.workload, concurrency=place.concurrency)
            cell = _cell_from_keys(summary, spath, dep.root)
            row = cell_row(summary)
            row["phase"], row["arm"], row["rep"] = cell.phase, cell.arm, cell.deployment.number
            row["kind"], row["rep_label"] = cell.deployment.kind, cell.rep
            row["workload"], row["concurrency"] = cell.workload, cell.concurrency
            out["cells"].append(row)
            chosen[(cell.workload, cell.concurrency)] = row["deployment_id"]
        adir = rdir / layout.ATTEMPTS
        if adir.is_dir():
            for att in sorted(p for p in adir.iterdir() if p.is_dir()):
                for req in sorted(att.glob(f"*/*/{layout.REQUESTS}")):
                    if not layout.matches("attempt_cell_dir", req.parent):
                        continue
                    k = layout.parse("attempt_cell_dir", req.parent)
                    workload, conc = k["workload"], k["concurrency"]
                    if not WORKLOAD_RE.match(workload):
                        continue
                    keys = arm_keys(dep.phase, dep.arm, dep.number, spec)
                    keys.update({"workload": workload, "concurrency": conc, "kind": dep.kind, "rep_label": dep.rep})
                    out["requests"].extend(request_rows(_read_jsonl(req), keys, att.name,
                                                        chosen.get((workload, conc)) == att.name))
    for ddir in failures:
        k = layout.parse("failure", ddir)
        if k["deployment_id"] in known_deployments:
            continue
        out["deployments"].append(deployment_row(failure_record(ddir), "failure_record",
                                                 {"kind": layout.rep_kind(k["rep"]), "rep_label": k["rep"]}))
    _measuring_time(out)
    for g in sorted(gates):
        k = layout.parse("gate", g)
        out["gates"].append(gate_row(_read(read_gate, g), k["phase"], k["arm"]))
    return out


def _measuring_time(out: dict[str, list[dict]]) -> None:
    """Per deployment: the wall time of the cells measured on it, and its share of the deployment's time."""
    wall: dict[str, float] = {}
    for c in out["cells"]:
        if c.get("deployment_id") and c.get("wall_seconds") is not None:
            wall[c["deployment_id"]] = wall.get(c["deployment_id"], 0.0) + float(c["wall_seconds"])
    for d in out["deployments"]:
        m = wall.get(d.get("deployment_id")) if d.get("source") == "deployment.json" else None
        d["measuring_seconds"] = m
        d["measuring_share"] = m / d["deployment_seconds"] if (m is not None and d.get("deployment_seconds")) else None


# ---------------------------------------------------------------------------------------------
# Arrow conversion, validation, deterministic write
# ---------------------------------------------------------------------------------------------
def _arrow_type(name: str):
    import pyarrow as pa

    return {
        "string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(),
        "list<float64>": pa.list_(pa.float64()), "list<int64>": pa.list_(pa.int64()),
    }[name]


def _infer(values: list) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "string"
    if all(isinstance(v, bool) for v in vals):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        return "int64"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals):
        return "float64"
    return "string"


def _coerce(v: Any, typ: str, table: str, column: str) -> Any:
    if v is None:
        return None
    try:
        if typ == "string":
            return _str(v)
        if typ == "bool":
            b = _bool(v)
            if b is None:
                raise ValueError(v)
            return b
        if typ == "int64":
            if isinstance(v, bool):
                raise ValueError(v)
            f = float(v)
            if f != int(f):
                raise ValueError(v)
            return int(f)
        if typ == "float64":
            if isinstance(v, bool):
                raise ValueError(v)
            f = float(v)
            return f if math.isfinite(f) else None
        if typ.startswith("list<"):
            if not isinstance(v, list):
                raise ValueError(v)
            inner = typ[5:-1]
            return [_coerce(x, inner, table, column) for x in v]
    except (TypeError, ValueError) as exc:
        raise TablesError(f"table {table}: column '{column}' expects {typ}, got {v!r} "
                          "(fix the producing record or the column declaration in specstudy.analysis.tables)") from exc
    return v


def column_plan(table: str, rows: list[dict]) -> list[tuple[str, str]]:
    core = CORE_COLUMNS[table]
    core_names = {n for n, _ in core}
    extra = sorted({k for r in rows for k in r} - core_names)
    return core + [(k, _infer([r.get(k) for r in rows])) for k in extra]


def _sort_key(row: dict, keys: list[str]):
    return tuple((row.get(k) is None, row.get(k) if row.get(k) is not None else "") for k in keys)


def validate_rows(table: str, rows: list[dict], source: str) -> None:
    """JSON-schema check of every row (schemas ``config/schemas/table-<table>.schema.json``)."""
    from specstudy.core import schemas

    name = f"table-{table}"
    try:
        schemas.load_schema(name)
    except FileNotFoundError:
        return
    for i, r in enumerate(rows):
        schemas.validate(r, name, f"{source} (row {i} of table {table})")


def build_table(table: str, rows: list[dict]):
    import pyarrow as pa

    plan = column_plan(table, rows)
    rows = sorted(rows, key=lambda r: _sort_key(r, SORT_KEYS[table]))
    fields, arrays = [], []
    for name, typ in plan:
        t = _arrow_type(typ)
        fields.append(pa.field(name, t))
        arrays.append(pa.array([_coerce(r.get(name), typ, table, name) for r in rows], type=t))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def table_bytes(tbl) -> bytes:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(tbl.replace_schema_metadata(None), buf, compression="zstd", compression_level=3,
                   use_dictionary=True, write_statistics=True, store_schema=True, version="2.6")
    return buf.getvalue()


def build_tables(results: str | Path | None, out: str | Path, *, files: dict[str, list] | None = None) -> dict[str, Path]:
    """Write the four tables into ``out``: from the ``files`` given (``{"cells", "records", "gates"}``: what
    rule ``tables`` passes), or from every result file of the tree ``results``."""
    from specstudy.core import atomic

    collected = collect_files(files.get("cells") or [], files.get("records") or [], files.get("gates") or []) \
        if files is not None else collect(results)
    source = str(results) if files is None else "the given result files"
    written = {}
    for table in TABLE_NAMES:
        rows = collected[table]
        validate_rows(table, rows, source)
        tbl = build_table(table, rows)
        written[table] = atomic.write_bytes(Path(out) / f"{table}.parquet", table_bytes(tbl))
    return written


def read_tables(tables: str | Path) -> dict:
    """The four tables of the folder ``tables`` as pandas DataFrames (:func:`read_table_files`)."""
    return read_table_files({table: Path(tables) / f"{table}.parquet" for table in TABLE_NAMES})


def read_table_files(files: dict[str, str | Path]) -> dict:
    """The four tables as pandas DataFrames from their files (table name → Parquet file); a table not given, or
    whose file is missing, is an empty frame with the core columns."""
    import pandas as pd

    out = {}
    for table in TABLE_NAMES:
        p = Path(files[table]) if files.get(table) is not None else None
        if p is not None and p.exists():
            out[table] = pd.read_parquet(p)
        else:
            out[table] = pd.DataFrame({n: pd.Series(dtype="object") for n, _ in CORE_COLUMNS[table]})
    return out


def _cmd_tables(args) -> int:
    given = args.cells is not None or args.deployments is not None or args.gates is not None
    if given and args.results is not None:
        raise UserError("tables: give the result files (--cells, --deployments, --gates) or a results tree "
                        "(--results), not both")
    if given:
        if not args.cells:  # tables without one cell would be written empty, and read as a study that measured nothing
            raise UserError("tables: --cells names no cell summary; give the cells' summary.json files "
                            f"({layout.readable('cell')}), or --results <results tree>")
        files = {"cells": args.cells or [], "records": args.deployments or [], "gates": args.gates or []}
        written = build_tables(None, args.out, files=files)
    else:
        results = args.results or layout.ROOT
        if not Path(results).is_dir():
            raise UserError(f"--results {results}: no such results directory (run from the study's working "
                            "directory, or pass the directory that holds screen/, confirm/, gates/)")
        if next(Path(results).glob(f"*/*/*/*/c*/{layout.CELL_SUMMARY}"), None) is None:
            raise UserError(f"--results {results}: no cell summary in it ({layout.readable('cell', results)}); "
                            "pass the study's results directory (the one holding screen/ and confirm/)")
        written = build_tables(results, args.out)
    for t, p in written.items():
        print(f"{t}: {p}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("tables", help="rebuild the Parquet tables from raw result artifacts")
    p.add_argument("--cells", nargs="*", default=None, metavar="SUMMARY",
                   help="cell summaries (<phase>/<arm>/<rep>/<workload>/c<c>/summary.json): what rule tables passes")
    p.add_argument("--deployments", nargs="*", default=None, metavar="RECORD",
                   help="deployment records (<phase>/<arm>/<rep>/deployment.json); their attempts' request files and "
                   "failure records are read beside them")
    p.add_argument("--gates", nargs="*", default=None, metavar="GATE", help="gate records (gates/<phase>/<arm>.json)")
    p.add_argument("--results", default=None,
                   help="instead of the files: every result of this results tree (default, with no files: results)")
    p.add_argument("--out", default=layout.tables_dir(), help=f"output directory (default: {layout.tables_dir()})")
    p.set_defaults(func=_cmd_tables)
