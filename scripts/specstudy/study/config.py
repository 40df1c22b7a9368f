"""Loading and checking the study config (the pre-registration it names: :mod:`specstudy.study.prereg`).

Schema errors name the file and the field; semantic checks (things a JSON schema cannot say)
name the field and the fix.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from specstudy.core import layout, schemas
from specstudy.core.errors import ConfigError, UserError
from specstudy.study.engine_methods import methods_record_path
from specstudy.study.engines import engine_builds, engine_label, engine_names

__all__ = ["ConfigError", "check_config", "load_config", "effective_config_files", "methods_record_path",
           "prereg_path", "request_counts", "resolved", "DEPLOYMENT_SECTIONS", "REPO_ROOT", "engine_builds",
           "engine_label", "engine_names"]

REPO_ROOT = Path(__file__).resolve().parents[3]


def _load_yaml(path: Path, what: str = "file") -> Any:
    """specstudy's own reader (studyyaml): duplicate keys, non-finite numbers, YAML errors and non-UTF-8
    bytes name the file and the line."""
    from specstudy.core.studyyaml import StudyYamlError, load

    try:
        return load(path, what)
    except StudyYamlError as exc:
        raise ConfigError(str(exc)) from None


def _scale_model_problems(cfg: dict, source: str) -> list[str]:
    """The scale model's shapes must embed the fixture pair exactly (scale_model.check_plan), refused at check time."""
    section = cfg.get("scale_model") or {}
    if not section.get("build"):
        return []
    from specstudy.inputs import fixture_models, scale_model

    fixture = cfg.get("fixture_models") or {}
    if not fixture.get("build"):
        return ["field 'scale_model.build': the scale model is widened from the fixture pair; set fixture_models.build: true"]
    draft = fixture_models.DRAFT_PRESETS[fixture.get("draft_preset", "default")]
    try:
        scale_model.check_plan(section, {"target": fixture_models.TARGET, "draft": draft}, source)
    except scale_model.ScaleModelError as exc:
        return [f"field 'scale_model': {exc}"]
    return []


def _variant_problems(cfg: dict) -> list[str]:
    """``arms.variants``: each varies an arm of the factorial, once, with settings core.arms accepts."""
    from specstudy.core import methods
    from specstudy.core.arms import arm_name, is_arm_name, override_problems, parse_arm
    from specstudy.study.engine_methods import engine_refusal

    arms = cfg["arms"]
    variants = arms.get("variants") or []
    problems: list[str] = []
    seen: set[str] = set()
    for i, v in enumerate(variants):
        where = f"arms.variants[{i}]"
        unknown = methods.method_of_unknown_arm(v["of"])
        if unknown:
            problems.append(methods.unknown_method(unknown, f"{where}.of"))
            continue
        base = parse_arm(v["of"]) if is_arm_name(v["of"]) else None
        if (base is None or "variant" in base or base["method"] not in arms["methods"]
                or base.get("num_speculative_tokens", 0) not in [0, *(arms.get("num_speculative_tokens") or [])]
                or base.get("draft_tensor_parallel_size", 0) not in [0, *(arms.get("draft_tensor_parallel_size") or [])]):
            problems.append(f"field '{where}.of': {v['of']!r} is not an arm of this study's factorial "
                            f"(arms.methods x num_speculative_tokens x draft_tensor_parallel_size); name one of them")
            continue
        if base.get("engine") not in engine_names(cfg):
            builds = [n for n in engine_names(cfg) if n]
            problems.append(f"field '{where}.of': {v['of']!r} " + (
                f"names no engine build of this study; name the arm with its build, e.g. {v['of'].split('@')[0]}@"
                f"{builds[0]} (builds: {', '.join(builds)})" if builds else
                "names an engine build, but this study declares no engines; remove the '@...'"))
            continue
        build = {"engine": engine_builds(cfg)[base.get("engine")]}  # a missing record is its own check's
        path = methods_record_path(build)
        refused = engine_refusal(build, base["method"]) if path is not None and path.is_file() else None
        if refused:
            who = f"engine build {base['engine']}" if base.get("engine") else "the declared engine"
            problems.append(f"field '{where}.of': {v['of']!r} is an arm of method {base['method']}, which {who} "
                            f"cannot serve: {refused}; vary a servable arm, or probe an engine that serves it")
            continue
        name = arm_name({**parse_arm(v["of"]), "variant": v["name"]})
        if name in seen:
            problems.append(f"field '{where}.name': {name} is declared twice; give each variant its own name")
        seen.add(name)
        problems.extend(override_problems(where, base["method"], v.get("speculative_config"),
                                          v.get("extra_args"), v.get("env")))
    return problems


