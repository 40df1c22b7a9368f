"""Full sha256 of large files (model weights, container images), computed once per (path, size, mtime).

A deployment's provenance names every weight file and the container image by content, but reading
140 GB of weights and a 30 GB image after every deployment would cost minutes of a GPU node each
time. :class:`HashCache` keeps each file's sha256 under its real path together with the size and
mtime it had when it was hashed; a later deployment (another job, another node) that finds the same
size and mtime takes the recorded hash without reading a byte. A changed size or mtime is hashed again
and replaces the entry. A file rewritten with the same size *and* its old mtime restored is not
noticed: that is the price of not reading it.

The cache is one JSON file (``results/.cache/content-hashes.json``, :func:`specstudy.core.layout.hash_cache`)
shared by every deployment job of a study, possibly at the same moment on several nodes:

* each update re-reads the file under a lock (``<cache>.lock``, :mod:`filelock`) and replaces it
  atomically (:func:`specstudy.core.atomic.write_json`), so readers never see half a file and no
  job's entry is lost;
* a file is hashed under a lock of its own (``<cache>.locks/<key>.lock``): a second job that needs
  the same file waits for the first one's hash instead of reading the same bytes again.

Every failure of the cache itself (unwritable folder, a file system without locks, a damaged cache
file) leaves the hash computed and recorded; only the caching is lost, and ``how`` says so.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from specstudy.core import atomic
from specstudy.core.timestamps import utc_now

SCHEMA = "specstudy.hash-cache/1"


def _hash_bytes(path: str | os.PathLike) -> str:
    """The one place a cached file's bytes are read (tests count the calls)."""
    return atomic.sha256_file(path)


class HashCache:
    """sha256 of files by (real path, size, mtime_ns); ``path=None`` keeps the cache in memory only."""

    def __init__(self, path: str | os.PathLike | None = None, *, lock_timeout_s: float = 3600.0):
        self.path = Path(path) if path else None
        self.lock_timeout_s = lock_timeout_s
        self._entries: dict[str, dict] | None = None
        self.hashed: list[str] = []  # real paths whose bytes this instance read
        self.errors: list[str] = []  # what went wrong with the cache itself (the hashes stay right)

    # ------------------------------------------------------------------ the cache file
    def _read(self) -> dict[str, dict]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = atomic.read_json(self.path)
        except (OSError, ValueError) as exc:
            self.errors.append(f"{self.path}: unreadable ({exc}); hashing again")
            return {}
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("entries"), dict):
            self.errors.append(f"{self.path}: not a {SCHEMA} file; hashing again")
            return {}
        return data["entries"]

    def _entries_now(self) -> dict[str, dict]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def _lock(self, path: Path):
        from filelock import FileLock

        path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(path), timeout=self.lock_timeout_s)

    def _store(self, real: str, entry: dict) -> None:
        self._entries_now()[real] = entry
        if self.path is None:
            return
        with self._lock(self.path.with_name(self.path.name + ".lock")):
            entries = self._read()  # other jobs' entries written since this one read the file
            entries[real] = entry
            atomic.write_json(self.path, {"schema": SCHEMA, "entries": dict(sorted(entries.items()))})

    @staticmethod
    def _matches(entry: dict | None, size: int, mtime_ns: int) -> str | None:
        if entry and entry.get("size") == size and entry.get("mtime_ns") == mtime_ns and entry.get("sha256"):
            return str(entry["sha256"])
        return None

    # ------------------------------------------------------------------ lookups
    def sha256(self, path: str | os.PathLike) -> dict:
        """``{"sha256", "size", "mtime_ns", "how"}`` of ``path`` (symlinks followed); ``how`` is ``cache``
        (no byte read), ``hashed`` (read once now and cached) or why the hash is missing or uncached."""
        p = Path(path)
        try:
            st = p.stat()
            real = str(p.resolve())
        except OSError as exc:
            return {"sha256": None, "size": None, "mtime_ns": None, "how": f"unreadable: {exc.strerror or exc}"}
        out = {"sha256": None, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "how": "cache"}
        hit = self._matches(self._entries_now().get(real), st.st_size, st.st_mtime_ns)
        if hit:
            return dict(out, sha256=hit)
        if self.path is None:
            return self._hash_and_store(real, out)
        key = hashlib.sha256(real.encode()).hexdigest()[:32]
        try:
            with self._lock(self.path.with_name(self.path.name + ".locks") / f"{key}.lock"):
                self._entries = self._read()  # another job may have hashed it while this one waited
                hit = self._matches(self._entries.get(real), st.st_size, st.st_mtime_ns)
                if hit:
                    return dict(out, sha256=hit)
                return self._hash_and_store(real, out)
        except Exception as exc:  # noqa: BLE001 - a lock/cache failure must not lose the hash
            self.errors.append(f"{self.path}: {type(exc).__name__}: {exc}")
            if real in self.hashed:  # the bytes were read before the cache failed
                entry = self._entries_now().get(real)
                return dict(out, sha256=(entry or {}).get("sha256"), how="hashed (cache not written)")
            return self._hash_and_store(real, out, store=False)

    def _hash_and_store(self, real: str, out: dict, store: bool = True) -> dict:
        t0 = time.monotonic()
        try:
            digest = _hash_bytes(real)
        except OSError as exc:
            return dict(out, how=f"unreadable: {exc.strerror or exc}")
        self.hashed.append(real)
        try:
            st = os.stat(real)
        except OSError:
            st = None
        if st is None or (st.st_size, st.st_mtime_ns) != (out["size"], out["mtime_ns"]):
            return dict(out, how="changed while it was hashed: no hash recorded")
        entry = {"sha256": digest, "size": out["size"], "mtime_ns": out["mtime_ns"],
                 "seconds": round(time.monotonic() - t0, 3), "hashed_at": utc_now()}
        if store:
            self._store(real, entry)
            return dict(out, sha256=digest, how="hashed")
        self._entries_now()[real] = entry
        return dict(out, sha256=digest, how="hashed (cache not written)")
