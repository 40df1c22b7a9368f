"""Build arctic-inference 0.1.1 (suffix decoding for vLLM) into a directory of its own, never into the venv.

vLLM serves ``suffix`` arms only when ``arctic_inference`` is importable by the server. Version 0.1.1
exists only as an sdist whose ``pyproject.toml`` asks for an isolated build with ``torch == 2.7.0`` (a
CUDA torch download). The part vLLM uses is one nanobind C++ extension
(``arctic_inference.suffix_decoding._C``), which builds against this interpreter without isolation
(docs/methods.md, "suffix: building arctic-inference 0.1.1"). :func:`ensure_arctic` does that with
nothing but ``sys.executable -m pip``:

1. ``pip download --no-deps --no-binary arctic-inference --no-build-isolation arctic-inference==0.1.1``
   (the sdist; without isolation its metadata step does not fetch ``torch==2.7.0``);
2. ``pip install --no-deps --target <tmp>/build-tools nanobind==2.9.2 grpcio-tools`` (build tools only);
3. ``pip wheel --no-build-isolation --no-deps`` of the sdist with ``<tmp>/build-tools`` on PYTHONPATH
   (and its ``bin`` on PATH); cmake >= 3.18 and a C++20 compiler come from the system;
4. ``pip install --no-deps --target <dest>/site`` of that wheel;
5. the server's import (``from arctic_inference.suffix_decoding import SuffixDecodingCache``) is tried
   with ``PYTHONPATH=<dest>/site``.

Everything is built in a temporary sibling of ``dest`` and renamed into place with ``done.json`` (the
marker, which carries :func:`build_key`) already inside, under an exclusive file lock
(``<dest>.lock``): two processes asking at once build once, an interrupted build leaves nothing that
looks finished. A failure raises :class:`ArcticBuildError` naming the step (missing cmake or compiler,
pip could not find the sdist, the compile) and keeps pip's output in ``<dest>.failed.log``.

Serve it with ``engine.server.env.PYTHONPATH: <dest>/site`` (``make install-suffix`` prints this).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from specstudy.core import atomic
from specstudy.core.errors import UserError
from specstudy.core.timestamps import utc_now

ARCTIC_VERSION = "0.1.1"
REQUIREMENT = f"arctic-inference=={ARCTIC_VERSION}"
# The sdist's own build requirements, less torch (the venv's), cmake and ninja (system / venv).
BUILD_TOOLS = ("nanobind==2.9.2", "grpcio-tools")
MIN_CMAKE = (3, 18)
IMPORT_CHECK = "from arctic_inference.suffix_decoding import SuffixDecodingCache"
MARKER = "done.json"
DEFAULT_DEST = Path("build") / f"arctic-inference-{ARCTIC_VERSION}"
STEP_TIMEOUT_S = 3600


class ArcticBuildError(UserError):
    """arctic-inference could not be built; the message names the step, the cause and the fix."""


def build_key() -> str:
    """Hash of what the built site depends on: this recipe, the version, the interpreter and platform."""
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(f"{REQUIREMENT}|{'|'.join(BUILD_TOOLS)}|{sys.implementation.cache_tag}|{sysconfig.get_platform()}".encode())
    return h.hexdigest()[:12]


def cache_dest(cache_root: str | Path) -> Path:
    """Where the test cache keeps a build: ``<cache_root>/arctic-inference-0.1.1-<key>``."""
    return Path(cache_root) / f"arctic-inference-{ARCTIC_VERSION}-{build_key()}"


def built_site(dest: str | Path) -> Path | None:
    """``<dest>/site`` when ``dest`` holds a finished build for this interpreter (its marker's key), else None."""
    dest = Path(dest)
    try:
        marker = atomic.read_json(dest / MARKER)
    except (OSError, ValueError, atomic.BadFile):
        return None
    if not isinstance(marker, dict) or marker.get("key") != build_key() or not (dest / "site").is_dir():
        return None
    return dest / "site"


def check_site(site: str | Path) -> str | None:
    """None when the server's import of arctic-inference works with ``PYTHONPATH=<site>``, else why not."""
    env = dict(os.environ, PYTHONPATH=str(site))
    res = subprocess.run([sys.executable, "-c", IMPORT_CHECK], env=env, capture_output=True, text=True, timeout=120)
    if res.returncode == 0:
        return None
    lines = [ln for ln in (res.stderr or res.stdout).strip().splitlines() if ln.strip()]
    return f"`{IMPORT_CHECK}` with PYTHONPATH={site} fails: {lines[-1] if lines else f'exit {res.returncode}'}"


def preflight() -> list[str]:
    """What this machine lacks to build the extension (empty when nothing): cmake, a C++ compiler, torch."""
    problems = []
    cmake = shutil.which("cmake")
    if cmake is None:
        problems.append(f"cmake not found on PATH (need cmake >= {'.'.join(map(str, MIN_CMAKE))}; "
                        "Debian/Ubuntu: apt-get install cmake)")
    else:
        out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"version (\d+)\.(\d+)", out)
        if not m or (int(m[1]), int(m[2])) < MIN_CMAKE:
            problems.append(f"{cmake} is too old ({out.splitlines()[0] if out else 'no version'}); "
                            f"need cmake >= {'.'.join(map(str, MIN_CMAKE))}")
    cxx = os.environ.get("CXX")
    if cxx:
        if shutil.which(cxx.split()[0]) is None:
            problems.append(f"CXX={cxx}: no such compiler on PATH")
    elif not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        problems.append("no C++ compiler on PATH (c++, g++ or clang++; need C++20, e.g. g++ >= 10; "
                        "Debian/Ubuntu: apt-get install g++)")
    for mod in ("torch", "setuptools"):
        if importlib.util.find_spec(mod) is None:
            problems.append(f"{sys.executable} cannot import {mod} (the build runs without isolation against this "
                            "environment; run `make install`)")
    return problems