# ------------------------------------------------------------------------------------------ engine builds
def _engine_problems(cfg: dict, source: str) -> list[str]:
    """A study of several engine builds: each has its own probe record, all share the tokenizer and the chat
    template (their outputs are compared), and none is asked for async scheduling with a method its record
    says it refuses it for."""
    problems: list[str] = []
    builds = engine_builds(cfg)
    if None in builds:
        return problems
    for name, engine in builds.items():
        if not cfg["engines"][name].get("methods_record"):  # its own: the engine section's is another build's
            problems.append(f"field 'engines.{name}.methods_record': every engine build needs its own probe record "
                            f"(what this build serves; engine.methods_record is not inherited); run `specstudy engine probe-methods` on this build (its "
                            f"python, server.env or container) and set the field to the file it writes")
        elif not methods_record_path({"engine": engine}).is_file():
            problems.append(f"field 'engines.{name}.methods_record': {engine['methods_record']} does not exist; write "
                            f"it with `specstudy engine probe-methods` run on this build, or fix the path")
    for field in ("tokenizer", "chat_template"):
        seen = {name: (engine["target"].get(field) or (engine["target"]["path"] if field == "tokenizer" else
                                                        "(the model's own)")) for name, engine in builds.items()}
        if len(set(seen.values())) > 1:
            problems.append(f"field 'engines.*.target.{field}': the engine builds differ ("
                            + ", ".join(f"{n}: {v}" for n, v in seen.items())
                            + f"); their outputs would not be comparable; give every build the same {field}")
    from specstudy.core import methods

    for name in builds:  # what the registry says every engine refuses, in each build's own flags
        flags = [str(a) for a in (cfg["engines"][name].get("server") or {}).get("extra_args") or []]
        for m in cfg["arms"]["methods"]:
            decl = methods.find(m)
            if decl is not None and flags:
                problems.extend(decl.forbidden_problems(f"engines.{name}.server", None, flags))
    problems.extend(_async_problems(cfg, builds))
    return problems


ASYNC_FLAG = "--async-scheduling"


def _async_problems(cfg: dict, builds: dict) -> list[str]:
    """``--async-scheduling`` in a build's server flags (every speculative arm of that build) or in a variant's
    (that variant's arm), where the build's probe record says it refuses it with that method."""
    from specstudy.core.arms import is_arm_name, parse_arm
    from specstudy.study.engine_methods import async_refusal, load_record

    out: list[str] = []
    speculative = [m for m in cfg["arms"]["methods"] if m != "baseline"]
    for name, engine in builds.items():
        path = methods_record_path({"engine": engine})
        if path is None or not path.is_file():
            continue
        record = load_record(path)
        where = f"engines.{name}.server.extra_args" if name else "engine.server.extra_args"
        if any(a.split("=", 1)[0] == ASYNC_FLAG for a in (engine.get("server") or {}).get("extra_args") or []):
            for method in speculative:
                refused = async_refusal(record, method, engine["methods_record"])
                if refused:
                    out.append(f"field '{where}': {ASYNC_FLAG} is asked for every arm of this build, but {refused}; "
                               f"remove the flag, or declare it as a variant of the methods that accept it")
        for i, v in enumerate(cfg["arms"].get("variants") or []):
            if not any(a.split("=", 1)[0] == ASYNC_FLAG for a in v.get("extra_args") or []):
                continue
            base = parse_arm(v["of"]) if is_arm_name(v["of"]) else None
            if base is None or base.get("engine") != name:
                continue
            refused = async_refusal(record, base["method"], engine["methods_record"])
            if refused:
                out.append(f"field 'arms.variants[{i}].extra_args': {ASYNC_FLAG} on {v['of']}, but {refused}; "
                           f"remove the flag or vary an arm of a build that accepts it")
    return out


