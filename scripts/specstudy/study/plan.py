"""The study plan: arms, the factorial of deployments and cells, and their counterbalanced order.

Design (recorded in ``plan.json`` with its seed):
- Arms: baseline and, for every method of ``arms.methods``, one arm per combination of its levels as its
  registration declares (:mod:`specstudy.core.methods`: ``draft-k<k>-tp<t>`` for every depth × draft TP,
  ``<method>-k<k>`` for every depth of every other method). Levels declared unservable in the config,
  and methods the engine's recorded probe (``engine.methods_record``, :mod:`specstudy.study.engine_methods`)
  says it refused, appear in the plan as skipped, with their reason (the engine's own message).
- Deployments: ``repeats`` rounds; in every round each arm is deployed once (a randomized complete
  block design): the arms' order inside a round is a seeded random permutation, so no arm is
  systematically first or last. Rounds are assigned to ``blocks`` (node/date blocks, a nuisance
  factor) round-robin; in confirmation, rounds 1..``repeats`` always run and rounds up to the
  pre-registered cap ``max_repeats`` are planned but run only when the checkpoint after the round
  before asks for them (``adaptive: true``; placed after the block's drift baselines); each block gets ``drift_baselines_per_block`` extra baseline deployments
  (``drift<n>``) running one drift cell, placed at the block's end, to detect drift over time.
- Cells inside a deployment: a seeded shuffle of (workload × concurrency), then rotated by the
  arm's repeat index (a Latin-square rotation), so each cell occupies each position equally
  often across repeats of an arm when the repeat count is a multiple of the cell count.
"""

from __future__ import annotations

import hashlib
import random
from itertools import product
from pathlib import Path

from specstudy.core import layout, methods
from specstudy.core.arms import ARM_PATTERN, BASELINE_PATTERN, VARIANT_SETTINGS, arm_name, is_baseline
from specstudy.core.atomic import sha256_file
from specstudy.study.config import ConfigError, request_counts  # noqa: F401  (request_counts: read from here too)
from specstudy.study.phase_decl import CORE_PHASES, DECLS, PHASES
from specstudy.study.prereg import load_prereg, prereg_path

# re-exported: rules/common.smk reads plan.ARM_PATTERN; the phases are declared in specstudy.study.phase_decl
__all__ = ["ARM_PATTERN", "BASELINE_PATTERN", "CORE_PHASES", "PHASES", "arm_name"]


def _engine_refusal(engine: dict, method: str) -> str | None:
    """The refusal of ``method`` in the probe record of one engine section (a build's, in a study of several)."""
    from specstudy.study.engine_methods import engine_refusal

    return engine_refusal({"engine": engine}, method)


def _unservable_reason(cfg: dict, spec: dict, engine: dict) -> str | None:
    refused = _engine_refusal(engine, spec["method"])
    if refused:
        return refused
    target_tp = engine["target"]["tensor_parallel_size"]
    for rule in cfg["arms"].get("unservable") or []:
        if "method" in rule and rule["method"] != spec["method"]:
            continue
        if "num_speculative_tokens" in rule and rule["num_speculative_tokens"] != spec.get("num_speculative_tokens"):
            continue
        if "draft_tensor_parallel_size" in rule and rule["draft_tensor_parallel_size"] != spec.get("draft_tensor_parallel_size"):
            continue
        if rule.get("draft_tensor_parallel_size_differs_from_target") and spec.get("draft_tensor_parallel_size") in (None, target_tp):
            continue
        return rule["reason"]
    return None


def all_arms(cfg: dict) -> list[dict]:
    """Every arm of the factorial with ``servable`` and, if not, ``skip_reason``; in a study of several engine
    builds every arm once per build (``engine``), each judged servable by its own build's probe record."""
    from specstudy.study.config import engine_builds

    arms_cfg = cfg["arms"]
    specs: list[dict] = []
    for method in arms_cfg["methods"]:
        if method == methods.BASELINE:
            specs.append({"method": methods.BASELINE})
            continue
        decl = methods.find(method)
        if decl is None:
            raise ConfigError(f"config: {methods.unknown_method(method, 'arms.methods')}")
        fields = decl.arm_fields()
        settings = decl.settings.arm_fields(arms_cfg.get(decl.settings.section) or {}) if decl.settings else {}
        for combo in product(*(arms_cfg[f] for f in fields)):
            specs.append({"method": method, **dict(zip(fields, combo, strict=True)), **settings})
    out = []
    for build, engine in engine_builds(cfg).items():
        for base in specs:
            spec = dict(base, engine=build) if build else dict(base)
            spec["name"] = arm_name(spec)
            reason = _unservable_reason(cfg, spec, engine)
            spec["servable"] = reason is None
            if reason:
                spec["skip_reason"] = reason
            out.append(spec)
    return out


