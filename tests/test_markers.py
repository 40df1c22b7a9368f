"""The suite's own guards (issue #31): a test that starts a real server carries its marker, markers are strict,
every test has a time limit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import conftest

ROOT = Path(__file__).resolve().parents[1]


class _Item:
    def __init__(self, nodeid: str, fixtures: tuple[str, ...], markers: tuple[str, ...]):
        self.nodeid, self.fixturenames, self._markers, self.added = nodeid, fixtures, markers, []

    def get_closest_marker(self, name):
        return name if name in self._markers else None

    def add_marker(self, marker):
        self.added.append(marker)


def test_a_server_fixture_without_its_marker_stops_collection():
    items = [_Item("t.py::ok", ("vllm_available", "tmp_path"), ("vllm",)),
             _Item("t.py::no_server", ("tmp_path",), ()),
             _Item("t.py::unmarked", ("fixture_models", "vllm_available"), ()),
             _Item("t.py::cluster", ("local_slurm",), ("vllm",))]
    with pytest.raises(pytest.UsageError) as err:
        conftest.pytest_collection_modifyitems(None, items)
    msg = str(err.value)
    assert "t.py::unmarked (uses vllm_available, add @pytest.mark.vllm)" in msg
    assert "t.py::cluster (uses local_slurm, add @pytest.mark.slurm)" in msg
    assert "t.py::ok" not in msg and "no_server" not in msg
    assert all(item.added == [] for item in items)  # refused before anything is marked
    kept = items[:2]
    conftest.pytest_collection_modifyitems(None, kept)  # all marked: collection goes on
    # Each test gets its xdist group and nothing else (none of these is a gpu test): the server test
    # joins the one serial group, the other its module's; the serial group comes first.
    assert [(item.nodeid, [(m.name, m.args) for m in item.added]) for item in kept] == [
        ("t.py::ok", [("xdist_group", (conftest.SERIAL_GROUP,))]), ("t.py::no_server", [("xdist_group", ("t.py",))])]


def test_unknown_markers_are_errors_and_tests_have_a_timeout(tmp_path):
    (tmp_path / "test_typo.py").write_text("import pytest\n\n@pytest.mark.vlm\ndef test_a():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(ROOT), "-c",
                           str(ROOT / "pyproject.toml"), str(tmp_path / "test_typo.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "'vlm' not found in `markers` configuration option" in proc.stdout + proc.stderr
    (tmp_path / "test_typo.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(30)\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(ROOT), "-c",
                           str(ROOT / "pyproject.toml"), "--timeout", "2", str(tmp_path / "test_typo.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Timeout" in proc.stdout, proc.stdout[-2000:]
    import tomllib

    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in ini["addopts"].split() and 0 < int(ini["timeout"]) <= 900



def test_under_two_processes_every_real_server_test_runs_in_one(tmp_path):
    """`make test`'s own scheduling, run for real: pytest-xdist with two processes and `--dist loadgroup`
    over the suite's conftest hook. Every server-marked test lands on one worker and each module's other
    tests on one worker (fails when the group never reaches xdist's node ids, as with pytest 9.2)."""
    (tmp_path / "conftest.py").write_text(
        "import importlib.util, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(ROOT / 'tests' / 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(suite)\n"
        "pytest_collection_modifyitems = suite.pytest_collection_modifyitems\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    vllm: x\n    slurm: x\n    study: x\n    gpu: x\n")
    for module in "abcd":
        (tmp_path / f"test_{module}.py").write_text(
            "import pytest\n\n"
            "@pytest.mark.vllm\ndef test_server():\n    pass\n\n"
            "@pytest.mark.slurm\ndef test_cluster():\n    pass\n\n"
            + "".join(f"def test_plain{i}():\n    pass\n\n" for i in range(4)))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                           "--no-loadscope-reorder", "-v", "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    import re

    ran = re.findall(r"^\[(gw\d)\] .*PASSED (\S+)", proc.stdout, re.M)
    assert len(ran) == 24, proc.stdout[-3000:]
    workers = {}
    for worker, nodeid in ran:
        group = nodeid.rsplit("@", 1)[1] if "@" in nodeid else nodeid
        workers.setdefault(group, set()).add(worker)
    assert set(workers) == {conftest.SERIAL_GROUP} | {f"test_{m}.py" for m in "abcd"}, workers
    assert all(len(w) == 1 for w in workers.values()), workers
