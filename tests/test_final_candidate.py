"""The capacity candidate is the arm the decision rule would enable (issue 28, item 3).

Constructed confirmation data (three workloads, one concurrency, three rounds); the baseline runs 100 tokens/s
in every round, so an arm's per-round speedups are its throughputs / 100.
"""

from __future__ import annotations

import math

import pytest

from specstudy.analysis import select
from specstudy.core import schemas
from specstudy.inference import decision, stats

WORKLOADS = ("chat", "code", "summ")


def cell(arm: str, w: str, rep: int, tput: float) -> dict:
    return {"keys": {"phase": "confirm", "arm": arm, "workload": w, "concurrency": 1, "rep": f"rep{rep}"},
            "validity": {"valid": True}, "tokens": {"output_tokens_per_second": tput}}


def study(arms: dict[str, dict[str, list[float]]]) -> list[dict]:
    out = [cell("baseline", w, r, 100.0) for w in WORKLOADS for r in (1, 2, 3)]
    for arm, per_w in arms.items():
        out += [cell(arm, w, r + 1, 100.0 * x) for w, xs in per_w.items() for r, x in enumerate(xs)]
    return out


def gates(*arms, verdict="pass"):
    return [{"arm": a, "phase": "confirm", "verdict": verdict} for a in arms]


# A: 1.10 on every cell, tight -> enabled. B: geometric means 1.35, 1.18, 1.24 (higher on average), but its
# code cell is noisy: the interval reaches below 1 - max_regression, so the rule does not enable B.
A = {w: [1.10, 1.105, 1.095] for w in WORKLOADS}
B = {"chat": [1.35, 1.36, 1.34], "code": [1.80, 0.92, 0.99], "summ": [1.24, 1.25, 1.23]}
C = {w: [0.90, 0.91, 0.89] for w in WORKLOADS}  # a regression shown everywhere
SEL = {"confirmation_arms": ["baseline", "A", "B", "C"]}


def test_the_capacity_candidate_is_the_arm_the_rule_enables_not_the_best_mean():
    s = study({"A": A, "B": B})
    logs = {a: sum(math.log(math.prod(xs) ** (1 / 3)) for xs in per.values()) / 3 for a, per in (("A", A), ("B", B))}
    assert logs["B"] > logs["A"]  # the old traffic-weighted mean log ratio picked B
    assert math.prod(B["code"]) ** (1 / 3) == pytest.approx(1.18, abs=0.005)
    res = select.final_candidate(s, gates("A", "B"), SEL)
    schemas.validate(res, "final-candidate", "<final-candidate>")
    assert res["arm"] == "A" and res["rule_enables"] and res["decision"] == "enable A" and res["beats_baseline"]
    assert [r["arm"] for r in res["ranking"]] == ["A", "B"]
    b = res["ranking"][1]
    assert not b["enable"] and any("non-inferiority not shown" in x and "code@c1" in x for x in b["blockers"])
    assert "decision rule enables" in res["ordering"] and "closest to enabling" in res["ordering"]
    # the recommendation (same rule, same data) enables the same arm
    rows = [select._comparison_row(x) for x in s]
    rec = decision.recommend(stats.comparisons(rows), gates("A", "B"), with_stability=False)
    assert rec["enable"] == res["arm"]


def test_none_enabled_the_closest_by_the_rules_ordering():
    res = select.final_candidate(study({"B": B, "C": C}), gates("B", "C"), SEL)
    assert res["arm"] == "B" and not res["rule_enables"] and res["decision"] == "do_not_enable"
    assert [r["arm"] for r in res["ranking"]] == ["B", "C"]
    assert res["ranking"][1]["excluded"]  # C's regression is shown: it ranks after B's open question
    assert "closest to enabling" in res["why"] and "code@c1" in res["why"]


def test_an_arm_whose_gate_did_not_pass_is_never_the_candidate():
    res = select.final_candidate(study({"A": A, "B": B}), gates("A", verdict="fail") + gates("B"), SEL)
    assert res["arm"] == "B" and not res["rule_enables"]
    assert [r["arm"] for r in res["ranking"] if r["eligible"]] == ["B"]
    res = select.final_candidate(study({"A": A}), gates("A", verdict="no_verdict"), SEL)
    assert res["arm"] is None and "baseline only" in res["why"]

