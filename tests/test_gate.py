"""Tests for specstudy.analysis.gate: metrics, controls, verdicts, CLI, and agreement with the upstream 70B study."""

from __future__ import annotations

import copy
import hashlib
import json
import types

import pytest

from conftest import data_path
from specstudy.analysis import gate
from specstudy.core import schemas
from specstudy.measure import greedy_capture

# The upstream 70B captures and gates are part of the repository's test data (tests/data/upstream-70b).
UPSTREAM = data_path("upstream-70b", "results", "70b", "correctness", "smoke-20260913-debug")
MARGINS = {"min_common_prefix_fraction": 0.05, "max_normalized_edit_distance": 0.05,
           "max_completion_token_difference": 2}
# upstream gate field name -> ours
UP_KEYS = {
    "minimum_common_prefix_characters": "min_common_prefix_chars",
    "minimum_common_prefix_fraction": "min_common_prefix_fraction",
    "maximum_normalized_edit_distance": "max_normalized_edit_distance",
    "maximum_completion_token_difference": "max_completion_token_difference",
}
UP_CHECKS = {"minimum_common_prefix_fraction": "min_common_prefix_fraction",
             "maximum_normalized_edit_distance": "max_normalized_edit_distance",
             "maximum_completion_token_difference": "max_completion_token_difference"}


def cap(outputs, *, dep="dep-a", arm="baseline", idx=1, tokens=None, failed=(), digest="d0"):
    """A hand-made capture: outputs = {prompt_id: text}."""
    prompts = []
    for pid, text in outputs.items():
        ok = pid not in failed
        prompts.append({"prompt_id": pid, "output_text": text if ok else None,
                        "completion_tokens": (tokens or {}).get(pid, len(text.split())) if ok else None,
                        "finish_reason": "stop" if ok else None, "success": ok,
                        "error": None if ok else "HTTP 500"})
    rec = {"schema": "specstudy.capture/1", "deployment_id": dep, "arm": arm, "capture_index": idx,
           "corpus": {"name": "smoke", "version": "1", "digest": digest},
           "sampling": {"temperature": 0.0, "seed": 0, "max_tokens": 64}, "prompts": prompts}
    schemas.validate(rec, "greedy-capture", "<test>")
    return rec


def row(comp, pid):
    return next(r for r in comp["prompts"] if r["prompt_id"] == pid)


# --------------------------------------------------------------------------- hand-made pairs


def test_identical_pair():
    a = cap({"p1": "hello world", "p2": "abc"})
    c = gate.compare_captures(a, copy.deepcopy(a))
    schemas.validate(c, "comparison", "<test>")
    assert c["kind"] == "within_deployment" and c["same_deployment"]
    w = c["worst_case"]
    assert w["exact_matches"] == 2 and w["comparable"] == 2
    assert w["min_common_prefix_fraction"] == 1.0
    assert w["max_normalized_edit_distance"] == 0.0
    assert w["max_completion_token_difference"] == 0
    assert row(c, "p1")["common_prefix_chars"] == 11


def test_empty_outputs():
    a = cap({"both": "", "one": "", "other": "xyz"}, dep="a")
    b = cap({"both": "", "one": "abcd", "other": ""}, dep="b")
    c = gate.compare_captures(a, b)
    schemas.validate(c, "comparison", "<test>")
    both, one, other = row(c, "both"), row(c, "one"), row(c, "other")
    assert both["exact_match"] and both["common_prefix_fraction"] == 1.0 and both["normalized_edit_distance"] == 0.0
    assert not one["exact_match"] and one["common_prefix_fraction"] == 0.0 and one["normalized_edit_distance"] == 1.0
    assert one["edit_distance"] == 4 and other["edit_distance"] == 3 and other["normalized_edit_distance"] == 1.0
    assert c["kind"] == "cross_deployment"


def test_unequal_lengths_and_prefix():
    a = cap({"p": "The answer is 42."}, dep="a", tokens={"p": 5})
    b = cap({"p": "The answer is 42. Also, more text."}, dep="b", arm="ngram-k3", tokens={"p": 12})
    c = gate.compare_captures(a, b)
    r = row(c, "p")
    assert c["kind"] == "cross_arm"
    assert r["common_prefix_chars"] == 17 and r["common_prefix_fraction"] == 1.0  # shorter is a prefix
    assert r["edit_distance"] == len(" Also, more text.")
    assert r["normalized_edit_distance"] == pytest.approx(17 / 34)
    assert r["completion_token_difference"] == 7
    # a divergence in the middle
    r2 = row(gate.compare_captures(cap({"p": "abcdef"}, dep="a"), cap({"p": "abXdefgh"}, dep="b")), "p")
    assert r2["common_prefix_chars"] == 2 and r2["common_prefix_fraction"] == pytest.approx(2 / 6)
    assert r2["normalized_edit_distance"] == pytest.approx(3 / 8)


