"""Results built from a checkpoint output that no longer exists are stale: move them aside.

Snakemake does not look past a missing checkpoint output when the files built from it still
exist: after ``select`` fails (and Snakemake deletes ``selection.json``), ``snakemake report`` and
``all`` print "Nothing to be done" over the old report. At every workflow parse,
:func:`quarantine_stale` moves the report and the tables — the files that present results as
current — to ``results/stale/<UTC time>/`` (never deleted) when a checkpoint output they were
built from is missing, so that Snakemake rebuilds them after re-running the checkpoint.

Nothing is moved while the workflow is parsed: :func:`stale_dependents` (read-only) lets the input
functions plan the rebuild (a dry run shows it), and the workflow's ``onstart`` handler, which
Snakemake runs before the first job and never for a dry run, calls :func:`quarantine_stale`.
"""

from __future__ import annotations

import os
from pathlib import Path

from specstudy.core import layout
from specstudy.core.timestamps import compact

#: checkpoint output -> results built from it that present the study as current
CHECKPOINT_DEPENDENTS = {
    layout.selection(): (layout.report_dir(), layout.tables_dir()),
    layout.final_candidate(): (layout.report_dir(),),
}


def stale_dependents(root: str | os.PathLike = ".", capacity: bool = True) -> list[tuple[str, str]]:
    """``(checkpoint output, dependent directory)`` pairs where the checkpoint output is missing and the
    directory built from it still holds files. ``capacity``: whether the study runs the capacity search;
    without it the final candidate is never built and its absence says nothing about the report."""
    root = Path(root)
    out = []
    for checkpoint, dependents in CHECKPOINT_DEPENDENTS.items():
        if checkpoint == layout.final_candidate() and not capacity:
            continue
        if (root / checkpoint).exists():
            continue
        for dep in dependents:
            src = root / dep
            if src.is_dir() and any(src.iterdir()):
                out.append((checkpoint, dep))
    return out


def quarantine_stale(root: str | os.PathLike = ".", log=print, capacity: bool = True) -> list[Path]:
    """Move every stale dependent (:func:`stale_dependents`) to ``results/stale/<UTC time>/``."""
    root = Path(root)
    moved: list[Path] = []
    stamp = compact()
    for checkpoint, dep in stale_dependents(root, capacity):
        src = root / dep
        dst = root / "results" / "stale" / stamp / Path(dep).name
        if not src.is_dir() or dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        src.rename(dst)
        moved.append(dst)
        log(f"{dep}/ was built from {checkpoint}, which is missing (its rule failed or it was deleted): "
            f"moved to {dst.relative_to(root)} so that it is rebuilt, not shown as current")
    return moved