def servable_arms(cfg: dict) -> list[dict]:
    return [a for a in all_arms(cfg) if a["servable"]]


def variant_arms(cfg: dict) -> list[dict]:
    """The declared variants (``arms.variants``): each the spec of its arm (``of``) with ``variant`` and the
    variant's settings, named ``<arm>+<variant>``; deployed only where named (``extensions.arms``), never
    part of the factorial that screening expands."""
    factorial = {a["name"]: a for a in all_arms(cfg)}
    out = []
    for i, v in enumerate((cfg.get("arms") or {}).get("variants") or []):
        if v["of"] not in factorial:
            raise ConfigError(f"config: field 'arms.variants[{i}].of' is {v['of']!r}, not an arm of this study's "
                              f"factorial ({', '.join(factorial)})")
        spec = {k: val for k, val in factorial[v["of"]].items() if k != "name"}
        spec["variant"] = v["name"]
        spec.update({k: v[k] for k in VARIANT_SETTINGS if v.get(k)})
        spec["name"] = arm_name(spec)
        out.append(spec)
    return out


def arm_by_name(cfg: dict, name: str) -> dict:
    for arm in all_arms(cfg) + variant_arms(cfg):
        if arm["name"] == name:
            return arm
    raise KeyError(f"arm {name!r} is not part of this study's factorial or its variants "
                   f"(arms: {', '.join(a['name'] for a in all_arms(cfg) + variant_arms(cfg))})")


def _rng(seed: int, *parts) -> random.Random:
    key = "|".join(str(p) for p in (seed, *parts))
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))


def phase_design(cfg: dict, phase: str, prereg: dict | None = None) -> dict:
    """The design the phase's declaration (:data:`specstudy.study.phase_decl.DECLS`) records in its plan."""
    decl = DECLS[phase]
    if prereg is None and decl.needs_prereg:
        prereg = load_prereg(cfg)
    return decl.design(cfg, prereg)


def drift_cell(cfg: dict, phase: str = "screen", prereg: dict | None = None) -> dict:
    """The one cell a drift baseline deployment runs: ``plan.drift_cell``, else the first workload at the
    phase's first concurrency (a config fact: the Snakefile's drift rule names its output from it)."""
    declared = (cfg.get("plan") or {}).get("drift_cell")
    if declared:
        return dict(declared)
    return {"workload": list(cfg["corpora"]["workloads"])[0], "concurrency": phase_design(cfg, phase, prereg)["concurrency"][0]}


def cell_order(cfg: dict, phase: str, arm: str, rep_index: int, workloads: list[str], concurrency: list[int]) -> list[dict]:
    base = [{"workload": w, "concurrency": c} for w, c in product(workloads, concurrency)]
    _rng(cfg["study"]["seed"], phase, "cells", arm).shuffle(base)
    shift = rep_index % len(base)
    return base[shift:] + base[:shift]


