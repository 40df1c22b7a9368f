"""Starting and stopping one vLLM server: backends, the server handle, the launcher's environment.

:func:`start_server` builds the command (:mod:`.command`), picks the backend (:func:`make_backend`:
:class:`LocalProcessBackend`, a child process in its own process group; or :class:`ContainerBackend`,
the same argument list wrapped in ``srun --environment=<edf.toml>`` on Clariden) and starts it.
``Server.stop()`` sends SIGTERM to the group, waits the grace period, SIGKILLs, and verifies with
psutil that nothing of the group remains.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specstudy.core import atomic
from specstudy.core.timestamps import utc_now
from specstudy.deployment import DeploymentError
from specstudy.deployment.command import build_command, engine_settings, with_variant
from specstudy.deployment.filehash import HashCache
from specstudy.deployment.redaction import redact_argv, redact_text, secret_values
from specstudy.study.config import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[3]

#: Thread-count variables a workflow manager sets for its own jobs; never passed on to the server.
INHERITED_THREAD_VARS = frozenset({"OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                   "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"})

#: Set in every server's environment (local process and container EDF) unless the engine config's ``env``
#: (or the container's EDF / env_file) sets them: NVLink SHARP / multicast off for NCCL, torch symmetric
#: memory and NVSHMEM. Multicast set-up fails or hangs on lent multi-GPU hosts and GH200 nodes whose
#: fabric manager or driver does not offer it (issue #19); a job environment that lacks them is the norm.
SERVER_ENV_DEFAULTS: dict[str, str] = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                       "NVSHMEM_DISABLE_NVLS": "1"}

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
    started_at: str = field(default_factory=utc_now)
    started_monotonic: float = field(default_factory=time.monotonic)
    ready_at: str | None = None
    stopped_at: str | None = None
    stop_report: dict | None = None
    launch_info: dict = field(default_factory=dict)  # environment the launcher added, compile cache at launch
    _reader: threading.Thread | None = None
    _lock_fh: Any = None
    # Re-entrant: a signal handler runs in the main thread between any two of its bytecodes, also inside
    # this thread's own ``stop`` (see :meth:`stop_from_signal`); a plain Lock deadlocks there.
    _stop_lock: threading.RLock = field(default_factory=threading.RLock)
    _stopping: bool = False  # a stop is under way (set under ``_stop_lock``, before any signal is sent)
    _deferred: list = field(default_factory=list)  # exceptions a signal handler left for the running stop

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pgid(self) -> int:
        return self.proc.pid  # process_group=0: the child leads its own process group

    def exited(self) -> int | None:
        return self.proc.poll()

    @property
    def stopping(self) -> bool:
        """A stop was made or is under way (by the job, the idle watchdog, a death watch or a signal handler)."""
        return self.stop_report is not None or self._stopping

    def stop(self, grace_s: float = 30.0, reason: str = "finished") -> dict:
        """SIGTERM to the process group, wait ``grace_s``, SIGKILL; verify nothing of the group remains.

        Idempotent and thread-safe (the idle watchdog, a signal handler and ``finally`` may all call it).
        An exception a signal handler deferred while this stop ran (:meth:`stop_from_signal`) is raised
        once the stop is complete.
        """
        with self._stop_lock:
            if self.stop_report is not None:
                return self.stop_report
            self._stopping = True
            try:
                report = stop_process_group(self.proc, grace_s=grace_s, reason=reason)
                self.stopped_at = utc_now()
                self.stop_report = report
                if self._reader is not None:
                    self._reader.join(timeout=5)
                if self._lock_fh is not None:
                    try:
                        self._lock_fh.close()
                    except OSError:
                        pass
                    self._lock_fh = None
            finally:
                self._stopping = False
        if self._deferred:
            raise self._deferred.pop(0)
        return report

    def stop_from_signal(self, exc: BaseException, *, grace_s: float = 30.0, reason: str = "signal") -> None:
        """Stop the server from a signal handler, then raise ``exc`` (e.g. ``TerminatedBySignal``).

        The handler runs in the main thread, which may be inside :meth:`stop` itself (the job's
        ``finally``, a death watch's stop is another thread's): then the running stop is left to finish
        (signals sent, grace period, SIGKILL, verification) and raises ``exc`` when done; the handler
        returns at once. A stop under way in another thread (idle watchdog) is waited for. Otherwise the
        handler stops the server itself.
        """
        with self._stop_lock:  # re-entrant: never blocks on this thread's own stop
            if self._stopping:
                self._deferred.append(exc)
                return
        self.stop(grace_s=grace_s, reason=reason)
        raise exc

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


def key_env(cfg: dict) -> dict[str, str]:
    """The server's API key as vLLM reads it from its environment (``VLLM_API_KEY``): never on the command line,
    where ``ps`` and the records would show it; never in an EDF file or the provenance's environment."""
    return {"VLLM_API_KEY": str(cfg["api_key"])} if cfg.get("api_key") else {}


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
        env.update(key_env(self.cfg))
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def cache_state(self, env: dict[str, str]) -> dict:
        if self.cfg.get("cache_root"):
            return compile_cache_state(env["VLLM_CACHE_ROOT"], "engine.server.cache_root")
        if env.get("VLLM_CACHE_ROOT"):
            return compile_cache_state(env["VLLM_CACHE_ROOT"], "environment")
        xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return compile_cache_state(os.path.join(xdg, "vllm"), "vLLM default")

    def describe(self, cache: HashCache | None = None) -> dict:
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
        log_fh.write(f"# specstudy launch {utc_now()}: {shlex.join(redact_argv(full, secrets))}\n")
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
        # node's CPUs and GPUs; a nested step without it waits for ever. Without its own GPU and CPU
        # request the step would get one CPU and no GPU of the allocation (step_resources).
        srun = [str(self.container.get("srun", "srun")), "--overlap", f"--environment={edf_path}", "--ntasks=1",
                *self.step_resources(), "--kill-on-bad-exit=1", "--unbuffered"]
        srun += [str(a) for a in self.container.get("srun_args") or []]
        return srun + list(argv)

    def step_resources(self) -> list[str]:
        """The vLLM step's GPUs and CPUs: ``--gpus-per-task`` = ``container.gpus_per_task``, else the
        deployment's tensor-parallel size (the engine's ranks, one GPU each); ``--cpus-per-task`` =
        ``container.cpus_per_task``, else the CPUs Slurm gave the job's step (``SLURM_CPUS_PER_TASK``: the
        profile's ``cpus_per_task``), else no CPU request."""
        gpus = self.container.get("gpus_per_task")
        gpus = int(self.cfg.get("tensor_parallel_size") or 1) if gpus is None else int(gpus)
        cpus = self.container.get("cpus_per_task")
        if cpus is None:
            cpus = os.environ.get("SLURM_CPUS_PER_TASK") or None
        out = [f"--gpus-per-task={gpus}"] if gpus > 0 else []
        if cpus is not None:
            out.append(f"--cpus-per-task={int(cpus)}")
        return out

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
        # the container's env comes from the EDF; srun itself needs the job env (minus its thread counts). The API
        # key goes through srun's environment, which the container inherits, never into the EDF written to results.
        env = {k: v for k, v in os.environ.items() if k not in INHERITED_THREAD_VARS}
        env.update(key_env(self.cfg))
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def cache_state(self, env: dict[str, str]) -> dict:
        root = (self.edf().get("env") or {}).get("VLLM_CACHE_ROOT")
        if self.cfg.get("cache_root"):
            return compile_cache_state(root, "engine.server.cache_root")
        return compile_cache_state(None, f"container ({root or 'vLLM default'}; not inspected from the host)")

    def describe(self, cache: HashCache | None = None) -> dict:
        """What the container deployment runs on, for the provenance: the image (full sha256, once per
        size and mtime through ``cache``), the EDF's mounts and workdir with variables expanded from the
        job's environment as the engine expands them, and every unset variable the EDF names."""
        edf = self.edf()
        env = self.environment()
        cache = cache if cache is not None else HashCache()
        image = image_record(edf.get("image"), env, cache)
        configured = self.container.get("image_digest")
        digest = configured or (f"sha256:{image['image_sha256']}" if image["image_sha256"] else None)
        workdir = expand_edf_value(edf["workdir"], env)[0] if edf.get("workdir") else None
        return {"kind": self.kind, **image, "image_digest": digest, "image_digest_configured": configured,
                "edf": str(self.container.get("edf") or ""), "workdir": workdir,
                "unset_variables": edf_unset_variables(edf, env),
                "mounts": mount_records(edf.get("mounts") or [], env, cache), "env_file": self.container.get("env_file")}


