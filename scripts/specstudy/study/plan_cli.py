"""``specstudy plan``: write a phase's plan (``--out``), its pre-registration lock (``plan lock``) or the
study's cost preview (``--cost``, :mod:`specstudy.study.cost`). The plan itself is :mod:`specstudy.study.plan`'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specstudy.core import atomic
from specstudy.core.atomic import sha256_file
from specstudy.study import cost, phase_decl
from specstudy.study.config import ConfigError, load_config
from specstudy.study.plan import PHASES, make_plan, prereg_lock
from specstudy.study.prereg import load_prereg


def _cmd_plan(args) -> int:
    if args.cost:
        return cost.cmd(args)
    if not args.out:
        print("specstudy plan: --out is required (or --cost for the cost preview)")
        return 2
    cfg = load_config(args.config)
    load_prereg(cfg)  # every plan belongs to a pre-registered study: a missing or broken one stops here
    from specstudy.study.template_args import check_workload_options

    # The parse of the workflow defers this while the target is not built; every plan rule runs after the
    # models and corpora, so a chat-template switch the template does not read stops the study here.
    check_workload_options(cfg, args.config, require_template=True)
    arms = None
    if args.selection:
        from specstudy.study.selection_lock import SelectionError, verify_selection

        try:
            sel = verify_selection(args.selection)
        except SelectionError as exc:
            print(f"error: {exc}")
            return 2
        arms = sel["confirmation_arms"]
    if phase_decl.DECLS[args.phase].extension:
        confirm_arms = None
        if args.arms_from:
            src = atomic.read_json(args.arms_from)
            if not isinstance(src, dict) or src.get("schema") != "specstudy.plan/1" or not isinstance(src.get("arms"), list):
                from specstudy.core.errors import UserError

                kind = src.get("schema") if isinstance(src, dict) else type(src).__name__
                raise UserError(f"{args.arms_from}: --arms-from: field 'schema' is {kind!r}, not 'specstudy.plan/1': "
                                "not a plan; give the confirmation plan, results/plan/confirm.json")
            confirm_arms = [a["name"] for a in src["arms"]]
        arms = phase_decl.arm_names(cfg, confirm_arms)
    plan = make_plan(cfg, args.phase, arms)
    plan["corpora"] = {}
    for path in args.corpora or []:
        rec = atomic.read_json(path)
        if not isinstance(rec, dict) or not {"name", "version", "digest"} <= set(rec):  # a corpus.json, not any JSON
            from specstudy.core.errors import UserError

            raise UserError(f"{path}: --corpora: not a corpus record (fields name, version, digest missing; "
                            f"schema {rec.get('schema') if isinstance(rec, dict) else type(rec).__name__!r}); give "
                            "the corpus.json files `specstudy corpus build` wrote (results/corpora/<name>/<version>/)")
        plan["corpora"][str(Path(path).parent)] = {"name": rec.get("name"), "version": rec.get("version"),
                                                   "digest": rec.get("digest")}
    if args.selection:
        plan["selection"] = {"path": args.selection, "sha256": sha256_file(args.selection)}
    from specstudy.core import schemas

    schemas.validate(plan, "plan", args.out)
    atomic.write_json_if_changed(args.out, plan)  # an unchanged plan keeps its bytes and time
    print(f"plan: {len(plan['deployments'])} deployments, {sum(len(d['cells']) for d in plan['deployments'])} cells, "
          f"{len(plan['skipped'])} skipped arms -> {args.out}")
    return 0


def _cmd_lock(args) -> int:
    out = Path(args.out)
    lock = prereg_lock(path=args.prereg)
    if out.exists():
        from specstudy.study.prereg_guard import verify_lock

        try:
            verify_lock(out, args.prereg)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    from specstudy.core import schemas

    schemas.validate(lock, "prereg-lock", str(out))
    atomic.write_json(out, lock)
    print(f"pre-registration locked: {lock['preregistration']} sha256 {lock['sha256']}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("plan", help="expand the factorial into an ordered plan (plan.json)")
    p.add_argument("--config", required=True)
    p.add_argument("--phase", choices=PHASES, default="screen")
    p.add_argument("--selection", help="selection.json (confirmation plans only)")
    p.add_argument("--arms-from", help="extension phases: the confirmation plan whose arms they deploy "
                   "(extensions.arms: confirmation)")
    p.add_argument("--corpora", nargs="*", default=[], help="corpus.json files whose digests the plan records")
    p.add_argument("--out", help="where plan.json goes (required unless --cost)")
    p.add_argument("--cost", action="store_true",
                   help="print the cost preview instead: deployments, cells, requests, wall time and node-hours per phase")
    p.add_argument("--profile", help="--cost: Snakemake profile directory (parallel slots, nodes per job)")
    p.add_argument("--results", default="results", help="--cost: results/ of this study (measured times, selection)")
    p.add_argument("--json", help="--cost: also write the preview as JSON here")
    p.set_defaults(func=_cmd_plan)
    p = sub.add_parser("prereg-lock", help="lock the pre-registration file's hash before screening starts")
    p.add_argument("--prereg", required=True, help="the pre-registration YAML (study.preregistration)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_lock)