def make_plan(cfg: dict, phase: str = "screen", arms: list[str] | None = None, prereg: dict | None = None) -> dict:
    """Expand the factorial of ``phase`` into ordered deployments and cells.

    ``arms`` restricts the arm set (confirmation: baseline + the selection's candidates).
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    seed = cfg["study"]["seed"]
    design = phase_design(cfg, phase, prereg)
    every = all_arms(cfg)
    if arms is not None:  # named arms: the factorial's and the declared variants
        known = {a["name"]: a for a in every + variant_arms(cfg)}
        unknown = [a for a in arms if a not in known]
        if unknown:
            raise KeyError(f"arms not in the factorial or its variants: {unknown}")
        chosen = [known[a] for a in arms]
    else:
        chosen = [a for a in every if a["servable"]]
    skipped = [{"arm": a["name"], "reason": a["skip_reason"]} for a in every if not a["servable"]]
    extension = DECLS[phase].extension
    workloads = list(design["workloads"]) if extension else list(cfg["corpora"]["workloads"])
    plan_cfg = cfg.get("plan") or {}
    blocks = 1 if extension else int(plan_cfg.get("blocks", 1))
    drift_n = 0 if extension else int(plan_cfg.get("drift_baselines_per_block", 0))
    drift = None if extension else drift_cell(cfg, phase, prereg)
    kind = design.get("kind", "repeat")
    deployments: list[dict] = []
    names = [a["name"] for a in chosen]
    by_block: dict[int, list[dict]] = {b: [] for b in range(1, blocks + 1)}
    initial = int(design["repeats"])
    # An extension phase may deploy the baseline more often (the sampling phase's control needs two).
    base_reps = int(design.get("baseline_repeats", initial))
    cap = int(design.get("max_repeats", max(initial, base_reps)))

    def add_round(r: int) -> None:
        order = [n for n in names if r <= (base_reps if is_baseline(n) else initial) or r > max(initial, base_reps)]
        _rng(seed, phase, "round", r).shuffle(order)
        block = (r - 1) % blocks + 1
        for name in order:
            cells = cell_order(cfg, phase, name, r - 1, workloads, design["concurrency"]) if workloads else []
            by_block[block].append({"phase": phase, "arm": name, "rep": layout.rep_label(r), "kind": kind, "round": r, "block": block,
                                    "adaptive": r > max(initial, base_reps), "cells": cells})

    for r in range(1, max(initial, base_reps) + 1):
        add_round(r)
    drift_counter = 0
    baselines = [n for n in names if is_baseline(n)]  # one per engine build
    for block in range(1, blocks + 1):
        for _ in range(drift_n):
            for base in baselines:
                drift_counter += 1
                by_block[block].append({"phase": phase, "arm": base, "rep": layout.drift_label(drift_counter),
                                        "kind": "drift", "round": None, "block": block, "adaptive": False,
                                        "cells": [dict(drift)]})
    # Adaptive rounds come after the drift baselines so that nothing always-run waits for a round that may not run.
    for r in range(max(initial, base_reps) + 1, cap + 1):
        add_round(r)
    for block in range(1, blocks + 1):
        for i, dep in enumerate(by_block[block]):
            dep["position_in_block"] = i
            dep["after"] = by_block[block][i - 1]["arm"] + "/" + by_block[block][i - 1]["rep"] if i else None
            deployments.append(dep)
    for n, dep in enumerate(deployments):
        dep["order"] = n
    return {
        "schema": "specstudy.plan/1",
        "phase": phase,
        "seed": seed,
        "design": {**design, "max_repeats": cap, "workloads": workloads, "blocks": blocks, "drift_baselines_per_block": drift_n,
                   "drift_cell": drift,
                   "deployment_order": ("seeded random order per round; rounds beyond an arm's repeats hold only the arms "
                                        "planned more often (the sampling baseline's second deployment)") if extension
                   else "randomized complete blocks (one of each arm per round)",
                   "cell_order": "seeded shuffle, Latin-square rotation by repeat index"},
        "arms": [{k: v for k, v in a.items() if k not in ("servable",)} for a in chosen],
        "skipped": skipped,
        "deployments": deployments,
    }


def find_deployment(plan: dict, arm: str, rep: str) -> dict:
    for dep in plan["deployments"]:
        if dep["arm"] == arm and dep["rep"] == rep:
            return dep
    raise KeyError(f"{plan['phase']} plan has no deployment {arm}/{rep}")


def predecessor(plan: dict, arm: str, rep: str) -> dict | None:
    """The deployment planned right before ``arm/rep`` in its block (None if first)."""
    dep = find_deployment(plan, arm, rep)
    if dep["after"] is None:
        return None
    a, r = dep["after"].split("/")
    return find_deployment(plan, a, r)


def prereg_lock(cfg: dict | None = None, path: str | Path | None = None) -> dict:
    """The lock record of the pre-registration file (given directly or through the config)."""
    if path is None:
        path = prereg_path(cfg)
        load_prereg(cfg)  # validates
    else:
        load_prereg({"study": {"preregistration": str(path)}})
    from specstudy.study.prereg_guard import lock_content

    return {"schema": "specstudy.prereg-lock/1", "preregistration": str(path), "sha256": sha256_file(path),
            "content": lock_content(path)}


