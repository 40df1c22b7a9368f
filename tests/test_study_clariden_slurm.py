"""The Clariden production path rehearsed on the local one-node Slurm: profiles/clariden, the Clariden config's
structure, the container backend's whole ``srun --environment`` command line.

What differs from Clariden, and only that: the local cluster cannot give 72 CPUs (the profile's
``cpus_per_task: 72`` becomes 2 in a copy of the profile; every other knob is the real profile's), has no
accounting database or account (``--slurm-status-command squeue --slurm-no-account``, 2-s status checks), and
its ``srun`` stands in for the Container Engine (tests/slurm/container_srun.py). The study config is
config/clariden-70b.yaml with tiny models and requests (the fixture models, two arms, one workload, the small
pre-registration), and the server is the suite's fake vLLM (tests/progress_fake_vllm.py) behind the
``engine.python`` shim, which first prints the GPUs and CPUs its Slurm step was given.

Legs: an image path that does not exist is refused from the login node before anything is submitted (naming the field); nothing else is
submitted; with the image in place screening runs, each vLLM step with the node's four GPUs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w
import yaml

from conftest import copy_workflow, fake_engine_python
from test_study_slurm import FAKE_VLLM, _submitted

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slurm, pytest.mark.study, pytest.mark.timeout(1500)]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
LOCAL = ["--slurm-no-account", "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2",
         "--seconds-between-status-checks", "2", "--latency-wait", "5"]


@pytest.fixture()
def workdir(tmp_path, fixture_models):
    copy_workflow(tmp_path, fixture_models=fixture_models, test_data=True)  # test data: the small pre-registration
    # the profile, with the node's CPUs instead of a GH200 node's 72
    prof = tmp_path / "profiles" / "clariden" / "config.yaml"
    text = prof.read_text()
    assert text.count("cpus_per_task: 72") == 4
    prof.write_text(text.replace("cpus_per_task: 72", "cpus_per_task: 2"))
    # engine.python: the fake vLLM, after printing what its Slurm step was given
    shim = fake_engine_python(tmp_path / "engine-python", FAKE_VLLM, before=(
        '    echo "step: SLURM_GPUS_ON_NODE=$SLURM_GPUS_ON_NODE SLURM_CPUS_ON_NODE=$SLURM_CPUS_ON_NODE '
        'EDF_HF_HUB_OFFLINE=$HF_HUB_OFFLINE"\n'))
    # the Clariden EDF's structure, with this machine's image and mounts
    edf = tomllib.loads((ROOT / "envs" / "clariden-vllm.toml").read_text())
    edf.update(image=str(tmp_path / "images" / "vllm.sqsh"), mounts=[f"{tmp_path}:{tmp_path}"], workdir=str(tmp_path))
    (tmp_path / "envs" / "rehearsal.toml").write_text(tomli_w.dumps(edf))
    cfg = yaml.safe_load((ROOT / "config" / "clariden-70b.yaml").read_text())
    small = yaml.safe_load((ROOT / "tests" / "data" / "study-small.yaml").read_text())
    cfg["study"].update(name="clariden-rehearsal", preregistration=small["study"]["preregistration"])
    eng = cfg["engine"]
    assert eng["backend"] == "container" and eng["target"]["tensor_parallel_size"] == 4
    eng["target"].update(path=small["engine"]["target"]["path"], served_model_name="fixture-target", max_model_len=1024)
    eng["draft"] = small["engine"]["draft"]
    eng["python"] = str(shim)
    eng["server"].update(ready_timeout_s=120, stop_grace_s=3, idle_timeout_s=300)
    # absolute: launch._resolve reads a relative EDF path against the checkout of scripts/, not the working directory
    eng["container"].update(image=edf["image"], edf=str(tmp_path / "envs" / "rehearsal.toml"))
    cfg["fixture_models"] = small["fixture_models"]
    cfg["corpora"] = small["corpora"]
    cfg["cells"] = small["cells"]
    cfg["arms"] = small["arms"]
    cfg["screen"] = small["screen"]
    cfg["plan"].update(drift_baselines_per_block=0, drift_cell={"workload": "code", "concurrency": 1})  # blocks: 2 stays
    cfg["capacity"]["enabled"] = False
    (tmp_path / "config" / "clariden-rehearsal.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return tmp_path


def run(workdir, env, *args, check=True, timeout=900):
    cmd = [SNAKEMAKE, *args, "--profile", "profiles/clariden", *LOCAL]
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-6000:]}")
    return proc.returncode, out


def test_clariden_profile_and_config_on_local_slurm(workdir, slurm_env, local_slurm):
    env = dict(slurm_env, SPECSTUDY_CONFIGFILE="config/clariden-rehearsal.yaml",
               PATH=f"{Path(sys.executable).parent}:{slurm_env.get('PATH', '')}")
    # 1. the image does not exist: refused from the login node before anything is submitted, naming the field
    #    (the job-level refusal of a configuration fault that only a compute node sees: tests/test_config_fault.py)
    rc, out = run(workdir, env, "results/plan/screen.json", check=False)
    assert rc != 0 and "field 'engine.container.image'" in out and "does not exist on this machine" in out, out[-2000:]
    assert not (workdir / "results/plan/screen.json").exists() and not _submitted(out, env)

    # 2. with the image in place: the plan (local rules), then screening through the production command line
    (workdir / "images").mkdir()
    (workdir / "images" / "vllm.sqsh").write_bytes(b"hsqs")
    run(workdir, env, "results/plan/screen.json")
    plan = json.loads((workdir / "results/plan/screen.json").read_text())
    assert len(plan["deployments"]) == 2
    first, second = sorted(plan["deployments"], key=lambda d: d["order"])
    rc, out = run(workdir, env, "screen")
    jobs = _submitted(out, env)
    assert len(jobs.get("deploy_screen", [])) == 2, (jobs, out[-3000:])
    for d in (first, second):
        rec = json.loads((workdir / f"results/screen/{d['arm']}/{d['rep']}/deployment.json").read_text())
        assert rec["status"] == "ok", rec.get("failure")
        assert rec["provenance"]["slurm"]["job_id"] in jobs["deploy_screen"]
        cmd = rec["command"]
        assert cmd[:2] == ["srun", "--overlap"] and "--gpus-per-task=4" in cmd and "--cpus-per-task=2" in cmd, cmd
        assert any(a.startswith("--environment=") for a in cmd)
        log = (workdir / f"results/screen/{d['arm']}/{d['rep']}/attempts" / rec["deployment_id"] / "launch.log").read_text()
        step = re.search(r"step: (.*)", log).group(1)
        assert step == "SLURM_GPUS_ON_NODE=4 SLURM_CPUS_ON_NODE=2 EDF_HF_HUB_OFFLINE=1", step
        cell = next((workdir / f"results/screen/{d['arm']}/{d['rep']}").glob("*/c*/summary.json"))
        assert json.loads(cell.read_text())["validity"]["valid"]
