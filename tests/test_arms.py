"""Tests for specstudy.core.arms: one naming and parsing of arms."""

from __future__ import annotations

import re

import pytest

from specstudy.core.arms import ARM_PATTERN, ARM_RE, arm_from_upstream_model, arm_name, is_arm_name, parse_arm
from specstudy.study import plan

NAMES = ["baseline", "draft-k1-tp1", "draft-k3-tp4", "draft-k12-tp2", "ngram-k3", "ngram-k10",
         "ngram_gpu-k3", "suffix-k8", "eagle-k3", "eagle3-k2"]


@pytest.mark.parametrize("name", NAMES)
def test_parse_then_name_round_trips(name):
    spec = parse_arm(name)
    assert spec["name"] == name
    assert arm_name(spec) == name
    assert is_arm_name(name)
    assert re.fullmatch(ARM_PATTERN, name) and ARM_RE.match(name)


def test_parse_gives_the_fields_of_the_method():
    assert parse_arm("baseline") == {"name": "baseline", "method": "baseline"}
    assert parse_arm("draft-k3-tp4") == {"name": "draft-k3-tp4", "method": "draft_model", "num_speculative_tokens": 3,
                                         "draft_tensor_parallel_size": 4}
    assert parse_arm("ngram-k5") == {"name": "ngram-k5", "method": "ngram", "num_speculative_tokens": 5}


@pytest.mark.parametrize("bad", ["", "draft-k3", "ngram-k", "draft-k3-tp4-x", "Baseline", "medusa-k3", "ngram-n3"])
def test_not_an_arm_name(bad):
    assert not is_arm_name(bad)
    assert re.fullmatch(ARM_PATTERN, bad) is None
    with pytest.raises(ValueError, match="not an arm name"):
        parse_arm(bad)


def test_arm_name_refuses_unknown_method():
    with pytest.raises(ValueError, match="method"):
        arm_name({"method": "medusa", "num_speculative_tokens": 3})


def test_upstream_model_names():
    assert arm_from_upstream_model("swiss-ai/apertus/draft-n3-tp4-20250101T000000") == "draft-k3-tp4"
    assert arm_from_upstream_model("apertus-ngram-n5-2025") == "ngram-k5"
    assert arm_from_upstream_model("x/baseline-2025") == "baseline"
    assert arm_from_upstream_model("something-else") == "unknown"
    assert arm_from_upstream_model("") == "unknown"


def test_plan_arms_are_named_by_arms_module():
    cfg = {"arms": {"methods": ["baseline", "draft_model", "ngram"], "num_speculative_tokens": [3, 5],
                    "draft_tensor_parallel_size": [1, 4], "ngram": {"prompt_lookup_min": 2, "prompt_lookup_max": 4}},
           "engine": {"target": {"tensor_parallel_size": 4}}}
    for arm in plan.all_arms(cfg):
        fixed = parse_arm(arm["name"])
        assert {k: arm[k] for k in fixed} == fixed
    assert plan.ARM_PATTERN == ARM_PATTERN  # rules/common.smk reads it from plan


# ------------------------------------------------------------------------------------------ engine builds
@pytest.mark.parametrize("name,engine", [("baseline@v023", "v023"), ("draft-k3-tp1@v026", "v026"),
                                         ("ngram-k3@cpu_b", "cpu_b"), ("draft-k3-tp1+eager-draft@v026", "v026")])
def test_an_arm_of_one_engine_build_names_it_after_the_at(name, engine):
    from specstudy.core.arms import baseline_of, engine_of, is_baseline

    spec = parse_arm(name)
    assert spec["engine"] == engine and arm_name(spec) == name
    assert re.fullmatch(ARM_PATTERN, name) and is_arm_name(name)
    assert engine_of(name) == engine
    assert baseline_of(name) == f"baseline@{engine}"
    assert is_baseline(name) == name.startswith("baseline@")


def test_a_study_of_one_engine_keeps_its_names():
    from specstudy.core.arms import baseline_of, engine_of, is_baseline

    assert "engine" not in parse_arm("draft-k3-tp1")
    assert engine_of("draft-k3-tp1") is None and baseline_of("draft-k3-tp1") == "baseline"
    assert is_baseline("baseline") and not is_baseline("baseline+v1-sync") and not is_baseline("draft-k3-tp1")


@pytest.mark.parametrize("bad", ["baseline@", "baseline@V026", "draft-k3-tp1@v0.26", "baseline@v1@v2", "@v026",
                                 "draft-k3-tp1@v026+x"])
def test_a_malformed_engine_suffix_is_no_arm_name(bad):
    assert not is_arm_name(bad)
    assert re.fullmatch(ARM_PATTERN, bad) is None
