#!/usr/bin/env python3
"""Stage vLLM + the harness for the offline GPU machine (docs/gpu.md, "Offline install").

Downloads the wheels pinned in envs/gpu/{engine,harness}.txt (sha256-checked by pip and again here), builds
the sdist-only packages of envs/gpu/build.txt into wheels, slims the vLLM wheel (drops what a Hopper run of
a Llama-family model does not load) and writes everything into the git-ignored REPO/.stage/ as parts of at
most 45 MB, one folder each (.stage/p1, .stage/p2, ...), so that one device call can carry one part. Every
part folder holds the same manifest.json: all parts with each file's sha256 and size, the slim wheel's
sha256 and how to reassemble it, and the wheel list with hashes. envs/gpu/install_offline.py reads it.

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
from install_offline import MANIFEST, InstallError, verify_part  # noqa: E402  (one manifest check for stage and install)

from specstudy.core.atomic import sha256_file  # noqa: E402

PART_LIMIT = 45_000_000  # bytes per part folder, manifest included (the device tool carries <= 64 MiB a call)
CARRY_LIMIT = 64 * 2**20  # what one device call carries: the working tree (tracked and untracked files git does
# not ignore) plus the carried paths. A part rides with the whole tree, so the tree must leave it room.
RESUME_RESERVE = 8_000_000  # kept free beside the largest part: a resume pack (lease.sh resume, carried with the
# last part) and the tree's growth between staging and the lease
MANIFEST_RESERVE = 64_000  # room kept in each part for manifest.json
STAGE_DIRNAME = ".stage"
FORMAT = 1

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

# Members dropped from the vLLM wheel: FlashAttention 2 kernels (Hopper runs FlashAttention 3), the MoE
# kernels (only import-probed for a dense model), the vllm-rs binary, deep_gemm builds for other Pythons.
SLIM_REMOVE = (
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    "vllm/_moe_C.abi3.so",
    "vllm/vllm-rs",
    "vllm/third_party/deep_gemm/_C.cpython-310-x86_64-linux-gnu.so",
    "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
    "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so",
    "vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so",
)
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


def slim_wheel(src: Path, dest: Path, remove: tuple[str, ...] = SLIM_REMOVE) -> list[str]:
    """Copy src to dest without the members matching `remove` (zip -d: no recompression) and with a RECORD
    that no longer lists them. Returns the removed member names."""
    with zipfile.ZipFile(src) as z:
        names = z.namelist()
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        record = z.read(record_name).decode()
    gone = [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in remove)]
    if not gone:
        raise StageError(f"{src.name}: none of {remove} is in the wheel; update SLIM_REMOVE in {Path(__file__).name}")
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


def slim_cached(src: Path, cache: Path) -> tuple[Path, list[str]]:
    """The slim wheel for src, from cache/slim when its recorded source and result hashes still hold."""
    folder = cache / "slim"
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / src.name
    info_path = folder / (src.name + ".json")
    src_sha = sha256_file(src)
    if dest.is_file() and info_path.is_file():
        info = json.loads(info_path.read_text())
        if info.get("source_sha256") == src_sha and info.get("remove") == list(SLIM_REMOVE) \
                and info.get("sha256") == sha256_file(dest):  # fmt: skip
            return dest, info["removed"]
    removed = slim_wheel(src, dest)
    info_path.write_text(json.dumps({"source_sha256": src_sha, "remove": list(SLIM_REMOVE), "removed": removed,
                                     "sha256": sha256_file(dest)}, indent=1))  # fmt: skip
    return dest, removed


# ---------------------------------------------------------------------------------------------------------
# Parts


@dataclass(frozen=True)
class Piece:
    part: int  # 1-based
    file: str  # name inside the part folder
    src: Path
    offset: int
    length: int


def plan_parts(split: Path | None, chunk_prefix: str, wheels: list[Path], limit: int = PART_LIMIT,
               reserve: int = MANIFEST_RESERVE) -> list[Piece]:  # fmt: skip
    """Fill parts in order: the file to split first (cut at each part's capacity, named chunk_prefix.000, .001,
    ...), then the wheels whole, in the order given, each in the current part if it fits, else in the next."""
    cap = limit - reserve
    if cap <= 0:
        raise StageError(f"part limit {limit} leaves no room beside the manifest reserve {reserve}")
    pieces: list[Piece] = []
    part, used = 1, 0
    if split is not None:
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


def build_manifest(pieces: list[Piece], slim: dict | None, wheels: list[dict], extra: dict | None = None,
                   limit: int = PART_LIMIT) -> dict:
    parts: dict[int, list[dict]] = {}
    for p in pieces:
        parts.setdefault(p.part, []).append({"file": p.file, "sha256": _range_sha(p.src, p.offset, p.length),
                                             "size": p.length})  # fmt: skip
    where = {p.file: f"p{p.part}" for p in pieces}
    manifest = {
        "format": FORMAT,
        "made_by": "envs/gpu/stage.py",
        "part_limit": limit,
        "parts": [{"name": f"p{k}", "sha256": part_digest(v), "size": sum(f["size"] for f in v), "files": v}
                  for k, v in sorted(parts.items())],  # fmt: skip
        "wheels": [{**w, "part": where[w["filename"]]} for w in wheels],
    }
    if slim is not None:
        chunk_names = [p.file for p in pieces if p.src == slim["path"]]
        manifest["slim_wheel"] = {k: v for k, v in slim.items() if k != "path"} | {
            "chunks": [{"part": where[c], "file": c} for c in chunk_names]}
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


def stage(repo: Path, cache: Path, log=print) -> dict:
    t0 = time.monotonic()
    lists = {k: HERE / f"{k}.txt" for k in ("engine", "harness", "build")}
    pins = {k: parse_pins(v, k) for k, v in lists.items()}
    names = [p.name for ps in pins.values() for p in ps]
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise StageError(f"pinned in more than one of {', '.join(str(v) for v in lists.values())}: {', '.join(dup)}")
    ensure_ignored(repo)
    tree = check_carry(repo)
    log(f"stage: working tree {tree / 1e6:.1f} MB + a part of <= {PART_LIMIT / 1e6:.0f} MB + "
        f"{RESUME_RESERVE / 1e6:.0f} MB reserve fit the {CARRY_LIMIT / 2**20:.0f} MiB of one device call")
    files = {**fetch_wheels(pins["engine"], lists["engine"], cache),
             **fetch_wheels(pins["harness"], lists["harness"], cache)}  # fmt: skip
    log(f"stage: {len(files)} pinned wheels verified in {cache / 'wheels'} ({time.monotonic() - t0:.1f}s)")
    built = build_sdists(pins["build"], lists["build"], cache)
    vllm_pin = next(p for p in pins["engine"] if p.name == SLIM_PACKAGE)
    source = files.pop(vllm_pin)
    slim_path, removed = slim_cached(source, cache)
    slim_sha = sha256_file(slim_path)
    log(f"stage: {source.name} slimmed {source.stat().st_size / 1e6:.1f} -> {slim_path.stat().st_size / 1e6:.1f} MB, "
        f"sha256 {slim_sha} ({time.monotonic() - t0:.1f}s)")
    torch_pin = wheel_requires(source, "torch")
    if not torch_pin:
        raise StageError(f"{source.name} does not pin torch==X; cannot record which torch it needs")
    order = [p for p in pins["engine"] if p != vllm_pin] + pins["harness"] + pins["build"]
    paths = {**files, **built}
    wheel_paths = [paths[p] for p in order]
    wheels = [{"filename": paths[p].name, "requirement": p.requirement, "list": p.source, "sha256": sha256_file(paths[p]),
               "size": paths[p].stat().st_size} | ({"sdist_sha256": p.sha256} if p.source == "build" else {})
              for p in order]  # fmt: skip
    slim = {"path": slim_path, "filename": slim_path.name, "requirement": vllm_pin.requirement, "sha256": slim_sha,
            "size": slim_path.stat().st_size, "source_sha256": vllm_pin.sha256, "removed": removed}  # fmt: skip
    pieces = plan_parts(slim_path, "vllm-slim.whl.part", wheel_paths)
    extra = {"requires": {"python": TARGET_PYTHON, "torch": torch_pin, "cuda_major": TARGET_CUDA_MAJOR},
             "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"}}  # fmt: skip
    manifest = build_manifest(pieces, slim, wheels, extra)
    wrote = write_stage(repo / STAGE_DIRNAME, pieces, manifest)
    total = sum(p["size"] for p in manifest["parts"])
    for p in manifest["parts"]:
        log(f"stage: {STAGE_DIRNAME}/{p['name']}: {p['size'] / 1e6:.1f} MB, {len(p['files'])} files")
    log(f"stage: {'written' if wrote else 'already up to date'}: {len(manifest['parts'])} parts, {total / 1e6:.1f} MB "
        f"in all ({time.monotonic() - t0:.1f}s)")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=REPO, help="repository root (default: this checkout)")
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get(
        "SPECSTUDY_GPU_WHEEL_CACHE", Path.home() / ".cache" / "specstudy" / "gpu-wheels")))
    ap.add_argument("--check-carry", action="store_true",
                    help="only check that the working tree leaves room for a part and a resume pack in one device call")
    args = ap.parse_args(argv)
    try:
        if args.check_carry:
            tree = check_carry(args.repo.resolve())
            print(f"stage: working tree {tree / 1e6:.1f} MB; room for a {PART_LIMIT / 1e6:.0f} MB part and "
                  f"{RESUME_RESERVE / 1e6:.0f} MB reserve within {CARRY_LIMIT / 2**20:.0f} MiB")
            return 0
        stage(args.repo.resolve(), args.cache)
    except StageError as e:
        print(f"stage: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