def make_backend(engine_cfg: dict) -> LocalProcessBackend:
    cfg = engine_settings(engine_cfg)
    return ContainerBackend(cfg) if cfg["backend"] == "container" else LocalProcessBackend(cfg)


def _resolve(path: str | os.PathLike) -> Path:
    p = Path(os.path.expandvars(str(path))).expanduser()
    return p if p.is_absolute() else (PROJECT_ROOT / p)


def read_env_file(path: str | os.PathLike) -> dict[str, str]:
    """``KEY=VALUE`` lines (``#`` comments, optional ``export``, optional quotes, ``${VAR}`` expanded from the
    job's environment), read by python-dotenv; a line without a value names the file and the key."""
    from dotenv import dotenv_values
    from dotenv.parser import parse_stream

    file = _resolve(path)
    with open(file, encoding="utf-8") as fh:
        for binding in parse_stream(fh):
            if binding.error or (binding.key and binding.value is None):
                raise ConfigError(f"{path}:{binding.original.line}: expected KEY=VALUE, got "
                                  f"{binding.original.string.strip()!r}")
    return dict(dotenv_values(file, interpolate=True))


def dump_toml(data: dict) -> str:
    """An EDF (TOML) file, written by tomli_w: scalars, lists, tables (nested tables are TOML tables,
    e.g. ``[annotations.com.hooks.aws_ofi_nccl]``, which TOML readers read as the dotted keys of the docs)."""
    import tomli_w

    return tomli_w.dumps(data)


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_server(engine_cfg: dict, arm: dict, *, attempt_dir: str | os.PathLike, served_model_name: str,
                 port: int | None = None) -> tuple[Server, LocalProcessBackend]:
    """build_command + make_backend + start; the log goes to ``<attempt_dir>/launch.log``."""
    cfg = engine_settings(engine_cfg)
    port = int(port or cfg.get("port") or free_port())
    argv = build_command(cfg, arm, port=port, served_model_name=served_model_name)
    backend = make_backend(with_variant(cfg, arm))  # a variant's env joins the server's
    server = backend.start(argv, log_path=Path(attempt_dir) / "launch.log", served_model_name=served_model_name,
                           port=port, attempt_dir=attempt_dir)
    return server, backend


