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
        self.nodeid, self.fixturenames, self._markers = nodeid, fixtures, markers

    def get_closest_marker(self, name):
        return name if name in self._markers else None

    def add_marker(self, marker):  # the gpu skip; none of these items is a gpu test
        raise AssertionError(f"{self.nodeid} got a marker")


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
    conftest.pytest_collection_modifyitems(None, items[:2])  # all marked: collection goes on


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

