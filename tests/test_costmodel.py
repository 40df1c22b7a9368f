"""The explanatory cost model (issue 27 item 4): constructed data with known answers, then the recorded
scale-model cells of the lent H200 (tests/data/gpu/cuda-logs/scale-model-8b) and its mechanics point."""

from __future__ import annotations

import json
import re

import pytest

from conftest import data_path
from specstudy.analysis import tables
from specstudy.deployment import launchlog
from specstudy.report import costmodel
from specstudy.report import document as report
from specstudy.report.blocks import render_markdown
from specstudy.report.files import from_root

SCALE = data_path("gpu", "cuda-logs", "scale-model-8b")
MECH = data_path("gpu", "mechanics-2026-12-02")


def test_break_even_alpha_inverts_the_expected_length():
    assert costmodel.expected_length(0.5, 2) == 1.75 and costmodel.expected_length(0.0, 4) == 1.0
    assert costmodel.break_even_alpha(1.75, 2) == pytest.approx(0.5, abs=1e-10)
    assert costmodel.break_even_alpha(1.3, 1) == pytest.approx(0.3, abs=1e-10)  # k = 1: L = 1 + α
    assert costmodel.break_even_alpha(0.8, 3) == 0.0  # cheaper than a baseline step: any acceptance wins
    assert costmodel.break_even_alpha(4.0, 3) == pytest.approx(1.0, abs=1e-10)
    assert costmodel.break_even_alpha(4.01, 3) is None  # beyond k + 1 tokens per step: unreachable
    for k, a in ((3, 0.37), (5, 0.81), (2, 0.05)):
        assert costmodel.break_even_alpha(costmodel.expected_length(a, k), k) == pytest.approx(a, abs=1e-9)


def _cell(arm, w, c, tpot, *, otps, length=None, alpha=None, rep=1, valid=True, kind="repeat", phase="confirm"):
    method = "baseline" if arm == "baseline" else ("ngram" if arm.startswith("ngram") else "draft_model")
    k = None if arm == "baseline" else int(re.search(r"-k(\d+)", arm)[1])
    return {"phase": phase, "arm": arm, "method": method, "num_speculative_tokens": k, "workload": w,
            "concurrency": c, "rep": rep, "kind": kind, "throughput_valid": valid, "tpot_p50_ms": tpot,
            "output_tokens_per_second": otps, "mean_acceptance_length": length, "acceptance_rate": alpha}


def constructed() -> tuple[list[dict], list[dict]]:
    """Baseline step 4 ms at c1, 5 ms at c8; draft-k2-tp1 steps 7 ms at c1 (L 2.0 on code, 1.5 on chat);
    ngram-k1 steps 6 ms at c8 (L 1.5); three repeats each whose medians are those values."""
    cells = []
    for rep, f in ((1, 0.9), (2, 1.0), (3, 1.2)):
        for w in ("code", "chat"):
            cells += [_cell("baseline", w, 1, 4.0 * f, otps=250.0 * f, rep=rep),
                      _cell("baseline", w, 8, 5.0 * f, otps=1600.0 * f, rep=rep)]
        cells += [_cell("draft-k2-tp1", "code", 1, 3.5 * f, otps=400.0 * f, length=2.0, alpha=0.6, rep=rep),
                  _cell("draft-k2-tp1", "chat", 1, 7.0 / 1.5 * f, otps=200.0 * f, length=1.5, alpha=0.3, rep=rep),
                  _cell("ngram-k1", "code", 8, 4.0 * f, otps=2000.0 * f, length=1.5, alpha=0.5, rep=rep)]
    # neither an invalid cell nor a drift baseline may move a median
    cells += [_cell("draft-k2-tp1", "code", 1, 400.0, otps=1.0, length=2.0, alpha=0.6, rep=4, valid=False),
              _cell("baseline", "code", 1, 400.0, otps=1.0, kind="drift"),
              _cell("draft-k2-tp1", "code", 1, 1.0, otps=1e6, length=3.0, phase="screen")]
    deps = [{"arm": "baseline", "method": "baseline", "status": "ok", "model_loading_gib": 10.0},
            {"arm": "draft-k2-tp1", "method": "draft_model", "status": "ok", "model_loading_gib": 12.5},
            {"arm": "draft-k2-tp1", "method": "draft_model", "status": "failed", "model_loading_gib": 99.0},
            {"arm": "ngram-k1", "method": "ngram", "status": "ok", "model_loading_gib": 10.0}]
    return cells, deps


