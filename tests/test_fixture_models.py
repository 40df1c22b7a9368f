"""Fixture models: deterministic from the seed, one shared tokenizer, a draft that agrees with the target."""

from __future__ import annotations

import json
from pathlib import Path

from specstudy import fixture_models as fm


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


def test_embedded_workloads_never_send_text_the_fixture_models_trained_on(tmp_path):
    """Review #16.11: the embedded workloads were built from the same text the fixture models trained
    on, so the measured acceptance was acceptance on training text. Every prompt now comes from the
    held-out part of its source."""
    from specstudy import corpus

    root = Path(__file__).resolve().parents[1]
    train, held, record = fm.training_documents(root / "corpora" / "data")
    training_text = "\n".join(train)
    assert train and held
    assert set(record["not_trained"]) == {"smoke/smoke.jsonl", "code/reference_solutions.py"}
    for name in ("open_chat", "code", "summarization"):
        spec = root / "corpora" / "embedded" / f"{name}.yaml"
        out = corpus.build(spec, tmp_path / "corpora")
        built = json.loads((out / "corpus.json").read_text())
        source = next(rel for rel in fm.SPLIT_SOURCES if rel.split("/")[0] == name)
        trained_ids = set(record["split_sources"][source]["training"])
        assert not trained_ids & {it["source_id"] for it in built["items"]}, name
        template = json.loads((out / "corpus.json").read_text())["spec"].get("template") or ""
        prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
        seen: dict[str, int] = {}
        for prompt in prompts:
            for x in {x.strip() for m in prompt["messages"] for x in m["content"].splitlines()}:
                seen[x] = seen.get(x, 0) + 1
        for prompt in prompts:
            # every distinctive line (20+ characters, in no other prompt, not the workload's template) of
            # every message; a short message counts whole
            lines = [x.strip() for m in prompt["messages"] for x in m["content"].splitlines()
                     if len(x.strip()) >= 20 and x.strip() not in template and seen[x.strip()] == 1]
            lines = lines or [m["content"].strip() for m in prompt["messages"]]
            assert lines, (name, prompt["prompt_id"])
            leaked = [x for x in lines if x in training_text]
            assert not leaked, (name, prompt["prompt_id"], leaked[:3])


def test_models_record_agreement_on_held_out_and_training_text(fixture_models):
    rec = json.loads((Path(fixture_models["dir"]) / "models.json").read_text())
    assert 0 <= rec["heldout_greedy_agreement"] <= 1 and 0 <= rec["training_greedy_agreement"] <= 1
    assert "never trained on" in rec["heldout_source"]
    assert rec["training_split"]["split_sources"]["code/tasks.jsonl"]["prompts_held_out"]
