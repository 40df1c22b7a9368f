"""Tests of the capacity search: pure search logic on synthetic systems, then a fake server end to end."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from specstudy.core import atomic, schemas
from specstudy.measure import capacity
from specstudy.measure.capacity.knee import deployment_summary
from specstudy.measure.capacity.runner import load_requests
from specstudy.measure.capacity.settings import load_json_or_file

sys.path.insert(0, os.path.dirname(__file__))
import capacity_fake_server as fake  # noqa: E402

OK_CLIENT = {"lateness_ms": {"p99": 0.5}, "cpu_share": 0.05, "pool_wait_ms": {"p99": 0.0},
             "event_loop_lag_ms": {"p99": 1.0}, "limited": False, "limited_reasons": []}


def synthetic(knee: float, *, client_limit: float | None = None, calls: list | None = None,
              flaky_at: float | None = None):
    """A system that meets every gate up to ``knee`` rps and saturates above it.

    Above ``client_limit`` the load generator reports itself limited (and, being limited, the
    server looks fine). ``flaky_at``: steps at exactly this rate fail (a knee that does not hold).
    """

    def run(rate: float) -> capacity.StepResult:
        if calls is not None:
            calls.append(rate)
        client = dict(OK_CLIENT)
        if client_limit is not None and rate > client_limit:
            client = dict(OK_CLIENT, limited=True, cpu_share=0.99, limited_reasons=["cpu_share=0.99 > 0.9"])
        over = rate > knee or (flaky_at is not None and abs(rate - flaky_at) < 1e-9)
        if client["limited"]:
            over = False
        excess = max(rate - knee, 0.0) if over else 0.0
        return capacity.StepResult(
            offered_rate=rate, achieved_rate=min(rate, knee), n_requests=100, n_errors=0, error_rate=0.0,
            ttft_p50_ms=50.0, ttft_p95_ms=5000.0 if over else 120.0, tpot_p50_ms=20.0, tpot_p95_ms=25.0,
            backlog_slope=excess if over else 0.01, backlog_slope_t=50.0 if over else 0.2, waiting_samples=60,
            preemptions=0.0, kv_cache_usage_max=0.5, client=client, duration_s=60.0)

    return run


GATES = capacity.resolve_gates({"ttft_p95_ms": 1000, "tpot_p95_ms": 100})
SEARCH = capacity.resolve_search({"start_rate_rps": 1.0, "growth": 2.0, "resolution_frac": 0.05,
                                  "soak": {"count": 3, "duration_s": 10}})


def test_synthetic_knee_found_and_confirmed():
    calls: list[float] = []
    out = capacity.search(synthetic(10.0, calls=calls), GATES, SEARCH, arm="baseline")
    k = out.knee
    assert k["status"] == "confirmed", k
    lo, hi = k["bracket"]["last_pass_rps"], k["bracket"]["first_fail_rps"]
    assert lo <= 10.0 < hi
    assert (hi - lo) / lo <= 0.05
    assert k["knee_rps"] == lo and k["step_above_rps"] == hi
    # bracket 1, 2, 4, 8, 16 (fail), then geometric bisection
    assert calls[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert [s["phase"] for s in out.steps[:5]] == ["bracket"] * 5
    assert all(s["phase"] == "bisect" for s in out.steps[5:])
    # soaks alternate knee / above, 3 of each, on the found rates
    assert [s["phase"] for s in out.soaks] == ["soak_knee", "soak_above"] * 3
    assert {s["offered_rate"] for s in out.soaks if s["phase"] == "soak_knee"} == {lo}
    assert k["confirmation"]["knee_verdicts"] == ["pass"] * 3
    assert k["confirmation"]["above_verdicts"] == ["fail"] * 3
    for row in out.steps + out.soaks:
        schemas.validate(row, "capacity-step")


def test_start_above_knee_brackets_down():
    cfg = dict(SEARCH, start_rate_rps=40.0)
    out = capacity.search(synthetic(3.0), GATES, cfg)
    assert [s["offered_rate"] for s in out.steps[:4]] == [40.0, 20.0, 10.0, 5.0]
    assert out.knee["status"] == "confirmed"
    assert out.knee["knee_rps"] <= 3.0 < out.knee["step_above_rps"]


def test_no_failure_below_max_rate():
    cfg = dict(SEARCH, max_rate_rps=8.0)
    out = capacity.search(synthetic(100.0), GATES, cfg)
    assert out.knee["status"] == "no_knee_below_max"
    assert out.knee["knee_rps"] == 8.0 and out.soaks == []


def test_client_limited_step_is_not_saturation():
    # the load generator gives up above 6 rps; the server's knee (10 rps) is out of reach
    out = capacity.search(synthetic(10.0, client_limit=6.0), GATES, SEARCH)
    limited = [s for s in out.steps if s["client_limited"]]
    assert limited and all(s["verdict"] == "client_limited" for s in limited)
    assert all(s["gates"]["client_flag"] == "fail" for s in limited)
    assert not any(s["verdict"] == "fail" for s in out.steps)
    k = out.knee
    assert k["bracket"]["first_fail_rps"] is None  # never counted as server saturation
    assert k["status"] == "refused"
    assert "client_limited" in [r["code"] for r in k["reasons"]]
    assert k["client_capacity"]["source"] == "measured" and k["client_capacity"]["rps"] <= 6.0
    assert out.soaks == []


def test_judge_client_gate_only_and_both():
    base = synthetic(10.0)(5.0)
    step = capacity.StepResult(**{**base.__dict__, "client": dict(OK_CLIENT, cpu_share=0.95)})
    j = capacity.judge(step, GATES)
    assert j["verdict"] == "client_limited" and j["client_limited"] and j["failed_gates"] == ["client_cpu"]
    both = capacity.StepResult(**{**step.__dict__, "ttft_p95_ms": 9999.0})
    j2 = capacity.judge(both, GATES)
    assert j2["verdict"] == "client_limited" and "ttft_p95" in j2["failed_gates"]
    # a tiny CPU threshold flags an otherwise healthy step
    tiny = capacity.resolve_gates({"client": {"max_cpu_share": 0.0001, "honour_loadgen_flag": False}})
    assert capacity.judge(base, tiny)["verdict"] == "client_limited"
    # disabled client gates never flag
    off = capacity.resolve_gates({"client": {"max_cpu_share": None, "honour_loadgen_flag": False}})
    assert capacity.judge(step, off)["verdict"] == "pass"


def test_judge_backlog_slope_test():
    s = synthetic(10.0)(8.0)
    grow = capacity.StepResult(**{**s.__dict__, "backlog_slope": 2.0, "backlog_slope_t": 8.0})
    assert capacity.judge(grow, GATES)["gates"]["backlog_slope"] == "fail"
    noisy = capacity.StepResult(**{**s.__dict__, "backlog_slope": 2.0, "backlog_slope_t": 1.0})
    assert capacity.judge(noisy, GATES)["gates"]["backlog_slope"] == "pass"
    missing = capacity.StepResult(**{**s.__dict__, "backlog_slope": None})
    j = capacity.judge(missing, GATES)
    assert j["gates"]["backlog_slope"] == "no_data" and j["verdict"] == "fail"
    pre = capacity.StepResult(**{**s.__dict__, "preemptions": 3.0})
    assert capacity.judge(pre, GATES)["failed_gates"] == ["preemptions"]


def test_knee_above_declared_client_capacity_refused():
    gates = capacity.resolve_gates({"ttft_p95_ms": 1000, "client": {"capacity_rps": 5.0}})
    calls: list[float] = []
    out = capacity.search(synthetic(10.0, calls=calls), gates, SEARCH)
    k = out.knee
    assert k["status"] == "refused"
    assert [r["code"] for r in k["reasons"]] == ["knee_above_client_capacity"]
    assert k["client_capacity"] == {"rps": 5.0, "source": "config", "measured_rps": k["client_capacity"]["measured_rps"],
                                    "ceiling_rps": None}
    assert out.soaks == []  # no confirmation of a refused knee


def test_soaks_disagree_unconfirmed_without_moves():
    # bisection finds ~10, but the knee does not hold in the soaks
    cfg = dict(SEARCH, soak={"count": 3, "duration_s": 10, "max_moves": 0})
    out = capacity.search(synthetic(10.0), GATES, cfg, soak_runner=synthetic(9.0))
    k = out.knee
    assert k["status"] == "unconfirmed"
    assert "knee_soak_failed" in [r["code"] for r in k["reasons"]]
    # the step above passing its soaks (a higher true knee) also blocks confirmation
    out2 = capacity.search(synthetic(10.0), GATES, cfg, soak_runner=synthetic(50.0))
    assert out2.knee["status"] == "unconfirmed"
    assert [r["code"] for r in out2.knee["reasons"]] == ["above_soak_passed"]


def test_knee_that_does_not_hold_moves_down_one_step_and_is_confirmed():
    # the search sees a knee of 10, the longer soaks only sustain 9.8: the knee moves down one step
    out = capacity.search(synthetic(10.0), GATES, SEARCH, soak_runner=synthetic(9.8))
    k, c = out.knee, out.knee["confirmation"]
    first_knee = k["bracket"]["last_pass_rps"]
    assert first_knee > 9.8 and k["status"] == "confirmed", k
    assert [m["direction"] for m in c["moves"]] == ["down"]
    assert k["knee_rps"] < 9.8 <= k["step_above_rps"] == first_knee
    assert (first_knee - k["knee_rps"]) / k["knee_rps"] <= SEARCH["resolution_frac"] + 1e-9
    # the failed knee's soaks are reused as the evidence above: 3 soaks at each of 3 rates, not 4
    assert len(out.soaks) == 9 and c["above_verdicts"] == ["fail"] * 3 and c["knee_verdicts"] == ["pass"] * 3
    assert sorted(x["rate_rps"] for x in c["soaked"]) == sorted({s["offered_rate"] for s in out.soaks})
    for row in out.soaks:
        schemas.validate(row, "capacity-step")


def test_sustained_step_above_moves_the_knee_up():
    cfg = dict(SEARCH, resolution_frac=0.2)
    out = capacity.search(synthetic(10.0), GATES, cfg, soak_runner=synthetic(12.0))  # the search stops at 9.5 | 11.3
    k, c = out.knee, out.knee["confirmation"]
    assert k["status"] == "confirmed" and [m["direction"] for m in c["moves"]] == ["up"], k
    assert k["knee_rps"] <= 12.0 < k["step_above_rps"] and k["knee_rps"] > k["bracket"]["last_pass_rps"]


def test_knee_moves_up_past_the_highest_step_the_client_has_driven_so_far():
    # bracket 1..8 pass, 16 fails, 11.3 fails: knee 8, step above 11.3. The soaks sustain 11.3, then 16
    # (the next failed step, the highest rate driven so far); the second move puts the step above at
    # 24, beyond the client capacity proven by the search, and its soaks are the first to drive it
    cfg = dict(SEARCH, resolution_frac=0.5)
    out = capacity.search(synthetic(10.0), GATES, cfg, soak_runner=synthetic(20.0))
    k = out.knee
    assert k["client_capacity"]["rps"] == 16.0
    assert k["status"] == "confirmed" and k["knee_rps"] == 16.0 and k["step_above_rps"] == 24.0, k
    assert [m["direction"] for m in k["confirmation"]["moves"]] == ["up", "up"]


def test_a_knee_that_keeps_failing_runs_out_of_moves():
    out = capacity.search(synthetic(10.0), GATES, dict(SEARCH, soak={"count": 2, "duration_s": 1, "max_moves": 1}),
                          soak_runner=synthetic(5.0))
    k = out.knee
    assert k["status"] == "unconfirmed" and len(k["confirmation"]["moves"]) == 1
    assert {"knee_soak_failed", "soak_moves_exhausted"} <= {r["code"] for r in k["reasons"]}


def test_step_budget_reported():
    cfg = dict(SEARCH, max_steps=6, resolution_frac=0.001)
    out = capacity.search(synthetic(10.0), GATES, cfg)
    assert len(out.steps) == 6
    assert "step_budget_exhausted" in [r["code"] for r in out.knee["reasons"]]


def test_run_capacity_outputs_and_gates_first(tmp_path):
    out_dir = tmp_path / "capacity" / "draft-k3-tp1"
    seen = []
    inner = synthetic(10.0)

    def runner(rate):
        if not seen:  # the first step: gates.json must already be there, nothing else
            seen.append(sorted(p.name for p in out_dir.iterdir()))
        return inner(rate)

    dep = {"deployment_id": "d1", "arm": {"name": "draft-k3-tp1"}, "cache_config": {"num_gpu_blocks": 1000, "block_size": 16},
           "confounds": {"gpu_memory_utilization": 0.9, "kv_cache_memory_gib": 12.5, "vllm_version": "x"}}
    knee = capacity.run_capacity("http://unused", "m", None, {"ttft_p95_ms": 1000}, json.dumps({"resolution_frac": 0.05,
                                 "soak": {"count": 1}}), out_dir, None, deployment_record=dep, step_runner=runner)
    assert seen == [["gates.json"]]
    g = atomic.read_json(out_dir / "gates.json")
    assert g["gates"]["ttft_p95_ms"] == 1000 and g["gates"]["tpot_p95_ms"] == 200.0
    assert g["arm"] == "draft-k3-tp1"
    steps = atomic.read_jsonl(out_dir / "steps.jsonl")
    assert [s["index"] for s in steps] == list(range(len(steps)))
    assert len(atomic.read_jsonl(out_dir / "soaks.jsonl")) == 2
    on_disk = atomic.read_json(out_dir / "knee.json")
    assert on_disk == knee and knee["status"] == "confirmed"
    assert knee["deployment"]["kv_capacity_tokens"] == 16000
    assert "vllm_version" not in knee["deployment"]["confounds"]
    assert (out_dir / "capacity.png").stat().st_size > 1000

    # the deploy module's launch-log confounds win over cache_config
    rec = dict(dep, confounds={"kv_cache": {"tokens": 12345, "available_memory_gib": 2.5}})
    summ = deployment_summary(rec)
    assert summ["kv_capacity_tokens"] == 12345 and summ["kv_cache_memory_gib"] == 2.5

    base = dict(knee, knee_rps=8.0, deployment={"kv_capacity_tokens": 20000})
    sentence = capacity.compare_knees(base, out_dir / "knee.json")
    assert sentence.startswith("the draft costs 20.0% of the KV pool")
    assert "moves the knee by +" in sentence and "(8 ->" in sentence
    ngram = dict(knee, knee_rps=9.0, deployment={"kv_capacity_tokens": 20000, "arm": {"method": "ngram"}})
    assert capacity.compare_knees(base, ngram).startswith("n-gram speculation (no draft model) costs 0.0% of the KV pool")


def test_bad_gates_name_the_field(tmp_path, capsys):
    from specstudy import cli

    rc = cli.main(["capacity", "search", "--base-url", "http://127.0.0.1:9", "--model", "m", "--prompts", "x.jsonl",
                   "--gates", '{"ttft_p95": 5}', "--out", str(tmp_path / "c")])
    assert rc == 2
    msg = capsys.readouterr().out
    assert "ttft_p95" in msg and "ttft_p95_ms" in msg  # names the bad field and the known ones


# ---------------------------------------------------------------------------------------- end to end

# 16 slots x (4 tokens x 50 ms) = 0.2 s per request -> sustainable rate 80 rps.
SLOTS, TOKENS, DELAY_MS = 16, 4, 50.0
CAPACITY = SLOTS / (TOKENS * DELAY_MS / 1000.0)
# The test machine is shared by many processes: the client gates here only catch a load generator that
# is grossly starved (they are tested on their own below and in the synthetic tests).
LENIENT_CLIENT = {"max_lateness_p99_ms": 500.0, "max_cpu_share": 0.95, "max_pool_wait_p99_ms": 500.0,
                  "max_event_loop_lag_p99_ms": 500.0}
NO_CLIENT_GATES = {"max_lateness_p99_ms": None, "max_cpu_share": None, "max_pool_wait_p99_ms": None,
                   "max_event_loop_lag_p99_ms": None, "honour_loadgen_flag": False}
PROMPTS = [{"prompt_id": f"p{i}", "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": TOKENS}
           for i in range(8)]


@pytest.fixture(scope="module")
def server():
    base, metrics, proc = fake.start(max_concurrency=SLOTS, token_delay_ms=DELAY_MS)
    try:
        yield base, metrics
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    atomic.write_jsonl(path, PROMPTS)
    return path


def test_fake_server_knee_within_one_step(server, tmp_path, prompts_file):
    base, metrics = server
    res = 0.25
    # 1.5-s windows: a queue near rho = 0.9 wanders by a few requests, so the slope gate is set at 10 % of arrivals
    gates = {"ttft_p95_ms": 600.0, "tpot_p95_ms": 80.0, "client": LENIENT_CLIENT,
             "backlog": {"max_waiting_slope_frac": 0.1}}
    search_cfg = {"start_rate_rps": 30.0, "growth": 2.0, "resolution_frac": res, "warmup_s": 0.3, "step_duration_s": 1.5,
                  "sample_interval_s": 0.05, "request_timeout_s": 30, "soak": {"count": 1, "duration_s": 1.0}}
    t0 = time.monotonic()
    knee = capacity.run_capacity(base, "fake", prompts_file, gates, search_cfg, tmp_path / "baseline", metrics)
    elapsed = time.monotonic() - t0
    steps = atomic.read_jsonl(tmp_path / "baseline" / "steps.jsonl")
    table = [(round(s["offered_rate"], 1), s["verdict"], s["failed_gates"], s["backlog_slope"]) for s in steps]
    assert knee["knee_rps"] is not None, table
    # the bracket must straddle the true capacity to within one resolution step either side
    assert CAPACITY / (1 + res) <= knee["knee_rps"] <= CAPACITY * (1 + res), (knee, table)
    assert knee["step_above_rps"] / knee["knee_rps"] <= 1 + res + 1e-9
    assert knee["status"] in ("confirmed", "unconfirmed")  # 1.5-s soaks on a shared machine may disagree
    assert all(not s["client_limited"] for s in steps), table
    # the measurement is real: saturated steps complete at most ~capacity per second
    over = [s for s in steps if s["offered_rate"] > 1.3 * CAPACITY]
    assert over and all(s["achieved_rate"] < 1.15 * CAPACITY for s in over), table
    raw = tmp_path / "baseline" / "raw" / "step-000"
    assert (raw / "requests.jsonl").exists() and (raw / "metrics_before.prom").exists()
    assert (tmp_path / "baseline" / "capacity.png").exists()
    assert elapsed < 40


def test_fake_server_backlog_gate(server):
    base, metrics = server
    # lenient latency gates: only the growing waiting queue can fail this overloaded step
    gates = capacity.resolve_gates({"ttft_p95_ms": 1e6, "tpot_p95_ms": 1e6, "client": NO_CLIENT_GATES,
                                    "backlog": {"max_kv_cache_usage": None}})
    cfg = capacity.resolve_search({"warmup_s": 0.2, "step_duration_s": 2.0, "sample_interval_s": 0.05})
    runner = capacity.make_step_runner(base, "fake", load_requests(PROMPTS), metrics, cfg, gates)
    step = runner(1.5 * CAPACITY)
    j = capacity.judge(step, gates)
    assert j["gates"]["backlog_slope"] == "fail", (step, j)
    assert j["failed_gates"] == ["backlog_slope"], j
    assert j["verdict"] == "fail" and not j["client_limited"]
    assert step.backlog_slope > 0.2 * CAPACITY  # ~ offered - capacity = 40 waiting/s
    assert step.waiting_max > 10 and step.preemptions == 0.0


def test_fake_server_client_limited(server, tmp_path, prompts_file):
    base, metrics = server
    gates = {"client": {"max_cpu_share": 0.0001}}  # nothing can stay under this: the client is the bottleneck
    cfg = {"start_rate_rps": 10.0, "warmup_s": 0.2, "step_duration_s": 1.0, "sample_interval_s": 0.1,
           "soak": {"count": 1, "duration_s": 1.0}}
    knee = capacity.run_capacity(base, "fake", prompts_file, gates, cfg, tmp_path / "ngram-k3", metrics)
    steps = atomic.read_jsonl(tmp_path / "ngram-k3" / "steps.jsonl")
    assert len(steps) == 1 and steps[0]["client_limited"] and steps[0]["verdict"] == "client_limited"
    assert steps[0]["gates"]["client_cpu"] == "fail"
    assert knee["status"] == "refused" and knee["bracket"]["first_fail_rps"] is None
    assert knee["knee_rps"] is None


def test_restart_during_soaks_unconfirms():
    inner = synthetic(10.0)

    def soak(rate):
        r = inner(rate)
        r.notes.append("server_restarted_between_steps")
        return r

    out = capacity.search(synthetic(10.0), GATES, dict(SEARCH, soak={"count": 1, "duration_s": 1}), soak_runner=soak)
    assert out.knee["status"] == "unconfirmed"
    assert "server_restarted" in [r["code"] for r in out.knee["reasons"]]


def test_gates_from_study_config_file(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("capacity:\n  gates:\n    ttft_p95_ms: 123\n  search:\n    soak: {count: 1}\n", encoding="utf-8")
    assert capacity.resolve_gates(load_json_or_file(str(cfg), "gates"))["ttft_p95_ms"] == 123
    assert capacity.resolve_search(load_json_or_file(str(cfg), "search"))["soak"] == {"count": 1, "duration_s": 300.0,
                                                                                            "max_moves": 2}
    with pytest.raises(ValueError, match="start_rate_rps"):
        capacity.resolve_search({"start_rate_rps": 1000, "max_rate_rps": 10})
