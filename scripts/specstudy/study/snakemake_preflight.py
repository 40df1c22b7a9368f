"""What a raw ``snakemake`` command line gets from specstudy before Snakemake reads it (issue 29).

Snakemake reads every ``--configfile`` while it sets itself up, before any workflow code runs, and a
file it cannot read (a misspelt path, a directory, a YAML error, a top-level list) ends in its own
message: no file, no line, or a ``FileNotFoundError`` traceback. Snakemake does run a profile's YTE
``__definitions__`` earlier, while it parses the command line, and it loads the workflow profile
``profiles/default/`` for every run of this workflow (also beside ``--profile``, unless
``--workflow-profile none``). That profile calls :func:`check_configfiles`, which reads the files with
specstudy's own reader and stops with one line naming the file, the line and the fix.

:func:`check_targets` is called at the end of the Snakefile: a target that is neither a rule nor a path
some rule produces is answered with the nearest rules and existing outputs, instead of Snakemake's
bare ``MissingRuleException``.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path


def snakemake_cli(argv: list[str] | None = None):
    """The command line as Snakemake's own parser reads it (no profiles), or None where that parser
    refuses it (Snakemake then says why itself)."""
    from snakemake.cli import get_argument_parser

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:  # Snakemake: explicit targets after "--"
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    else:
        extra = []
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            args, _ = get_argument_parser().parse_known_args(argv)
    except (SystemExit, Exception):  # a value Snakemake refuses (``--cores many``): its own message follows
        return None
    args.targets = list(args.targets or []) + extra
    return args


def configfile_problem(argv: list[str] | None = None, default: str | None = None) -> str | None:
    """The message for the first ``--configfile`` (or ``default``, a profile's ``configfile:``, when the
    command line names none) specstudy's reader refuses, or None."""
    from specstudy.core.studyyaml import StudyYamlError, load_mapping

    args = snakemake_cli(argv)
    if args is None:
        return None
    files = [str(p) for p in (args.configfile or [])] or ([default] if default else [])
    for f in files:
        try:
            load_mapping(f, "study config (--configfile)", "study, engine, corpora, cells, arms, screen")
        except StudyYamlError as exc:
            if not Path(f).exists() and not Path(f).suffix:  # `--configfile study.yaml screen`: nargs="+" took the target
                exc = StudyYamlError(f"{exc}; --configfile takes every word after it, so {f!r} was read as a config "
                                     "file: put the targets before --configfile, or after `--`")
            return f"{exc}\n(checked by specstudy before Snakemake reads it; `specstudy check-config {f}` checks the rest)"
    return None


def check_configfiles(argv: list[str] | None = None, default: str | None = None) -> None:
    """Called from a profile's ``__definitions__``: exit 1 with the message of :func:`configfile_problem`."""
    problem = configfile_problem(argv, default)
    if problem:
        print(f"specstudy: error: {problem}", file=sys.stderr)
        sys.exit(1)


def _is_snakemake_command() -> bool:
    argv0 = Path(sys.argv[0] if sys.argv else "")
    return argv0.name == "snakemake" or (argv0.name == "__main__.py" and argv0.parent.name == "snakemake")


def target_problem(targets: list[str], rules: dict, produced: list[str]) -> str | None:
    """The message for the first target that is neither a rule name (``rules``: name -> Rule) nor a
    path a rule produces; ``produced``: existing outputs offered as the nearest paths."""
    from rapidfuzz import process

    for t in targets:
        if t in rules or any(r.is_producer(t) for r in rules.values()):
            continue
        looks_like_path = "/" in t or "." in t
        pool = produced if looks_like_path else list(rules)
        near = [m for m, score, _ in process.extract(t, pool, limit=3) if score >= 60] if pool else []
        what = "path" if looks_like_path else "rule"
        hint = f" Nearest {what}s: {', '.join(near)}." if near else ""
        return (f"target {t!r} is neither a rule of this workflow nor a path any rule writes.{hint} "
                "Targets are rule names (screen, confirm, capacity, all, …: `snakemake --list-target-rules`) or "
                "result paths such as results/screen/<arm>/rep<r>/<workload>/c<concurrency>/summary.json "
                "(`specstudy rerun <path>` re-runs one cell)")
    return None


def check_targets(workflow, results: str = "results") -> None:
    """End of the Snakefile: raise WorkflowError for a target no rule can make (raw ``snakemake`` runs only)."""
    from snakemake.exceptions import WorkflowError

    if not _is_snakemake_command() or not workflow.is_main_process:
        return
    args = snakemake_cli()
    if args is None or not args.targets:
        return
    rules = {r.name: r for r in workflow.rules}
    produced = [str(p) for p in Path(results).rglob("*") if p.is_file()] if Path(results).is_dir() else []
    produced += sorted({str(o) for r in rules.values() for o in r.output})  # the patterns, {wildcards} and all
    problem = target_problem(list(args.targets), rules, produced)
    if problem:
        raise WorkflowError(problem)


def recorded_results_problem(results: str = "results") -> str | None:
    """The message for results files changed since specstudy wrote them (specstudy.core.atomic's records), or
    None. Only files whose size or mtime moved are hashed."""
    from specstudy.core.atomic import recorded_problems

    changed = recorded_problems(results) if Path(results).is_dir() else []
    if not changed:
        return None
    first = "\n".join(f"  {c.path}: {'missing' if c.now is None else 'sha256 ' + c.now[:12] + '…, recorded ' + c.recorded[:12] + '…'}"
                      for c in changed[:10])
    more = f"\n  … and {len(changed) - 10} more" if len(changed) > 10 else ""
    return (f"{len(changed)} results file(s) changed after specstudy wrote them (hand-edited or truncated); "
            f"nothing was run:\n{first}{more}\nFix: `specstudy check-results --repair` moves each aside (or restores "
            "it from the attempt that holds the recorded bytes) and names the rule that writes it again")


def check_recorded_results(workflow, results: str = "results") -> None:
    """Snakefile: raise WorkflowError before any job (dry runs included) when a recorded results file changed."""
    from snakemake.exceptions import WorkflowError

    if not workflow.is_main_process:
        return
    problem = recorded_results_problem(results)
    if problem:
        raise WorkflowError(problem)