def test_constructed_step_split_prediction_and_break_even():
    cells, deps = constructed()
    m = costmodel.cost_model(cells, deps, phase="confirm")
    assert m["sources"] == ["memory-bound"]
    steps = {(s["arm"], s["concurrency"]): s for s in m["steps"]}
    d = steps[("draft-k2-tp1", 1)]
    assert d["base_step_ms"] == pytest.approx(4.0) and d["step_ms"] == pytest.approx(7.0)
    assert d["verify_ms"] == pytest.approx(4.0) and d["draft_ms"] == pytest.approx(3.0)
    assert d["draft_ms_per_token"] == pytest.approx(1.5) and d["draft_token_cost"] == pytest.approx(0.375)
    assert d["draft_size_ratio"] == pytest.approx(0.25) and d["size_model_step_ms"] == pytest.approx(6.0)
    assert d["break_even_length"] == pytest.approx(1.75) and d["break_even_alpha"] == pytest.approx(0.5)
    assert d["reachable"] and d["measured_length"] == pytest.approx(1.75) and d["workloads"] == 2
    n = steps[("ngram-k1", 8)]
    assert n["step_ms"] == pytest.approx(6.0) and n["break_even_length"] == pytest.approx(1.2)
    assert n["break_even_alpha"] == pytest.approx(0.2) and n["draft_size_ratio"] == 0.0
    assert n["size_model_step_ms"] == pytest.approx(5.0)
    pred = {(p["arm"], p["workload"], p["concurrency"]): p for p in m["predictions"]}
    code, chat = pred[("draft-k2-tp1", "code", 1)], pred[("draft-k2-tp1", "chat", 1)]
    assert code["predicted_speedup"] == pytest.approx(8 / 7) and chat["predicted_speedup"] == pytest.approx(6 / 7)
    assert code["wins_by_model"] and not chat["wins_by_model"]
    assert code["size_model_speedup"] == pytest.approx(4 / 3) and chat["size_model_speedup"] == pytest.approx(1.0)
    assert code["measured_speedup"] == pytest.approx(400 / 250) and code["measured_tpot_speedup"] == pytest.approx(4 / 3.5)
    assert code["n"] == 3  # the invalid repeat is out
    assert pred[("ngram-k1", "code", 8)]["size_model_speedup"] == pytest.approx(1.5)


def test_mechanics_and_profile_take_precedence_for_verification():
    cells, deps = constructed()
    mech = {"rows": [{"mechanics_label": "small-draft-k2", "num_speculative_tokens": 2, "concurrency": 1,
                      "valid": True, "step_time_ratio": 1.25},
                     {"mechanics_label": "self-draft-k2", "num_speculative_tokens": 2, "concurrency": 1,
                      "valid": True, "step_time_ratio": 9.0}]}
    d = {(s["arm"], s["concurrency"]): s for s in costmodel.cost_model(cells, deps, mechanics=mech)["steps"]}
    assert d[("draft-k2-tp1", 1)]["verify_source"] == "mechanics"
    assert d[("draft-k2-tp1", 1)]["verify_ms"] == pytest.approx(5.0) and d[("draft-k2-tp1", 1)]["draft_ms"] == pytest.approx(2.0)
    assert d[("ngram-k1", 8)]["verify_source"] == "memory-bound"  # the mechanics draft says nothing of n-gram
    prof = {"arms": [{"arm": "draft-k2-tp1", "total": {
        "ms": {"target_forward": 10.0, "draft_forward": 90.0, "other": 0.0},
        "device_ms": {"target_forward": 60.0, "draft_forward": 30.0, "rejection_sampling": 10.0, "other": 100.0}}}]}
    s = costmodel.cost_model(cells, deps, mechanics=mech, profile=prof)["steps"][0]
    assert s["verify_source"] == "profile" and s["draft_ms"] == pytest.approx(7.0 * 0.3)  # GPU time, 'other' left out
    assert s["verify_ms"] == pytest.approx(7.0 * 0.7)


