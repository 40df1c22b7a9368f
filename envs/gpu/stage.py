#!/usr/bin/env python3
"""Stage vLLM builds + the harness for the offline GPU machine (docs/gpu.md, "Offline install").

For each vLLM build (`--builds 0.23.0,0.26.0`; default: every envs/gpu/engine-<version>.txt) downloads the
wheels pinned there, and those of envs/gpu/harness.txt (sha256-checked by pip and again here), builds the
sdist-only packages of envs/gpu/build.txt into wheels, slims each vLLM wheel (drops what a Hopper run of a
Llama-family model does not load) and writes everything into the git-ignored REPO/.stage/ as parts of at
most 40 MB, one folder each (.stage/p1, .stage/p2, ...), so that one device call can carry one part. A wheel
that several lists pin with the same hash is staged once. Every part folder holds the same manifest.json:
all parts with each file's sha256 and size, each build's slim wheel (sha256, how to reassemble it, which
wheels its site gets, the torch it pins), and the wheel list with hashes. envs/gpu/install_offline.py reads it.

Idempotent: wheels come from a cache (default ~/.cache/specstudy/gpu-wheels, shared by all checkouts;
pip's own cache is used for the downloads), and a stage whose manifest and files already verify is left
as it is.

Run with any Python >= 3.9 that has pip; needs `zip` (to delete members without recompressing).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "scripts"))
from install_offline import MANIFEST, MANIFEST_FORMAT, InstallError, verify_part  # noqa: E402  (one manifest check for stage and install)

from specstudy.core.atomic import sha256_file  # noqa: E402

PART_LIMIT = 40_000_000  # bytes per part folder, manifest included (the device tool carries <= 64 MiB a call)
CARRY_LIMIT = 64 * 2**20  # what one device call carries: the working tree (tracked and untracked files git does
# not ignore) plus the carried paths. A part rides with the whole tree, so the tree must leave it room.
RESUME_RESERVE = 8_000_000  # kept free beside the largest part: a resume pack (lease.sh resume, carried with the
# last part) and the tree's growth between staging and the lease
MANIFEST_RESERVE = 64_000  # room kept in each part for manifest.json
STAGE_DIRNAME = ".stage"
FORMAT = MANIFEST_FORMAT  # 2: several vLLM builds ("builds"), each wheel listed once with the lists that use it
ENGINE_GLOB = "engine-*.txt"  # one pin list per vLLM build: engine-<version>.txt
DEFAULT_BUILD = "0.23.0"  # the build the harness site's env.sh serves with when a study names none

# Target image: the lent H200's 'cuda' image. vLLM 0.23.0's CUDA wheel pins torch==2.11.0 and links
# libcudart.so.13; the image has torch 2.11.0+cu130 on Python 3.12.
TARGET_PYTHON = "3.12"
TARGET_CUDA_MAJOR = 13
PLATFORM_ARGS = [
    "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none",
    *[a for p in ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
                  "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                  "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64", "any") for a in ("--platform", p)],
]  # fmt: skip

# Members dropped from each vLLM wheel, every one of which must be in it: FlashAttention 2 kernels (Hopper runs
# FlashAttention 3; vllm_flash_attn imports FA2 in a try), the MoE kernels (imported under
# contextlib.suppress(ImportError) by vllm.platforms, used only by MoE layers), the vllm-rs binary (the Rust
# front end, off unless VLLM_RUST_FRONTEND_PATH is set), deep_gemm builds for other Pythons.
_DEEP_GEMM_OTHER_PYTHONS = tuple(f"vllm/third_party/deep_gemm/_C.cpython-3{v}-x86_64-linux-gnu.so" for v in (10, 11, 13, 14))
SLIM_REMOVE = {
    "0.23.0": ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/_moe_C.abi3.so", "vllm/vllm-rs",
               *_DEEP_GEMM_OTHER_PYTHONS),
    # 0.26.0 has no _C / _moe_C: its kernels are the stable-ABI _C_stable_libtorch / _moe_C_stable_libtorch
    "0.26.0": ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/_moe_C_stable_libtorch.abi3.so", "vllm/vllm-rs",
               *_DEEP_GEMM_OTHER_PYTHONS),
}  # fmt: skip
# The compiled module the install imports to prove a build's kernels load (vllm.platforms.cuda imports it first)
KERNEL_MODULES = ("vllm._C", "vllm._C_stable_libtorch")
SLIM_PACKAGE = "vllm"
FIXED_ZIP_TIME = (2020, 1, 1, 0, 0, 0)


class StageError(Exception):
    pass


@dataclass(frozen=True)
class Pin:
    name: str  # normalized
    version: str
    sha256: str
    source: str  # which list: engine, harness, build

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)\s+--hash=sha256:([0-9a-f]{64})\s*$")


def parse_pins(path: Path, source: str) -> list[Pin]:
    """`name==version --hash=sha256:HEX` lines (pip's --require-hashes format); # comments and blanks."""
    pins = []
    for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        m = _PIN.match(line)
        if not m:
            raise StageError(f"{path}:{n}: expected 'name==version --hash=sha256:<64 hex>', got {raw!r}")
        pins.append(Pin(normalize(m[1]), m[2], m[3], source))
    names = [p.name for p in pins]
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise StageError(f"{path}: pinned twice: {', '.join(dup)}")
    return pins


def wheel_name_version(filename: str) -> tuple[str, str]:
    base = filename[:-4] if filename.endswith(".whl") else filename
    parts = base.split("-")
    return normalize(parts[0]), parts[1]


# ---------------------------------------------------------------------------------------------------------
# Fetching (network; pip checks the hashes, and we check them again on every use)


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise StageError(f"{' '.join(cmd[:6])} ... failed (exit {r.returncode}):\n{r.stdout[-4000:]}")


def index_by_hash(folder: Path) -> dict[str, Path]:
    out = {}
    if folder.is_dir():
        for f in sorted(folder.iterdir()):
            if f.is_file() and (f.suffix == ".whl" or f.name.endswith(".tar.gz")):
                out[sha256_file(f)] = f
    return out


def fetch_wheels(pins: list[Pin], req_file: Path, cache: Path) -> dict[Pin, Path]:
    """The wheel of each pin from cache/wheels, downloading (with --require-hashes) only when one is missing."""
    folder = cache / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    have = index_by_hash(folder)
    if any(p.sha256 not in have for p in pins):
        _pip("download", "--no-deps", "--require-hashes", "--only-binary=:all:", *PLATFORM_ARGS,
             "-d", str(folder), "-r", str(req_file))  # fmt: skip
        have = index_by_hash(folder)
    out = {}
    for p in pins:
        f = have.get(p.sha256)
        if f is None:
            raise StageError(f"{req_file}: no wheel with sha256 {p.sha256} for {p.requirement} after pip download")
        if wheel_name_version(f.name) != (p.name, p.version):
            raise StageError(f"{req_file}: the wheel with {p.requirement}'s hash is {f.name}")
        out[p] = f
    return out


def build_sdists(pins: list[Pin], req_file: Path, cache: Path) -> dict[Pin, Path]:
    """Download each pinned sdist (hash-checked) and build a wheel of it; built wheels are kept in cache/built."""
    sdir, bdir = cache / "sdist", cache / "built"
    sdir.mkdir(parents=True, exist_ok=True)
    bdir.mkdir(parents=True, exist_ok=True)
    out = {}
    for p in pins:
        built = [w for w in bdir.glob("*.whl") if wheel_name_version(w.name) == (p.name, p.version)]
        stamp = bdir / f"{p.name}-{p.version}.from-sdist-sha256"
        if len(built) == 1 and stamp.is_file() and stamp.read_text().strip() == p.sha256:
            out[p] = built[0]
            continue
        have = index_by_hash(sdir)
        if p.sha256 not in have:
            _pip("download", "--no-deps", "--require-hashes", "--no-binary=:all:", "-d", str(sdir), "-r", str(req_file))
            have = index_by_hash(sdir)
        if p.sha256 not in have:
            raise StageError(f"{req_file}: no sdist with sha256 {p.sha256} for {p.requirement}")
        for w in built:
            w.unlink()
        os.environ.setdefault("SOURCE_DATE_EPOCH", "1577836800")  # reproducible zip timestamps
        _pip("wheel", "--no-deps", "-w", str(bdir), str(have[p.sha256]))
        built = [w for w in bdir.glob("*.whl") if wheel_name_version(w.name) == (p.name, p.version)]
        if len(built) != 1 or not built[0].name.endswith("-py3-none-any.whl"):
            raise StageError(f"building {p.requirement} gave {[w.name for w in built]}, expected one py3-none-any wheel")
        stamp.write_text(p.sha256 + "\n")
        out[p] = built[0]
    return out


# ---------------------------------------------------------------------------------------------------------
# Slimming


def wheel_requires(wheel: Path, name: str) -> str | None:
    """The version pinned by `Requires-Dist: name==X` in a wheel's METADATA (None when unpinned)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            m = re.match(rf"Requires-Dist:\s*{re.escape(name)}\s*==\s*([^\s;,]+)\s*(;.*)?$", line, re.I)
            if m and not (m[2] and "extra" in m[2]):
                return m[1]
    return None


def slim_wheel(src: Path, dest: Path, remove: tuple[str, ...]) -> list[str]:
    """Copy src to dest without the members matching `remove` (zip -d: no recompression) and with a RECORD
    that no longer lists them. Every pattern must match a member (a renamed member is found at staging, not
    as a wheel that stays large). Returns the removed member names."""
    with zipfile.ZipFile(src) as z:
        names = z.namelist()
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        record = z.read(record_name).decode()
    absent = [pat for pat in remove if not any(fnmatch.fnmatchcase(n, pat) for n in names)]
    if absent:
        raise StageError(f"{src.name}: no member matches {absent}; update SLIM_REMOVE in {Path(__file__).name}")
    gone = [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in remove)]
    if shutil.which("zip") is None:
        raise StageError("`zip` is not installed here (apt-get install zip): it deletes wheel members without recompressing")
    tmp = dest.with_suffix(".tmp")
    shutil.copyfile(src, tmp)
    subprocess.run(["zip", "-q", "-d", str(tmp), *gone], check=True)
    kept = [ln for ln in record.splitlines(keepends=True) if ln.split(",", 1)[0] not in set(gone)]
    with tempfile.TemporaryDirectory() as td:
        rec = Path(td, record_name)
        rec.parent.mkdir(parents=True)
        rec.write_text("".join(kept))
        t = time.mktime((*FIXED_ZIP_TIME, 0, 0, -1))
        os.utime(rec, (t, t))
        subprocess.run(["zip", "-q", "-X", str(tmp.resolve()), record_name], check=True, cwd=td,
                       env={**os.environ, "TZ": "UTC"})  # fmt: skip
    with zipfile.ZipFile(tmp) as z:
        left = set(z.namelist())
        bad = z.testzip() if os.environ.get("SPECSTUDY_STAGE_TESTZIP") else None
    if set(gone) & left or bad:
        raise StageError(f"slimming {src.name} failed (still there: {sorted(set(gone) & left)}, bad member: {bad})")
    tmp.replace(dest)
    return gone


def slim_remove_for(version: str) -> tuple[str, ...]:
    if version not in SLIM_REMOVE:
        raise StageError(f"no SLIM_REMOVE entry for vLLM {version} in {Path(__file__).name}: list the members its "
                         f"wheel can drop (compare with {', '.join(SLIM_REMOVE)})")  # fmt: skip
    return SLIM_REMOVE[version]


def slim_cached(src: Path, cache: Path, remove: tuple[str, ...]) -> tuple[Path, list[str]]:
    """The slim wheel for src, from cache/slim when its recorded source and result hashes still hold."""
    folder = cache / "slim"
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / src.name
    info_path = folder / (src.name + ".json")
    src_sha = sha256_file(src)
    if dest.is_file() and info_path.is_file():
        info = json.loads(info_path.read_text())
        if info.get("source_sha256") == src_sha and info.get("remove") == list(remove) \
                and info.get("sha256") == sha256_file(dest):  # fmt: skip
            return dest, info["removed"]
    removed = slim_wheel(src, dest, remove)
    info_path.write_text(json.dumps({"source_sha256": src_sha, "remove": list(remove), "removed": removed,
                                     "sha256": sha256_file(dest)}, indent=1))  # fmt: skip
    return dest, removed


def kernel_module(wheel: Path) -> str:
    """The compiled kernel module of a vLLM wheel (0.23.0: vllm._C; 0.26.0: vllm._C_stable_libtorch)."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    for mod in KERNEL_MODULES:
        if f"{mod.replace('.', '/')}.abi3.so" in names:
            return mod
    raise StageError(f"{wheel.name} has none of {', '.join(KERNEL_MODULES)} (as .abi3.so); update KERNEL_MODULES")


# ---------------------------------------------------------------------------------------------------------
# Parts


@dataclass(frozen=True)
class Piece:
    part: int  # 1-based
    file: str  # name inside the part folder
    src: Path
    offset: int
    length: int


def plan_parts(splits: list[tuple[Path, str]], wheels: list[Path], limit: int = PART_LIMIT,
               reserve: int = MANIFEST_RESERVE) -> list[Piece]:  # fmt: skip
    """Fill parts in order: the files to split first, one after the other (each cut at the parts' capacity,
    named prefix.000, .001, ...), then the wheels whole, in the order given, each in the current part if it
    fits, else in the next."""
    cap = limit - reserve
    if cap <= 0:
        raise StageError(f"part limit {limit} leaves no room beside the manifest reserve {reserve}")
    pieces: list[Piece] = []
    part, used = 1, 0
    for split, chunk_prefix in splits:
        size, off, k = split.stat().st_size, 0, 0
        while off < size:
            if used >= cap:
                part, used = part + 1, 0
            n = min(cap - used, size - off)
            pieces.append(Piece(part, f"{chunk_prefix}.{k:03d}", split, off, n))
            off, used, k = off + n, used + n, k + 1
    for w in wheels:
        size = w.stat().st_size
        if size > cap:
            raise StageError(f"{w.name} ({size} bytes) is larger than a part ({cap} bytes)")
        if used + size > cap:
            part, used = part + 1, 0
        pieces.append(Piece(part, w.name, w, 0, size))
        used += size
    return pieces


def _copy_range(src: Path, dst: Path, offset: int, length: int) -> str:
    h = hashlib.sha256()
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        fi.seek(offset)
        left = length
        while left:
            b = fi.read(min(1 << 20, left))
            if not b:
                raise StageError(f"{src} is shorter than expected")
            h.update(b)
            fo.write(b)
            left -= len(b)
    return h.hexdigest()


def _range_sha(src: Path, offset: int, length: int) -> str:
    h = hashlib.sha256()
    with open(src, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            b = f.read(min(1 << 20, left))
            h.update(b)
            left -= len(b)
    return h.hexdigest()


def part_digest(files: list[dict]) -> str:
    """A part's sha256: over its files' 'name sha256 size' lines, in manifest order."""
    return hashlib.sha256("".join(f"{f['file']} {f['sha256']} {f['size']}\n" for f in files).encode()).hexdigest()


def build_manifest(pieces: list[Piece], builds: list[dict], wheels: list[dict], extra: dict | None = None,
                   limit: int = PART_LIMIT) -> dict:
    """builds: per vLLM build {"version", "slim_wheel": {"path", "filename", ...}, ...}; wheels: every other
    file once, each with the lists ("engine-<version>", "harness", "build") that use it."""
    parts: dict[int, list[dict]] = {}
    for p in pieces:
        parts.setdefault(p.part, []).append({"file": p.file, "sha256": _range_sha(p.src, p.offset, p.length),
                                             "size": p.length})  # fmt: skip
    where = {p.file: f"p{p.part}" for p in pieces}
    out_builds = []
    for b in builds:
        slim = b["slim_wheel"]
        chunk_names = [p.file for p in pieces if p.src == slim["path"]]
        out_builds.append({**b, "slim_wheel": {k: v for k, v in slim.items() if k != "path"} | {
            "chunks": [{"part": where[c], "file": c} for c in chunk_names]}})
    manifest = {
        "format": FORMAT,
        "made_by": "envs/gpu/stage.py",
        "part_limit": limit,
        "parts": [{"name": f"p{k}", "sha256": part_digest(v), "size": sum(f["size"] for f in v), "files": v}
                  for k, v in sorted(parts.items())],  # fmt: skip
        "builds": out_builds,
        "wheels": [{**w, "part": where[w["filename"]]} for w in wheels],
    }
    manifest.update(extra or {})
    return manifest


def verify_part_dir(folder: Path, manifest: dict, name: str) -> list[str]:
    """Problems with one part folder against the manifest (empty list: it verifies)."""
    try:
        problems = verify_part(folder, manifest, name)  # the files, as install_offline checks them on the node
    except InstallError as e:
        return [str(e)]
    entry = next(p for p in manifest["parts"] if p["name"] == name)
    on_disk = json.loads((folder / MANIFEST).read_text()) if (folder / MANIFEST).is_file() else None
    if on_disk != manifest:
        problems.append(f"{folder / MANIFEST}: missing or different")
    extra = {p.name for p in folder.iterdir()} - {f["file"] for f in entry["files"]} - {MANIFEST}
    if extra:
        problems.append(f"{folder}: files not in the manifest: {sorted(extra)}")
    return problems


def write_stage(stage: Path, pieces: list[Piece], manifest: dict) -> bool:
    """Write the part folders (stage/p1, ...). Returns False when the stage already matched and nothing was
    written. Folders of an earlier stage that are no longer parts are removed."""
    names = [p["name"] for p in manifest["parts"]]
    if all((stage / n).is_dir() and not verify_part_dir(stage / n, manifest, n) for n in names) and \
            {d.name for d in stage.glob("p*") if d.is_dir()} == set(names):  # fmt: skip
        return False
    stage.mkdir(parents=True, exist_ok=True)
    for d in stage.glob("p*"):
        if d.is_dir() and d.name not in names:
            shutil.rmtree(d)
    by_part: dict[str, list[Piece]] = {}
    for p in pieces:
        by_part.setdefault(f"p{p.part}", []).append(p)
    body = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    for name in names:
        folder = stage / name
        if folder.is_dir() and not verify_part_dir(folder, manifest, name):
            continue
        tmp = stage / f".{name}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        for p in by_part[name]:
            _copy_range(p.src, tmp / p.file, p.offset, p.length)
        (tmp / MANIFEST).write_text(body)
        problems = verify_part_dir(tmp, manifest, name)
        size = sum(f.stat().st_size for f in tmp.iterdir())
        if size > manifest["part_limit"]:
            problems.append(f"{folder}: {size} bytes with its manifest, over the part limit {manifest['part_limit']}")
        if problems:
            raise StageError("; ".join(problems))
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    (stage / MANIFEST).write_text(body)  # a copy at the top, for people; the installer reads the parts' own
    return True


def ensure_ignored(repo: Path, stage_dirname: str = STAGE_DIRNAME) -> None:
    """The stage must be git-ignored: the device tool sends every untracked file that git does not ignore."""
    r = subprocess.run(["git", "-C", str(repo), "check-ignore", "-q", f"{stage_dirname}/p1/x"], capture_output=True)
    if r.returncode == 0:
        return
    r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--git-path", "info/exclude"], capture_output=True,
                       text=True)  # fmt: skip
    if r.returncode != 0:
        raise StageError(f"{repo} is not a git checkout: cannot make {stage_dirname}/ ignored")
    exclude = Path(repo, r.stdout.strip()) if not Path(r.stdout.strip()).is_absolute() else Path(r.stdout.strip())
    exclude.parent.mkdir(parents=True, exist_ok=True)
    text = exclude.read_text() if exclude.is_file() else ""
    with open(exclude, "a") as f:
        f.write(("" if text.endswith("\n") or not text else "\n") + f"/{stage_dirname}/\n")


def tree_bytes(repo: Path) -> int:
    """Bytes the device tool sends as the working tree: tracked files and untracked files git does not ignore."""
    r = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True)  # fmt: skip
    if r.returncode != 0:
        raise StageError(f"{repo} is not a git checkout: cannot size the working tree the device call sends")
    names = {n for n in r.stdout.decode().split("\0") if n}
    return sum((repo / n).stat().st_size for n in names if (repo / n).is_file() and not (repo / n).is_symlink())


