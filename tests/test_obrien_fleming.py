"""The O'Brien–Fleming alpha-spending correction for the looks of adaptive confirmation (issue 28, item 1)."""

from __future__ import annotations

import math

import pytest

from specstudy.inference import decision

PREREG = {"confirmation": {"repeats": 3, "stopping": {"max_repeats": 10, "correction": "obrien_fleming"},
                           "decision": {"min_gain": 0.0, "max_regression": 0.05, "confidence": 0.95}}}


def test_spending_sums_to_alpha_and_saves_it_for_the_late_looks():
    conf = decision.obrien_fleming_confidences(0.05, 3, 10)
    assert sorted(conf) == list(range(3, 11))
    assert math.fsum(1 - c for c in conf.values()) == pytest.approx(0.05, abs=1e-9)  # union bound: at most alpha
    assert conf[3] > 0.999 and conf[10] < 1 - 0.05 / 8  # early looks spend almost nothing, the last more than Bonferroni
    assert all(conf[n] > conf[n + 1] for n in range(3, 10))


def test_the_rule_uses_the_confidence_of_the_look_it_is_at():
    rule = decision.rule_from(None, PREREG)
    assert rule["correction"] == "obrien_fleming" and rule["looks"] == 8
    assert rule["look_confidence"] == pytest.approx(rule["look_confidences"][10])
    assert decision.confidence_at(rule, 3) == rule["look_confidences"][3]
    assert decision.confidence_at(rule, 2) == rule["look_confidences"][3]  # fewer valid rounds: the first look's
    # a cell exactly at 1.00 with per-round SD 0.048 after 10 rounds: non-inferior at a 5% margin under the
    # spending boundary, inconclusive under Bonferroni over the same 8 looks
    a = 0.0455
    vals = [math.exp(a if i % 2 else -a) for i in range(10)]
    obf = decision.judge(vals, rule)
    assert obf["confidence"] == rule["look_confidences"][10] and obf["verdict"] == "non_inferior", obf
    bonf = decision.judge(vals, decision.rule_from(None, {"confirmation": {
        **PREREG["confirmation"], "stopping": {"max_repeats": 10, "correction": "bonferroni"}}}))
    assert bonf["verdict"] == "inconclusive", bonf
    # the same data seen at the first look (3 rounds) are judged at that look's (much higher) confidence
    early = decision.judge(vals[:3], rule)
    assert early["confidence"] == rule["look_confidences"][3] and early["verdict"] == "inconclusive"


def _comps(per_w: dict[str, list[float]]):
    from specstudy.inference import intervals

    out = []
    for w, vals in per_w.items():
        reps = [{"rep": i + 1, "speedup": v, "arm_otps": 100 * v, "base_otps": 100.0} for i, v in enumerate(vals)]
        out.append({"phase": "confirm", "arm": "ngram-k4", "workload": w, "concurrency": 1, "repeats": reps,
                    "speedup": intervals.describe(vals)})
    return out


def test_the_chosen_design_enables_a_gain_with_one_neutral_workload_and_not_a_5pct_loss():
    """The cluster study's pre-registered design (config/preregistration-clariden-70b.yaml) on constructed data."""
    from pathlib import Path

    from specstudy.study.config import load_config
    from specstudy.study.prereg import load_prereg

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "config" / "clariden-70b.yaml")
    rule = decision.rule_from(cfg, load_prereg(cfg))
    assert (rule["correction"], rule["max_regression"], rule["min_gain"], rule["max_repeats"]) == (
        "obrien_fleming", 0.05, 0.0, 10)
    gates = {"ngram-k4": {"arm": "ngram-k4", "verdict": "pass"}}
    weights = {"open_chat": 0.6, "code": 0.3, "summarization": 0.1}
    jitter = [1.0 + 0.01 * ((i * 7) % 5 - 2) for i in range(10)]  # ±2 %, 10 rounds
    neutral = {"open_chat": [1.13 * j for j in jitter], "code": [1.00 * j for j in jitter],
               "summarization": [1.13 * j for j in jitter]}
    res = decision.decide(_comps(neutral), gates, rule, list(weights), [1], weights)
    assert res["decision"] == "enable", res["candidates"][0]["blockers"]
    loss = dict(neutral, code=[0.95 * j for j in jitter])  # a 5 % loss: at the margin, never shown non-inferior
    res = decision.decide(_comps(loss), gates, rule, list(weights), [1], weights)
    assert res["decision"] == "do_not_enable"
    assert any("code@c1" in b for b in res["candidates"][0]["blockers"])
