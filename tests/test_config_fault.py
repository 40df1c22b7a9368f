"""A launch failure that is the configuration's fault stops the study; a node's fault stays data.

The "server" is a script that prints what the container engine or vLLM prints on such a failure and exits 1,
started by the real deployment job (``run_deployment``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specstudy.core import atomic
from specstudy.deployment import launchlog
from specstudy.job.run import CONFIG_FAULT_EXIT, run_deployment
from test_deploy import BASELINE, fake_engine_section, job_spec

IMAGE_MISSING = "srun: error: container engine: /x/base.toml: image /capstor/images/vllm.sqsh does not exist"
MODEL_MISSING = ("huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
                 "'namespace/repo_name': '/capstor/models/Apertus-v1.5-70B'. Use `repo_type` argument if needed.")
NODE_FAULT = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
DRAFT_TP = "ValueError: draft_tensor_parallel_size and tensor_parallel_size must be the same"


def _failing_python(tmp_path: Path, line: str) -> str:
    exe = tmp_path / "failpy"
    exe.write_text(f"#!/bin/sh\necho 'INFO starting'\necho {line!r} >&2\nexit 1\n")
    exe.chmod(0o755)
    return str(exe)


@pytest.mark.parametrize("line,fix,detail", [
    (IMAGE_MISSING, "engine.container.image", "image /capstor/images/vllm.sqsh does not exist"),
    (MODEL_MISSING, "engine.target.path", "Repo id must be in the form")])
def test_a_configuration_fault_fails_the_job_with_the_fix(tmp_path, monkeypatch, capsys, line, fix, detail):
    monkeypatch.chdir(tmp_path)
    spec = job_spec(tmp_path, BASELINE, fake_engine_section(tmp_path, _failing_python(tmp_path, line)))
    out = tmp_path / "results" / "screen" / "baseline" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == CONFIG_FAULT_EXIT
    err = capsys.readouterr().err
    assert "because of the study's configuration, not the node" in err and fix in err
    assert detail in err  # the engine's own message
    # nothing published: the deployments waiting for this one never start, and the next run starts it again
    assert not (out / "deployment.json").exists() and not list(out.glob("*/c*/summary.json"))
    failures = list((tmp_path / "results" / "deployment-failures").rglob("failure.json"))
    assert len(failures) == 1 and atomic.read_json(failures[0])["status"] == "failed"


@pytest.mark.parametrize("line", [NODE_FAULT, DRAFT_TP])
def test_a_node_fault_or_an_unservable_arm_stays_data(tmp_path, monkeypatch, line):
    monkeypatch.chdir(tmp_path)
    spec = job_spec(tmp_path, BASELINE, fake_engine_section(tmp_path, _failing_python(tmp_path, line)))
    out = tmp_path / "results" / "screen" / "baseline" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    rec = atomic.read_json(out / "deployment.json")
    assert rec["status"] == "failed" and Path(rec["failure"]["record"]).exists()


def test_config_fault_reads_the_engines_messages():
    assert launchlog.config_fault("x\n" + IMAGE_MISSING + "\n")["detail"].endswith("does not exist")
    assert "engine.target.path" in launchlog.config_fault(MODEL_MISSING)["fix"]
    assert launchlog.config_fault(NODE_FAULT) is None and launchlog.config_fault(DRAFT_TP) is None
    assert launchlog.config_fault("") is None