def check_carry(repo: Path, limit: int = PART_LIMIT, reserve: int = RESUME_RESERVE,
                carry: int = CARRY_LIMIT) -> int:  # fmt: skip
    """The working tree's bytes, when a part of `limit` bytes plus `reserve` still fits beside it in one device
    call; otherwise a StageError naming the sizes and the fix (found at staging, not when a lease is refused)."""
    tree = tree_bytes(repo)
    if tree + limit + reserve > carry:
        raise StageError(
            f"the working tree of {repo} is {tree / 1e6:.1f} MB: with a part of {limit / 1e6:.0f} MB and "
            f"{reserve / 1e6:.0f} MB kept for a resume pack it exceeds the {carry / 2**20:.0f} MiB one device call "
            f"carries. Fix: move large tracked files out of the tree (e.g. older results packs under docs/gpu-results/, "
            f"which git history keeps) or lower PART_LIMIT in envs/gpu/stage.py")
    return tree


# ---------------------------------------------------------------------------------------------------------


def version_key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.+-]", v))


def engine_lists(folder: Path = HERE) -> dict[str, Path]:
    """The pin list of each vLLM build: {version: folder/engine-<version>.txt}, oldest first."""
    found = {f.name[len("engine-"):-len(".txt")]: f for f in folder.glob(ENGINE_GLOB)}
    return {v: found[v] for v in sorted(found, key=version_key)}


