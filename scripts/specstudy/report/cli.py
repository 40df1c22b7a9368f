"""``specstudy report``: the study report's command line (:func:`specstudy.report.document.build`)."""

from __future__ import annotations

import json
from pathlib import Path

from specstudy.report.document import build


def _cmd_report(args) -> int:
    config = {}
    if args.config:
        p = Path(args.config)
        if not p.exists():
            print(f"{p}: config file not found (pass the resolved config JSON written by the workflow)")
            return 2
        config = json.loads(p.read_text()) if p.suffix == ".json" else __import__("yaml").safe_load(p.read_text())
    summary = build(args.results, args.tables, config, args.out, sections=args.sections)
    rec = summary["recommendation"]
    print(f"report: {Path(args.out) / 'report.md'}; decision: {rec['decision']} {rec.get('enable') or ''}".rstrip())
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="write the study report (Markdown + HTML + plots + recommendation)")
    p.add_argument("--results", default="results")
    p.add_argument("--tables", default="results/tables")
    p.add_argument("--config", default=None, help="resolved study config (JSON or YAML)")
    p.add_argument("--out", default="results/report")
    p.add_argument("--sections", nargs="*", default=[],
                   help="extension phases' sections (results/<phase>/section.md) appended under 'Extensions'")
    p.set_defaults(func=_cmd_report)
