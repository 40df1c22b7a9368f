"""Fixture models: deterministic from the seed, one shared tokenizer, a draft that agrees with the target."""

from __future__ import annotations

import json
from pathlib import Path

from specstudy.inputs import fixture_models as fm


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
