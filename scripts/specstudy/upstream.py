"""Importer for the real 70B study's raw cells (``/work/shared/upstream-70b``, see its MANIFEST.md).

An upstream cell directory (``<variant>-<slurm job>/<workload>/c<c>/repeat-<r>/``) holds
``requests.jsonl``, ``metrics_before.prom``, ``metrics_after.prom``, ``summary.json`` and
``metadata.json``. :func:`convert_cell` maps its request rows to this project's request-row fields
(our definitions, see ``docs/metrics.md`` "Upstream 70B cells") and recomputes the summary with
:func:`specstudy.cell.summarize`; the upstream summary is kept verbatim under ``upstream``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from specstudy import atomic, cell

REQUIRED_FILES = ("requests.jsonl", "metrics_before.prom", "metrics_after.prom", "summary.json", "metadata.json")
WALL_SOURCE = (
    "upstream summary.json wall_seconds: time.perf_counter() around the whole closed-loop gather "
    "(first worker start -> last worker exit); the rows carry no per-request start/end times"
)
DEFINITION_NOTES = {
    "e2e_ms": "ours = ttft_ms + sum(stream_event_gaps_ms) (start -> last content event); upstream = start -> "
    "end of stream incl. the trailing usage chunk and [DONE] (kept as upstream.e2e_ms)",
    "tpot_ms": "ours = (e2e_ms - ttft_ms)/(completion_tokens - 1) with our e2e; upstream used its e2e "
    "(kept as upstream.tpot_ms)",
    "success": "ours additionally requires finish_reason stop/length and HTTP 200; upstream = usage present",
    "tokens_per_event": "null: upstream did not request continuous usage stats",
}


class UpstreamError(ValueError):
    """An upstream cell directory is incomplete or malformed; the message names file and field."""


def arm_of(variant: dict) -> tuple[str, dict]:
    """Our arm name and arm spec for an upstream ``metadata.variant``."""
    method = variant.get("method")
    k = variant.get("num_speculative_tokens")
    if method in ("none", "baseline", None):
        return "baseline", {"name": "baseline", "method": "baseline"}
    if method == "draft_model":
        tp = variant.get("draft_tensor_parallel_size")
        name = f"draft-k{k}-tp{tp}"
        return name, {"name": name, "method": "draft_model", "num_speculative_tokens": k, "draft_tensor_parallel_size": tp}
    if method == "ngram":
        name = f"ngram-k{k}"
        return name, {
            "name": name,
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": variant.get("prompt_lookup_max"),
        }
    raise UpstreamError(f"metadata.json: field 'variant.method' = {method!r} is not one of none, draft_model, ngram")


def map_row(up: dict) -> dict:
    """One upstream request row -> our request-row fields (see DEFINITION_NOTES)."""
    gaps = [float(g) for g in (up.get("stream_event_gaps_ms") or [])]
    ttft = up.get("ttft_ms")
    comp = up.get("completion_tokens")
    e2e = None if ttft is None else math.fsum([float(ttft), *gaps])
    tpot = None
    if e2e is not None and comp is not None and comp > 1:
        tpot = (e2e - ttft) / (comp - 1)
    status = up.get("status_code")
    finish = up.get("finish_reason")
    success = bool(up.get("success")) and status == 200 and up.get("error") is None and finish in cell.OK_FINISH_REASONS
    return {
        "request_index": up["request_index"],
        "prompt_id": up.get("prompt_id"),
        "workload": up.get("workload"),
        "scheduled_s": None,
        "start_s": None,
        "end_s": None,
        "start_unix": None,
        "ttft_ms": ttft,
        "e2e_ms": e2e,
        "tpot_ms": tpot,
        "completion_tokens": comp,
        "prompt_tokens": up.get("prompt_tokens"),
        "usage_present": comp is not None,
        "finish_reason": finish,
        "status_code": status,
        "error": up.get("error"),
        "success": success,
        "n_content_events": (len(gaps) + 1) if ttft is not None else 0,
        "stream_event_gaps_ms": gaps,
        "tokens_per_event": None,
        "output_sha256": up.get("output_sha256"),
        "output_chars": None,
        "upstream": {"e2e_ms": up.get("e2e_ms"), "tpot_ms": up.get("tpot_ms"), "success": up.get("success")},
    }


def find_cells(root: str | Path) -> list[Path]:
    """``root`` itself if it is a cell directory, else every cell directory below it (sorted)."""
    root = Path(root)
    if (root / "requests.jsonl").is_file():
        return [root]
    return sorted(p.parent for p in root.rglob("requests.jsonl"))


def load_cell(cell_dir: str | Path) -> dict:
    d = Path(cell_dir)
    missing = [f for f in REQUIRED_FILES if not (d / f).is_file()]
    if missing:
        raise UpstreamError(f"{d}: not a complete upstream cell, missing {missing} (need {list(REQUIRED_FILES)})")
    meta = atomic.read_json(d / "metadata.json")
    for field in ("variant", "cell", "workload_file_sha256"):
        if field not in meta:
            raise UpstreamError(f"{d / 'metadata.json'}: missing field '{field}'")
    rows = atomic.read_jsonl(d / "requests.jsonl")
    for i, r in enumerate(rows):
        if "request_index" not in r:
            raise UpstreamError(f"{d / 'requests.jsonl'} line {i + 1}: missing field 'request_index'")
    return {
        "dir": d,
        "metadata": meta,
        "rows": rows,
        "summary": atomic.read_json(d / "summary.json"),
        "before": (d / "metrics_before.prom").read_text(encoding="utf-8"),
        "after": (d / "metrics_after.prom").read_text(encoding="utf-8"),
    }


def _deployment_id(cell_dir: Path) -> str:
    # .../<variant>-<job>/<workload>/c<c>/repeat-<r>
    try:
        return cell_dir.parents[2].name
    except IndexError:
        return cell_dir.name


def convert_cell(cell_dir: str | Path) -> tuple[list[dict], dict, dict]:
    """Return (our request rows, our summary, raw upstream bundle) for one upstream cell."""
    up = load_cell(cell_dir)
    meta = up["metadata"]
    arm, arm_spec = arm_of(meta["variant"])
    c = meta["cell"]
    keys = {
        "phase": "upstream",
        "arm": arm,
        "method": arm_spec["method"],
        "num_speculative_tokens": arm_spec.get("num_speculative_tokens"),
        "draft_tensor_parallel_size": arm_spec.get("draft_tensor_parallel_size"),
        "rep": int(c["repeat"]),
        "workload": c["workload"],
        "concurrency": int(c["concurrency"]),
        "deployment_id": _deployment_id(Path(cell_dir)),
    }
    corpus = {
        "name": f"upstream-{Path(meta.get('workload_file', 'workload')).stem}",
        "version": "upstream",
        "digest": f"sha256:{meta['workload_file_sha256']}",
    }
    rows = [map_row(r) for r in sorted(up["rows"], key=lambda r: r["request_index"])]
    spec = {
        "arm": arm_spec,
        "workload": c["workload"],
        "corpus_digest": corpus["digest"],
        "concurrency": int(c["concurrency"]),
        "requests": c.get("requests"),
        "warmup_requests": c.get("warmup_requests"),
        "sampling": c.get("generation"),
    }
    summary = cell.summarize(
        rows,
        up["before"],
        up["after"],
        keys=keys,
        corpus=corpus,
        client={"limited": None, "note": "upstream recorded no load-generator self-measurement"},
        confounds={k: v for k, v in (meta.get("extra") or {}).items() if k in ("vllm_build", "async_scheduling", "hardware")},
        warmup_counts={"attempted": c.get("warmup_requests"), "successful": None},
        fingerprint=cell.cell_fingerprint(spec),
        wall_seconds=up["summary"].get("wall_seconds"),
        wall_source=WALL_SOURCE,
        times={"started_at": meta.get("started_at"), "ended_at": meta.get("ended_at")},
    )
    summary["upstream"] = {
        "cell_dir": str(Path(cell_dir)),
        "model": meta.get("model"),
        "variant": meta.get("variant"),
        "harness_git_revision": meta.get("harness_git_revision"),
        "definition_differences": DEFINITION_NOTES,
        "summary": up["summary"],
    }
    cell.validate_summary(summary, Path(cell_dir) / "summary.json (converted)")
    return rows, summary, up


def import_cell(cell_dir: str | Path, out_root: str | Path) -> Path:
    """Write the converted cell to ``<out>/<arm>/rep<r>/<workload>/c<c>/`` and return that path."""
    rows, summary, up = convert_cell(cell_dir)
    k = summary["keys"]
    out = Path(out_root) / k["arm"] / f"rep{k['rep']}" / k["workload"] / f"c{k['concurrency']}"
    atomic.write_jsonl(out / "requests.jsonl", rows)
    atomic.write_text(out / "metrics_before.prom", up["before"])
    atomic.write_text(out / "metrics_after.prom", up["after"])
    atomic.write_json(out / "upstream_metadata.json", up["metadata"])
    atomic.write_json(out / "summary.json", summary)
    return out


def _fmt(x, spec=".4g"):
    return "-" if x is None else format(x, spec)


def cmd_import(args: argparse.Namespace) -> int:
    cells = find_cells(args.source)
    if not cells:
        print(f"error: {args.source}: no upstream cell found (a cell directory contains {list(REQUIRED_FILES)})", file=sys.stderr)
        return 2
    print("arm                c   valid  acc_rate  mal     out_tok/s  ttft_p50  tpot_p50  -> path")
    for d in cells:
        try:
            out = import_cell(d, args.out)
        except (UpstreamError, ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        s = atomic.read_json(out / "summary.json")
        sp = s["speculative"]
        print(
            f"{s['keys']['arm']:<18} {s['keys']['concurrency']:<3} {str(s['validity']['valid']):<6} "
            f"{_fmt(sp.get('acceptance_rate')):<9} {_fmt(sp.get('mean_acceptance_length')):<7} "
            f"{_fmt(s['tokens']['output_tokens_per_second'], '.1f'):<10} {_fmt(s['latency_ms']['ttft']['p50'], '.1f'):<9} "
            f"{_fmt(s['latency_ms']['tpot']['p50'], '.2f'):<9} -> {out}"
        )
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "import-upstream",
        help="convert the 70B study's raw cells into this project's cell format",
        description="Convert upstream 70B cells (requests.jsonl, metrics_{before,after}.prom, summary.json, "
        "metadata.json) into specstudy cells; the summary is recomputed from the raw files.",
    )
    p.add_argument("source", help="an upstream cell directory (…/c8/repeat-01) or any directory above cells")
    p.add_argument("out", help="output root; cells go to <out>/<arm>/rep<r>/<workload>/c<c>/")
    p.set_defaults(func=cmd_import)

