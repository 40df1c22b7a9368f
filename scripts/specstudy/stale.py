"""Results built from a checkpoint output that no longer exists are stale: move them aside.

Snakemake does not look past a missing checkpoint output when the files built from it still
exist: after ``select`` fails (and Snakemake deletes ``selection.json``), ``snakemake report`` and
``all`` print "Nothing to be done" over the old report. At every workflow parse,
:func:`quarantine_stale` moves the report and the tables — the files that present results as
current — to ``results/stale/<UTC time>/`` (never deleted) when a checkpoint output they were
built from is missing, so that Snakemake rebuilds them after re-running the checkpoint.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: checkpoint output -> results built from it that present the study as current
CHECKPOINT_DEPENDENTS = {
    "results/selection/selection.json": ("results/report", "results/tables"),
    "results/selection/final-candidate.json": ("results/report",),
}


def quarantine_stale(root: str | os.PathLike = ".", log=print, capacity: bool = True) -> list[Path]:
    """``capacity``: whether the study runs the capacity search; without it the final candidate is never
    built and its absence says nothing about the report."""
    root = Path(root)
    moved: list[Path] = []
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for checkpoint, dependents in CHECKPOINT_DEPENDENTS.items():
        if checkpoint.endswith("final-candidate.json") and not capacity:
            continue
        if (root / checkpoint).exists():
            continue
        for dep in dependents:
            src = root / dep
            if not src.is_dir() or not any(src.iterdir()):
                continue
            dst = root / "results" / "stale" / stamp / Path(dep).name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.exists():
                continue
            src.rename(dst)
            moved.append(dst)
            log(f"{dep}/ was built from {checkpoint}, which is missing (its rule failed or it was deleted): "
                f"moved to {dst.relative_to(root)} so that it is rebuilt, not shown as current")
    return moved
