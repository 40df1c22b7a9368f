"""Tests for specstudy.inference.stats and specstudy.inference.intervals: hand-computed statistics, coverage, pairing, drift,
recommendation and its vLLM patch (specstudy.deployment.command)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from specstudy.deployment import command
from specstudy.inference import decision, intervals, simulate, stats

T_975_DF1 = 12.706204736174698
T_975_DF2 = 4.302652729749464


def test_describe_hand_computed():
    d = intervals.describe([1.0, 1.21])
    assert d["n"] == 2 and d["median"] == pytest.approx(1.105)
    assert d["geomean"] == pytest.approx(1.1)
    m, sd = math.log(1.21) / 2, math.log(1.21) / math.sqrt(2)
    h = T_975_DF1 * sd / math.sqrt(2)
    assert d["ci_low"] == pytest.approx(math.exp(m - h)) and d["ci_high"] == pytest.approx(math.exp(m + h))
    d4 = intervals.describe([1.0, 2.0, 3.0, 4.0])
    assert (d4["median"], d4["q1"], d4["q3"], d4["min"], d4["max"]) == (2.5, 1.75, 3.25, 1.0, 4.0)


def test_t_interval_three_repeats():
    vals = [1.1, 1.2, 1.3]
    logs = np.log(vals)
    h = T_975_DF2 * logs.std(ddof=1) / math.sqrt(3)
    _, _, lo, hi = intervals.log_interval(list(logs), 0.95)
    assert lo == pytest.approx(math.exp(logs.mean() - h)) and hi == pytest.approx(math.exp(logs.mean() + h))
    # the many-samples form is the same interval, on the log scale
    _, _, los, his = intervals.log_intervals(np.array([logs, logs]), 0.95)
    assert np.exp(los) == pytest.approx([lo, lo]) and np.exp(his) == pytest.approx([hi, hi])


def test_exact_bootstrap_percentile_two_values():
    a, b = 1.0, 1.44
    la, lb = 0.0, math.log(1.44)
    mid = (la + lb) / 2
    # the 4 equally likely resamples have log means [la, mid, mid, lb]; numpy linear quantiles:
    lo_pos, hi_pos = 0.025 * 3, 0.975 * 3
    exp_lo = la + lo_pos * (mid - la)
    exp_hi = mid + (hi_pos - 2) * (lb - mid)
    (lo, hi), used = intervals.bootstrap_interval([a, b], method="percentile")
    assert used == "percentile"
    assert lo == pytest.approx(math.exp(exp_lo)) and hi == pytest.approx(math.exp(exp_hi))


def test_bca_falls_back_when_degenerate():
    (lo, hi), used = intervals.bootstrap_interval([1.1, 1.1, 1.1], method="bca")
    assert used.startswith("percentile") and lo == pytest.approx(1.1) and hi == pytest.approx(1.1)
    _, used = intervals.bootstrap_interval([1.0, 1.1, 1.3, 1.2, 1.25], method="bca")
    assert used == "bca"


def test_describe_edge_cases():
    assert intervals.describe([])["median"] is None
    one = intervals.describe([1.2])
    assert one["median"] == 1.2 and one["ci_low"] is None and "one repeat" in one["ci_note"]
    assert intervals.describe([None, float("nan"), -1, 1.5])["n"] == 1


@pytest.mark.parametrize("n", [3, 5])
def test_coverage_t_interval_near_nominal(n):
    cov = simulate.coverage(n, "t_log", sims=1000, seed=11)
    # binomial SE at 1000 sims is 0.007: accept 0.93..0.97
    assert 0.93 <= cov <= 0.97, cov


def test_percentile_bootstrap_undercovers_with_three_repeats():
    """Documented reason for choosing the t interval: the percentile bootstrap covers ~2/3 at n=3."""
    boot = simulate.coverage(3, "bootstrap_percentile", sims=400, seed=3)
    t = simulate.coverage(3, "t_log", sims=400, seed=3)
    assert boot < 0.85 < t


def _cell(phase, arm, rep, otps, *, w="code", c=1, valid=True, thr=True, ttft=50.0, tpot=10.0, acc=None):
    spec = {"baseline": ("baseline", None, None)}.get(arm, ("draft_model", 3, 4))
    return {"phase": phase, "arm": arm, "method": spec[0], "num_speculative_tokens": spec[1],
            "draft_tensor_parallel_size": spec[2], "rep": rep, "workload": w, "concurrency": c,
            "deployment_id": f"{arm}-{rep}", "valid": valid, "throughput_valid": thr, "latency_valid": valid,
            "invalid_reasons": "" if valid else "server_restarted", "output_tokens_per_second": otps,
            "tpot_p50_ms": tpot, "ttft_p50_ms": ttft, "acceptance_rate": acc, "mean_acceptance_length": None}


def test_comparisons_pair_by_rep_and_count_exclusions():
    cells = [
        _cell("confirm", "baseline", 0, 100.0), _cell("confirm", "baseline", 1, 200.0, valid=False),
        _cell("confirm", "baseline", 3, 100.0, thr=False, ttft=40.0),
        _cell("confirm", "draft-k3-tp4", 0, 120.0, tpot=8.0, ttft=55.0),
        _cell("confirm", "draft-k3-tp4", 1, 150.0), _cell("confirm", "draft-k3-tp4", 2, 150.0),
        _cell("confirm", "draft-k3-tp4", 3, 150.0, ttft=60.0),
        _cell("screen", "baseline", 0, 50.0),  # another phase is never a partner
    ]
    (comp,) = stats.comparisons(cells)
    assert comp["speedup"]["values"] == [pytest.approx(1.2)]
    assert comp["tpot_ratio"]["values"] == [pytest.approx(0.8)]
    assert comp["ttft_ratio"]["values"] == [pytest.approx(1.1), pytest.approx(1.5)]  # rep 3: latency still valid
    assert comp["n_excluded"] == 2
    reasons = {e["rep"]: e["reason"] for e in comp["excluded"]}
    assert "server_restarted" in reasons[1] and "unpaired" in reasons[2]
    assert comp["absolute"]["base_otps"] == 100.0


def _comp(arm, w, c, speedups, phase="confirm"):
    reps = [{"rep": i, "speedup": s, "arm_otps": 100 * s, "base_otps": 100.0} for i, s in enumerate(speedups)]
    return {"phase": phase, "arm": arm, "workload": w, "concurrency": c, "repeats": reps,
            "speedup": intervals.describe(speedups), "method": "draft_model", "num_speculative_tokens": 3,
            "draft_tensor_parallel_size": 4}


WIN = [1.30, 1.32, 1.31]
FLAT = [1.00, 1.01, 0.99]
LOSE = [0.90, 0.91, 0.89]
GATE_PASS = [{"phase": "confirm", "arm": "draft-k3-tp4", "verdict": "pass"}]


def test_recommend_win():
    comps = [_comp("draft-k3-tp4", w, c, WIN) for w in ("code", "chat") for c in (1, 8)]
    rec = decision.recommend(comps, GATE_PASS)
    assert rec["decision"] == "enable" and rec["enable"] == "draft-k3-tp4"


def test_recommend_lose_and_mixed():
    lose = [_comp("draft-k3-tp4", "code", 1, WIN), _comp("draft-k3-tp4", "chat", 1, LOSE)]
    rec = decision.recommend(lose, GATE_PASS)
    assert rec["decision"] == "do_not_enable"
    assert any("regression shown" in b and "chat@c1" in b for b in rec["candidates"][0]["blockers"])
    # mixed: wins on code, flat on chat; with 3 repeats a 2% loss on chat is not excluded -> inconclusive, blocks
    mixed = [_comp("draft-k3-tp4", "code", 1, WIN), _comp("draft-k3-tp4", "chat", 1, FLAT)]
    def traffic(mix=None, routed=False):  # the traffic section of a pre-registration (issue 28: not the config)
        return {"traffic": {"route_by_workload": routed, "shares": "output_tokens", "mixture": mix}}

    rec = decision.recommend(mixed, GATE_PASS, None, traffic({"code": 0.9, "chat": 0.1}))
    assert rec["decision"] == "do_not_enable"
    assert rec["candidates"][0]["status"]["chat@c1"] == "inconclusive"
    assert rec["undecided"][0]["what"] == "chat@c1"
    assert rec["traffic"]["mixture"] == {"code": 0.9, "chat": 0.1} and rec["traffic"]["shares"] == "output_tokens"
    # non-inferiority declared on the traffic mixture: the code-heavy mixture is enabled, the chat-heavy one not
    prereg = {"confirmation": {"repeats": 3, "stopping": {"max_repeats": 5, "correction": "none"},
                               "decision": {"min_gain": 0.05, "max_regression": 0.02, "non_inferiority_on": "mixture"}}}
    rec = decision.recommend(mixed, GATE_PASS, None, {**prereg, **traffic({"code": 0.9, "chat": 0.1})})
    assert rec["decision"] == "enable"
    rec = decision.recommend(mixed, GATE_PASS, None, {**prereg, **traffic({"code": 0.05, "chat": 0.95})})
    assert rec["decision"] == "do_not_enable"
    # routed by workload: enable for code only
    rec = decision.recommend(mixed, GATE_PASS, None, traffic(None, routed=True))
    assert rec["decision"] == "enable_per_workload"
    assert rec["per_workload"] == {"chat": None, "code": "draft-k3-tp4"}


def test_mixture_speedup_hand_computed():
    code = _comp("a", "code", 1, [2.0])
    chat = _comp("a", "chat", 1, [1.0])
    # equal token shares: base time 0.5/100 + 0.5/100, arm time 0.5/200 + 0.5/100 -> 0.02/0.015
    assert decision._mixture({"code": code, "chat": chat}, {"code": 0.5, "chat": 0.5}) == [pytest.approx(4 / 3)]


def test_cell_status_is_the_interval_verdict():
    assert decision.cell_status({"speedup": intervals.describe(WIN)}, 0.05, 0.02) == "gain"
    assert decision.cell_status({"speedup": intervals.describe(LOSE)}, 0.05, 0.02) == "regression"
    assert decision.cell_status({"speedup": intervals.describe([1.0, 1.2, 0.8])}, 0.05, 0.02) == "inconclusive"
    assert decision.cell_status({"speedup": intervals.describe([1.0])}, 0.05, 0.02) == "missing"


@pytest.mark.parametrize("verdict", ["fail", "no_verdict", None])
def test_gate_blocks(verdict):
    comps = [_comp("draft-k3-tp4", "code", 1, WIN)]
    gates = [] if verdict is None else [{"phase": "confirm", "arm": "draft-k3-tp4", "verdict": verdict}]
    rec = decision.recommend(comps, gates)
    assert rec["decision"] == "do_not_enable"
    assert rec["candidates"][0]["blockers"][0] == (f"gate verdict {verdict}" if verdict else "no confirm gate verdict")


def test_a_screening_gate_never_stands_in_for_the_confirmation_gate():
    """Review #16.4: recommend silently fell back to the screening gate; final_candidate did not."""
    comps = [_comp("draft-k3-tp4", w, c, WIN) for w in ("code", "chat") for c in (1, 8)]
    rec = decision.recommend(comps, [{"phase": "screen", "arm": "draft-k3-tp4", "verdict": "pass"}])
    assert rec["decision"] == "do_not_enable"
    assert rec["candidates"][0]["gate_verdict"] == "missing"
    assert rec["candidates"][0]["blockers"][0] == "no confirm gate verdict (the screen gate does not stand in for it)"
    assert "never stands in" in rec["gate_rule"] and "confirm phase" in rec["gate_rule"]
    # the final candidate applies the same rule: a screening pass does not make an arm eligible
    from specstudy.analysis.select import final_candidate

    summ = [{"keys": {"arm": a, "workload": "code", "concurrency": 1}, "validity": {"valid": True},
             "tokens": {"output_tokens_per_second": v}} for a, v in (("baseline", 100.0), ("draft-k3-tp4", 130.0))]
    fc = final_candidate(summ, [{"phase": "screen", "arm": "draft-k3-tp4", "verdict": "pass"}],
                         {"confirmation_arms": ["baseline", "draft-k3-tp4"]})
    assert fc["arm"] is None