def ensure_arctic(dest: str | Path, log=print) -> Path:
    """``<dest>/site`` holding arctic-inference 0.1.1 built for this interpreter; built now if not yet there.

    Waits for another process building the same ``dest``. Raises :class:`ArcticBuildError` when it fails.
    """
    dest = Path(dest).absolute()
    site = built_site(dest)
    if site is not None:
        return site
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f"{dest.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"arctic-inference: another process is building {dest}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        site = built_site(dest)  # the other process may have finished it
        if site is not None:
            return site
        return _build_locked(dest, log)


def _build_locked(dest: Path, log) -> Path:
    problems = preflight()
    if problems:
        raise ArcticBuildError(f"cannot build {REQUIREMENT} into {dest}: " + "; ".join(problems))
    for stale in dest.parent.glob(f".{dest.name}.tmp-*"):  # left by a killed build; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    failed_log = dest.parent / f"{dest.name}.failed.log"
    t0 = time.monotonic()
    try:
        _build_into(tmp, log)
        site_problem = check_site(tmp / "site")
        if site_problem:
            raise ArcticBuildError(f"{REQUIREMENT} was built but does not import: {site_problem}")
        for scratch in ("build-tools", "sdist", "wheel"):
            shutil.rmtree(tmp / scratch, ignore_errors=True)
        atomic.write_json(tmp / MARKER, {"key": build_key(), "requirement": REQUIREMENT, "build_tools": list(BUILD_TOOLS),
                                         "python": sys.executable, "cache_tag": sys.implementation.cache_tag,
                                         "platform": sysconfig.get_platform(),
                                         "seconds": round(time.monotonic() - t0, 1),
                                         "built_at": utc_now()})
        if dest.exists():  # a stale build (another interpreter or recipe) or one without its marker
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except BaseException as exc:
        if (tmp / "build.log").exists():
            shutil.copyfile(tmp / "build.log", failed_log)
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, ArcticBuildError):
            raise ArcticBuildError(f"{exc} (pip's output: {failed_log})") from None
        raise
    failed_log.unlink(missing_ok=True)
    log(f"arctic-inference: built {dest / 'site'} in {time.monotonic() - t0:.0f} s")
    return dest / "site"