def parse_builds(text: str | None, available: dict[str, Path]) -> list[str]:
    """`--builds 0.23.0,0.26.0` (None or empty: every build with a pin list), checked against the pin lists."""
    wanted = [b.strip() for b in (text or "").split(",") if b.strip()] or list(available)
    unknown = [b for b in wanted if b not in available]
    if unknown or not wanted:
        raise StageError(f"--builds {text}: no pin list for {', '.join(unknown) or 'any build'}; the builds are "
                         f"{', '.join(available) or 'none'} (envs/gpu/{ENGINE_GLOB}). Fix: name those, or add "
                         f"envs/gpu/engine-<version>.txt with vllm==<version> and its dependencies")  # fmt: skip
    return sorted(dict.fromkeys(wanted), key=version_key)


def engine_provided(harness: Path) -> list[str]:
    """The names harness.txt's `# engine-provided: a b c` line leaves to every engine list."""
    for line in Path(harness).read_text().splitlines():
        if line.startswith("# engine-provided:"):
            return [normalize(n) for n in line.split(":", 1)[1].split()]
    return []


def check_lists(pins: dict[str, list[Pin]], lists: dict[str, Path]) -> None:
    """Each engine list pins its own vllm; harness and build share no name with any other list; a name+version
    pinned by two engine lists has one hash."""
    for key, ps in pins.items():
        if key.startswith("engine-"):
            want = key[len("engine-"):]
            got = [p.version for p in ps if p.name == SLIM_PACKAGE]
            if got != [want]:
                raise StageError(f"{lists[key]}: must pin {SLIM_PACKAGE}=={want} (its name says so), pins {got or 'none'}")
    for name in engine_provided(lists["harness"]):
        for key, ps in pins.items():
            if key.startswith("engine-") and name not in {p.name for p in ps}:
                raise StageError(f"{lists[key]} does not pin {name}, which {lists['harness']} leaves to the engine "
                                 f"lists (its '# engine-provided:' line). Fix: pin it there too")
    for own in ("harness", "build"):
        mine = {p.name for p in pins[own]}
        for key, ps in pins.items():
            both = sorted(mine & {p.name for p in ps}) if key != own else []
            if both:
                raise StageError(f"pinned in both {lists[own]} and {lists[key]}: {', '.join(both)}. Fix: keep each in "
                                 f"one list (the harness finds what the engine lists pin in the default build's site)")
    seen: dict[str, Pin] = {}
    for key, ps in pins.items():
        for p in ps:
            other = seen.setdefault(p.requirement, p)
            if other.sha256 != p.sha256:
                raise StageError(f"{p.requirement} has sha256 {other.sha256} in {lists[other.source]} and {p.sha256} "
                                 f"in {lists[key]}. Fix: pin one wheel (the same hash) in both")


