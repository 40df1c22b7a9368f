"""Tests of the load generator against benchmarks/fake_server.py (started once, in a subprocess)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from specstudy.measure import loadgen
from specstudy.measure.loadgen import RequestSpec, poisson_schedule, run_closed_loop, run_open_loop

REPO = Path(__file__).resolve().parents[1]
MSGS = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "benchmarks" / "fake_server.py"), "--port", "0", "--events", "8", "--no-uvloop"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY "), f"fake server did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _reset(base: str) -> None:
    urllib.request.urlopen(urllib.request.Request(base + "/fake/reset", method="POST", data=b""), timeout=5).read()


def specs(n: int, **fake) -> list[RequestSpec]:
    extra = {"fake": fake} if fake else {}
    return [RequestSpec(f"p{i}", "unit", MSGS, 16, extra_body=dict(extra)) for i in range(n)]


def one(base: str, **fake) -> dict:
    res = run_closed_loop(base, "fake-model", specs(1, **fake), 1, keep_text=True)
    assert len(res.rows) == 1
    return res.rows[0]


def test_basic_row_shape(server):
    row = one(server, events=5)
    assert row["success"] is True and row["error"] is None
    assert row["status_code"] == 200 and row["finish_reason"] == "length"
    assert row["completion_tokens"] == 5 and row["prompt_tokens"] == 7 and row["usage_present"] is True
    assert row["n_content_events"] == 5 and len(row["stream_event_gaps_ms"]) == 4
    assert row["tokens_per_event"] == [1, 1, 1, 1, 1]
    assert row["output_text"] == "".join(f" w{i}.0" for i in range(5))
    assert row["output_sha256"] == hashlib.sha256(row["output_text"].encode()).hexdigest()
    assert row["output_chars"] == len(row["output_text"])
    assert row["scheduled_s"] is None and row["start_s"] <= row["end_s"]
    assert abs(row["start_unix"] - time.time()) < 60


def test_ttft_ignores_role_only_chunk(server):
    # the role-only chunk is sent at once, each content event 60 ms later
    row = one(server, events=2, delay_s=0.06, role_chunk=True)
    assert row["success"]
    assert row["ttft_ms"] >= 55, row
    assert row["e2e_ms"] >= 110


def test_e2e_excludes_trailing_usage_chunk(server):
    row = one(server, events=3, usage_delay_s=0.15)
    assert row["success"] and row["completion_tokens"] == 3
    total_ms = (row["end_s"] - row["start_s"]) * 1e3
    assert total_ms >= 145
    assert row["e2e_ms"] < total_ms - 100, row


def test_missing_usage(server):
    row = one(server, events=4, fault="missing_usage")
    assert row["completion_tokens"] is None and row["prompt_tokens"] is None
    assert row["usage_present"] is False
    assert row["tpot_ms"] is None and row["tokens_per_event"] is None
    assert row["n_content_events"] == 4
    assert row["success"] is True  # success does not depend on usage; the cell flags missing_usage


def test_multi_token_events(server):
    row = one(server, events=5, tokens_per_event=[1, 3, 2])
    assert row["tokens_per_event"] == [1, 3, 2, 1, 3]
    assert row["completion_tokens"] == 10
    assert row["tpot_ms"] == pytest.approx((row["e2e_ms"] - row["ttft_ms"]) / 9, abs=1e-3)


def test_single_token_has_no_tpot(server):
    row = one(server, events=1)
    assert row["completion_tokens"] == 1 and row["tpot_ms"] is None and row["success"]


def test_lines_split_across_tcp_chunks(server):
    row = one(server, events=3, tokens_per_event=2, fault="split")
    assert row["success"], row["error"]
    assert row["tokens_per_event"] == [2, 2, 2] and row["completion_tokens"] == 6


def test_reasoning_content_counts_as_content(server):
    row = one(server, events=3, fault="reasoning")
    assert row["n_content_events"] == 3 and row["output_chars"] > 0 and row["success"]


@pytest.mark.parametrize(
    "fault, needle",
    [
        ("malformed", "malformed JSON"),
        ("bad_shape", "unexpected SSE event shape"),
        ("error_event", "error event"),
        ("truncate", "ClientPayloadError"),
        ("no_done", "ended before data: [DONE]"),
    ],
)
def test_broken_streams_become_failed_rows(server, fault, needle):
    reqs = specs(3) + specs(1, events=6, fault=fault) + specs(3)
    res = run_closed_loop(server, "fake-model", reqs, 2)
    bad = res.rows[3]
    assert bad["success"] is False and bad["error"] and needle in bad["error"]
    assert all(r["success"] for i, r in enumerate(res.rows) if i != 3)
    assert [r["request_index"] for r in res.rows] == list(range(7))


def _comparable(row: dict) -> dict:
    timing = {"start_s", "end_s", "start_unix", "ttft_ms", "e2e_ms", "tpot_ms", "stream_event_gaps_ms"}
    out = {k: v for k, v in row.items() if k not in timing}
    out["error"] = row["error"] and row["error"].split(" (")[0]  # decoder-specific detail in parentheses
    return out


def test_stdlib_json_fallback_gives_the_same_rows(server, monkeypatch):
    reqs = (
        specs(1, events=5, tokens_per_event=[1, 3])
        + specs(1, fault="missing_usage")
        + specs(1, fault="malformed")
        + specs(1, fault="bad_shape")
        + specs(1, fault="error_event")
        + specs(1, fault="reasoning")
    )
    fast = run_closed_loop(server, "fake-model", reqs, 1, keep_text=True)
    monkeypatch.setattr(loadgen, "_decode_event", loadgen._json_decode_event)
    monkeypatch.setattr(loadgen, "_ShapeErrors", (loadgen.EventShapeError,))
    slow = run_closed_loop(server, "fake-model", reqs, 1, keep_text=True)
    assert [_comparable(r) for r in fast.rows] == [_comparable(r) for r in slow.rows]
    assert [r["success"] for r in slow.rows] == [True, True, False, False, False, True]


def test_http_500_is_a_failed_row(server):
    row = one(server, fault="http500")
    assert row["status_code"] == 500 and row["success"] is False
    assert row["error"].startswith("HTTP 500") and "injected failure" in row["error"]
    assert row["ttft_ms"] is None and row["n_content_events"] == 0


def test_finish_reason_must_be_stop_or_length(server):
    row = one(server, events=2, finish_reason="abort")
    assert row["success"] is False and "abort" in row["error"]
    assert one(server, events=2, finish_reason="stop")["success"] is True


def test_connection_refused_and_timeout(server):
    res = run_closed_loop("http://127.0.0.1:9", "m", specs(2), 2)
    assert all(not r["success"] and r["status_code"] is None and r["error"] for r in res.rows)
    res = run_closed_loop(server, "m", specs(1, events=10, delay_s=0.1), 1, request_timeout_s=0.3)
    assert "timed out" in res.rows[0]["error"] and not res.rows[0]["success"]


def test_closed_loop_never_exceeds_concurrency(server):
    _reset(server)
    res = run_closed_loop(server, "fake-model", specs(40, events=3, delay_s=0.004), 4)
    stats = _get(server + "/fake/stats")
    assert stats["requests"] == 40
    assert 2 <= stats["max_active"] <= 4  # never exceeded (server-side count; on a loaded machine 4 may not overlap)
    assert res.client["max_in_flight"] == 4 and res.client["connector_limit"] == 4
    assert all(r["success"] for r in res.rows)
    # workers take requests in list order: the first wave starts before the last wave
    starts = [r["start_s"] for r in res.rows]
    assert max(starts[:4]) <= min(starts[-4:])


def test_poisson_schedule_is_seeded_and_absolute():
    a = poisson_schedule(2000, 50.0, seed=7)
    assert a == poisson_schedule(2000, 50.0, seed=7)
    assert a != poisson_schedule(2000, 50.0, seed=8)
    rng = random.Random(7)
    t, expect = 0.0, []
    for _ in range(2000):
        t += rng.expovariate(50.0)
        expect.append(t)
    assert a == expect
    gaps = [y - x for x, y in zip([0.0] + a, a, strict=False)]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 50, rel=0.08)  # mean of 2000 exp gaps
    cv = (sum((g - 0.02) ** 2 for g in gaps) / len(gaps)) ** 0.5 / 0.02
    assert 0.85 < cv < 1.15  # exponential: coefficient of variation 1
    with pytest.raises(ValueError, match="rate_rps"):
        poisson_schedule(3, 0, seed=1)


def test_open_loop_follows_the_schedule(server):
    n, rate = 60, 150.0
    res = run_open_loop(server, "fake-model", specs(n, events=3), rate, arrival_seed=11)
    sched = poisson_schedule(n, rate, seed=11)
    assert [r["scheduled_s"] for r in res.rows] == [round(s, 6) for s in sched]
    late = [r["start_s"] - r["scheduled_s"] for r in res.rows]
    assert min(late) >= -1e-5  # never early
    assert sorted(late)[n // 2] < 0.05  # absolute timeline: lateness does not accumulate
    c = res.client
    assert c["mode"] == "open" and c["offered_rate"] == rate and c["lateness_ms"]["count"] == n
    assert c["scheduled_rate"] == pytest.approx(n / sched[-1], rel=1e-3)
    assert c["achieved_rate"] > 0.8 * c["scheduled_rate"]
    assert all(r["success"] for r in res.rows)
    again = run_open_loop(server, "fake-model", specs(n, events=3), rate, arrival_seed=11)
    assert [r["scheduled_s"] for r in again.rows] == [r["scheduled_s"] for r in res.rows]


def test_blocked_event_loop_sets_limited(server):
    async def main():
        stop = False

        async def hog():  # a CPU-bound task that blocks the loop for 40 ms at a time
            while not stop:
                t = time.perf_counter()
                while time.perf_counter() - t < 0.04:
                    pass
                await asyncio.sleep(0)

        task = asyncio.create_task(hog())
        try:
            return await loadgen.arun_closed_loop(server, "fake-model", specs(8, events=5, delay_s=0.02), 2)
        finally:
            stop = True
            await task

    res = asyncio.run(main())
    c = res.client
    assert c["limited"] is True
    assert any(r.startswith("event_loop_lag_p99_ms") for r in c["limited_reasons"]), c
    assert c["event_loop_lag_ms"]["p99"] > 20
    t = c["tail_tests"]["event_loop_lag_p99_ms"]  # many late ticks, not one: the test, not the p99, decides
    assert t["verdict"] == "fail" and t["late"] >= 3 and t["n"] == c["event_loop_lag_ms"]["count"]
    assert (t["p99"], t["max"]) == (c["event_loop_lag_ms"]["p99"], c["event_loop_lag_ms"]["max"])
    # each stall carries when the loop woke from it: the worst first, the largest being the recorded max
    stalls = c["event_loop_stalls"]
    assert 3 <= len(stalls) <= loadgen.MAX_STALLS and stalls[0]["ms"] == pytest.approx(c["event_loop_lag_ms"]["max"], abs=1e-3)
    assert [x["ms"] for x in stalls] == sorted((x["ms"] for x in stalls), reverse=True)
    assert all(x["ms"] > loadgen.STALL_MS and -0.1 < x["at_s"] < c["wall_seconds"] + 0.1 for x in stalls)
    first_send = min(r["start_unix"] for r in res.rows)
    assert all(abs(x["unix"] - (first_send + x["at_s"])) < 0.05 for x in stalls)  # one clock with the rows


def test_unblocked_run_is_not_limited_by_lag(server):
    res = run_closed_loop(server, "fake-model", specs(4, events=5, delay_s=0.01), 2)
    assert res.client["event_loop_lag_ms"]["count"] > 0
    assert res.client["pool_wait_ms"]["count"] == 4
    assert 0 <= res.client["cpu_share"] <= 1.5
    # the default limits: a run whose client is not blocked is not marked limited
    assert res.client["limited"] is False, res.client["limited_reasons"]
    tests = res.client["tail_tests"]  # a closed loop tests lag and pool wait; lateness is not measured
    assert set(tests) == {"event_loop_lag_p99_ms", "pool_wait_p99_ms"} and tests["pool_wait_p99_ms"]["n"] == 4
    assert res.client["limits"]["tail_alpha"] == 0.05
    # loose limits: nothing can trip them
    loose = {"event_loop_lag_p99_ms": 1e9, "cpu_share": 1e9, "pool_wait_p99_ms": 1e9}
    assert run_closed_loop(server, "m", specs(2), 1, limits=loose).client["limited"] is False


def test_limits_reject_unknown_keys(server):
    with pytest.raises(ValueError, match="unknown key 'lag'"):
        run_closed_loop(server, "m", specs(1), 1, limits={"lag": 3})


def test_api_key_is_sent_but_never_written(server):
    secret = "sk-test-SECRET-4242"
    _reset(server)
    reqs = specs(2) + specs(1, fault="http500") + specs(1, fault="malformed")
    res = run_closed_loop(server, "fake-model", reqs, 2, api_key=secret, keep_text=True)
    assert _get(server + "/fake/stats")["authorized"] == 4
    res2 = run_closed_loop("http://127.0.0.1:9", "m", specs(1), 1, api_key=secret)
    blob = json.dumps([res.rows, res.client, res2.rows, res2.client])
    assert secret not in blob
    assert "SECRET" not in blob


def test_pool_wait_hook_measures_queueing(server):
    import aiohttp

    async def main():
        ctxs = [{}, {}]
        body = b'{"fake": {"events": 2, "delay_s": 0.05}}'
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector, trace_configs=[loadgen._trace_config()]) as session:

            async def req(ctx):
                async with session.post(server + "/v1/chat/completions", data=body, trace_request_ctx=ctx) as r:
                    await r.read()

            await asyncio.gather(req(ctxs[0]), req(ctxs[1]))
        return ctxs

    waits = sorted(ctx.get("queued", 0.0) for ctx in asyncio.run(main()))
    assert waits[0] == 0.0 and waits[1] >= 0.08  # the second request waited for the only connection


def test_cli_writes_rows_and_client(server, tmp_path):
    import argparse

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt_id": f"x-{i}", "stratum": "code", "messages": MSGS, "max_tokens": 8}) + "\n"
            for i in range(3)
        )
    )
    parser = argparse.ArgumentParser()
    loadgen.register(parser.add_subparsers())
    out = tmp_path / "out"
    argv = ["loadgen", "--base-url", server, "--model", "fake-model", "--prompts", str(prompts)]
    args = parser.parse_args(argv + ["--concurrency", "2", "--num-requests", "5", "--out", str(out)])
    assert args.func(args) == 0
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert [r["prompt_id"] for r in rows] == ["x-0", "x-1", "x-2", "x-0", "x-1"]
    assert all(r["success"] and r["workload"] == "code" for r in rows)
    assert json.loads((out / "client.json").read_text())["mode"] == "closed"
    args = parser.parse_args(argv + ["--rate", "100", "--arrival-seed", "3", "--out", str(out)])
    assert args.func(args) == 0
    assert json.loads((out / "client.json").read_text())["mode"] == "open"


def test_empty_request_list_and_gc_restored(server):
    import gc

    for res in (run_closed_loop(server, "m", [], 4), run_open_loop(server, "m", [], 10.0, arrival_seed=1)):
        assert res.rows == [] and res.client["limited"] is False and res.client["achieved_rate"] is None
    run_closed_loop(server, "m", specs(2), 2)
    assert gc.get_freeze_count() == 0  # the window's gc.freeze() is undone
