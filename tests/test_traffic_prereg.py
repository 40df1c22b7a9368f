"""Traffic mixture and routing live in the pre-registration, locked by its hash (issue 28, item 4)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from specstudy.inference import decision
from specstudy.study.config import ConfigError, check_config, load_config
from specstudy.study.prereg import load_prereg

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ["config/config.yaml", "config/gpu-h200.yaml", "config/gpu-h200x4.yaml", "config/clariden-70b.yaml"]


def _study(tmp_path, mutate=None):
    cfg = load_config(ROOT / "config" / "config.yaml")
    prereg = yaml.safe_load((ROOT / "config" / "preregistration.yaml").read_text())
    if mutate:
        mutate(prereg)
    p = tmp_path / "prereg.yaml"
    p.write_text(yaml.safe_dump(prereg))
    cfg["study"]["preregistration"] = str(p)
    return cfg


@pytest.mark.parametrize("path", SHIPPED)
def test_shipped_studies_declare_traffic_in_their_preregistration(path):
    cfg = load_config(ROOT / path)
    assert not {"traffic_mix", "route_by_workload"} & set(cfg.get("recommendation") or {})
    t = load_prereg(cfg)["traffic"]
    assert t["shares"] == "output_tokens" and t["route_by_workload"] is False
    assert sum(t["mixture"].values()) == pytest.approx(1.0)
    assert set(t["mixture"]) <= set(cfg["corpora"]["workloads"])


@pytest.mark.parametrize("key", ["traffic_mix", "route_by_workload"])
def test_a_config_that_still_sets_traffic_is_refused_naming_the_field(key):
    cfg = load_config(ROOT / "config" / "config.yaml")
    bad = copy.deepcopy(cfg)
    bad["recommendation"][key] = {"code": 1.0} if key == "traffic_mix" else False
    with pytest.raises(ConfigError, match=rf"(?s)study\.yaml.*'recommendation\.{key}'.*pre-registration") as exc:
        check_config(bad, "study.yaml")
    assert decision.MOVED_TO_TRAFFIC[key] in str(exc.value)
    with pytest.raises(decision.DecisionRuleError, match=rf"'recommendation\.{key}'"):
        decision.recommend([], [], bad)


@pytest.mark.parametrize(("mutate", "field", "words"), [
    (lambda p: p.pop("traffic"), "traffic", "required"),
    (lambda p: p["traffic"].update(mixture={"open_chat": 0.5, "code": 0.3, "summarization": 0.3}),
     "traffic.mixture", "sum to 1.1"),
    (lambda p: p["traffic"].update(mixture={"open_chat": 0.5, "chat": 0.5}), "traffic.mixture", "'chat' not a workload"),
    (lambda p: p["traffic"].update(route_by_workload=True), "traffic.mixture", "routed study"),
    (lambda p: p["traffic"].update(mixture=None), "traffic.mixture", "required when"),
    (lambda p: p["traffic"].update(shares="requests"), "traffic.shares", "output_tokens"),
])
def test_bad_traffic_declarations_are_refused_naming_the_field(tmp_path, mutate, field, words):
    with pytest.raises(ConfigError) as exc:
        load_prereg(_study(tmp_path, mutate))
    msg = str(exc.value)
    assert "prereg.yaml" in msg and field.split(".")[-1] in msg and words in msg, msg


def test_the_declared_mixture_is_what_the_recommendation_uses(tmp_path):
    cfg = _study(tmp_path)
    mix = load_prereg(cfg)["traffic"]["mixture"]
    rec = decision.recommend([{"phase": "confirm", "arm": "a", "workload": "code", "concurrency": 1,
                            "repeats": [{"rep": 1, "speedup": 1.2, "arm_otps": 120.0, "base_otps": 100.0}]}], [], cfg,
                          load_prereg(cfg), with_stability=False)
    assert rec["traffic"]["mixture"] == mix and rec["traffic"]["source"] == "pre-registration traffic"
    assert rec["traffic"]["shares"] == "output_tokens" and rec["route_by_workload"] is False


def test_a_routed_study_declares_no_mixture(tmp_path):
    cfg = _study(tmp_path, lambda p: p["traffic"].update(route_by_workload=True, mixture=None))
    assert load_prereg(cfg)["traffic"]["mixture"] is None
    assert decision.traffic_from(load_prereg(cfg), ["code"])["route_by_workload"] is True
