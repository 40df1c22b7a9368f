"""Deployment job paths that must not start a server: corpus digest mismatch, everything reused."""

from __future__ import annotations

from pathlib import Path

import pytest

from specstudy.core import atomic
from specstudy.deployment import launch as server_launch
from specstudy.deployment import provenance, readiness
from specstudy.inputs import corpus
from specstudy.job.run import run_deployment
from specstudy.job.spec import engine_flat
from specstudy.measure import prom

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = corpus.build(ROOT / "corpora/embedded/code.yaml", tmp_path / "corpora")
    smoke = corpus.build(ROOT / "corpora/embedded/smoke.yaml", tmp_path / "corpora")

    def no_launch(*a, **k):  # any server start here is a bug
        raise AssertionError("a server was started")

    monkeypatch.setattr(server_launch, "start_server", no_launch)
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
    atomic.write_json(plan, {"schema": "specstudy.plan/1", "phase": "screen", "seed": 1, "design": {},
                             "arms": [spec["arm"]], "skipped": [],
                             "deployments": [{"phase": "screen", "arm": "baseline", "rep": "rep1", "kind": "repeat",
                                              "block": 1, "order": 0, "after": None,
                                              "cells": [{"workload": "code", "concurrency": 1}]}],
                             "corpora": {spec["cells"][0]["corpus_dir"]: {"digest": "0" * 64}}})
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
    from specstudy.measure import cell as cellmod
    from specstudy.measure import greedy_capture

    spec["cells"].append(dict(spec["cells"][0], concurrency=2))
    monkeypatch.setattr(server_launch, "start_server", lambda *a, **k: (_FakeServer(), None))
    monkeypatch.setattr(readiness, "wait_ready", lambda *a, **k: None)
    monkeypatch.setattr(prom, "fetch_kv_cache_config", lambda *a, **k: (None, None))
    monkeypatch.setattr(provenance, "collect_provenance", lambda *a, **k: None)

    def capture(url, served, prompts, path, **k):
        atomic.write_json(path, {"fake": True})

    monkeypatch.setattr(greedy_capture, "capture_greedy", capture)
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

    from specstudy.job import spec as dr

    versions = {"vllm": "0.32.0"}
    monkeypatch.setattr(provenance, "server_software", lambda py: {"python": "3.12", **versions})
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
        return dr.fingerprint(s, cell, "sha256:abc")

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


def test_the_job_spec_comes_from_the_plan_and_the_config(monkeypatch):
    """`specstudy deployment run --plan … --deployment <phase>/<arm>/<rep>`: what runs is the plan's, how the config's."""
    from specstudy.core.errors import UserError
    from specstudy.job.spec import corpus_dirs, deployment_spec
    from specstudy.study import plan as planmod
    from specstudy.study.config import load_config

    monkeypatch.chdir(ROOT)
    cfg = load_config("config/config.yaml")
    p = planmod.make_plan(cfg, "screen")
    for dep in p["deployments"]:
        spec = deployment_spec(p, f"screen/{dep['arm']}/{dep['rep']}", cfg)
        assert spec["arm"] == next(a for a in p["arms"] if a["name"] == dep["arm"])
        assert [(c["workload"], c["concurrency"]) for c in spec["cells"]] == \
            [(c["workload"], c["concurrency"]) for c in dep["cells"]]  # the planned order
        assert [c["corpus_dir"] for c in spec["cells"]] == [corpus_dirs(cfg)[c["workload"]] for c in dep["cells"]]
        assert (spec["kind"], spec["block"], spec["order"], spec["rep"]) == (dep["kind"], dep["block"], dep["order"],
                                                                           dep["rep"])
        assert spec["engine"] == cfg["engine"] and spec["cell_settings"] == cfg["cells"]
        assert spec["smoke_corpus_dir"] == corpus_dirs(cfg)["smoke"]
    workload = next(iter(cfg["corpora"]["workloads"]))
    cap = deployment_spec(p, "capacity/baseline/rep1", dict(cfg, capacity={"enabled": True, "workload": workload}))
    assert cap["kind"] == "capacity" and cap["cells"] == [] and cap["capacity_corpus_dir"] == corpus_dirs(cfg)[workload]
    with pytest.raises(UserError, match="not in the screen plan"):
        deployment_spec(p, "screen/draft-k9-tp1/rep1", cfg)
    with pytest.raises(UserError, match="no deployment baseline/rep99"):
        deployment_spec(p, "screen/baseline/rep99", cfg)
    with pytest.raises(UserError, match="<phase>/<arm>/<rep>"):
        deployment_spec(p, "baseline", cfg)
