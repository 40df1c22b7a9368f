"""Tests for specstudy.phases.sampling: sampled captures, per-item statistics, the calibrated distribution judge.

Captures are constructed: every (deployment, prompt, seed) output is drawn from a per-prompt word
distribution with ``random.Random`` seeded by a string (deterministic across runs and hash seeds).
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
import yaml

from specstudy.core import records, schemas
from specstudy.phases import sampling_capture, sampling_judge
from specstudy.study import config, prereg
from specstudy.study.prereg import SamplingInputError

ROOT = Path(__file__).resolve().parents[1]
SEEDS = [1000, 1001, 1002, 1003]
N_PROMPTS = 24


def settings(**over) -> dict:
    s = {"temperature": 0.8, "top_p": 1.0, "seeds": {"policy": "same_per_request_across_arms", "base": 1000,
                                                     "per_prompt": 4},
         "control_pairing": "rotated_seed", "test": "mannwhitneyu", "alpha": 0.05, "correction": "bonferroni",
         "margins": {"length_difference": 0.05, "token_tvd": 0.05, "text_similarity": 0.05}, "min_prompts": 20}
    s.update(over)
    return s


def draw(pid: int, key: str, length_factor: float = 1.0) -> list[int]:
    """One sample of prompt ``pid``: length around 30..60 tokens, words from the prompt's skewed vocabulary."""
    rng = random.Random(key)
    mean = 30 + 30 * (pid % 7) / 6
    n = max(1, int(rng.gauss(mean, 8) * length_factor))
    vocab = list(range(pid * 50, pid * 50 + 40))
    weights = [1 / (i + 1) for i in range(len(vocab))]
    return rng.choices(vocab, weights, k=n)


def capture(dep: str, arm: str = "baseline", *, salt: str | None = None, length_factor: float = 1.0,
            n_prompts: int = N_PROMPTS, seeds=SEEDS, ids: bool = False) -> dict:
    """A sampled capture; outputs depend on (salt or dep, prompt, seed): same salt -> identical outputs."""
    rows = []
    for p in range(n_prompts):
        for s in seeds:
            toks = draw(p, f"{salt or dep}/{p}/{s}", length_factor)
            text = " ".join(f"w{t}" for t in toks)
            rows.append({"prompt_id": f"p{p:02d}", "seed": s, "temperature": 0.8, "top_p": 1.0, "max_tokens": 256,
                         "output_text": text, "completion_tokens": len(toks),
                         "completion_token_ids": toks if ids else None, "finish_reason": "stop", "success": True,
                         "error": None})
    return {"schema": sampling_capture.CAPTURE_SCHEMA, "deployment_id": dep, "arm": arm, "capture_index": 1,
            "corpus": {"name": "test", "version": "1", "digest": None},
            "sampling": {"temperature": 0.8, "top_p": 1.0, "seed_policy": "same_per_request_across_arms",
                         "seeds": list(seeds)},
            "prompts": rows}


def baselines(n: int = 2, **kw) -> list[dict]:
    return [capture(f"base-r{i + 1}", **kw) for i in range(n)]


def check(rec: dict, name: str) -> dict:
    return next(c for c in rec["checks"] if c["name"] == name)


# --------------------------------------------------------------------------- per-item statistics


def test_item_statistics_on_known_values():
    assert sampling_judge.length_difference(0, 0) == 0.0
    assert sampling_judge.length_difference(50, 100) == 0.5
    assert sampling_judge.unigram_tvd([], []) == 0.0
    assert sampling_judge.unigram_tvd([1], []) == 1.0
    assert sampling_judge.unigram_tvd([1, 2, 2], [2, 1, 2]) == 0.0  # order does not matter
    assert sampling_judge.unigram_tvd([1, 1], [2, 2]) == 1.0
    assert sampling_judge.unigram_tvd([1, 2], [1, 3]) == pytest.approx(0.5)
    assert sampling_judge.text_similarity("", "") == 1.0
    assert sampling_judge.text_similarity("abc", "") == 0.0
    assert sampling_judge.text_similarity("abcd", "abcx") == pytest.approx(0.75)


