"""The container backend's vLLM step on a real local Slurm: its GPUs, its CPUs and the EDF it runs with.

The local cluster (tests/slurm/cluster.py) has four count-only GPUs and an ``srun`` that stands in for the
Container Engine's ``--environment`` (tests/slurm/container_srun.py). The backend's whole ``srun`` command line
runs inside a batch job shaped like a deployment job (all the node's GPUs, its CPUs), and the step reports the
environment Slurm gave it.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from specstudy.deployment import launch

pytestmark = pytest.mark.slurm


def _backend(tmp_path: Path, *, tp: int, container: dict) -> launch.ContainerBackend:
    image = tmp_path / "vllm.sqsh"
    image.write_bytes(b"hsqs")
    edf = tmp_path / "base.toml"
    edf.write_text(f'image = "{image}"\nmounts = ["{tmp_path}:{tmp_path}"]\n\n[env]\nEDF_MARK = "from-edf"\n')
    cfg = {"model": "/models/target", "backend": "container", "tensor_parallel_size": tp,
           "container": {"edf": str(edf), **container}}
    backend = launch.make_backend(cfg)
    assert isinstance(backend, launch.ContainerBackend)
    return backend


def _step_env(tmp_path: Path, slurm_env: dict, argv: list[str]) -> dict[str, str]:
    """Run ``argv`` (the backend's srun line) as the job step of a 4-GPU, 2-CPU batch job; the step's env."""
    out = tmp_path / "step.env"
    job_log = tmp_path / "job.log"
    script = f"cd {shlex.quote(str(tmp_path))} && {shlex.join(argv)} > {shlex.quote(str(out))}"
    proc = subprocess.run(["sbatch", "--wait", "--gres=gpu:4", "--cpus-per-task=2", "--mem=200", f"--output={job_log}",
                           "--wrap", script], env=slurm_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr + (job_log.read_text() if job_log.exists() else "")
    return dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)


def test_the_vllm_step_gets_the_gpus_and_cpus_it_asks_for(tmp_path, slurm_env):
    # TP 2 on a 4-GPU job, one CPU of the job's two: numbers that differ from what the job holds, so the step's
    # own request is what shows
    backend = _backend(tmp_path, tp=2, container={"cpus_per_task": 1})
    argv = backend.wrap(["/usr/bin/env"], tmp_path / "attempt")
    assert "--gpus-per-task=2" in argv and "--cpus-per-task=1" in argv
    env = _step_env(tmp_path, slurm_env, argv)
    assert env.get("SLURM_GPUS_ON_NODE") == "2", env
    assert env.get("SLURM_CPUS_ON_NODE") == "1" and env.get("SLURM_CPUS_PER_TASK") == "1", env
    assert env.get("EDF_MARK") == "from-edf"  # the EDF's [env] reached the step: --environment was honoured


def test_gpus_follow_the_tensor_parallel_size_unless_the_config_says(tmp_path):
    argv = _backend(tmp_path, tp=4, container={}).wrap(["x"], tmp_path / "a")
    assert "--gpus-per-task=4" in argv
    argv = _backend(tmp_path, tp=4, container={"gpus_per_task": 3, "cpus_per_task": 8}).wrap(["x"], tmp_path / "b")
    assert "--gpus-per-task=3" in argv and "--cpus-per-task=8" in argv


@pytest.mark.parametrize("fault", ["missing_edf", "unparsable_edf", "missing_image"])
def test_the_container_engine_stand_in_refuses_what_the_engine_refuses(tmp_path, slurm_env, fault):
    backend = _backend(tmp_path, tp=1, container={"cpus_per_task": 1})
    argv = backend.wrap(["/usr/bin/true"], tmp_path / "attempt")
    edf = tmp_path / "attempt" / "environment.toml"
    if fault == "missing_edf":
        edf.unlink()
        expected = f"{edf} not found"
    elif fault == "unparsable_edf":
        edf.write_text('image = "/x.sqsh\n')
        expected = "cannot parse the environment definition file"
    else:
        (tmp_path / "vllm.sqsh").unlink()
        expected = f"image {tmp_path / 'vllm.sqsh'} does not exist"
    proc = subprocess.run(argv, env=slurm_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert expected in proc.stderr