# ---------------------------------------------------------------- what a container deployment mounts
# Variables in an EDF, expanded as the CSCS Container Engine does when it reads the file on the compute
# node (docs.cscs.ch, "EDF reference" -> "Environment variable expansion"; eth-cscs/cscs-docs
# docs/software/container-engine/edf.md): `${VAR}` in every EDF parameter (mounts, workdir, image, env,
# annotations) takes the value of the job's environment; "Referencing an undefined variable results in
# an error", `${VAR:-}` (here `${VAR:-word}`) gives the default instead, and `$$` is a literal `$`. The
# engine's parser evaluates a value as a shell word with `set -u`, so `$VAR` expands as `${VAR}` does.
# Variables the image defines (the engine lets them win) are not visible from the host; paths such as
# `${SCRATCH}` come from the job. An unset variable is left as written and named in the record: the
# engine would refuse that EDF.
_EDF_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def expand_edf_value(text: str, env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """``text`` with its variables expanded from ``env`` (default: this process's environment) as the
    container engine expands an EDF value; also the names of the variables that are unset (left as
    written)."""
    env = os.environ if env is None else env
    unset: list[str] = []

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(3)
        if m.group(2) is not None:  # ${VAR:-word}: the word when VAR is unset or empty
            return env.get(name) or m.group(2)
        if name in env:
            return env[name]
        if name not in unset:
            unset.append(name)
        return m.group(0)

    return _EDF_VAR.sub(sub, str(text)), unset


def edf_unset_variables(edf: dict, env: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Every unset variable an EDF refers to, with the parameters that name it (``mounts[1]``, ``workdir``,
    ``env.HF_HOME`` ...)."""
    out: dict[str, list[str]] = {}

    def walk(value, where: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
        elif isinstance(value, str):
            for name in expand_edf_value(value, env)[1]:
                out.setdefault(name, []).append(where)

    walk(edf, "")
    return out


def mount_records(mounts: list, env: dict[str, str] | None = None, cache: HashCache | None = None) -> list[dict]:
    """One record per EDF mount ``SOURCE:DESTINATION[:FLAGS]``, variables expanded as the engine does:
    the source's ``kind`` (``file``, ``directory``, ``missing``, or ``unset_variable`` when a variable
    it names is unset) and whether it exists. A file's sha256 comes from ``cache`` (read once per
    size and mtime); a directory (the shared model store, ``${SCRATCH}``) is recorded, never walked."""
    cache = cache if cache is not None else HashCache()
    out = []
    for m in mounts:
        spec = str(m)
        expanded, unset = expand_edf_value(spec, env)
        src, _, rest = expanded.partition(":")
        dst, _, flags = rest.partition(":") if rest else (src, "", "")
        entry = {"spec": spec, "src": src, "dst": dst, "flags": flags or None, "exists": False,
                 "kind": "missing", "sha256": None}
        p = Path(src)
        if unset:
            entry.update(kind="unset_variable", unset=unset)
        elif p.is_file():
            h = cache.sha256(p)
            entry.update(kind="file", exists=True, sha256=h["sha256"], size=h["size"], mtime_ns=h["mtime_ns"],
                         hash=h["how"])
        elif p.is_dir():
            entry.update(kind="directory", exists=True)
        out.append(entry)
    return out


def image_record(image: str | None, env: dict[str, str] | None = None, cache: HashCache | None = None) -> dict:
    """The container image as the engine resolves it: a local squashfs file gets its full sha256 (from
    ``cache``: read once per size and mtime), a registry reference only its name."""
    if not image:
        return {"image": None, "image_sha256": None, "image_size": None, "image_mtime_ns": None, "image_hash": None}
    expanded, unset = expand_edf_value(image, env)
    out = {"image": expanded, "image_sha256": None, "image_size": None, "image_mtime_ns": None, "image_hash": None}
    if unset:
        out.update(image_hash="unset variable", image_unset=unset)
    elif Path(expanded).is_file():
        h = (cache if cache is not None else HashCache()).sha256(expanded)
        out.update(image_sha256=h["sha256"], image_size=h["size"], image_mtime_ns=h["mtime_ns"], image_hash=h["how"])
    else:
        out["image_hash"] = "not a local file (registry reference, or absent here)"
    return out


def sha256_file(path: str | os.PathLike, limit: int | None = None) -> str | None:
    """:func:`specstudy.core.atomic.sha256_file`, or None for an unreadable file (provenance records what it can)."""
    try:
        return atomic.sha256_file(path, limit=limit)
    except OSError:
        return None
