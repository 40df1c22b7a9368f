"""The locked selection: once the confirmation plan records it, the selection is never written again.

``results/plan/confirm.json`` records the sha256 of the selection it was built from; from then on
the selection and the screening files it was computed from (its ``inputs``, each with its sha256)
are the lock. At every parse of the workflow (``rules/common.smk``) :func:`check` compares them:

- a selection that no longer matches its own digest or the plan's sha256, or
- a screening input that exists with other content than the selection recorded

stops the run before any job, naming the files and the two ways out (restore the screening files
from their attempts, or archive confirmation with the selection and start it again). A missing
input is not a change: the job that writes it is about to run again (a deleted cell re-run by its
path) and its new content is checked at the next parse. While the lock holds, the ``select`` rule's
inputs are ``ancient`` (a re-run screening cell never re-runs the selection) and ``specstudy select``
refuses to write a selection other than the one the plan recorded. Every consumer of the selection
(the confirmation plan, each confirmation deployment, ``check-results``) reads it through
:func:`verify_selection`, which refuses one edited by hand.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specstudy.core import atomic, layout
from specstudy.core.atomic import sha256_file
from specstudy.core.records import Plan, read_plan, to_record

CONFIRM_PLAN = layout.plan("confirm")
SELECTION = layout.selection()
#: the command that archives confirmation with the selection and its plan, so that both are made again
RESELECT_COMMAND = "make confirm-again RESELECT=1"
RESTORE_COMMAND = "specstudy check-results --repair"


class LockBroken(RuntimeError):
    """The locked selection or its screening inputs changed; the message names the files and the fix."""


@dataclass
class Changed:
    path: str
    recorded: str
    now: str | None  # None: missing


def locked(root: str | os.PathLike = ".") -> bool:
    """Whether confirmation has a plan (from then on the selection is locked)."""
    return (Path(root) / CONFIRM_PLAN).exists()


def changed_inputs(selection: dict, root: str | os.PathLike = ".", include_missing: bool = False) -> list[Changed]:
    """The selection's recorded inputs whose content is not what it recorded (missing ones only when asked)."""
    out = []
    for entry in selection.get("inputs") or []:
        p = Path(root) / entry["path"]
        if not p.exists():
            if include_missing:
                out.append(Changed(entry["path"], entry["sha256"], None))
            continue
        now = sha256_file(p)
        if now != entry["sha256"]:
            out.append(Changed(entry["path"], entry["sha256"], now))
    return out


def check(root: str | os.PathLike = ".") -> None:
    """Raise :class:`LockBroken` when the locked selection or its screening inputs changed (see module doc)."""
    root = Path(root)
    if not locked(root) or not (root / SELECTION).exists():
        return
    try:
        sel = verify_selection(root / SELECTION, root / CONFIRM_PLAN)
    except SelectionError as exc:
        raise LockBroken(f"{exc}. The confirmation plan {CONFIRM_PLAN} locks the selection it was built from; "
                         f"`specstudy check-results` says what is consistent and prints the command that repairs "
                         f"the tree (restore, or archive confirmation and select again: {RESELECT_COMMAND})") from None
    changed = changed_inputs(sel, root)
    if changed:
        raise LockBroken(message(changed))


def message(changed: list[Changed]) -> str:
    files = "; ".join(f"{c.path} (sha256 {c.now[:12]}…, the selection recorded {c.recorded[:12]}…)"
                      if c.now else f"{c.path} (missing)" for c in changed)
    return (f"screening data changed after the selection was locked by the confirmation plan {CONFIRM_PLAN}: "
            f"{files}. The locked selection {SELECTION} is never rewritten; nothing was run. Either restore the "
            f"screening files the selection was made from (`{RESTORE_COMMAND}` copies them back from their "
            f"attempts/ where it can; `specstudy check-results` lists what it can restore), or accept the new "
            f"screening data: `{RESELECT_COMMAND}` archives confirmation, the selection and its plan under "
            "results-archive/ and runs selection and confirmation again")


class SelectionError(RuntimeError):
    pass


def selection_digest(selection: dict) -> str:
    """sha256 of the selection's canonical JSON (sorted keys, no whitespace), the ``digest`` field left out."""
    import hashlib
    import json

    body = {k: v for k, v in selection.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def verify_selection(path: str | Path, plan: Plan | dict | str | Path | None = None) -> dict:
    """The selection at ``path`` after checking it was not edited by hand: its ``digest`` must match its
    content and, given the confirmation plan (a records.Plan, plan.make_plan's dict or the plan's path), its
    file sha256 must equal the plan's record."""
    path = Path(path)
    try:
        sel = atomic.read_json(path)
    except (OSError, ValueError) as exc:
        raise SelectionError(f"{path}: cannot read the selection ({exc}); re-run the select rule") from exc
    digest = sel.get("digest")
    if not digest:
        raise SelectionError(f"{path}: field 'digest' missing; a selection written by `specstudy select` carries "
                             "it. Re-create the selection from the screening outputs (snakemake --forcerun select "
                             "after removing the protected file)")
    actual = selection_digest(sel)
    if actual != digest:
        raise SelectionError(f"{path}: content does not match its field 'digest' ({digest} recorded, {actual} "
                             "computed): the selection was edited after `specstudy select` wrote it. Restore it "
                             "or re-create it from the screening outputs; a hand-edited selection is never consumed")
    if plan is not None:
        if isinstance(plan, Plan | dict):
            plan_path = "<confirmation plan>"
            plan = plan if isinstance(plan, Plan) else to_record(plan, Plan, plan_path)
        else:
            plan_path = str(plan)
            plan = read_plan(plan)
        recorded = plan.selection.sha256 if plan.selection else None
        if not recorded:
            raise SelectionError(f"{plan_path}: field 'selection.sha256' missing; a confirmation plan records the "
                                 "selection it was built from. Re-run the plan_confirm rule")
        now = sha256_file(path)
        if now != recorded:
            raise SelectionError(f"{path}: sha256 {now} differs from the one recorded in {plan_path} "
                                 f"(selection.sha256 = {recorded}): the selection changed after the confirmation "
                                 "plan was made. Restore the selection the plan was built from, or re-plan")
    return sel