def _refused_by_every_build(cfg: dict, method: str) -> str | None:
    """The engine's refusal of ``method`` where every engine build's readable record refuses it (one build that
    may serve it needs the method's settings); None otherwise."""
    from specstudy.study.engine_methods import engine_refusal

    refusals = []
    for engine in engine_builds(cfg).values():
        one = {"engine": engine}
        path = methods_record_path(one)
        refusals.append(engine_refusal(one, method) if engine.get("methods_record") and path.is_file() else None)
    return refusals[0] if all(refusals) else None


def _method_problems(cfg: dict, source: str) -> list[str]:
    """``arms.methods`` (and ``arms.unservable[].method``) against the method registry (core.methods): each a
    registered method, with the levels, settings and model directory its registration needs, and nothing the
    engine refuses with it. A method the record says the engine refused needs no model directory: its arms are
    skipped, never deployed. (A method the record does not cover is the pre-flight's: the probe that writes
    the record reads this config too.)"""
    from specstudy.core import methods

    arms, engine = cfg["arms"], cfg["engine"]
    problems: list[str] = []
    listed = []
    for i, name in enumerate(arms["methods"]):
        if name != methods.BASELINE and methods.find(name) is None:
            problems.append(methods.unknown_method(name, f"arms.methods[{i}]"))
        elif name != methods.BASELINE:
            listed.append(methods.get(name))
    for i, rule in enumerate(arms.get("unservable") or []):
        if "method" in rule and rule["method"] != methods.BASELINE and methods.find(rule["method"]) is None:
            problems.append(methods.unknown_method(rule["method"], f"arms.unservable[{i}].method"))
    if problems:
        return problems
    seen_sections: set[str] = set()
    flags = [str(a) for a in (engine.get("server") or {}).get("extra_args") or []]
    for decl in listed:
        refused = _refused_by_every_build(cfg, decl.name)
        if decl.model and not refused and not (engine.get(decl.model.section) or {}).get("path"):
            problems.append(f"field '{decl.model.field}': required for method {decl.name}; set {decl.model.what} "
                            f"(or remove {decl.name} from arms.methods)")
        for level in decl.levels[1:]:
            if not arms.get(level.field):
                problems.append(f"field 'arms.{level.field}': required for method {decl.name}; e.g. {level.example}")
        s = decl.settings
        if s and s.required and s.section not in seen_sections:
            section = arms.get(s.section) or {}
            if any(k not in section for k in s.keys):
                problems.append(f"field 'arms.{s.section}': needs {' and '.join(s.keys)} for method {decl.name}")
            elif s.check:
                problems.extend(s.check(section))
        if s:
            seen_sections.add(s.section)
        if not refused:
            problems.extend(decl.forbidden_problems("engine.server", None, flags))
    for section, s in methods.settings_sections().items():
        owners = methods.methods_with_settings(section)
        if not s.required and arms.get(section) and not set(owners) & set(arms["methods"]):
            problems.append(f"field 'arms.{section}': set only with method {'/'.join(owners)} in arms.methods; add "
                            f"{owners[0]} or remove arms.{section}")
    return problems


def request_counts(settings: dict, concurrency: int) -> tuple[int, int]:
    """(measured, warm-up) request counts of a cell at ``concurrency``.

    ``cells.requests_by_concurrency`` / ``cells.warmup_requests_by_concurrency`` (keys are concurrency
    levels) override ``cells.requests`` / ``cells.warmup_requests`` for the levels they name, so a cell at
    concurrency 32 can send enough requests to keep 32 in flight for a while without making the cells at
    concurrency 1 long. ``cells.warmup_per_slot`` sizes the warm-up by rule: ``warmup_per_slot`` x concurrency
    requests (one batch at the cell's concurrency per unit), at least ``warmup_requests``; a level named in
    ``warmup_requests_by_concurrency`` keeps its own figure.
    """
    def pick(by_key: str, default: int) -> int:
        by = settings.get(by_key) or {}
        value = by.get(str(int(concurrency)), by.get(int(concurrency)))
        return int(default if value is None else value)

    warm = int(settings["warmup_requests"])
    if settings.get("warmup_per_slot") is not None:
        warm = max(warm, int(settings["warmup_per_slot"]) * int(concurrency))
    return pick("requests_by_concurrency", int(settings["requests"])), pick("warmup_requests_by_concurrency", warm)


