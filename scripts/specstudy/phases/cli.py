"""``specstudy phase``: the one command line of the phases, built from the phase registry.

- ``specstudy phase summary <phase> --plan results/plan/<phase>.json --config ... --out results/<phase>`` —
  a phase's summary and report section from its plan and deployment records
  (:func:`specstudy.phases.summary.summarize`; the workflow's rule ``phase_summary`` runs it);
- ``specstudy phase <phase> <tool> ...`` — a phase's own tools, each added by the phase's registered
  :meth:`~specstudy.phases.registry.Phase.add_tools` (``sampling capture|judge``, ``memory kv-cost``,
  ``profile summarize-traces``).

Imports ``study`` (config, pre-registration) and the ``phases`` package (its registry and summary).
"""

from __future__ import annotations

from specstudy.core.errors import UserError
from specstudy.phases import registry, summary
from specstudy.study import phase_decl

__all__ = ["register"]


def _cmd_summary(args) -> int:
    from specstudy.study.config import load_config
    from specstudy.study.prereg import load_prereg, prereg_path

    cfg = load_config(args.config)
    if args.prereg:
        cfg = dict(cfg, study=dict(cfg["study"], preregistration=args.prereg))
    prereg = load_prereg(cfg)
    if args.phase not in phase_decl.declared(cfg):
        raise UserError(f"{args.config}: field 'extensions.{args.phase}' is missing; declare the phase to summarise it")
    summary.summarize(args.phase, args.plan, cfg, prereg, args.results, args.out, prereg_file=str(prereg_path(cfg)))
    print(f"{args.phase}: summary -> {args.out}/summary.json, section -> {args.out}/section.md")
    return 0


def register(sub) -> None:
    p = sub.add_parser("phase", help="the study's phases: a phase's summary, and each phase's own tools "
                       "(docs/extensions.md)")
    psub = p.add_subparsers(dest="phase_command", required=True)
    s = psub.add_parser("summary", help="summary.json and the report section of one opt-in phase, from its plan "
                        "and deployment records")
    s.add_argument("phase", choices=phase_decl.EXTENSION_PHASES)
    s.add_argument("--plan", required=True, help="results/plan/<phase>.json")
    s.add_argument("--config", required=True, help="the effective study config")
    s.add_argument("--prereg", help="the pre-registration (default: the config's study.preregistration)")
    s.add_argument("--results", default="results")
    s.add_argument("--out", required=True, help="results/<phase>")
    s.set_defaults(func=_cmd_summary)
    for name in registry.names():
        phase = registry.get(name)
        if type(phase).add_tools is registry.Phase.add_tools:
            continue  # no tools of its own
        t = psub.add_parser(name, help=f"the {name} phase's own tools ({phase.decl.label.split(':')[0]})")
        phase.add_tools(t.add_subparsers(dest=f"{name}_command", required=True))
