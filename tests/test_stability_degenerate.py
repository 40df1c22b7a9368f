"""Decision stability without degenerate resamples (issue 28, item 5)."""

from __future__ import annotations

import itertools

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


def test_two_rounds_are_not_estimable_every_admissible_resample_is_the_data_reordered():
    cs = comps([1.30, 1.32])
    stab = decision.stability(cs, GATES, RULE, ["code"], [1], {"code": 1.0}, resamples=100, seed=1)
    # with two rounds a resample is either both rounds (the observed data reordered) or one round twice
    # (degenerate): no admissible resample differs from the data, so no stability figure is reported
    assert stab["resamples"] == 0 and stab["outcomes"] == {} and stab["agreement"] is None
    assert stab["note"].startswith("not estimable: with 2 rounds")
    assert decision.format_outcomes(stab) == stab["note"]


def test_a_cell_left_without_two_valid_rounds_is_redrawn_not_judged():
    """Round 2 of the code cell was excluded (invalid): a resample that draws round 2 twice and round 1 or 3
    once leaves that cell one distinct round — no interval, a verdict 'missing' — and is redrawn."""
    reps = [{"rep": i + 1, "speedup": s, "arm_otps": 100 * s, "base_otps": 100.0}
            for i, s in enumerate([1.30, 1.32, 1.28, 1.31])]
    chat = {"phase": "confirm", "arm": "ngram-k4", "workload": "chat", "concurrency": 1, "repeats": reps,
            "speedup": intervals.describe([r["speedup"] for r in reps])}
    code_reps = [r for r in reps if r["rep"] != 2]
    code = dict(chat, workload="code", repeats=code_reps, speedup=intervals.describe([r["speedup"] for r in code_reps]))
    cs = [chat, code]
    w = {"chat": 0.5, "code": 0.5}
    observed = decision.decision_label(decision.decide(cs, GATES, RULE, ["chat", "code"], [1], w))
    stab = decision.stability(cs, GATES, RULE, ["chat", "code"], [1], w, resamples=300, seed=5)
    assert stab["resamples"] == 300 and stab["cell_degenerate_excluded"] > 0
    assert stab["degenerate_excluded"] >= stab["cell_degenerate_excluded"]
    assert stab["outcomes"] == {observed: 1.0}, stab["outcomes"]  # the tight cells agree once each is judged
    # what the redrawn ones would have said: the code cell or the mixture without an interval
    bad = [p for p in itertools.product([1, 2, 3, 4], repeat=4) if len(set(p)) >= 2 and len(set(p) - {2}) < 2]
    assert bad
    for p in bad[:20]:
        res = decision.decide(decision._resampled(cs, list(p)), GATES, RULE, ["chat", "code"], [1], w)
        cand = res["candidates"][0]
        assert cand["cells"]["code@c1"]["verdict"] == "missing" or cand["cells"]["code@c1"]["hi"] == cand[
            "cells"]["code@c1"]["lo"], p
