"""The ignore_eos phase (issue #20 item 2): fixed output lengths beside natural EOS.

Every request of the phase is sent with ``ignore_eos: true`` and ``max_tokens`` = the declared
``output_tokens``, so every successful request generates exactly that many tokens whatever the arm.
That removes one thing a natural-EOS comparison cannot hold fixed: how long each arm's answers are
(a speculative arm is lossless under greedy decoding, but a run can still end at a different length
on numerics, and throughput depends on length). What remains is the serving mechanics: drafting,
verification, batching and KV traffic at a known length.

The results are MECHANICS, never a study result, and never pooled with the natural-EOS (confirmation)
results: both are analysed here side by side, each within its own phase, with the same functions the
decision rule uses (:func:`specstudy.inference.stats.comparisons` pairs an arm's deployment with the baseline
deployment of the same repeat; :func:`specstudy.inference.decision.judge` gives the geometric-mean speedup, its
Student-t interval and the verdict), and the report shows where the two disagree.

Per cell summary (schema ``cell-summary``, ``keys.phase == "ignore_eos"``) the fixed length is checked
from the summary's own figures: the completion tokens of the successful requests that carried usage
must equal ``(successful - missing_usage) * output_tokens``, and the server's finished-request counter
(``server_deltas.requests_finished_by_reason``) must show no request that ended on ``stop``. A cell that
fails the check is flagged and left out of the fixed-length comparison with reason code
``fixed_length_not_honoured`` (listed, never dropped silently), like a cell whose own validity rejects it.

Rule: ``confirmation.decision`` of the pre-registration (``min_gain``, ``max_regression``,
``confidence``). The phase is a fixed design with one look, so intervals are at ``confidence`` with no
correction for repeated looks, for fixed lengths and natural EOS alike (the confirmation checkpoint's own
verdicts may use a Bonferroni-corrected confidence: docs/ignore-eos.md).

Registered as the ``ignore_eos`` phase (:mod:`specstudy.phases.registry`; its design in
:mod:`specstudy.study.phase_decl`). CLI: ``specstudy phase summary ignore_eos``. Public: :func:`summarize`,
:func:`check_fixed_length`. Imports ``core``, ``inference``, ``analysis.tables``, ``study`` and the registry.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from specstudy.core import layout
from specstudy.core.errors import UserError
from specstudy.core.stat_util import median
from specstudy.phases.registry import Phase, register_phase
from specstudy.study.phase_decl import DECLS

PHASE = "ignore_eos"
NATURAL_PHASE = "confirm"
LABEL = DECLS[PHASE].label
SCHEMA = "specstudy.ignore-eos/1"
NOT_HONOURED = "fixed_length_not_honoured"
ONE_DEPLOYMENT = "one deployment: no interval"
SOURCES = {"fixed_length": PHASE, "natural_eos": NATURAL_PHASE}

class IgnoreEosInputError(UserError):
    """Bad input to the ignore_eos analysis; the message names the file, the field and the fix."""


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
def _rule(decision: dict, source: str) -> dict:
    """The rule :func:`specstudy.inference.decision.judge` reads, from the pre-registration's ``confirmation.decision``."""
    from specstudy.inference import decision as dec

    if not isinstance(decision, dict):
        raise IgnoreEosInputError(f"{source}: field 'confirmation.decision' is {type(decision).__name__}, not a "
                                  "mapping; declare e.g. decision: {min_gain: 0.05, max_regression: 0.02, "
                                  "confidence: 0.95}")
    out: dict[str, Any] = {}
    for key, default in (("min_gain", None), ("max_regression", None), ("confidence", 0.95)):
        v = decision.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise IgnoreEosInputError(f"{source}: field 'confirmation.decision.{key}' is {v!r}; it must be a number "
                                      f"(e.g. min_gain: 0.05, max_regression: 0.02, confidence: 0.95)")
        out[key] = float(v)
    if out["min_gain"] < 0 or not 0 <= out["max_regression"] < 1:
        raise IgnoreEosInputError(f"{source}: fields 'confirmation.decision.min_gain' ({out['min_gain']}) and "
                                  f"'max_regression' ({out['max_regression']}) must be fractions >= 0 (max_regression "
                                  "< 1)")
    if not 0 < out["confidence"] < 1:
        raise IgnoreEosInputError(f"{source}: field 'confirmation.decision.confidence' is {out['confidence']}; it must "
                                  "lie strictly between 0 and 1 (e.g. 0.95)")
    # a fixed design with one look: no correction for repeated looks
    rule = dict(out, correction="none", initial_repeats=None, max_repeats=None,
                source=f"{source} confirmation.decision (one look, no correction)")
    rule["looks"] = dec.looks(rule)
    rule["look_confidence"] = dec.look_confidence(rule)
    return rule


