"""The ignore_eos (fixed-length) phase's analysis (specstudy.phases.ignore_eos): fixed lengths beside natural EOS.

The cell summaries are built here in the shape ``cell.summarize`` writes (copied, trimmed, from a real
confirmation summary of the embedded study: baseline rep1 code c1 and draft-k2-tp1 rep1 code c1) and
validated against the ``cell-summary`` schema before use, so the analysis sees real-shaped records.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from specstudy.core import schemas
from specstudy.core.errors import UserError
from specstudy.inference import decision
from specstudy.phases import ignore_eos as ie

ROOT = Path(__file__).resolve().parents[1]
DECISION = {"min_gain": 0.05, "max_regression": 0.02, "confidence": 0.95}
N = 48  # output_tokens of the phase

# From results/confirm/baseline/rep1/code/c1/summary.json of a real embedded-default run (trimmed).
REAL_BASELINE = {
    "schema": "specstudy.cell/1",
    "confounds": None,
    "corpus": {"digest": "24759f5a4b235ba2c822223e21f8751ea130996afdc53159998171a51090f846", "name": "bundled-code",
               "version": "1"},
    "drain": {"drained": True, "error": None, "running_plus_waiting": 0.0, "seconds": 0.026447947002452565},
    "fingerprint": "a073b4660502e4872d02753355517da889732c22edbb90e1f37d7ad4140063f1",
    "keys": {"arm": "baseline", "concurrency": 1, "deployment_id": "confirm-baseline-rep1-20261201T200816Z-p30678",
             "draft_tensor_parallel_size": None, "kind": "repeat", "method": "baseline", "num_speculative_tokens": None,
             "phase": "confirm", "rep": 1, "rep_label": "rep1", "tensor_parallel_size": 1, "workload": "code"},
    "latency_ms": {
        "e2e": {"count": 12, "mean": 443.09183333333334, "p50": 164.586, "p95": 1116.401, "p99": 1134.9778000000001},
        "stream_event_gap": {"count": 571, "mean": 8.481169877408055, "p50": 8.272, "p95": 12.273, "p99": 15.8496},
        "tpot": {"count": 12, "mean": 7.6706916666666665, "p50": 7.949349999999999, "p95": 8.900955, "p99": 9.033791},
        "ttft": {"count": 12, "mean": 39.529916666666665, "p50": 40.935, "p95": 47.121849999999995, "p99": 49.26597},
    },
    "loadgen": {"achieved_rate": 2.2183, "concurrency": 1, "cpu_share": 0.0728, "limited": False,
                "limited_reasons": [], "mode": "closed", "n_requests": 12, "wall_seconds": 5.409802},
    "percentile_method": "numpy.percentile(method='linear') (Hyndman-Fan type 7); mean = math.fsum/n",
    "requests": {"attempted": 12, "failed": 0, "failures_by_cause": {}, "missing_usage": 0,
                 "requests_per_second": 2.218356530564331, "success_rate": 1.0, "successful": 12},
    "server_deltas": {
        "available": True, "client_completion_tokens": 595, "client_rows_unknown_tokens": 0,
        "client_rows_without_usage": 0, "foreign_traffic_token_check": "done", "foreign_traffic_tolerance_tokens": 8,
        "generation_tokens": 595.0, "generation_tokens_minus_client": 0.0, "preemptions": 0.0,
        "prompt_tokens": 1507.0, "requests_finished": 12.0,
        "requests_finished_by_reason": {"abort": 0.0, "error": 0.0, "length": 2.0, "repetition": 0.0, "stop": 10.0},
    },
    "speculative": {"enabled": False},
    "telemetry": {"errors": {}, "hardware_source": "psutil", "interval_s": 1.0, "samples": 6,
                  "series": {"proc.cpu_pct": {"count": 6, "max": 191.2, "mean": 157.966667}}},
    "times": {"ended_at": "2026-12-01T20:09:59.217827+00:00", "started_at": "2026-12-01T20:09:53.808417+00:00"},
    "tokens": {"completion": 595, "output_tokens_per_second": 109.9935113071481, "prompt": 1507},
    "tokens_per_event": {"completion_tokens_per_content_event": 1.020583190394511, "count": 583,
                         "histogram": {"1": 582, "3": 1}, "mean": 1.0034305317324186, "multi_token_events": 1,
                         "source": "continuous_usage"},
    "validity": {"latency_valid": True, "notes": [], "reasons": [], "throughput_valid": True, "tpot_valid": True,
                 "valid": True},
    "wall_seconds": 5.40941,
    "wall_source": "rows: max(end_s) - min(start_s)",
    "warmup": {"attempted": 4, "successful": 4},
}
# From results/confirm/draft-k2-tp1/rep1/code/c1/summary.json of the same run.
REAL_SPECULATIVE = {"acceptance_rate": 0.6535433070866141, "accepted_tokens": 332.0, "attributable": True,
                    "draft_tokens": 508.0, "drafts": 254.0, "enabled": True, "mean_acceptance_length": 2.3070866141732282,
                    "mean_proposal_length": 2.0, "per_position": {"0": 0.7480314960629921, "1": 0.5590551181102362},
                    "per_position_accepted": {"0": 190.0, "1": 142.0}, "per_position_sum_matches": True}


def cell(phase, arm, rep, otps, *, workload="code", conc=1, tpot=8.0, completion=None, successful=12,
         missing_usage=0, stop=None, reasons=(), kind="repeat", spec=None):
    """A cell summary of the shape cell.summarize writes, validated against the schema."""
    d = copy.deepcopy(REAL_BASELINE)
    label = f"{kind if kind == 'drift' else 'rep'}{rep}"
    k = d["keys"]
    k.update(phase=phase, arm=arm, rep=rep, rep_label=label, kind=kind, workload=workload, concurrency=conc,
             deployment_id=f"{phase}-{arm}-{label}-20261201T200816Z-p1")
    if arm != "baseline":
        parts = arm.split("-")
        k.update(method="draft_model" if parts[0] == "draft" else "ngram", num_speculative_tokens=int(parts[1][1:]),
                 draft_tensor_parallel_size=int(parts[2][2:]) if parts[0] == "draft" else None)
        d["speculative"] = copy.deepcopy(spec or REAL_SPECULATIVE)
    with_usage = successful - missing_usage
    if completion is None:  # natural EOS: the real cell's mean length; fixed length: N per request
        completion = with_usage * N if phase == "ignore_eos" else round(595 / 12 * with_usage)
    if stop is None:
        stop = 0.0 if phase == "ignore_eos" else 10.0
    d["requests"].update(successful=successful, failed=12 - successful, success_rate=successful / 12,
                         missing_usage=missing_usage)
    d["tokens"].update(completion=completion, output_tokens_per_second=otps)
    d["latency_ms"]["tpot"]["p50"] = tpot
    d["server_deltas"]["requests_finished_by_reason"].update(stop=float(stop), length=float(successful - stop))
    if reasons:
        d["validity"].update(valid=False, reasons=[{"code": c, "detail": f"{c} (test)"} for c in reasons])
    schemas.validate(d, "cell-summary", "<test cell>")
    return d


def write(root: Path, d: dict) -> Path:
    k = d["keys"]
    p = root / k["phase"] / k["arm"] / k["rep_label"] / k["workload"] / f"c{k['concurrency']}" / "summary.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(d))
    return p


def rule():
    """The decision module's own rule for the same margins, one look."""
    prereg = {"confirmation": {"repeats": 3, "decision": DECISION, "stopping": {"max_repeats": 3, "correction": "none"}}}
    return decision.rule_from(None, prereg)


