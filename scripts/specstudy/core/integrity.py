"""Results verified, not trusted (issue 29): a cell summary's digest and its place in the results tree.

Every writer of a cell summary (cell.run_cell, the deployment job's failed cells, the upstream importer)
seals it: ``integrity = {"sha256": <digest of the rest of the summary>, "attempt": <deployment id>}``.
``specstudy tables`` re-computes the digest of every summary it reads and refuses one that does not
match (an edited number), and refuses a summary whose own ``keys`` disagree with its path (a summary
copied into another arm's or cell's directory).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from specstudy.core import layout
from specstudy.core.errors import UserError

FIELD = "integrity"


class IntegrityError(UserError):
    """A result file that is not what its writer wrote, or not where its writer put it."""


def digest(summary: dict) -> str:
    """sha256 of the summary's canonical JSON without its ``integrity`` field."""
    from specstudy.core.atomic import dumps_json

    body = {k: v for k, v in summary.items() if k != FIELD}
    # the summary as it reads back from disk (atomic.dumps_json: what every writer writes), canonical
    text = json.dumps(json.loads(dumps_json(body)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def seal(summary: dict) -> dict:
    """Add (or renew) the summary's digest and attempt; returns the summary."""
    summary.pop(FIELD, None)
    summary[FIELD] = {"sha256": digest(summary), "attempt": (summary.get("keys") or {}).get("deployment_id")}
    return summary


def sealed_copies(path: Any) -> list:
    """The attempt copies of a published cell summary (``<deployment>/attempts/*/<workload>/c<N>/summary.json``,
    what the deployment job published it from) that carry a seal; none for a path that is no cell summary
    (specstudy.core.layout)."""
    if not layout.matches("cell", path):
        return []
    k = layout.parse("cell", path)
    attempts = Path(layout.deployment_dir(k["phase"], k["arm"], k["rep"], root=k["root"])) / layout.ATTEMPTS
    found = []
    for copy in sorted(attempts.glob(f"*/{layout.cell_rel(k['workload'], k['concurrency'])}/{layout.CELL_SUMMARY}")):
        try:
            if isinstance(json.loads(copy.read_bytes()).get(FIELD), dict):
                found.append(copy)
        except (OSError, ValueError):
            continue
    return found


def verify_digest(raw: dict, path: Any) -> None:
    seal_ = raw.get(FIELD)
    if not isinstance(seal_, dict):
        # Unsealed: written before summaries were sealed, or by hand in a test tree, and then keys and schema
        # still apply. But a cell whose deployment job sealed it (its attempt copy says so) has had its seal
        # taken off: an edit laundered by deleting the digest.
        copies = sealed_copies(path)
        if copies:
            raise IntegrityError(
                f"{path}: field 'integrity' missing, but its deployment job sealed this cell ({copies[-1]} carries the "
                "seal): the summary was changed after it was written; a measured number must not be edited by "
                f"hand: restore it from that copy or re-measure the cell with `specstudy rerun {path}`")
        return
    want, got = seal_.get("sha256"), digest(raw)
    if want != got:
        raise IntegrityError(
            f"{path}: field 'integrity.sha256': the summary was changed after its deployment job wrote it (digest "
            f"{got[:12]}…, recorded {str(want)[:12]}…); a measured number must not be edited by hand: restore it from "
            f"the attempt's copy under attempts/{seal_.get('attempt')}/ or re-measure the cell with "
            f"`specstudy rerun {path}`")
    if seal_.get("attempt") != (raw.get("keys") or {}).get("deployment_id"):
        raise IntegrityError(f"{path}: field 'integrity.attempt' {seal_.get('attempt')!r} differs from "
                             f"keys.deployment_id {(raw.get('keys') or {}).get('deployment_id')!r}; re-measure the cell "
                             f"with `specstudy rerun {path}`")


def verify_fields(raw: dict, path: Any) -> None:
    """Fields that schema ``cell-summary`` forbids (its closed objects: the top level and ``keys``) are
    refused, as the schema says, rather than ignored by the reader."""
    from specstudy.core.schemas import load_schema

    schema = load_schema("cell-summary")
    for where, obj, sub in (("", raw, schema), ("keys.", raw.get("keys") or {}, schema["properties"]["keys"])):
        if sub.get("additionalProperties") is False:
            extra = sorted(set(obj) - set(sub["properties"]))
            if extra:
                raise IntegrityError(f"{path}: field(s) {', '.join(where + e for e in extra)} not allowed by schema "
                                     f"cell-summary (known: {', '.join(sorted(sub['properties']))}); a summary is "
                                     "written by its deployment job, not edited: re-measure the cell with "
                                     f"`specstudy rerun {path}`")


def verify_place(raw: dict, path: Any, *, phase: str, arm: str, rep: int, rep_label: str, workload: str,
                 concurrency: int) -> None:
    """The summary's own keys must name the cell its path names (phase, arm, rep, workload, concurrency,
    and a method that is the arm's)."""
    from specstudy.core.arms import parse_arm

    keys = raw.get("keys") or {}
    expected = {"phase": phase, "arm": arm, "workload": workload, "concurrency": concurrency}
    if keys.get("rep_label") is not None:
        expected["rep_label"] = rep_label
    else:
        expected["rep"] = rep
    try:
        spec = parse_arm(arm)
    except ValueError:
        spec = {}
    expected.update({k: spec[k] for k in ("method", "num_speculative_tokens", "draft_tensor_parallel_size") if k in spec})
    wrong = [f"keys.{k} is {keys.get(k)!r}, the path says {v!r}" for k, v in expected.items() if keys.get(k) != v]
    if wrong:
        raise IntegrityError(f"{path}: this summary belongs elsewhere: {'; '.join(wrong)}. A summary is only valid "
                             f"where its deployment job wrote it: move it back ({layout.readable('cell')} from its keys) or "
                             f"re-measure with `specstudy rerun {path}`")
