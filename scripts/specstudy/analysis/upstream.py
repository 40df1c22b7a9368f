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

from specstudy.core import atomic, layout, methods
from specstudy.core.arms import K_METHODS, METHODS, arm_name
from specstudy.measure import cell, prom
from specstudy.study.phase_decl import CORE_PHASES

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
    registered = methods.find(tok) is not None and methods.get(tok).levels == (methods.K,)  # named <method>-k<k>
    name = arm_name({"method": tok, "num_speculative_tokens": k}) if registered else f"{tok}-k{k}"
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
    if not registered:
        spec["note"] = (f"method {method!r} is not one of this project's arm methods ({', '.join(methods.arm_methods())}); "
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


def convert_cell(cell_dir: str | Path, phase: str = "screen") -> tuple[list[dict], dict, dict]:
    """Return (our request rows, our summary, raw upstream bundle) for one upstream cell; ``phase`` is the
    phase key the summary carries (``screen``, or ``confirm`` for a confirmation set)."""
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


def cell_out_dir(results: str | Path, keys: dict) -> Path:
    """``<results>/<phase>/<arm>/rep<r>/<workload>/c<c>``: where ``specstudy tables`` reads a cell."""
    return Path(layout.cell_dir(keys["phase"], keys["arm"], keys["rep"], keys["workload"], keys["concurrency"],
                                root=results))


def _deployment_record_of(cell_out: Path) -> Path:
    """The deployment record beside an imported cell's folder (``<results>/<phase>/<arm>/rep<r>/deployment.json``)."""
    k = layout.parse("cell_dir", cell_out)
    return Path(layout.deployment_record(k["phase"], k["arm"], k["rep"], root=k["root"]))


def _refuse_other_deployment(out: Path, keys: dict, cell_dir: Path) -> None:
    if (out / layout.CELL_SUMMARY).is_file():
        prev = atomic.read_json(out / layout.CELL_SUMMARY)
        prev_dep = (prev.get("keys") or {}).get("deployment_id")
        if prev_dep != keys["deployment_id"]:
            raise UpstreamError(
                f"{out / layout.CELL_SUMMARY}: already holds deployment {prev_dep!r}, and {Path(cell_dir)} (deployment "
                f"{keys['deployment_id']!r}) maps to the same arm {keys['arm']!r}, repeat {keys['rep']}, workload and "
                "concurrency. Import the two sets into separate output roots (different drafters of one method and "
                "depth share an arm name), or remove the old cell")


def import_cell(cell_dir: str | Path, results: str | Path, phase: str = "screen") -> Path:
    """Write the converted cell to ``<results>/<phase>/<arm>/rep<r>/<workload>/c<c>/`` and return that path.

    The raw artifacts (``metrics_timeseries.jsonl``) are copied verbatim beside it. A path already holding
    a cell of another upstream deployment is an error (two blocks must never overwrite each other)."""
    rows, summary, up = convert_cell(cell_dir, phase)
    k = summary["keys"]
    out = cell_out_dir(results, k)
    _refuse_other_deployment(out, k, Path(cell_dir))
    atomic.write_jsonl(out / "requests.jsonl", rows)
    atomic.write_text(out / "metrics_before.prom", up["before"])
    atomic.write_text(out / "metrics_after.prom", up["after"])
    atomic.write_json(out / "upstream_metadata.json", up["metadata"])
    for name in summary["upstream"]["raw_artifacts"]:
        tmp = out / f".{name}.tmp"
        shutil.copyfile(Path(cell_dir) / name, tmp)
        tmp.replace(out / name)
    from specstudy.core.integrity import seal

    atomic.write_json(out / layout.CELL_SUMMARY, seal(summary))
    return out


# ------------------------------------------------------------------------------------ summary-only cells
# The 8B confirmation deployments: <prefix>-<variant>-confirm-c<block>-<stamp> (upstream's naming)
CONFIRM_DEPLOYMENT_RE = re.compile(r"^(?P<prefix>.+?)-(?P<variant>baseline|[A-Za-z0-9_]+-k[0-9]+)-confirm-"
                                   r"(?P<block>c[0-9]+)-(?P<stamp>[0-9]{8}T[0-9]{6}Z)$")
SUMMARY_DEFINITIONS = (
    "Same definitions as the project's: "
    "output tokens/s (completion tokens / upstream's wall, as the raw import uses), TTFT, stream-event gaps, "
    "acceptance counters (from upstream's /metrics deltas). Upstream's definitions: e2e (request start -> end of the "
    "stream incl. the usage chunk and [DONE]) and TPOT ((e2e - ttft)/(completion_tokens - 1) with that e2e); the "
    "project's end at the last content event. Not checked: per-request success (upstream counts a request with usage "
    "as successful), foreign traffic, counter decreases and restarts, load-generator limits")
SUMMARY_ONLY_NOTE = (
    "summary-only import: the cell's requests.jsonl and /metrics scrapes are not in the source, so nothing here "
    "was recomputed by this project; the figures are upstream's summary.json. " + SUMMARY_DEFINITIONS)
SUMMARY_NOT_RECOMPUTED = {
    "requests.successful": "upstream's count (success = usage present); the project's rule (finish reason stop/"
                           "length and HTTP 200) needs the rows",
    "latency_ms.e2e": "upstream's definition (to the end of the stream incl. the usage chunk and [DONE])",
    "latency_ms.tpot": "upstream's definition (with upstream's e2e)",
    "server_deltas": "null: the /metrics scrapes are not in the source",
    "tokens_per_event": "unavailable: upstream did not request continuous usage stats, and there are no rows",
    "fingerprint": "null: the cell spec's corpus digest (metadata.json workload_file_sha256) is not in the source",
    "requests.failures_by_cause": "not stated by upstream's summary",
}


# A raw confirmation cell met by a --from-summaries import of a set that also holds summary-only cells is read
# from its summary.json as well: one E2E/TPOT definition (upstream's) across every cell the comparison pairs.
RAW_READ_AS_SUMMARY_NOTE = (
    "summary-level import: this cell's requests.jsonl and /metrics scrapes ARE in the source but were not read, "
    "because --from-summaries met a set that also holds summary-only cells; a raw cell would carry the project's "
    "E2E/TPOT (to the last content event) beside its pairs' upstream definitions, a silent mix. Import it without "
    "--from-summaries to recompute it from the raw files; the figures are upstream's summary.json. ")
RAW_NOT_READ_SERVER_DELTAS = ("null: the /metrics scrapes are in the source but were not read (summary-level import "
                              "of a set that holds summary-only cells)")


def raw_confirm_cells(cells: list[Path]) -> list[Path]:
    """The complete raw cells among ``cells`` that sit in upstream's confirmation layout
    (``<deployment>/cells/<workload>/c<c>/``), i.e. the ones :func:`convert_summary` can also read."""
    out = []
    for d in cells:
        parts = Path(d).parts
        if (len(parts) >= 4 and parts[-3] == "cells" and re.fullmatch(r"c[0-9]+", Path(d).name)
                and all((Path(d) / f).is_file() for f in REQUIRED_FILES)):
            out.append(Path(d))
    return out


def parse_confirm_deployment(name: str) -> dict | None:
    """``{"variant", "block", "rep", "stamp"}`` of an upstream confirmation deployment name, else None."""
    m = CONFIRM_DEPLOYMENT_RE.match(name)
    if not m:
        return None
    return {"variant": m["variant"], "block": m["block"], "rep": _block_number(m["block"], Path(name)), "stamp": m["stamp"]}


def _is_summary_only_dir(d: Path) -> bool:
    return (d / "summary.json").is_file() and not any((d / f).is_file() for f in REQUIRED_FILES[:3])


def _summary_arm(cell_dir: Path, dep: str, meta: dict | None, arms: dict[str, str]) -> tuple[str, dict, str]:
    """Arm name, spec and where it came from, for a summary-only cell: the cell's metadata.json when present,
    else the variant label of the deployment name through ``arms`` (``--arm LABEL=ARM``; baseline implied)."""
    parsed = parse_confirm_deployment(dep)
    label = parsed["variant"] if parsed else None
    if meta is not None:
        name, spec = arm_of(meta["variant"], meta.get("extra"), str(cell_dir / "metadata.json"))
        given = {"baseline": "baseline", **arms}.get(label)
        if given is not None and given != name:
            raise UpstreamError(f"{cell_dir / 'metadata.json'}: field 'variant' maps to arm {name!r}, but --arm "
                                f"{label}={given} says {given!r}; fix the --arm mapping")
        return name, spec, f"metadata.json variant ({cell_dir / 'metadata.json'})"
    if label == "baseline":
        return "baseline", {"name": "baseline", "method": "baseline"}, f"deployment name {dep!r} (variant 'baseline')"
    if label is None or label not in arms:
        raise UpstreamError(f"{cell_dir}: summary-only cell without metadata.json, and its deployment {dep!r} has no "
                            f"arm: pass --arm {label or '<variant label>'}=<arm> (e.g. --arm eagle31-k2=eagle3-k2; "
                            f"known: {sorted(arms) or 'none'})")
    from specstudy.core.arms import parse_arm

    try:
        spec = parse_arm(arms[label])
    except ValueError as exc:
        raise UpstreamError(f"--arm {label}={arms[label]}: {exc}") from None
    return spec["name"], spec, f"--arm {label}={arms[label]} (deployment name {dep!r}; no metadata.json in this cell)"


def convert_summary(cell_dir: str | Path, phase: str = "confirm", arms: dict[str, str] | None = None) -> dict:
    """Our summary for an upstream confirmation cell of which only ``summary.json`` (and perhaps
    ``metadata.json``) is present: ``<deployment>/cells/<workload>/c<c>/``. Every figure is upstream's, with
    its definition named (:data:`SUMMARY_ONLY_NOTE`); what cannot be recomputed is null or listed in
    ``upstream.not_recomputed``. Validity applies the one rule a summary allows (success rate)."""
    d = Path(cell_dir)
    parts = d.parts
    if len(parts) < 4 or parts[-3] != "cells" or not re.fullmatch(r"c[0-9]+", d.name):
        raise UpstreamError(f"{d}: a summary-only cell must sit at <deployment>/cells/<workload>/c<concurrency>/ "
                            "(upstream's confirmation layout); other layouts need the raw files")
    dep = parts[-4]
    meta = atomic.read_json(d / "metadata.json") if (d / "metadata.json").is_file() else None
    arm, spec, arm_source = _summary_arm(d, dep, meta, arms or {})
    parsed = parse_confirm_deployment(dep)
    if meta is not None:
        rep = repeat_of(meta, d / "metadata.json")
        dep_id = _deployment_id(d, meta)
    elif parsed is not None:
        rep, dep_id = parsed["rep"], dep
    else:
        raise UpstreamError(f"{d}: deployment {dep!r} names no block (-confirm-c<N>-) and the cell has no metadata.json "
                            "with extra.block_id: the repeat is unknown")
    up = atomic.read_json(d / "summary.json")
    try:
        req, tok, lat = up["requests"], up["tokens"], up["latency_ms"]
        sd = up.get("speculative_decoding") or {}
        attempted, successful = int(req["attempted"]), int(req["successful"])
        rate = req["success_rate"]
        completion, prompt = int(tok["completion"]), int(tok["prompt"])
        otps = tok["output_tokens_per_second"]
        dists = {m: {k: lat[m][k] for k in ("count", "mean", "p50", "p95", "p99")}
                 for m in ("ttft", "tpot", "e2e", "stream_event_gap")}
    except (KeyError, TypeError, ValueError) as exc:
        raise UpstreamError(f"{d / 'summary.json'}: upstream summary lacks field {exc} (need requests, tokens, "
                            "latency_ms.{ttft,tpot,e2e,stream_event_gap}); re-copy it from the upstream run") from None
    reasons = []
    if rate is None or rate < cell.DEFAULT_THRESHOLDS["min_success_rate"]:
        reasons.append(cell._reason("low_success_rate", f"upstream: {successful}/{attempted} requests succeeded (success "
                                    f"= usage present); minimum success rate {cell.DEFAULT_THRESHOLDS['min_success_rate']}"))
    raw_present = [f for f in REQUIRED_FILES[:3] if (d / f).is_file()]
    note_text = RAW_READ_AS_SUMMARY_NOTE + SUMMARY_DEFINITIONS if raw_present else SUMMARY_ONLY_NOTE
    notes = [cell._note("summary_only", note_text)]
    speculative: dict = {"enabled": sd.get("enabled")}
    if sd.get("enabled"):
        speculative.update({k: sd[k] for k in ("drafts", "draft_tokens", "accepted_tokens", "acceptance_rate",
                                               "mean_acceptance_length") if sd.get(k) is not None})
        if sd.get("acceptance_rate_per_position") is not None:
            speculative["per_position"] = dict(sd["acceptance_rate_per_position"])
    if spec["method"] != "baseline" and not sd.get("enabled"):
        raise UpstreamError(f"{d / 'summary.json'}: field 'speculative_decoding.enabled' is not true, but the arm is "
                            f"{arm!r}: a speculative arm without speculation cannot be imported as valid")
    c = (meta or {}).get("cell") or {}
    keys = {"phase": phase, "arm": arm, "method": spec["method"], "num_speculative_tokens": spec.get("num_speculative_tokens"),
            "draft_tensor_parallel_size": spec.get("draft_tensor_parallel_size"), "rep": rep, "workload": parts[-2],
            "concurrency": int(d.name[1:]), "deployment_id": dep_id}
    if c and (c.get("workload") != keys["workload"] or int(c.get("concurrency", -1)) != keys["concurrency"]):
        raise UpstreamError(f"{d / 'metadata.json'}: field 'cell' names {c.get('workload')}/c{c.get('concurrency')}, the "
                            f"directory {keys['workload']}/c{keys['concurrency']}")
    summary = {
        "schema": cell.SCHEMA,
        "keys": cell._keys(keys),
        "fingerprint": None,
        "corpus": {"name": None, "version": "upstream",
                   "digest": f"sha256:{meta['workload_file_sha256']}" if meta and meta.get("workload_file_sha256") else None},
        "validity": cell._validity(reasons, wall_ok=bool(up.get("wall_seconds")), notes=notes),
        "requests": {"attempted": attempted, "successful": successful, "failed": int(req.get("failed", attempted - successful)),
                     "success_rate": rate, "missing_usage": 0, "requests_per_second": req.get("requests_per_second")},
        "tokens": {"prompt": prompt, "completion": completion, "output_tokens_per_second": otps},
        "wall_seconds": up.get("wall_seconds"),
        "wall_source": WALL_SOURCE,
        "percentile_method": "upstream's (its summary.json); the DSpark and 70B raw cells reproduce it with "
                             + cell.PERCENTILE_METHOD,
        "latency_ms": dists,
        "tokens_per_event": {"source": "unavailable", "count": 0, "histogram": {}, "mean": None,
                             "multi_token_events": 0, "completion_tokens_per_content_event": None},
        "speculative": speculative,
        "server_deltas": {"available": False, "reason": RAW_NOT_READ_SERVER_DELTAS if raw_present
                          else SUMMARY_NOT_RECOMPUTED["server_deltas"]},
        "loadgen": {"limited": None, "note": "upstream recorded no load-generator self-measurement"},
        "telemetry": None,
        "confounds": None,
        "warmup": {"attempted": c.get("warmup_requests"), "successful": None} if c else None,
        "times": {"started_at": (meta or {}).get("started_at"), "ended_at": (meta or {}).get("ended_at")},
        "upstream": {
            "cell_dir": str(d),
            "summary_only": True,
            "arm_source": arm_source,
            "arm_spec": spec,
            "block_id": ((meta or {}).get("extra") or {}).get("block_id") or (parsed or {}).get("block"),
            "definitions": note_text,
            "raw_files_not_read": raw_present,
            "not_recomputed": SUMMARY_NOT_RECOMPUTED,
            "variant": (meta or {}).get("variant"),
            "summary": up,
        },
    }
    cell.validate_summary(summary, d / "summary.json (converted)")
    return summary


def import_summary(cell_dir: str | Path, results: str | Path, phase: str = "confirm",
                   arms: dict[str, str] | None = None) -> Path:
    """Write a summary-only cell (:func:`convert_summary`) to ``<results>/<phase>/<arm>/rep<r>/<workload>/c<c>/``;
    upstream's metadata.json (when present) is kept as ``upstream_metadata.json``."""
    from specstudy.core.integrity import seal

    summary = convert_summary(cell_dir, phase, arms)
    out = cell_out_dir(results, summary["keys"])
    _refuse_other_deployment(out, summary["keys"], Path(cell_dir))
    if (Path(cell_dir) / "metadata.json").is_file():
        atomic.write_json(out / "upstream_metadata.json", atomic.read_json(Path(cell_dir) / "metadata.json"))
    atomic.write_json(out / layout.CELL_SUMMARY, seal(summary))
    return out


# ------------------------------------------------------------------------------------ provenance, deployments
SOURCE_REPO = "swiss-ai/apertus-speculative-decoding"
_MANIFEST_ROW = re.compile(r"^\| `([^`]+)` \| ([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+) \|(.*)$")


def read_manifest(path: Path) -> dict[str, dict]:
    """``{local path: {repo, commit, sha256}}`` of a data set's MANIFEST.md (the 70B and 8B sets' tables: the
    first backquoted 40-hex field is the commit, the first 64-hex one the sha256)."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _MANIFEST_ROW.match(line)
        if not m:
            continue
        commit = re.search(r"`([0-9a-f]{40})`", m[3])
        sha = re.search(r"`([0-9a-f]{64})`", m[3])
        if commit and sha:
            out[m[1]] = {"repo": m[2], "commit": commit[1], "sha256": sha[1]}
    return out


class Provenance:
    """Where each imported file came from: the MANIFEST.md of the data set above it (sha256 verified), else
    ``--source REPO@COMMIT``; a file known to neither has commit null, and the record says why."""

    def __init__(self, source: str | None = None):
        self.given = None
        if source:
            repo, sep, commit = source.partition("@")
            if not sep or not repo or not re.fullmatch(r"[0-9a-f]{7,40}", commit):
                raise UpstreamError(f"--source {source!r}: expected OWNER/REPO@COMMIT (a hex commit)")
            self.given = {"repo": repo, "commit": commit}
        self._manifests: dict[Path, dict] = {}

    def _manifest_for(self, f: Path) -> tuple[Path, dict] | None:
        for d in f.resolve().parents:
            m = d / "MANIFEST.md"
            if m.is_file():
                if m not in self._manifests:
                    self._manifests[m] = read_manifest(m)
                return m, self._manifests[m]
        return None

    def file(self, f: Path) -> dict:
        import hashlib

        sha = hashlib.sha256(f.read_bytes()).hexdigest()
        found = self._manifest_for(f)
        if found:
            mpath, rows = found
            entry = rows.get(str(f.resolve().relative_to(mpath.parent)))
            if entry:
                if entry["sha256"] != sha:
                    raise UpstreamError(f"{f}: sha256 {sha} differs from {mpath} ({entry['sha256']}): the file is not the "
                                        "one the manifest lists; re-copy it from the upstream repository")
                return {"path": str(f), "repo": entry["repo"], "commit": entry["commit"], "sha256": sha,
                        "commit_source": str(mpath)}
        if self.given:
            return {"path": str(f), **self.given, "sha256": sha, "commit_source": "--source"}
        return {"path": str(f), "repo": SOURCE_REPO, "commit": None, "sha256": sha,
                "commit_source": "unknown: no MANIFEST.md entry above the file and no --source REPO@COMMIT"}


def _imported_from(files: list[dict]) -> str:
    origins = sorted({f"{f['repo']}@{f['commit'] or 'unknown-commit'}" for f in files})
    return "imported from upstream " + ", ".join(origins)


NOT_MEASURED_DEPLOYMENT = {
    "command": "null: upstream's cell files do not record the vLLM command line",
    "times": "null: upstream's cell files record each cell's window (in the cell summaries), not the deployment's "
             "launch, ready and stop times",
    "startup": "null: no launch log in the source",
    "confounds": "null: no launch log in the source (the project's confounds are parsed from it)",
    "smoke.captures": "empty: the project's smoke captures are not part of upstream's runs",
}


def deployment_record(cells: list[dict], prov: Provenance, report: tuple[Path, dict] | None = None) -> dict:
    """The ``deployment.json`` of one imported deployment from its imported cells (``{"out", "summary", "src",
    "arm_spec"}``): what the source states, provenance naming where each part came from, and every field the
    source does not carry null with the reason (:data:`NOT_MEASURED_DEPLOYMENT`). Never a measurement of ours."""
    first = cells[0]
    k = first["summary"]["keys"]
    deps = sorted({c["summary"]["keys"]["deployment_id"] for c in cells})
    if len(deps) > 1:
        raise UpstreamError(f"{first['out'].parent.parent}: cells of deployments {deps} map to one deployment directory "
                            f"({k['arm']} rep {k['rep']}); import them into separate output roots")
    files, not_measured = [], dict(NOT_MEASURED_DEPLOYMENT)
    # a cell read from its summary.json (summary-level import) uses no raw file, even where the source holds them
    read = {id(c): ("summary.json", "metadata.json") if c["summary"]["upstream"].get("summary_only")
            else (*REQUIRED_FILES, *RAW_ARTIFACTS) for c in cells}
    for c in cells:
        for name in read[id(c)]:
            if (c["src"] / name).is_file():
                files.append(prov.file(c["src"] / name))
    meta = next((atomic.read_json(c["src"] / "metadata.json") for c in cells if (c["src"] / "metadata.json").is_file()), None)
    extra = (meta or {}).get("extra") or {}
    cache_config, cache_source = None, None
    raw = next((c for c in cells if "metrics_before.prom" in read[id(c)] and (c["src"] / "metrics_before.prom").is_file()),
               None)
    if raw is not None:
        cache_config = prom.kv_cache_config((raw["src"] / "metrics_before.prom").read_text(encoding="utf-8"))
        cache_source = f"vllm:cache_config_info of upstream's scrape {raw['src'] / 'metrics_before.prom'}"
    up_report = None
    if cache_config is None and report is not None:
        rpath, rdata = report
        entry = (rdata.get("deployments") or {}).get(deps[0])
        if entry is not None:
            up_report = {"path": str(rpath), "entry": entry, **{k2: v for k2, v in prov.file(rpath).items() if k2 != "path"}}
            if entry.get("kv_cache_tokens") is not None:
                cache_config = {"num_gpu_blocks": None, "block_size": None, "kv_cache_tokens": int(entry["kv_cache_tokens"])}
                cache_source = (f"upstream's stated figure: {rpath} deployments[{deps[0]!r}].kv_cache_tokens "
                                "(num_gpu_blocks and block_size not stated)")
    if cache_config is None:
        not_measured["cache_config"] = "null: no /metrics scrape in the source and no --report entry for this deployment"
    tp_target = extra.get("target_tensor_parallel_size")
    tp = None
    if tp_target is not None:
        tp = {"target": int(tp_target), "draft": first["arm_spec"].get("draft_tensor_parallel_size")}
    else:
        not_measured["tensor_parallel_size"] = "null: no metadata.json with extra.target_tensor_parallel_size in the source"
    dep_id = re.sub(r"[^A-Za-z0-9._-]+", "_", deps[0])
    return {
        "schema": "specstudy.deployment/1",
        "deployment_id": dep_id,
        "phase": k["phase"],
        "arm": first["arm_spec"],
        "rep": k["rep"],
        "rep_label": layout.rep_label(k["rep"]),
        "kind": "repeat",
        "status": "ok",
        "failure": None,
        "command": None,
        "provenance": {
            "imported_from": _imported_from(files),
            "importer": "specstudy import-upstream",
            "upstream_deployment_id": deps[0],
            "status_source": "every cell of this deployment is present in the source"
                             + (f"; upstream's report states {up_report['entry'].get('status')}" if up_report else ""),
            "model": (meta or {}).get("model"),
            "target_model": extra.get("target_model"),
            "harness_git_revision": (meta or {}).get("harness_git_revision"),
            "cache_config_source": cache_source,
            "upstream_report": up_report,
            "summary_only": all(c["summary"]["upstream"].get("summary_only") for c in cells),
            "files": files,
            "fields_not_measured": not_measured,
        },
        "confounds": None,
        "cache_config": cache_config,
        "smoke": {"captures": []},
        "cells": [{"workload": c["summary"]["keys"]["workload"], "concurrency": c["summary"]["keys"]["concurrency"],
                   "summary": str(Path(layout.cell_rel(c["summary"]["keys"]["workload"],
                                                       c["summary"]["keys"]["concurrency"])) / layout.CELL_SUMMARY),
                   "status": "ok" if c["summary"]["validity"]["valid"] else "invalid", "deployment_id": dep_id}
                  for c in sorted(cells, key=lambda c: (c["summary"]["keys"]["workload"], c["summary"]["keys"]["concurrency"]))],
        "times": {"start": None, "ready": None, "stop": None},
        "startup": None,
        "tensor_parallel_size": tp,
    }


def write_deployments(imported: list[dict], prov: Provenance, report: tuple[Path, dict] | None = None) -> list[Path]:
    """One ``<results>/<phase>/<arm>/rep<r>/deployment.json`` per deployment directory of ``imported``; the
    deployment's cells already there from an earlier import (same deployment) are kept in its cell list."""
    from specstudy.core import schemas

    by_record: dict[Path, list[dict]] = {}
    for c in imported:
        by_record.setdefault(_deployment_record_of(c["out"]), []).append(c)
    written = []
    for path, cells in sorted(by_record.items()):
        rec = deployment_record(cells, prov, report)
        if path.is_file():
            prev = atomic.read_json(path)
            if prev.get("deployment_id") != rec["deployment_id"]:
                raise UpstreamError(f"{path}: already records deployment {prev.get('deployment_id')!r}, not "
                                    f"{rec['deployment_id']!r}; import into a separate output root")
            have = {(c["workload"], c["concurrency"]) for c in rec["cells"]}
            rec["cells"] = sorted([c for c in prev.get("cells", []) if (c["workload"], c["concurrency"]) not in have]
                                  + rec["cells"], key=lambda c: (c["workload"], c["concurrency"]))
            rec["provenance"]["files"] = sorted(
                {f["path"]: f for f in (prev.get("provenance") or {}).get("files", []) + rec["provenance"]["files"]}.values(),
                key=lambda f: f["path"])
            rec["provenance"]["imported_from"] = _imported_from(rec["provenance"]["files"])
        if rec["arm"].get("method") in ("baseline", "draft_model", *K_METHODS):
            schemas.validate(rec, "deployment", str(path))
        atomic.write_json(path, rec)
        written.append(path)
    return written


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


def _parse_arms(pairs: list[str]) -> dict[str, str]:
    arms = {}
    for x in pairs or []:
        label, sep, arm = x.partition("=")
        if not sep or not label or not arm:
            raise UpstreamError(f"--arm {x!r}: expected LABEL=ARM, e.g. eagle31-k2=eagle3-k2")
        arms[label] = arm
    return arms


def _console_line(s: dict) -> str:
    sp, keys = s["speculative"], s["keys"]
    if s["upstream"].get("summary_only"):  # every figure upstream's: latencies in the "up" columns
        w = {"output_tokens_per_second_upstream_wall": s["tokens"]["output_tokens_per_second"],
             "output_tokens_per_second_from_rows": None}
        ours = {"e2e": None, "tpot": None}
        ud = {m: s["latency_ms"][m]["p50"] for m in ("e2e", "tpot")}
    else:
        w = s["upstream"]["wall"]
        ours = {m: s["latency_ms"][m]["p50"] for m in ("e2e", "tpot")}
        ud = {m: s["upstream"]["latency_ms_upstream_definition"][m]["p50"] for m in ("e2e", "tpot")}
    return (f"{keys['arm']:<14} {keys['rep']:<3} {keys['workload']:<10} {keys['concurrency']:<3} "
            f"{validity_label(s['validity']):<8} {_fmt(sp.get('acceptance_rate'), '.3f'):<6} "
            f"{_fmt(sp.get('mean_acceptance_length'), '.3f'):<6} "
            f"{_fmt(w['output_tokens_per_second_upstream_wall'], '.1f'):>8} "
            f"{_fmt(w['output_tokens_per_second_from_rows'], '.1f'):>8} {_fmt(s['latency_ms']['ttft']['p50'], '.1f'):>8} "
            f"{_fmt(ours['e2e'], '.1f'):>8} {_fmt(ud['e2e'], '.1f'):>8} "
            f"{_fmt(ours['tpot'], '.2f'):>7} {_fmt(ud['tpot'], '.2f'):>7}")


def cmd_import(args: argparse.Namespace) -> int:
    """Import every complete cell under ``source`` (and, with ``--from-summaries``, every confirmation cell of
    which only upstream's summary.json is present); list the incomplete ones with their missing files; write
    one deployment.json per imported deployment. Exit 2 when nothing could be imported, when a cell is
    malformed, or (``--strict``) when any cell is incomplete; else 0."""
    from_summaries = getattr(args, "from_summaries", False)
    try:
        arms = _parse_arms(getattr(args, "arm", None))
        prov = Provenance(getattr(args, "source_commit", None))
        report = None
        if getattr(args, "report", None):
            report = (Path(args.report), atomic.read_json(args.report))
    except (UpstreamError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cells = find_cells(args.source)
    if from_summaries:
        root = Path(args.source)
        extra = [d for d in ([root] if root.is_dir() else []) + sorted(p.parent for p in root.rglob("summary.json"))
                 if _is_summary_only_dir(d)]
        cells = sorted(set(cells) | set(extra))
    # a summary-level import of a set that also holds raw confirmation cells reads those from summary.json too,
    # so that no comparison pairs the project's E2E/TPOT with upstream's (RAW_READ_AS_SUMMARY_NOTE)
    as_summary = set(raw_confirm_cells(cells)) if from_summaries and extra else set()
    if not cells:
        print(f"error: {args.source}: no upstream cell found (a cell directory contains {list(REQUIRED_FILES)}"
              + ("" if from_summaries else "; a confirmation set of summary.json files only needs --from-summaries")
              + ")", file=sys.stderr)
        return 2
    head = (f"{'arm':<14} {'rep':<3} {'workload':<10} {'c':<3} {'validity':<8} {'acc':<6} {'mal':<6} {'tok/s':>8} {'tok/s':>8} "
            f"{'ttft50':>8} {'e2e50':>8} {'e2e50':>8} {'tpot50':>7} {'tpot50':>7}")
    sub = (f"{'':<14} {'':<3} {'':<10} {'':<3} {'':<8} {'':<6} {'':<6} {'up wall':>8} {'rows':>8} {'':>8} {'ours':>8} "
           f"{'up':>8} {'ours':>7} {'up':>7}")
    imported, incomplete, errors, written = [], [], [], []
    for d in cells:
        summary_only = from_summaries and (_is_summary_only_dir(d) or d in as_summary)
        try:
            if summary_only:
                if args.out:
                    out = import_summary(d, args.out, args.phase, arms)
                    s = atomic.read_json(out / layout.CELL_SUMMARY)
                else:
                    out, s = None, convert_summary(d, args.phase, arms)
                arm_spec = s["upstream"]["arm_spec"]
            else:
                if args.out:
                    out = import_cell(d, args.out, args.phase)
                    s = atomic.read_json(out / layout.CELL_SUMMARY)
                else:
                    out, s = None, convert_cell(d, args.phase)[1]
                meta = atomic.read_json(d / "metadata.json")
                arm_spec = arm_of(meta["variant"], meta.get("extra"), str(d / "metadata.json"))[1]
        except IncompleteCell as exc:
            incomplete.append(exc)
            continue
        except (UpstreamError, ValueError, OSError) as exc:
            errors.append(f"{d}: {exc}" if str(d) not in str(exc) else str(exc))
            continue
        if not imported:
            print(head)
            print(sub)
        imported.append({"src": d, "out": out, "summary": s, "arm_spec": arm_spec})
        print(_console_line(s) + (f"  -> {out}" if out else ""))
    if args.out and imported:
        try:
            written = write_deployments(imported, prov, report)
        except (UpstreamError, ValueError, OSError) as exc:
            errors.append(f"deployment records: {exc}")
    if imported:
        print("tok/s: output tokens/s with upstream's wall (summary.json wall_seconds) | with the wall from the rows "
              "(sum of e2e / concurrency; a lower bound of the wall for c > 1).\n"
              "e2e/tpot p50 (ms): ours end at the last content event | upstream's end after the usage chunk and [DONE] "
              "(upstream's tables use the latter); a summary-only cell has upstream's only.\n"
              "validity: valid | lat-only (latencies valid; throughput and TPOT not: validity.throughput_valid "
              "false, e.g. a request without usage) | invalid (see the summary's validity.reasons).")
    for p in written:
        print(f"deployment record: {p}")
    from specstudy.core.arms import is_arm_name

    for arm in sorted({c["summary"]["keys"]["arm"] for c in imported if not is_arm_name(c["summary"]["keys"]["arm"])}):
        print(f"note: arm {arm!r} is not one of this project's arms (methods {', '.join(METHODS)}): its cells and "
              "deployment records are written, but `specstudy tables` reads only the project's arms and leaves "
              f"{arm}/ out of the tables", file=sys.stderr)
    for d in sorted(as_summary):
        print(f"note: {d}: its raw files are in the source but this --from-summaries import read it from summary.json "
              "(upstream's E2E/TPOT, as its summary-only pairs); import it without --from-summaries to recompute it "
              "from the raw files", file=sys.stderr)
    for exc in incomplete:
        print(f"incomplete: {exc.cell_dir}: missing {', '.join(exc.missing)}", file=sys.stderr)
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    n_sum = sum(1 for c in imported if c["summary"]["upstream"].get("summary_only"))
    print(f"{len(imported)} cell(s) {'imported' if args.out else 'read'}"
          + (f" ({n_sum} from upstream's summary.json only)" if n_sum else "")
          + f", {len(incomplete)} incomplete, {len(errors)} with errors"
          + (f", {len(written)} deployment record(s)" if written else ""), file=sys.stderr)
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
                   help="results root: cells go to <out>/<phase>/<arm>/rep<r>/<workload>/c<c>/ with one "
                   "deployment.json per deployment, where `specstudy tables --results <out>` reads them "
                   "(omit to only report)")
    p.add_argument("--strict", action="store_true", help="exit 2 when any cell is incomplete")
    p.add_argument("--phase", default="screen", choices=CORE_PHASES,
                   help="phase the cells are imported as (default screen; confirm for a confirmation set)")
    p.add_argument("--from-summaries", action="store_true",
                   help="also import confirmation cells (<deployment>/cells/<workload>/c<c>/) of which only "
                   "upstream's summary.json is present: every figure upstream's, definitions named, what cannot be "
                   "recomputed null (docs/upstream-8b.md)")
    p.add_argument("--arm", action="append", default=[], metavar="LABEL=ARM",
                   help="arm of a summary-only deployment without metadata.json, by the variant label of its name, "
                   "e.g. eagle31-k2=eagle3-k2 (baseline implied)")
    p.add_argument("--report", help="upstream's confirm-report.json: its per-deployment KV-cache tokens go into the "
                   "deployment records of summary-only deployments (named as upstream's figure)")
    p.add_argument("--source", dest="source_commit", metavar="REPO@COMMIT",
                   help="provenance of files that no MANIFEST.md above them lists")
    p.set_defaults(func=cmd_import)
