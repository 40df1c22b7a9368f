"""What the *content* of a published result is, record by record: the one definition the deployment job
(write only what changed), ``specstudy check-results`` and the tests share.

A re-run of a finished cell republishes files that describe the same measurement. Snakemake compares an
input's sha256 with the one it recorded when the job reading it ran (files up to 1 MB), so a published
file whose bytes do not change never re-runs anything downstream; these functions decide when a new
publication describes the same thing as the file already in place, so that the file is kept as it is
(bytes and mtime, ``atomic.replace_if_changed``).

- cell summary (``summary.json``): its bytes. A reused cell is a byte copy of the attempt it ran in.
- deployment record (``deployment.json``): everything but the fields of the publishing step — ``reused_by``
  (the job that republished it without a server) and each cell's ``status`` (``reused`` on a
  republication, ``valid``/``rejected`` when measured: the cell's validity lives in the summary its
  ``summary`` path names, an attempt file that never changes); cells compared as a set.
- capacity files, gates, selection, round checkpoints, final candidate, plans: their bytes (none carries a
  time of writing except the capacity search's ``gates.json``, which is new content: a new search).
"""

from __future__ import annotations

import json
from typing import Any

#: fields of a deployment record that describe the publishing step, not the deployment
PUBLISH_FIELDS = ("reused_by",)


def deployment_content(rec: dict) -> dict:
    """A deployment record without the fields of the publishing step (see the module docstring)."""
    out = {k: v for k, v in rec.items() if k not in PUBLISH_FIELDS}
    cells = rec.get("cells") or []
    out["cells"] = sorted(
        json.dumps({k: v for k, v in c.items() if k != "status"}, sort_keys=True) for c in cells)
    return out


def same_deployment(old: bytes | str | dict, new: bytes | str | dict) -> bool:
    """Whether two deployment records (bytes, text or parsed) describe the same deployment."""
    return deployment_content(_parsed(old)) == deployment_content(_parsed(new))


def _parsed(x: Any) -> dict:
    if isinstance(x, dict):
        return x
    try:
        obj = json.loads(x)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj
