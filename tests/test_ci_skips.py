"""Review #16.10: tests must not pass by skipping. Under CI=true a missing prerequisite fails the run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SKIPPING = '''
import pytest

@pytest.fixture
def needs_tool():
    pytest.skip("tool X is not installed")

def test_skip_in_fixture(needs_tool):
    pass

@pytest.mark.skipif(True, reason="data not available")
def test_skipif():
    pass

@pytest.mark.gpu
def test_needs_gpu():
    pytest.skip("gpu test: no NVIDIA GPU on this machine (none listed)")

@pytest.mark.gpu
def test_gpu_test_skipped_for_another_reason():
    pytest.skip("CUDA vLLM is not installed")

@pytest.mark.xfail(reason="known")
def test_expected_failure():
    assert False

def test_runs():
    pass
'''


def _pytest(tmp_path, ci):
    (tmp_path / "test_x.py").write_text(SKIPPING)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT / "tests")
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "ci_skips", "-p", "no:cacheprovider", "-ra",
                           "-c", str(tmp_path / "pytest.ini"), str(tmp_path / "test_x.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_skips_fail_under_ci_except_gpu_tests(tmp_path):
    res = _pytest(tmp_path, ci=True)
    assert res.returncode == 1, res.stdout
    # a skip in setup (skipif, a fixture) becomes a setup error: the run fails either way
    assert "2 errors" in res.stdout and "1 passed" in res.stdout and "1 skipped" in res.stdout, res.stdout
    assert "skipped under CI=true, which counts as a failure: tool X is not installed" in res.stdout
    # a gpu test is let off only for want of a GPU
    assert "FAILED test_x.py::test_gpu_test_skipped_for_another_reason" in res.stdout, res.stdout
    assert "CUDA vLLM is not installed" in res.stdout and "1 failed" in res.stdout
    assert "data not available" in res.stdout
    assert "1 xfailed" in res.stdout


def test_skips_stay_skips_with_their_reason_outside_ci(tmp_path):
    res = _pytest(tmp_path, ci=False)
    assert res.returncode == 0, res.stdout
    assert "4 skipped" in res.stdout
    assert "tool X is not installed" in res.stdout and "data not available" in res.stdout


COLLECTION_SKIPS = {
    "test_module_skip.py": 'import pytest\npytest.skip("fixture data absent", allow_module_level=True)\n\n'
                           'def test_a():\n    pass\n',
    "test_importorskip.py": 'import pytest\npytest.importorskip("no_such_module_specstudy")\n\ndef test_b():\n    pass\n',
    "test_fine.py": "def test_c():\n    pass\n",
}


@pytest.mark.parametrize("ci", [True, False])
def test_collection_time_skips_fail_under_ci(tmp_path, ci):
    for name, text in COLLECTION_SKIPS.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT / "tests")
    if ci:
        env["CI"] = "true"
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "ci_skips", "-p", "no:cacheprovider", "-ra",
                          "-c", str(tmp_path / "pytest.ini"), str(tmp_path)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    if ci:
        assert res.returncode != 0, res.stdout
        assert "2 errors" in res.stdout, res.stdout
        assert "test_module_skip.py: skipped at collection under CI=true" in res.stdout and "fixture data absent" in res.stdout
        assert "test_importorskip.py: skipped at collection under CI=true" in res.stdout
        assert "no_such_module_specstudy" in res.stdout
    else:
        assert res.returncode == 0, res.stdout
        assert "1 passed, 2 skipped" in res.stdout, res.stdout


def test_the_suites_own_no_gpu_skip_is_the_one_ci_accepts():
    """The suite's gpu skip (tests/conftest.py) passes under CI=true on a machine without a GPU, and
    its wording is the one ci_skips lets through."""
    from ci_skips import NO_GPU
    from conftest import nvidia_gpu_present

    reason = nvidia_gpu_present()
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                          "tests/test_memory.py::test_nvml_memory_on_a_real_gpu"], cwd=ROOT,
                         env=dict(os.environ, CI="true"), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout
    if reason is None:  # a GPU machine runs the test
        assert "1 passed" in res.stdout, res.stdout
    else:
        assert f"gpu test: {reason}".startswith(NO_GPU) and "1 skipped" in res.stdout and NO_GPU in res.stdout, res.stdout


def _fake_path(tmp_path) -> str:
    """A PATH with the shell basics but neither Slurm nor apt-get."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("id", "timeout", "tail", "head", "kill", "cat"):
        real = shutil.which(tool)
        if real:
            (bindir / tool).symlink_to(real)
    return str(bindir)


def _ensure(tmp_path, ci):
    env = {"PATH": _fake_path(tmp_path), "ENSURE_SLURM_SBIN": str(tmp_path / "sbin")}
    if ci:
        env["CI"] = "true"
    return subprocess.run([shutil.which("bash"), str(ROOT / "tests" / "slurm" / "ensure-slurm-packages.sh")],
                          env=env, capture_output=True, text=True, timeout=60)


def test_slurm_install_that_cannot_happen_fails_under_ci(tmp_path):
    res = _ensure(tmp_path, ci=True)
    assert res.returncode == 1, res.stderr
    assert "cannot install Slurm under CI=true: apt-get is not available" in res.stderr


def test_slurm_install_that_cannot_happen_is_reported_outside_ci(tmp_path):
    res = _ensure(tmp_path, ci=False)
    assert res.returncode == 0
    assert "NOT installing Slurm: apt-get is not available" in res.stderr and "will be skipped" in res.stderr


def test_make_test_does_not_ignore_a_failed_slurm_install():
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = lines.index("test: install")
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line)
    ensure = [r for r in recipe if "ensure-slurm-packages.sh" in r]
    assert ensure and not any("|| true" in r or r.lstrip().startswith("\t-") for r in ensure), recipe
    assert 'export CI="${CI:-true}"' in (ROOT / ".ci" / "run").read_text()

