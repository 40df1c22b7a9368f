"""The knee record read back: the knee's view of the arm's deployment record (KV capacity, memory
confounds; written into ``knee.json``), a typed knee from any of its forms, and the comparison of two arms'
knees ("the draft costs X% of the KV pool and moves the knee by Y").
"""

from __future__ import annotations

import os

from specstudy.core import atomic
from specstudy.core.records import CapacityKnee, kv_cache_tokens, read_knee, to_record
from specstudy.core.stat_util import finite_or_none as _num
from specstudy.measure.capacity.step import finite


def kv_capacity_tokens(record: dict | None) -> float | None:
    """KV pool in tokens of a deployment record or a knee's deployment summary: the launch log's figure,
    else the ``/metrics`` one (records.kv_cache_tokens), else the summary's own ``kv_capacity_tokens``."""
    tokens = kv_cache_tokens(record, sources=("log", "metrics"))
    return tokens if tokens is not None or not record else _num(record.get("kv_capacity_tokens"))


def _kv_memory_gib(record: dict) -> float | None:
    kv = (record.get("confounds") or {}).get("kv_cache") or {}
    if isinstance(kv, dict) and _num(kv.get("available_memory_gib")) is not None:
        return _num(kv["available_memory_gib"])
    b = _num((record.get("cache_config") or {}).get("kv_cache_memory_bytes"))
    return b / 2**30 if b is not None else None


def deployment_summary(record: dict | str | os.PathLike | None) -> dict | None:
    """The knee's view of the arm's deployment record: id, KV capacity, KV/memory confounds."""
    if record is None:
        return None
    path = None
    if not isinstance(record, dict):
        path = str(record)
        record = atomic.read_json(record)
    conf = record.get("confounds") or {}
    kv_conf = {k: v for k, v in conf.items()
               if any(w in k.lower() for w in ("kv", "cache", "memory", "block", "gpu_mem"))}
    return finite({
        "path": path,
        "deployment_id": record.get("deployment_id"),
        "phase": record.get("phase"),
        "rep": record.get("rep"),
        "arm": record.get("arm"),
        "kv_capacity_tokens": kv_capacity_tokens(record),
        "kv_cache_memory_gib": _kv_memory_gib(record),
        "cache_config": record.get("cache_config"),
        "confounds": kv_conf,
    })


def as_knee(knee: CapacityKnee | dict | str | os.PathLike) -> CapacityKnee:
    """A typed knee from a record, its dict (run_capacity's return) or its ``knee.json``."""
    if isinstance(knee, CapacityKnee):
        return knee
    return to_record(knee, CapacityKnee, "<knee>") if isinstance(knee, dict) else read_knee(knee)


def compare_knees(baseline_knee: CapacityKnee | dict | str | os.PathLike,
                  candidate_knee: CapacityKnee | dict | str | os.PathLike) -> str:
    """"the draft costs X% of the KV pool and moves the knee by Y" from two ``knee.json`` records."""
    b, c = as_knee(baseline_knee), as_knee(candidate_knee)
    kb, kc = kv_capacity_tokens(b.deployment), kv_capacity_tokens(c.deployment)
    if kb and kc is not None:
        cost = f"costs {100.0 * (kb - kc) / kb:.1f}% of the KV pool ({kb:,.0f} -> {kc:,.0f} tokens)"
    else:
        cost = "costs an unknown share of the KV pool (no KV capacity in the deployment records)"
    qb, qc = _num(b.knee_rps), _num(c.knee_rps)
    if qb is not None and qc is not None:
        d = qc - qb
        pct = f", {100.0 * d / qb:+.1f}%" if qb else ""
        move = f"moves the knee by {d:+.3g} req/s ({qb:.3g} -> {qc:.3g} req/s{pct})"
    else:
        move = "moves the knee by an unknown amount (a knee is missing)"
    caveats = [f"{name} knee {rec.status}" for name, rec in (("baseline", b), ("candidate", c))
               if rec.status != "confirmed"]
    tail = f" [{'; '.join(caveats)}]" if caveats else ""
    method = ((c.deployment or {}).get("arm") or {}).get("method")  # the summary's arm: the record's, or None
    subject = ("the draft" if method in (None, "draft_model") else "n-gram speculation (no draft model)"
               if method == "ngram" else f"the {method} arm")
    return f"{subject} {cost} and {move}{tail}"
