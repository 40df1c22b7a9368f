"""The pre-registration: where the study config names it, its file read and checked, section by section.

Every check of a pre-registration runs from here, so that a study is refused at parse time naming the
file, the field and the fix: the decision rule's margins, stopping rule and traffic
(:func:`specstudy.inference.decision.check_prereg`, :func:`specstudy.inference.decision.check_traffic`), the hypotheses'
tests (:data:`specstudy.inference.stats.HYPOTHESIS_TESTS`), the sampling phase's section and the capacity criteria
(their judges, :mod:`specstudy.phases.sampling` and :mod:`specstudy.analysis.capacity_criteria`, read what these checks
let through). The lock that freezes the file before screening is :mod:`specstudy.study.prereg_guard`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specstudy.core import schemas
from specstudy.core.errors import UserError
from specstudy.study.config import ConfigError, _load_yaml, prereg_path  # noqa: F401  (prereg_path: read from here)


def check_hypotheses(prereg: dict, workloads, source: str = "<pre-registration>") -> None:
    """Every declared hypothesis names a known test, has the roles that test needs, and its workload
    roles name workloads of this study (an H2 naming 'chat' in a study of 'open_chat' is never testable)."""
    from specstudy.inference.stats import HYPOTHESIS_TESTS

    workloads = list(workloads)
    problems = []
    seen = set()
    for i, h in enumerate(prereg.get("hypotheses") or []):
        where = f"field 'hypotheses[{i}]' ({h.get('id')})"
        if h["id"] in seen:
            problems.append(f"{where}: duplicate id {h['id']!r}; give every hypothesis its own id")
        seen.add(h["id"])
        test = HYPOTHESIS_TESTS.get(h["test"])
        if test is None:
            problems.append(f"{where}.test: {h['test']!r} is not a known test; use one of {sorted(HYPOTHESIS_TESTS)}")
            continue
        roles = h.get("roles") or {}
        for role, kind in test["roles"].items():
            if role not in roles:
                problems.append(f"{where}.roles.{role}: required by test {h['test']!r} "
                                f"({'a list of workloads' if kind == 'list' else 'a workload'} of {workloads})")
                continue
            names = roles[role] if isinstance(roles[role], list) else [roles[role]]
            if (kind == "list") != isinstance(roles[role], list):
                problems.append(f"{where}.roles.{role}: must be {'a list of workloads' if kind == 'list' else 'one workload name'}")
            for name in names:
                # Membership is checked where the study's workloads are known (a caller holding only the
                # pre-registration's path, e.g. a lock check, cannot tell and checks the rest).
                if workloads and name not in workloads:
                    problems.append(f"{where}.roles.{role}: {name!r} is not a workload of this study; "
                                    f"use one of {workloads} (corpora.workloads)")
        extra = set(roles) - set(test["roles"])
        if extra:
            problems.append(f"{where}.roles: {sorted(extra)} not used by test {h['test']!r} "
                            f"(its roles: {sorted(test['roles']) or 'none'})")
    if problems:
        raise ConfigError(f"{source}: invalid hypotheses:\n  - " + "\n  - ".join(problems))


def read_prereg_file(path: str | Path) -> dict:
    """A pre-registration file, parsed and checked against its schema (errors name the file and field)."""
    data = _load_yaml(Path(path), "pre-registration")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: line 1: the pre-registration is {'empty' if data is None else 'a ' + type(data).__name__}, "
                          "not a mapping; check that study.preregistration names a pre-registration file "
                          "(keys version, selection, confirmation, gate)")
    try:
        schemas.validate(data, "preregistration", str(path))
    except schemas.ValidationError as exc:
        raise ConfigError(str(exc)) from None
    return data


def load_prereg(cfg: dict) -> dict:
    path = prereg_path(cfg)
    data = read_prereg_file(path)
    check_hypotheses(data, (cfg.get("corpora") or {}).get("workloads") or [], str(path))
    if data.get("sampling") is not None:  # optional: the opt-in sampling phase (docs/sampling.md)
        try:
            check_sampling(data["sampling"], str(path))
        except SamplingInputError as exc:
            raise ConfigError(str(exc)) from None
    from specstudy.inference.decision import DecisionRuleError, check_prereg, check_traffic

    try:
        check_prereg(data, str(path))
        check_traffic(data, (cfg.get("corpora") or {}).get("workloads") or [], str(path))
        try:
            check_capacity_criteria(data, bool((cfg.get("capacity") or {}).get("enabled")), str(path))
        except CapacityCriteriaError as exc:
            raise DecisionRuleError(str(exc)) from None
    except DecisionRuleError as exc:
        raise ConfigError(str(exc)) from None
    return data


class SamplingInputError(UserError):
    """Bad input to the sampling judge; the message names the file, the field and the fix."""


def check_sampling(settings: Any, source: str = "sampling settings") -> dict:
    """Check a pre-registration's ``sampling`` section (schema + cross-field rules); errors name ``source``
    and the field (``sampling.<path>``). Returns it unchanged."""
    import jsonschema

    sub = schemas.load_schema("preregistration")["properties"]["sampling"]
    validator = jsonschema.validators.validator_for(sub)(sub)
    errs = []
    for err in sorted(validator.iter_errors(settings), key=lambda e: list(map(str, e.absolute_path))):
        field = ".".join(["sampling", *map(str, err.absolute_path)])
        allowed = f" (allowed: {', '.join(map(str, err.validator_value))})" if err.validator == "enum" else ""
        errs.append(f"field '{field}': {err.message}{allowed}")
    if not errs and settings["control_pairing"] == "rotated_seed" and settings["seeds"]["per_prompt"] < 2:
        errs.append("field 'sampling.seeds.per_prompt': rotated_seed control pairing needs at least 2 seeds per "
                    "prompt; raise per_prompt or declare control_pairing: same_seed")
    if errs:
        raise SamplingInputError(f"{source}: invalid sampling section:\n  - " + "\n  - ".join(errs))
    return settings


def load_sampling_settings(prereg_path: str | os.PathLike) -> dict:
    """The ``sampling`` section of a pre-registration file (schema-checked, then :func:`check_sampling`).

    Errors name the file and the field; a pre-registration without the section is refused."""
    path = Path(prereg_path)
    section = read_prereg_file(path).get("sampling")
    if section is None:
        raise SamplingInputError(f"{path}: field 'sampling' missing; the sampling phase needs a pre-registered "
                                 "sampling section (see docs/sampling.md)")
    return check_sampling(section, str(path))


#: The limits every capacity criterion declares (``capacity_criteria.<field>``).
FIELDS = ("min_knee_ratio", "matched_load_fraction", "max_ttft_p95_ratio", "max_tpot_p95_ratio",
          "max_kv_tokens_lost_fraction")


class CapacityCriteriaError(ValueError):
    """The pre-registered capacity criteria are missing or unusable; the message names the file and field."""


def check_capacity_criteria(prereg: dict, capacity_enabled: bool, source: str = "<pre-registration>") -> None:
    """``capacity_criteria`` is required when the study runs a capacity search (the schema checks types)."""
    crit = prereg.get("capacity_criteria")
    if crit is None:
        if capacity_enabled:
            raise CapacityCriteriaError(
                f"{source}: field 'capacity_criteria': missing, but the study runs a capacity search (capacity.enabled); "
                "declare the limits before screening, e.g. capacity_criteria: {min_knee_ratio: 0.9, "
                "matched_load_fraction: 0.8, max_ttft_p95_ratio: 1.2, max_tpot_p95_ratio: 1.2, "
                "max_kv_tokens_lost_fraction: 0.6}")
        return
    missing = [f for f in FIELDS if crit.get(f) is None]
    if missing:
        raise CapacityCriteriaError(f"{source}: field 'capacity_criteria.{missing[0]}': missing; every criterion "
                                    f"needs its declared limit ({', '.join(FIELDS)})")
