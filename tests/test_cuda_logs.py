"""Confounds of real vLLM 0.23.0 CUDA launch logs (tests/fixtures/launch-logs/cuda/, see its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specstudy.core import schemas
from specstudy.deployment import launchlog

CUDA = Path(__file__).parent / "fixtures" / "launch-logs" / "cuda"


def parsed(name: str) -> dict:
    c = launchlog.parse_launch_log((CUDA / name).read_text(encoding="utf-8", errors="replace"))
    schemas.validate(c, "confounds", name)
    return c


EAGER = ["baseline", "ngram-k3", "ngram_gpu-k3", "draft-k3", "draft-k3-async"]
COMPILED = ["baseline", "ngram-k4", "draft-k2", "draft-k4"]


@pytest.mark.parametrize("name", [f"vllm-0.23.0-cuda-eager-{a}.log" for a in EAGER]
                         + [f"vllm-0.23.0-cuda-compiled-{a}.log" for a in COMPILED])
def test_common_cuda_facts(name):
    c = parsed(name)
    assert c["vllm_version"] == "0.23.0" and c["device"] == "cuda"
    assert c["tensor_parallel_size"] == 1
    assert c["attention_backend"] == {"name": "FLASH_ATTN", "candidates": ["FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"],
                                      "flash_attn_version": 3}
    assert c["kv_cache"]["device"] == "GPU" and c["kv_cache"]["tokens_per_request"] == 1024
    assert c["max_num_batched_tokens"] == 8192
    assert "gpu_worker.py" in c["evidence"]["kv_cache_memory"]
    assert "flash_attn.py" in c["evidence"]["flash_attn_version"]


def test_eager_cuda_logs_async_scheduling_kv_and_loading():
    base, ngram, ngpu, draft, dasync = (parsed(f"vllm-0.23.0-cuda-eager-{a}.log") for a in EAGER)
    # async scheduling: on for the baseline and ngram_gpu, off for ngram/draft_model, on with an explicit --async-scheduling
    assert base["async_scheduling"] == {"enabled": True, "statement": "Asynchronous scheduling is enabled.",
                                        "method": None, "source": "log"}
    assert ngram["async_scheduling"]["enabled"] is False and ngram["async_scheduling"]["method"] == "ngram"
    assert ngpu["async_scheduling"]["enabled"] is True and ngpu["speculative_method"] == "ngram_gpu"
    assert draft["async_scheduling"]["enabled"] is False and draft["async_scheduling"]["method"] == "draft_model"
    assert "'async_scheduling': True" in dasync["non_default_args"]
    assert dasync["async_scheduling"]["enabled"] is True and dasync["speculative_method"] == "draft_model"
    # the draft arm schedules fewer tokens than it batches (the k draft slots per sequence)
    for d in (draft, dasync):
        assert (d["max_num_scheduled_tokens"], d["scheduled_tokens_reduced"]) == (7168, True)
    for c in (base, ngram, ngpu):
        assert c["max_num_scheduled_tokens"] is None and c["scheduled_tokens_reduced"] is None
    # KV cache: the draft model's layers halve the token capacity of the same memory
    assert [c["kv_cache"]["tokens"] for c in (base, ngram, ngpu, draft, dasync)] == \
        [10_908_800, 10_891_600, 10_891_600, 5_444_256, 5_444_256]
    assert [c["kv_cache"]["available_memory_gib"] for c in (base, ngram, draft)] == [41.61, 41.55, 41.54]
    assert base["kv_cache"]["max_concurrency"] == 10653.12 and draft["kv_cache"]["max_concurrency"] == 5316.66
    # model loading: the draft arm loads weights twice (target, then drafter) and reports both in one line
    assert base["model_loading"] == {"memory_gib": 0.01, "seconds": 1.731435, "weights_seconds": 0.01, "weights_loads": 1,
                                     "weights_seconds_each": [0.01], "includes_draft": False}
    assert draft["model_loading"] == {"memory_gib": 0.02, "seconds": 0.270231, "weights_seconds": 0.02,
                                      "weights_loads": 2, "weights_seconds_each": [0.01, 0.01], "includes_draft": True}
    assert ngram["model_loading"]["includes_draft"] is False  # ngram logs "Loading drafter model..." but loads nothing
    assert [c["engine_init_seconds"] for c in (base, ngram, ngpu, draft, dasync)] == [19.83, 4.39, 2.38, 2.25, 2.73]
    # model runner: V2 for the baseline, V1 (gpu_model_runner) where V2 lacks the speculative method
    assert base["model_runner"] == "V2" and "Using V2 Model Runner" in base["evidence"]["model_runner"]
    assert draft["model_runner"] == ngram["model_runner"] == "V1 (gpu_model_runner)"
    for c in (base, ngram, ngpu, draft, dasync):
        assert c["enforce_eager"] is True
        assert c["compilation"] == {"torch_compile": False, "torch_compile_seconds": None, "torch_compile_seconds_each": [],
                                    "engine_init_compilation_seconds": None, "compile_cache": None, "cache_dirs": [],
                                    "cuda_graphs": False, "graph_capture_seconds": None, "graph_capture_memory_gib": None}


def test_compiled_cuda_logs_torch_compile_graph_capture_and_compile_cache():
    base, ngram, d2, d4 = (parsed(f"vllm-0.23.0-cuda-compiled-{a}.log") for a in COMPILED)
    for c in (base, ngram, d2, d4):
        assert c["enforce_eager"] is False and c["prefix_caching"] is False
        assert c["compilation"]["torch_compile"] is True and c["compilation"]["cuda_graphs"] is True
    bc = base["compilation"]
    assert (bc["torch_compile_seconds"], bc["engine_init_compilation_seconds"], bc["compile_cache"]) == (12.0, 12.0, "miss")
    assert (bc["graph_capture_seconds"], bc["graph_capture_memory_gib"]) == (2.0, 0.15)
    assert bc["cache_dirs"] == ["/tmp/vcache/torch_compile_cache/87ea34c6ea/rank_0_0/backbone"]
    assert base["engine_init_seconds"] == 31.17 and base["kv_cache"]["tokens"] == 10_897_440
    assert "monitor.py" in base["evidence"]["torch_compile"] and "Graph capturing" in base["evidence"]["graph_capture"]
    # draft k=2 on a fresh cache: target backbone and draft model are compiled one after the other
    c2 = d2["compilation"]
    assert c2["torch_compile_seconds_each"] == [10.87, 9.75] and c2["torch_compile_seconds"] == 20.62
    assert c2["engine_init_compilation_seconds"] == 20.61 and c2["compile_cache"] == "miss"
    assert [p.rsplit("/", 1)[1] for p in c2["cache_dirs"]] == ["backbone", "draft_model"]
    assert (c2["graph_capture_seconds"], c2["graph_capture_memory_gib"]) == (3.0, 0.10)
    assert d2["model_loading"]["weights_seconds_each"] == [0.05, 0.01] and d2["model_loading"]["includes_draft"] is True
    assert d2["kv_cache"]["tokens"] == 8_675_792 and d2["engine_init_seconds"] == 35.8
    # draft k=4 right after: same compile-cache hash (k does not enter it), loaded from the AOT cache
    c4 = d4["compilation"]
    assert c4["compile_cache"] == "hit" and c4["torch_compile_seconds_each"] == [1.75, 0.43]
    assert c4["engine_init_compilation_seconds"] == 2.17 and d4["engine_init_seconds"] == 18.0
    assert c4["cache_dirs"][0].split("/")[4] == c2["cache_dirs"][0].split("/")[4] == "18cbda005c"
    assert "Directly load the compiled graph(s)" in d4["evidence"]["compile_cache"]
    assert ngram["compilation"]["torch_compile_seconds"] == 9.23 and ngram["async_scheduling"]["enabled"] is False
    assert (d2["max_num_scheduled_tokens"], d4["max_num_scheduled_tokens"], ngram["max_num_scheduled_tokens"]) == \
        (7168, 7168, None)


def test_tp_workers_count_once():
    """The upstream 70B logs (4 TP workers) repeat per-worker lines; TP comes from the engine config line."""
    d3 = launchlog.parse_launch_log((CUDA.parent / "upstream-70b" / "D3-3446273.log").read_text(errors="replace"))
    assert d3["tensor_parallel_size"] == 4 and d3["draft_tensor_parallel_size"] == 4
    synthetic = "\n".join(
        f"(Worker_TP{i} pid={100 + i}) INFO 09-19 21:28:{30 + i} [monitor.py:53] torch.compile took 9.5{i} s in total"
        for i in range(4))
    c = launchlog.parse_launch_log(synthetic)
    assert c["compilation"]["torch_compile_seconds_each"] == [9.5] and c["compilation"]["torch_compile_seconds"] == 9.5


# ------------------------------------------------------------------------------------------ start-up phases
def log_text(name: str) -> str:
    return (CUDA / name).read_text(encoding="utf-8", errors="replace")


def test_startup_phases_of_the_eager_baseline():
    """eager-summary.txt: ready 65.2 s after the probe's launch; readiness seen at 08:55:29 (server started 08:55:28)."""
    ready = "2026-12-01T08:55:29.000Z"
    launch = "2026-12-01T08:54:23.800Z"  # ready - 65.2 s
    s = launchlog.startup_steps(log_text("vllm-0.23.0-cuda-eager-baseline.log"), launch=launch, ready=ready,
                              utc_offsets_s=(0.0,))
    assert s["boundaries"] == {"first_log_line": "12-01 08:54:42", "engine_core": "12-01 08:55:02",
                               "model_loaded": "12-01 08:55:07", "engine_initialized": "12-01 08:55:26"}
    assert s["phases"] == {"import": 18.2, "api_server": 20.0, "engine_start": 3.268565, "weights": 1.731435,
                           "compile": 0.0, "graph_capture": 0.0, "engine_init": 19.0, "ready": 3.0}
    assert s["total_s"] == 65.2 and s["log_clock"] == "utc" and s["resolution_s"] == 1.0 and s["cache"] == "unknown"
    assert sum(s["phases"].values()) == pytest.approx(s["total_s"], abs=1e-6)


