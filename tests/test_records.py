"""Tests for specstudy.core.records: the one reader of record fields (KV capacity, typed records)."""

from __future__ import annotations

import pytest

from specstudy.analysis import select, tables
from specstudy.core import records
from specstudy.core.records import kv_cache_tokens
from specstudy.measure import capacity
from specstudy.measure.capacity.knee import kv_capacity_tokens

LOG = {"kv_cache": {"tokens": 12345, "available_memory_gib": 2.5}}


def test_kv_from_metrics_then_blocks():
    assert kv_cache_tokens({"cache_config": {"kv_cache_tokens": 1600, "num_gpu_blocks": 1, "block_size": 16}}) == 1600
    assert kv_cache_tokens({"cache_config": {"kv_cache_tokens": None, "num_gpu_blocks": 100, "block_size": 16}}) == 1600
    assert kv_cache_tokens({"cache_config": {"num_gpu_blocks": 100, "block_size": None}}) is None
    assert kv_cache_tokens({"cache_config": None, "confounds": LOG}) is None  # metrics only by default
    assert kv_cache_tokens(None) is None and kv_cache_tokens({}) is None


def test_kv_source_order_is_the_callers():
    rec = {"cache_config": {"kv_cache_tokens": 16000}, "confounds": LOG}
    assert kv_cache_tokens(rec, sources=("log", "metrics")) == 12345
    assert kv_cache_tokens(rec, sources=("metrics", "log")) == 16000
    assert kv_cache_tokens({"confounds": LOG}, sources=("metrics", "log")) == 12345
    with pytest.raises(ValueError, match="KV source"):
        kv_cache_tokens(rec, sources=("nvml",))


def test_every_reader_uses_it():
    rec = {"status": "ok", "arm": {"name": "baseline"}, "cache_config": {"kv_cache_tokens": 16000}, "confounds": LOG}
    assert tables.confound_fields(rec["confounds"], rec["cache_config"])["kv_cache_tokens"] == 16000
    typed = records.to_record(dict(rec, deployment_id="d", phase="screen", rep=0, failure=None, command=None, times={}),
                              records.DeploymentRecord)
    assert tables.startup_fields(typed)["kv_log_tokens"] == 12345
    assert tables.deployment_row(typed)["kv_cache_tokens"] == 16000
    assert kv_capacity_tokens(rec) == 12345  # the knee prefers the launch log
    assert kv_capacity_tokens({"kv_capacity_tokens": 7.0}) == 7.0  # a knee's own summary field
    assert select.kv_cache_tokens is records.kv_cache_tokens


def test_number():
    assert records.number("12") == 12.0 and records.number(3) == 3.0
    assert records.number(True) is None and records.number(float("nan")) is None and records.number("x") is None
    assert records.number([1]) is None


# ------------------------------------------------------------------------------------------------ typed records
KEYS = {"phase": "screen", "arm": "draft-k3-tp1", "method": "draft_model", "num_speculative_tokens": 3,
        "draft_tensor_parallel_size": 1, "rep": 2, "workload": "code", "concurrency": 4, "deployment_id": "d-1",
        "kind": "drift", "rep_label": "drift2"}


def test_a_written_failed_cell_summary_reads_typed(tmp_path):
    from specstudy.core import atomic
    from specstudy.measure import cell

    s = cell.failed_summary(KEYS, {"name": "mini", "version": 1, "digest": "x"}, "cell_error", "boom")
    cell.validate_summary(s)
    atomic.write_json(tmp_path / "summary.json", s)
    rec = records.read_cell_summary(tmp_path / "summary.json")
    assert (rec.keys.kind, rec.keys.rep_label, rec.keys.rep) == ("drift", "drift2", 2)  # flow through unchanged
    assert rec.validity.valid is False and [r.code for r in rec.validity.reasons] == ["cell_error"]
    assert rec.requests.attempted == 0 and rec.latency("ttft", "p50") is None
    assert rec.corpus.version == 1 and rec.speculative.per_position_rates() is None
    row = tables.cell_row(rec)
    assert row["kind"] == "drift" and row["rep_label"] == "drift2" and row["invalid_reasons"] == "cell_error"


def test_per_position_rates_in_position_order():
    sp = records.Speculative(enabled=True, per_position={"10": 0.1, "2": 0.5, "0": 0.9, "1": None})
    assert sp.per_position_rates() == [0.9, None, 0.5, 0.1]