def check_fixed_length(summary, output_tokens: int) -> dict:
    """Whether a cell's successful requests all produced ``output_tokens`` completion tokens (from its summary).

    ``summary`` is a :class:`specstudy.core.records.CellSummary`. ``honoured`` is None when no successful
    request carried usage (nothing to check)."""
    req, tok = summary.requests, summary.tokens
    counted = req.successful - req.missing_usage
    expected = counted * output_tokens
    finished = (summary.server_deltas or {}).get("requests_finished_by_reason")
    finished = finished if isinstance(finished, dict) else {}
    stop = finished.get("stop")
    length = finished.get("length")
    problems = []
    if counted > 0 and tok.completion != expected:
        problems.append(f"tokens.completion is {tok.completion}, expected {expected} = {counted} successful requests "
                        f"with usage x {output_tokens} (mean {tok.completion / counted:.2f} per request)")
    if stop:
        problems.append(f"server_deltas.requests_finished_by_reason.stop is {stop:g}: requests ended on EOS/stop, "
                        "not at max_tokens (was ignore_eos sent?)")
    honoured = None if counted <= 0 and not stop else not problems
    return {"output_tokens": output_tokens, "requests_with_usage": counted, "expected_completion_tokens": expected,
            "completion_tokens": tok.completion,
            "mean_completion_tokens": tok.completion / counted if counted > 0 else None,
            "finished_stop": stop, "finished_length": length,
            "server_check": "done" if finished else "not made: no server_deltas.requests_finished_by_reason",
            "honoured": honoured, "problems": problems}


def _read(paths: list, phase: str, source: str, output_tokens: int | None) -> list[dict]:
    """Analysis rows (:func:`specstudy.analysis.tables.cell_row`) of one source's cell summaries, checked."""
    from specstudy.analysis import tables
    from specstudy.core import records

    rows, seen = [], {}
    for p in paths:
        p = Path(p)
        summary = records.read_cell_summary(p)
        k = summary.keys
        if k.phase != phase:
            want = "results/ignore_eos/..." if phase == PHASE else "results/confirm/..."
            raise IgnoreEosInputError(f"{p}: field '$.keys.phase' is {k.phase!r}, expected {phase!r} for the "
                                      f"{source.replace('_', ' ')} cells; pass summaries from {want}")
        m = layout.parse("cell", p) if layout.matches("cell", p) else None
        label = k.rep_label or layout.rep_label(k.rep)
        if m and (m["arm"], m["rep"], m["workload"], m["concurrency"]) != (k.arm, label, k.workload, k.concurrency):
            raise IgnoreEosInputError(
                f"{p}: fields '$.keys' (arm {k.arm}, rep {label}, workload {k.workload}, concurrency "
                f"{k.concurrency}) do not match the path ({m['arm']}/{m['rep']}/{layout.cell_rel(m['workload'], m['concurrency'])}); the "
                "summary was copied to the wrong place: rerun the cell (specstudy rerun <path>)")
        key = (k.arm, label, k.workload, k.concurrency)
        if key in seen:
            raise IgnoreEosInputError(f"{p}: the same cell ({'/'.join(map(str, key))}) as {seen[key]}; pass each "
                                      "cell summary once")
        seen[key] = p
        row = tables.cell_row(summary, str(p))
        row.update(source=source, path=str(p), own_valid=row["valid"], own_invalid_reasons=row["invalid_reasons"])
        row["fixed_length"] = check_fixed_length(summary, output_tokens) if output_tokens is not None else None
        if row["fixed_length"] is not None and row["fixed_length"]["honoured"] is False:
            codes = sorted({*filter(None, row["invalid_reasons"].split(",")), NOT_HONOURED})
            details = json.loads(row["invalid_details"]) if row["invalid_details"] else []
            details.append({"code": NOT_HONOURED, "detail": "; ".join(row["fixed_length"]["problems"])})
            row.update(valid=False, invalid_reasons=",".join(codes),
                       invalid_details=json.dumps(details, sort_keys=True))
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------
def zone(speedup: float | None, rule: dict) -> str | None:
    """Where a point speedup lies against the thresholds: ``above_gain`` (> 1 + min_gain), ``below_regression``
    (< 1 - max_regression) or ``between``; the same strict inequalities as :func:`specstudy.inference.decision.verdict`."""
    if speedup is None:
        return None
    if speedup > 1 + rule["min_gain"]:
        return "above_gain"
    if speedup < 1 - rule["max_regression"]:
        return "below_regression"
    return "between"