def test_rotated_seed_pairs_each_seed_with_the_next():
    a, b = capture("a"), capture("b")
    items = sampling_judge.compare_pair(a, b, pairing="rotated_seed")
    first = [it for it in items if it["prompt_id"] == "p00"]
    assert [(it["seed_a"], it["seed_b"]) for it in first] == [(1000, 1001), (1001, 1002), (1002, 1003), (1003, 1000)]
    same = sampling_judge.compare_pair(a, copy.deepcopy(a), pairing="same_seed")
    assert all(it["text_similarity"] == 1.0 and it["token_tvd"] == 0.0 for it in same)


# --------------------------------------------------------------------------- verdicts


@pytest.mark.parametrize("test", ["mannwhitneyu", "ks_2samp"])
def test_same_distribution_passes(test):
    base = baselines(2)
    cand = [capture(f"cand-r{i + 1}", "draft-k3-tp1") for i in range(2)]  # independent draws, same distribution
    rec = sampling_judge.judge(base, cand, base, settings(test=test), arm="draft-k3-tp1", phase="sampling")
    assert rec["verdict"] == "pass", rec["reasons"]
    assert rec["reasons"] == [] and rec["n_prompts"] == N_PROMPTS
    assert rec["control"]["n_pairs"] == 1 and rec["treatment"]["n_pairs"] == 2
    for s in sampling_judge.STATISTICS:
        c = check(rec, s)
        assert c["passed"] and c["test"] == test and c["alpha"] == pytest.approx(0.05 / 3)
        assert abs(c["effect"]) < 0.05 and c["p_value"] > 0.1  # not a near miss
        # one value per pair x prompt, each the mean over the prompt's 4 seeds
        assert (c["treatment"]["n"], c["control"]["n"]) == (2 * N_PROMPTS, N_PROMPTS)


def test_identical_outputs_pass():
    base = baselines(2)
    cand = copy.deepcopy(base[0])
    cand.update(deployment_id="cand-r1", arm="ngram-k3")
    rec = sampling_judge.judge(base, [cand], base, settings())
    assert rec["verdict"] == "pass"
    assert check(rec, "text_similarity")["treatment"]["mean"] == 1.0


@pytest.mark.parametrize("test", ["mannwhitneyu", "ks_2samp"])
def test_lengths_shifted_beyond_the_control_fail(test):
    base = baselines(2)
    cand = [capture(f"cand-r{i + 1}", "draft-k3-tp1", length_factor=1.6) for i in range(2)]
    rec = sampling_judge.judge(base, cand, base, settings(test=test))
    assert rec["verdict"] == "fail" and rec["blocks_recommendation"]
    c = check(rec, "length_difference")
    assert not c["passed"] and c["significant"] and c["material"]
    assert c["p_value"] < c["alpha"] and c["effect"] > c["margin"]
    assert c["treatment"]["mean"] > c["allowance"] > c["control"]["mean"]
    assert "exceeds_control" in {r["code"] for r in rec["reasons"]}
    assert rec["lengths"]["signed_shift_treatment"]["mean"] > 10 > abs(rec["lengths"]["signed_shift_control"]["mean"])


def test_a_shift_inside_the_margin_passes_even_when_significant():
    base = baselines(2)
    cand = [capture(f"cand-r{i + 1}", "draft-k3-tp1", length_factor=1.6) for i in range(2)]
    rec = sampling_judge.judge(base, cand, base, settings(margins={"length_difference": 0.9, "token_tvd": 0.9,
                                                             "text_similarity": 0.9}))
    c = check(rec, "length_difference")
    assert c["significant"] and not c["material"] and c["passed"]
    assert rec["verdict"] == "pass"


def test_same_seed_control_is_too_strict_when_baselines_reproduce_each_other():
    # Two baselines that reproduce each other under the same seed, a candidate drawing independently from the
    # same distribution (as a rejection sampler may): the rotated-seed control passes it, a same-seed one does not.
    base = [capture("base-r1", salt="shared"), capture("base-r2", salt="shared")]
    cand = [capture("cand-r1", "draft-k3-tp1")]
    assert sampling_judge.judge(base, cand, base, settings())["verdict"] == "pass"
    strict = sampling_judge.judge(base, cand, base, settings(control_pairing="same_seed"))
    assert strict["verdict"] == "fail"
    assert not check(strict, "text_similarity")["passed"]