def test_a_written_failure_record_reads_typed(tmp_path):
    from specstudy.deployment import records as deploy

    arm = {"name": "ngram-k3", "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
           "prompt_lookup_max": 4}
    path = deploy.write_failure_record(tmp_path / "results", phase="screen", arm=arm, rep=1, deployment_id="dep-1",
                                       stage="readiness", reason="exited", log_path=None, exit_code=1)
    rec = records.read_deployment(path)
    assert rec.arm_name == "ngram-k3" and rec.status == "failed" and rec.cells == [] and rec.cache_config is None
    assert rec.failure.stage == "readiness" and rec.rep == 1 and rec.rep_label == "rep1"
    row = tables.deployment_row(rec, "failure_record", {"kind": "repeat", "rep_label": "rep1"})
    assert row["failure_stage"] == "readiness" and row["num_speculative_tokens"] == 3 and row["n_cells"] == 0


def test_deployment_record_fields():
    rec = records.to_record({"deployment_id": "d", "phase": "screen", "arm": {"name": "baseline", "method": "baseline"},
                             "rep": 0, "status": "ok", "failure": None, "command": None,
                             "times": {"start": "2026-01-01T00:00:00+00:00", "ready": None, "stop": None},
                             "provenance": {"hardware": {"hostname": "nid001"}, "tensor_parallel_size": {"target": 4}},
                             "confounds": LOG, "cache_config": {"kv_cache_tokens": 16000, "num_gpu_blocks": 1000,
                                                                 "block_size": 16}},
                            records.DeploymentRecord)
    assert rec.hostname == "nid001" and rec.target_tensor_parallel_size == 4
    assert kv_cache_tokens(rec) == 16000 and kv_cache_tokens(rec, sources=("log",)) == 12345
    rec.tensor_parallel_size = records.TensorParallel(target=2)
    assert rec.target_tensor_parallel_size == 2


def test_a_record_of_another_shape_names_file_and_field(tmp_path):
    p = tmp_path / "summary.json"
    p.write_text('{"keys": {"phase": "screen"}}')
    with pytest.raises(records.RecordError, match=r"summary\.json: .*required field"):
        records.read_cell_summary(p)
    p.write_text('{"keys": ')
    with pytest.raises(records.RecordError, match="not valid JSON"):
        records.read_cell_summary(p)
    with pytest.raises(records.RecordError, match=r"\$\.rep"):
        records.to_record({"deployment_id": "d", "phase": "screen", "arm": {}, "rep": "one", "status": "ok",
                           "failure": None, "command": None, "times": {}}, records.DeploymentRecord, "x")


def test_gate_record_rows(tmp_path):
    gate = {"schema": "specstudy.gate/1", "arm": "ngram-k3", "phase": "screen", "verdict": "no_verdict",
            "reasons": [{"code": "no_control", "detail": "no control deployments"}], "blocks_recommendation": False,
            "claim": "no verdict: consistent with losslessness; not a proof", "margins": {"min_common_prefix_fraction": 0.0},
            "baseline": {}, "candidate": {}, "treatment": None, "control": None, "within_deployment_controls": [],
            "allowances": None, "checks": [], "tokenizer": None}
    p = tmp_path / "ngram-k3.json"
    p.write_text(__import__("json").dumps(gate))
    rec = records.read_gate(p)
    assert rec.verdict == "no_verdict" and rec.control is None and rec.reasons[0].code == "no_control"
    row = tables.gate_row(rec, "screen", "ngram-k3")
    assert row["reason_codes"] == "no_control" and row["control_pairs"] is None and not row["blocks_recommendation"]
    assert row["margins.min_common_prefix_fraction"] == 0.0
    assert tables.gate_row(gate, "screen", "ngram-k3") == row  # a dict is read as the record