def test_recommend_without_confirmation():
    rec = decision.recommend([_comp("draft-k3-tp4", "code", 1, WIN, phase="screen")], GATE_PASS)
    assert rec["decision"] == "insufficient_evidence" and "confirm" in rec["missing"][0]


def test_patch_replaces_existing_speculative_config():
    args = ["vllm", "serve", "m", "--speculative-config", '{"method":"ngram"}', "--port", "8000"]
    cfg = command.recommended_speculative_config({"method": "draft_model", "num_speculative_tokens": 3,
                                                  "draft_tensor_parallel_size": 4}, None, "/models/draft")
    new, diff = command.vllm_args_patch(args, cfg)
    assert new.count("--speculative-config") == 1 and json.loads(new[-1])["model"] == "/models/draft"
    assert "-" + "--speculative-config '{\"method\":\"ngram\"}'" in diff and "+--speculative-config" in diff
    recorded = command.recommended_speculative_config(None, '{"method": "ngram", "num_speculative_tokens": 3}')
    assert recorded == {"method": "ngram", "num_speculative_tokens": 3}


def test_the_production_draft_replaces_only_a_draft_models_path():
    """The recommendation's production draft path replaces the recorded draft model's path, never an EAGLE head's
    (recorded or built from the spec): the two branches must agree."""
    recorded = command.recommended_speculative_config(
        None, '{"method": "draft_model", "model": "/measured/draft", "num_speculative_tokens": 3}', "/prod/draft")
    assert recorded["model"] == "/prod/draft"
    head = command.recommended_speculative_config(
        None, '{"method": "eagle3", "model": "/measured/head", "num_speculative_tokens": 2}', "/prod/draft")
    assert head["model"] == "/measured/head"
    built = command.recommended_speculative_config({"method": "eagle3", "num_speculative_tokens": 2}, None, "/prod/draft")
    assert built["model"] != "/prod/draft"


