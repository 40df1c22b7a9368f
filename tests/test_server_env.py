"""The server's environment: NVLS/multicast off (issue #19), the study's shared vLLM cache root (#14)."""

from __future__ import annotations

import json
import sys
import time
import tomllib
from pathlib import Path

import pytest

from specstudy import deploy, deployment_run, schemas

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
PROBE = ["NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "VLLM_CACHE_ROOT", "KEEP_ME"]


def child_env(backend: deploy.LocalProcessBackend, tmp_path: Path) -> tuple[dict, deploy.Server]:
    """Start a real child through the backend that prints the probed variables of its own os.environ."""
    code = f"import json, os; print('ENV=' + json.dumps({{k: os.environ.get(k) for k in {PROBE!r}}}))"
    server = backend.start([sys.executable, "-c", code], log_path=tmp_path / "launch.log", served_model_name="x",
                           port=1, attempt_dir=tmp_path)
    deadline = time.monotonic() + 30
    while server.exited() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    server.stop(grace_s=1)
    lines = [ln for ln in (tmp_path / "launch.log").read_text().splitlines() if ln.startswith("ENV=")]
    assert lines, (tmp_path / "launch.log").read_text()
    return json.loads(lines[0][4:]), server


def test_local_child_gets_multicast_off_even_when_the_job_lacks_or_contradicts_it(tmp_path, monkeypatch):
    for k in MULTICAST_OFF:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("KEEP_ME", "job")
    env, server = child_env(deploy.LocalProcessBackend({"model": "m"}), tmp_path / "a")
    assert {k: env[k] for k in MULTICAST_OFF} == MULTICAST_OFF and env["KEEP_ME"] == "job"
    assert server.launch_info["added_env"] == MULTICAST_OFF
    # a job environment that turns multicast on does not reach the server: only the engine config decides
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env, _ = child_env(deploy.LocalProcessBackend({"model": "m"}), tmp_path / "b")
    assert env["NCCL_NVLS_ENABLE"] == "0"


def test_engine_config_sets_them_explicitly(tmp_path, monkeypatch):
    monkeypatch.delenv("NVSHMEM_DISABLE_NVLS", raising=False)
    backend = deploy.LocalProcessBackend({"model": "m", "env": {"NCCL_NVLS_ENABLE": "1"}})
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
    backend = deploy.make_backend(cfg)
    backend.wrap(["python3", "-m", "x"], tmp_path / "attempt")
    written = tomllib.loads((tmp_path / "attempt" / "environment.toml").read_text())["env"]
    assert written == {"VLLM_CACHE_ROOT": "/scratch/vllm-cache", "NVSHMEM_DISABLE_NVLS": "0", "HF_HUB_OFFLINE": "1",
                       "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0", "NCCL_NVLS_ENABLE": "0"}
    assert backend.added_env() == {"NCCL_NVLS_ENABLE": "0"}
    # the repository's Clariden example EDF + env file get all three
    root = Path(__file__).resolve().parents[1]
    clariden = deploy.make_backend({"model": "/m", "backend": "container", "container": {
        "edf": str(root / "envs" / "clariden-vllm.toml"), "env_file": str(root / "envs" / "clariden-vllm.env")}})
    assert {k: clariden.edf()["env"][k] for k in MULTICAST_OFF} == MULTICAST_OFF


def test_cache_root_is_shared_cold_then_warm_and_recorded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = {"target": {"path": "/m", "max_model_len": 64}, "server": {"cache_root": "results/.vllm-cache"}}
    flat = deployment_run.engine_flat(study)
    assert flat["cache_root"] == "results/.vllm-cache"
    root = tmp_path / "results" / ".vllm-cache"
    env, first = child_env(deploy.LocalProcessBackend(flat), tmp_path / "d1")
    assert env["VLLM_CACHE_ROOT"] == str(root) and root.is_dir()
    assert first.launch_info["compile_cache"] == {"root": str(root), "source": "engine.server.cache_root",
                                                  "state": "cold", "files": 0}
    (root / "torch_compile_cache").mkdir()
    (root / "torch_compile_cache" / "artifact.bin").write_bytes(b"x")  # what a first server leaves behind
    env, second = child_env(deploy.LocalProcessBackend(flat), tmp_path / "d2")
    assert env["VLLM_CACHE_ROOT"] == str(root)
    assert second.launch_info["compile_cache"]["state"] == "warm" and second.launch_info["compile_cache"]["files"] == 1
    prov = deploy.collect_provenance(flat, {"name": "baseline", "method": "baseline"}, deployment_id="d2",
                                     server=second, times=second.times())
    schemas.validate(prov, "provenance", "test")
    assert prov["compile_cache"]["state"] == "warm" and prov["launcher_env"]["VLLM_CACHE_ROOT"] == str(root)
    assert prov["tensor_parallel_size"] == {"target": 1, "draft": None}


def test_cache_root_unset_and_conflicts():
    backend = deploy.LocalProcessBackend({"model": "m"})
    assert "VLLM_CACHE_ROOT" not in backend.added_env()
    state = backend.cache_state({"XDG_CACHE_HOME": "/nonexistent-xdg"})
    assert state == {"root": "/nonexistent-xdg/vllm", "source": "vLLM default", "state": "cold", "files": 0}
    container = deploy.make_backend({"model": "m", "backend": "container", "container": {"image": "/i.sqsh"}})
    assert container.cache_state({})["state"] == "unknown"
    with pytest.raises(deploy.ConfigError, match=r"'server.cache_root' \(/a\) and 'server.env.VLLM_CACHE_ROOT' \(/b\)"):
        deploy.engine_settings({"model": "m", "cache_root": "/a", "env": {"VLLM_CACHE_ROOT": "/b"}})
    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "config.yaml").read_text())
    cfg["engine"].setdefault("server", {})["cache_root"] = "results/.vllm-cache"
    schemas.validate(cfg, "config", "config.yaml + engine.server.cache_root")