def test_startup_phases_of_a_compiled_draft_arm_on_a_cold_cache():
    """compiled-summary.txt: draft k=2 ready after 85.2 s; the server started at 10:13:16."""
    text = "# specstudy launch 2026-12-01T10:11:51.800Z: python -m vllm.entrypoints.openai.api_server ...\n" + \
        log_text("vllm-0.23.0-cuda-compiled-draft-k2.log")
    s = launchlog.startup_steps(text, ready="2026-12-01T10:13:17.000Z", cache="cold", utc_offsets_s=(3600.0, 0.0))
    assert s["launch"] == "2026-12-01T10:11:51.800Z"  # from our launch line
    assert s["log_clock"] == "utc"  # UTC+1 would put the first vLLM line before the launch
    assert s["phases"] == {"import": 20.2, "api_server": 22.0, "engine_start": 4.457692, "weights": 0.542308,
                           "compile": 20.62, "graph_capture": 3.0, "engine_init": 12.38, "ready": 2.0}
    assert s["total_s"] == 85.2 and s["cache"] == "cold"
    assert sum(s["phases"].values()) == pytest.approx(85.2, abs=1e-6)
    # the k=4 arm right after reuses the compiled graphs: compile drops from 20.62 s to 2.18 s
    s4 = launchlog.startup_steps(log_text("vllm-0.23.0-cuda-compiled-draft-k4.log"), cache="warm")
    assert s4["phases"]["compile"] == 2.18 and s4["phases"]["graph_capture"] == 2.0 and s4["cache"] == "warm"
    assert s4["phases"]["import"] is None and s4["total_s"] is None  # no launch/ready given


def test_startup_log_clock_in_local_time_and_unaligned():
    text = log_text("vllm-0.23.0-cuda-eager-baseline.log")
    # the same log written by a server whose local time is UTC+1: our UTC launch is one hour earlier
    s = launchlog.startup_steps(text, launch="2026-12-01T07:54:23.800Z", ready="2026-12-01T07:55:29.000Z",
                              utc_offsets_s=(3600.0, 0.0))
    assert s["log_clock"] == "utc+1h" and s["phases"]["import"] == 18.2 and s["phases"]["ready"] == 3.0
    # a launch time that matches no alignment: the clock-crossing phases are unknown, the log-internal ones stay
    s = launchlog.startup_steps(text, launch="2026-12-01T05:00:00Z", ready="2026-12-01T05:01:05Z", utc_offsets_s=(0.0,))
    assert s["log_clock"] == "unaligned" and s["phases"]["import"] is None and s["phases"]["ready"] is None
    assert s["phases"]["api_server"] == 20.0 and s["total_s"] == 65.0