def test_one_side_failed_and_missing():
    a = cap({"p1": "x", "p2": "y", "p3": "z"}, dep="a", failed={"p2"})
    b = cap({"p1": "x", "p2": "y"}, dep="b")
    c = gate.compare_captures(a, b)
    schemas.validate(c, "comparison", "<test>")
    assert c["counts"] == {"prompts": 3, "comparable": 1, "exact_matches": 1, "failed_a": 1, "failed_b": 0,
                           "missing_a": 0, "missing_b": 1, "missing_usage": 0}
    assert not row(c, "p2")["comparable"] and "failed in a" in row(c, "p2")["reason"]
    assert row(c, "p3")["reason"] == "missing in b"
    assert (row(c, "p2")["completion_tokens_a"], row(c, "p2")["completion_tokens_b"]) == (None, 1)
    assert (row(c, "p3")["completion_tokens_a"], row(c, "p3")["completion_tokens_b"]) == (1, None)
    assert c["distribution"]["normalized_edit_distance"]["count"] == 1
    both = gate.compare_captures(cap({"p": "x"}, dep="a", failed={"p"}), cap({"q": "y"}, dep="b"))
    assert row(both, "p")["reason"] == "failed in a: HTTP 500; missing in b"
    assert row(both, "q")["reason"] == "missing in a" and both["counts"]["missing_a"] == both["counts"]["failed_a"] == 1


def test_distribution_median_even_count():
    a = cap({"p1": "aaaa", "p2": "aaaa", "p3": "aaaa", "p4": "aaaa"}, dep="a")
    b = cap({"p1": "aaaa", "p2": "aaab", "p3": "aabb", "p4": "bbbb"}, dep="b")
    d = gate.compare_captures(a, b)["distribution"]["normalized_edit_distance"]
    assert d == {"count": 4, "min": 0.0, "median": 0.375, "mean": pytest.approx(0.4375), "max": 1.0}


# --------------------------------------------------------------------------- judge


def _arms():
    base1 = cap({"p1": "one two three four", "p2": "alpha beta gamma"}, dep="b1")
    base2 = cap({"p1": "one two three five", "p2": "alpha beta gamma"}, dep="b2")
    spec1 = cap({"p1": "one two three four", "p2": "alpha beta gamma"}, dep="s1", arm="draft-k3-tp1")
    return base1, base2, spec1


def test_judge_pass_records_control_and_claim():
    base1, base2, spec1 = _arms()
    g = gate.judge([base1], [spec1], [base1], [base2], MARGINS, phase="screen")
    assert g["verdict"] == "pass" and g["blocks_recommendation"] is False
    assert "consistent with losslessness; not a proof" in g["claim"]
    assert g["arm"] == "draft-k3-tp1"
    assert g["control"]["kind"] == "cross_deployment" and g["control"]["arm"] == "baseline"
    assert g["control"]["deployment_ids"] == ["b1", "b2"]
    assert g["control"]["worst_case"]["exact_matches"] == 1
    assert g["treatment"]["worst_case"]["exact_matches"] == 2
    assert g["margins"] == MARGINS
    assert g["allowances"]["max_normalized_edit_distance"] == pytest.approx(
        g["control"]["worst_case"]["max_normalized_edit_distance"] + 0.05)


def test_judge_forced_failure_blocks_recommendation():
    base1, base2, _ = _arms()
    bad = cap({"p1": "completely different output here", "p2": "zzz"}, dep="s1", arm="draft-k3-tp1",
              tokens={"p1": 40, "p2": 1})
    g = gate.judge([base1], [bad], [base1], [base2], MARGINS)
    assert g["verdict"] == "fail" and g["blocks_recommendation"] is True
    failed = {c["name"] for c in g["checks"] if not c["passed"]}
    assert failed == {"min_common_prefix_fraction", "max_normalized_edit_distance",
                      "max_completion_token_difference"}
    assert any(r["code"] == "exceeds_control" for r in g["reasons"])
    assert "not a proof" in g["claim"]


def test_judge_prompt_failed_on_candidate_fails():
    base1, base2, _ = _arms()
    spec = cap({"p1": "one two three four", "p2": "alpha beta gamma"}, dep="s1", arm="draft-k3-tp1", failed={"p2"})
    g = gate.judge([base1], [spec], [base1], [base2], MARGINS)
    assert g["verdict"] == "fail" and g["blocks_recommendation"]
    assert [c["passed"] for c in g["checks"] if c["name"] == "all_prompts_succeeded"] == [False]
    assert any(r["code"] == "prompt_failed" and "p2" in r["detail"] for r in g["reasons"])


