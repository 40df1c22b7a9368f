"""The simulation machinery (small counts): scenario generators, the vectorized rule, OC, coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specstudy.inference import decision, simulate

PREREG = {"confirmation": {"concurrency": [1, 8], "repeats": 3,
                           "stopping": {"max_repeats": 5, "correction": "bonferroni"},
                           "decision": {"min_gain": 0.05, "max_regression": 0.02}}}
RULE = decision.rule_from(None, PREREG)
W_OF, C_OF, WEIGHTS = [0, 0, 1, 1], [1, 8, 1, 8], [0.7, 0.3]


@pytest.mark.parametrize("scenario", ["lognormal", "skewed", "heavy_tailed"])
def test_generators_have_mean_zero_and_sd_sigma(scenario):
    x = simulate.draw(scenario, np.random.default_rng(1), (200_000, 1), 0.1)
    assert abs(x.mean()) < 0.002 and x.std() == pytest.approx(0.1, rel=0.05)


def test_skewed_has_a_long_slow_tail_and_outlier_shifts_one_round():
    x = simulate.draw("skewed", np.random.default_rng(2), (100_000, 1), 0.1).ravel()
    assert np.mean((x - x.mean()) ** 3) < 0
    o = simulate.deployment_logs("outlier", np.random.default_rng(3), 100, 5, 400, 0.1, rho=0.0)
    shifted = o.mean(axis=2) < -0.2  # every cell of the outlying round moves by -4 sigma
    assert (shifted.sum(axis=1) == 1).all()


def _comps(logs_one_sim, truth_cells):
    comps = []
    for i, (w, c) in enumerate(truth_cells):
        ratios = np.exp(logs_one_sim[:, i])
        reps = [{"rep": r + 1, "speedup": float(v), "arm_otps": 100 * float(v), "base_otps": 100.0}
                for r, v in enumerate(ratios)]
        comps.append({"phase": "confirm", "arm": "cand", "workload": f"w{w}", "concurrency": c, "repeats": reps})
    return comps


@pytest.mark.parametrize("truth", [[1.2, 1.2, 1.2, 1.2], [0.95, 0.95, 1.2, 1.2], [1.03, 1.0, 1.1, 1.06]])
@pytest.mark.parametrize("scope", ["cells", "mixture"])
def test_vectorized_rule_matches_decide(truth, scope):
    rule = dict(RULE, non_inferiority_on=scope)
    rng = np.random.default_rng(5)
    logs = np.log(truth)[None, None, :] + simulate.deployment_logs("heavy_tailed", rng, 40, 4, 4, 0.04)
    vec = simulate.evaluate_vectorized(logs, rule, W_OF, C_OF, WEIGHTS, 4)
    cells = list(zip(W_OF, C_OF, strict=True))
    for s in range(40):
        res = decision.decide(_comps(logs[s], cells), {"cand": {"verdict": "pass"}}, rule, ["w0", "w1"], [1, 8],
                              {"w0": 0.7, "w1": 0.3})
        assert (res["decision"] == "enable") == bool(vec["enable"][s])
        assert bool(res["undecided"]) == bool(vec["undecided"][s])


def test_operating_characteristics_small():
    gain = simulate.operating_characteristics([1.2] * 4, RULE, W_OF, C_OF, WEIGHTS, sigma=0.005, sims=200)
    assert gain["p_enable"] == 1.0 and gain["mean_rounds"] == 3.0
    loss = simulate.operating_characteristics([0.95, 0.95, 1.2, 1.2], RULE, W_OF, C_OF, WEIGHTS, sigma=0.005, sims=200)
    assert loss["p_enable"] == 0.0
    noisy = simulate.operating_characteristics([1.2] * 4, RULE, W_OF, C_OF, WEIGHTS, sigma=0.1, sims=300)
    assert 3.0 < noisy["mean_rounds"] <= 5.0 and sum(noisy["rounds"].values()) == pytest.approx(1.0)
    legacy = simulate.operating_characteristics([0.95, 0.95, 1.2, 1.2], RULE, W_OF, C_OF, WEIGHTS, sigma=0.1,
                                                sims=300, legacy=True)
    assert legacy["mean_rounds"] == 3.0


def test_coverage_per_scenario():
    assert 0.92 <= simulate.coverage(3, "t_log", "lognormal", sims=2000, seed=1) <= 0.98
    # one deployment at -4 sigma biases the mean but inflates the SD more: the t interval widens (over-covers)
    assert simulate.coverage(5, "t_log", "outlier", sims=2000, seed=1) > 0.95
    assert simulate.coverage(3, "bootstrap_percentile", "skewed", sims=100, seed=1) < 0.85
    with pytest.raises(ValueError, match="unknown scenario"):
        simulate.coverage(3, "t_log", "cauchy", sims=10)


def test_sigma_from_comparisons_pools_by_df():
    comps = [{"repeats": [{"speedup": math.exp(x)} for x in (0.0, 0.2)]},
             {"repeats": [{"speedup": math.exp(x)} for x in (0.1, 0.1, 0.1)]}]
    m = simulate.sigma_from_comparisons(comps)
    assert m["df"] == 3 and m["sigma"] == pytest.approx(math.sqrt(0.02 / 3))
    assert simulate.DECLARED_SIGMA == pytest.approx(0.176, abs=0.001)