def _pip(args: list[str], logfile: Path, step: str, log, env: dict | None = None, failure: str | None = None) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    log(f"arctic-inference: {step}")
    with open(logfile, "a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        start = fh.tell()
        try:
            res = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ArcticBuildError(f"{step}: `{' '.join(cmd)}` ran past {STEP_TIMEOUT_S} s") from None
    if res.returncode != 0:
        with open(logfile, errors="replace") as fh:
            fh.seek(start)
            lines = [ln.strip() for ln in fh.read().splitlines() if ln.strip()]
        raise ArcticBuildError(f"{failure or step + ' failed'}: `{' '.join(cmd)}` exited {res.returncode}: "
                               + " | ".join(_first_error(lines) + lines[-2:]))


def _first_error(lines: list[str]) -> list[str]:
    """The first real complaint in pip's output (cmake's or the compiler's), with the lines after it."""
    for i, ln in enumerate(lines):
        if re.search(r"CMake Error|fatal error|error:|No matching distribution|Could not find a version", ln) and \
                "subprocess-exited-with-error" not in ln:
            return lines[i:i + 4] + ["..."]
    return []


def _build_into(tmp: Path, log) -> None:
    logfile = tmp / "build.log"
    # --no-build-isolation: preparing the sdist's metadata must not fetch its build requirement torch==2.7.0
    _pip(["download", "--no-deps", "--no-binary", "arctic-inference", "--no-build-isolation", "-d", str(tmp / "sdist"), REQUIREMENT],
         logfile, f"downloading the {REQUIREMENT} sdist", log,
         failure=f"pip could not find the {REQUIREMENT} sdist (check the index: pip config list)")
    sdists = sorted((tmp / "sdist").glob("arctic[_-]inference-*.tar.gz"))
    if not sdists:
        raise ArcticBuildError(f"pip could not find the {REQUIREMENT} sdist: `pip download` left no "
                               f"arctic_inference-{ARCTIC_VERSION}.tar.gz in {tmp / 'sdist'}")
    _pip(["install", "--no-deps", "--target", str(tmp / "build-tools"), *BUILD_TOOLS], logfile,
         f"installing the build tools ({', '.join(BUILD_TOOLS)}) into a --target directory", log)
    bt = tmp / "build-tools"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(bt), os.environ.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join((str(bt / "bin"), os.environ.get("PATH", "")))
    _pip(["wheel", "--no-build-isolation", "--no-deps", "--no-cache-dir", "-w", str(tmp / "wheel"), str(sdists[0])],
         logfile, f"compiling {REQUIREMENT} (cmake + C++ extension, minutes)", log, env=env)
    wheels = sorted((tmp / "wheel").glob("arctic_inference-*.whl"))
    if not wheels:
        raise ArcticBuildError(f"compiling {REQUIREMENT} left no wheel in {tmp / 'wheel'}")
    _pip(["install", "--no-deps", "--target", str(tmp / "site"), str(wheels[0])], logfile,
         "installing the wheel into a --target directory (not the venv)", log)


def cmd_build(args) -> int:
    """``specstudy engine build-suffix``: build (or find) it and say how to serve suffix arms with it."""
    t0 = time.monotonic()
    site = ensure_arctic(args.dest, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"arctic-inference {ARCTIC_VERSION} -> {site} ({time.monotonic() - t0:.0f} s)")
    print("To serve suffix arms with the embedded engine, set in the study config:\n"
          f"  engine:\n    server:\n      env:\n        PYTHONPATH: {site}\n"
          "then probe again: specstudy engine probe-methods --config <config> --methods suffix --out <record>")
    return 0