def entry(res, source, arm, workload="code", conc=1):
    return next(e for e in res[source] if (e["arm"], e["workload"], e["concurrency"]) == (arm, workload, conc))


def tree(tmp_path, fixed: dict[int, tuple[float, float]], natural: dict[int, tuple[float, float]],
         arm="ngram-k4", extra=()):
    """Write (baseline otps, arm otps) per rep for both phases; return (fixed paths, natural paths)."""
    fp, np_ = [], []
    for rep, (b, a) in fixed.items():
        fp += [write(tmp_path, cell("ignore_eos", "baseline", rep, b)), write(tmp_path, cell("ignore_eos", arm, rep, a))]
    for rep, (b, a) in natural.items():
        np_ += [write(tmp_path, cell("confirm", "baseline", rep, b)), write(tmp_path, cell("confirm", arm, rep, a))]
    for d in extra:
        (fp if d["keys"]["phase"] == "ignore_eos" else np_).append(write(tmp_path, d))
    return fp, np_


def test_speedup_and_verdict_are_the_decision_modules(tmp_path):
    fixed = {1: (100.0, 131.0), 2: (104.0, 133.0), 3: (98.0, 129.5)}
    natural = {1: (110.0, 108.0), 2: (111.0, 101.0), 3: (108.0, 112.0)}
    fp, np_ = tree(tmp_path, fixed, natural)
    res = ie.summarize(fp, np_, output_tokens=N, decision=DECISION, out_dir=tmp_path / "out")
    for source, data in (("fixed_length", fixed), ("natural_eos", natural)):
        want = decision.judge([a / b for b, a in data.values()], rule())
        got = entry(res, source, "ngram-k4")
        assert got["n"] == 3
        assert got["speedup"] == pytest.approx(want["geomean"], rel=1e-12)
        assert (got["lo"], got["hi"]) == pytest.approx((want["lo"], want["hi"]), rel=1e-12)
        assert got["verdict"] == want["verdict"]
        # medians of the cells' own figures; acceptance figures as written, never converted
        assert got["output_tokens_per_second_median"] == sorted(a for _, a in data.values())[1]
        assert got["baseline_output_tokens_per_second_median"] == sorted(b for b, _ in data.values())[1]
        assert got["tpot_p50_ms_median"] == 8.0
        assert got["acceptance_rate_median"] == REAL_SPECULATIVE["acceptance_rate"]
        assert got["mean_acceptance_length_median"] == REAL_SPECULATIVE["mean_acceptance_length"]
    assert entry(res, "fixed_length", "ngram-k4")["verdict"] == "gain"
    assert entry(res, "natural_eos", "ngram-k4")["verdict"] in ("inconclusive", "non_inferior")
    assert res["pooled_with_study"] is False and res["label"] == ie.LABEL