def test_judge_without_control_is_no_verdict():
    base1, _, spec1 = _arms()
    g = gate.judge([base1], [spec1], None, None, MARGINS)
    assert g["verdict"] == "no_verdict" and not g["blocks_recommendation"]
    assert [r["code"] for r in g["reasons"]] == ["no_control"]
    assert g["control"] is None and g["checks"] == [] and g["treatment"] is not None


def test_judge_control_from_one_deployment_is_no_verdict():
    base1, _, spec1 = _arms()
    base1b = copy.deepcopy(base1)
    base1b["capture_index"] = 2
    g = gate.judge([base1, base1b], [spec1], [base1], [base1b], MARGINS)
    assert g["verdict"] == "no_verdict"
    assert "control_not_cross_deployment" in [r["code"] for r in g["reasons"]]
    # the two captures of b1 form a within-deployment control (recorded)
    w = g["within_deployment_controls"]
    assert len(w) == 1 and w[0]["deployment_ids"] == ["b1"] and w[0]["arm"] == "baseline"
    assert w[0]["worst_case"]["exact_matches"] == 2


def test_judge_failed_deployment_record(tmp_path):
    base1, base2, _ = _arms()
    dep = {"schema": "specstudy.deployment/1", "deployment_id": "s1-x", "phase": "screen",
           "arm": {"name": "draft-k3-tp1", "method": "draft_model"}, "rep": 1, "status": "failed",
           "failure": {"stage": "startup", "reason": "DraftModelProposer TP assertion", "error_excerpt": "",
                       "log": "x.log"}, "smoke": {"captures": []}}
    p = tmp_path / "deployment.json"
    p.write_text(json.dumps(dep))
    g = gate.judge([base1], [str(p)], [base1], [base2], MARGINS, arm="draft-k3-tp1")
    assert g["verdict"] == "no_verdict"
    codes = [r["code"] for r in g["reasons"]]
    assert "deployment_failed" in codes and "no_captures" in codes
    assert "DraftModelProposer" in g["reasons"][0]["detail"]
    assert g["candidate"]["failed_deployments"][0]["deployment_id"] == "s1-x"


def test_judge_ok_deployment_record_expands_captures(tmp_path):
    base1, base2, spec1 = _arms()
    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / "capture-1.json").write_text(json.dumps(spec1))
    dep = {"schema": "specstudy.deployment/1", "deployment_id": "s1", "status": "ok",
           "smoke": {"captures": ["smoke/capture-1.json"]}}
    (tmp_path / "deployment.json").write_text(json.dumps(dep))
    g = gate.judge([base1], [str(tmp_path / "deployment.json")], [base1], [base2], MARGINS)
    assert g["verdict"] == "pass" and g["candidate"]["deployment_ids"] == ["s1"]


def test_judge_corpus_mismatch_is_no_verdict():
    base1, base2, _ = _arms()
    spec = cap({"p1": "one two three four", "p2": "alpha beta gamma"}, dep="s1", arm="draft-k3-tp1", digest="other")
    g = gate.judge([base1], [spec], [base1], [base2], MARGINS)
    assert g["verdict"] == "no_verdict" and "corpus_mismatch" in [r["code"] for r in g["reasons"]]


def test_judge_missing_usage_is_no_verdict():
    base1, base2, spec1 = _arms()
    spec1["prompts"][0]["completion_tokens"] = None
    g = gate.judge([base1], [spec1], [base1], [base2], MARGINS)
    assert g["verdict"] == "no_verdict" and [r["code"] for r in g["reasons"]] == ["missing_usage"]


def test_margins_validation_names_field():
    base1, base2, spec1 = _arms()
    with pytest.raises(gate.GateInputError, match="max_normalized_edit_distance"):
        gate.judge([base1], [spec1], [base1], [base2], {"min_common_prefix_fraction": 0.05,
                                                         "max_completion_token_difference": 2})
    with pytest.raises(gate.GateInputError, match="min_common_prefix_fraction"):
        gate.validate_margins({**MARGINS, "min_common_prefix_fraction": 1.5})


def test_treatment_pairs_each_candidate_with_one_baseline():
    base1, base2, spec1 = _arms()
    spec2 = cap({"p1": "one two three four", "p2": "alpha beta delta"}, dep="s2", arm="draft-k3-tp1")
    g = gate.judge([base1, base2], [spec1, spec2], [base1], [base2], MARGINS)
    pairs = [(p["a"]["deployment_id"], p["b"]["deployment_id"]) for p in g["treatment"]["pairs"]]
    assert pairs == [("b1", "s1"), ("b2", "s2")] and g["treatment"]["pairing"] == "by_position"
    assert g["treatment"]["worst_case"]["exact_matches"] == 2 + 0


