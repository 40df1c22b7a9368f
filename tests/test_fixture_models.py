"""Fixture models: deterministic from the seed, one shared tokenizer, a draft that agrees with the target, and the
opt-in draft training by the target's own generations (``fixture_models.draft_training``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from specstudy.core.errors import UserError
from specstudy.inputs import fixture_models as fm
from specstudy.study.config import ConfigError, check_config

ROOT = Path(__file__).resolve().parents[1]


def test_rebuild_from_same_seed_is_identical_and_draft_agrees(tmp_path, fixture_models):
    first = json.loads((Path(fixture_models["dir"]) / "models.json").read_text())
    again = fm.build_fixture_models(tmp_path / "again", quick=True, log=lambda *_: None)
    assert again["target"]["weights_sha256"] == first["target"]["weights_sha256"]
    assert again["draft"]["weights_sha256"] == first["draft"]["weights_sha256"]
    assert again["tokenizer_sha256"] == first["tokenizer_sha256"]
    # one tokenizer for both models
    assert (tmp_path / "again" / "target" / "tokenizer.json").read_bytes() == \
        (tmp_path / "again" / "draft" / "tokenizer.json").read_bytes()
    # distillation makes the draft's greedy choice match the target's often, even after a quick build
    assert again["heldout_greedy_agreement"] > 0.3
    cfg = json.loads((tmp_path / "again" / "target" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["head_dim"] == 64


def test_other_seed_gives_other_weights(tmp_path, fixture_models):
    first = json.loads((Path(fixture_models["dir"]) / "models.json").read_text())
    other = fm.build_fixture_models(tmp_path / "other", seed=1, quick=True, log=lambda *_: None)
    assert other["target"]["weights_sha256"] != first["target"]["weights_sha256"]


def test_draft_training_target_generations_changes_the_draft_and_the_record_not_the_target(tmp_path, fixture_models):
    first = json.loads((Path(fixture_models["dir"]) / "models.json").read_text())
    # the default is today's text distillation, also when named
    # (the plan is all the draft training reads; a second quick build to compare weights costs minutes in CI)
    assert first["draft_training"] == {"method": "kl_text", "steps": 30} == fm.draft_training_plan(None, quick=True)
    assert fm.draft_training_plan({"method": "kl_text"}, quick=True) == fm.draft_training_plan(None, quick=True)
    lines = []
    seq = fm.build_fixture_models(tmp_path / "seq", quick=True, log=lines.append,
                                  draft_training={"method": "target_generations", "steps": 12})
    assert seq["draft_training"] == {"method": "target_generations", "steps": 12, "prompts": 24, "new_tokens": 16,
                                     "prompt_tokens": 48}
    assert seq["params"]["draft_steps"] == 12 and "target generations: 24 prompts x 16 tokens" in lines
    # the target trains before the draft, from the same seed: only the draft differs
    assert seq["target"]["weights_sha256"] == first["target"]["weights_sha256"]
    assert seq["draft"]["weights_sha256"] != first["draft"]["weights_sha256"]
    assert json.loads((tmp_path / "seq" / "models.json").read_text())["draft_training"]["method"] == "target_generations"


@pytest.mark.parametrize("spec,field", [
    ({"method": "self_play"}, "fixture_models.draft_training.method"),
    ({"method": "kl_text", "prompts": 8}, "fixture_models.draft_training.prompts"),
    ({"method": "target_generations", "steps": 0}, "fixture_models.draft_training.steps"),
    ({"method": "target_generations", "new_tokens": "64"}, "fixture_models.draft_training.new_tokens"),
    ({"method": "target_generations", "prompt_tokens": 7}, "fixture_models.draft_training.prompt_tokens"),
    ({"method": "target_generations", "new_tokens": 1000}, "fixture_models.draft_training: prompt_tokens + new_tokens"),
])
def test_bad_draft_training_is_refused_naming_the_field(spec, field):
    with pytest.raises(UserError, match=re.escape(field)):
        fm.draft_training_plan(spec)


def test_config_schema_lists_the_draft_training_settings_and_refuses_bad_ones():
    schema = json.loads((ROOT / "config" / "schemas" / "config.schema.json").read_text())
    section = schema["properties"]["fixture_models"]["properties"]["draft_training"]
    assert set(section["properties"]["method"]["enum"]) == set(fm.DRAFT_TRAINING)
    assert set(section["properties"]) - {"method"} == {k for s in fm.DRAFT_TRAINING.values() for k in s}
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    for bad, where in (({"method": "self_play"}, "method"), ({"method": "kl_text", "prompts": 8}, "prompts"),
                       ({"method": "target_generations", "steps": 0}, "steps")):
        cfg["fixture_models"]["draft_training"] = bad
        with pytest.raises(ConfigError, match="draft_training") as exc:
            check_config(cfg, "config.yaml")
        assert where in str(exc.value)
    cfg["fixture_models"]["draft_training"] = {"method": "target_generations", "steps": 600}
    check_config(cfg, "config.yaml")