def test_one_deployment_gives_the_point_estimate_without_interval(tmp_path):
    fp, np_ = tree(tmp_path, {1: (100.0, 120.0)}, {1: (100.0, 101.0)})
    res = ie.summarize(fp, np_, output_tokens=N, decision=DECISION, out_dir=tmp_path / "out")
    e = entry(res, "fixed_length", "ngram-k4")
    assert e["speedup"] == pytest.approx(1.2) and e["lo"] is None and e["verdict"] == "missing"
    assert e["note"] == "one deployment: no interval"
    section = (tmp_path / "out" / "section.md").read_text()
    assert "1.200 (one deployment: no interval)" in section
    # no interval on either side: the point speedups (1.20 above 1.05, 1.01 between) decide the disagreement
    [d] = res["disagreements"]
    assert d["basis"].startswith("point speedups vs thresholds")
    assert d["fixed_length"]["zone"] == "above_gain" and d["natural_eos"]["zone"] == "between"
    assert d["natural_eos"]["speedup"] == pytest.approx(1.01)


def test_disagreement_detected_and_agreement_not_reported(tmp_path):
    ngram_fixed = {1: (100.0, 131.0), 2: (104.0, 133.0), 3: (98.0, 129.5)}   # gain at fixed lengths
    ngram_nat = {1: (100.0, 90.0), 2: (102.0, 91.0), 3: (99.0, 88.0)}       # regression at natural EOS
    fp, np_ = tree(tmp_path, ngram_fixed, ngram_nat)
    # a second arm that agrees (gain on both)
    for rep, (a_f, a_n) in {1: (130.0, 129.0), 2: (134.0, 132.0), 3: (128.0, 131.0)}.items():
        fp.append(write(tmp_path, cell("ignore_eos", "draft-k2-tp1", rep, a_f)))
        np_.append(write(tmp_path, cell("confirm", "draft-k2-tp1", rep, a_n)))
    res = ie.summarize(fp, np_, output_tokens=N, decision=DECISION, out_dir=tmp_path / "out")
    assert entry(res, "natural_eos", "draft-k2-tp1")["verdict"] == entry(res, "fixed_length", "draft-k2-tp1")["verdict"]
    [d] = res["disagreements"]
    assert (d["arm"], d["workload"], d["concurrency"], d["basis"]) == ("ngram-k4", "code", 1, "verdicts")
    assert d["fixed_length"]["verdict"] == "gain" and d["natural_eos"]["verdict"] == "regression"
    assert d["fixed_length"]["speedup"] == pytest.approx(entry(res, "fixed_length", "ngram-k4")["speedup"])
    section = (tmp_path / "out" / "section.md").read_text()
    row = next(line for line in section.splitlines() if line.startswith("| ngram-k4 | code | 1 | verdicts"))
    assert "gain" in row and "regression" in row
    assert res["n_compared"] == 2