def prereg_path(cfg: dict) -> Path:
    """The pre-registration file the config names: relative to the working directory, else to the repository."""
    p = Path(cfg["study"]["preregistration"])
    return p if (p.is_absolute() or p.exists()) else REPO_ROOT / p


def _confirmation_concurrency(cfg: dict) -> tuple[str, list[int]]:
    """The pre-registration's confirmation concurrencies, read where the config names it; ``[]`` when the file
    cannot be read (its own checks, :func:`specstudy.study.prereg.load_prereg`, then name what is wrong)."""
    try:
        path = prereg_path(cfg)
        prereg = _load_yaml(path, "pre-registration")
        conc = (prereg.get("confirmation") or {}).get("concurrency") or []
        return str(path), [int(c) for c in conc]
    except (ConfigError, OSError, AttributeError, TypeError, ValueError):
        return "", []


def _warmup_problems(cfg: dict) -> list[str]:
    """Every cell warms up at least as many requests as its concurrency: the warm-up runs the workload at the
    cell's concurrency shape (one full batch before the window opens), as the pre-registration promises."""
    from specstudy.study import phase_decl

    prereg_file, confirm = _confirmation_concurrency(cfg)
    where = [("cells", dict(cfg["cells"]), "screen.concurrency", list(cfg["screen"]["concurrency"]))]
    if confirm:
        where.append(("cells", dict(cfg["cells"]), f"confirmation.concurrency of {prereg_file}", confirm))
    for phase in phase_decl.declared(cfg):
        decl = phase_decl.DECLS[phase]
        if decl.has_cells:
            s = phase_decl.section(cfg, phase)
            own = {k: s[k] for k in ("requests", "warmup_requests") if k in s}
            field = f"extensions.{phase}" if "warmup_requests" in own else "cells"
            where.append((field, {**cfg["cells"], **own}, f"extensions.{phase}.concurrency",
                          decl.cell_concurrency(cfg)))
    problems: list[str] = []
    seen: set[tuple[str, int]] = set()
    for section, settings, levels_from, levels in where:
        for c in levels:
            warm = request_counts(settings, c)[1]
            if warm >= c or (section, c) in seen:
                continue
            seen.add((section, c))
            by = settings.get("warmup_requests_by_concurrency") or {}
            field = (f"cells.warmup_requests_by_concurrency.{c}" if section == "cells" and str(c) in by
                     else f"{section}.warmup_requests")
            problems.append(
                f"field '{field}': {warm} warm-up request(s) at concurrency {c} ({levels_from}) is fewer than the "
                f"concurrency, so the warm-up never runs the cell's concurrency shape; set cells.warmup_per_slot: 1 "
                f"(warm-up = concurrency, at least warmup_requests) or warmup_requests_by_concurrency: "
                f"{{\"{c}\": {c}}}")
    return problems


