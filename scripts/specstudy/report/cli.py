"""``specstudy report``: the study report's command line (:func:`specstudy.report.document.build`), from the
files named on it (the workflow's way) or from a results root (``--results``: :func:`specstudy.report.files.from_root`).
"""

from __future__ import annotations

import json
from pathlib import Path

from specstudy.core import layout
from specstudy.report.document import build
from specstudy.report.files import TABLES, ReportFiles, from_root

#: the options naming the report's files one by one (any of them given: the report reads those files alone)
FILE_OPTIONS = ("table_files", "selection", "final_candidate", "rounds", "knees", "corpora", "heldout",
                "scale_record", "records", "mechanics", "profile")


def _tables_of(paths: list[str]) -> dict[str, str]:
    """``--table-files``: each a ``<table>.parquet`` of the layout, named by its table."""
    tables = {}
    for p in paths:
        name = Path(p).stem
        if name not in TABLES:
            raise SystemExit(f"--table-files {p}: not one of the tables ({', '.join(f'{t}.parquet' for t in TABLES)})")
        tables[name] = p
    return tables


def files_of(args) -> ReportFiles:
    """The report's files: those named one by one, else those found under ``--results`` (default results/)."""
    if not any(getattr(args, name) is not None for name in FILE_OPTIONS):
        return from_root(args.results or layout.ROOT, args.tables, args.sections)
    if args.results is not None or args.tables is not None:
        raise SystemExit("specstudy report: give the files one by one or --results/--tables, not both")
    return ReportFiles(tables=_tables_of(args.table_files or []), selection=args.selection,
                       final_candidate=args.final_candidate, rounds=tuple(args.rounds or ()),
                       knees=tuple(args.knees or ()), corpora=tuple(args.corpora or ()), heldout=args.heldout,
                       scale=args.scale_record, records=tuple(args.records or ()), mechanics=args.mechanics,
                       profile=args.profile, sections=tuple(args.sections))


def _cmd_report(args) -> int:
    config = {}
    if args.config:
        p = Path(args.config)
        if not p.exists():
            print(f"{p}: config file not found (pass the resolved config JSON written by the workflow)")
            return 2
        config = json.loads(p.read_text()) if p.suffix == ".json" else __import__("yaml").safe_load(p.read_text())
    summary = build(files_of(args), config, args.out)
    rec = summary["recommendation"]
    print(f"report: {Path(args.out) / 'report.md'}; decision: {rec['decision']} {rec.get('enable') or ''}".rstrip())
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="write the study report (Markdown + HTML + plots + recommendation)")
    p.add_argument("--results", default=None,
                   help="find every file under this results root (default results/, when no file is named below)")
    p.add_argument("--tables", default=None, help="with --results: the tables' folder (default <results>/tables)")
    files = p.add_argument_group("the report's files, named one by one (the workflow's way; rules/report.smk)")
    files.add_argument("--table-files", nargs="*", default=None, metavar="TABLE.parquet",
                       help=f"the tables ({', '.join(f'{t}.parquet' for t in TABLES)}; one not given is empty)")
    files.add_argument("--selection", default=None, help="results/selection/selection.json")
    files.add_argument("--final-candidate", default=None, help="results/selection/final-candidate.json")
    files.add_argument("--rounds", nargs="*", default=None, help="the confirmation checkpoints (round<n>.json)")
    files.add_argument("--knees", nargs="*", default=None,
                       help="the capacity knees (results/capacity/<arm>/knee.json; steps, plot and record beside each)")
    files.add_argument("--corpora", nargs="*", default=None,
                       help="the built corpora (corpus.json; token_stats.json beside each)")
    files.add_argument("--heldout", default=None, help="the fixture draft's held-out acceptance (heldout.json)")
    files.add_argument("--scale-record", default=None, help="the scale model's record (results/models/scale/scale.json)")
    files.add_argument("--records", nargs="*", default=None,
                       help="the screening and confirmation deployment records (the duty cycle)")
    files.add_argument("--mechanics", default=None, help="the mechanics point's summary (results/mechanics/mechanics.json)")
    files.add_argument("--profile", default=None, help="the profile phase's summary (results/profile/summary.json)")
    p.add_argument("--config", default=None, help="resolved study config (JSON or YAML)")
    p.add_argument("--out", default="results/report")
    p.add_argument("--sections", nargs="*", default=[],
                   help="extension phases' sections (results/<phase>/section.md) appended under 'Extensions'")
    p.set_defaults(func=_cmd_report)