def test_selection_record(tmp_path):
    from specstudy.report.sections.inputs import selection_check

    assert records.read_selection(tmp_path / "selection.json") is None
    sel = {"schema": "specstudy.selection/1", "rule": {}, "metric": "tpot_p50", "scores": {}, "per_workload": {},
           "candidates": [{"arm": "draft-k3-tp4", "why": ["best on code"]}], "excluded_cells": [],
           "confirmation_arms": ["baseline", "draft-k3-tp4"], "prereg_sha256": "0" * 64, "phase_of_inputs": "screen",
           "inputs": [{"path": "results/screen/baseline/rep1/code/c1/summary.json", "sha256": "1" * 64}]}
    (tmp_path / "selection.json").write_text(__import__("json").dumps(sel))
    check = selection_check(records.read_selection(tmp_path / "selection.json"))
    assert check["present"] and check["used_confirmation"] is False and check["candidates"] == ["draft-k3-tp4"]
    sel["inputs"].append({"path": "results/confirm/baseline/rep1/code/c1/summary.json", "sha256": "2" * 64})
    assert selection_check(records.to_record(sel, records.SelectionRecord))["used_confirmation"] is True


# ---------------------------------------------------------------------------------------------------------
# capacity step / knee and the plan: read back exactly as their writers wrote them
# ---------------------------------------------------------------------------------------------------------
def _same_json(typed, raw: bytes) -> None:
    """``typed`` re-encodes, by the writer's canonical encoding (atomic: sorted keys), to the very bytes it was
    decoded from: a ``.json`` record or one ``.jsonl`` line."""
    import json

    import msgspec

    from specstudy.core import atomic

    data = msgspec.to_builtins(typed)
    again = atomic.dumps_json(data) if raw.startswith(b"{\n") else json.dumps(data, sort_keys=True, allow_nan=False)
    assert again.encode() == raw


def _capacity_search(tmp_path):
    """A real capacity search (capacity.run_capacity) against a synthetic server that saturates above 10 rps."""
    import json

    client = {"lateness_ms": {"p99": 0.5}, "cpu_share": 0.05, "pool_wait_ms": {"p99": 0.0},
              "event_loop_lag_ms": {"p99": 1.0}, "limited": False, "limited_reasons": []}

    def runner(rate):
        over = rate > 10.0
        return capacity.StepResult(
            offered_rate=rate, achieved_rate=min(rate, 10.0), n_requests=100, n_errors=0, error_rate=0.0,
            ttft_p50_ms=50.0, ttft_p95_ms=5000.0 if over else 120.0, tpot_p50_ms=20.0, tpot_p95_ms=25.0,
            backlog_slope=rate - 10.0 if over else 0.01, backlog_slope_t=50.0 if over else 0.2, waiting_samples=60,
            preemptions=0, kv_cache_usage_max=0.5, client=client, duration_s=60.0)

    out = tmp_path / "capacity" / "draft-k3-tp1"
    dep = {"deployment_id": "d1", "arm": {"name": "draft-k3-tp1", "method": "draft_model"},
           "cache_config": {"num_gpu_blocks": 1000, "block_size": 16}, "confounds": {"kv_cache": {"tokens": 15000}}}
    knee = capacity.run_capacity("http://unused", "m", None, {"ttft_p95_ms": 1000},
                                 json.dumps({"resolution_frac": 0.05, "soak": {"count": 2}}),
                                 out, None, deployment_record=dep, step_runner=runner)
    return out, knee


def test_capacity_records_read_back_as_written(tmp_path):
    out, knee = _capacity_search(tmp_path)
    for name in ("steps.jsonl", "soaks.jsonl"):
        lines = (out / name).read_bytes().splitlines()
        rows = records.read_capacity_steps(out / name)
        assert lines and len(rows) == len(lines)
        for row, line in zip(rows, lines, strict=True):
            _same_json(row, line)
    steps, soaks = records.read_capacity_steps(out / "steps.jsonl"), records.read_capacity_steps(out / "soaks.jsonl")
    assert steps[0].preemptions == 0 and isinstance(steps[0].preemptions, int)  # a number stays as written
    assert steps[0].soak_round is records.UNSET and soaks[0].soak_round == 0 and soaks[0].phase == "soak_knee"
    assert all(s.gates["ttft_p95"] in ("pass", "fail") for s in steps)
    k = records.read_knee(out / "knee.json")
    _same_json(k, (out / "knee.json").read_bytes())
    assert k.status == knee["status"] == "confirmed" and k.knee_rps == knee["knee_rps"]
    assert k.confirmation.knee_verdicts == ["pass", "pass"] and k.confirmation.moves == []
    assert kv_capacity_tokens(k.deployment) == 15000
    assert records.to_record(knee, records.CapacityKnee) == k  # run_capacity's return is the same record
    assert capacity.compare_knees(k, out / "knee.json").startswith("the draft costs 0.0% of the KV pool")


