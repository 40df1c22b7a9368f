"""The pre-registered decision rule on constructed data: verdicts, rounds, stopping, stability, bad input."""

from __future__ import annotations

import copy
import math

import pytest
import yaml

from specstudy.inference import decision, intervals
from specstudy.study.config import ConfigError
from specstudy.study.prereg import load_prereg

PREREG = {"version": 1,
          "selection": {"metric": "tpot_p50", "retain_within": 0.05},
          "confirmation": {"concurrency": [1, 8], "repeats": 3,
                           "stopping": {"max_repeats": 5, "correction": "bonferroni"},
                           "decision": {"min_gain": 0.05, "max_regression": 0.02, "confidence": 0.95}},
          "traffic": {"route_by_workload": False, "shares": "output_tokens", "mixture": {"code": 0.6, "chat": 0.4}},
          "gate": {"margins": {"min_common_prefix_fraction": 0.05, "max_normalized_edit_distance": 0.05,
                               "max_completion_token_difference": 4}}}
RULE = decision.rule_from(None, PREREG)
GATES = {"ngram-k4": {"arm": "ngram-k4", "verdict": "pass"}}
GAIN = [1.30, 1.31, 1.32]
LOSS = [0.80, 0.81, 0.82]
FLAT_TIGHT = [1.000, 1.001, 1.002]
BORDER = [0.97, 1.05, 1.00]  # median 1.00: the old point rule called this fine; a 5% loss is not excluded


def comp(arm, w, c, speedups, phase="confirm"):
    reps = [{"rep": i + 1, "speedup": s, "arm_otps": 100 * s, "base_otps": 100.0} for i, s in enumerate(speedups)]
    return {"phase": phase, "arm": arm, "workload": w, "concurrency": c, "repeats": reps,
            "speedup": intervals.describe(speedups)}


def study(per_cell: dict[tuple[str, int], list[float]], arm="ngram-k4"):
    return [comp(arm, w, c, v) for (w, c), v in per_cell.items()]


def run(comps, rule=RULE, gates=GATES):
    ws = sorted({c["workload"] for c in comps})
    cs = sorted({c["concurrency"] for c in comps})
    return decision.decide(comps, gates, rule, ws, cs, {w: 1 / len(ws) for w in ws})


def test_bonferroni_over_looks():
    assert RULE["looks"] == 3 and RULE["look_confidence"] == pytest.approx(1 - 0.05 / 3)
    none = decision.rule_from(None, {**PREREG, "confirmation": {**PREREG["confirmation"],
                                                               "stopping": {"max_repeats": 5, "correction": "none"}}})
    assert none["look_confidence"] == pytest.approx(0.95)


@pytest.mark.parametrize(("lo", "hi", "expected"), [(1.06, 1.3, "gain"), (0.5, 0.97, "regression"),
                                                    (0.99, 1.04, "non_inferior"), (0.95, 1.2, "inconclusive"),
                                                    (None, None, "missing")])
def test_verdicts(lo, hi, expected):
    assert decision.verdict(lo, hi, 0.05, 0.02) == expected


def test_judge_matches_hand_computed_t_interval():
    j = decision.judge(GAIN, RULE)
    logs = [math.log(v) for v in GAIN]
    m = sum(logs) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 2)
    from scipy import stats as st

    h = st.t.ppf(1 - 0.05 / 6, 2) * sd / math.sqrt(3)
    assert j["lo"] == pytest.approx(math.exp(m - h)) and j["hi"] == pytest.approx(math.exp(m + h))
    assert j["verdict"] == "gain"


def test_clear_gain_enables_and_stops():
    res = run(study({("code", 1): GAIN, ("code", 8): GAIN, ("chat", 1): GAIN, ("chat", 8): FLAT_TIGHT}))
    assert res["decision"] == "enable" and res["enable"] == "ngram-k4"
    assert decision.next_round(res, 3, RULE)["continue"] is False


def test_clear_regression_blocks_and_stops():
    res = run(study({("code", 1): GAIN, ("code", 8): LOSS}))
    assert res["decision"] == "do_not_enable"
    (cand,) = res["candidates"]
    assert cand["cells"]["code@c8"]["verdict"] == "regression" and cand["excluded"]
    assert any("regression shown" in b and "code@c8" in b for b in cand["blockers"])
    stop = decision.next_round(res, 3, RULE)
    assert stop["continue"] is False and "settled" in stop["why"]


