"""Importer for the upstream study's raw cells (swiss-ai/apertus-speculative-decoding).

Layouts: 70B smoke (``/work/shared/upstream-70b``: ``<variant>-<slurm job>/<workload>/c<c>/repeat-<r>/``),
8B confirmation (``results/8b/eagle/confirm/<deployment>/cells/<workload>/c<c>/``, one deployment per block,
``extra.block_id`` c1..c3 = our repeat) and 8B sweeps (``<sweep>/<arm>/<workload>/<workload>/c<c>/``).
A cell holds ``requests.jsonl``, ``metrics_before.prom``, ``metrics_after.prom``, ``summary.json`` and
``metadata.json`` (8B: also ``metrics_timeseries.jsonl``, copied verbatim). :func:`convert_cell` maps its
request rows to this project's request-row fields (our definitions, see ``docs/metrics.md`` "Upstream 70B
cells") and recomputes the summary with :func:`specstudy.measure.cell.summarize`; the upstream summary is kept
verbatim under ``upstream``. ``docs/upstream-8b.md`` covers the 8B set.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
from pathlib import Path

from specstudy.core import atomic
from specstudy.core.arms import K_METHODS, METHODS, arm_name
from specstudy.measure import cell, prom

REQUIRED_FILES = ("requests.jsonl", "metrics_before.prom", "metrics_after.prom", "summary.json", "metadata.json")
# kept verbatim beside the converted cell when present (the 8B harness's /metrics time series)
RAW_ARTIFACTS = ("metrics_timeseries.jsonl",)
# metadata.extra fields naming the drafter's checkpoint, first present wins
DRAFTER_FIELDS = ("eagle_head", "dspark_checkpoint", "draft_model", "speculative_model")
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


WALL_FROM_ROWS = (
    "sum over all rows of upstream e2e_ms (start -> end of stream) / concurrency: the busy time of the "
    "closed loop's workers; equal to the wall for concurrency 1 up to the gaps between requests, a lower "
    "bound otherwise (the rows carry no start/end times)"
)


class UpstreamError(ValueError):
    """An upstream cell directory is incomplete or malformed; the message names file and field."""


class IncompleteCell(UpstreamError):
    """An upstream cell directory lacks some of :data:`REQUIRED_FILES` (``missing`` lists them)."""

    def __init__(self, cell_dir: Path, missing: list[str]):
        self.cell_dir, self.missing = Path(cell_dir), list(missing)
        super().__init__(f"{cell_dir}: not a complete upstream cell, missing {self.missing} "
                         f"(need {list(REQUIRED_FILES)})")


def _spec_config(extra: dict, where: str) -> dict | None:
    """``extra.speculative_config`` (a JSON string in the 8B cells) as a dict, None when absent."""
    raw = extra.get("speculative_config")
    if raw in (None, ""):
        return None
    if isinstance(raw, dict):
        return raw
    try:
        cfg = json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise UpstreamError(f"{where}: field 'extra.speculative_config' is not JSON ({exc}); expected the "
                            "engine's --speculative-config string") from None
    if not isinstance(cfg, dict):
        raise UpstreamError(f"{where}: field 'extra.speculative_config' is {type(cfg).__name__}, not an object")
    return cfg


def _method_token(method: str) -> str:
    tok = re.sub(r"[^a-z0-9_]+", "_", str(method).lower()).strip("_")
    if not tok:
        raise UpstreamError(f"metadata.json: field 'variant.method' = {method!r} has no usable name")
    return tok


def arm_of(variant: dict, extra: dict | None = None, where: str = "metadata.json") -> tuple[str, dict]:
    """Our arm name and arm spec for an upstream ``metadata.variant`` (and ``metadata.extra``).

    ``none``/``baseline`` -> ``baseline``; ``draft_model`` -> ``draft-k<k>-tp<tp>``; every other method the
    engine names (``ngram``, ``eagle3``, ``dspark``, ...) -> ``<method>-k<k>``, with the method's own
    speculative settings recorded in the spec (``upstream_variant``, ``speculative_config``, the drafter's
    checkpoint). A method without ``num_speculative_tokens`` is an error naming the field."""
    extra = extra or {}
    method = variant.get("method")
    k = variant.get("num_speculative_tokens")
    if method in ("none", "baseline", None):
        return "baseline", {"name": "baseline", "method": "baseline"}
    if method == "draft_model":
        tp = variant.get("draft_tensor_parallel_size")
        spec = {"method": "draft_model", "num_speculative_tokens": k, "draft_tensor_parallel_size": tp}
        name = arm_name(spec)
        return name, {"name": name, **spec}
    if method == "ngram":
        name = arm_name({"method": "ngram", "num_speculative_tokens": k})
        return name, {
            "name": name,
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": variant.get("prompt_lookup_max"),
        }
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise UpstreamError(f"{where}: field 'variant.num_speculative_tokens' = {k!r} for method {method!r}; a "
                            "speculative arm needs its depth (a positive integer)")
    tok = _method_token(method)
    name = arm_name({"method": tok, "num_speculative_tokens": k}) if tok in K_METHODS else f"{tok}-k{k}"
    spec = {
        "name": name,
        "method": tok,
        "num_speculative_tokens": k,
        "draft_tensor_parallel_size": variant.get("draft_tensor_parallel_size"),
        # the method's own settings, as upstream recorded them
        "upstream_variant": dict(variant),
        "speculative_config": _spec_config(extra, where),
        "drafter": next((extra[f] for f in DRAFTER_FIELDS if extra.get(f)), None),
    }
    if tok not in K_METHODS:
        spec["note"] = (f"method {method!r} is not one of this project's arm methods ({', '.join(METHODS)}); "
                        f"imported as arm {name!r} with its settings under upstream_variant/speculative_config")
    return name, spec


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


def _is_cell_dir(d: Path) -> bool:
    """A directory holding any of the cell files (requests.jsonl, metrics_*.prom, or summary.json
    together with metadata.json): a cell, complete or not."""
    names = {p.name for p in d.iterdir() if p.is_file()}
    return bool(names & {"requests.jsonl", "metrics_before.prom", "metrics_after.prom"}) or \
        {"summary.json", "metadata.json"} <= names


def find_cells(root: str | Path) -> list[Path]:
    """``root`` itself if it is a cell directory, else every cell directory below it (sorted),
    incomplete ones included (:func:`load_cell` says what they lack)."""
    root = Path(root)
    if root.is_dir() and _is_cell_dir(root):
        return [root]
    return sorted(d for d in root.rglob("*") if d.is_dir() and _is_cell_dir(d))


def load_cell(cell_dir: str | Path) -> dict:
    d = Path(cell_dir)
    missing = [f for f in REQUIRED_FILES if not (d / f).is_file()]
    if missing:
        raise IncompleteCell(d, missing)
    for name in ("metrics_before.prom", "metrics_after.prom"):
        if not (d / name).read_text(encoding="utf-8").strip():
            raise UpstreamError(f"{d / name}: empty file; a cell needs the /metrics scrape taken before and after "
                                "its measured window (without it nothing says whether speculation ran). Re-copy the "
                                "file from the upstream run, or leave the cell out")
    meta = atomic.read_json(d / "metadata.json")
    for field in ("variant", "cell", "workload_file_sha256"):
        if field not in meta:
            raise UpstreamError(f"{d / 'metadata.json'}: missing field '{field}'")
    rows = atomic.read_jsonl(d / "requests.jsonl")
    for i, r in enumerate(rows):
        if "request_index" not in r:
            raise UpstreamError(f"{d / 'requests.jsonl'} line {i + 1}: missing field 'request_index'")
    summary = atomic.read_json(d / "summary.json")
    cell_ = meta["cell"]
    lacking = [k for k in ("workload", "concurrency", "repeat") if not isinstance(cell_, dict) or k not in cell_]
    if lacking:
        raise UpstreamError(f"{d / 'metadata.json'}: field 'cell' must name the cell as a mapping with workload, "
                            f"concurrency and repeat (lacking: {', '.join('cell.' + k for k in lacking)}; got "
                            f"{cell_!r}); re-copy metadata.json from the upstream run's cell directory")
    return {
        "dir": d,
        "metadata": meta,
        "rows": rows,
        "summary": summary,
        "before": (d / "metrics_before.prom").read_text(encoding="utf-8"),
        "after": (d / "metrics_after.prom").read_text(encoding="utf-8"),
    }


def _deployment_id(cell_dir: Path, meta: dict) -> str:
    """``metadata.extra.deployment_id`` (the 8B cells), else the directory of the layout:
    70B ``<variant>-<job>/<workload>/c<c>/repeat-<r>``, 8B confirmation ``<deployment>/cells/<workload>/c<c>``,
    8B sweep ``<sweep>/<arm>/<workload>/<workload>/c<c>`` (-> ``<sweep>/<arm>``)."""
    dep = (meta.get("extra") or {}).get("deployment_id")
    if dep:
        return str(dep)
    parts = cell_dir.parts
    if cell_dir.name.startswith("repeat-") and len(parts) >= 4:
        return parts[-4]
    if len(parts) >= 4 and parts[-3] == "cells":
        return parts[-4]
    if len(parts) >= 5 and parts[-2] == parts[-3]:
        return f"{parts[-5]}/{parts[-4]}"
    return cell_dir.parent.name or cell_dir.name


def _block_number(block, where: Path) -> int:
    m = re.fullmatch(r"[A-Za-z_-]*0*([0-9]+)", str(block))
    if not m or int(m[1]) < 1:
        raise UpstreamError(f"{where}: field 'extra.block_id' = {block!r} is not a block label such as 'c1' "
                            "(letters then a positive number)")
    return int(m[1])


def repeat_of(meta: dict, where: Path) -> int:
    """The deployment repeat of a cell: ``extra.block_id`` (8B confirmation blocks c1..c3, each its own
    deployment, every cell ``repeat`` 1), else ``cell.repeat`` (70B)."""
    c = meta["cell"]
    block = (meta.get("extra") or {}).get("block_id")
    repeat = int(c.get("repeat") or 1)
    if block is None:
        return repeat
    if repeat != 1:
        raise UpstreamError(f"{where}: field 'cell.repeat' = {repeat} inside block {block!r}: a block holds one "
                            "measurement per cell here; re-run the import per repeat into separate output roots")
    return _block_number(block, where)


def convert_cell(cell_dir: str | Path, phase: str = "upstream") -> tuple[list[dict], dict, dict]:
    """Return (our request rows, our summary, raw upstream bundle) for one upstream cell; ``phase`` is the
    phase key the summary carries (``upstream``, or ``confirm`` for a confirmation set)."""
    up = load_cell(cell_dir)
    meta = up["metadata"]
    meta_path = Path(cell_dir) / "metadata.json"
    arm, arm_spec = arm_of(meta["variant"], meta.get("extra"), str(meta_path))
    c = meta["cell"]
    dec = prom.decreased_counters(up["before"], up["after"])
    if dec:
        shown = ", ".join(f"{d['name']} {d['before']} -> {d['after']}" for d in dec[:3])
        raise UpstreamError(
            f"counter decreased in {Path(cell_dir) / 'metrics_before.prom'} -> {Path(cell_dir) / 'metrics_after.prom'}: "
            f"{len(dec)} cumulative series are lower after the window than before ({shown}). Either the two files "
            "are swapped (metrics_before.prom must be the scrape taken before the measured requests) or the server "
            "restarted in between; re-copy them from the upstream run or leave the cell out")
    keys = {
        "phase": phase,
        "arm": arm,
        "method": arm_spec["method"],
        "num_speculative_tokens": arm_spec.get("num_speculative_tokens"),
        "draft_tensor_parallel_size": arm_spec.get("draft_tensor_parallel_size"),
        "rep": repeat_of(meta, meta_path),
        "workload": c["workload"],
        "concurrency": int(c["concurrency"]),
        "deployment_id": _deployment_id(Path(cell_dir), meta),
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
    if arm_spec["method"] != "baseline" and not summary["speculative"].get("enabled"):
        raise UpstreamError(
            f"{Path(cell_dir) / 'metrics_after.prom'}: no vllm:spec_decode_* counters, but metadata.json field "
            f"'variant.method' is {meta['variant'].get('method')!r}: a speculative arm whose scrapes show no "
            "speculation cannot be imported as valid. Check that the scrapes belong to this deployment")
    ok = [r for r in rows if cell.is_success(r)]
    up_e2e = [r["upstream"]["e2e_ms"] for r in rows if r["upstream"]["e2e_ms"] is not None]
    conc = int(c["concurrency"])
    wall_rows = math.fsum(up_e2e) / 1000.0 / conc if len(up_e2e) == len(rows) and rows else None
    wall_up = up["summary"].get("wall_seconds")
    comp = summary["tokens"]["completion"]
    summary["upstream"] = {
        "cell_dir": str(Path(cell_dir)),
        "model": meta.get("model"),
        "variant": meta.get("variant"),
        "harness_git_revision": meta.get("harness_git_revision"),
        "block_id": (meta.get("extra") or {}).get("block_id"),
        "cell_repeat": c.get("repeat"),
        "raw_artifacts": [n for n in RAW_ARTIFACTS if (Path(cell_dir) / n).is_file()],
        "definition_differences": DEFINITION_NOTES,
        # the wall time this summary uses is upstream's; the one the rows give is beside it
        "wall": {
            "wall_seconds_upstream": wall_up,
            "wall_seconds_upstream_source": WALL_SOURCE,
            "wall_seconds_from_rows": wall_rows,
            "wall_seconds_from_rows_source": WALL_FROM_ROWS,
            "output_tokens_per_second_upstream_wall": comp / wall_up if wall_up else None,
            "output_tokens_per_second_from_rows": comp / wall_rows if wall_rows else None,
            "rows_to_upstream_wall": wall_rows / wall_up if (wall_rows and wall_up) else None,
        },
        # upstream-compatible latencies (to the end of the stream, usage chunk included), beside ours
        "latency_ms_upstream_definition": {
            "e2e": cell.distribution(r["upstream"]["e2e_ms"] for r in ok),
            "tpot": cell.distribution(r["upstream"]["tpot_ms"] for r in ok),
            "definition": "upstream: e2e = request start -> end of stream incl. the trailing usage chunk and [DONE]; "
                          "tpot = (e2e - ttft)/(completion_tokens - 1) with that e2e",
        },
        "summary": up["summary"],
    }
    cell.validate_summary(summary, Path(cell_dir) / "summary.json (converted)")
    return rows, summary, up


def import_cell(cell_dir: str | Path, out_root: str | Path, phase: str = "upstream") -> Path:
    """Write the converted cell to ``<out>/<arm>/rep<r>/<workload>/c<c>/`` and return that path.

    The raw artifacts (``metrics_timeseries.jsonl``) are copied verbatim beside it. A path already holding
    a cell of another upstream deployment is an error (two blocks must never overwrite each other)."""
    rows, summary, up = convert_cell(cell_dir, phase)
    k = summary["keys"]
    out = Path(out_root) / k["arm"] / f"rep{k['rep']}" / k["workload"] / f"c{k['concurrency']}"
    if (out / "summary.json").is_file():
        prev = atomic.read_json(out / "summary.json")
        prev_dep = (prev.get("keys") or {}).get("deployment_id")
        if prev_dep != k["deployment_id"]:
            raise UpstreamError(
                f"{out / 'summary.json'}: already holds deployment {prev_dep!r}, and {Path(cell_dir)} (deployment "
                f"{k['deployment_id']!r}) maps to the same arm {k['arm']!r}, repeat {k['rep']}, workload and "
                "concurrency. Import the two sets into separate output roots (different drafters of one method and "
                "depth share an arm name), or remove the old cell")
    atomic.write_jsonl(out / "requests.jsonl", rows)
    atomic.write_text(out / "metrics_before.prom", up["before"])
    atomic.write_text(out / "metrics_after.prom", up["after"])
    atomic.write_json(out / "upstream_metadata.json", up["metadata"])
    for name in summary["upstream"]["raw_artifacts"]:
        tmp = out / f".{name}.tmp"
        shutil.copyfile(Path(cell_dir) / name, tmp)
        tmp.replace(out / name)
    from specstudy.core.integrity import seal

    atomic.write_json(out / "summary.json", seal(summary))
    return out


def validity_label(validity: dict) -> str:
    """``valid`` for a fully valid cell; ``lat-only`` when latencies are valid but throughput/TPOT are not
    (e.g. a request without usage); ``invalid`` otherwise."""
    if not validity.get("valid"):
        return "invalid"
    if not (validity.get("throughput_valid") and validity.get("tpot_valid", True)):
        return "lat-only"
    return "valid"


def _fmt(x, spec=".4g"):
    return "-" if x is None else format(x, spec)


def cmd_import(args: argparse.Namespace) -> int:
    """Import every complete cell under ``source``; list the incomplete ones with their missing files.
    Exit 2 when nothing could be imported, when a cell is malformed, or (``--strict``) when any cell is
    incomplete; else 0."""
    cells = find_cells(args.source)
    if not cells:
        print(f"error: {args.source}: no upstream cell found (a cell directory contains {list(REQUIRED_FILES)})",
              file=sys.stderr)
        return 2
    head = (f"{'arm':<14} {'rep':<3} {'workload':<10} {'c':<3} {'validity':<8} {'acc':<6} {'mal':<6} {'tok/s':>8} {'tok/s':>8} "
            f"{'ttft50':>8} {'e2e50':>8} {'e2e50':>8} {'tpot50':>7} {'tpot50':>7}")
    sub = (f"{'':<14} {'':<3} {'':<10} {'':<3} {'':<8} {'':<6} {'':<6} {'up wall':>8} {'rows':>8} {'':>8} {'ours':>8} "
           f"{'up':>8} {'ours':>7} {'up':>7}")
    imported, incomplete, errors = [], [], []
    for d in cells:
        try:
            if args.out:
                out = import_cell(d, args.out, args.phase)
                s = atomic.read_json(out / "summary.json")
            else:
                out, s = None, convert_cell(d, args.phase)[1]
        except IncompleteCell as exc:
            incomplete.append(exc)
            continue
        except (UpstreamError, ValueError, OSError) as exc:
            errors.append(f"{d}: {exc}" if str(d) not in str(exc) else str(exc))
            continue
        if not imported:
            print(head)
            print(sub)
        imported.append(d)
        sp, w = s["speculative"], s["upstream"]["wall"]
        ud = s["upstream"]["latency_ms_upstream_definition"]
        print(f"{s['keys']['arm']:<14} {s['keys']['rep']:<3} {s['keys']['workload']:<10} {s['keys']['concurrency']:<3} "
              f"{validity_label(s['validity']):<8} {_fmt(sp.get('acceptance_rate'), '.3f'):<6} "
              f"{_fmt(sp.get('mean_acceptance_length'), '.3f'):<6} "
              f"{_fmt(w['output_tokens_per_second_upstream_wall'], '.1f'):>8} "
              f"{_fmt(w['output_tokens_per_second_from_rows'], '.1f'):>8} {_fmt(s['latency_ms']['ttft']['p50'], '.1f'):>8} "
              f"{_fmt(s['latency_ms']['e2e']['p50'], '.1f'):>8} {_fmt(ud['e2e']['p50'], '.1f'):>8} "
              f"{_fmt(s['latency_ms']['tpot']['p50'], '.2f'):>7} {_fmt(ud['tpot']['p50'], '.2f'):>7}"
              + (f"  -> {out}" if out else ""))
    if imported:
        print("tok/s: output tokens/s with upstream's wall (summary.json wall_seconds) | with the wall from the rows "
              "(sum of e2e / concurrency; a lower bound of the wall for c > 1).\n"
              "e2e/tpot p50 (ms): ours end at the last content event | upstream's end after the usage chunk and [DONE] "
              "(upstream's tables use the latter).\n"
              "validity: valid | lat-only (latencies valid; throughput and TPOT not: validity.throughput_valid "
              "false, e.g. a request without usage) | invalid (see the summary's validity.reasons).")
    for exc in incomplete:
        print(f"incomplete: {exc.cell_dir}: missing {', '.join(exc.missing)}", file=sys.stderr)
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    print(f"{len(imported)} cell(s) {'imported' if args.out else 'read'}, {len(incomplete)} incomplete, "
          f"{len(errors)} with errors", file=sys.stderr)
    if not imported or errors or (incomplete and args.strict):
        return 2
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "import-upstream",
        help="convert the upstream study's raw cells (70B smoke, 8B sweeps and confirmation) into this project's cell format",
        description="Convert upstream cells (requests.jsonl, metrics_{before,after}.prom, summary.json, "
        "metadata.json) into specstudy cells; the summary is recomputed from the raw files. Complete cells are "
        "imported; incomplete ones are listed with their missing files.",
    )
    p.add_argument("source", help="an upstream cell directory (…/c8/repeat-01) or any directory above cells")
    p.add_argument("out", nargs="?", default=None,
                   help="output root; cells go to <out>/<arm>/rep<r>/<workload>/c<c>/ (omit to only report)")
    p.add_argument("--strict", action="store_true", help="exit 2 when any cell is incomplete")
    p.add_argument("--phase", default="upstream",
                   help="phase key of the imported summaries (default upstream; confirm to import a confirmation "
                   "set into results/confirm)")
    p.set_defaults(func=cmd_import)
