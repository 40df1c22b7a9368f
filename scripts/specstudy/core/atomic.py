"""Result files on disk: atomic writes, the one JSON reader and the file hasher.

Every result is written to a temporary sibling and renamed into place, so a reader (or Snakemake with
``--keep-incomplete``) never sees a half-written file. Standard library only: the GPU staging imports it
before anything is installed.

A file written under a results tree (a directory named ``results``, or ``results-…``) is also *recorded*:
its sha256, size and mtime go to a hidden sidecar ``.<name>.sha256`` beside it, written right after the file
itself. :func:`read_json`/:func:`read_jsonl` compare the bytes they read with it, and :func:`recorded_problems`
(run by the Snakefile before any job, and by ``specstudy check-results``) finds every recorded file whose
content changed since it was written (a hand edit, a truncated copy), comparing sizes and mtimes first and
hashing only a file whose size or mtime moved. A file without a sidecar (written before files were recorded,
by another tool, or by hand in a test tree) is read as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp creates 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if is_recorded(path):
        _record(path, hashlib.sha256(data).hexdigest())
    return path


# ------------------------------------------------------------------ recorded results files

SIDECAR_SUFFIX = ".sha256"


#: folders of a results tree whose files are not recorded: model directories (their content is identified by
#: specstudy.job.spec.model_identity and ``models-verify``, and a sidecar would become part of that identity)
UNRECORDED_DIRS = frozenset({"models"})


def is_recorded(path: str | os.PathLike) -> bool:
    """Files under a results tree (a directory ``results`` or ``results-…``) are recorded, except in its
    :data:`UNRECORDED_DIRS` and hidden folders (caches); sidecars are not."""
    path = Path(path)
    if path.name.startswith(".") and path.name.endswith(SIDECAR_SUFFIX):
        return False
    parts = path.parent.absolute().parts
    roots = [i for i, p in enumerate(parts) if p == "results" or p.startswith("results-")]
    if not roots:
        return False
    inside = parts[roots[-1] + 1:]
    return not any(p in UNRECORDED_DIRS or p.startswith(".") for p in inside)


def sidecar(path: str | os.PathLike) -> Path:
    """Where ``path``'s recorded sha256 lives: ``.<name>.sha256`` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}{SIDECAR_SUFFIX}")


