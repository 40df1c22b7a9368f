"""The GPU study config (config/gpu-h200.yaml): valid, sized as documented, and its DAG plans.

No GPU is needed: these check the config and the plan it produces; the GPU path itself is checked
by the `gpu`-marked tests and by the recorded run in docs/gpu.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from specstudy.job.run import request_counts  # noqa: E402
from specstudy.study.config import ConfigError, check_config, load_config  # noqa: E402

GPU_CONFIG = ROOT / "config" / "gpu-h200.yaml"


def test_gpu_config_validates_and_preregisters_confirmation_at_1_8_32():
    cfg = load_config(str(GPU_CONFIG))
    assert cfg["engine"]["target"]["dtype"] == "bfloat16"
    assert cfg["engine"]["server"]["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    prereg = yaml.safe_load((ROOT / cfg["study"]["preregistration"]).read_text())
    assert prereg["confirmation"]["concurrency"] == [1, 8, 32]


def test_request_counts_follow_the_concurrency_level():
    cells = load_config(str(GPU_CONFIG))["cells"]
    assert request_counts(cells, 1) == (8, 2)
    assert request_counts(cells, 8) == (32, 8)
    assert request_counts(cells, 32) == (96, 32)
    # A level the mapping does not name falls back to the flat counts.
    assert request_counts(cells, 4) == (cells["requests"], cells["warmup_requests"])
    assert request_counts({"requests": 12, "warmup_requests": 4}, 32) == (12, 4)


def test_warm_up_by_rule_one_request_per_slot():
    rule = {"requests": 8, "warmup_requests": 1, "warmup_per_slot": 1}
    assert [request_counts(rule, c) for c in (1, 4, 8)] == [(8, 1), (8, 4), (8, 8)]
    assert request_counts(dict(rule, warmup_per_slot=2), 8) == (8, 16)
    assert request_counts(dict(rule, warmup_requests=3), 1) == (8, 3)       # the floor
    assert request_counts(dict(rule, warmup_requests_by_concurrency={"8": 2}), 8) == (8, 2)  # a named level wins


@pytest.mark.parametrize("bad", [{"0": 5}, {"eight": 5}, {"8": 0}])
def test_bad_request_mapping_is_refused_with_the_field_named(bad):
    cfg = yaml.safe_load(GPU_CONFIG.read_text())
    cfg["cells"]["requests_by_concurrency"] = bad
    with pytest.raises(ConfigError, match="requests_by_concurrency"):
        check_config(cfg, str(GPU_CONFIG))


def test_fingerprint_changes_with_the_request_count_of_the_level():
    from specstudy.job.spec import fingerprint as _fingerprint

    cfg = load_config(str(GPU_CONFIG))
    spec = {"arm": {"name": "baseline", "method": "baseline"}, "cell_settings": dict(cfg["cells"]),
            "engine": cfg["engine"]}
    cell = {"workload": "code", "concurrency": 32}
    before = _fingerprint(spec, cell, "d1")
    spec["cell_settings"] = dict(cfg["cells"], requests_by_concurrency={"1": 8, "8": 32, "32": 64})
    assert _fingerprint(spec, cell, "d1") != before


def _dry_run(tmp_path: Path, config: str, *extra: str) -> tuple[str, dict[str, int]]:
    proc = subprocess.run([sys.executable, "-m", "snakemake", "screen", "-n", *extra, "--configfile", config],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line.split() for line in proc.stdout.splitlines()]
    return proc.stdout, {p[0]: int(p[1]) for p in lines if len(p) == 2 and p[1].isdigit()}


def test_gpu_study_dry_run_plans_one_screening_deployment_per_arm(tmp_path):
    from test_workflow_dag import fake_planned, workflow_copy

    workflow_copy(tmp_path)
    out, counts = _dry_run(tmp_path, "config/gpu-h200.yaml", "--cores", "16")
    assert counts.get("plan_screen") == 1 and "deploy_screen" not in counts, counts  # the DAG comes from the plan
    fake_planned(tmp_path, "config/gpu-h200.yaml")
    out, counts = _dry_run(tmp_path, "config/gpu-h200.yaml", "--cores", "16")
    assert counts["deploy_screen"] == 3, out  # baseline, draft-k3-tp1, ngram-k3
    assert not list((tmp_path / "results" / "screen").glob("*/rep*"))  # a dry run measures nothing


# ------------------------------------------------------------------ the 4-GPU topology (issue #19)

GPU_X4 = ROOT / "config" / "gpu-h200x4.yaml"


def test_x4_config_runs_target_tp4_and_attempts_draft_tp1_and_tp4():
    from specstudy.inputs.fixture_models import DRAFT_PRESETS, TARGET
    from specstudy.study import plan as planmod

    cfg = load_config(str(GPU_X4))
    assert cfg["engine"]["target"]["tensor_parallel_size"] == 4
    assert cfg["fixture_models"]["draft_preset"] == "tp4"
    # TP 4 must divide the heads of both fixture models
    for sizes in (TARGET, DRAFT_PRESETS["tp4"]):
        assert sizes["num_attention_heads"] % 4 == 0 and sizes["num_key_value_heads"] % 4 == 0
    assert DRAFT_PRESETS["default"]["num_attention_heads"] % 4 != 0  # why the preset exists
    p = planmod.make_plan(cfg, "screen")
    arms = {d["arm"] for d in p["deployments"]}
    # draft TP 1 is attempted, not declared unservable: its refusal must be the engine's own, as data
    assert {"baseline", "draft-k3-tp1", "draft-k3-tp4", "ngram-k3"} <= arms, arms
    assert not p["skipped"], p["skipped"]


def test_x4_launch_command_carries_tp4_and_the_draft_tp():
    from specstudy.deployment import command
    from specstudy.job.spec import engine_flat

    cfg = load_config(str(GPU_X4))
    eng = engine_flat(cfg["engine"])
    argv = command.build_command(eng, {"name": "draft-k3-tp1", "method": "draft_model", "num_speculative_tokens": 3,
                                      "draft_tensor_parallel_size": 1}, port=8000, served_model_name="m")
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["draft_tensor_parallel_size"] == 1 and spec["method"] == "draft_model"


def test_x4_dry_run_builds_the_tp4_draft_and_four_screening_deployments(tmp_path):
    from test_workflow_dag import fake_planned, workflow_copy

    workflow_copy(tmp_path)
    out, counts = _dry_run(tmp_path, "config/gpu-h200x4.yaml", "-p", "--cores", "64")
    assert counts.get("plan_screen") == 1 and "--draft-preset tp4" in out, counts
    fake_planned(tmp_path, "config/gpu-h200x4.yaml")
    out, counts = _dry_run(tmp_path, "config/gpu-h200x4.yaml", "-p", "--cores", "64")
    assert counts["deploy_screen"] == 4, out
