"""The confirmation's checkpoint after each round (``specstudy confirm-round``), and running confirmation
again: archive one run's confirmation outputs, show the outcome of several runs (``confirm-archive``,
``confirm-show``). The rule it applies is :mod:`specstudy.inference.decision`'s.
"""

from __future__ import annotations

from specstudy.core import layout
from specstudy.core.timestamps import compact
from specstudy.inference.decision import (
    DecisionRuleError,
    decision_label,
    format_outcomes,
    next_round,
    recommend,
    rule_from,
)

# ---------------------------------------------------------------------------------------------
# The checkpoint after each confirmation round (CLI: specstudy confirm-round)
# ---------------------------------------------------------------------------------------------


def _round_row(path: str, round_n: int) -> dict:
    """The ``cells`` row of one confirmation cell of rounds 1..``round_n``: its keys are the summary's own
    (specstudy.core.layout: the file's keys are the source of truth), and a summary whose keys name another
    place than its path is refused (specstudy.core.integrity.verify_place), never given the folder's keys."""
    import json
    from pathlib import Path

    from specstudy.analysis import tables
    from specstudy.core import integrity, records

    expected = layout.readable("cell").replace("<phase>", "confirm")
    try:
        place = layout.parse_cell(path)
    except layout.LayoutError as exc:
        raise DecisionRuleError(f"{path}: not a confirmation cell summary (expected {expected}): {exc}") from None
    if place.phase != "confirm" or place.deployment.kind != "repeat":
        raise DecisionRuleError(f"{path}: not a confirmation cell summary (expected {expected})")
    summary = records.read_cell_summary(path)
    integrity.verify_place(json.loads(Path(path).read_bytes()), path, phase=place.phase, arm=place.arm,
                           rep=place.deployment.number, rep_label=place.rep, workload=place.workload,
                           concurrency=place.concurrency)
    cell = layout.cell_of_keys(summary.keys, root=place.root)
    if cell.deployment.number > round_n:
        raise DecisionRuleError(f"{path}: round {cell.deployment.number} is after the checkpoint's round {round_n}; "
                                "the checkpoint of round n reads rounds 1..n only")
    row = tables.cell_row(summary)
    row.update(phase=cell.phase, arm=cell.arm, rep=cell.deployment.number, workload=cell.workload,
               concurrency=cell.concurrency)
    return row