def test_borderline_cell_asks_for_another_round():
    res = run(study({("code", 1): GAIN, ("code", 8): BORDER}))
    assert res["decision"] == "do_not_enable"
    (cand,) = res["candidates"]
    assert cand["cells"]["code@c8"]["verdict"] == "inconclusive"
    assert any("non-inferiority not shown" in b and "code@c8" in b for b in cand["blockers"])
    (u,) = res["undecided"]
    assert u["arm"] == "ngram-k4" and u["what"] == "code@c8"
    assert u["extra_repeats"] is not None and u["extra_repeats"] >= 1, u  # a borderline cell says how many more
    nxt = decision.next_round(res, 3, RULE)
    assert nxt["continue"] is True and "code@c8" in nxt["why"]


def test_cap_reached_stops_with_undecided_cells():
    vals = BORDER + [0.96, 1.04]
    res = run(study({("code", 1): GAIN + [1.3, 1.31], ("code", 8): vals}))
    assert res["candidates"][0]["cells"]["code@c8"]["verdict"] == "inconclusive"
    nxt = decision.next_round(res, 5, RULE)
    assert nxt["continue"] is False and "cap of 5 rounds reached" in nxt["why"]
    assert res["decision"] == "do_not_enable"


def test_more_rounds_settle_a_noisy_but_good_cell():
    noisy = [1.10, 1.02, 1.12]
    res3 = run(study({("code", 1): GAIN, ("code", 8): noisy}))
    assert res3["candidates"][0]["cells"]["code@c8"]["verdict"] == "inconclusive"
    res5 = run(study({("code", 1): GAIN + [1.31, 1.3], ("code", 8): noisy + [1.08, 1.09]}))
    assert res5["candidates"][0]["cells"]["code@c8"]["verdict"] in ("non_inferior", "gain")
    assert res5["decision"] == "enable"


def test_gate_fail_excludes_candidate_from_more_rounds():
    res = run(study({("code", 1): GAIN, ("code", 8): BORDER}), gates={"ngram-k4": {"verdict": "fail"}})
    assert res["undecided"] == [] and decision.next_round(res, 3, RULE)["continue"] is False



# Two arms that both qualify (every cell a shown gain), one by more than the other. The arms are sorted by
# name inside decide(), so each test runs with the better arm first and last.
SMALL_GAIN = [1.15, 1.16, 1.17]
CELLS = [("code", 1), ("code", 8), ("chat", 1), ("chat", 8)]


@pytest.mark.parametrize("better", ["draft-k3-tp1", "ngram-k4"])
def test_of_two_eligible_arms_the_better_is_enabled(better):
    worse = ({"draft-k3-tp1", "ngram-k4"} - {better}).pop()
    comps = study(dict.fromkeys(CELLS, GAIN), arm=better) + study(dict.fromkeys(CELLS, SMALL_GAIN), arm=worse)
    res = run(comps, gates={a: {"arm": a, "verdict": "pass"} for a in (better, worse)})
    cands = {c["arm"]: c for c in res["candidates"]}
    assert cands[better]["enable"] and cands[worse]["enable"]  # both qualify on their own
    assert cands[better]["score"] > cands[worse]["score"] > 1.05
    assert res["decision"] == "enable" and res["enable"] == better


@pytest.mark.parametrize("better_on_code", ["draft-k3-tp1", "ngram-k4"])
def test_routed_by_workload_each_workload_gets_its_better_eligible_arm(better_on_code):
    """With routing by workload each workload is decided on its own: both arms qualify on both workloads, one is
    better on code, the other on chat."""
    other = ({"draft-k3-tp1", "ngram-k4"} - {better_on_code}).pop()
    speedups = {better_on_code: {"code": GAIN, "chat": SMALL_GAIN}, other: {"code": SMALL_GAIN, "chat": GAIN}}
    comps = [comp(arm, w, c, speedups[arm][w]) for arm in speedups for w, c in CELLS]
    res = decision.decide(comps, {a: {"arm": a, "verdict": "pass"} for a in speedups}, RULE, ["chat", "code"], [1, 8],
                          {"chat": 0.5, "code": 0.5}, route_by_workload=True)
    for cand in res["candidates"]:
        assert all(v["enable"] for v in cand["workloads"].values()), cand["arm"]
    assert res["decision"] == "enable_per_workload"
    assert res["per_workload"] == {"code": better_on_code, "chat": other}