def test_invalid_cell_excluded_with_its_reason(tmp_path):
    bad = cell("ignore_eos", "ngram-k4", 3, 500.0, reasons=("loadgen_limited",))
    fp, np_ = tree(tmp_path, {1: (100.0, 120.0), 2: (101.0, 122.0)}, {1: (100.0, 110.0), 2: (100.0, 111.0)},
                   extra=[cell("ignore_eos", "baseline", 3, 99.0), bad])
    res = ie.summarize(fp, np_, output_tokens=N, decision=DECISION, out_dir=tmp_path / "out")
    [x] = res["excluded"]
    assert x["cell"] == "ignore_eos/ngram-k4/rep3/code/c1" and x["invalid_reasons"] == "loadgen_limited"
    assert x["source"] == "fixed_length"
    e = entry(res, "fixed_length", "ngram-k4")
    assert e["n"] == 2 and e["values"] == pytest.approx([1.2, 122 / 101])  # the 500 tok/s cell is not used
    assert e["excluded_repeats"][0]["rep"] == 3 and "loadgen_limited" in e["excluded_repeats"][0]["reason"]
    section = (tmp_path / "out" / "section.md").read_text()
    assert "| fixed_length | ignore_eos/ngram-k4/rep3/code/c1 | loadgen_limited |" in section
    import pandas as pd

    df = pd.read_parquet(tmp_path / "out" / "cells.parquet")
    row = df[(df.source == "fixed_length") & (df.arm == "ngram-k4") & (df.rep == 3)].iloc[0]
    assert not row.used and row.own_invalid_reasons == "loadgen_limited"
    assert len(df) == len(fp) + len(np_)


def test_cell_that_did_not_produce_output_tokens_is_flagged(tmp_path):
    short = cell("ignore_eos", "ngram-k4", 2, 150.0, completion=12 * N - 30)              # some requests short
    eos = cell("ignore_eos", "ngram-k4", 3, 150.0, completion=12 * N - 2 * 7, stop=2)     # two ended on EOS
    usage = cell("ignore_eos", "baseline", 2, 100.0, missing_usage=2)                    # 10 with usage x N: fine
    fp, np_ = tree(tmp_path, {1: (100.0, 120.0)}, {1: (100.0, 110.0)},
                   extra=[usage, short, cell("ignore_eos", "baseline", 3, 100.0), eos])
    res = ie.summarize(fp, np_, output_tokens=N, decision=DECISION, out_dir=tmp_path / "out")
    flagged = {f["cell"]: f for f in res["fixed_length_flagged"]}
    assert set(flagged) == {"ignore_eos/ngram-k4/rep2/code/c1", "ignore_eos/ngram-k4/rep3/code/c1"}
    f2 = flagged["ignore_eos/ngram-k4/rep2/code/c1"]
    assert f2["expected_completion_tokens"] == 12 * N and f2["completion_tokens"] == 12 * N - 30
    assert "tokens.completion" in f2["problems"][0] and len(f2["problems"]) == 1
    f3 = flagged["ignore_eos/ngram-k4/rep3/code/c1"]
    assert any("requests_finished_by_reason.stop is 2" in p for p in f3["problems"])
    # flagged cells are left out of the comparison with their reason code, never silently
    excl = {x["cell"]: x["invalid_reasons"] for x in res["excluded"]}
    assert excl == {c: ie.NOT_HONOURED for c in flagged}
    assert entry(res, "fixed_length", "ngram-k4")["n"] == 1
    # natural-EOS cells end on stop by design: never checked
    assert not any(f["cell"].startswith("confirm/") for f in res["fixed_length_flagged"])
    section = (tmp_path / "out" / "section.md").read_text()
    assert f"| ignore_eos/ngram-k4/rep2/code/c1 | {12 * N - 30} ({12 * N}) |" in section
    assert _labelled_tables(section) == (4, 4)  # fixed, natural, fixed-length check, excluded (both gain: agree)


def _labelled_tables(section: str) -> tuple[int, int]:
    blocks = [b.strip() for b in section.split("\n\n") if b.strip()]
    tables = [i for i, b in enumerate(blocks) if b.startswith("|")]
    labelled = [i for i in tables if i > 0 and blocks[i - 1].startswith(f"**{ie.LABEL}**")]
    return len(tables), len(labelled)


