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


class _FakeServer:
    pid = pgid = 12345
    base_url = "http://127.0.0.1:9"
    record_command = ["vllm", "serve", "m"]
    secrets = ()

    def exited(self):
        return None

    def stop(self, grace_s=0):
        return {"stopped": True}


def test_a_cell_that_raises_is_recorded_and_the_deployment_goes_on(tmp_path, spec, monkeypatch):
    """Review #16.7: a failing cell used to crash its deployment (no deployment.json, job exit non-zero)."""
    from specstudy import cell as cellmod
    from specstudy import gate

    spec["cells"].append(dict(spec["cells"][0], concurrency=2))
    monkeypatch.setattr(deploy, "launch", lambda *a, **k: (_FakeServer(), None))
    monkeypatch.setattr(deploy, "wait_ready", lambda *a, **k: None)
    monkeypatch.setattr(deploy, "fetch_cache_config", lambda *a, **k: (None, None))
    monkeypatch.setattr(deploy, "collect_provenance", lambda *a, **k: None)

    def capture(url, served, prompts, path, **k):
        atomic.write_json(path, {"fake": True})

    monkeypatch.setattr(gate, "capture_greedy", capture)
    calls = []

    def run_cell(*a, **k):
        calls.append(k["keys"]["concurrency"])
        raise RuntimeError("load generator exploded")

    monkeypatch.setattr(cellmod, "run_cell", run_cell)
    out = tmp_path / "results/screen/baseline/rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    assert calls == [1, 2], "the deployment must go on to the next cell"
    rec = atomic.read_json(out / "deployment.json")
    assert rec["status"] == "ok" and [c["status"] for c in rec["cells"]] == ["cell_error", "cell_error"]
    s = atomic.read_json(out / "code/c1/summary.json")
    assert s["validity"]["reasons"][0]["code"] == "cell_error"
    assert "RuntimeError: load generator exploded" in s["validity"]["reasons"][0]["detail"]


def test_fingerprint_covers_every_setting_that_can_change_a_measurement(tmp_path, spec, monkeypatch):
    """Review #16.6: env, memory utilization, dtype, TP, the draft's identity, the engine version and
    client limits were left out, so a changed setting reused old 'valid' cells."""
    import copy

    from specstudy import deployment_run as dr

    versions = {"vllm": "0.32.0"}
    monkeypatch.setattr(deploy, "server_software", lambda py: {"python": "3.12", **versions})
    draft_dir = tmp_path / "draft"
    draft_dir.mkdir()
    (draft_dir / "config.json").write_text('{"layers": 2}')
    spec["arm"] = {"name": "draft-k2-tp1", "method": "draft_model", "num_speculative_tokens": 2,
                   "draft_tensor_parallel_size": 1}
    spec["engine"]["draft"] = {"path": str(draft_dir)}
    spec["engine"]["server"] = {"stop_grace_s": 1, "gpu_memory_utilization": 0.9, "env": {"A": "1"}}
    spec["cell_settings"]["client_limits"] = {"event_loop_lag_p99_ms": 20}
    cell = spec["cells"][0]

    def fp(s):
        return dr._fingerprint(s, cell, "sha256:abc")

    base = fp(spec)
    assert base == fp(copy.deepcopy(spec))
    changes = {
        "server env": lambda s: s["engine"]["server"]["env"].update(A="2"),
        "gpu memory utilization": lambda s: s["engine"]["server"].update(gpu_memory_utilization=0.8),
        "dtype": lambda s: s["engine"]["target"].update(dtype="bfloat16"),
        "tensor parallel size": lambda s: s["engine"]["target"].update(tensor_parallel_size=4),
        "draft path": lambda s: s["engine"]["draft"].update(path=str(tmp_path / "other")),
        "container image": lambda s: s["engine"].update(backend="container", container={"image": "/img.sqsh"}),
        "client limits": lambda s: s["cell_settings"]["client_limits"].update(event_loop_lag_p99_ms=50),
        "client cpus": lambda s: s["cell_settings"].update(client_cpus=[1]),
    }
    for what, change in changes.items():
        s = copy.deepcopy(spec)
        change(s)
        assert fp(s) != base, f"changing the {what} must change the fingerprint"
    # the draft's content (same path), and the engine version, are part of it too
    (draft_dir / "config.json").write_text('{"layers": 3}')
    assert fp(spec) != base
    (draft_dir / "config.json").write_text('{"layers": 2}')
    assert fp(spec) == base
    versions["vllm"] = "0.33.0"
    assert fp(spec) != base
    versions["vllm"] = "0.32.0"
    # operational settings do not re-measure
    s = copy.deepcopy(spec)
    s["engine"]["server"].update(ready_timeout_s=999, stop_grace_s=99)
    s["cell_settings"]["reuse_valid"] = False
    assert fp(s) == base