def test_drift_detected_and_not():
    def cells(trend):
        out = []
        for i in range(8):
            for w in ("code", "chat"):
                c = _cell("screen", "baseline", i, 100 * (1 + trend * i) * (1 + 0.002 * ((i * 3) % 4)), w=w)
                c["started_unix"] = 1e9 + 3600 * i
                out.append(c)
        return out

    d = stats.drift(cells(0.02))
    assert d["detected"] and d["total_fraction"] > 0.1
    assert not stats.drift(cells(0.0))["detected"]
    assert stats.drift(cells(0.0)[:2])["detected"] is None


def test_h4_untestable_when_engine_refuses():
    comps = [_comp("draft-k3-tp4", "code", 1, WIN, phase="screen")]
    deps = [{"arm": "draft-k3-tp1", "method": "draft_model", "draft_tensor_parallel_size": 1, "status": "failed",
             "deployment_id": "x", "failure_stage": "startup", "failure_reason": "draft TP must equal target TP"}]
    (h,) = stats.hypotheses(comps, deps, [{"id": "H4", "statement": "tp", "phase": "screen",
                                           "test": "draft_tp_contrast", "params": {"better": 1, "worse": 4}}])
    assert h["verdict"] == "untestable" and "refused" in h["reason"]


def test_explanatory_model_recovers_slope():
    comps = []
    for i, acc in enumerate([0.3, 0.4, 0.5, 0.6, 0.7, 0.8]):
        for c in (1, 8):
            sp = [math.exp(0.5 * acc - 0.02 * math.log2(c) + 0.001 * r) for r in range(3)]
            comp = _comp(f"draft-k{i + 1}-tp4", "code", c, sp, phase="screen")
            comp["num_speculative_tokens"] = 3
            for r in comp["repeats"]:
                r["acceptance_rate"] = acc
            comps.append(comp)
    m = stats.explanatory_model(comps)
    assert m["fitted"] and "EXPLANATORY" in m["label"]
    coef = {p["term"]: p["coef"] for p in m["params"]}
    assert coef["acceptance_rate"] == pytest.approx(0.5, abs=0.02)


