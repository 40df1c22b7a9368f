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
    "fixture_models",
    "heldout",
    "corpus",
    "plan",
    "loadgen",
    "deployment_run",
    "deployment.cli",
    "engine_methods",
    "telemetry",
    "gate",
    "sampling_phase",
    "select",
    "checkpoint",
    "capacity",
    "memory",
    "upstream",
    "tables",
    "report",
    "random_model",
    "scale_model",
    "mechanics",
    "ignore_eos",
    "profiling",
    "rerun",
    "check_results",
    "checkconfig",
    "extension_cli",
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


def main(argv: list[str] | None = None) -> int:
    from .errors import explain

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
