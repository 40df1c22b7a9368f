"""The ``specstudy`` command line. Each concept module registers its own subcommands.

A module listed in ``COMMAND_MODULES`` exposes ``register(subparsers)`` which adds parsers whose
``func`` attribute takes the parsed ``argparse.Namespace`` and returns an exit code. Modules keep
heavy imports (torch, vllm, pandas) inside functions so that ``specstudy --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = [
    "inputs.fixture_models",
    "inputs.heldout",
    "inputs.corpus",
    "study.plan_cli",
    "measure.loadgen",
    "job.run",
    "job.cli",
    "job.engine_probe",
    "measure.telemetry",
    "analysis.gate_cli",
    "analysis.select",
    "analysis.checkpoint",
    "measure.capacity.cli",
    "analysis.upstream",
    "analysis.tables",
    "report.cli",
    "inputs.random_model",
    "inputs.scale_model",
    "inputs.rebuilt",
    "mechanics.point",
    "study.rerun",
    "analysis.check_results",
    "study.checkconfig",
    "phases.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specstudy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"specstudy.{name}")
        except ModuleNotFoundError as exc:  # a module not written yet must not break the others
            if exc.name == f"specstudy.{name}":
                continue
            raise
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
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
