"""specstudy.inputs.arctic_build: arctic-inference 0.1.1 built into a --target directory, cached, locked, or a clear error.

The real build (minutes) runs once per cache key through ``tests/test_methods.py``'s ``arctic_env`` fixture;
here: the cache key and marker, the errors a machine without cmake / a compiler / the sdist gets (real
``pip``, a real failing compile), the lock a second process waits on, and the command's error line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specstudy import cli
from specstudy.core import atomic
from specstudy.inputs import arctic_build
from specstudy.inputs.arctic_build import ArcticBuildError

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is needed to build arctic-inference (and by this test); install it"
    return path


def _path_with(tmp_path: Path, *tools: str) -> str:
    """A PATH holding only the named tools (symlinks to the real ones)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for t in tools:
        (bin_dir / t).symlink_to(_tool(t))
    return str(bin_dir)


def _finished(dest: Path, key: str) -> Path:
    (dest / "site").mkdir(parents=True)
    atomic.write_json(dest / arctic_build.MARKER, {"key": key})
    return dest / "site"


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name)


def test_cache_dest_is_keyed_by_the_recipe_and_interpreter(tmp_path):
    key = arctic_build.build_key()
    assert len(key) == 12 and int(key, 16) >= 0
    assert key == arctic_build.build_key(), "the key is a pure function of the recipe and interpreter"
    assert arctic_build.cache_dest(tmp_path) == tmp_path / f"arctic-inference-0.1.1-{key}"


def test_only_a_marker_with_this_key_counts_as_built(tmp_path):
    dest = tmp_path / "a"
    (dest / "site").mkdir(parents=True)
    assert arctic_build.built_site(dest) is None, "a site without done.json is an interrupted build"
    atomic.write_json(dest / "done.json", {"key": "000000000000"})
    assert arctic_build.built_site(dest) is None, "a build for another interpreter or recipe is stale"
    atomic.write_json(dest / "done.json", {"key": arctic_build.build_key()})
    assert arctic_build.built_site(dest) == dest / "site"


def test_check_site_names_the_failing_import(tmp_path):
    problem = arctic_build.check_site(tmp_path)
    assert "from arctic_inference.suffix_decoding import SuffixDecodingCache" in problem
    assert "ModuleNotFoundError" in problem and str(tmp_path) in problem


def test_missing_cmake_is_named_and_nothing_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _path_with(tmp_path, "g++"))
    monkeypatch.delenv("CXX", raising=False)
    dest = tmp_path / "cache" / "arctic"
    with pytest.raises(ArcticBuildError, match=r"cannot build arctic-inference==0\.1\.1 .*cmake not found on PATH "
                                               r"\(need cmake >= 3\.18"):
        arctic_build.ensure_arctic(dest, log=lambda m: None)
    assert not dest.exists() and _leftovers(dest.parent) == []


def test_missing_compiler_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _path_with(tmp_path, "cmake"))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ArcticBuildError, match=r"no C\+\+ compiler on PATH") as err:
        arctic_build.ensure_arctic(tmp_path / "arctic", log=lambda m: None)
    assert "cmake" not in str(err.value), "cmake is there: only the compiler is named"
    monkeypatch.setenv("CXX", "no-such-c++")
    with pytest.raises(ArcticBuildError, match=r"CXX=no-such-c\+\+: no such compiler on PATH"):
        arctic_build.ensure_arctic(tmp_path / "arctic", log=lambda m: None)


def test_pip_that_cannot_find_the_sdist_is_named(tmp_path, monkeypatch):
    empty = tmp_path / "empty-index"
    empty.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no pip.conf indexes
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    dest = tmp_path / "arctic"
    (tmp_path / ".arctic.tmp-999999" / "site").mkdir(parents=True)  # a build killed half way
    with pytest.raises(ArcticBuildError, match=r"pip could not find the arctic-inference==0\.1\.1 sdist") as err:
        arctic_build.ensure_arctic(dest, log=lambda m: None)
    failed_log = tmp_path / "arctic.failed.log"
    assert str(failed_log) in str(err.value) and "No matching distribution" in str(err.value)
    assert "--no-binary arctic-inference" in failed_log.read_text()
    assert not dest.exists() and _leftovers(tmp_path) == [], "a killed build's leftovers are removed under the lock"


def test_a_failing_compile_is_named_and_leaves_nothing_that_looks_finished(tmp_path, monkeypatch):
    """A real build whose C++ compiler fails (CXX=/bin/false): pip finds and fetches everything, cmake stops."""
    monkeypatch.setenv("CXX", "/bin/false")
    dest = tmp_path / "arctic"
    lines = []
    with pytest.raises(ArcticBuildError, match=r"compiling arctic-inference==0\.1\.1 .* failed: .*pip wheel "
                                               r"--no-build-isolation") as err:
        arctic_build.ensure_arctic(dest, log=lines.append)
    assert [ln.split(":")[1].split()[0] for ln in lines] == ["downloading", "installing", "compiling"]
    log = (tmp_path / "arctic.failed.log").read_text()
    assert "CMake Error" in log and "is not able to compile" in log, "cmake's complaint is kept"
    assert 'CMake Error' in str(err.value) and '"/bin/false"' in str(err.value), \
        "the message quotes cmake's complaint, not only pip's last lines"
    assert "--target" in log and str(tmp_path) in log, "build tools went into a --target dir under the build dir"
    assert not dest.exists() and _leftovers(tmp_path) == []
    assert arctic_build.built_site(dest) is None
    assert "(pip's output:" in str(err.value)


def test_a_second_process_waits_for_the_first_and_reuses_its_build(tmp_path, monkeypatch):
    dest = tmp_path / "arctic"
    holder = textwrap.dedent(f"""
        import fcntl, sys
        sys.path.insert(0, {str(ROOT / 'scripts')!r})
        from pathlib import Path
        from specstudy.core import atomic
        dest = Path({str(dest)!r})
        with open(dest.parent / (dest.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            print("locked", flush=True)
            sys.stdin.readline()  # until the test has seen the other process wait for this lock (or gave up)
            tmp = dest.parent / ".arctic.tmp-x"
            (tmp / "site").mkdir(parents=True)
            atomic.write_json(tmp / "done.json", {{"key": {arctic_build.build_key()!r}}})
            tmp.rename(dest)
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"

        def must_not_build(*_a, **_k):
            raise AssertionError("the second process built again instead of reusing the first one's build")

        monkeypatch.setattr(arctic_build, "_build_locked", must_not_build)
        lines = []

        def log(line):  # said just before this process blocks on the lock: the holder may finish now
            lines.append(line)
            if "another process is building" in line:
                proc.stdin.write("go\n")
                proc.stdin.flush()

        assert arctic_build.ensure_arctic(dest, log=log) == dest / "site"
        assert any("another process is building" in ln for ln in lines)
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0


def test_build_suffix_command_names_what_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", _path_with(tmp_path, "g++"))
    monkeypatch.delenv("CXX", raising=False)
    assert cli.main(["engine", "build-suffix", "--dest", str(tmp_path / "arctic")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specstudy engine: error: cannot build arctic-inference==0.1.1") and "cmake not found" in err


def test_build_suffix_command_prints_the_site_and_the_config_line(tmp_path, capsys):
    site = _finished(tmp_path / "arctic", arctic_build.build_key())
    assert cli.main(["engine", "build-suffix", "--dest", str(tmp_path / "arctic")]) == 0
    out = capsys.readouterr().out
    assert f"arctic-inference 0.1.1 -> {site}" in out
    assert f"      env:\n        PYTHONPATH: {site}\n" in out and "probe-methods" in out
