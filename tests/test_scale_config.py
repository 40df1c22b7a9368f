"""The scale-model study config (config/gpu-h200-scale.yaml, issue 27): valid, sized as its header says,
and its DAG builds the scale model before any deployment serves it. No GPU needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from specstudy.study import checkconfig  # noqa: E402
from specstudy.study.config import ConfigError, check_config, load_config  # noqa: E402

SCALE_CONFIG = ROOT / "config" / "gpu-h200-scale.yaml"


def test_scale_config_is_the_compiled_bf16_study_on_the_scale_pair_with_three_rounds():
    assert checkconfig.check(SCALE_CONFIG)[0] == str(SCALE_CONFIG)
    cfg = load_config(str(SCALE_CONFIG))
    eng = cfg["engine"]
    assert eng["target"]["path"] == "results/models/scale/target" and eng["draft"]["path"] == "results/models/scale/draft"
    assert eng["target"]["dtype"] == "bfloat16" and eng["server"]["cache_root"]
    args = eng["server"]["extra_args"]
    assert "--enforce-eager" not in args and "--no-enable-prefix-caching" in args
    assert cfg["scale_model"]["build"] and cfg["fixture_models"]["build"]
    assert "scale-model" in cfg["study"]["name"]
    assert set(cfg["arms"]["methods"]) == {"baseline", "draft_model", "ngram"}
    assert cfg["screen"]["concurrency"] == [1, 8]
    prereg = yaml.safe_load((ROOT / cfg["study"]["preregistration"]).read_text())
    assert prereg["confirmation"]["concurrency"] == [1, 8, 32]
    assert prereg["confirmation"]["repeats"] == 3 == prereg["confirmation"]["stopping"]["max_repeats"]
    assert cfg["capacity"]["enabled"] and cfg["capacity"]["search"]["soak"]["count"] >= 1
    assert cfg["recommendation"]["launch_args"][1] == eng["target"]["path"]


@pytest.mark.parametrize("role,shape,match", [
    ("draft", {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 16, "num_attention_heads": 16,
               "num_key_value_heads": 8}, "power of 4"),
    ("target", {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 64,
                "num_key_value_heads": 2}, "KV heads"),
])
def test_a_shape_that_cannot_embed_the_fixture_is_refused_at_check_time(role, shape, match):
    cfg = yaml.safe_load(SCALE_CONFIG.read_text())
    cfg["scale_model"][role] = {"shape": shape}
    with pytest.raises(ConfigError, match=rf"scale_model.{role}.shape: .*{match}"):
        check_config(cfg, str(SCALE_CONFIG))
    cfg = yaml.safe_load(SCALE_CONFIG.read_text())
    cfg["fixture_models"]["build"] = False
    with pytest.raises(ConfigError, match="set fixture_models.build: true"):
        check_config(cfg, str(SCALE_CONFIG))


def test_dry_run_builds_the_scale_model_before_the_screening_deployments(tmp_path):
    from test_gpu_config import _dry_run
    from test_workflow_dag import fake_planned, workflow_copy

    workflow_copy(tmp_path)
    out, counts = _dry_run(tmp_path, "config/gpu-h200-scale.yaml", "--cores", "16")
    assert counts.get("plan_screen") == 1 and "deploy_screen" not in counts, counts
    fake_planned(tmp_path, "config/gpu-h200-scale.yaml")
    out, counts = _dry_run(tmp_path, "config/gpu-h200-scale.yaml", "-p", "--cores", "16")
    assert counts["deploy_screen"] == 5, out  # baseline, draft-k3-tp1, draft-k5-tp1, ngram-k3, ngram-k5
    assert counts["scale_models"] == 1, counts  # an input of every deployment
    assert "specstudy scale-model --out $(dirname results/models/scale/scale.json)" in out
    assert "--target-shape 'llama-3-8b' --draft-shape 'llama-3.2-1b'" in out
