"""The server's environment: NVLS/multicast off (issue #19), the study's shared vLLM cache root (#14)."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

from specstudy.core import schemas
from specstudy.deployment import command, provenance
from specstudy.deployment import launch as server_launch
from specstudy.job import run as deployment_run
from specstudy.job.spec import engine_flat
from specstudy.study import config

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
PROBE = ["NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "VLLM_CACHE_ROOT", "KEEP_ME"]


def child_env(backend: server_launch.LocalProcessBackend, tmp_path: Path) -> tuple[dict, server_launch.Server]:
    """Start a real child through the backend that prints the probed variables of its own os.environ."""
    code = f"import json, os; print('ENV=' + json.dumps({{k: os.environ.get(k) for k in {PROBE!r}}}))"
    server = backend.start([sys.executable, "-c", code], log_path=tmp_path / "launch.log", served_model_name="x",
                           port=1, attempt_dir=tmp_path)
    try:
        server.proc.wait(timeout=30)  # the child prints and exits; still running at the deadline fails the test
    finally:
        server.stop(grace_s=1)  # joins the log pump: the log is complete below
    lines = [ln for ln in (tmp_path / "launch.log").read_text().splitlines() if ln.startswith("ENV=")]
    assert lines, (tmp_path / "launch.log").read_text()
    return json.loads(lines[0][4:]), server


def test_local_child_gets_multicast_off_even_when_the_job_lacks_or_contradicts_it(tmp_path, monkeypatch):
    for k in MULTICAST_OFF:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("KEEP_ME", "job")
    env, server = child_env(server_launch.LocalProcessBackend({"model": "m"}), tmp_path / "a")
    assert {k: env[k] for k in MULTICAST_OFF} == MULTICAST_OFF and env["KEEP_ME"] == "job"
    assert server.launch_info["added_env"] == MULTICAST_OFF
    # a job environment that turns multicast on does not reach the server: only the engine config decides
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env, _ = child_env(server_launch.LocalProcessBackend({"model": "m"}), tmp_path / "b")
    assert env["NCCL_NVLS_ENABLE"] == "0"


def test_engine_config_sets_them_explicitly(tmp_path, monkeypatch):
    monkeypatch.delenv("NVSHMEM_DISABLE_NVLS", raising=False)
    backend = server_launch.LocalProcessBackend({"model": "m", "env": {"NCCL_NVLS_ENABLE": "1"}})
    env, server = child_env(backend, tmp_path)
    assert env["NCCL_NVLS_ENABLE"] == "1" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert "NCCL_NVLS_ENABLE" not in server.launch_info["added_env"]


def test_container_edf_carries_multicast_off_unless_configured(tmp_path):
    env_file = tmp_path / "c.env"
    env_file.write_text("NVSHMEM_DISABLE_NVLS=0\nHF_HUB_OFFLINE=1\n")
    edf = tmp_path / "base.toml"
    edf.write_text('image = "/i.sqsh"\n\n[env]\nVLLM_CACHE_ROOT = "/scratch/vllm-cache"\n')
    cfg = {"model": "/m", "backend": "container", "env": {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"},
           "container": {"edf": str(edf), "env_file": str(env_file)}}
    backend = server_launch.make_backend(cfg)
    backend.wrap(["python3", "-m", "x"], tmp_path / "attempt")
    written = tomllib.loads((tmp_path / "attempt" / "environment.toml").read_text())["env"]
    assert written == {"VLLM_CACHE_ROOT": "/scratch/vllm-cache", "NVSHMEM_DISABLE_NVLS": "0", "HF_HUB_OFFLINE": "1",
                       "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0", "NCCL_NVLS_ENABLE": "0"}
    assert backend.added_env() == {"NCCL_NVLS_ENABLE": "0"}
    # the repository's Clariden example EDF + env file get all three
    root = Path(__file__).resolve().parents[1]
    clariden = server_launch.make_backend({"model": "/m", "backend": "container", "container": {
        "edf": str(root / "envs" / "clariden-vllm.toml"), "env_file": str(root / "envs" / "clariden-vllm.env")}})
    assert {k: clariden.edf()["env"][k] for k in MULTICAST_OFF} == MULTICAST_OFF


def test_cache_root_is_shared_cold_then_warm_and_recorded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = {"target": {"path": "/m", "max_model_len": 64}, "server": {"cache_root": "results/.vllm-cache"}}
    flat = engine_flat(study)
    assert flat["cache_root"] == "results/.vllm-cache"
    root = tmp_path / "results" / ".vllm-cache"
    env, first = child_env(server_launch.LocalProcessBackend(flat), tmp_path / "d1")
    assert env["VLLM_CACHE_ROOT"] == str(root) and root.is_dir()
    assert first.launch_info["compile_cache"] == {"root": str(root), "source": "engine.server.cache_root",
                                                  "state": "cold", "files": 0}
    (root / "torch_compile_cache").mkdir()
    (root / "torch_compile_cache" / "artifact.bin").write_bytes(b"x")  # what a first server leaves behind
    env, second = child_env(server_launch.LocalProcessBackend(flat), tmp_path / "d2")
    assert env["VLLM_CACHE_ROOT"] == str(root)
    assert second.launch_info["compile_cache"]["state"] == "warm" and second.launch_info["compile_cache"]["files"] == 1
    prov = provenance.collect_provenance(flat, {"name": "baseline", "method": "baseline"}, deployment_id="d2",
                                     server=second, times=second.times())
    schemas.validate(prov, "provenance", "test")
    assert prov["compile_cache"]["state"] == "warm" and prov["launcher_env"]["VLLM_CACHE_ROOT"] == str(root)
    assert prov["tensor_parallel_size"] == {"target": 1, "draft": None}


def test_cache_root_unset_and_conflicts():
    backend = server_launch.LocalProcessBackend({"model": "m"})
    assert "VLLM_CACHE_ROOT" not in backend.added_env()
    state = backend.cache_state({"XDG_CACHE_HOME": "/nonexistent-xdg"})
    assert state == {"root": "/nonexistent-xdg/vllm", "source": "vLLM default", "state": "cold", "files": 0}
    container = server_launch.make_backend({"model": "m", "backend": "container", "container": {"image": "/i.sqsh"}})
    assert container.cache_state({})["state"] == "unknown"
    with pytest.raises(config.ConfigError, match=r"'server.cache_root' \(/a\) and 'server.env.VLLM_CACHE_ROOT' \(/b\)"):
        command.engine_settings({"model": "m", "cache_root": "/a", "env": {"VLLM_CACHE_ROOT": "/b"}})
    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "config.yaml").read_text())
    cfg["engine"].setdefault("server", {})["cache_root"] = "results/.vllm-cache"
    schemas.validate(cfg, "config", "config.yaml + engine.server.cache_root")


# ------------------------------------------------------------------------------------------ deployment record
TIMED_SERVER = '''
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
args = sys.argv[1:]
port = int(args[args.index("--port") + 1]); name = args[args.index("--served-model-name") + 1]
def log(proc, msg):  # vLLM's format: local time, MM-DD HH:MM:SS, no year
    print("(%s pid=1) INFO %s [x.py:1] %s" % (proc, time.strftime("%m-%d %H:%M:%S", time.localtime()), msg), flush=True)
time.sleep(1.2)
log("APIServer", "non-default args: {'model': 'm'}")
time.sleep(1.0)
log("EngineCore", "Initializing a V1 LLM engine (v0.23.0) with config: model='m', speculative_config=None, tensor_parallel_size=1, device_config=cuda")
log("EngineCore", "Loading weights took 0.20 seconds")
log("EngineCore", "Model loading took 0.01 GiB memory and 0.300000 seconds")
time.sleep(1.0)
log("EngineCore", "init engine (profile, create kv cache, warmup model) took 1.00 s")
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, obj):
        b = json.dumps(obj).encode(); self.send_response(200); self.send_header("Content-Length", str(len(b)))
        self.end_headers(); self.wfile.write(b)
    def do_GET(self):
        self._send({"data": [{"id": name}]})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send({"choices": [{"message": {"content": "hi"}, "finish_reason": "length"}], "usage": {"completion_tokens": 2}})
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_deployment_record_carries_startup_phases_tp_and_cache_state(tmp_path, monkeypatch):
    from specstudy.job.run import run_deployment
    from specstudy.measure import cell as cellmod
    from test_deploy import fake_captures, job_spec

    monkeypatch.chdir(tmp_path)
    script = tmp_path / "timed_server.py"
    script.write_text(TIMED_SERVER)
    exe = tmp_path / "fakepy"
    exe.write_text(f'#!/bin/sh\nshift 2\nexec "{sys.executable}" "{script}" "$@"\n')
    exe.chmod(0o755)
    fake_captures(monkeypatch)

    def run_cell(base_url, served, reqs, warm, conc, cdir, *, keys, **k):
        summary = {"keys": keys, "validity": {"valid": True, "reasons": []}}
        cdir.mkdir(parents=True, exist_ok=True)
        (cdir / "summary.json").write_text(json.dumps(summary))
        return summary

    monkeypatch.setattr(cellmod, "run_cell", run_cell)
    engine = {"backend": "local", "python": str(exe),
              "target": {"path": str(tmp_path), "served_model_name": "t", "tensor_parallel_size": 4, "max_model_len": 512},
              "draft": {"path": str(tmp_path)},
              "server": {"stop_grace_s": 3, "cache_root": str(tmp_path / "vllm-cache")}}
    arm = {"name": "draft-k3-tp2", "method": "draft_model", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 2}
    out = tmp_path / "results" / "screen" / "draft-k3-tp2" / "rep1"
    assert run_deployment(job_spec(tmp_path, arm, engine), out, results_root=tmp_path / "results") == 0
    rec = json.loads((out / "deployment.json").read_text())
    assert rec["status"] == "ok", rec["failure"]
    st = rec["startup"]
    assert st["cache"] == "cold" and st["log_clock"] is not None and st["log_clock"] != "unaligned"
    launch_log = out / "attempts" / rec["deployment_id"] / "launch.log"
    assert st["launch"] == launch_log.read_text().split()[3].rstrip(":")
    ph = st["phases"]
    assert ph["weights"] == 0.3 and ph["compile"] is None and ph["graph_capture"] is None
    assert 0 <= ph["import"] <= 3.5 and 0 <= ph["api_server"] <= 2 and 0 <= ph["engine_init"] <= 2
    assert st["total_s"] >= 3.0 and sum(v for v in ph.values() if v is not None) == pytest.approx(st["total_s"], abs=1e-6)
    assert rec["tensor_parallel_size"] == {"target": 4, "draft": 2}
    assert rec["provenance"]["tensor_parallel_size"] == {"target": 4, "draft": 2}
    schemas.validate(rec, "deployment", "record with start-up phases")


def test_cell_keys_carry_the_targets_tp():
    from specstudy.measure import cell

    keys = {"phase": "screen", "arm": "draft-k3-tp4", "method": "draft_model", "num_speculative_tokens": 3,
            "draft_tensor_parallel_size": 4, "tensor_parallel_size": 4, "rep": 0, "workload": "open_chat",
            "concurrency": 8, "deployment_id": "d"}
    s = cell.failed_summary(keys, {"name": "c", "version": "1", "digest": "sha256:00"}, "deployment_failed", "x")
    assert s["keys"]["tensor_parallel_size"] == 4 and s["keys"]["draft_tensor_parallel_size"] == 4
    schemas.validate(s, "cell-summary", "failed cell with TP")
    spec = {"arm": {"name": "baseline", "method": "baseline"}, "phase": "screen", "rep": "rep0", "kind": "repeat",
            "engine": {"target": {"path": "/m", "max_model_len": 64, "tensor_parallel_size": 4}}}
    assert deployment_run._keys(spec, {"workload": "code", "concurrency": 2}, "d")["tensor_parallel_size"] == 4
