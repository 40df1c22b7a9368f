"""Timestamps of records: the one format they are stamped in, and the one reader of every stamp written so far.

Every record is stamped in UTC, ISO 8601 to the millisecond with a ``Z``: ``2026-12-02T10:11:12.345Z``
(:func:`utc_now`; :func:`utc_iso` for a Unix time). Ids and directory names that carry a time use its
compact form ``20261202T101112Z`` (:func:`compact`), which sorts as it reads and needs no quoting.

:func:`parse` and :func:`to_unix` read any ISO 8601 stamp back, including the forms older records carry
(a ``+00:00`` offset, microseconds, whole seconds); a stamp without a zone is UTC.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

__all__ = ["compact", "parse", "to_unix", "utc_iso", "utc_now"]


def utc_iso(ts: float) -> str:
    """The Unix time ``ts`` as a record's stamp (``2026-12-02T10:11:12.345Z``)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def utc_now() -> str:
    """Now, as a record's stamp."""
    return utc_iso(time.time())


def compact(ts: float | None = None) -> str:
    """``ts`` (default: now) as the compact stamp of an id or a directory name (``20261202T101112Z``)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(ts))


def parse(stamp: str | None) -> datetime | None:
    """An ISO 8601 stamp as an aware UTC datetime (no zone: UTC); None when empty or not a stamp."""
    if not stamp or not isinstance(stamp, str):
        return None
    try:
        dt = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def to_unix(v) -> float | None:
    """Seconds since the epoch from a finite number or a numeric string (already Unix) or an ISO 8601 stamp;
    None when unknown (None, booleans, non-finite numbers, anything else)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float):
        return float(v) if math.isfinite(v) else None
    if not isinstance(v, str):
        return None
    try:
        f = float(v)
    except ValueError:
        dt = parse(v)
        return None if dt is None else dt.timestamp()
    return f if math.isfinite(f) else None
