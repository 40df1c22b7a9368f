"""``specstudy rerun <path>…``: re-run the jobs that write the given results, the one way that cannot go wrong.

``snakemake --forcerun <path>`` takes every following word as another path to force, so the
target is swallowed and Snakemake runs its default rule ``all`` instead; ``--configfile`` has the
same trap. This command builds the call with the targets *first* (nothing before them can swallow
them) and the options with ``=`` forms:

    snakemake <path>… --profile=<profile> [--configfile=<file>] [--dry-run] --forcerun=<path> …

A cell path (``results/<phase>/<arm>/<rep>/<workload>/c<conc>/summary.json``) re-runs its deployment:
a fresh server, valid cells with the same fingerprint reused, the others measured again (set
``cells.reuse_valid: false`` to re-measure valid cells too).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from specstudy.core import layout
from specstudy.core.errors import UserError


def snakemake_command(targets: list[str], *, profile: str | None = "profiles/local", configfile: str | None = None,
                      dry_run: bool = False, cores: int | None = None, snakemake: str | None = None) -> list[str]:
    if not targets:
        raise UserError("rerun: name at least one result path, e.g. results/screen/baseline/rep1/code/c1/summary.json")
    for t in targets:
        if t.startswith("-"):
            raise UserError(f"rerun: {t!r} is an option, not a result path; pass paths only (options go before them: "
                            "specstudy rerun --profile … <path>)")
    exe = snakemake or shutil.which("snakemake") or "snakemake"
    cmd = [exe, *targets]
    if profile:
        cmd.append(f"--profile={profile}")
    if configfile:
        cmd.append(f"--configfile={configfile}")
    if cores:
        cmd.append(f"--cores={cores}")
    if dry_run:
        cmd.append("--dry-run")
    cmd += [f"--forcerun={t}" for t in targets]
    return cmd


CELL_PATTERN = layout.readable("cell")
PATTERNS = (CELL_PATTERN + " (a cell: re-runs its deployment)",
            layout.readable("deployment") + " (a whole deployment)",
            f"{layout.report_file('report.md')}, {layout.selection()}, ... (any other output of the workflow)")


def _cell(path: str) -> layout.Cell | None:
    """The cell a path relative to the working directory names (under ``results/``), else None."""
    try:
        cell = layout.parse_cell(path)
    except layout.LayoutError:
        return None
    return cell if cell.root == layout.ROOT else None


def _existing_cells(directory: Path) -> list[str]:
    return sorted(rel for rel in (str(p.relative_to(directory)) for p in directory.glob(layout.glob_pattern("cell")))
                  if _cell(rel))


def _planned_cells(directory: Path) -> dict[str, list[str]]:
    """Per phase with a plan file: the cell paths of its deployments (none when the plan is unreadable)."""
    import json

    out: dict[str, list[str]] = {}
    for plan in sorted(directory.glob(layout.glob_pattern("plan"))):
        try:
            phase = layout.parse("plan", plan)["phase"]
            data = json.loads(plan.read_text(encoding="utf-8"))
            out[phase] = [layout.cell_summary(phase, d["arm"], d["rep"], c["workload"], c["concurrency"])
                          for d in data["deployments"] for c in d["cells"]]
        except (OSError, ValueError, KeyError, TypeError, layout.LayoutError):
            continue
    return out


def _nearest(target: str, candidates: list[str], n: int = 3) -> str:
    from rapidfuzz import process

    best = [m for m, _score, _ in process.extract(target, sorted(set(candidates)), limit=n)]
    return ", ".join(best) if best else "none yet (no cell has been planned or measured here)"


def _study_arms(cfg: dict) -> list[str]:
    """The arms a study config declares (the factorial's and its variants), for a phase not planned yet."""
    from specstudy.study.plan import all_arms, variant_arms

    return sorted({a["name"] for a in all_arms(cfg)} | {a["name"] for a in variant_arms(cfg)})


def check_targets(targets: list[str], directory: str | os.PathLike = ".", cfg: dict | None = None,
                  cfg_source: str = "the study config") -> None:
    """Refuse paths that are not results of this workflow (a typo would otherwise run nothing or everything,
    or end in Snakemake's bare MissingRuleException): the message gives the valid patterns and the nearest
    cells that exist or are planned. A cell of screening or confirmation before its plan is written is
    checked against the study config ``cfg`` (its arms and workloads)."""
    directory = Path(directory)
    planned = _planned_cells(directory)
    known = _existing_cells(directory) + [c for cells in planned.values() for c in cells]
    patterns = "; ".join(PATTERNS)
    for t in targets:
        norm = os.path.normpath(t)
        if not norm.startswith(layout.ROOT + "/"):
            raise UserError(f"rerun: {t}: not a path under {layout.ROOT}/ (relative to {directory.resolve()}); valid "
                            f"patterns: {patterns}; e.g. results/screen/baseline/rep1/code/c1/summary.json")
        if t.endswith("/") or (directory / norm).is_dir():
            inside = [c for c in known if c.startswith(norm + "/")]
            raise UserError(f"rerun: {t}: is a directory, not a result; name the cells to re-run "
                            f"({CELL_PATTERN}): {_nearest(norm, inside or known, 5)}")
        if not norm.endswith(layout.CELL_SUMMARY):
            continue
        cell = _cell(norm)
        if cell is None:
            raise UserError(f"rerun: {t}: not a cell path (a cell is {CELL_PATTERN}); valid patterns: {patterns}. "
                            f"Nearest cells: {_nearest(norm, known)}")
        phase = cell.phase
        if phase in planned and norm not in planned[phase] and not (directory / norm).exists():
            arms = sorted({layout.parse_cell(c).arm for c in planned[phase]})
            plan = layout.plan(phase)
            if cell.arm not in arms:
                raise UserError(f"rerun: {t}: {cell.arm!r} is not an arm of {plan} (its arms: {', '.join(arms)}); "
                                f"nearest cells: {_nearest(norm, planned[phase])}")
            raise UserError(f"rerun: {t}: not a cell of {plan}; nearest cells: {_nearest(norm, planned[phase])}")
        if phase not in planned and phase in ("screen", "confirm") and cfg is not None \
                and not (directory / norm).exists():
            arms = _study_arms(cfg)
            if cell.arm not in arms:
                raise UserError(f"rerun: {t}: {cell.arm!r} is not an arm of this study ({cfg_source}, arms: "
                                f"{', '.join(arms)}); name a cell of one of those")
            workloads = sorted((cfg.get("corpora") or {}).get("workloads") or [])
            if workloads and cell.workload not in workloads:
                raise UserError(f"rerun: {t}: {cell.workload!r} is not a workload of this study ({cfg_source}, "
                                f"corpora.workloads: {', '.join(workloads)})")


def _cmd_rerun(args) -> int:
    from specstudy.study.config import ConfigError, load_config

    cfg, source = None, args.configfile or "config/config.yaml"
    if args.configfile:  # the pre-flight before Snakemake reads it (its own errors name neither file nor line)
        cfg = load_config(args.configfile)
    elif Path(source).is_file():
        try:
            cfg = load_config(source)
        except ConfigError:  # the workflow's own parse names the problem
            cfg = None
    check_targets(args.paths, cfg=cfg, cfg_source=source)
    cmd = snakemake_command(args.paths, profile=args.profile or None, configfile=args.configfile,
                            dry_run=args.dry_run, cores=args.cores)
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def register(sub) -> None:
    p = sub.add_parser("rerun", help="re-run the jobs writing these result paths (a cell: its deployment)",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("paths", nargs="+", help="result paths, e.g. results/screen/baseline/rep1/code/c1/summary.json")
    p.add_argument("--profile", default="profiles/local", help="Snakemake profile (default: profiles/local; '' for none)")
    p.add_argument("--configfile", default=None, help="the study config, when not the embedded default")
    p.add_argument("--cores", type=int, default=None)
    p.add_argument("-n", "--dry-run", action="store_true", help="show the jobs that would run")
    p.set_defaults(func=_cmd_rerun)
