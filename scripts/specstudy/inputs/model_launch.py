"""The pinned swiss-ai/model-launch example the recommendation is delivered against.

One manifest (JSON: ``repository``, ``commit``, ``path``, ``local`` — the verbatim copy beside it —, ``sha256``,
``bytes``) pins the example; the study config names it (``recommendation.model_launch``; shipped:
``tests/data/model-launch/manifest.json``). :func:`load_manifest` reads it and refuses a copy whose bytes are not
the pinned file's; ``check-config`` calls it at parse, the report (:mod:`specstudy.report.model_launch`) when it
writes the patch.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from specstudy.core.errors import UserError

MANIFEST_FIELDS = ("repository", "commit", "path", "local", "sha256", "bytes")

#: One ``--speculative-config.<key> <value>`` line of an ``sml advanced --framework-args "..."`` command: its
#: indentation, key, value and what ends the line (`` \\`` continuation, or the closing quote).
LINE_RE = re.compile(r'^(?P<indent>\s*)--speculative-config\.(?P<key>[A-Za-z0-9_.]+)[ =](?P<value>[^\s"\\]+)'
                     r'(?P<tail>"?\s*\\?\s*)$')

_FIX = "restore the shipped tests/data/model-launch/ (git checkout) or re-pin the example (docs/report.md)"


def load_manifest(path: str | Path) -> dict:
    """The manifest of the pinned example, its copy checked: every field present, a full commit, the copy's size
    and sha256 as the manifest says. Adds ``text`` (the copy's content) and ``file`` (its path)."""
    path = Path(path)
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: the model-launch manifest cannot be read ({exc}); config field "
                        f"'recommendation.model_launch' names it; {_FIX}") from None
    if not isinstance(man, dict):
        raise UserError(f"{path}: expected a JSON object with {', '.join(MANIFEST_FIELDS)}")
    missing = [f for f in MANIFEST_FIELDS if not man.get(f)]
    if missing:
        raise UserError(f"{path}: field '{missing[0]}' is missing; the manifest needs {', '.join(MANIFEST_FIELDS)}")
    if not re.fullmatch(r"[0-9a-f]{40}", str(man["commit"])):
        raise UserError(f"{path}: field 'commit' is {man['commit']!r}; pin a full 40-hex commit of {man['repository']}")
    copy = path.parent / man["local"]
    try:
        data = copy.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: field 'local' names {copy}, which cannot be read ({exc}); {_FIX}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != man["sha256"] or len(data) != int(man["bytes"]):
        raise UserError(f"{copy}: sha256 {digest} ({len(data)} bytes) differs from the manifest's field 'sha256' "
                        f"{man['sha256']} ({man['bytes']} bytes): the copy is not the file at {man['repository']}@"
                        f"{man['commit'][:12]}; {_FIX}")
    return {**man, "file": str(copy), "text": data.decode("utf-8")}


def example_flags(text: str) -> dict[str, str]:
    """The example's ``--speculative-config.<key> <value>`` settings, in file order."""
    return {m["key"]: m["value"] for m in (LINE_RE.match(line) for line in text.splitlines()) if m}


def manifest_path(ref: str | Path, repo_root: Path) -> Path:
    """The config's manifest path: relative to the working directory, else to the repository."""
    p = Path(ref)
    return p if (p.is_absolute() or p.exists()) else repo_root / p