def check_config(cfg: dict, source: str = "<config>") -> dict:
    """Validate ``cfg`` against config.schema.json plus cross-field rules; return it unchanged."""
    try:
        schemas.validate(cfg, "config", source)
    except schemas.ValidationError as exc:
        raise ConfigError(str(exc)) from None
    problems = []
    arms = cfg["arms"]
    methods = arms["methods"]
    if "baseline" not in methods:
        problems.append("field 'arms.methods': must include 'baseline' (every comparison is against it); add baseline")
    spec_methods = [m for m in methods if m != "baseline"]
    if spec_methods and not arms.get("num_speculative_tokens"):
        problems.append("field 'arms.num_speculative_tokens': required when a speculative method is listed; e.g. [2, 3, 5, 8]")
    problems.extend(_method_problems(cfg, source))
    problems.extend(_variant_problems(cfg))
    problems.extend(_engine_problems(cfg, source))
    record = cfg["engine"].get("methods_record")
    if record and not methods_record_path(cfg).is_file():
        problems.append(f"field 'engine.methods_record': {record} does not exist; write it with "
                        f"`specstudy engine probe-methods --config {source} --out {record}`")
    drift = (cfg.get("plan") or {}).get("drift_cell")
    if drift:
        if drift["workload"] not in cfg["corpora"]["workloads"]:
            problems.append(f"field 'plan.drift_cell.workload': {drift['workload']!r} is not a workload in corpora.workloads "
                            f"({', '.join(cfg['corpora']['workloads'])})")
    problems.extend(_scale_model_problems(cfg, source))
    launch_ref = (cfg.get("recommendation") or {}).get("model_launch")
    if launch_ref:
        from specstudy.inputs.model_launch import load_manifest, manifest_path

        try:
            load_manifest(manifest_path(launch_ref, REPO_ROOT))
        except UserError as exc:
            problems.append(f"field 'recommendation.model_launch': {exc}")
    problems.extend(_warmup_problems(cfg))
    per_request = (cfg.get("cost") or {}).get("seconds_per_request")
    if per_request is not None:
        workloads = list(cfg["corpora"]["workloads"])
        missing = [w for w in workloads if w not in per_request]
        if missing:
            problems.append(f"field 'cost.seconds_per_request': no figure for workload(s) {', '.join(missing)}; declare "
                            "the seconds per request at concurrency 1 of every workload of corpora.workloads (e.g. "
                            f"{missing[0]}: 2.5): long-input workloads cost far more than open chat")
    from specstudy.inference.decision import MOVED_TO_TRAFFIC

    for k, dest in MOVED_TO_TRAFFIC.items():
        if k in (cfg.get("recommendation") or {}):
            problems.append(f"field 'recommendation.{k}': no longer read from the config; declare it in the "
                            f"pre-registration as '{dest}' (locked by its hash before screening) and remove it here")
    cap = cfg.get("capacity") or {}
    if cap.get("enabled") and cap.get("workload") not in cfg["corpora"]["workloads"]:
        problems.append(f"field 'capacity.workload': {cap.get('workload')!r} is not a workload in corpora.workloads")
    if problems:
        raise ConfigError(f"{source}: invalid study config:\n  - " + "\n  - ".join(problems))
    # Chat-template switches (docs/thinking.md): checked against the template here where it is readable;
    # a target not built yet defers that part to the plan command and the deployment job.
    from specstudy.study.template_args import check_workload_options

    check_workload_options(cfg, source, require_template=False)
    return cfg


def load_config(path: str | Path) -> dict:
    path = Path(path)
    cfg = _load_yaml(path, "study config")
    if not isinstance(cfg, dict):
        kind = "empty" if cfg is None else f"a {type(cfg).__name__}"
        raise ConfigError(f"{path}: line 1: the study config is {kind}, not a mapping; it must be a mapping with "
                          "keys study, engine, corpora, cells, arms, screen")
    if "study" not in cfg and {"selection", "confirmation", "gate"} & set(cfg):
        raise ConfigError(f"{path}: this is a pre-registration (keys {', '.join(sorted(cfg))}), not a study config; "
                          "pass the study config that names it under study.preregistration (e.g. config/config.yaml)")
    return check_config(cfg, str(path))


#: The sections of a study config that a deployment job reads (engine and its builds, cell settings, corpora,
#: capacity search, the workloads' chat-template switches).
DEPLOYMENT_SECTIONS = ("study", "engine", "engines", "corpora", "cells", "capacity", "workload_options")


def effective_config_files(cfg: dict, root: str = layout.ROOT) -> dict[str, str]:
    """The workflow's effective config as content-addressed files, ``{path: text}`` (written by the
    rule ``effective_config``, never while the workflow is parsed): ``<hash>.json`` holds the whole
    config (plans, selection, report); ``deployment-<hash>.json`` only :data:`DEPLOYMENT_SECTIONS`, so
    that a change elsewhere (analysis, report) does not re-run a capacity search."""
    import hashlib
    import json

    out = {}
    for prefix, data in (("", cfg), ("deployment-", {k: cfg[k] for k in DEPLOYMENT_SECTIONS if k in cfg})):
        text = json.dumps(data, sort_keys=True, indent=1)
        out[layout.config_file(f"{prefix}{hashlib.sha256(text.encode()).hexdigest()[:16]}", root)] = text
    return out


def resolved(cfg: dict) -> dict:
    """A deep copy safe to serialize (used for params and the report)."""
    return copy.deepcopy(cfg)
