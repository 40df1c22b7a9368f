"""The report's input files: every file ``specstudy report`` reads, named (:class:`ReportFiles`), and the one
loader that finds them under a results root (:func:`from_root`, for interactive use and the workflow's planned
stale report). The workflow names them itself (rules/common.smk: ``report_inputs``, ``report_args``), and
:func:`specstudy.report.document.build` reads only the files it is given.

A capacity search's ``knee.json`` stands for its folder: the steps, the plot and the deployment record the
search writes beside it are read from there (rule ``capacity_search`` declares the knee alone). A corpus's
``token_stats.json`` is read beside its ``corpus.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specstudy.core import layout

#: the four tables (specstudy.analysis.tables.TABLE_NAMES), as ``--table-files`` names them
TABLES = ("cells", "requests", "deployments", "gates")
#: the phases whose deployment records the duty cycle reads (the capacity records lie beside the knees)
RECORD_PHASES = ("screen", "confirm")


@dataclass(frozen=True)
class ReportFiles:
    """Every file the report reads; a file not given (None, or absent from a list) is a missing piece the
    report names. ``tables`` maps a table name to its Parquet file; ``root`` only words the report's opening."""

    tables: dict[str, str]
    selection: str | None = None
    final_candidate: str | None = None
    rounds: tuple[str, ...] = ()
    knees: tuple[str, ...] = ()
    corpora: tuple[str, ...] = ()
    heldout: str | None = None
    scale: str | None = None
    records: tuple[str, ...] = ()
    mechanics: str | None = None
    profile: str | None = None
    sections: tuple[str, ...] = ()
    root: str | None = field(default=None)

    @property
    def tables_dir(self) -> str:
        """The folder of the tables (where the report says it was built from)."""
        dirs = sorted({str(Path(p).parent) for p in self.tables.values()})
        return dirs[0] if len(dirs) == 1 else ", ".join(dirs)

    @property
    def results_root(self) -> str:
        """The results root the tables were rebuilt from: ``root``, else the root of the cells table's path."""
        if self.root is not None:
            return self.root
        cells = self.tables.get("cells")
        return layout.parse("table", cells)["root"] if cells and layout.matches("table", cells) else "?"


def _existing(pattern: str, kind: str | None = None) -> list[str]:
    import glob

    return sorted(p for p in glob.glob(pattern) if kind is None or layout.matches(kind, p))


def _one(path: str) -> str | None:
    return path if Path(path).exists() else None


def from_root(results: str | Path = layout.ROOT, tables_dir: str | Path | None = None,
              sections: list[str] | tuple[str, ...] = ()) -> ReportFiles:
    """The report's files found under a results root (through :mod:`specstudy.core.layout`); the tables from
    ``tables_dir`` (default ``<results>/tables``)."""
    from specstudy.inputs.scale_model import RECORD_NAME

    root = str(results)
    tdir = str(tables_dir) if tables_dir is not None else layout.tables_dir(root)
    records = [str(p) for ph in RECORD_PHASES for p in sorted(Path(root, ph).glob(f"**/{layout.DEPLOYMENT_RECORD}"))
               if layout.matches("deployment", p)]
    return ReportFiles(
        tables={t: str(Path(tdir) / f"{t}.parquet") for t in TABLES},
        selection=_one(layout.selection(root)),
        final_candidate=_one(layout.final_candidate(root)),
        rounds=tuple(_existing(layout.glob_pattern("round", root), "round")),
        knees=tuple(_existing(layout.glob_pattern("knee", root), "knee")),
        corpora=tuple(_existing(layout.glob_pattern("corpus", root), "corpus")),
        heldout=_one(layout.models_dir("fixture", "heldout.json", root=root)),
        scale=_one(layout.models_dir("scale", RECORD_NAME, root=root)),
        records=tuple(records),
        mechanics=_one(layout.mechanics_dir("mechanics.json", root=root)),
        profile=_one(layout.phase_summary("profile", root)),
        sections=tuple(sections),
        root=root,
    )


def knee_arms(files: ReportFiles) -> dict[str, str]:
    """The capacity knees by arm (the arm from each knee's path)."""
    return {layout.parse("knee", p)["arm"]: p for p in files.knees}


def rounds_in_order(files: ReportFiles) -> list[str]:
    """The confirmation checkpoints, in round order."""
    return sorted(files.rounds, key=lambda p: layout.parse("round", p)["n"])


def records_by_phase(files: ReportFiles) -> dict[str, list[str]]:
    """The deployment records by phase folder: the given records (phase from the path) and, as ``capacity``,
    every record beside a capacity knee."""
    out: dict[str, list[str]] = {}
    for p in files.records:
        out.setdefault(layout.parse("deployment", p)["phase"], []).append(p)
    for k in files.knees:
        out.setdefault("capacity", []).extend(str(p) for p in sorted(Path(k).parent.glob(f"**/{layout.DEPLOYMENT_RECORD}")))
    return {ph: sorted(ps) for ph, ps in out.items()}
