"""Result files on disk: atomic writes, the one JSON reader and the file hasher.

Every result is written to a temporary sibling and renamed into place, so a reader (or Snakemake with
``--keep-incomplete``) never sees a half-written file. Standard library only: the GPU staging imports it
before anything is installed.
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
    return path


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


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadFile(path, f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None


def read_jsonl(path: str | os.PathLike) -> list[Any]:
    rows = []
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
