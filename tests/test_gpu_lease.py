"""envs/gpu/lease.sh: the background run's stage order and deadline, and what `pack` brings back.

The GPU machine is lent for 30 minutes and calls last at most 10; the script must keep the study
first, skip the extras that no longer fit (saying so), and pack results without model weights in
parts small enough to come back. Fake `snakemake`/`nvidia-smi` stand in for the real ones here:
what is tested is the script's own logic, not theirs.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEASE = ROOT / "envs" / "gpu" / "lease.sh"


def _fake_bin(tmp: Path) -> Path:
    b = tmp / "bin"
    b.mkdir()
    (b / "snakemake").write_text("#!/bin/sh\necho \"snakemake $*\" >> \"$SPECSTUDY_LEASE_DIR/calls\"\n"
                                 "mkdir -p results/screen/baseline/rep1/attempts/d1/code/c1\n"
                                 "echo '{}' > results/screen/baseline/rep1/attempts/d1/code/c1/summary.json\nexit 0\n")
    (b / "nvidia-smi").write_text("#!/bin/sh\necho 'fake GPU'\n")
    for f in b.iterdir():
        f.chmod(0o755)
    return b


def _env(tmp: Path) -> dict:
    return dict(os.environ, PATH=f"{_fake_bin(tmp)}:{os.environ['PATH']}", SPECSTUDY_LEASE_DIR=str(tmp / "lease"),
                SPECSTUDY_WORKDIR=str(tmp / "work"), SPECSTUDY_MECH_CONFIG=str(tmp / "missing.yaml"),
                OUT=str(tmp / "out"))


def test_background_runs_the_study_first_and_skips_what_no_longer_fits(tmp_path):
    (tmp_path / "work").mkdir()
    env = _env(tmp_path)
    deadline = int(time.time()) + 60  # the study fits; the benchmark (300 s) and mechanics (420 s) do not
    subprocess.run(["bash", str(LEASE), "_background", str(deadline)], env=env, check=True, timeout=60,
                   capture_output=True, text=True)
    lease = tmp_path / "lease"
    assert (lease / "study.rc").read_text().strip() == "0"
    calls = (lease / "calls").read_text()
    assert calls.startswith("snakemake all ") and "--resources deployments=1" in calls
    assert "--configfile config/gpu-h200.yaml" in calls
    log = (lease / "lease.log").read_text()
    assert "start-up cache benchmark skipped" in log and "mechanics skipped" in log
    assert (lease / "done").exists()


def test_pack_leaves_model_weights_behind_and_splits_into_small_parts(tmp_path):
    work = tmp_path / "work"
    (work / "results" / "models" / "fixture").mkdir(parents=True)
    (work / "results" / "models" / "fixture" / "model.safetensors").write_bytes(os.urandom(1024))
    (work / "results" / "models" / "scale" / "target").mkdir(parents=True)
    (work / "results" / "models" / "scale" / "target" / "model-00001-of-00002.safetensors").write_bytes(os.urandom(1024))
    (work / "results" / "models" / "scale" / "scale.json").write_text("{}")
    (work / "results" / "screen").mkdir(parents=True)
    (work / "results" / "screen" / "x.json").write_text("{}")
    (work / ".snakemake" / "metadata").mkdir(parents=True)
    (work / ".snakemake" / "metadata" / "eA==").write_text("{}")
    (tmp_path / "out").mkdir()
    env = _env(tmp_path)
    (tmp_path / "lease").mkdir()
    (tmp_path / "lease" / "lease.log").write_text("log\n")
    subprocess.run(["bash", str(LEASE), "pack"], env=env, check=True, timeout=60, capture_output=True, text=True)
    parts = sorted((tmp_path / "out").glob("results.tgz.part*"))
    assert parts and all(p.stat().st_size <= 15 * 1024 * 1024 for p in parts)
    whole = tmp_path / "whole.tgz"
    whole.write_bytes(b"".join(p.read_bytes() for p in parts))
    names = tarfile.open(whole).getnames()
    assert "results/screen/x.json" in names
    assert not any(n.endswith(".safetensors") for n in names)  # no weights: rebuilt from their seeds
    assert "results/models/scale/scale.json" in names  # the record with every file's sha256 comes back
    assert ".snakemake/metadata/eA==" in names  # what a later lease's `resume` needs for Snakemake to resume
    assert (tmp_path / "out" / "lease.log").exists()


def test_wait_packs_while_it_waits_so_a_call_cut_at_its_limit_keeps_what_ran(tmp_path):
    """The device call of the last `wait` is killed when the session's device time runs out (rc 124): only
    what is already under $OUT comes back. `wait` packs every SPECSTUDY_LEASE_PACK_S seconds, so the kill
    loses at most that much (seen 2026-12-03: a 560 s wait cut at 559 s brought nothing back)."""
    work = tmp_path / "work"
    (work / "results" / "confirm").mkdir(parents=True)
    (work / "results" / "confirm" / "cell.json").write_text("{}")
    (tmp_path / "out").mkdir()
    (tmp_path / "lease").mkdir()
    (tmp_path / "lease" / "lease.log").write_text("log\n")
    env = dict(_env(tmp_path), SPECSTUDY_LEASE_PACK_S="1", SPECSTUDY_LEASE_POLL_S="1")
    proc = subprocess.Popen(["bash", str(LEASE), "wait", "120"], env=env, cwd=work, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while "packed (interim)" not in (tmp_path / "lease" / "lease.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "no interim pack"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, 9)  # the device tool's kill at the call's limit
        proc.wait(timeout=30)
    parts = sorted((tmp_path / "out").glob("results.tgz.part*"))
    assert parts
    whole = tmp_path / "whole.tgz"
    whole.write_bytes(b"".join(p.read_bytes() for p in parts))
    assert "results/confirm/cell.json" in tarfile.open(whole).getnames()
