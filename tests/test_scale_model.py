"""Scale models (issue 27): the real fixture pair widened exactly, on CPU with small widened shapes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specstudy import cli
from specstudy.inputs import fixture_models as fm
from specstudy.inputs import scale_model as sm

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "corpora" / "data" / "smoke" / "smoke.jsonl"  # the smoke prompts (id + messages rows)
# Fixture target 256 hidden (4 heads, 4 KV heads, 4 layers) -> 1024 (h'/h = 4), 16 heads in 8 KV groups of 2,
# 6 layers (2 identity layers); fixture draft 128 hidden -> 2048 (h'/h = 16), 32 heads in 8 groups of 4, 3 layers.
SMALL = {
    "target": dict(hidden_size=1024, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=16, num_key_value_heads=8),
    "draft": dict(hidden_size=2048, intermediate_size=512, num_hidden_layers=3, num_attention_heads=32, num_key_value_heads=8),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory, fixture_models):
    out = tmp_path_factory.mktemp("scale") / "scale"
    record = sm.build_scale_models(out, fixture_models["dir"], SMOKE, seed=3, shapes=SMALL, device="cpu",
                                   dtype="float32", greedy_tokens=16, log=lambda *_: None)
    return out, record


def _prompt_count() -> int:
    return sum(1 for line in SMOKE.read_text().splitlines() if line.strip())


def test_widened_pair_computes_the_fixture_function(built):
    out, record = built
    assert record["label"] == "scale model" and record["device"] == "cpu"
    for role in sm.ROLES:
        check = record[role]["check"]
        assert check["passed"] and check["dtype"] == "float32"
        assert check["max_abs_logit_diff"] <= 1e-5
        assert check["prompts"] == _prompt_count() == check["greedy_equal"]
        # the logits compared are the fixture's real ones, not zeros
        assert all(r["max_abs_logit"] > 1.0 for r in check["per_prompt"])
        cfg = json.loads((out / role / "config.json").read_text())
        assert {k: cfg[k] for k in sm.SHAPE_KEYS} == SMALL[role]
        assert cfg["head_dim"] == 64
        ratio = SMALL[role]["hidden_size"] // record[role]["construction"]["fixture_shape"]["hidden_size"]
        assert cfg["rms_norm_eps"] == pytest.approx(1e-5 / ratio, rel=1e-12)
        assert record[role]["parameters"] == sm.count_parameters(SMALL[role], cfg["vocab_size"], 64)
    assert record["target"]["construction"]["identity_layers"] == [4, 5]
    # fixture query head j of KV group j (groups of 1) -> the first head of wide group j (groups of 2)
    assert record["target"]["construction"]["head_map"] == [0, 2, 4, 6]
    assert record["draft"]["construction"]["head_map"] == [0, 4]
    assert record["draft"]["construction"]["norm_weight_divisor"] == 4
    assert sm.verify(out) == []
    assert (out / "target" / "tokenizer.json").read_bytes() == (Path(record["fixture_dir"]) / "target" / "tokenizer.json").read_bytes()


def test_saved_model_reloads_with_the_fixture_function_and_hashes_are_checked(built, fixture_models):
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    out, record = built
    wide = LlamaForCausalLM.from_pretrained(str(out / "target"), dtype=torch.float32).eval()
    small = LlamaForCausalLM.from_pretrained(fixture_models["target"], dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(out / "target"))
    prompts = sm.read_prompts(SMOKE)[:2]
    check = sm.function_check(small, wide, tok, prompts, 8, 1e-5)
    assert check["passed"], check
    # the extra layers really are full-size and random (they cost a full model's bytes), not zeros
    q = wide.model.layers[5].self_attn.q_proj.weight
    assert q.shape == (1024, 1024) and float(q.detach().std()) == pytest.approx(0.02, rel=0.05)
    assert float(wide.model.layers[5].self_attn.o_proj.weight.detach().abs().max()) == 0.0
    # a changed file no longer matches the record
    copy = out.parent / "tampered"
    shutil.copytree(out, copy)
    cfg = json.loads((copy / "draft" / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    (copy / "draft" / "config.json").write_text(json.dumps(cfg))
    assert sm.verify(copy) == [str(copy / "draft" / "config.json")]


def test_same_seed_same_weights_other_seed_other_weights(fixture_models):
    import torch
    from transformers import LlamaForCausalLM

    small = LlamaForCausalLM.from_pretrained(fixture_models["draft"], dtype=torch.float32).eval()
    shape = dict(SMALL["draft"], num_hidden_layers=2)
    a, _ = sm.widen_model(small, shape, 5, "cpu", role="draft")
    b, _ = sm.widen_model(small, shape, 5, "cpu", role="draft")
    c, _ = sm.widen_model(small, shape, 6, "cpu", role="draft")
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.1.self_attn.q_proj.weight"], sc["model.layers.1.self_attn.q_proj.weight"])
    # the fixture's own weights are the same in both: only the random filler depends on the seed
    assert torch.equal(sa["model.layers.0.mlp.down_proj.weight"], sc["model.layers.0.mlp.down_proj.weight"])


def test_missing_fixture_pair_is_refused(tmp_path):
    (tmp_path / "fixture" / "target").mkdir(parents=True)
    with pytest.raises(sm.ScaleModelError, match=r"fixture pair is missing.*specstudy fixture-models --out"):
        sm.build_scale_models(tmp_path / "out", tmp_path / "fixture", SMOKE, shapes=SMALL, device="cpu", log=lambda *_: None)
    assert not (tmp_path / "out").exists()


def test_ratio_not_a_power_of_4_is_refused_before_building(tmp_path, fixture_models, capsys):
    bad = dict(SMALL["target"], hidden_size=512, num_attention_heads=8, num_key_value_heads=4)  # h'/h = 2
    with pytest.raises(sm.ScaleModelError, match=r"scale model target .*512/256 is not a power of 4"):
        sm.build_scale_models(tmp_path / "out", fixture_models["dir"], SMOKE, shapes={"target": bad, "draft": SMALL["draft"]},
                              device="cpu", log=lambda *_: None)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()
    # the CLI says the same in one line, exit 2
    rc = cli.main(["scale-model", "--out", str(tmp_path / "out"), "--fixture", fixture_models["dir"], "--prompts", str(SMOKE),
                   "--target-shape", json.dumps(bad), "--device", "cpu"])
    assert rc == 2 and "not a power of 4" in capsys.readouterr().out


def test_shape_checks_name_the_field_and_fix():
    fixture = dict(fm.TARGET, head_dim=64)
    with pytest.raises(sm.ScaleModelError, match="set num_attention_heads to 16"):
        sm.check_shapes(fixture, dict(SMALL["target"], num_attention_heads=8, num_key_value_heads=8), "target")
    with pytest.raises(sm.ScaleModelError, match="give at least 4 KV heads"):
        sm.check_shapes(fixture, dict(SMALL["target"], num_key_value_heads=2), "target")
    with pytest.raises(sm.ScaleModelError, match="num_hidden_layers 3 is below the fixture's 4"):
        sm.check_shapes(fixture, dict(SMALL["target"], num_hidden_layers=3), "target")
    with pytest.raises(sm.ScaleModelError, match="not a named shape"):
        sm.resolve_shape("llama-70b", "target")
    # the defaults embed the fixture presets: 16x wider, Llama-3-8B / Llama-3.2-1B shapes
    facts = sm.check_shapes(fixture, sm.resolve_shape(None, "target"), "target")
    assert facts["ratio"] == 16 and facts["head_map"] == [0, 4, 8, 12]
    assert sm.count_parameters(sm.SHAPES["llama-3-8b"], 2048, 64) == 6_996_365_312
    assert sm.count_parameters(sm.SHAPES["llama-3.2-1b"], 2048, 64) == 981_534_720
    sm.check_plan({"build": True}, {"target": fixture, "draft": dict(fm.DRAFT, head_dim=64)})
    with pytest.raises(sm.ScaleModelError, match=r"config.yaml: scale_model.draft.shape: .*power of 4"):
        sm.check_plan({"build": True, "draft": {"shape": dict(SMALL["draft"], hidden_size=1024, num_attention_heads=16)}},
                      {"target": fixture, "draft": dict(fm.DRAFT, head_dim=64)}, "config.yaml")


def test_draft_vocabulary_differing_from_the_target_is_refused(tmp_path, fixture_models):
    import torch
    from transformers import LlamaForCausalLM

    fixture = tmp_path / "fixture"
    shutil.copytree(fixture_models["dir"], fixture)
    draft = LlamaForCausalLM.from_pretrained(str(fixture / "draft"), dtype=torch.float32)
    draft.resize_token_embeddings(draft.config.vocab_size + 64)
    shutil.rmtree(fixture / "draft")
    draft.save_pretrained(str(fixture / "draft"))
    with pytest.raises(sm.ScaleModelError, match=r"scale model draft: its vocabulary \(2112 tokens.*differs from the target's \(2048"):
        sm.build_scale_models(tmp_path / "out", fixture, SMOKE, shapes=SMALL, device="cpu", log=lambda *_: None)
    assert not (tmp_path / "out").exists()


def test_failing_function_check_is_refused_and_writes_nothing(tmp_path, fixture_models, monkeypatch):
    real = sm.widen_model

    def broken(small, shape, seed, device, init_std=0.02, role="target"):
        model, construction = real(small, shape, seed, device, init_std, role)
        with __import__("torch").no_grad():  # one fixture weight off by a little: no longer the fixture's function
            model.model.layers[0].mlp.down_proj.weight[0, 0] += 0.05
        return model, construction

    monkeypatch.setattr(sm, "widen_model", broken)
    with pytest.raises(sm.ScaleModelError, match=r"scale model target: function check failed .*refused, nothing written"):
        sm.build_scale_models(tmp_path / "out", fixture_models["dir"], SMOKE, shapes=SMALL, device="cpu", greedy_tokens=4,
                              log=lambda *_: None)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()


def test_build_from_config_follows_the_study_config(tmp_path, fixture_models):
    import yaml

    cfg = yaml.safe_load((ROOT / "config" / "gpu-h200-scale.yaml").read_text())
    cfg["corpora"]["smoke"] = str(ROOT / "corpora" / "embedded" / "smoke.yaml")
    path = tmp_path / "study.yaml"
    cfg["scale_model"]["build"] = False
    path.write_text(yaml.safe_dump(cfg))
    assert not sm.wanted(path) and sm.build_from_config(path, tmp_path / "out", fixture_models["dir"], log=lambda *_: None) is None
    cfg["scale_model"].update(build=True, device="cpu", draft={"shape": dict(SMALL["draft"], hidden_size=1024, num_attention_heads=16)})
    path.write_text(yaml.safe_dump(cfg))
    assert sm.wanted(path)
    # the config's shapes reach the builder: an 8x widening of the draft is refused before any weight is built
    with pytest.raises(sm.ScaleModelError, match=r"scale model draft .*1024/128 is not a power of 4"):
        sm.build_from_config(path, tmp_path / "out", fixture_models["dir"], log=lambda *_: None)
    assert not (tmp_path / "out").exists()
    assert sm.smoke_source(cfg["corpora"]["smoke"]).endswith("corpora/data/smoke/smoke.jsonl")


def test_report_note_labels_the_scale_model_study_from_its_record(built, tmp_path):
    out, record = built
    path = tmp_path / "models" / "scale" / sm.RECORD_NAME
    assert sm.report_note({"scale_model": {"build": False}}, path) is None
    assert "record (" in sm.report_note({"scale_model": {"build": True}}, path)  # says the record is missing
    path.parent.mkdir(parents=True)
    shutil.copy(out / sm.RECORD_NAME, path)
    note = sm.report_note({"scale_model": {"build": True}}, path)
    assert note.startswith("Scale model: the trained fixture pair widened")
    assert f"target {record['target']['parameters']:,} parameters (hidden 1024, 6 layers, 16 heads, 8 KV heads)" in note
    assert f"greedy equal on {_prompt_count()} of {_prompt_count()} smoke prompts" in note


def test_cli_builds_what_the_rule_asks_for(tmp_path, fixture_models, capsys):
    target = dict(hidden_size=1024, intermediate_size=768, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4)
    draft = dict(hidden_size=512, intermediate_size=384, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2)
    out = tmp_path / "scale"
    rc = cli.main(["scale-model", "--out", str(out), "--fixture", fixture_models["dir"], "--prompts", str(SMOKE),
                   "--seed", "9", "--device", "auto", "--dtype", "bfloat16", "--tolerance", "1e-5", "--greedy-tokens", "4",
                   "--target-shape", json.dumps(target), "--draft-shape", json.dumps(draft)])
    assert rc == 0, capsys.readouterr().out
    record = json.loads((out / sm.RECORD_NAME).read_text())
    import torch

    assert record["seed"] == 9 and record["dtype"] == "bfloat16"
    assert record["device"] == ("cuda" if torch.cuda.is_available() else "cpu")  # auto: the GPU where there is one
    assert record["target"]["construction"]["shape"] == target and record["draft"]["construction"]["shape"] == draft
    assert record["target"]["check"]["greedy_tokens"] == 4 and record["target"]["check"]["tolerance"] == 1e-5
    assert json.loads((out / "draft" / "config.json").read_text())["dtype"] == "bfloat16"
    assert sm.verify(out) == []
    # a named shape on the command line is the named shape (as the rule passes it)
    assert sm._shape_arg("llama-3-8b") == "llama-3-8b" and sm._shape_arg('"llama-3.2-1b"') == "llama-3.2-1b"


@pytest.mark.gpu
def test_full_size_scale_pair_builds_on_a_gpu(tmp_path, fixture_models):
    """The default 8B/1B shapes on the GPU (the lease's prebuild): the check holds at full size."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the full-size scale pair is built on the GPU machine only")
    rec = sm.build_scale_models(tmp_path / "scale", fixture_models["dir"], SMOKE, seed=1, device="cuda", dtype="bfloat16")
    assert rec["target"]["parameters"] == 6_996_365_312 and rec["draft"]["parameters"] == 981_534_720
    for role in sm.ROLES:
        assert rec[role]["check"]["max_abs_logit_diff"] <= 1e-4
        assert rec[role]["check"]["greedy_equal"] == rec[role]["check"]["prompts"]
    size = sum(p.stat().st_size for p in (tmp_path / "scale" / "target").glob("*.safetensors"))
    assert 2 * rec["target"]["parameters"] <= size < 2 * rec["target"]["parameters"] + 50_000_000  # bf16 weights
