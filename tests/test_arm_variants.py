"""Arm variants (``arms.variants``, docs/profile.md "Arm variants"): an arm of the factorial with declared extra
``speculative_config`` keys, server flags or environment, named ``<arm>+<variant>``. The profile config of the
scale pair (config/gpu-h200-scale-profile.yaml) declares two; their launch commands carry the settings, and
bad settings are refused naming the field. No GPU, no server."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from specstudy.core.arms import ARM_PATTERN, arm_name, parse_arm  # noqa: E402
from specstudy.deployment.command import build_command, strip_speculative, validate_arm, with_variant  # noqa: E402
from specstudy.job.spec import deployment_spec, engine_flat, fingerprint_context  # noqa: E402
from specstudy.study import plan  # noqa: E402
from specstudy.study.config import ConfigError, check_config, load_config  # noqa: E402

PROFILE_CONFIG = ROOT / "config" / "gpu-h200-scale-profile.yaml"
ARMS = ["baseline", "draft-k3-tp1", "draft-k3-tp1+eager-draft", "baseline+v1-sync"]


@pytest.fixture(scope="module")
def cfg() -> dict:
    return load_config(str(PROFILE_CONFIG))


def _command(cfg: dict, name: str) -> list[str]:
    return build_command(engine_flat(cfg["engine"]), plan.arm_by_name(cfg, name), port=8000, served_model_name="x")


def _spec_config(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_variant_names_round_trip_and_match_the_wildcard():
    import re

    spec = parse_arm("draft-k3-tp1+eager-draft")
    assert spec == {"name": "draft-k3-tp1+eager-draft", "method": "draft_model", "num_speculative_tokens": 3,
                    "draft_tensor_parallel_size": 1, "variant": "eager-draft"}
    assert arm_name(spec) == "draft-k3-tp1+eager-draft"
    assert parse_arm("baseline+v1-sync") == {"name": "baseline+v1-sync", "method": "baseline", "variant": "v1-sync"}
    assert re.fullmatch(ARM_PATTERN, "ngram-k3+a_b-1") and not re.fullmatch(ARM_PATTERN, "draft-k3-tp1+")
    assert not re.fullmatch(ARM_PATTERN, "draft-k3-tp1+Eager")


def test_the_profile_config_plans_one_profiled_deployment_per_arm_and_variant(cfg):
    assert [a["name"] for a in plan.variant_arms(cfg)] == ["draft-k3-tp1+eager-draft", "baseline+v1-sync"]
    # variants are never screened: the factorial's plan has only its own arms
    assert {d["arm"] for d in plan.make_plan(cfg, "screen")["deployments"]} == {"baseline", "draft-k3-tp1"}
    p = plan.make_plan(cfg, "profile", ARMS)
    assert sorted(d["arm"] for d in p["deployments"]) == sorted(ARMS)
    assert {d["kind"] for d in p["deployments"]} == {"profile"}
    eager = next(a for a in p["arms"] if a["name"] == "draft-k3-tp1+eager-draft")
    assert eager["speculative_config"] == {"enforce_eager": True} and eager["variant"] == "eager-draft"


def test_launch_commands_carry_the_variant_settings_and_nothing_else(cfg):
    plain, eager = _command(cfg, "draft-k3-tp1"), _command(cfg, "draft-k3-tp1+eager-draft")
    assert _spec_config(eager) == {**_spec_config(plain), "enforce_eager": True}
    assert "enforce_eager" not in _spec_config(plain)
    assert strip_speculative(eager) == strip_speculative(plain)  # the speculative config is the only difference
    base, v1 = _command(cfg, "baseline"), _command(cfg, "baseline+v1-sync")
    assert "--speculative-config" not in v1
    study_args = cfg["engine"]["server"]["extra_args"]
    assert v1 == base + ["--no-async-scheduling"]  # after the study's flags, so it wins in vLLM's parser
    assert v1[-len(study_args) - 1:-1] == study_args
    flat = engine_flat(cfg["engine"])
    env = with_variant(flat, plan.arm_by_name(cfg, "baseline+v1-sync"))["env"]
    assert env == {**flat["env"], "VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert with_variant(flat, plan.arm_by_name(cfg, "draft-k3-tp1")) is flat


def test_a_variant_is_its_own_deployment_with_its_own_fingerprint(cfg):
    p = plan.make_plan(cfg, "profile", ARMS)
    specs = {a: deployment_spec(p, f"profile/{a}/rep1", cfg) for a in ("draft-k3-tp1", "draft-k3-tp1+eager-draft")}
    assert specs["draft-k3-tp1+eager-draft"]["arm"]["speculative_config"] == {"enforce_eager": True}
    ctx = {a: fingerprint_context(s) for a, s in specs.items()}
    assert ctx["draft-k3-tp1"]["arm"] != ctx["draft-k3-tp1+eager-draft"]["arm"]


@pytest.mark.parametrize("variant,match", [
    ({"of": "draft-k3-tp1", "name": "x", "speculative_config": {"enforce_eagre": True}},
     r"field 'arms.variants\[0\].speculative_config.enforce_eagre': unknown or arm-defining key; use one of enforce_eager"),
    ({"of": "draft-k3-tp1", "name": "x", "speculative_config": {"num_speculative_tokens": 5}},
     r"field 'arms.variants\[0\].speculative_config.num_speculative_tokens': unknown or arm-defining key"),
    ({"of": "draft-k3-tp1", "name": "x", "speculative_config": {"enforce_eager": "yes"}},
     r"field 'arms.variants\[0\].speculative_config.enforce_eager': must be a bool"),
    ({"of": "draft-k5-tp1", "name": "x", "speculative_config": {"enforce_eager": True}},
     r"field 'arms.variants\[0\].of': 'draft-k5-tp1' is not an arm of this study's factorial"),
    ({"of": "baseline", "name": "x", "speculative_config": {"enforce_eager": True}},
     r"field 'arms.variants\[0\].speculative_config': the baseline has no speculative config"),
    ({"of": "baseline", "name": "x", "extra_args": ["--port=9"]},
     r"field 'arms.variants\[0\].extra_args': must not contain --port"),
    ({"of": "baseline", "name": "x"}, r"field 'arms.variants\[0\]': declares no setting"),
    ({"of": "baseline", "name": "x", "extra_args": ["--no-async-scheduling"], "enfore": 1},
     r"arms.variants.*enfore"),
    ({"of": "baseline", "name": "Bad Name", "extra_args": ["--x"]}, r"arms.variants.*name"),
])
def test_bad_variants_are_refused_naming_the_field(cfg, variant, match):
    bad = copy.deepcopy(cfg)
    bad["arms"]["variants"] = [variant]
    with pytest.raises(ConfigError, match=match):
        check_config(bad, "gpu-h200-scale-profile.yaml")


def test_a_duplicate_variant_is_refused(cfg):
    bad = copy.deepcopy(cfg)
    bad["arms"]["variants"].append(copy.deepcopy(bad["arms"]["variants"][0]))
    with pytest.raises(ConfigError, match=r"arms.variants\[2\].name': draft-k3-tp1\+eager-draft is declared twice"):
        check_config(bad, "x.yaml")


def test_the_launch_command_refuses_variant_settings_it_cannot_trust(cfg):
    arm = dict(plan.arm_by_name(cfg, "draft-k3-tp1"), speculative_config={"enforce_eager": True})
    with pytest.raises(ConfigError, match="field 'speculative_config' is set but the arm has no 'variant'"):
        validate_arm(arm)
    arm = dict(plan.arm_by_name(cfg, "draft-k3-tp1+eager-draft"), speculative_config={"model": "/other"})
    with pytest.raises(ConfigError, match=r"arm draft-k3-tp1\+eager-draft.speculative_config.model': unknown"):
        build_command(engine_flat(cfg["engine"]), arm, port=1, served_model_name="x")


def test_extension_arms_may_name_variants_and_misspelt_ones_get_the_nearest(cfg):
    from specstudy.study.preflight import extension_arm_problems

    assert extension_arm_problems(cfg) == []
    bad = copy.deepcopy(cfg)
    bad["extensions"]["arms"] = ["draft-k3-tp1+eagre-draft"]
    (problem,) = extension_arm_problems(bad)
    assert "nearest: draft-k3-tp1+eager-draft" in problem and "arms.variants" in problem


def _values(node, key: str, kind: type, path=""):
    """Every (json path, value) of ``key`` in a schema whose value is a ``kind`` (a pattern's str, an enum's list)."""
    if isinstance(node, dict):
        for k, value in node.items():
            if k == key and isinstance(value, kind):
                yield path, value
            else:
                yield from _values(value, key, kind, f"{path}/{k}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _values(value, key, kind, f"{path}/{i}")


def _patterns(node):
    return _values(node, "pattern", str)


def _enums(node):
    return _values(node, "enum", list)


def test_every_schema_spells_arm_names_as_core_arms_does():
    """One source of truth: an arm-name pattern in a record or table schema is core.arms.ARM_PATTERN (variants
    included), and an enum of arm methods is the method registry's (baseline and every registered method),
    both generated by `specstudy methods --schemas write`. Lease 2 of 2026-12-06 lost its profile records to a
    deployment schema that still had the pre-variant spelling. The study config's schema lists no methods:
    check_config checks them against the registry (naming the nearest)."""
    from specstudy.core.arms import METHODS
    from specstudy.core.layout import SEGMENT_PATTERN
    from specstudy.core.methods import names

    seen, enums = {}, {}
    for path in sorted((ROOT / "config" / "schemas").glob("*.json")):
        schema = json.loads(path.read_text())
        for where, pattern in _patterns(schema):
            if "draft-k" in pattern:
                seen[f"{path.name}{where}"] = pattern
        for where, values in _enums(schema):
            if len(set(values) & set(names())) >= 2:  # (the mechanics kinds name ngram only)
                enums[f"{path.name}{where}"] = values
    assert len(seen) >= 5, seen  # deployment, table-cells, table-deployments, table-gates, table-requests
    assert {k: v for k, v in seen.items() if v != f"^{ARM_PATTERN}$"} == {}
    assert len(enums) >= 4, enums  # deployment, table-cells, table-deployments, table-requests
    assert {k: v for k, v in enums.items() if tuple(v) != METHODS} == {}
    assert not [k for k in [*seen, *enums] if k.startswith("config.schema.json")]
    dep = json.loads((ROOT / "config" / "schemas" / "deployment.schema.json").read_text())
    assert dep["properties"]["deployment_id"]["pattern"] == f"^{SEGMENT_PATTERN}$"


def test_a_variant_arms_deployment_record_validates():
    """A real deployment record (the scale study on the H200) as a profiled variant would write it: its arm
    name and deployment id carry the '+'; a malformed variant is still refused, naming the field."""
    from specstudy.core import schemas
    from specstudy.deployment.records import new_deployment_id

    rec = json.loads((ROOT / "tests/data/scale-h200/results/confirm/baseline/rep1/deployment.json").read_text())
    schemas.validate(rec, "deployment")
    variant = copy.deepcopy(rec)
    variant.update(phase="profile", deployment_id=new_deployment_id("profile", "baseline+v1-sync", 1))
    variant["arm"]["name"] = "baseline+v1-sync"
    assert "+v1-sync-rep1-" in variant["deployment_id"]
    schemas.validate(variant, "deployment")
    variant["arm"]["name"] = "baseline+V1"
    with pytest.raises(Exception, match=r"arm\.name"):
        schemas.validate(variant, "deployment")
