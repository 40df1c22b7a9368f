"""envs/gpu/lease.sh's prebuild (issue 27): the fixture models, then the scale model the config asks for,
both before `start` runs the study. A fake `python3` stands in for the two builds (they are tested in
test_fixture_models.py / test_scale_model.py); whether the config asks for a scale model is answered by
the real specstudy.inputs.scale_model.wanted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEASE = ROOT / "envs" / "gpu" / "lease.sh"


def _env(tmp: Path, config: str) -> dict:
    b = tmp / "bin"
    b.mkdir()
    # the builds are logged and stubbed; any other python3 call (scale_model.wanted) is the real interpreter
    (b / "python3").write_text(
        "#!/bin/sh\ncase \"$*\" in\n"
        "  *build_fixture_models*) echo fixture >> \"$SPECSTUDY_LEASE_DIR/builds\"; exit 0 ;;\n"
        "  *build_from_config*) echo \"scale $*\" >> \"$SPECSTUDY_LEASE_DIR/builds\"; exit 0 ;;\n"
        f"  *) exec {sys.executable} \"$@\" ;;\nesac\n")
    (b / "python3").chmod(0o755)
    (tmp / "work" / "results" / "logs" / "models").mkdir(parents=True)
    (tmp / "lease").mkdir()
    return dict(os.environ, PATH=f"{b}:{os.environ['PATH']}", SPECSTUDY_LEASE_DIR=str(tmp / "lease"),
                SPECSTUDY_WORKDIR=str(tmp / "work"), SPECSTUDY_GPU_CONFIG=str(ROOT / "config" / config))


@pytest.mark.parametrize("config,scale", [("gpu-h200-scale.yaml", True), ("gpu-h200.yaml", False)])
def test_prebuild_builds_the_fixture_then_the_scale_model_the_config_asks_for(tmp_path, config, scale):
    env = _env(tmp_path, config)
    subprocess.run(["bash", str(LEASE), "_prebuild", ""], env=env, check=True, timeout=120, capture_output=True, text=True)
    lease = tmp_path / "lease"
    builds = (lease / "builds").read_text().splitlines()
    assert builds[0] == "fixture"
    assert (lease / "prebuild.rc").read_text().strip() == "0" and (lease / "prebuild.done").exists()
    if scale:
        assert len(builds) == 2 and "build_from_config" in builds[1] and "gpu-h200-scale.yaml" in builds[1]
        assert (lease / "scale.rc").read_text().strip() == "0"
        assert "prebuild: scale model rc 0" in (lease / "lease.log").read_text()
    else:
        assert builds == ["fixture"] and not (lease / "scale.rc").exists()


def test_a_failed_fixture_build_skips_the_scale_model_but_ends_the_prebuild(tmp_path):
    env = _env(tmp_path, "gpu-h200-scale.yaml")
    fake = tmp_path / "bin" / "python3"
    fake.write_text(fake.read_text().replace('echo fixture >> "$SPECSTUDY_LEASE_DIR/builds"; exit 0',
                                             'echo fixture >> "$SPECSTUDY_LEASE_DIR/builds"; exit 3'))
    subprocess.run(["bash", str(LEASE), "_prebuild", ""], env=env, check=True, timeout=120, capture_output=True, text=True)
    lease = tmp_path / "lease"
    assert (lease / "builds").read_text().splitlines() == ["fixture"]
    assert (lease / "prebuild.rc").read_text().strip() == "3" and not (lease / "scale.rc").exists()
    assert (lease / "prebuild.done").exists()  # `start` does not wait forever; the study's rules retry the builds


@pytest.mark.parametrize("scale_rc,scale_touched", [("0", True), ("1", False)])
def test_start_touches_only_what_the_prebuild_built(tmp_path, scale_rc, scale_touched):
    env = _env(tmp_path, "gpu-h200-scale.yaml")
    work, lease = tmp_path / "work", tmp_path / "lease"
    records = [work / "results" / "models" / "fixture" / "models.json", work / "results" / "models" / "scale" / "scale.json"]
    for r in records:
        r.parent.mkdir(parents=True)
        r.write_text("{}")
        os.utime(r, (1_000_000_000, 1_000_000_000))  # older than any input a device call may re-copy
    (lease / "prebuild.rc").write_text("0\n")
    (lease / "scale.rc").write_text(scale_rc + "\n")
    subprocess.run(["bash", str(LEASE), "_touch_prebuilt"], env=env, check=True, timeout=60, capture_output=True, text=True)
    fixture, scale = (r.stat().st_mtime_ns for r in records)
    assert fixture > 1_000_000_000 * 10**9
    if scale_touched:
        assert scale >= fixture  # the scale record stays newer than its input, the fixture record
    else:
        assert scale == 1_000_000_000 * 10**9  # a failed scale prebuild is left for the study's rule to redo