def test_token_ids_are_the_unit_when_every_capture_has_them():
    base = baselines(2, ids=True)
    cand = [capture("cand-r1", "draft-k3-tp1", ids=True)]
    assert sampling_judge.judge(base, cand, base, settings())["unit"] == "token_id"
    cand_words = [capture("cand-r1", "draft-k3-tp1")]
    assert sampling_judge.judge(base, cand_words, base, settings())["unit"] == "word"


# --------------------------------------------------------------------------- no verdict


def test_no_control_no_verdict():
    base = baselines(2)
    cand = [capture("cand-r1", "draft-k3-tp1", length_factor=1.6)]  # would fail with a control
    for control in ([], [base[0]]):
        rec = sampling_judge.judge(base, cand, control, settings())
        assert rec["verdict"] == "no_verdict" and not rec["blocks_recommendation"]
        assert [r["code"] for r in rec["reasons"]] == ["no_control"]
        assert rec["checks"] == []


def test_mixed_control_too_few_prompts_and_mismatched_parameters_give_no_verdict():
    base = baselines(2)
    cand = [capture("cand-r1", "draft-k3-tp1")]
    mixed = sampling_judge.judge(base, cand, [base[0], cand[0]], settings())
    assert "control_mixed_arms" in {r["code"] for r in mixed["reasons"]} and mixed["verdict"] == "no_verdict"
    few = sampling_judge.judge(base, cand, base, settings(min_prompts=N_PROMPTS + 1))
    assert [r["code"] for r in few["reasons"]] == ["too_few_prompts"]
    bad = copy.deepcopy(cand[0])
    bad["prompts"][3]["top_p"] = 0.9
    rec = sampling_judge.judge(base, [bad], base, settings())
    assert rec["verdict"] == "no_verdict" and "parameters_mismatch" in {r["code"] for r in rec["reasons"]}
    other_seeds = capture("cand-r1", "draft-k3-tp1", seeds=[7, 8, 9, 10])
    rec = sampling_judge.judge(base, [other_seeds], base, settings())
    assert {"missing_items", "parameters_mismatch"} <= {r["code"] for r in rec["reasons"]}
    assert rec["verdict"] == "no_verdict"
    shifted = settings(seeds={"policy": "same_per_request_across_arms", "base": 2000, "per_prompt": 4})
    rec = sampling_judge.judge(base, cand, base, shifted)  # every arm the same, but not the declared seeds
    assert [r["code"] for r in rec["reasons"]] == ["parameters_mismatch"] and "seeds.base" in rec["reasons"][0]["detail"]


def test_a_failed_request_fails_and_a_failed_control_request_gives_no_verdict():
    base = baselines(2)
    cand = capture("cand-r1", "draft-k3-tp1")
    cand["prompts"][0].update(success=False, error="HTTP 500", output_text=None)
    rec = sampling_judge.judge(base, [cand], base, settings())
    assert rec["verdict"] == "fail" and not check(rec, "all_requests_succeeded")["passed"]
    broken = copy.deepcopy(base)
    broken[1]["prompts"][0].update(success=False, error="HTTP 500")
    rec = sampling_judge.judge(broken, [capture("cand-r1", "draft-k3-tp1")], broken, settings())
    assert rec["verdict"] == "no_verdict" and "control_incomplete" in {r["code"] for r in rec["reasons"]}


# --------------------------------------------------------------------------- bad input


def test_a_missing_field_names_the_file_and_field(tmp_path):
    cap = capture("cand-r1", "draft-k3-tp1")
    del cap["prompts"][0]["seed"]
    p = tmp_path / "capture-1.json"
    p.write_text(json.dumps(cap))
    with pytest.raises(SamplingInputError, match=r"capture-1\.json") as exc:
        sampling_judge.judge(baselines(2), [str(p)], baselines(2), settings())
    assert "field 'prompts.0'" in str(exc.value) and "'seed'" in str(exc.value)


