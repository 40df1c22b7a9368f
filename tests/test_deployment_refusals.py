"""Deployment job paths that must not start a server: corpus digest mismatch, everything reused."""

from __future__ import annotations

from pathlib import Path

import pytest

from specstudy import atomic, corpus, deploy
from specstudy.deployment_run import engine_flat, run_deployment

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = corpus.build(ROOT / "corpora/embedded/code.yaml", tmp_path / "corpora")
    smoke = corpus.build(ROOT / "corpora/embedded/smoke.yaml", tmp_path / "corpora")

    def no_launch(*a, **k):  # any server start here is a bug
        raise AssertionError("a server was started")

    monkeypatch.setattr(deploy, "launch", no_launch)
    return {
        "phase": "screen", "rep": "rep1", "kind": "repeat", "block": 1, "order": 0,
        "arm": {"name": "baseline", "method": "baseline"},
        "cells": [{"workload": "code", "concurrency": 1, "corpus_dir": str(code)}],
        "smoke_corpus_dir": str(smoke),
        "engine": {"backend": "local", "target": {"path": "m", "served_model_name": "t", "tensor_parallel_size": 1,
                                                   "max_model_len": 1024}, "server": {"stop_grace_s": 1}},
        "cell_settings": {"requests": 2, "warmup_requests": 0},
        "study": "t", "seed": 1,
    }


def test_cell_refuses_to_run_when_the_corpus_digest_differs_from_the_plan(tmp_path, spec):
    plan = tmp_path / "plan.json"
    atomic.write_json(plan, {"corpora": {spec["cells"][0]["corpus_dir"]: {"digest": "0" * 64}}})
    out = tmp_path / "results/screen/baseline/rep1"
    assert run_deployment(spec, out, str(plan), results_root=tmp_path / "results") == 0
    cell = atomic.read_json(out / "code/c1/summary.json")
    assert not cell["validity"]["valid"]
    reason = cell["validity"]["reasons"][0]
    assert reason["code"] == "corpus_mismatch" and "0" * 64 in reason["detail"] and "re-run the plan" in reason["detail"]
    assert atomic.read_json(out / "deployment.json")["cells"][0]["status"] == "corpus_mismatch"


def test_engine_config_maps_to_launcher_settings_without_secrets(monkeypatch):
    monkeypatch.setenv("MY_KEY", "s3cret")
    flat = engine_flat({"backend": "local", "target": {"path": "/m", "served_model_name": "x", "tensor_parallel_size": 4,
                                                       "max_model_len": 4096},
                        "draft": {"path": "/d"}, "server": {"api_key_env": "MY_KEY", "extra_args": ["--a"]}})
    assert flat["model"] == "/m" and flat["draft_model"] == "/d" and flat["tensor_parallel_size"] == 4
    assert flat["api_key"] == "s3cret" and flat["extra_args"] == ["--a"]
