"""Snakemake through profiles/slurm-local on a real one-node Slurm (tests/slurm/cluster.py)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from slurm.conftest_slurm import local_slurm, slurm_env  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+) ")


def _copy_profile(tmp_path: Path) -> Path:
    dst = tmp_path / "profile"
    shutil.copytree(REPO / "profiles" / "slurm-local", dst)
    return dst


def _snakemake_argv(tmp_path: Path, profile: Path, *extra: str) -> list[str]:
    return [SNAKEMAKE, "--profile", str(profile), "--directory", str(tmp_path),
            "--snakefile", str(tmp_path / "Snakefile"), *extra]


def _scontrol_job(job_id: str, env: dict) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True,
                         timeout=10)
    assert out.returncode == 0, out.stderr
    return dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)


def _live_processes_with(token: str) -> list[str]:
    """Non-zombie processes whose command line contains token."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if token in cmd and state != "Z":
            found.append(f"{pid} [{state}] {cmd.strip()}")
    return found


def test_fixture_cluster_is_idle_and_runs_srun(local_slurm, slurm_env):  # noqa: F811
    assert Path(slurm_env["SLURM_CONF"]).is_file()
    assert local_slurm.node_state() == "idle"
    out = subprocess.run(["srun", "-N1", "-n1", "printenv", "SLURMD_NODENAME"], env=slurm_env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr + local_slurm.logs_tail()
    assert out.stdout.strip() == local_slurm.nodename


def test_two_rules_become_two_slurm_jobs(tmp_path, local_slurm, slurm_env):  # noqa: F811
    (tmp_path / "Snakefile").write_text(textwrap.dedent("""
        rule all:
            input: "b.txt"

        rule a:
            output: "a.txt"
            shell: "echo job=$SLURM_JOB_ID node=$SLURMD_NODENAME cpus=$SLURM_CPUS_PER_TASK > {output}"

        rule b:
            input: "a.txt"
            output: "b.txt"
            shell: "cat {input} > {output}; echo job=$SLURM_JOB_ID node=$SLURMD_NODENAME >> {output}"
    """))
    profile = _copy_profile(tmp_path)
    proc = subprocess.run(_snakemake_argv(tmp_path, profile), env=slurm_env, capture_output=True, text=True,
                          timeout=240)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log + local_slurm.logs_tail()

    # Rule "all" is a target-only rule and runs locally; a and b are one Slurm job each.
    submitted = SUBMITTED.findall(log)
    assert len(submitted) == 2, log
    slurm_ids = [ext for _, ext in submitted]
    assert len(set(slurm_ids)) == 2

    lines = (tmp_path / "b.txt").read_text().splitlines()
    assert len(lines) == 2
    seen = [dict(kv.split("=", 1) for kv in line.split()) for line in lines]
    assert [s["job"] for s in seen] == slurm_ids            # a first, then b; the IDs Snakemake reported
    assert {s["node"] for s in seen} == {local_slurm.nodename}
    assert seen[0]["cpus"] == "1"                            # default-resources cpus_per_task=1

    # Slurm itself knows both as finished jobs, each with the rule in its comment.
    for (rule, job_id) in zip(("a", "b"), slurm_ids, strict=True):
        info = _scontrol_job(job_id, slurm_env)
        assert info["JobState"] == "COMPLETED", info
        assert info["Comment"] == f"rule_{rule}", info
        assert info["Partition"] == "normal"
    # Nothing of this run is left in the queue.
    q = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=slurm_env, capture_output=True, text=True, timeout=10)
    assert not [ln for ln in q.stdout.splitlines() if ln.split()[0] in slurm_ids and "COMPLETED" not in ln]


def test_scancel_is_a_failure_and_leaves_no_process(tmp_path, local_slurm, slurm_env):  # noqa: F811
    token = f"specstudy-scancel-{uuid.uuid4().hex[:12]}"
    (tmp_path / "Snakefile").write_text(textwrap.dedent(f"""
        rule long:
            output: "long.txt"
            shell:
                \"\"\"
                trap 'echo TERM > got_term; exit 143' TERM
                echo $SLURM_JOB_ID > started
                # the token makes this job's processes findable in /proc
                bash -c 'sleep 300; : {token}' &
                # the shell itself stays busy in short sleeps, so it is alive to run its trap whatever
                # order scancel's signals reach the step's processes in
                for i in $(seq 1500); do sleep 0.2; done
                echo done > {{output}}
                \"\"\"
    """))
    profile = _copy_profile(tmp_path)
    proc = subprocess.Popen(_snakemake_argv(tmp_path, profile), env=slurm_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        started = tmp_path / "started"
        deadline = time.monotonic() + 120
        while not (started.exists() and started.read_text().strip()) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.3)
        assert started.exists(), "the job never started\n" + local_slurm.logs_tail()
        job_id = started.read_text().strip()
        assert _live_processes_with(token), "the job's sleep is not running"

        subprocess.run(["scancel", job_id], env=slurm_env, check=True, timeout=10)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    assert proc.returncode != 0, out
    assert re.search(rf"Error in rule long:|SLURM-job '{job_id}' failed", out), out
    assert re.search(rf"SLURM-job '{job_id}' failed, SLURM status is: 'CANCELLED'", out), out
    assert not (tmp_path / "long.txt").exists()
    assert _scontrol_job(job_id, slurm_env)["JobState"] == "CANCELLED"

    # No process of the job survives: not the sleep, not the job's shell, not a slurmstepd for it. Snakemake
    # reports the job CANCELLED as soon as slurmctld does, before the step's processes have had their
    # SIGTERM (and, KillWait later, SIGKILL): wait for them all to be gone (KillWait 5 s + margin), then judge.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_live_processes_with(token) or _live_processes_with(f"[{job_id}.")):
        time.sleep(0.5)
    assert _live_processes_with(token) == [], "the job's processes outlived scancel by 30 s"
    assert _live_processes_with(f"slurmstepd: [{job_id}") == []
    # The job's shell is gone, so its trap ran or never will: scancel's SIGTERM reached the rule's shell
    # through sbatch -> jobstep srun -> inner snakemake, so a deployment job can write its failure record.
    assert (tmp_path / "got_term").exists(), "the rule's shell died without its SIGTERM trap\n" + local_slurm.logs_tail()
    assert (tmp_path / "got_term").read_text().strip() == "TERM"