def test_temperature_zero_captures_are_refused_naming_file_and_field(tmp_path):
    cap = capture("cand-r1", "draft-k3-tp1")
    cap["prompts"][0]["temperature"] = 0.0
    p = tmp_path / "capture-t0.json"
    p.write_text(json.dumps(cap))
    with pytest.raises(SamplingInputError, match=r"capture-t0\.json.*\n.*field 'prompts\.0\.temperature'"):
        sampling_capture.load_sampled_capture(p)
    greedy = {"schema": "specstudy.capture/1", "deployment_id": "d", "arm": "baseline", "capture_index": 1}
    g = tmp_path / "greedy.json"
    g.write_text(json.dumps(greedy))
    with pytest.raises(SamplingInputError, match=r"greedy\.json: field 'schema' .*greedy capture \(temperature 0\)"):
        sampling_judge.judge([str(g)], [capture("c", "ngram-k3")], baselines(2), settings())


def test_bad_settings_name_the_field():
    with pytest.raises(SamplingInputError, match=r"field 'sampling\.test'.*allowed: mannwhitneyu, ks_2samp"):
        prereg.check_sampling(settings(test="ttest"), "prereg.yaml")
    with pytest.raises(SamplingInputError, match=r"(?s)prereg\.yaml.*field 'sampling\.seeds\.per_prompt'"):
        prereg.check_sampling(settings(seeds={"policy": "same_per_request_across_arms", "base": 0,
                                                   "per_prompt": 1}), "prereg.yaml")
    with pytest.raises(SamplingInputError, match=r"field 'sampling': 'margins' is a required property"):
        prereg.check_sampling({k: v for k, v in settings().items() if k != "margins"})


# --------------------------------------------------------------------------- pre-registration and records


def _prereg(tmp_path: Path, mutate) -> dict:
    pr = yaml.safe_load((ROOT / "config/preregistration.yaml").read_text())
    mutate(pr)
    p = tmp_path / "prereg.yaml"
    p.write_text(yaml.safe_dump(pr))
    return {"study": {"preregistration": str(p)}}


def test_every_preregistration_validates_and_the_default_declares_sampling():
    for path in sorted((ROOT / "config").glob("preregistration*.yaml")):
        data = prereg.load_prereg({"study": {"preregistration": str(path)}})
        if path.name == "preregistration.yaml":
            assert prereg.check_sampling(data["sampling"]) is data["sampling"]
            assert data["sampling"]["temperature"] == 0.8 and data["sampling"]["test"] in sampling_judge.TESTS


def test_a_bad_sampling_section_names_the_file_and_field(tmp_path):
    def zero(pr):
        pr["sampling"]["temperature"] = 0

    with pytest.raises(config.ConfigError, match=r"prereg\.yaml.*\n.*field 'sampling\.temperature'"):
        prereg.load_prereg(_prereg(tmp_path, zero))

    def one_seed(pr):
        pr["sampling"]["seeds"]["per_prompt"] = 1

    with pytest.raises(config.ConfigError, match=r"prereg\.yaml.*\n.*field 'sampling\.seeds\.per_prompt'.*rotated_seed"):
        prereg.load_prereg(_prereg(tmp_path, one_seed))

    def without(pr):
        del pr["sampling"]

    assert "sampling" not in prereg.load_prereg(_prereg(tmp_path, without))  # optional


def test_the_record_validates_and_reads_back_typed(tmp_path):
    base = baselines(2)
    rec = sampling_judge.judge(base, [capture("cand-r1", "draft-k3-tp1", length_factor=1.6)], base, settings(),
                         arm="draft-k3-tp1", phase="sampling")
    schemas.validate(rec, "sampling-gate")
    p = tmp_path / "draft-k3-tp1.json"
    p.write_text(json.dumps(rec))
    typed = records.read_sampling_gate(p)
    assert typed.verdict == "fail" and typed.arm == "draft-k3-tp1"
    ld = next(c for c in typed.checks if c.name == "length_difference")
    assert ld.treatment is not None and ld.treatment.n == N_PROMPTS and ld.passed is False