def test_a_plan_reads_back_as_written(tmp_path, monkeypatch):

    from specstudy.core import atomic, schemas
    from specstudy.study import plan
    from specstudy.study.config import load_config

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    p = plan.make_plan(load_config("config/config.yaml"), "confirm", arms=["baseline"])
    p["corpora"] = {"results/corpora/code/v1": {"name": "code", "version": 1, "digest": "0" * 64}}
    p["selection"] = {"path": "results/selection/selection.json", "sha256": "1" * 64}
    schemas.validate(p, "plan", "plan.json")  # what plan_cli._cmd_plan writes
    path = atomic.write_json(tmp_path / "confirm.json", p)
    typed = records.read_plan(path)
    _same_json(typed, path.read_bytes())
    assert typed.selection.sha256 == "1" * 64 and typed.corpora["results/corpora/code/v1"].digest == "0" * 64
    dep = typed.deployment("baseline", "rep1")
    assert (dep.kind, dep.round, dep.after) == ("repeat", 1, p["deployments"][dep.order]["after"])
    assert [(c.workload, c.concurrency) for c in dep.cells] == [(c["workload"], c["concurrency"])
                                                               for c in p["deployments"][dep.order]["cells"]]
    drift = [d for d in typed.deployments if d.kind == "drift"]
    assert all(d.round is None for d in drift)
    with pytest.raises(KeyError, match="no deployment baseline/rep99"):
        typed.deployment("baseline", "rep99")
    # a screening plan has neither corpora nor selection: they stay absent
    screen = plan.make_plan(load_config("config/config.yaml"), "screen")
    path = atomic.write_json(tmp_path / "screen.json", screen)
    typed = records.read_plan(path)
    assert typed.selection is records.UNSET and not typed.corpora
    _same_json(typed, path.read_bytes())


def test_bad_capacity_and_plan_records_name_file_and_field(tmp_path):
    import json

    out, knee = _capacity_search(tmp_path)
    row = json.loads((out / "steps.jsonl").read_bytes().splitlines()[1])
    bad = tmp_path / "steps.jsonl"
    bad.write_text(json.dumps(row) + "\n" + json.dumps({k: v for k, v in row.items() if k != "verdict"}) + "\n")
    with pytest.raises(records.RecordError, match=r"steps\.jsonl:2: .*required field `verdict`"):
        records.read_capacity_steps(bad)
    bad.write_text(json.dumps(dict(row, offered_rate="fast")) + "\n")
    with pytest.raises(records.RecordError, match=r"steps\.jsonl:1: .*\$\.offered_rate"):
        records.read_capacity_steps(bad)
    bad.write_text(json.dumps(row) + "\n{\n")
    with pytest.raises(records.RecordError, match=r"steps\.jsonl:2: not valid JSON"):
        records.read_capacity_steps(bad)
    with pytest.raises(records.RecordError, match=r"missing\.jsonl: cannot read"):
        records.read_capacity_steps(tmp_path / "missing.jsonl")

    k = tmp_path / "knee.json"
    k.write_text(json.dumps(dict(knee, confirmation=dict(knee["confirmation"], knee_verdicts="pass"))))
    with pytest.raises(records.RecordError, match=r"knee\.json: .*\$\.confirmation\.knee_verdicts"):
        records.read_knee(k)
    k.write_text(json.dumps({key: v for key, v in knee.items() if key != "client_capacity"}))
    with pytest.raises(records.RecordError, match=r"knee\.json: .*required field `client_capacity`"):
        records.read_knee(k)
    with pytest.raises(records.RecordError, match=r"<knee>: .*\$\.knee_rps"):
        capacity.compare_knees(dict(knee, knee_rps="high"), knee)

    from specstudy.study import plan
    from specstudy.study.config import load_config

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    p = plan.make_plan(load_config(root / "config" / "config.yaml"), "screen")
    pp = tmp_path / "screen.json"
    p["deployments"][0]["block"] = "first"
    pp.write_text(json.dumps(p))
    with pytest.raises(records.RecordError, match=r"screen\.json: .*\$\.deployments\[0\]\.block"):
        records.read_plan(pp)
    del p["deployments"][0]["block"], p["deployments"][1]["cells"]
    pp.write_text(json.dumps(p))
    with pytest.raises(records.RecordError, match=r"screen\.json: .*required field `block`.*\$\.deployments\[0\]"):
        records.read_plan(pp)