def test_report_section_on_constructed_tables(tmp_path):
    cells, deps = constructed()
    B: list = []
    comps = [{"phase": "confirm", "arm": "draft-k2-tp1", "workload": "code", "concurrency": 1,
              "speedup": {"n": 3, "geomean": 1.6, "ci_low": 1.4, "ci_high": 1.8}}]
    m = costmodel.report_section(B, cells, deps, (None, None), comps)
    assert len(m["steps"]) == 2
    md = render_markdown(B)
    assert "## Cost model" in md and "4.00 (memory-bound)" in md and "1.600 [1.400, 1.800]" in md
    B2: list = []
    costmodel.report_section(B2, [c for c in cells if c["arm"] == "baseline"], deps)
    assert "nothing to model" in B2[-1][1]


# ------------------------------------------------------------------------------------------ recorded cells
ARMS = {"baseline": "baseline", "draft-k1": "draft-k1-tp1", "draft-k3": "draft-k3-tp1", "ngram-k3": "ngram-k3"}


def recorded() -> tuple[list[dict], list[dict], dict]:
    cells, deps = [], []
    for name, arm in ARMS.items():
        rec = json.loads((SCALE / f"cells_{name}.json").read_text())
        for c in rec["cells"]:
            cells.append(_cell(arm, "open_chat", c["c"], c["tpot_p50_ms"], otps=c["out_tok_s"],
                               length=c.get("mean_acceptance_length"), alpha=c.get("acceptance_rate")))
        conf = launchlog.parse_launch_log((SCALE / f"serve_{name}.log").read_text(errors="replace"))
        dep = tables.deployment_row({"schema": "specstudy.deployment/1", "deployment_id": f"scale-{name}",
                                     "phase": "confirm", "arm": {"name": arm, "method": cells[-1]["method"]},
                                     "rep": 1, "status": "ok", "failure": None, "command": None, "confounds": conf,
                                     "times": {"start": None, "ready": None, "stop": None}})
        deps.append(dep)
    raw = {(name, c["c"]): c for name in ARMS for c in json.loads((SCALE / f"cells_{name}.json").read_text())["cells"]}
    return cells, deps, raw


def mechanics_rows() -> dict:
    """The mechanics point's rows as ``mechanics.json`` holds them, read from its recorded Markdown table."""
    rows = []
    for line in (MECH / "mechanics.md").read_text().splitlines():
        cols = [x.strip() for x in line.strip("|").split("|")]
        if len(cols) == 12 and cols[2].isdigit():
            k = re.search(r"-k(\d+)$", cols[1])
            rows.append({"mechanics_label": cols[1], "concurrency": int(cols[2]), "valid": cols[3] == "True",
                         "num_speculative_tokens": int(k[1]) if k else None,
                         "step_time_ratio": None if cols[11] == "—" else float(cols[11])})
    return {"rows": rows}


