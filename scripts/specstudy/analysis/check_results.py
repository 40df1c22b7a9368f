"""``specstudy check-results``: is this results tree consistent, and what is the one command that repairs it?

Checks, in the order a study makes its files:

0. every results file specstudy recorded when it wrote it (specstudy.core.atomic: a sidecar ``.<name>.sha256``)
   still holds those bytes (a hand edit or a truncated copy is found here);
1. the pre-registration lock (``results/screen/prereg-lock.json``) against the pre-registration file;
2. the selection against its own ``digest``, and against the sha256 the confirmation plan recorded;
3. the selection's screening inputs (cells, deployment records, screening gates) against the sha256 the
   selection recorded for each (specstudy.study.selection_lock);
4. every declared deployment record (``results/<phase>/<arm>/<rep>/deployment.json``) against its cells:
   each declared ``summary.json`` must be the copy of the attempt file the record names.

Each check prints ``ok`` or ``NOT OK`` with what it found; the last line is the one command that repairs the
tree (nothing to do when everything is consistent). ``--repair`` runs the repair that needs no measurement:
it copies changed or missing screening files back from the attempts that hold the bytes the selection
recorded (every attempt stays on disk), then checks again. A repair that needs a decision (accept new
screening data: archive confirmation and select again) is printed, never run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from specstudy.core import atomic, layout
from specstudy.core.atomic import sha256_file
from specstudy.study.plan import CORE_PHASES
from specstudy.study.selection_lock import CONFIRM_PLAN, RESELECT_COMMAND, RESTORE_COMMAND, SELECTION, changed_inputs

LOCK = layout.prereg_lock()


@dataclass
class Finding:
    check: str
    ok: bool
    detail: str


@dataclass
class Result:
    findings: list[Finding] = field(default_factory=list)
    repair: str | None = None  # the one command that repairs the tree; None when consistent
    restorable: dict[str, Path] = field(default_factory=dict)  # declared file -> attempt copy with the recorded bytes
    changed: list = field(default_factory=list)  # recorded files whose bytes changed (atomic.Changed)

    @property
    def consistent(self) -> bool:
        return all(f.ok for f in self.findings)

    def add(self, check: str, ok: bool, detail: str, repair: str | None = None) -> None:
        self.findings.append(Finding(check, ok, detail))
        if not ok and repair and self.repair is None:
            self.repair = repair


#: a declared file's kind -> where its attempts' copies are (the kind of folder, the file in it)
_ATTEMPT_COPIES = {"deployment": ("attempt", layout.ATTEMPT_RECORD), "cell": ("attempt_cell_dir", layout.CELL_SUMMARY)}


def attempt_copy(root: Path, declared: str, sha256: str) -> Path | None:
    """An attempt file holding the bytes ``sha256`` of a declared cell summary or deployment record."""
    # results/<phase>/<arm>/<rep>/deployment.json  or  results/<phase>/<arm>/<rep>/<workload>/c<c>/summary.json
    kind = next((k for k in _ATTEMPT_COPIES if layout.matches(k, declared)), None)
    if kind is None:
        return None
    attempt, name = _ATTEMPT_COPIES[kind]
    keys = layout.parse(kind, declared)
    if keys.pop("root") != layout.ROOT:
        return None
    pattern = f"{layout.glob_pattern(attempt, layout.ROOT, **keys)}/{name}"
    for cand in sorted(root.glob(pattern)):
        if sha256_file(cand) == sha256:
            return cand
    return None


def _core_records(root: Path) -> list[tuple[Path, layout.Deployment]]:
    """Every declared deployment record of screening and confirmation under ``root/results`` (its path, and its
    deployment relative to ``root``)."""
    out = []
    for rec_path in sorted(root.glob(layout.glob_pattern("deployment"))):
        rel = rec_path.relative_to(root)
        if layout.matches("deployment", rel) and (dep := layout.parse_deployment(rel)).phase in CORE_PHASES:
            out.append((rec_path, dep))
    return out


def check_tree(root: str | os.PathLike = ".") -> Result:
    from specstudy.study.config import ConfigError
    from specstudy.study.prereg_guard import verify_lock
    from specstudy.study.selection_lock import SelectionError, verify_selection

    root = Path(root)
    res = Result()
    for c in atomic.recorded_problems(root / layout.ROOT):
        rel = os.path.relpath(c.path, root)
        copy = attempt_copy(root, rel, c.recorded)
        if copy is not None:
            res.restorable[rel] = copy
        else:
            res.changed.append(c)
        where = (f"restorable from {copy.relative_to(root)}" if copy is not None
                 else f"to be moved aside and written again by `{rewrite_command(rel)}`")
        res.add("recorded files", False, f"{rel}: sha256 {c.now[:12]}…, recorded {c.recorded[:12]}… when it was "
                                         f"written ({where})", RESTORE_COMMAND)
    if not any(f.check == "recorded files" for f in res.findings):
        res.add("recorded files", True, "every results file specstudy recorded holds the bytes it wrote")
    lock_path = root / LOCK
    if not lock_path.exists():
        res.add("pre-registration lock", True, f"{LOCK} not written yet (screening has not started)")
    else:
        prereg = None
        try:
            prereg = atomic.read_json(lock_path).get("preregistration") or ""
            lock = verify_lock(lock_path, prereg if os.path.isabs(prereg) else root / prereg)
            res.add("pre-registration lock", True, f"{prereg} matches {LOCK} (sha256 {lock['sha256'][:12]}…)")
        except (ConfigError, ValueError, OSError) as exc:
            res.add("pre-registration lock", False, str(exc), f"git checkout {prereg}" if prereg else None)

    sel_path, plan_path = root / SELECTION, root / CONFIRM_PLAN
    sel = None
    if not sel_path.exists():
        res.add("selection", True, f"{SELECTION} not written yet")
    else:
        try:
            sel = verify_selection(sel_path)
            res.add("selection", True, f"{SELECTION} matches its digest; confirmation arms {sel['confirmation_arms']}")
        except SelectionError as exc:
            res.add("selection", False, str(exc), RESELECT_COMMAND)
    if sel is not None and plan_path.exists():
        try:
            verify_selection(sel_path, plan_path)
            res.add("confirmation plan", True, f"{CONFIRM_PLAN} records this selection's sha256 (the selection is "
                                               "locked)")
        except SelectionError as exc:
            res.add("confirmation plan", False, f"{exc}. The selection was rewritten after confirmation was planned",
                    RESELECT_COMMAND)
    elif plan_path.exists() and sel is None and not sel_path.exists():
        res.add("confirmation plan", False, f"{CONFIRM_PLAN} exists but the selection it was built from "
                                            f"({SELECTION}) is missing", RESELECT_COMMAND)

    if sel is not None:
        changed = changed_inputs(sel, root, include_missing=True)
        if not changed:
            res.add("screening inputs", True, f"all {len(sel.get('inputs') or [])} files the selection was made from "
                                              "hold the content it recorded")
        for c in changed:
            copy = attempt_copy(root, c.path, c.recorded)
            if copy is not None:
                res.restorable[c.path] = copy
            what = "missing" if c.now is None else f"sha256 {c.now[:12]}…, the selection recorded {c.recorded[:12]}…"
            where = (f"restorable from {copy.relative_to(root)}" if copy is not None
                     else "no attempt holds the recorded bytes")
            locked = plan_path.exists()
            if c.now is None and locked:
                fix = f"snakemake --profile profiles/local {c.path}"  # rebuilt by its job (a reused cell: same bytes)
            elif copy is not None:
                fix = RESTORE_COMMAND
            else:
                fix = RESELECT_COMMAND if locked else f"snakemake --profile profiles/local {layout.selection()}"
            res.add("screening inputs", False, f"{c.path}: {what} ({where})", fix)

    for rec_path, dep in _core_records(root):
        rel = rec_path.relative_to(root)
        try:
            rec = atomic.read_json(rec_path)
        except ValueError as exc:
            res.add("deployment records", False, str(exc), f"specstudy rerun {rel}")
            continue
        bad = []
        for c in rec.get("cells") or []:
            declared = root / dep.cell(c["workload"], c["concurrency"]).summary
            src = Path(c.get("summary") or "")
            src = src if src.is_absolute() else root / src
            if not declared.exists():
                bad.append(f"{declared.relative_to(root)} missing")
            elif not src.exists():
                bad.append(f"{src} (named by the record) missing")
            elif sha256_file(declared) != sha256_file(src):
                bad.append(f"{declared.relative_to(root)} differs from {c.get('summary')}")
        if bad:
            res.add("deployment records", False, f"{rel}: " + "; ".join(bad),
                    f"specstudy rerun {bad[0].split(' ')[0]}")
    if not any(f.check == "deployment records" for f in res.findings):
        n = len(_core_records(root))
        res.add("deployment records", True, f"{n} deployment records, every declared cell is the copy of the attempt "
                                            "its record names")
    if res.consistent:
        res.repair = None
    elif res.repair is None:
        res.repair = RESELECT_COMMAND
    return res


def rewrite_command(rel: str) -> str:
    """The command that writes the results file ``rel`` again: a cell or deployment record is re-measured by
    ``specstudy rerun``, any other file by its rule."""
    if layout.matches("cell", rel) or layout.matches("deployment", rel):
        return f"specstudy rerun {rel}"
    return f"snakemake --profile profiles/local {rel}"


def repair(root: str | os.PathLike = ".") -> list[str]:
    """Copy every restorable file back from its attempt (the bytes the selection, or the file's own record,
    recorded); move every other changed recorded file aside, naming the command that writes it again."""
    root = Path(root)
    done = []
    res = check_tree(root)
    for declared, copy in res.restorable.items():
        atomic.write_bytes(root / declared, copy.read_bytes())
        done.append(f"restored {declared} from {copy.relative_to(root)}")
    for c in res.changed:
        path = Path(c.path)
        aside = path.with_name(f"{path.name}.changed-{c.now[:12]}")
        os.replace(path, aside)
        atomic.sidecar(path).unlink(missing_ok=True)
        rel = os.path.relpath(path, root)
        done.append(f"moved {rel} aside to {aside.name}; write it again with `{rewrite_command(rel)}`")
    return done


def _print(res: Result) -> None:
    for f in res.findings:
        print(f"{'ok    ' if f.ok else 'NOT OK'} {f.check}: {f.detail}")
    if res.consistent:
        print("consistent: nothing to repair")
    else:
        print(f"repair: {res.repair}")


def _cmd_check(args) -> int:
    os.chdir(args.directory)
    if args.repair:
        res = check_tree(".")
        if res.repair == RESTORE_COMMAND:
            for line in repair("."):
                print(line)
        elif not res.consistent:
            _print(res)
            print("--repair restores screening files from their attempts only; run the command above")
            return 1
    res = check_tree(".")
    _print(res)
    return 0 if res.consistent else 1


def register(sub) -> None:
    p = sub.add_parser("check-results", help="check a results tree (lock, selection, plans, records' digests) and "
                                             "print the one command that repairs it",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--directory", default=".", help="the study's working directory (holding results/)")
    p.add_argument("--repair", action="store_true", help="restore changed screening files from their attempts")
    p.set_defaults(func=_cmd_check)
