"""A real one-node Slurm cluster for tests (munged + slurmctld + slurmd in a private directory).

Usage from Python::

    from slurm.cluster import LocalSlurm, unavailable_reason

    if (why := unavailable_reason()) is None:
        with LocalSlurm(tmp_dir) as cluster:
            subprocess.run(["sinfo"], env=cluster.env, check=True)

Usage from pytest: see ``tests/slurm/conftest_slurm.py`` (fixtures ``local_slurm`` and ``slurm_env``).

Everything lives in one directory: ``slurm.conf``, the munge key/socket/pid/log, the Slurm state,
spool, pid and log files. The daemons listen on free TCP ports picked at start, and talk to their own
munged through a private socket (``AuthInfo=socket=...``), so the cluster neither needs nor touches
``/etc/slurm``, ``/etc/munge`` or another Slurm running on the same machine. Daemons are stopped by
the PIDs in their pid files (SIGTERM, then SIGKILL after a grace period).

Clients (``sinfo``, ``sbatch``, ``squeue``, ``scancel``, ``srun``, Snakemake's Slurm executor)
find the cluster through ``SLURM_CONF``; ``cluster.env`` is ``os.environ`` plus that variable.

The node looks like one GPU node of the production cluster where the tests need it: four GPUs as
count-only GRES (``gres.conf``: ``AutoDetect=off``, no devices behind them; a job or step asks for
them with ``--gres``/``--gpus-per-task`` and sees ``SLURM_GPUS_ON_NODE``), and ``srun`` understands the
Container Engine's ``--environment=<EDF>`` through a stand-in that refuses what the engine refuses
(``container_srun.py``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("sinfo", "sbatch", "squeue", "scancel", "scontrol", "srun")
#: the ``srun`` wrapper that checks and strips ``--environment=<EDF>`` (the Container Engine's option)
CONTAINER_SRUN = Path(__file__).with_name("container_srun.py")
PACKAGES_HINT = "apt-get install -y slurm-wlm munge (tests/slurm/ensure-slurm-packages.sh does it)"


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for d in ("/usr/sbin", "/sbin", "/usr/local/sbin") if (p := Path(d, name)).exists()), None
    )


def unavailable_reason() -> str | None:
    """Why a local Slurm cannot be started here, or None when it can."""
    missing = [name for name in DAEMONS + CLIENTS if _which(name) is None]
    if missing:
        return f"Slurm/munge programs not installed ({', '.join(missing)}); install with: {PACKAGES_HINT}"
    if os.geteuid() != 0:
        return "a local Slurm needs root here (SlurmUser=root, SlurmdUser=root); run the tests as root"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _mem_total_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("MemTotal missing from /proc/meminfo")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still "exists"; treat it as dead.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return False


class SlurmStartError(RuntimeError):
    pass


class LocalSlurm:
    """A one-node Slurm in ``root``. Start with ``start()`` or ``with LocalSlurm(root) as c:``."""

    def __init__(self, root: str | os.PathLike, *, partition: str = "normal", cpus: int | None = None,
                 mem_mib: int | None = None, gpus: int = 4, start_timeout_s: float = 180.0):
        self.root = Path(root).resolve()
        self.partition = partition
        self.nodename = socket.gethostname().split(".")[0]
        self.cpus = cpus or os.cpu_count() or 1
        self.gpus = gpus  # count-only GPU GRES (no devices): a stand-in for a 4-GPU node
        # "a little under total": leave room for the OS, never below 256 MiB.
        total = _mem_total_mib()
        self.mem_mib = mem_mib or max(256, min(total - 512, int(total * 0.9)))
        self.start_timeout_s = start_timeout_s
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.env: dict[str, str] = {}
        self.ctld_port = self.slurmd_port = 0
        self._pidfiles = {
            "slurmd": self.root / "slurmd.pid",
            "slurmctld": self.root / "slurmctld.pid",
            "munged": self.root / "munge" / "munged.pid",
        }
        self._started = False

    # -- configuration -------------------------------------------------------------------------
    def _write_config(self) -> None:
        (self.root / "state").mkdir(parents=True, exist_ok=True)
        (self.root / "spool").mkdir(parents=True, exist_ok=True)
        self.ctld_port = _free_port()
        self.slurmd_port = _free_port()
        while self.slurmd_port == self.ctld_port:
            self.slurmd_port = _free_port()
        r = self.root
        self.conf.write_text(
            "\n".join([
                "# Written by tests/slurm/cluster.py: one node, no accounting database, no cgroups.",
                "ClusterName=local",
                f"SlurmctldHost={self.nodename}",
                f"SlurmctldPort={self.ctld_port}",
                f"SlurmdPort={self.slurmd_port}",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={self.munge_socket}",
                "SlurmUser=root",
                "SlurmdUser=root",
                f"StateSaveLocation={r}/state",
                f"SlurmdSpoolDir={r}/spool",
                f"SlurmctldPidFile={r}/slurmctld.pid",
                f"SlurmdPidFile={r}/slurmd.pid",
                f"SlurmctldLogFile={r}/slurmctld.log",
                f"SlurmdLogFile={r}/slurmd.log",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "JobCompType=jobcomp/none",
                "SchedulerType=sched/backfill",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core_Memory",
                "ReturnToService=2",
                "MpiDefault=none",
                # Finished jobs stay visible to squeue/scontrol for 5 minutes (Snakemake's squeue
                # status check and the tests rely on it).
                "MinJobAge=300",
                "KillWait=5",
                # Count-only GPUs (gres.conf below): jobs and steps can ask for GPUs as on a GPU
                # partition, and Slurm sets the step's GPU variables, with no device behind them.
                "GresTypes=gpu",
                f"NodeName={self.nodename} CPUs={self.cpus} RealMemory={self.mem_mib} Gres=gpu:{self.gpus} "
                "State=UNKNOWN",
                f"PartitionName={self.partition} Nodes={self.nodename} Default=YES MaxTime=INFINITE State=UP",
                "",
            ])
        )
        # gres.conf is looked up next to slurm.conf. AutoDetect=off: no NVML probing. Slurm 22.05's
        # gres/gpu counts GPUs by their File= lines (a "Count=" line alone registers none and drains
        # the node), so each GPU is a plain file here; nothing opens it. Slurm accounts for them and
        # sets a step's SLURM_GPUS_ON_NODE to the GPUs the step was given.
        dev = self.root / "gpus"
        dev.mkdir(exist_ok=True)
        for i in range(self.gpus):
            (dev / f"gpu{i}").touch()
        (self.root / "gres.conf").write_text(
            "AutoDetect=off\n" + "".join(f"Name=gpu File={dev}/gpu{i}\n" for i in range(self.gpus)))
        # slurm.conf must not be writable by others, and plugstack.conf is looked up next to it.
        (self.root / "plugstack.conf").write_text("")
        # The Slurm job-step executor (snakemake-executor-plugin-slurm-jobstep 0.6.1) removes every
        # SLURM_* variable except the job identity from the environment of its inner ``srun``, so
        # SLURM_CONF does not reach it; a real cluster has /etc/slurm/slurm.conf. Instead of writing
        # that machine-wide file, put ``srun``/``sbatch``/... shims that set SLURM_CONF first on PATH.
        shim_dir = self.root / "bin"
        shim_dir.mkdir(exist_ok=True)
        # ``srun`` also stands in for the Container Engine's --environment=<EDF> (container_srun.py).
        for name in CLIENTS + ("sacct", "sstat"):
            real = _which(name)
            if real:
                shim = shim_dir / name
                run = (f'{sys.executable} {CONTAINER_SRUN} {real}' if name == "srun" else real)
                shim.write_text(f'#!/bin/sh\nSLURM_CONF={self.conf} exec {run} "$@"\n')
                shim.chmod(0o755)
        self.env = dict(os.environ, SLURM_CONF=str(self.conf),
                        PATH=f"{shim_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        for var in ("SLURM_JOB_ID", "SLURM_JOBID", "SBATCH_PARTITION", "SBATCH_ACCOUNT"):
            self.env.pop(var, None)

    # -- daemons ---------------------------------------------------------------------------------
    def _run(self, argv: list[str], what: str) -> None:
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=self.start_timeout_s)
        if proc.returncode != 0:
            raise SlurmStartError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n"
                                  f"{proc.stdout}{proc.stderr}\n{self.logs_tail()}")

    def _start_munge(self) -> None:
        mdir = self.munge_socket.parent
        mdir.mkdir(parents=True, exist_ok=True)
        os.chmod(mdir, 0o700)
        key = mdir / "munge.key"
        if not key.exists():
            self._run([_which("mungekey"), "--create", f"--keyfile={key}"], "mungekey")
        os.chmod(key, 0o600)
        self._run([_which("munged"), "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                   f"--pid-file={self._pidfiles['munged']}", f"--log-file={mdir / 'munged.log'}",
                   f"--seed-file={mdir / 'munged.seed'}"], "munged")
        self._wait_for(lambda: self.munge_socket.exists(), "munged socket", 10)

    def start(self) -> LocalSlurm:
        why = unavailable_reason()
        if why:
            raise SlurmStartError(why)
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._started = True
        try:
            self._start_munge()
            self._run([_which("slurmctld"), "-f", str(self.conf)], "slurmctld")
            self._wait_for(lambda: self._scontrol_ping(), "slurmctld to answer", self.start_timeout_s)
            self._run([_which("slurmd"), "-f", str(self.conf), "-N", self.nodename], "slurmd")
            self._wait_for(lambda: self.node_state() == "idle", f"node {self.nodename} idle in sinfo",
                           self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _scontrol_ping(self) -> bool:
        p = subprocess.run([_which("scontrol"), "ping"], env=self.env, capture_output=True, text=True, timeout=10)
        return p.returncode == 0 and "UP" in p.stdout

    def node_state(self) -> str:
        p = subprocess.run([_which("sinfo"), "-h", "-N", "-n", self.nodename, "-o", "%t"], env=self.env,
                           capture_output=True, text=True, timeout=10)
        return p.stdout.strip().rstrip("*~#$@%!^-") if p.returncode == 0 else ""

    def _wait_for(self, cond, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if cond():
                    return
            except (subprocess.TimeoutExpired, OSError):
                pass
            time.sleep(0.3)
        raise SlurmStartError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.logs_tail()}")

    def logs_tail(self, lines: int = 15) -> str:
        out = []
        for log in (self.root / "slurmctld.log", self.root / "slurmd.log", self.munge_socket.parent / "munged.log"):
            if log.exists():
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {log} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(out)

    def daemon_pids(self) -> dict[str, int]:
        pids = {}
        for name, pidfile in self._pidfiles.items():
            try:
                pids[name] = int(pidfile.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        return pids

    def stop(self, grace_s: float = 10.0) -> None:
        """Cancel remaining jobs, then stop slurmd, slurmctld and munged by their pid files."""
        if not self._started:
            return
        self._started = False
        if self.conf.exists() and (scancel := _which("scancel")):
            try:
                subprocess.run([scancel, "--full", "--partition", self.partition], env=self.env,
                               capture_output=True, timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.daemon_pids().get(name)
            if pid is None or not _pid_alive(pid):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + grace_s
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# -- one cluster per process, shared by every fixture that asks for it -------------------------------
_lock = threading.Lock()
_shared: LocalSlurm | None = None
_users = 0


def acquire(root: str | os.PathLike) -> LocalSlurm:
    """Start the process-wide cluster in ``root`` (or reuse the running one) and count a user."""
    global _shared, _users
    with _lock:
        if _shared is None:
            _shared = LocalSlurm(root).start()
        _users += 1
        return _shared


def release() -> None:
    """Drop one user; the last one stops the cluster."""
    global _shared, _users
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _shared is not None:
            _shared.stop()
            _shared = None
