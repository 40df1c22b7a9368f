"""The report shows the bootstrap interval beside the t interval of every comparison, with the coverage
simulation's verdict on each at the phase's repeat count."""

from __future__ import annotations

from specstudy.inference import simulate
from specstudy.inference.intervals import describe
from specstudy.report.sections.results import coverage_note, results_tables

S = {"analysis": {"confidence": 0.95, "ci_method": "t_log"}}
#: a constructed coverage table: t holds at 5 repeats, the bootstraps miss under two scenarios
COV = [{"scenario": sc, "n": n, "t_log": t, "bootstrap_percentile": p, "bootstrap_bca": b}
       for sc, n, t, p, b in [("lognormal", 3, 0.95, 0.73, 0.72), ("skewed", 3, 0.90, 0.57, 0.61),
                              ("lognormal", 5, 0.96, 0.93, 0.94), ("skewed", 5, 0.93, 0.71, 0.72)]]


def _comp(values, phase="confirm"):
    return {"phase": phase, "arm": "ngram-k3", "workload": "code", "concurrency": 8, "n_excluded": 0,
            "speedup": describe(values, resamples=999), "tpot_ratio": describe(values), "ttft_ratio": describe(values),
            "absolute": dict.fromkeys(("base_otps", "arm_otps", "base_tpot_ms", "arm_tpot_ms", "acceptance_rate"))}


def test_verdicts_at_the_simulated_repeat_count():
    v = simulate.coverage_verdicts(COV, 5)
    assert v["t_log"] == {"n": 5, "min": 0.93, "max": 0.96, "under": [], "verdict": "holds"}
    assert v["bootstrap_bca"]["verdict"] == "under-covers" and v["bootstrap_bca"]["under"] == ["skewed"]
    assert v["bootstrap_percentile"]["under"] == ["skewed"]  # 0.93 under lognormal: within the tolerance
    assert simulate.coverage_verdicts(COV, 10)["t_log"]["n"] == 5  # nearest simulated count from below
    assert simulate.coverage_verdicts(COV, 4)["t_log"] == {"n": 3, "min": 0.90, "max": 0.95, "under": ["skewed"],
                                                           "verdict": "under-covers"}
    assert simulate.coverage_verdicts([], 5) is None


def test_results_table_shows_both_intervals_and_their_verdicts():
    values = [1.10, 1.14, 1.08, 1.12, 1.11]  # five deployment repeats
    comp = _comp(values)
    B: list = []
    results_tables(B, [comp], S, cov=COV)
    table = next(b for b in B if b[0] == "table")
    row = dict(zip(table[1], table[2][0], strict=True))
    sp = comp["speedup"]
    assert sp["boot_low"] is not None and (sp["boot_low"], sp["boot_high"]) != (sp["ci_low"], sp["ci_high"])
    assert row["speedup gm [CI]"].endswith(f"[{sp['ci_low']:.3f}, {sp['ci_high']:.3f}]")
    assert row["speedup bootstrap CI"] == f"[{sp['boot_low']:.3f}, {sp['boot_high']:.3f}] BCa"
    note = next(b[1] for b in B if b[0] == "p" and b[1].startswith("Coverage simulation"))
    assert "n = 5: t interval on log ratios holds (0.93–0.96)" in note
    assert "BCa bootstrap under-covers (0.72–0.94, below 0.92 under skewed)" in note


def test_a_phase_with_one_repeat_has_no_verdict():
    assert coverage_note([_comp([1.1])], S, COV).startswith("No coverage simulation covers")


def test_the_report_simulates_the_repeat_counts_it_judges():
    from specstudy.report.sections.method import coverage

    rows = coverage([_comp([1.1 + 0.01 * i for i in range(4)])])  # 4 repeats: simulated beside 3 and 5
    assert {r["n"] for r in rows} == {3, 4, 5} and simulate.coverage_verdicts(rows, 4)["t_log"]["n"] == 4