def _group_medians(rows: list[dict]) -> dict[tuple, dict]:
    """Per (arm, workload, concurrency): medians over the valid repeat cells (drift baselines are not used)."""
    from specstudy.inference.stats import _ok

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("kind") == "drift" or not r["valid"]:
            continue
        groups.setdefault((r["arm"], r["workload"], r["concurrency"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        thr = [r for r in rs if _ok(r, "throughput")]
        out[key] = {"n_cells": len(rs),
                    "output_tokens_per_second": median((r["output_tokens_per_second"] for r in thr), finite=True),
                    "tpot_p50_ms": median((r["tpot_p50_ms"] for r in thr), finite=True),
                    "acceptance_rate": median((r["acceptance_rate"] for r in rs), finite=True),
                    "mean_acceptance_length": median((r["mean_acceptance_length"] for r in rs), finite=True)}
    return out


def _analyse(rows: list[dict], rule: dict) -> dict[tuple, dict]:
    """Per (arm, workload, concurrency) of one source: speedup, interval and verdict (stats + decision)."""
    from specstudy.inference import decision, stats

    config = {"analysis": {"confidence": rule["look_confidence"]}}
    comps = {(c["arm"], c["workload"], c["concurrency"]): c for c in stats.comparisons(rows, config)}
    med = _group_medians(rows)
    base = {(w, c): m for (a, w, c), m in med.items() if a == "baseline"}
    keys = sorted({(r["arm"], r["workload"], r["concurrency"]) for r in rows if r.get("kind") != "drift"},
                  key=lambda k: (k[0] != "baseline", k[0], k[1], k[2]))
    out = {}
    for key in keys:
        arm, w, c = key
        m = med.get(key) or {"n_cells": 0}
        b = base.get((w, c)) or {}
        entry: dict[str, Any] = {
            "arm": arm, "workload": w, "concurrency": c, "n_valid_cells": m["n_cells"],
            "output_tokens_per_second_median": m.get("output_tokens_per_second"),
            "tpot_p50_ms_median": m.get("tpot_p50_ms"),
            "baseline_output_tokens_per_second_median": b.get("output_tokens_per_second"),
            "baseline_tpot_p50_ms_median": b.get("tpot_p50_ms"),
            "acceptance_rate_median": m.get("acceptance_rate"),
            "mean_acceptance_length_median": m.get("mean_acceptance_length")}
        if arm == "baseline":
            entry.update(reference=True, speedup=None, lo=None, hi=None, n=None, verdict=None, zone=None,
                         note="the reference (speedup 1 by definition)")
        else:
            comp = comps.get(key)
            vals = [r["speedup"] for r in comp["repeats"]] if comp else []
            j = decision.judge(vals, rule)
            entry.update(reference=False, speedup=j["geomean"], lo=j["lo"], hi=j["hi"], n=j["n"],
                         confidence=j["confidence"], verdict=j["verdict"], values=j["values"],
                         zone=zone(j["geomean"], rule),
                         excluded_repeats=comp["excluded"] if comp else [],
                         note=(ONE_DEPLOYMENT if j["n"] == 1 else
                               "no valid paired deployment" if j["n"] == 0 else ""))
        out[key] = entry
    return out


def _disagreements(fixed: dict, natural: dict, rule: dict) -> tuple[list[dict], list[dict]]:
    """Cells where the verdicts differ (both with an interval) or, when either lacks one, where the point
    speedups lie on different sides of the thresholds; and the cells that could not be compared."""
    out, not_compared = [], []
    for key, f in fixed.items():
        if f["reference"]:
            continue
        n = natural.get(key)
        arm, w, c = key
        both = {"fixed_length": _fig(f), "natural_eos": _fig(n) if n else None}
        if n is None or f["speedup"] is None or n["speedup"] is None:
            why = ("no natural-EOS cell of this arm, workload and concurrency" if n is None else
                   "no speedup for " + " and ".join(s for s, e in (("fixed lengths", f), ("natural EOS", n))
                                                     if e["speedup"] is None))
            not_compared.append({"arm": arm, "workload": w, "concurrency": c, "why": why, **both})
            continue
        with_interval = f["verdict"] != "missing" and n["verdict"] != "missing"
        if with_interval:
            if f["verdict"] != n["verdict"]:
                out.append({"arm": arm, "workload": w, "concurrency": c, "basis": "verdicts", **both})
        elif f["zone"] != n["zone"]:
            out.append({"arm": arm, "workload": w, "concurrency": c,
                        "basis": "point speedups vs thresholds (at least one side has no interval)", **both})
    return out, not_compared


def _fig(e: dict) -> dict:
    return {k: e.get(k) for k in ("speedup", "lo", "hi", "n", "verdict", "zone", "note")}


# ---------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------
_PARQUET_COLUMNS = [
    ("source", "string"), ("phase", "string"), ("arm", "string"), ("method", "string"), ("rep", "int64"),
    ("rep_label", "string"), ("kind", "string"), ("workload", "string"), ("concurrency", "int64"),
    ("deployment_id", "string"), ("path", "string"), ("label", "string"),
    ("valid", "bool"), ("invalid_reasons", "string"), ("own_valid", "bool"), ("own_invalid_reasons", "string"),
    ("used", "bool"), ("requests_attempted", "int64"), ("requests_successful", "int64"), ("missing_usage", "int64"),
    ("completion_tokens", "int64"), ("output_tokens", "int64"), ("expected_completion_tokens", "int64"),
    ("finished_stop", "double"), ("finished_length", "double"), ("fixed_length_honoured", "bool"),
    ("fixed_length_problems", "string"), ("output_tokens_per_second", "double"), ("tpot_p50_ms", "double"),
    ("ttft_p50_ms", "double"), ("acceptance_rate", "double"), ("mean_acceptance_length", "double"),
    ("draft_tokens", "double"), ("accepted_tokens", "double"),
]


def _parquet_row(r: dict) -> dict:
    fl = r["fixed_length"] or {}
    return {"source": r["source"], "phase": r["phase"], "arm": r["arm"], "method": r.get("method"), "rep": r["rep"],
            "rep_label": r.get("rep_label"), "kind": r.get("kind"), "workload": r["workload"],
            "concurrency": r["concurrency"], "deployment_id": r.get("deployment_id"), "path": r["path"],
            "label": LABEL, "valid": r["valid"], "invalid_reasons": r["invalid_reasons"], "own_valid": r["own_valid"],
            "own_invalid_reasons": r["own_invalid_reasons"], "used": bool(r["valid"]) and r.get("kind") != "drift",
            "requests_attempted": r["requests_attempted"], "requests_successful": r["requests_successful"],
            "missing_usage": r["missing_usage"], "completion_tokens": r["completion_tokens"],
            "output_tokens": fl.get("output_tokens"), "expected_completion_tokens": fl.get("expected_completion_tokens"),
            "finished_stop": fl.get("finished_stop"), "finished_length": fl.get("finished_length"),
            "fixed_length_honoured": fl.get("honoured"), "fixed_length_problems": "; ".join(fl.get("problems") or []),
            "output_tokens_per_second": r["output_tokens_per_second"], "tpot_p50_ms": r["tpot_p50_ms"],
            "ttft_p50_ms": r["ttft_p50_ms"], "acceptance_rate": r["acceptance_rate"],
            "mean_acceptance_length": r["mean_acceptance_length"], "draft_tokens": r["draft_tokens"],
            "accepted_tokens": r["accepted_tokens"]}


def _parquet_bytes(rows: list[dict]) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"string": pa.string(), "int64": pa.int64(), "bool": pa.bool_(), "double": pa.float64()}
    schema = pa.schema([(n, types[t]) for n, t in _PARQUET_COLUMNS])
    tbl = pa.Table.from_pylist([_parquet_row(r) for r in rows], schema=schema)
    buf = io.BytesIO()
    pq.write_table(tbl, buf)
    return buf.getvalue()


def _f(v, fmt="{:.3f}") -> str:
    return "—" if v is None else fmt.format(v)


def _speedup_text(e: dict) -> str:
    if e is None:
        return "—"
    if e.get("reference"):
        return "1 (reference)"
    if e["speedup"] is None:
        return "— (no valid paired deployment)"
    if e["lo"] is None:
        return f"{e['speedup']:.3f} ({e['note'] or 'no interval'})"
    return f"{e['speedup']:.3f} [{e['lo']:.3f}, {e['hi']:.3f}]"


def _verdict_text(e: dict) -> str:
    if e is None or e.get("reference"):
        return "—"
    if e["verdict"] == "missing":
        return f"none ({e['note']})" if e["note"] else "none"
    return e["verdict"]


def _table(title: str, entries: dict) -> list[str]:
    lines = [f"**{LABEL}** — {title}", "",
             "| arm | workload | c | n | speedup [interval] | verdict | tok/s (arm / base) | TPOT p50 ms (arm / base) "
             "| acceptance rate | mean acceptance length |",
             "|---|---|---:|---:|---|---|---|---|---:|---:|"]
    for e in entries.values():
        lines.append(
            f"| {e['arm']} | {e['workload']} | {e['concurrency']} | {e['n'] if e['n'] is not None else e['n_valid_cells']} "
            f"| {_speedup_text(e)} | {_verdict_text(e)} "
            f"| {_f(e['output_tokens_per_second_median'], '{:.1f}')} / "
            f"{_f(e['baseline_output_tokens_per_second_median'], '{:.1f}')} "
            f"| {_f(e['tpot_p50_ms_median'], '{:.2f}')} / {_f(e['baseline_tpot_p50_ms_median'], '{:.2f}')} "
            f"| {_f(e['acceptance_rate_median'])} | {_f(e['mean_acceptance_length_median'])} |")
    return [*lines, ""]


def _fig_text(f: dict | None) -> str:
    if not f:
        return "—"
    return f"{_speedup_text(dict(f, reference=False))}; {_verdict_text(dict(f, reference=False))}; {f['zone'] or '—'}"


def section_markdown(result: dict) -> str:
    """The report section (Markdown)."""
    rule = result["rule"]
    g, d = rule["min_gain"], rule["max_regression"]
    lines = [f"## {LABEL}", "",
             f"Every request of this phase was sent with `ignore_eos: true` and `max_tokens` = {result['output_tokens']}, "
             "so every successful request generates exactly that many tokens in every arm: answer length is held "
             "fixed and only the serving mechanics (drafting, verification, batching, KV traffic) differ. These "
             "figures are mechanics, not a study result; they are never pooled with the natural-EOS results, which "
             f"are recomputed here from the `{NATURAL_PHASE}` cells only for comparison.", "",
             f"Speedup = geometric mean over paired deployments (arm repeat r vs baseline repeat r) of the output-token "
             f"throughput ratio; interval: Student-t on log ratios at {rule['look_confidence']:.0%} (one look, no "
             f"correction); verdicts against gain > {1 + g:.2f} and regression < {1 - d:.2f} (the pre-registered "
             "decision rule's functions). Medians are over valid cells; acceptance rate (accepted / draft tokens) and "
             "mean acceptance length (1 + accepted / drafts) are the cells' own figures. Zone: where a point "
             f"speedup lies (above_gain > {1 + g:.2f}, below_regression < {1 - d:.2f}, else between).", ""]
    lines += _table("fixed output lengths (ignore_eos cells)", result["fixed_length"])
    lines += _table(f"natural EOS ({NATURAL_PHASE} cells, same rule), for comparison only", result["natural_eos"])
    lines += [f"**{LABEL}** — where natural EOS and fixed lengths disagree", ""]
    if result["disagreements"]:
        lines += ["| arm | workload | c | basis | fixed lengths: speedup; verdict; zone | natural EOS: speedup; verdict; "
                  "zone |", "|---|---|---:|---|---|---|"]
        lines += [f"| {x['arm']} | {x['workload']} | {x['concurrency']} | {x['basis']} | {_fig_text(x['fixed_length'])} "
                  f"| {_fig_text(x['natural_eos'])} |" for x in result["disagreements"]]
    else:
        lines.append(f"No disagreement: on every compared cell ({result['n_compared']}) the verdicts (or, without an "
                     "interval, the point speedups' sides of the thresholds) agree.")
    lines.append("")
    if result["not_compared"]:
        lines += [f"**{LABEL}** — cells not compared", "", "| arm | workload | c | why |", "|---|---|---:|---|"]
        lines += [f"| {x['arm']} | {x['workload']} | {x['concurrency']} | {x['why']} |" for x in result["not_compared"]]
        lines.append("")
    flagged = result["fixed_length_flagged"]
    lines += [f"**{LABEL}** — fixed-length check ({result['output_tokens']} tokens per successful request)", ""]
    if flagged:
        lines += ["| cell | completion tokens (expected) | finished on stop | problem |", "|---|---:|---:|---|"]
        lines += [f"| {x['cell']} | {x['completion_tokens']} ({x['expected_completion_tokens']}) | "
                  f"{_f(x['finished_stop'], '{:g}')} | {'; '.join(x['problems'])} |" for x in flagged]
    else:
        lines.append(f"Every ignore_eos cell with usage produced exactly {result['output_tokens']} tokens per successful "
                     "request and no request ended on stop.")
    lines.append("")
    lines += [f"**{LABEL}** — excluded cells (never silently dropped)", ""]
    if result["excluded"]:
        lines += ["| source | cell | reason codes | details |", "|---|---|---|---|"]
        lines += [f"| {x['source']} | {x['cell']} | {x['invalid_reasons']} | {x['invalid_details']} |"
                  for x in result["excluded"]]
    else:
        lines.append("None.")
    lines.append("")
    return "\n".join(lines)


def _cell_name(r: dict) -> str:
    return layout.cell_dir(r["phase"], r["arm"], r.get("rep_label") or r["rep"], r["workload"], r["concurrency"], root="")


def _plain(e: dict) -> dict:
    return {(k if isinstance(k, str) else str(k)): v for k, v in e.items()}


def summarize(cells: list, natural_cells: list, *, output_tokens: int, decision: dict, out_dir) -> dict:
    """Analyse the ignore_eos cells beside the natural-EOS (confirmation) cells; write summary.json, section.md
    and cells.parquet under ``out_dir``; return the summary."""
    from specstudy.core import atomic
    from specstudy.inference import stats

    if isinstance(output_tokens, bool) or not isinstance(output_tokens, int) or output_tokens < 1:
        raise IgnoreEosInputError(f"--output-tokens {output_tokens!r}: must be a positive integer, the max_tokens every "
                                  "ignore_eos request was sent with (the phase's declared output_tokens)")
    if not cells:
        raise IgnoreEosInputError("no ignore_eos cell summaries given (expected results/ignore_eos/<arm>/<rep>/"
                                  "<workload>/c<c>/summary.json); run the ignore_eos phase's deployments first")
    if not natural_cells:
        raise IgnoreEosInputError("no natural-EOS cell summaries given (expected results/confirm/<arm>/<rep>/"
                                  "<workload>/c<c>/summary.json); the ignore_eos phase is read beside confirmation: "
                                  "run `snakemake confirm` first")
    rule = _rule(decision, "pre-registration")
    fixed_rows = _read(cells, PHASE, "fixed_length", output_tokens)
    natural_rows = _read(natural_cells, NATURAL_PHASE, "natural_eos", None)
    fixed_keys = {(r["arm"], r["workload"], r["concurrency"]) for r in fixed_rows}
    fixed = _analyse(fixed_rows, rule)
    natural_all = _analyse(natural_rows, rule)
    natural = {k: v for k, v in natural_all.items() if k in fixed_keys}
    disagreements, not_compared = _disagreements(fixed, natural, rule)
    excluded = [dict(x, source=src, cell=_cell_name(x)) for src, rs in (("fixed_length", fixed_rows),
                                                                        ("natural_eos", natural_rows))
                for x in stats.excluded_cells(rs)]
    flagged = [{"cell": _cell_name(r), "path": r["path"], **r["fixed_length"]} for r in fixed_rows
               if r["fixed_length"]["honoured"] is False]
    unchecked = [{"cell": _cell_name(r), "path": r["path"], "why": "no successful request with usage"}
                 for r in fixed_rows if r["fixed_length"]["honoured"] is None]
    n_compared = sum(1 for e in fixed.values() if not e["reference"]) - len(not_compared)
    result = {
        "schema": SCHEMA, "phase": PHASE, "label": LABEL, "pooled_with_study": False,
        "output_tokens": output_tokens, "rule": rule,
        "fixed_length": fixed, "natural_eos": natural,
        "disagreements": disagreements, "n_compared": n_compared, "not_compared": not_compared,
        "fixed_length_flagged": flagged, "fixed_length_unchecked": unchecked, "excluded": excluded,
        "natural_only": [dict(zip(("arm", "workload", "concurrency"), k, strict=True))
                         for k in natural_all if k not in fixed_keys],
        "drift_cells_not_used": [_cell_name(r) for r in natural_rows + fixed_rows if r.get("kind") == "drift"],
        "inputs": [{"path": r["path"], "sha256": atomic.sha256_file(r["path"])} for r in fixed_rows + natural_rows],
    }
    out = {**result, "fixed_length": [_plain(e) for e in fixed.values()],
           "natural_eos": [_plain(e) for e in natural.values()]}
    out_dir = Path(out_dir)
    section, table = section_markdown(result), _parquet_bytes(fixed_rows + natural_rows)
    atomic.write_bytes(out_dir / "cells.parquet", table)
    atomic.write_text(out_dir / "section.md", section)
    atomic.write_json(out_dir / "summary.json", out)
    return out


# ---------------------------------------------------------------------------------------------
# The phase
# ---------------------------------------------------------------------------------------------
@register_phase
class IgnoreEosPhase(Phase):
    """Its deployments run their cells with the fixed length (the design's ``cell_settings``: the spec merges
    them); nothing else. The summary sets them beside the confirmation's natural-EOS cells."""

    name = PHASE

    def summarize(self, run) -> dict:
        return summarize(run.cells, run.confirm_cells(),
                         output_tokens=int(run.cfg["extensions"]["ignore_eos"]["output_tokens"]),
                         decision=run.prereg["confirmation"]["decision"], out_dir=run.out)
