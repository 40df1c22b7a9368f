"""Decision stability without degenerate resamples (issue 28, item 5)."""

from __future__ import annotations

import itertools

import pytest

from specstudy.inference import decision, intervals

RULE = decision.rule_from(None, None)  # fixed design, one look at 95 %, margins g = 0.05, d = 0.02
GATES = {"ngram-k4": {"arm": "ngram-k4", "verdict": "pass"}}


def comps(speedups):
    reps = [{"rep": i + 1, "speedup": s, "arm_otps": 100 * s, "base_otps": 100.0} for i, s in enumerate(speedups)]
    return [{"phase": "confirm", "arm": "ngram-k4", "workload": "code", "concurrency": 1, "repeats": reps,
             "speedup": intervals.describe(speedups)}]


def decide(cs):
    return decision.decision_label(decision.decide(cs, GATES, RULE, ["code"], [1], {"code": 1.0}))


def test_an_enable_that_only_degenerate_resamples_produce_is_gone():
    cs = comps([1.10, 1.20, 0.95])
    assert decide(cs) == "do_not_enable"  # inconclusive: [0.77, 1.50]-ish at 3 rounds
    # by enumeration: of the 27 ordered resamples only the two single-round ones (1.10 x3, 1.20 x3) enable
    enabling = [p for p in itertools.product([1, 2, 3], repeat=3)
                if decide(decision._resampled(cs, list(p))) != "do_not_enable"]
    assert set(map(frozenset, enabling)) == {frozenset({1}), frozenset({2})}
    stab = decision.stability(cs, GATES, RULE, ["code"], [1], {"code": 1.0}, resamples=400, seed=3)
    assert stab["resamples"] == 400 and stab["outcomes"] == {"do_not_enable": 1.0} and stab["agreement"] == 1.0
    # 3 of 27 draws are degenerate: about 1 in 9 was redrawn
    assert 20 < stab["degenerate_excluded"] < 90, stab["degenerate_excluded"]
    assert "fewer than two distinct rounds" in stab["method"]


def test_two_rounds_are_still_resampled_and_every_kept_resample_has_both():
    cs = comps([1.30, 1.32])
    stab = decision.stability(cs, GATES, RULE, ["code"], [1], {"code": 1.0}, resamples=100, seed=1)
    # with two rounds a resample is either both rounds (kept) or one round twice (redrawn): half of the draws
    assert stab["resamples"] == 100 and stab["outcomes"] == {stab["observed"]: 1.0}
    assert 50 < stab["degenerate_excluded"] < 160
    assert sum(stab["outcomes"].values()) == pytest.approx(1.0)
