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

from .errors import UserError


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


def check_targets(targets: list[str], directory: str | os.PathLike = ".") -> None:
    """Refuse paths that are not results of this workflow (a typo would otherwise run nothing or everything)."""
    for t in targets:
        norm = os.path.normpath(t)
        if not norm.startswith("results/"):
            raise UserError(f"rerun: {t}: not a path under results/ (relative to {Path(directory).resolve()}); "
                            "e.g. results/screen/baseline/rep1/code/c1/summary.json")


def _cmd_rerun(args) -> int:
    check_targets(args.paths)
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