def _record(path: Path, sha: str) -> None:
    st = path.stat()
    text = json.dumps({"sha256": sha, "size": st.st_size, "mtime_ns": st.st_mtime_ns}, sort_keys=True) + "\n"
    side = sidecar(path)
    fd, tmp = tempfile.mkstemp(prefix=f"{side.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, side)
    _VERIFIED[str(path.absolute())] = (st.st_size, st.st_mtime_ns)


#: absolute path -> (size, mtime_ns) of a recorded file this process already found intact
_VERIFIED: dict[str, tuple[int, int]] = {}


def recorded_sha256(path: str | os.PathLike) -> dict | None:
    """The sidecar's record of ``path`` (sha256, size, mtime_ns), or None when the file is not recorded."""
    try:
        rec = json.loads(sidecar(path).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("sha256"), str) else None


def check_recorded(path: str | os.PathLike, data: bytes | None = None) -> None:
    """Raise :class:`Changed` when ``path`` (its bytes ``data`` when already read) differs from its record.
    A file found intact is remembered (by size and mtime) for the rest of the process."""
    path = Path(path)
    if not is_recorded(path):
        return
    key = str(path.absolute())
    try:
        st = path.stat()
    except OSError:
        return
    if _VERIFIED.get(key) == (st.st_size, st.st_mtime_ns):
        return
    rec = recorded_sha256(path)
    if rec is None:
        return
    sha = hashlib.sha256(data).hexdigest() if data is not None else sha256_file(path)
    if sha != rec["sha256"]:
        raise Changed(path, rec["sha256"], sha)
    _VERIFIED[key] = (st.st_size, st.st_mtime_ns)


def recorded_problems(root: str | os.PathLike) -> list[Changed]:
    """Every recorded file under ``root`` whose content differs from its record. Cheap: a file whose size and
    mtime are the recorded ones is taken as intact; only the others are hashed. A sidecar whose file is gone
    is not a problem here (the rule that writes the file runs again)."""
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if not (name.startswith(".") and name.endswith(SIDECAR_SUFFIX)) or name.endswith(".tmp"):
                continue
            path = Path(dirpath) / name[1:-len(SIDECAR_SUFFIX)]
            rec = recorded_sha256(path)
            if rec is None:
                continue
            try:
                st = path.stat()
            except OSError:
                continue
            if (st.st_size, st.st_mtime_ns) == (rec.get("size"), rec.get("mtime_ns")):
                continue
            if path.is_file() and (sha := sha256_file(path)) != rec["sha256"]:
                out.append(Changed(path, rec["sha256"], sha))
    return sorted(out, key=lambda c: c.path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def dumps_json(obj: Any) -> str:
    """Canonical JSON used for every record: sorted keys, 2-space indent, trailing newline."""
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False, default=str) + "\n"


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return write_text(path, dumps_json(obj))


def replace_if_changed(path: str | os.PathLike, data: bytes, same=None) -> bool:
    """Write ``data`` to ``path`` atomically unless the file already holds the same content; True when written.

    Content is the bytes, or, given ``same(old_bytes, new_bytes) -> bool``, what that comparison says
    (e.g. a record compared without the fields of the publishing step). An unchanged file keeps its
    bytes and its mtime, so nothing downstream of it looks out of date (docs/deployments.md, "Re-running
    a finished study").
    """
    path = Path(path)
    try:
        old = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        old = None
    if old is not None and (old == data or (same is not None and _same(same, old, data))):
        return False
    write_bytes(path, data)
    return True


def _same(same, old: bytes, new: bytes) -> bool:
    try:
        return bool(same(old, new))
    except ValueError:  # an unreadable old file is never "the same"
        return False


def write_json_if_changed(path: str | os.PathLike, obj: Any, same=None) -> bool:
    """:func:`write_json` unless ``path`` already holds this content (:func:`replace_if_changed`)."""
    return replace_if_changed(path, dumps_json(obj).encode("utf-8"), same)


def write_jsonl(path: str | os.PathLike, rows) -> Path:
    text = "".join(json.dumps(r, sort_keys=True, allow_nan=False, default=str) + "\n" for r in rows)
    return write_text(path, text)


class BadFile(ValueError):
    """A JSON/JSONL file that cannot be parsed; the message names the file, the place and the fix."""

    def __init__(self, path: str | os.PathLike, detail: str):
        self.path = str(path)
        super().__init__(
            f"{path}: {detail}. The file is truncated or corrupt (an interrupted copy, a full disk, a hand edit). "
            "Fix: delete it and re-run the rule that writes it (raw attempts under attempts/ keep the originals), "
            "or restore it from a backup.")


class Changed(BadFile):
    """A recorded results file whose content is not what its writer wrote (a :class:`BadFile`)."""

    def __init__(self, path: str | os.PathLike, recorded: str, now: str | None):
        self.path, self.recorded, self.now = str(path), recorded, now
        what = "is missing" if now is None else f"was changed after it was written (sha256 {now[:12]}…, recorded " \
                                                f"{recorded[:12]}… in {sidecar(path).name})"
        try:
            rel = os.path.relpath(path)
        except ValueError:
            rel = str(path)
        rel = rel if not rel.startswith("..") else str(path)
        ValueError.__init__(
            self,
            f"{path}: {what}; a result is never edited by hand. Fix: `specstudy check-results --repair` moves it "
            f"aside (or restores it from the attempt that holds the recorded bytes) and names the command that "
            f"writes it again (`specstudy rerun {rel}` for a cell or a deployment record, else "
            f"`snakemake --profile profiles/local {rel}`)")


def read_json(path: str | os.PathLike) -> Any:
    with open(path, "rb") as fh:
        data = fh.read()
    check_recorded(path, data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadFile(path, f"not UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadFile(path, f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None


def read_jsonl(path: str | os.PathLike) -> list[Any]:
    rows = []
    check_recorded(path)
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise BadFile(path, f"line {n} is not valid JSON ({exc.msg}, column {exc.colno})") from None
    return rows


def sha256_file(path: str | os.PathLike, limit: int | None = None) -> str:
    """sha256 of a file's bytes (the first ``limit`` bytes or more, whole 1 MiB blocks, when given)."""
    h = hashlib.sha256()
    read = 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
            read += len(block)
            if limit is not None and read >= limit:
                break
    return h.hexdigest()