def describe_part(part: dict, manifest: dict) -> str:
    """What a part holds, for people: the vLLM chunks by build and how many wheels of which lists."""
    files = {f["file"] for f in part["files"]}
    bits = []
    for b in manifest["builds"]:
        chunks = [c["file"] for c in b["slim_wheel"]["chunks"] if c["file"] in files]
        if chunks:
            n = len(b["slim_wheel"]["chunks"])
            idx = [b["slim_wheel"]["chunks"].index({"part": part["name"], "file": c}) + 1 for c in chunks]
            bits.append(f"vLLM {b['version']} chunk {idx[0]}" + (f"-{idx[-1]}" if len(idx) > 1 else "") + f" of {n}")
    wheels = [w for w in manifest["wheels"] if w["filename"] in files]
    if wheels:
        kinds: dict[str, int] = {}
        for w in wheels:
            k = "+".join(sorted({"engine" if x.startswith("engine-") else x for x in w["lists"]}))
            kinds[k] = kinds.get(k, 0) + 1
        bits.append(", ".join(f"{n} {k} wheel{'s' if n > 1 else ''}" for k, n in kinds.items()))
    return "; ".join(bits)


def stage(repo: Path, cache: Path, builds: list[str] | None = None, log=print) -> dict:
    t0 = time.monotonic()
    available = engine_lists(HERE)
    builds = builds or list(available)
    lists = {f"engine-{v}": available[v] for v in builds} | {"harness": HERE / "harness.txt", "build": HERE / "build.txt"}
    pins = {k: parse_pins(v, k) for k, v in lists.items()}
    check_lists(pins, lists)
    ensure_ignored(repo)
    tree = check_carry(repo, PART_LIMIT, RESUME_RESERVE, CARRY_LIMIT)
    log(f"stage: working tree {tree / 1e6:.1f} MB + a part of <= {PART_LIMIT / 1e6:.0f} MB + "
        f"{RESUME_RESERVE / 1e6:.0f} MB reserve fit the {CARRY_LIMIT / 2**20:.0f} MiB of one device call")
    paths: dict[Pin, Path] = {}
    for key in lists:
        if key != "build":
            paths.update(fetch_wheels(pins[key], lists[key], cache))
    log(f"stage: {len(set(paths.values()))} pinned wheels verified in {cache / 'wheels'} ({time.monotonic() - t0:.1f}s)")
    paths.update(build_sdists(pins["build"], lists["build"], cache))
    out_builds, splits = [], []
    for v in builds:
        key = f"engine-{v}"
        vllm_pin = next(p for p in pins[key] if p.name == SLIM_PACKAGE)
        source = paths.pop(vllm_pin)
        slim_path, removed = slim_cached(source, cache, slim_remove_for(v))
        slim_sha = sha256_file(slim_path)
        log(f"stage: {source.name} slimmed {source.stat().st_size / 1e6:.1f} -> {slim_path.stat().st_size / 1e6:.1f} MB, "
            f"sha256 {slim_sha} ({time.monotonic() - t0:.1f}s)")
        torch_pin = wheel_requires(source, "torch")
        if not torch_pin:
            raise StageError(f"{source.name} does not pin torch==X; cannot record which torch it needs")
        out_builds.append({
            "version": v, "list": key,
            # what the install imports with only this build's site on PYTHONPATH, as a server naming it runs
            "imports": [SLIM_PACKAGE, kernel_module(source), "vllm.entrypoints.openai.api_server"],
            "requires": {"torch": torch_pin}, "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
            "slim_wheel": {"path": slim_path, "filename": slim_path.name, "requirement": vllm_pin.requirement,
                           "sha256": slim_sha, "size": slim_path.stat().st_size, "source_sha256": vllm_pin.sha256,
                           "removed": removed},
        })  # fmt: skip
        splits.append((slim_path, f"vllm-{v}-slim.whl.part"))
    order = [p for key in lists for p in pins[key] if p in paths]  # engine lists in build order, harness, build
    wheels: dict[str, dict] = {}
    for p in order:
        path = paths[p]
        sha = sha256_file(path)
        entry = wheels.setdefault(sha, {"filename": path.name, "requirement": p.requirement, "sha256": sha,
                                        "size": path.stat().st_size, "lists": []})  # fmt: skip
        entry["lists"].append(p.source)
        if p.source == "build":
            entry["sdist_sha256"] = p.sha256
    names = [w["filename"] for w in wheels.values()]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise StageError(f"two different wheels named {', '.join(clash)} (pinned with different hashes). Fix: pin one")
    by_name = {paths[p].name: paths[p] for p in order}
    pieces = plan_parts(splits, [by_name[w["filename"]] for w in wheels.values()], PART_LIMIT, MANIFEST_RESERVE)
    default = DEFAULT_BUILD if DEFAULT_BUILD in builds else builds[0]
    extra = {"requires": {"python": TARGET_PYTHON, "cuda_major": TARGET_CUDA_MAJOR}, "default_build": default}
    manifest = build_manifest(pieces, out_builds, list(wheels.values()), extra, PART_LIMIT)
    wrote = write_stage(repo / STAGE_DIRNAME, pieces, manifest)
    total = sum(p["size"] for p in manifest["parts"])
    for p in manifest["parts"]:
        log(f"stage: {STAGE_DIRNAME}/{p['name']}: {p['size'] / 1e6:.1f} MB, {len(p['files'])} files: "
            f"{describe_part(p, manifest)}")
    shared = sum(1 for w in manifest["wheels"] if len(w["lists"]) > 1)
    log(f"stage: {'written' if wrote else 'already up to date'}: builds {', '.join(builds)} (default {default}), "
        f"{len(manifest['wheels'])} wheels ({shared} used by more than one list, staged once), "
        f"{len(manifest['parts'])} parts, {total / 1e6:.1f} MB in all ({time.monotonic() - t0:.1f}s)")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=REPO, help="repository root (default: this checkout)")
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get(
        "SPECSTUDY_GPU_WHEEL_CACHE", Path.home() / ".cache" / "specstudy" / "gpu-wheels")))
    ap.add_argument("--builds", default=None,
                    help=f"vLLM builds to stage, comma-separated (default: every envs/gpu/{ENGINE_GLOB})")
    ap.add_argument("--check-carry", action="store_true",
                    help="only check that the working tree leaves room for a part and a resume pack in one device call")
    args = ap.parse_args(argv)
    try:
        if args.check_carry:
            tree = check_carry(args.repo.resolve())
            print(f"stage: working tree {tree / 1e6:.1f} MB; room for a {PART_LIMIT / 1e6:.0f} MB part and "
                  f"{RESUME_RESERVE / 1e6:.0f} MB reserve within {CARRY_LIMIT / 2**20:.0f} MiB")
            return 0
        stage(args.repo.resolve(), args.cache, parse_builds(args.builds, engine_lists(HERE)))
    except StageError as e:
        print(f"stage: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
