"""The phases' behaviour, registered once: what a phase does in a deployment and in its summary.

A phase module defines one :class:`Phase` subclass and registers it with :func:`register_phase`; its facts (target,
kind, label, checks, the design its plan records) are its declaration, :data:`specstudy.study.phase_decl.DECLS`,
under the same name. The deployment job (:mod:`specstudy.job.spec`, :mod:`specstudy.job.run`) and the
command line (:mod:`specstudy.phases.cli`) iterate over this registry instead of naming phases:

- :meth:`Phase.spec_extras` — what the deployment spec carries besides the cells (read from the plan's design);
- :meth:`Phase.engine` / :meth:`Phase.after_smoke` / :meth:`Phase.before_cells` / :meth:`Phase.around_cells`
  — the deployment's steps, in this order: before the launch, after the smoke captures, before the cells,
  around the cells; the job (a ``job.run._Job``) is passed as is: ``spec``, ``attempt``, ``server``,
  ``served``, ``eng``, ``arm``, ``settings``, ``progress``, ``stage``, ``deployment_id``, ``death``,
  ``to_measure`` and ``extension`` (the artifacts the record names, by :attr:`PhaseDecl.artifact`);
- :meth:`Phase.summarize` — ``results/<phase>/summary.json`` and ``section.md`` (the report section) from a
  :class:`specstudy.phases.summary.PhaseRun`;
- :meth:`Phase.add_tools` — the phase's own subcommands, ``specstudy phase <name> ...``.

The core phases (``screen``, ``confirm``) and the capacity search register the plain :class:`Phase`: nothing
runs besides their cells, and their analysis is :mod:`specstudy.analysis` (tables, gates, selection).

Imports ``core`` and ``study`` (the declarations) only; every phase module imports this one.
"""

from __future__ import annotations

import contextlib
from typing import Any

from specstudy.core.errors import UserError
from specstudy.study.phase_decl import CORE_PHASES, DECLS, PhaseDecl

__all__ = ["Phase", "get", "names", "register_phase"]


class Phase:
    """One phase's behaviour; the defaults are the core phases' (nothing besides the cells)."""

    #: the phase's name (its declaration's, :data:`specstudy.study.phase_decl.DECLS`)
    name: str = ""
    #: a deployment that has no cell left to measure still starts its server (the memory sweep)
    serves_without_cells: bool = False

    def __init__(self, name: str | None = None):
        if name is not None:
            self.name = name

    @property
    def decl(self) -> PhaseDecl:
        return DECLS[self.name]

    # -------------------------------------------------------------------- the deployment
    def spec_extras(self, design: dict, dirs: dict[str, str]) -> dict:
        """What the deployment spec carries besides the cells, from the plan's ``design`` and the corpora's
        directories (``dirs``: workload -> corpus directory)."""
        return {}

    def engine(self, job: Any, eng: dict) -> dict:
        """The engine settings the server is launched with (default: the job's)."""
        return eng

    def after_smoke(self, job: Any) -> None:
        """A step after the smoke captures, before the cells' KV-cache config is read."""

    def before_cells(self, job: Any) -> None:
        """A step after the KV-cache config is read, before the cells."""

    def around_cells(self, job: Any) -> contextlib.AbstractContextManager:
        """A context the cells run in (only entered when there are cells to measure)."""
        return contextlib.nullcontext()

    # -------------------------------------------------------------------- the summary and its section
    def summarize(self, run: Any) -> dict:
        """Write ``run.out/summary.json`` and ``run.out/section.md`` from ``run`` (a
        :class:`specstudy.phases.summary.PhaseRun`, which imports this module); return the summary."""
        raise UserError(f"phase {self.name!r} has no phase summary: its results are read by the tables, gates and "
                        "selection (`snakemake screen` / `snakemake confirm`)")

    def add_tools(self, sub: Any) -> None:
        """Add the phase's own subcommands to ``sub`` (the subparsers of ``specstudy phase <name>``)."""


_REGISTRY: dict[str, Phase] = {}
_PLAIN = Phase()


def register_phase(cls: type[Phase]) -> type[Phase]:
    """Class decorator: register one instance of a :class:`Phase` subclass under its declared name."""
    phase = cls()
    if phase.name not in DECLS:
        raise ValueError(f"phase {phase.name!r} has no declaration in specstudy.study.phase_decl")
    if phase.name in _REGISTRY:
        raise ValueError(f"phase {phase.name!r} is registered twice")
    _REGISTRY[phase.name] = phase
    return cls


for _core in CORE_PHASES:
    _REGISTRY[_core] = Phase(_core)


def names() -> tuple[str, ...]:
    """Every registered phase, in declaration order."""
    return tuple(p for p in DECLS if p in _REGISTRY)


def get(name: str) -> Phase:
    """The registered behaviour of ``name``; a deployment of no declared phase (the capacity search) gets
    the plain one."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in DECLS:
        raise KeyError(f"phase {name!r} is declared but no module registered its behaviour (specstudy.phases)")
    return _PLAIN