def test_recorded_scale_model_cells():
    cells, deps, raw = recorded()
    m = costmodel.cost_model(cells, deps)
    steps = {(s["arm"], s["concurrency"]): s for s in m["steps"]}
    pred = {(p["arm"], p["concurrency"]): p for p in m["predictions"]}
    base = {c: raw[("baseline", c)]["tpot_p50_ms"] for c in (1, 8, 32)}
    # the draft's weights from the arms' own launch logs: (14.86 - 13.03) / 13.03 GiB
    d3 = steps[("draft-k3-tp1", 1)]
    assert d3["draft_size_ratio"] == pytest.approx((14.86 - 13.03) / 13.03)
    r = raw[("draft-k3", 1)]
    assert d3["step_ms"] == pytest.approx(r["tpot_p50_ms"] * r["mean_acceptance_length"])  # ≈ 24.3 ms
    assert d3["draft_token_cost"] == pytest.approx((d3["step_ms"] - base[1]) / 3 / base[1])
    # a 1B-shaped draft forward costs about 1.5 target steps per token, not the 0.14 its bytes would
    assert 1.4 < d3["draft_token_cost"] < 1.6 and d3["draft_size_ratio"] < 0.15
    # no acceptance can make it win at k = 3 (L* > 4), though a memory-bound draft would have (size model > 1)
    assert d3["break_even_length"] > 4 and d3["break_even_alpha"] is None and not d3["reachable"]
    p3 = pred[("draft-k3-tp1", 1)]
    assert p3["size_model_speedup"] > 1.0 > p3["measured_speedup"]
    assert p3["predicted_speedup"] == pytest.approx(base[1] / r["tpot_p50_ms"])  # one workload: the TPOT ratio
    assert abs(p3["predicted_speedup"] - p3["measured_speedup"]) < 0.02  # decode dominates: ≈ 0.27 both
    # n-gram wins everywhere and by less as concurrency rises, in the model as in the measurement
    ng = [pred[("ngram-k3", c)] for c in (1, 8, 32)]
    assert all(p["wins_by_model"] and p["measured_speedup"] > 1 for p in ng)
    assert ng[0]["measured_speedup"] > ng[1]["measured_speedup"] > ng[2]["measured_speedup"]
    assert ng[0]["predicted_speedup"] > ng[1]["predicted_speedup"] > ng[2]["predicted_speedup"]
    n1 = steps[("ngram-k3", 1)]
    assert costmodel.expected_length(n1["break_even_alpha"], 3) == pytest.approx(n1["break_even_length"], rel=1e-9)
    assert n1["break_even_alpha"] < raw[("ngram-k3", 1)]["acceptance_rate"]
    # the predicted speedup overstates the measured one by the share of TTFT in the wall time (c1: 2.36 vs 1.99)
    assert ng[0]["predicted_speedup"] > ng[0]["measured_speedup"]


def test_recorded_cells_with_the_mechanics_point():
    cells, deps, raw = recorded()
    mech = mechanics_rows()
    assert [r["step_time_ratio"] for r in mech["rows"] if r["mechanics_label"] == "small-draft-k3"] == [1.439, 1.585, 1.825]
    m = costmodel.cost_model(cells, deps, mechanics=mech)
    steps = {(s["arm"], s["concurrency"]): s for s in m["steps"]}
    for c, ratio in ((1, 1.439), (8, 1.585), (32, 1.825)):
        s = steps[("draft-k3-tp1", c)]
        assert s["verify_source"] == "mechanics"
        assert s["verify_ms"] == pytest.approx(raw[("baseline", c)]["tpot_p50_ms"] * ratio)
        assert s["draft_ms"] == pytest.approx(s["step_ms"] - s["verify_ms"])
    assert steps[("draft-k1-tp1", 1)]["verify_source"] == "memory-bound"  # the mechanics point has k = 3 only
    assert steps[("ngram-k3", 1)]["verify_source"] == "memory-bound"
    assert m["sources"] == ["mechanics", "memory-bound"]


def test_the_report_carries_the_cost_model(tmp_path):
    from test_tables import make_results_tree

    res = make_results_tree(tmp_path)
    tables.build_tables(res, res / "tables")
    out = report.build(from_root(res, res / "tables"), {}, tmp_path / "report")
    cm = out["cost_model"]
    assert cm["phase"] == "confirm" and [(s["arm"], s["concurrency"]) for s in cm["steps"]] == \
        [("draft-k3-tp4", 1), ("draft-k3-tp4", 8)]
    for p in cm["predictions"]:  # a workload's prediction differs from another's only through its acceptance
        s = next(s for s in cm["steps"] if s["concurrency"] == p["concurrency"])
        assert p["predicted_speedup"] == pytest.approx(p["length"] / s["break_even_length"])
    saved = json.loads((tmp_path / "report" / "recommendation.json").read_text())
    assert saved["cost_model"]["steps"][0]["verify_source"] == "memory-bound"
    assert "## Cost model: time per decoding step" in (tmp_path / "report" / "report.md").read_text()