def test_extra_repeats_estimate():
    # mean 0.1 above the bound, sd 0.1: t(n-1) * 0.1 / sqrt(n) < 0.1 first holds at n = 7 (t6 = 2.447 / 2.646 < 1)
    assert decision.extra_repeats_to_settle(0.1, 0.1, 3, 0.0, 0.95) == 4
    assert decision.extra_repeats_to_settle(0.0, 0.1, 3, 0.0, 0.95) is None


def test_stability_counts_resampled_decisions():
    comps = study({("code", 1): GAIN, ("code", 8): [1.3, 1.25, 0.9]})
    stab = decision.stability(comps, GATES, RULE, ["code"], [1, 8], {"code": 1.0}, resamples=200, seed=1)
    assert stab["resamples"] == 200 and sum(stab["outcomes"].values()) == pytest.approx(1.0)
    assert stab["observed"] == "do_not_enable"
    assert 0 < stab["agreement"] <= 1
    assert stab["drivers"][0]["cell"] == "code@c8"
    assert "%" in decision.format_outcomes(stab)


def test_recommend_uses_preregistered_rule_and_reports_stability():
    comps = study({("code", 1): GAIN, ("chat", 1): GAIN})
    rec = decision.recommend(comps, [{"phase": "confirm", "arm": "ngram-k4", "verdict": "pass"}],
                          {"analysis": {"stability_resamples": 50}}, PREREG)
    assert rec["decision"] == "enable" and rec["rule"]["source"] == "pre-registration"
    assert rec["stability"]["resamples"] == 50


def _write(tmp_path, prereg):
    p = tmp_path / "prereg.yaml"
    p.write_text(yaml.safe_dump(prereg))
    return {"study": {"preregistration": str(p)}}


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda p: p["confirmation"].pop("stopping"), "stopping"),
    (lambda p: p["confirmation"]["stopping"].update(max_repeats=2), "confirmation.stopping.max_repeats"),
    (lambda p: p["confirmation"]["decision"].update(max_regression=-0.02), "confirmation.decision.max_regression"),
    (lambda p: p["confirmation"]["decision"].update(min_gain=-0.1), "confirmation.decision.min_gain"),
    (lambda p: p["confirmation"]["stopping"].update(correction="pocock"), "confirmation.stopping.correction"),
])
def test_bad_stopping_rule_refused_with_field(tmp_path, mutate, field):
    bad = copy.deepcopy(PREREG)
    mutate(bad)
    with pytest.raises(ConfigError) as exc:
        load_prereg(_write(tmp_path, bad))
    assert field in str(exc.value) and "prereg.yaml" in str(exc.value)


def test_good_prereg_loads(tmp_path):
    assert load_prereg(_write(tmp_path, PREREG))["confirmation"]["stopping"]["max_repeats"] == 5


def test_archive_and_show_confirmation_runs(tmp_path, capsys):
    import json

    from specstudy.cli import main

    res = tmp_path / "results"
    rounds = res / "confirm" / "rounds"
    rounds.mkdir(parents=True)
    (res / "gates" / "confirm").mkdir(parents=True)
    for n, dec in ((3, "do_not_enable"), (4, "enable ngram-k4")):
        (rounds / f"round{n}.json").write_text(json.dumps(
            {"round": n, "decision": dec, "why": "w", "stability": {"resamples": 10, "outcomes": {dec: 0.7, "x": 0.3}}}))
    assert main(["confirm-archive", "--results", str(res), "--to", str(tmp_path / "arch"), "--stamp", "run1"]) == 0
    assert not (res / "confirm").exists() and (tmp_path / "arch/confirm-run1/gates/confirm").is_dir()
    assert main(["confirm-archive", "--results", str(res), "--to", str(tmp_path / "arch")]) == 2
    assert "no confirmation checkpoint" in capsys.readouterr().out
    assert main(["confirm-show", str(tmp_path / "arch/confirm-run1")]) == 0
    out = capsys.readouterr().out
    assert "after 4 rounds: enable ngram-k4; stability: enable ngram-k4 in 70% of resamples, x in 30%" in out
