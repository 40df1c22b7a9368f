"""The ``specstudy`` command line: one table of every subcommand and the module that owns it.

:data:`SUBCOMMANDS` lists each subcommand once, in the order ``specstudy --help`` shows them, with the
module that owns it (the pattern of vLLM's ``benchmarks/sweep/cli.py``: one table, each entry's own code
builds its parser). That module's ``register(subparsers)`` adds its parsers (arguments, help) and sets
``func``, the handler that takes the parsed ``argparse.Namespace`` and returns an exit code; it must add
exactly the subcommands the table lists for it, in the table's order (:func:`build_parser` checks).
Modules keep heavy imports (torch, vllm, pandas) inside functions so that ``specstudy --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: every subcommand: (name, the module under ``specstudy.`` that registers its parser and handler)
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    # inputs: fixture models, held-out text, corpora
    ("fixture-models", "inputs.fixture_models"),
    ("fixture-heldout", "inputs.heldout"),
    ("corpus", "inputs.corpus"),
    # the study: its plan and the pre-registration lock
    ("plan", "study.plan_cli"),
    ("prereg-lock", "study.plan_cli"),
    # one cell and one deployment
    ("loadgen", "measure.loadgen"),
    ("deployment", "job.run"),
    ("deploy-confounds", "job.cli"),
    ("deploy-command", "job.cli"),
    ("engine", "job.engine_probe"),
    ("telemetry-summary", "measure.telemetry"),
    # results read and judged
    ("gate", "analysis.gate_cli"),
    ("select", "analysis.select"),
    ("final-candidate", "analysis.select"),
    ("confirm-archive", "analysis.checkpoint"),
    ("confirm-show", "analysis.checkpoint"),
    ("confirm-round", "analysis.checkpoint"),
    ("capacity", "measure.capacity.cli"),
    ("import-upstream", "analysis.upstream"),
    ("tables", "analysis.tables"),
    ("report", "report.cli"),
    # the mechanics point and its models (random, scale, rebuilt)
    ("random-model", "inputs.random_model"),
    ("scale-model", "inputs.scale_model"),
    ("models-verify", "inputs.rebuilt"),
    ("mechanics", "mechanics.point"),
    # repairs and checks of a study
    ("rerun", "study.rerun"),
    ("check-results", "analysis.check_results"),
    ("check-config", "study.checkconfig"),
    ("methods", "study.methods_cli"),
    # the opt-in phases: `specstudy phase summary <phase>`, `specstudy phase <phase> <tool>`
    ("phase", "phases.cli"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specstudy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    for module in dict.fromkeys(m for _, m in SUBCOMMANDS):
        listed = [name for name, m in SUBCOMMANDS if m == module]
        before = list(sub.choices)
        importlib.import_module(f"specstudy.{module}").register(sub)
        added = [name for name in sub.choices if name not in before]
        if added != listed:
            raise RuntimeError(f"specstudy.{module} registers {added}, but specstudy.cli.SUBCOMMANDS lists {listed} "
                               "for it: list every subcommand in the table, once, in the order it is added")
    if list(sub.choices) != [name for name, _ in SUBCOMMANDS]:
        raise RuntimeError("specstudy.cli.SUBCOMMANDS: list each module's subcommands next to each other")
    return parser


def explain(exc: BaseException) -> str | None:
    """The message for a bad-input exception, or None for anything else (a bug: keep the traceback)."""
    import json

    from specstudy.core import atomic, schemas
    from specstudy.core.errors import ConfigError, UserError
    from specstudy.inputs.corpus import CorpusError

    if isinstance(exc, (UserError, atomic.BadFile, ConfigError, CorpusError, schemas.ValidationError)):
        return str(exc)
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename or exc}: file not found. Check the path (relative paths are relative to {_cwd()})."
    if isinstance(exc, (NotADirectoryError, FileExistsError)):
        return (f"{exc.filename}: a file is in the way: an output directory was to be created there (an --out "
                "that is a file?); pass an --out path that is a directory or does not exist yet, or move the file")
    if isinstance(exc, IsADirectoryError):
        return f"{exc.filename}: is a directory, a file was expected."
    if isinstance(exc, PermissionError):
        return f"{exc.filename}: permission denied."
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
    return None


def _cwd() -> str:
    import os

    return os.getcwd()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except Exception as exc:  # bad input: one line naming the file/field and the fix; a bug keeps its traceback
        message = explain(exc)
        if message is None:
            raise
        print(f"specstudy {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