def checkpoint(config_path: str, lock_path: str, plan_path: str, round_n: int, summary_paths: list[str],
               gate_paths: list[str], out: str) -> dict:
    """Evaluate the pre-registered rule on rounds 1..``round_n`` and say whether round ``round_n + 1`` runs."""
    from specstudy.core import atomic, records
    from specstudy.core.atomic import sha256_file
    from specstudy.inference import stats
    from specstudy.study.config import load_config
    from specstudy.study.prereg import load_prereg, prereg_path
    from specstudy.study.prereg_guard import read_lock

    cfg = load_config(config_path)
    prereg = load_prereg(cfg)
    lock = read_lock(lock_path)
    current = sha256_file(prereg_path(cfg))
    if lock.get("sha256") != current:
        raise DecisionRuleError(
            f"pre-registration changed since screening started: {lock_path} locked sha256 {lock.get('sha256')}, "
            f"{prereg_path(cfg)} now hashes to {current}; the stopping rule must stay as locked. Restore the locked "
            "file (git checkout) or start a new study.")
    rule = rule_from(cfg, prereg)
    if not rule["initial_repeats"] <= round_n <= rule["max_repeats"]:
        raise DecisionRuleError(f"round {round_n}: outside the pre-registered rounds {rule['initial_repeats']}.."
                                f"{rule['max_repeats']} (confirmation.repeats .. confirmation.stopping.max_repeats in "
                                f"{prereg_path(cfg)})")
    plan = records.read_plan(plan_path)
    rows = [_round_row(p, round_n) for p in summary_paths]
    gates = [dict(atomic.read_json(p)) for p in gate_paths]
    ccfg = dict(cfg, recommendation=dict(cfg.get("recommendation") or {}, phase="confirm"))
    # An interim look: confirmation gates need the complete rounds, so the screening gates are named
    # explicitly (the record says so); the final recommendation requires the confirmation gates.
    rec = recommend(stats.comparisons(rows, ccfg), gates, ccfg, prereg, gate_phase="screen")
    nxt = next_round(rec, round_n, rule)
    upcoming = [{"arm": d.arm, "rep": d.rep, "order": d.order} for d in plan.deployments
                if d.kind == "repeat" and d.round == round_n + 1] if nxt["continue"] else []
    state = {
        "schema": "specstudy.confirm-round/1",
        "round": round_n,
        "rounds_run": sorted({r["rep"] for r in rows}),
        "continue": nxt["continue"],
        "why": nxt["why"],
        "next_round": upcoming,
        "decision": decision_label(rec) if rec["decision"] != "insufficient_evidence" else rec["decision"],
        "undecided": rec["undecided"],
        "candidates": [{"arm": c["arm"], "gate_verdict": c["gate_verdict"], "verdicts": c["status"],
                        "enable": c["enable"], "blockers": c["blockers"]} for c in rec["candidates"]],
        "stability": rec["stability"],
        "rule": rule,
        "gate_phase": rec["gate_phase"],
        "prereg_sha256": lock["sha256"],
        "inputs": [{"path": p, "sha256": sha256_file(p)} for p in [*summary_paths, *gate_paths, plan_path]],
    }
    atomic.write_json_if_changed(out, state)  # an unchanged checkpoint keeps its bytes and time
    return state


def _cmd_checkpoint(args) -> int:
    from specstudy.study.config import ConfigError

    try:
        st = checkpoint(args.config, args.lock, args.plan, args.round, args.summaries, args.gates, args.out)
    except (DecisionRuleError, ConfigError) as exc:
        print(f"error: {exc}")
        return 2
    print(f"round {st['round']}: {st['decision']}; {'one more round' if st['continue'] else 'stop'}: {st['why']} "
          f"-> {args.out}")
    return 0


# ---------------------------------------------------------------------------------------------
# Running confirmation again (issue #15 item 5): archive one run's confirmation, compare runs
# ---------------------------------------------------------------------------------------------
CONFIRM_OUTPUTS = (layout.phase_dir("confirm", ""), f"{layout.GATES}/confirm", f"{layout.FAILURES}/confirm",
                   f"{layout.LOGS}/confirm")
#: with ``reselect``: the locked selection, the plan built from it and what followed from it (capacity)
RESELECT_OUTPUTS = (layout.SELECTION, layout.plan("confirm", ""), layout.CAPACITY, f"{layout.LOGS}/selection",
                    f"{layout.LOGS}/capacity")


def archive_confirmation(results: str, to: str, stamp: str | None = None, reselect: bool = False) -> str:
    """Move this run's confirmation outputs to ``<to>/confirm-<stamp>/`` so that confirmation runs again from scratch.

    Screening, the selection and the plans stay: the next confirmation runs under the same locked
    pre-registration and the same seed-determined plan. With ``reselect`` (screening data changed after the
    selection was locked: specstudy.study.selection_lock) the selection, the confirmation plan and the capacity
    results move too, so that the next run selects again from the screening files as they are now.
    """
    import shutil
    from pathlib import Path

    res = Path(results)
    rounds = Path(layout.confirm_rounds_dir(res))
    if not rounds.is_dir() and not (reselect and Path(layout.plan("confirm", res)).exists()):
        raise DecisionRuleError(f"{rounds}: no confirmation checkpoint to archive (run `snakemake "
                                "confirm` first)")
    dest = Path(to) / f"confirm-{stamp or compact()}"
    if dest.exists():
        raise DecisionRuleError(f"{dest}: already exists; pick another --stamp")
    for rel in CONFIRM_OUTPUTS + (RESELECT_OUTPUTS if reselect else ()):
        if (res / rel).exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(res / rel), str(dest / rel))
    return str(dest)


