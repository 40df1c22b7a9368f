"""The pre-registration lock, verified wherever the pre-registration is consumed.

``results/screen/prereg-lock.json`` records the sha256 of the pre-registration (and, since issue
#21, its parsed content) before screening starts. Every later use — Snakemake's parse of the
workflow (so every rule: plans, deployments, gates, selection, capacity, tables, report) and the
``select`` command — calls :func:`verify_lock`, which refuses a changed file and names the fields
that changed, the lock and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specstudy.core import atomic, layout
from specstudy.study.config import ConfigError


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists are leaves."""
    if isinstance(obj, dict) and obj:
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def changed_fields(locked: Any, current: Any) -> list[str]:
    """Dotted field names whose values differ, e.g. ``confirmation.concurrency: [1, 4, 8] -> [1, 4, 16]``."""
    a, b = flatten(locked), flatten(current)
    out = []
    for key in sorted(set(a) | set(b)):
        if key not in a:
            out.append(f"{key}: added ({b[key]!r})")
        elif key not in b:
            out.append(f"{key}: removed (was {a[key]!r})")
        elif a[key] != b[key]:
            out.append(f"{key}: {a[key]!r} -> {b[key]!r}")
    return out


def lock_content(path: str | os.PathLike) -> Any:
    """The parsed pre-registration as stored in the lock (for field-level comparisons later)."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def read_lock(lock_path: str | os.PathLike) -> dict:
    """The lock file, refused (ConfigError) when it is another kind of file (a summary, a plan given as --lock)."""
    lock = atomic.read_json(lock_path)
    if not isinstance(lock, dict) or lock.get("schema", "specstudy.prereg-lock/1") != "specstudy.prereg-lock/1" \
            or not isinstance(lock.get("sha256"), str):
        kind = lock.get("schema") if isinstance(lock, dict) else type(lock).__name__
        raise ConfigError(f"{lock_path}: not a pre-registration lock (field 'sha256' missing, schema {kind!r}); give "
                          f"{layout.prereg_lock()}, written by `specstudy prereg-lock` (the prereg_lock rule)")
    return lock


def verify_lock(lock_path: str | os.PathLike, prereg_file: str | os.PathLike) -> dict:
    """Refuse (ConfigError) when ``prereg_file`` differs from what ``lock_path`` locked; return the lock."""
    lock_path, prereg_file = Path(lock_path), Path(prereg_file)
    lock = read_lock(lock_path)
    current = atomic.sha256_file(prereg_file)
    if lock.get("sha256") == current:
        return lock
    fields = []
    if "content" in lock:
        try:
            fields = changed_fields(lock["content"], lock_content(prereg_file))
        except Exception as exc:  # an unparsable file is a change too
            fields = [f"(the file no longer parses: {exc})"]
    what = ("changed fields: " + "; ".join(fields)) if fields else \
        "changed bytes only (comments or formatting) or a lock written before field-level locks"
    raise ConfigError(
        f"{prereg_file}: the pre-registration changed since screening started — {what}. "
        f"{lock_path} locked sha256 {lock.get('sha256')}, the file now hashes to {current}. "
        f"A pre-registered design must not change after the fact: restore the file (e.g. git checkout {prereg_file}) "
        "or start a new study in a new results directory.")


def verify_recorded(results: str | os.PathLike, prereg_file: str | os.PathLike) -> None:
    """Every screening deployment record carries the sha256 of the pre-registration it ran under
    (``prereg_sha256``): refuse (ConfigError) when one differs from the file, so that deleting
    ``results/screen/prereg-lock.json`` after an edit cannot launder the edit into a fresh lock."""
    results, prereg_file = Path(results), Path(prereg_file)
    if not Path(layout.phase_dir("screen", results)).is_dir():
        return
    current = atomic.sha256_file(prereg_file)
    lock = Path(layout.prereg_lock(results))
    for rec in sorted(results.glob(layout.glob_pattern("deployment", "", phase="screen"))):
        try:
            recorded = atomic.read_json(rec).get("prereg_sha256")
        except atomic.BadFile as exc:
            raise ConfigError(str(exc)) from None
        if recorded and recorded != current:
            raise ConfigError(
                f"{prereg_file}: screening results were measured under another pre-registration: {rec} records "
                f"prereg_sha256 {recorded}, the file now hashes to {current}"
                + ("" if lock.exists() else f" (and {lock} is missing: deleting the lock does not unlock an edit)")
                + f". Restore the pre-registration the study locked (e.g. git checkout {prereg_file}) or start a new "
                  "study in a new results directory.")