def test_h2_is_evaluated_from_the_preregistration_of_both_studies(tmp_path):
    """Review #16.2: H2's default named a workload 'chat'; both studies call it 'open_chat', and the
    pre-registration's hypotheses list was read by nothing: H2 could never be tested."""
    import yaml

    from specstudy.study.config import load_config
    from specstudy.study.prereg import load_prereg

    root = Path(__file__).resolve().parents[1]
    for cfg_file in ("config/config.yaml", "config/clariden-70b.yaml"):
        cfg = load_config(root / cfg_file)
        cfg["study"]["preregistration"] = str(root / cfg["study"]["preregistration"])
        declared = load_prereg(cfg)["hypotheses"]
        h2 = next(h for h in declared if h["id"] == "H2")
        assert h2["roles"]["low"] in cfg["corpora"]["workloads"], cfg_file
    comps = []
    for w, acc, sp in (("code", 0.7, 1.3), ("summarization", 0.6, 1.25), ("open_chat", 0.3, 1.05)):
        for c in (1, 4):
            comp = _comp("draft-k2-tp1", w, c, [sp, sp * 1.01, sp * 0.99], phase="screen")
            comp["absolute"] = {"acceptance_rate": acc}
            for r in comp["repeats"]:
                r["acceptance_rate"] = acc
            comps.append(comp)
    hyps = {h["id"]: h for h in stats.hypotheses(comps, [], declared)}
    assert hyps["H2"]["verdict"] == "supported", hyps["H2"]
    assert hyps["H2"]["phase_used"] == "screen" and hyps["H2"]["roles"]["low"] == "open_chat"
    assert "4/4" in hyps["H2"]["evidence"]
    # a pre-registration whose roles name a workload the study does not have is refused when loaded
    cfg = load_config(root / "config/config.yaml")
    bad = yaml.safe_load((root / "config/preregistration.yaml").read_text())
    next(h for h in bad["hypotheses"] if h["id"] == "H2")["roles"]["low"] = "chat"
    p = tmp_path / "prereg-bad.yaml"
    p.write_text(yaml.safe_dump(bad))
    cfg["study"]["preregistration"] = str(p)
    from specstudy.study.config import ConfigError

    with pytest.raises(ConfigError, match=r"hypotheses\[1\].*roles.low: 'chat' is not a workload of this study"):
        load_prereg(cfg)