def final_state(path: str) -> tuple[str, dict]:
    """The last checkpoint record of a run (a rounds directory, a run directory or a round file)."""
    from pathlib import Path

    from specstudy.core import atomic

    p = Path(path)
    for cand in (p, p / "rounds", p / "confirm" / "rounds"):
        if cand.is_dir() and list(cand.glob("round*.json")):
            last = max(cand.glob("round*.json"), key=lambda f: int(f.stem[5:] or 0))
            return str(last), atomic.read_json(last)
    if p.is_file():
        try:
            st = atomic.read_json(p)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecisionRuleError(str(exc)) from None
        if not isinstance(st, dict) or st.get("schema") != "specstudy.confirm-round/1":
            schema = st.get("schema") if isinstance(st, dict) else type(st).__name__
            raise DecisionRuleError(f"{path}: field 'schema' is {schema!r}, not 'specstudy.confirm-round/1': not a "
                                    "confirmation checkpoint; give a run directory, its rounds directory or a "
                                    "results/confirm/rounds/round<n>.json")
        return str(p), st
    raise DecisionRuleError(f"{path}: no results/confirm/rounds/round<n>.json here (a confirmation run directory, its "
                            "rounds directory or a round file)")


def _cmd_show(args) -> int:
    try:
        states = [final_state(p) for p in args.runs]
    except DecisionRuleError as exc:
        print(f"error: {exc}")
        return 2
    for path, st in states:
        stab = st.get("stability") or {}
        print(f"{path}: after {st.get('round')} rounds: {st.get('decision')}; stability: {format_outcomes(stab)}")
        print(f"    stop: {st.get('why')}")
        for d in (stab.get("drivers") or [])[:3]:
            print(f"    driver: {d['arm']} {d['cell']} ({d['observed']}; flips in {d['flip_rate']:.0%} of resamples)")
    return 0


def _cmd_archive(args) -> int:
    try:
        dest = archive_confirmation(args.results, args.to, args.stamp, reselect=args.reselect)
    except DecisionRuleError as exc:
        print(f"error: {exc}")
        return 2
    what = "confirmation outputs, the selection and its plan" if args.reselect else "confirmation outputs"
    print(f"{what} moved to {dest}; `snakemake confirm` now runs confirmation again from round 1"
          + (" after selecting again from the screening files" if args.reselect else ""))
    return 0


def register(sub) -> None:
    p = sub.add_parser("confirm-archive", help="move this run's confirmation outputs aside so that it runs again")
    p.add_argument("--results", default="results")
    p.add_argument("--to", default="results-archive")
    p.add_argument("--stamp", default=None, help="suffix of the archive directory (default: UTC time)")
    p.add_argument("--reselect", action="store_true", help="also archive the locked selection, the confirmation "
                   "plan and capacity: the next run selects again (screening data changed after the lock)")
    p.set_defaults(func=_cmd_archive)
    p = sub.add_parser("confirm-show", help="decision, rounds and stability of one or more confirmation runs")
    p.add_argument("runs", nargs="+", help="results/confirm/rounds, results-archive/confirm-<stamp>, or round files")
    p.set_defaults(func=_cmd_show)
    p = sub.add_parser("confirm-round", help="checkpoint after a confirmation round: evaluate the pre-registered "
                                             "rule and decide whether one more round runs")
    p.add_argument("--config", required=True)
    p.add_argument("--lock", required=True, help="results/screen/prereg-lock.json")
    p.add_argument("--plan", required=True, help="results/plan/confirm.json (holds the rounds up to the cap)")
    p.add_argument("--round", type=int, required=True)
    p.add_argument("--summaries", nargs="+", required=True, help="cell summaries of rounds 1..round")
    p.add_argument("--gates", nargs="*", default=[], help="gate verdicts available now (screening gates)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_checkpoint)