def test_summary_end_to_end(tmp_path):
    """The phase's summary from the cell files (``specstudy phase summary ignore_eos`` hands it the plan's cells)
    with the embedded pre-registration's rule."""
    import pandas as pd
    import yaml

    res_root = tmp_path / "results"
    fp, np_ = tree(res_root, {1: (100.0, 131.0), 2: (104.0, 133.0), 3: (98.0, 129.5)},
                   {1: (100.0, 90.0), 2: (102.0, 91.0), 3: (99.0, 88.0)},
                   extra=[cell("confirm", "baseline", 1, 95.0, kind="drift")])
    out = res_root / "ignore_eos"
    prereg = yaml.safe_load((ROOT / "config/preregistration.yaml").read_text())
    ie.summarize(fp, np_, output_tokens=N, decision=prereg["confirmation"]["decision"], out_dir=out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema"] == ie.SCHEMA and summary["output_tokens"] == N
    # the embedded pre-registration's margins (issue 28's rule: gain > 0, 5 % regression), judged at one look
    assert summary["rule"]["min_gain"] == 0.0 and summary["rule"]["max_regression"] == 0.05
    assert summary["rule"]["look_confidence"] == 0.95
    assert [d["arm"] for d in summary["disagreements"]] == ["ngram-k4"]
    assert summary["drift_cells_not_used"] == ["confirm/baseline/drift1/code/c1"]
    assert len(summary["inputs"]) == len(fp) + len(np_)
    assert math.isclose(entry(summary, "fixed_length", "ngram-k4")["speedup"],
                        decision.judge([1.31, 133 / 104, 129.5 / 98], rule())["geomean"])
    section = (out / "section.md").read_text()
    assert section.startswith(f"## {ie.LABEL}\n")
    n_tables, n_labelled = _labelled_tables(section)
    assert n_tables == n_labelled == 3  # fixed, natural, disagreements (nothing excluded or flagged here)
    assert "where natural EOS and fixed lengths disagree" in section
    df = pd.read_parquet(out / "cells.parquet")
    assert len(df) == len(fp) + len(np_) and set(df.label) == {ie.LABEL}
    assert set(df.source) == {"fixed_length", "natural_eos"}
    assert df[df.source == "fixed_length"].fixed_length_honoured.all()
    assert df[df.source == "natural_eos"].fixed_length_honoured.isna().all()


def test_bad_input_is_named(tmp_path):
    fp, np_ = tree(tmp_path, {1: (100.0, 120.0)}, {1: (100.0, 110.0)})
    kw = {"output_tokens": N, "decision": DECISION, "out_dir": tmp_path / "out"}
    with pytest.raises(UserError, match=r"summary\.json: field '\$\.keys\.phase' is 'ignore_eos', expected 'confirm'"):
        ie.summarize(fp, fp, **kw)
    with pytest.raises(UserError, match=r"field '\$\.keys\.phase' is 'confirm', expected 'ignore_eos'"):
        ie.summarize(np_, np_, **kw)
    with pytest.raises(UserError, match=r"--output-tokens 0: must be a positive integer"):
        ie.summarize(fp, np_, **dict(kw, output_tokens=0))
    with pytest.raises(UserError, match=r"confirmation\.decision\.min_gain' is None"):
        ie.summarize(fp, np_, **dict(kw, decision={"max_regression": 0.02}))
    with pytest.raises(UserError, match="no natural-EOS cell summaries"):
        ie.summarize(fp, [], **kw)
    with pytest.raises(UserError, match=r"the same cell \(ngram-k4/rep1/code/1\)"):
        ie.summarize([*fp, fp[1]], np_, **kw)
    # keys that do not match the path
    moved = tmp_path / "ignore_eos/ngram-k4/rep2/code/c1/summary.json"
    moved.parent.mkdir(parents=True)
    moved.write_text(fp[1].read_text())
    with pytest.raises(UserError, match=r"rep2/code/c1/summary\.json: fields '\$\.keys' .*do not match the path"):
        ie.summarize([*fp, moved], np_, **kw)
    moved.unlink()
    # a corrupt summary: the reader names the file
    fp[0].write_text("{not json")
    with pytest.raises(UserError, match=str(fp[0])):
        ie.summarize(fp, np_, **kw)
    assert not (tmp_path / "out").exists()  # nothing written on bad input
    # a rule outside its bounds names its field
    with pytest.raises(UserError, match=r"'max_regression' \(1\.5\) must be"):
        ie.summarize(fp, np_, **dict(kw, decision=dict(DECISION, max_regression=1.5)))
