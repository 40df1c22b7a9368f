"""The capacity half of the recommendation (issue 28, item 2) on constructed knees and steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specstudy.analysis import capacity_criteria as cc
from specstudy.study.config import ConfigError, load_config
from specstudy.study.prereg import load_prereg

ROOT = Path(__file__).resolve().parents[1]
CRIT = {"min_knee_ratio": 0.9, "matched_load_fraction": 0.8, "max_ttft_p95_ratio": 1.2, "max_tpot_p95_ratio": 1.2,
        "max_kv_tokens_lost_fraction": 0.6}


def knee(k, above, kv, status="confirmed"):
    return {"knee_rps": k, "step_above_rps": above, "status": status, "deployment": {"kv_capacity_tokens": kv}}


def steps(rates_ttft_tpot, limited=()):
    return [{"phase": "bracket", "offered_rate": r, "ttft_p95_ms": a, "tpot_p95_ms": b, "client_limited": r in limited}
            for r, a, b in rates_ttft_tpot]


BASE_STEPS = steps([(1, 100, 20), (2, 110, 21), (4, 130, 22), (8, 160, 24), (16, 900, 60)])


def test_every_criterion_met_names_its_figures():
    ev = cc.evaluate(CRIT, knee(10, 11, 1_000_000), knee(12, 13.2, 600_000), BASE_STEPS,
                     steps([(1, 90, 12), (2, 95, 12), (4, 100, 13), (8, 120, 15), (16, 200, 18)]))
    by = {r["criterion"]: r for r in ev["criteria"]}
    assert ev["met"] and ev["missed"] == [] and list(by) == list(cc.CRITERIA)
    assert by["knee_ratio"]["value"] == pytest.approx(1.2)
    assert by["knee_ratio"]["interval"] == pytest.approx([12 / 11, 13.2 / 10])
    # matched load: the highest common rate <= 0.8 x 10 req/s
    assert by["ttft_p95_at_matched_load"]["matched_rps"] == 8 and by["ttft_p95_at_matched_load"]["value"] == 0.75
    assert by["kv_tokens_lost"]["value"] == pytest.approx(0.4)


def test_a_penalty_is_missed_and_missing_data_counts_as_missed():
    slow_tail = steps([(1, 100, 20), (2, 120, 30), (4, 150, 30), (8, 400, 40)])
    ev = cc.evaluate(CRIT, knee(10, 11, 1_000_000), knee(6, 6.6, 300_000), BASE_STEPS, slow_tail)
    by = {r["criterion"]: r["verdict"] for r in ev["criteria"]}
    # knee 0.6 [0.545, 0.66] wholly below 0.9; TTFT 400/160 = 2.5; TPOT 40/24; 70 % of the KV pool lost
    assert by == {"knee_ratio": "missed", "ttft_p95_at_matched_load": "missed", "tpot_p95_at_matched_load": "missed",
                  "kv_tokens_lost": "missed"}
    # a knee ratio whose bracket still reaches the limit is not a shown penalty
    ev = cc.evaluate(CRIT, knee(10, 11, 1e6), knee(8.5, 9.35, 1e6), BASE_STEPS, BASE_STEPS)
    assert ev["criteria"][0]["verdict"] == "met" and ev["criteria"][0]["interval"][1] >= 0.9
    # client-limited candidate steps are no evidence; no common rate -> no data -> missed
    ev = cc.evaluate(CRIT, knee(10, 11, 1e6), knee(10, 11, None), BASE_STEPS, steps([(8, 1, 1)], limited=(8,)))
    by = {r["criterion"]: r["verdict"] for r in ev["criteria"]}
    assert by["ttft_p95_at_matched_load"] == "no_data" and by["kv_tokens_lost"] == "no_data" and not ev["met"]
    ev = cc.evaluate(CRIT, knee(None, None, 1e6), knee(10, 11, 1e6), BASE_STEPS, BASE_STEPS)
    assert ev["criteria"][0]["verdict"] == "no_data"


def test_a_setting_that_misses_one_criterion_is_not_enabled():
    rec = {"decision": "enable", "enable": "ngram-k4"}
    bad = cc.evaluate(CRIT, knee(10, 11, 1e6), knee(10, 11, 1e6), BASE_STEPS,
                      steps([(1, 100, 20), (2, 110, 21), (4, 130, 22), (8, 300, 24)]))
    out = cc.apply(rec, bad, "ngram-k4", True)
    assert out["decision"] == "do_not_enable" and out["enable"] is None and out["confirmation_decision"] == "enable"
    assert out["capacity_blocker"] == "capacity criteria missed: ttft_p95_at_matched_load"
    good = cc.evaluate(CRIT, knee(10, 11, 1e6), knee(10, 11, 1e6), BASE_STEPS, BASE_STEPS)
    assert cc.apply(rec, good, "ngram-k4", True)["decision"] == "enable"
    assert cc.apply(rec, None, "ngram-k4", True)["decision"] == "do_not_enable"  # no search of the enabled arm
    assert cc.apply(rec, None, None, False)["decision"] == "enable"  # no capacity phase: not evaluated, said so
    assert "not evaluated" in cc.apply(rec, None, None, False)["capacity_half"]["note"]


def test_a_study_with_a_capacity_search_must_declare_the_criteria(tmp_path):
    cfg = load_config(ROOT / "config" / "config.yaml")
    assert (cfg.get("capacity") or {}).get("enabled")
    assert load_prereg(cfg)["capacity_criteria"] == CRIT
    prereg = yaml.safe_load((ROOT / "config" / "preregistration.yaml").read_text())
    del prereg["capacity_criteria"]
    p = tmp_path / "prereg.yaml"
    p.write_text(yaml.safe_dump(prereg))
    cfg["study"]["preregistration"] = str(p)
    with pytest.raises(ConfigError, match=r"prereg\.yaml: field 'capacity_criteria': missing"):
        load_prereg(cfg)
    prereg["capacity_criteria"] = dict(CRIT, max_kv_tokens_lost_fraction=1.5)
    p.write_text(yaml.safe_dump(prereg))
    with pytest.raises(ConfigError, match="max_kv_tokens_lost_fraction"):
        load_prereg(cfg)


def test_the_report_shows_both_halves_with_figures(tmp_path):
    """Real search records (capacity.search on synthetic systems: baseline knee 10 req/s, candidate 12) feed
    the report's recommendation: the confirmation half enables, the capacity half is judged from the files."""
    import os
    import sys

    from specstudy.core import atomic
    from specstudy.measure import capacity
    from specstudy.report.blocks import render_markdown
    from specstudy.report.files import from_root
    from specstudy.report.sections.recommendation import capacity_half_blocks, with_capacity_half

    sys.path.insert(0, os.path.dirname(__file__))
    from test_capacity import GATES, SEARCH, synthetic

    results = tmp_path / "results"
    for arm, k, kv in (("baseline", 10.0, 1_000_000), ("ngram-k4", 12.0, 1_000_000)):
        out = capacity.search(synthetic(k), GATES, SEARCH, arm=arm)
        rec = dict(out.knee, deployment={"kv_capacity_tokens": kv})
        atomic.write_jsonl(results / "capacity" / arm / "steps.jsonl", out.steps)
        atomic.write_json(results / "capacity" / arm / "knee.json", rec)
    cfg = load_config(ROOT / "config" / "config.yaml")
    rec = with_capacity_half({"decision": "enable", "enable": "ngram-k4"}, from_root(results), cfg)
    ev = rec["capacity_half"]["evaluation"]
    by = {r["criterion"]: r for r in ev["criteria"]}
    assert rec["decision"] == "enable" and ev["met"], ev
    assert by["knee_ratio"]["value"] == pytest.approx(12.0 / 10.0, rel=0.06)
    # the baseline knee is bisected to just below 10: 0.8 x knee < 8, so the highest common rate is 4
    assert by["ttft_p95_at_matched_load"]["matched_rps"] == 4.0
    blocks: list = []
    capacity_half_blocks(blocks, rec)
    md = render_markdown(blocks)
    assert "(1) confirmation — enable" in md and "(2) capacity — ngram-k4: every pre-registered criterion met" in md
    assert "| knee_ratio |" in md and "at 4 req/s" in md
    # the same candidate with half the KV pool lost beyond the declared 0.6: not enabled, the miss named
    atomic.write_json(results / "capacity" / "ngram-k4" / "knee.json",
                      dict(atomic.read_json(results / "capacity" / "ngram-k4" / "knee.json"),
                           deployment={"kv_capacity_tokens": 300_000}))
    rec = with_capacity_half({"decision": "enable", "enable": "ngram-k4"}, from_root(results), cfg)
    assert rec["decision"] == "do_not_enable" and rec["capacity_blocker"] == "capacity criteria missed: kv_tokens_lost"
    blocks = []
    capacity_half_blocks(blocks, rec)
    assert "missed kv_tokens_lost" in render_markdown(blocks)