def _dep_record(tmp_path, capture, rep):
    d = tmp_path / capture["deployment_id"]
    (d / "smoke").mkdir(parents=True)
    (d / "smoke" / "capture-1.json").write_text(json.dumps(capture))
    rec = {"schema": "specstudy.deployment/1", "deployment_id": capture["deployment_id"], "status": "ok",
           "rep": rep, "rep_label": f"rep{rep}", "smoke": {"captures": ["smoke/capture-1.json"]}}
    (d / "deployment.json").write_text(json.dumps(rec))
    return str(d / "deployment.json")


def test_gate_compares_like_with_like_and_states_the_control_size(tmp_path):
    """Review #16.3: the treatment's worst case was taken over every baseline x candidate pair (9 in
    confirmation), the control's over one rep1-vs-rep2 pair. Now: each candidate repeat against the
    baseline of its repeat (3 pairs), the control over every pair of baseline repeats (3 pairs)."""
    texts = ["one two three four", "one two three five", "one two six seven"]
    bases = [_dep_record(tmp_path, cap({"p1": t, "p2": "alpha beta gamma"}, dep=f"b{i + 1}"), i + 1)
             for i, t in enumerate(texts)]
    # candidate repeat r reproduces baseline repeat r exactly: it is as deterministic as the baseline
    cands = [_dep_record(tmp_path, cap({"p1": t, "p2": "alpha beta gamma"}, dep=f"s{i + 1}", arm="draft-k3-tp1"),
                         i + 1) for i, t in reversed(list(enumerate(texts)))]
    g = gate.judge(bases, cands, margins=MARGINS, phase="confirm", control=bases)
    schemas.validate(g, "gate", "<test>")
    pairs = sorted((p["a"]["deployment_id"], p["b"]["deployment_id"]) for p in g["treatment"]["pairs"])
    assert pairs == [("b1", "s1"), ("b2", "s2"), ("b3", "s3")] and g["treatment"]["pairing"] == "by_rep"
    assert g["treatment"]["n_pairs"] == 3
    cpairs = sorted(tuple(sorted((p["a"]["deployment_id"], p["b"]["deployment_id"]))) for p in g["control"]["pairs"])
    assert cpairs == [("b1", "b2"), ("b1", "b3"), ("b2", "b3")]
    assert g["control"]["n_pairs"] == 3 and g["control"]["n_deployments"] == 3
    assert g["control"]["pairing"] == "all_pairs"
    assert g["treatment"]["worst_case"]["exact_matches"] == 6 and g["verdict"] == "pass"
    from specstudy.analysis import tables

    row = tables.gate_row(g, "confirm", "draft-k3-tp1")
    assert (row["treatment_pairs"], row["control_pairs"], row["control_deployments"]) == (3, 3, 3)
    # the CLI takes the baseline repeats as the control
    from specstudy import cli

    out = tmp_path / "gate.json"
    assert cli.main(["gate", "judge", "--baseline", *bases, "--candidate", *cands, "--control", *bases,
                     "--margins", json.dumps(MARGINS), "--phase", "confirm", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["control"]["n_pairs"] == 3



# --------------------------------------------------------------------------- more than one repeat
SAME = {"p1": "one two three four", "p2": "alpha beta gamma"}
DIVERGED = {"p1": "one nine ten eleven twelve thirteen fourteen fifteen", "p2": "alpha beta gamma"}


@pytest.mark.parametrize("diverging", [1, 2, 3])
def test_one_diverging_candidate_repeat_of_three_fails_the_gate(tmp_path, diverging):
    """The treatment's worst case is over every repeat: three baseline repeats that agree exactly (a control of
    zero divergence), three candidate repeats of which one diverges. Whichever repeat it is, the gate fails on
    all three checks with that repeat's values."""
    bases = [_dep_record(tmp_path, cap(SAME, dep=f"b{r}"), r) for r in (1, 2, 3)]
    cands = [_dep_record(tmp_path, cap(DIVERGED if r == diverging else SAME, dep=f"s{r}", arm="draft-k3-tp1"), r)
             for r in (1, 2, 3)]
    g = gate.judge(bases, cands, margins=MARGINS, phase="confirm", control=bases)
    assert g["treatment"]["pairing"] == "by_rep" and g["treatment"]["n_pairs"] == 3 and g["control"]["n_pairs"] == 3
    cw = g["control"]["worst_case"]
    assert (cw["min_common_prefix_fraction"], cw["max_normalized_edit_distance"],
            cw["max_completion_token_difference"]) == (1.0, 0.0, 0)
    diverged = gate.compare_captures(cap(SAME, dep="b"), cap(DIVERGED, dep="s"))["worst_case"]
    tw = g["treatment"]["worst_case"]
    for key in gate.MARGIN_KEYS:
        assert tw[key] == diverged[key], key
    assert tw["exact_matches"] == 5 and tw["comparable"] == 6  # summed over the three pairs
    assert g["verdict"] == "fail" and g["blocks_recommendation"]
    assert {c["name"] for c in g["checks"] if not c["passed"]} == set(gate.MARGIN_KEYS)


def test_one_diverging_baseline_repeat_of_three_widens_the_control(tmp_path):
    """The control's worst case is over every pair of baseline repeats: repeats 1 and 2 agree exactly, repeat 3
    diverges from both. A candidate whose repeats diverge from their baselines by as much as baseline repeat 3
    does is within the control's envelope and passes; judged against the agreeing pair alone it would fail."""
    bases = [_dep_record(tmp_path, cap(DIVERGED if r == 3 else SAME, dep=f"b{r}"), r) for r in (1, 2, 3)]
    cands = [_dep_record(tmp_path, cap(SAME if r == 3 else DIVERGED, dep=f"s{r}", arm="draft-k3-tp1"), r)
             for r in (1, 2, 3)]
    g = gate.judge(bases, cands, margins=MARGINS, phase="confirm", control=bases)
    assert g["control"]["n_pairs"] == 3 and g["treatment"]["n_pairs"] == 3
    diverged = gate.compare_captures(cap(SAME, dep="b"), cap(DIVERGED, dep="s"))["worst_case"]
    for key in gate.MARGIN_KEYS:
        assert g["control"]["worst_case"][key] == g["treatment"]["worst_case"][key] == diverged[key], key
    assert g["control"]["worst_case"]["exact_matches"] == 2 + 1 + 1  # b1-b2 both prompts, b1-b3 and b2-b3 p2 only
    assert g["verdict"] == "pass", g["reasons"]
    agreeing = gate.judge(bases[:2], cands[:2], margins=MARGINS, phase="confirm", control=bases[:2])
    assert agreeing["verdict"] == "fail"


def test_pooled_worst_case_takes_each_extreme_from_whichever_comparison_holds_it():
    def comp(prefix, ned, tokens, exact, n=2):
        return {"worst_case": {"exact_matches": exact, "comparable": n, "min_common_prefix_chars": prefix * 10,
                               "min_common_prefix_fraction": prefix, "max_normalized_edit_distance": ned,
                               "max_completion_token_difference": tokens}}

    comps = [comp(0.9, 0.1, 1, 2), comp(0.8, 0.05, 4, 1), comp(0.95, 0.3, None, 0)]
    assert gate.pooled_worst_case(comps) == {"exact_matches": 3, "comparable": 6, "min_common_prefix_chars": 8.0,
                                             "min_common_prefix_fraction": 0.8, "max_normalized_edit_distance": 0.3,
                                             "max_completion_token_difference": 4}
    assert gate.pooled_worst_case([]) is None


# --------------------------------------------------------------------------- the margin arithmetic
# A control pair (b1 vs b2) whose worst case is set by p1: prefix 5 of 10 characters (0.5), 5 of 10 characters
# edited (0.5), 13 vs 10 completion tokens (3). With these margins the allowances are 0.5 - 0.2 = 0.3,
# 0.5 + 0.05 = 0.55 and 3 + 2 = 5; a candidate at exactly each allowance passes, one step beyond it fails.
ARITH_MARGINS = {"min_common_prefix_fraction": 0.2, "max_normalized_edit_distance": 0.05,
                 "max_completion_token_difference": 2}
ARITH_BASE = {"p1": "aaaaaaaaaa", "p2": "aaaaaaaaa", "p3": "x y z"}
ARITH_TOKENS = {"p1": 10, "p2": 9, "p3": 3}
AT_ALLOWANCE = {"p1": "aaabaaaaaa", "p2": "aaaaaaaaa" + "b" * 11, "p3": "x y z"}  # prefix 3/10, 11 of 20 edited
BEYOND = {"min_common_prefix_fraction": ({"p1": "aabaaaaaaa"}, {}),              # prefix 2/10
          "max_normalized_edit_distance": ({"p2": "aaaaaaaaa" + "b" * 12}, {}),  # 12 of 21 edited
          "max_completion_token_difference": ({}, {"p3": 3 + 6})}                 # 6 tokens more


def _arith_judge(texts: dict, tokens: dict) -> dict:
    b1 = cap(ARITH_BASE, dep="b1", tokens=ARITH_TOKENS)
    b2 = cap({**ARITH_BASE, "p1": "aaaaabbbbb"}, dep="b2", tokens={**ARITH_TOKENS, "p1": 13})
    cand = cap(texts, dep="s1", arm="draft-k3-tp1", tokens=tokens)
    return gate.judge([b1], [cand], [b1], [b2], ARITH_MARGINS)


def test_allowances_are_the_control_worst_case_plus_the_margins():
    g = _arith_judge(AT_ALLOWANCE, {**ARITH_TOKENS, "p3": 3 + 5})
    cw = g["control"]["worst_case"]
    assert (cw["min_common_prefix_fraction"], cw["max_normalized_edit_distance"],
            cw["max_completion_token_difference"]) == (0.5, 0.5, 3)
    assert g["allowances"] == {"min_common_prefix_fraction": pytest.approx(0.3, abs=1e-12),
                               "max_normalized_edit_distance": pytest.approx(0.55, abs=1e-12),
                               "max_completion_token_difference": 5}
    observed = {c["name"]: (c["observed"], c["control"], c["margin"], c["passed"]) for c in g["checks"]}
    assert observed == {"all_prompts_succeeded": (True, None, None, True),
                        "min_common_prefix_fraction": (pytest.approx(0.3, abs=1e-12), 0.5, 0.2, True),
                        "max_normalized_edit_distance": (pytest.approx(0.55, abs=1e-12), 0.5, 0.05, True),
                        "max_completion_token_difference": (5, 3, 2, True)}
    assert g["verdict"] == "pass", g["reasons"]


@pytest.mark.parametrize("check", sorted(BEYOND))
def test_one_step_beyond_an_allowance_fails_that_check_alone(check):
    texts, tokens = BEYOND[check]
    g = _arith_judge({**AT_ALLOWANCE, **texts}, {**ARITH_TOKENS, "p3": 3 + 5, **tokens})
    assert g["verdict"] == "fail"
    assert [c["name"] for c in g["checks"] if not c["passed"]] == [check]
    assert [r["code"] for r in g["reasons"]] == ["exceeds_control"] and check in g["reasons"][0]["detail"]


# --------------------------------------------------------------------------- token level


def _tiny_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "the": 1, "cat": 2, "sat": 3, "on": 4, "mat": 5, "dog": 6, "a": 7}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")
    out = tmp_path / "tok"
    fast.save_pretrained(str(out))
    return out


def test_token_level_metrics_with_tiny_tokenizer(tmp_path):
    tok_dir = _tiny_tokenizer(tmp_path)
    a = cap({"p": "the cat sat on the mat", "e": ""}, dep="a")
    b = cap({"p": "the cat sat on a dog", "e": ""}, dep="b")
    c = gate.compare_captures(a, b, tokenizer=str(tok_dir))
    schemas.validate(c, "comparison", "<test>")
    t = row(c, "p")["token_level"]
    assert t == {"tokens_a": 6, "tokens_b": 6, "common_prefix_tokens": 4, "common_prefix_token_fraction": 4 / 6,
                 "token_edit_distance": 2, "normalized_token_edit_distance": 2 / 6}
    assert row(c, "e")["token_level"]["common_prefix_token_fraction"] == 1.0
    assert c["worst_case"]["min_common_prefix_tokens"] == 0
    assert c["worst_case"]["max_normalized_token_edit_distance"] == pytest.approx(1 / 3)
    assert c["tokenizer"] == str(tok_dir)
    # char level is still what the client observes
    assert row(c, "p")["common_prefix_chars"] == len("the cat sat on ")


# --------------------------------------------------------------------------- capture


def test_capture_greedy_uses_closed_loop_concurrency_1(tmp_path, monkeypatch):
    from specstudy.measure import loadgen

    calls = {}

    def fake_run(base_url, model, requests, concurrency, **kw):
        calls.update(base_url=base_url, model=model, n=len(requests), concurrency=concurrency, **kw)
        rows = []
        for i, r in enumerate(requests):
            ok = r.prompt_id != "bad"
            rows.append({"request_index": i, "prompt_id": r.prompt_id, "success": ok,
                         "output_text": f"out {r.prompt_id}" if ok else None,
                         "completion_tokens": 2 if ok else None, "prompt_tokens": 5,
                         "finish_reason": "stop" if ok else None, "status_code": 200 if ok else 500,
                         "error": None if ok else "HTTP 500"})
        return types.SimpleNamespace(rows=rows, client={})

    monkeypatch.setattr(loadgen, "run_closed_loop", fake_run)
    prompts = [{"prompt_id": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
               {"prompt_id": "bad", "messages": [{"role": "user", "content": "x"}], "max_tokens": 16}]
    out = tmp_path / "smoke" / "capture-1.json"
    rec = greedy_capture.capture_greedy("http://127.0.0.1:1", "m", prompts, out, deployment_id="d1", arm="baseline",
                                        capture_index=1, corpus={"name": "c", "version": "1", "digest": "abc"}, seed=7,
                                        api_key="secret")
    assert calls["concurrency"] == 1 and calls["keep_text"] is True and calls["temperature"] == 0.0
    assert calls["seed"] == 7 and calls["api_key"] == "secret" and calls["n"] == 2
    on_disk = json.loads(out.read_text())
    assert on_disk == rec and "secret" not in out.read_text()
    schemas.validate(on_disk, "greedy-capture", out)
    assert on_disk["sampling"] == {"temperature": 0.0, "seed": 7, "max_tokens": 16}
    assert on_disk["prompts"][0]["output_sha256"] == hashlib.sha256(b"out a").hexdigest()
    assert on_disk["prompts"][1]["success"] is False and on_disk["prompts"][1]["error"] == "HTTP 500"
    assert not list(out.parent.glob("*.tmp"))


# --------------------------------------------------------------------------- CLI


def test_cli_compare_and_judge(tmp_path, capsys):
    from specstudy import cli

    base1, base2, spec1 = _arms()
    paths = {}
    for name, rec in (("b1", base1), ("b2", base2), ("s1", spec1)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(rec))
    out = tmp_path / "cmp.json"
    assert cli.main(["gate", "compare", str(paths["b1"]), str(paths["s1"]), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["worst_case"]["exact_matches"] == 2
    gout = tmp_path / "gates" / "screen" / "draft-k3-tp1.json"
    rc = cli.main(["gate", "judge", "--baseline", str(paths["b1"]), "--candidate", str(paths["s1"]),
                   "--control-a", str(paths["b1"]), "--control-b", str(paths["b2"]),
                   "--margins", json.dumps(MARGINS), "--phase", "screen", "--out", str(gout)])
    assert rc == 0
    g = json.loads(gout.read_text())
    schemas.validate(g, "gate", gout)
    assert g["verdict"] == "pass" and g["phase"] == "screen"
    rc = cli.main(["gate", "judge", "--baseline", str(paths["b1"]), "--candidate", str(paths["s1"]),
                   "--margins", "{not json", "--out", str(gout)])
    assert rc == 2 and "--margins" in capsys.readouterr().err
    assert cli.main(["gate", "compare", str(tmp_path / "nope.json"), str(paths["s1"]), "--out", str(out)]) == 2


# --------------------------------------------------------------------------- upstream agreement


def _up(name):
    return json.loads((UPSTREAM / name).read_text())


def test_upstream_adapter():
    c = gate.load_capture(UPSTREAM / "draft-n3-tp4.json")
    assert c["arm"] == "draft-k3-tp4" and c["capture_index"] == 1
    assert c["deployment_id"].endswith("20260913T152358Z")
    assert [p["prompt_id"] for p in c["prompts"]] == ["chat-001", "chat-002", "code-001", "code-002",
                                                      "summary-001", "summary-002"]
    for p in c["prompts"]:  # the upstream hashes are of the same text we compare
        assert hashlib.sha256(p["output_text"].encode()).hexdigest() == p["output_sha256"]
    assert gate.load_capture(UPSTREAM / "baseline.json")["arm"] == "baseline"


@pytest.mark.parametrize("comparison,a,b", [
    ("comparison.json", "baseline.json", "draft-n3-tp4.json"),
    ("comparison-draft-repeat1-vs-repeat2.json", "draft-n3-tp4.json", "draft-n3-tp4-repeat2.json"),
])
def test_upstream_exact_match_comparisons(comparison, a, b):
    up = _up(comparison)
    ours = gate.compare_captures(gate.load_capture(UPSTREAM / a), gate.load_capture(UPSTREAM / b))
    assert ours["counts"]["exact_matches"] == up["exact_matches"]
    assert {r["prompt_id"]: r["exact_match"] for r in ours["prompts"]} == {
        c["prompt_id"]: c["exact_match"] for c in up["cases"]}


@pytest.mark.parametrize("gate_file,candidate", [
    ("gate-baseline-vs-draft-repeat1.json", "draft-n3-tp4.json"),
    ("gate-baseline-vs-draft-repeat2.json", "draft-n3-tp4-repeat2.json"),
    ("gate2-baseline-vs-draft-repeat1.json", "draft-n3-tp4.json"),
    ("gate2-baseline-vs-draft-repeat2.json", "draft-n3-tp4-repeat2.json"),
])
def test_upstream_gate_worst_cases_and_verdict(gate_file, candidate):
    up = _up(gate_file)
    margins = {"min_common_prefix_fraction": up["tolerance"]["common_prefix_fraction_margin"],
               "max_normalized_edit_distance": up["tolerance"]["normalized_edit_distance_margin"],
               "max_completion_token_difference": up["tolerance"]["completion_token_difference_margin"]}
    g = gate.judge([UPSTREAM / "baseline.json"], [UPSTREAM / candidate], [UPSTREAM / "draft-n3-tp4.json"],
                   [UPSTREAM / "draft-n3-tp4-repeat2.json"], margins)
    tw, cw = g["treatment"]["worst_case"], g["control"]["worst_case"]
    for uk, ok in UP_KEYS.items():
        assert tw[ok] == pytest.approx(up["treatment"]["worst_case"][uk], rel=0, abs=1e-12), uk
        assert cw[ok] == pytest.approx(up["controls"][0]["worst_case"][uk], rel=0, abs=1e-12), uk
    assert tw["exact_matches"] == up["treatment"]["exact_matches"]
    assert cw["exact_matches"] == up["controls"][0]["exact_matches"]
    assert g["verdict"] == "pass" and up["verdict"] == "within_control_envelope"
    if gate_file.startswith("gate-"):  # single control: allowances must agree exactly
        for check in up["checks"]:
            if check["name"] in UP_CHECKS:
                ours = next(c for c in g["checks"] if c["name"] == UP_CHECKS[check["name"]])
                assert ours["allowance"] == pytest.approx(check["allowance"], abs=1e-12)
                assert ours["observed"] == pytest.approx(check["treatment"], abs=1e-12)


def test_upstream_readme_means():
    """README table: mean normalized edit distance 0.081 / 0.104 / 0.147 for the three reproducible pairs."""
    pairs = [("baseline.json", "draft-n3-tp4.json", 0.081), ("baseline.json", "draft-n3-tp4-repeat2.json", 0.104),
             ("draft-n3-tp4.json", "draft-n3-tp4-repeat2.json", 0.147)]
    for a, b, mean in pairs:
        c = gate.compare_captures(gate.load_capture(UPSTREAM / a), gate.load_capture(UPSTREAM / b))
        assert round(c["distribution"]["normalized_edit_distance"]["mean"], 3) == mean


@pytest.mark.parametrize("name", ["comparison-ngram-repeat2.json", "comparison-ngram-repeat1-vs-repeat2.json"])
def test_upstream_aggregation_of_their_per_prompt_values(name):
    """The n-gram captures were not copied; check our aggregation on their per-prompt divergence values."""
    up = _up(name)
    rows = []
    for case in up["cases"]:
        d = case["divergence"]
        rows.append({"exact_match": d["exact_match"], "common_prefix_chars": d["common_prefix_characters"],
                     "common_prefix_fraction": d["common_prefix_fraction"],
                     "normalized_edit_distance": d["normalized_edit_distance"],
                     "completion_token_difference": d["completion_token_difference"]})
    worst = gate._worst_from_rows(rows)
    for uk, ok in UP_KEYS.items():
        assert worst[ok] == pytest.approx(up["worst_case"][uk], abs=1e-12)
    assert worst["exact_matches"] == up["exact_matches"]
    for uk, ok in (("common_prefix_characters", "common_prefix_chars"),
                   ("common_prefix_fraction", "common_prefix_fraction"),
                   ("normalized_edit_distance", "normalized_edit_distance"),
                   ("completion_token_difference", "completion_token_difference")):
        st = gate._stat([r[ok] for r in rows])
        assert st["median"] == pytest.approx(up["divergence"][uk]["p50"], abs=1e-12)
        assert st["mean"] == pytest.approx(up["divergence"][uk]["mean"], abs=1e-12)


def test_failed_baseline_repeat_named_once_when_it_is_also_the_control(tmp_path):
    base1, _, spec1 = _arms()
    dep = {"schema": "specstudy.deployment/1", "deployment_id": "b2-x", "status": "failed", "rep": 2,
           "failure": {"stage": "readiness", "reason": "timeout"}, "smoke": {"captures": []}}
    p = tmp_path / "deployment.json"
    p.write_text(json.dumps(dep))
    ok = _dep_record(tmp_path, base1, 1)
    g = gate.judge([ok, str(p)], [spec1], margins=MARGINS, control=[ok, str(p)])
    assert g["verdict"] == "no_verdict"
    assert [r["code"] for r in g["reasons"]].count("deployment_failed") == 1
