"""Tests for specstudy.measure.cell: summary definitions, validity reasons, run_cell artifacts."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import numpy as np
import pytest

from specstudy.core import atomic, schemas
from specstudy.measure import cell
from test_prom import _Handler, vllm_text

KEYS = {
    "phase": "screen",
    "arm": "draft-k3-tp1",
    "method": "draft_model",
    "num_speculative_tokens": 3,
    "draft_tensor_parallel_size": 1,
    "rep": 1,
    "workload": "chat",
    "concurrency": 2,
    "deployment_id": "d-1",
}
CORPUS = {"name": "fixture", "version": "1", "digest": "sha256:abc"}
CLIENT = {"limited": False, "limited_reasons": []}


def row(i, *, start, end, ttft, comp=11, prompt=5, finish="stop", success=True, usage=True, tpe=None, gaps=None):
    e2e = (end - start) * 1000.0
    return {
        "request_index": i,
        "prompt_id": f"p{i}",
        "workload": "chat",
        "scheduled_s": None,
        "start_s": start,
        "end_s": end,
        "start_unix": 1_700_000_000.0 + start,
        "ttft_ms": ttft,
        "e2e_ms": e2e,
        "tpot_ms": (e2e - ttft) / (comp - 1) if (usage and comp > 1) else None,
        "completion_tokens": comp if usage else None,
        "prompt_tokens": prompt if usage else None,
        "usage_present": usage,
        "finish_reason": finish,
        "status_code": 200,
        "error": None if success else "boom",
        "success": success,
        "n_content_events": len(tpe) if tpe else comp,
        "stream_event_gaps_ms": gaps if gaps is not None else [10.0] * (comp - 1),
        "tokens_per_event": tpe,
        "output_sha256": "0" * 64,
        "output_chars": 10,
    }


def succ(n):
    """request_success counters after n more finished requests (before: stop 3, length 1, abort 0)."""
    return (("stop", 3.0 + n), ("length", 1.0), ("abort", 0.0))


def four_rows():
    return [
        row(0, start=0.0, end=1.0, ttft=10.0),
        row(1, start=0.0, end=1.5, ttft=20.0),
        row(2, start=1.0, end=2.0, ttft=30.0),
        row(3, start=1.5, end=2.5, ttft=40.0),
    ]


def summ(rows, before=None, after=None, **kw):
    before = vllm_text(gen=0.0, drafts=0, draft_tokens=0, accepted=0, per_pos=(0, 0, 0)) if before is None else before
    after = vllm_text(gen=44.0, drafts=20, draft_tokens=60, accepted=24, per_pos=(12, 8, 4), success=succ(4)) if after is None else after
    kw.setdefault("client", CLIENT)
    s = cell.summarize(rows, before, after, keys=KEYS, corpus=CORPUS, **kw)
    schemas.validate(s, "cell-summary", "test")
    return s


def codes(s):
    return [r["code"] for r in s["validity"]["reasons"]]


def test_valid_cell_definitions():
    s = summ(four_rows())
    assert s["validity"] == {
        "valid": True,
        "reasons": [],
        "notes": [],
        "latency_valid": True,
        "tpot_valid": True,
        "throughput_valid": True,
    }
    assert s["requests"]["success_rate"] == 1.0
    # wall = first request start -> last request end
    assert s["wall_seconds"] == 2.5
    assert s["tokens"] == {"prompt": 20, "completion": 44, "output_tokens_per_second": 44 / 2.5}
    t = s["latency_ms"]["ttft"]
    assert t["count"] == 4 and t["mean"] == 25.0
    assert t["p50"] == 25.0 and t["p95"] == pytest.approx(38.5, rel=1e-12) and t["p99"] == pytest.approx(39.7, rel=1e-12)
    assert t["p95"] == float(np.percentile([10, 20, 30, 40], 95, method="linear"))
    assert s["latency_ms"]["stream_event_gap"]["count"] == 40
    sp = s["speculative"]
    assert sp["acceptance_rate"] == 24 / 60 and sp["mean_acceptance_length"] == 1 + 24 / 20
    assert sp["per_position"] == {"0": 0.6, "1": 0.4, "2": 0.2} and sp["attributable"] is True
    assert s["server_deltas"]["generation_tokens"] == 44.0
    assert s["times"]["started_at"].startswith("2023-11-14T22:13:20")


def test_low_success_rate_rejects_and_bad_finish_reason_is_failure():
    rows = [row(i, start=0.0, end=1.0, ttft=10.0) for i in range(100)]
    rows[0]["finish_reason"] = "abort"  # success flag set, but abort is a failure
    s = summ(rows, after=vllm_text(gen=1089.0, drafts=1, draft_tokens=3, accepted=1, per_pos=(1, 0, 0)))
    assert s["requests"]["successful"] == 99 and s["requests"]["success_rate"] == 0.99
    assert "low_success_rate" not in codes(s) and s["validity"]["valid"]
    rows[1] = row(1, start=0.0, end=1.0, ttft=10.0, success=False, finish=None, usage=False)
    s = summ(rows, after=vllm_text(gen=1078.0, drafts=1, draft_tokens=3, accepted=1, per_pos=(1, 0, 0)))
    assert s["requests"]["success_rate"] == 0.98
    assert "low_success_rate" in codes(s)
    assert s["validity"]["valid"] is False and s["validity"]["throughput_valid"] is False
    assert s["requests"]["failures_by_cause"] == {"abort": 1, "error": 1}


def test_counter_decreased_rejects():
    before = vllm_text(gen=5000.0)
    after = vllm_text(gen=44.0, drafts=20, draft_tokens=60, accepted=24, per_pos=(12, 8, 4))
    s = summ(four_rows(), before=before, after=after)
    assert codes(s) == ["counter_decreased"]
    assert s["validity"]["valid"] is False and s["speculative"]["attributable"] is False


def test_restart_rejects():
    before = vllm_text(gen=0.0, drafts=0, draft_tokens=0, accepted=0, per_pos=(0, 0, 0), start=1000.0)
    after = vllm_text(gen=44.0, drafts=20, draft_tokens=60, accepted=24, per_pos=(12, 8, 4), start=1234.0)
    s = summ(four_rows(), before=before, after=after)
    assert "server_restarted" in codes(s) and s["validity"]["valid"] is False


def test_metrics_unreachable_is_a_reason_not_a_crash():
    s = cell.summarize(four_rows(), None, vllm_text(), keys=KEYS, corpus=CORPUS, client=CLIENT,
                       metrics_errors={"before": "GET x: connection refused"})
    assert codes(s) == ["metrics_unreachable"] and "connection refused" in s["validity"]["reasons"][0]["detail"]
    assert s["validity"]["valid"] is False and s["speculative"]["enabled"] is None
    s = cell.summarize(four_rows(), vllm_text(), "<html>502 bad gateway", keys=KEYS, corpus=CORPUS, client=CLIENT)
    assert codes(s) == ["metrics_unreachable"] and "after" in s["validity"]["reasons"][0]["detail"]
    schemas.validate(s, "cell-summary")


def test_missing_usage_invalidates_throughput_and_tpot_only():
    rows = four_rows()
    rows[2] = row(2, start=1.0, end=2.0, ttft=30.0, usage=False)
    s = summ(rows, after=vllm_text(gen=44.0, drafts=20, draft_tokens=60, accepted=24, per_pos=(12, 8, 4)))
    assert codes(s) == ["missing_usage"]
    assert s["server_deltas"]["foreign_traffic_token_check"] == "lower bound only"
    assert [n["code"] for n in s["validity"]["notes"]] == ["foreign_traffic_partial"]
    assert s["requests"]["missing_usage"] == 1
    v = s["validity"]
    assert v["valid"] is True and v["latency_valid"] is True
    assert v["throughput_valid"] is False and v["tpot_valid"] is False
    assert s["tokens"]["completion"] == 33  # only rows with usage
    assert s["latency_ms"]["tpot"]["count"] == 3


def test_multi_token_events_histogram():
    rows = four_rows()
    rows[0] = row(0, start=0.0, end=1.0, ttft=10.0, comp=11, tpe=[1, 3, 3, 4], gaps=[5.0, 5.0, 5.0])
    rows[1] = row(1, start=0.0, end=1.5, ttft=20.0, comp=11, tpe=[2, 4, 4, 1], gaps=[5.0, 5.0, 5.0])
    s = summ(rows)
    tpe = s["tokens_per_event"]
    assert tpe["source"] == "continuous_usage"
    assert tpe["histogram"] == {"1": 2, "2": 1, "3": 2, "4": 3}
    assert tpe["multi_token_events"] == 6 and tpe["count"] == 8 and tpe["mean"] == 22 / 8
    # gaps are per event, never per token
    assert s["latency_ms"]["stream_event_gap"]["count"] == 3 + 3 + 10 + 10


def test_foreign_traffic_flag_both_directions():
    after_more = vllm_text(gen=44.0 + 500, drafts=20, draft_tokens=60, accepted=24, per_pos=(12, 8, 4))
    s = summ(four_rows(), after=after_more)
    assert codes(s) == ["foreign_traffic"]
    assert s["validity"]["valid"] is True and s["validity"]["throughput_valid"] is False
    assert s["speculative"]["attributable"] is False
    assert s["server_deltas"]["generation_tokens_minus_client"] == 500
    after_less = vllm_text(gen=10.0, drafts=20, draft_tokens=60, accepted=24, per_pos=(12, 8, 4))
    assert codes(summ(four_rows(), after=after_less)) == ["foreign_traffic"]
    # within tolerance (8 tokens) is fine
    after_close = vllm_text(gen=50.0, drafts=20, draft_tokens=60, accepted=24, per_pos=(12, 8, 4))
    assert codes(summ(four_rows(), after=after_close)) == []
    # more finished requests than we sent
    after_req = vllm_text(gen=44.0, drafts=20, draft_tokens=60, accepted=24, per_pos=(12, 8, 4), success=succ(9))
    assert codes(summ(four_rows(), after=after_req)) == ["foreign_traffic"]


def test_loadgen_limited_rejects():
    s = summ(four_rows(), client={"limited": True, "limited_reasons": ["event-loop lag p99 45 ms > 20 ms"]})
    assert codes(s) == ["loadgen_limited"] and s["validity"]["valid"] is False
    assert "event-loop lag" in s["validity"]["reasons"][0]["detail"]


def test_rows_without_times_use_given_wall():
    rows = four_rows()
    for r in rows:
        r["start_s"] = r["end_s"] = None
    s = summ(rows, wall_seconds=4.0, wall_source="test")
    assert s["wall_seconds"] == 4.0 and s["tokens"]["output_tokens_per_second"] == 11.0
    s = summ(rows)
    assert s["wall_seconds"] is None and s["validity"]["throughput_valid"] is False


def test_failed_summary_and_fingerprint():
    s = cell.failed_summary(KEYS, CORPUS, "deployment_failed", "server never became ready (see log)")
    schemas.validate(s, "cell-summary")
    assert s["validity"]["valid"] is False and codes(s) == ["deployment_failed"]
    with pytest.raises(ValueError):
        cell.failed_summary(KEYS, CORPUS, "not_a_code", "x")
    a = cell.cell_fingerprint({"arm": "x", "c": 1, "sampling": {"t": 0.0, "seed": 1}})
    b = cell.cell_fingerprint({"sampling": {"seed": 1, "t": 0.0}, "c": 1, "arm": "x"})
    assert a == b and len(a) == 64 and a != cell.cell_fingerprint({"arm": "x", "c": 2})


def test_schema_rejects_bad_summary():
    s = summ(four_rows())
    s["validity"]["reasons"] = [{"code": "made_up", "detail": ""}]
    with pytest.raises(schemas.ValidationError, match="validity.reasons.0.code"):
        schemas.validate(s, "cell-summary", "x")


# ----------------------------------------------------------------------------- run_cell with a fake loadgen


@dataclass
class FakeResult:
    rows: list
    client: dict


def fake_loadgen(monkeypatch, calls):
    mod = types.ModuleType("specstudy.measure.loadgen")

    def run_closed_loop(base_url, model, requests, concurrency, **kw):
        calls.append((len(requests), concurrency, kw))
        rows = [row(i, start=0.1 * i, end=0.1 * i + 1.0, ttft=10.0) for i in range(len(requests))]
        return FakeResult(rows, {"limited": False, "limited_reasons": []})

    mod.run_closed_loop = run_closed_loop
    monkeypatch.setitem(sys.modules, "specstudy.measure.loadgen", mod)
    import specstudy.measure

    # `from specstudy.measure import loadgen` reads the package's attribute once the real module was imported
    monkeypatch.setattr(specstudy.measure, "loadgen", mod, raising=False)


def test_run_cell_with_unreachable_metrics(tmp_path, monkeypatch):
    calls = []
    fake_loadgen(monkeypatch, calls)
    s = cell.run_cell("http://127.0.0.1:9", "m", [object()] * 4, [object()] * 2, 2, tmp_path / "c",
                      keys=KEYS, corpus=CORPUS, metrics_url="http://127.0.0.1:9/metrics", fingerprint="a" * 64,
                      drain_timeout_s=0.0, metrics_timeout_s=0.5)
    assert [c[:2] for c in calls] == [(2, 2), (4, 2)]  # warm-up with the same concurrency first
    assert codes(s) == ["metrics_unreachable"]
    for f in ("requests.jsonl", "warmup.jsonl", "summary.json"):
        assert (tmp_path / "c" / f).exists()
    assert not (tmp_path / "c" / "metrics_before.prom").exists()
    assert atomic.read_json(tmp_path / "c" / "summary.json")["warmup"] == {"attempted": 2, "successful": 2}
    assert s["drain"]["drained"] is False


def test_run_cell_with_metrics_server(tmp_path, monkeypatch):
    import http.server
    import threading

    calls = []
    fake_loadgen(monkeypatch, calls)
    state = {"n": 0}

    class H(_Handler):
        def do_GET(self):  # noqa: N802
            # first scrape = before, later scrapes = after (4 requests x 11 tokens)
            state["n"] += 1
            H.body = (vllm_text(gen=0.0) if state["n"] == 1 else vllm_text(gen=44.0, success=succ(4))).encode()
            super().do_GET()

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        s = cell.run_cell(url, "m", [object()] * 4, [], 2, tmp_path / "c", keys=KEYS, corpus=CORPUS,
                          metrics_url=url + "/metrics", fingerprint="b" * 64, drain_timeout_s=2.0)
    finally:
        srv.shutdown()
        srv.server_close()
    assert s["validity"]["valid"] is True, s["validity"]
    assert s["drain"]["drained"] is True
    assert s["wall_seconds"] == pytest.approx(1.3)
    assert (tmp_path / "c" / "metrics_before.prom").read_text().startswith("# HELP")
    assert s["server_deltas"]["generation_tokens"] == 44.0


def test_foreign_traffic_uses_the_rows_with_usage_and_discloses_a_partial_check():
    """Review #16.8: one failed request without usage used to skip the whole check in silence."""
    rows = four_rows() + [row(4, start=2.0, end=2.2, ttft=5.0, success=False, usage=False, finish=None)]
    after_less = vllm_text(gen=10.0, drafts=20, draft_tokens=60, accepted=24, per_pos=(12, 8, 4), success=succ(5))
    s = cell.summarize(rows, vllm_text(gen=0.0, drafts=0, draft_tokens=0, accepted=0, per_pos=(0, 0, 0)),
                       after_less, keys=KEYS, corpus=CORPUS, client=CLIENT,
                       thresholds={"min_success_rate": 0.5})
    schemas.validate(s, "cell-summary", "test")
    # the server generated fewer tokens than the successful rows received: flagged despite the failed row
    assert "foreign_traffic" in codes(s)
    assert [n["code"] for n in s["validity"]["notes"]] == ["foreign_traffic_partial"]
    assert "request_index [4]" in s["validity"]["notes"][0]["detail"]
    # more tokens than the successful rows received: may be the failed request's, not flagged, but disclosed
    after_more = vllm_text(gen=44.0 + 30, drafts=20, draft_tokens=60, accepted=24, per_pos=(12, 8, 4), success=succ(5))
    s = cell.summarize(rows, vllm_text(gen=0.0, drafts=0, draft_tokens=0, accepted=0, per_pos=(0, 0, 0)),
                       after_more, keys=KEYS, corpus=CORPUS, client=CLIENT, thresholds={"min_success_rate": 0.5})
    assert "foreign_traffic" not in codes(s)
    assert s["server_deltas"]["foreign_traffic_token_check"] == "lower bound only"
    assert s["validity"]["notes"][0]["code"] == "foreign_traffic_partial"
    # a request the server refused (HTTP 503) generated nothing: the full check is made, no note
    refused = four_rows() + [dict(row(4, start=2.0, end=2.2, ttft=5.0, success=False, usage=False), status_code=503)]
    s = cell.summarize(refused, vllm_text(gen=0.0, drafts=0, draft_tokens=0, accepted=0, per_pos=(0, 0, 0)),
                       after_more, keys=KEYS, corpus=CORPUS, client=CLIENT, thresholds={"min_success_rate": 0.5})
    assert "foreign_traffic" in codes(s) and s["validity"]["notes"] == []
    assert s["server_deltas"]["foreign_traffic_token_check"] == "done"


def test_cell_error_is_a_known_reason():
    """Review #16.7: recording a cell that raised used to raise (reason missing from table and schema)."""
    s = cell.failed_summary(KEYS, CORPUS, "cell_error", "RuntimeError: loadgen exploded")
    schemas.validate(s, "cell-summary", "test")
    assert codes(s) == ["cell_error"] and s["validity"]["valid"] is False


def _http(n, status="2xx", handler="/v1/chat/completions", method="POST"):
    return f'http_requests_total{{handler="{handler}",method="{method}",status="{status}"}} {n}\n'


def test_requests_the_load_generator_did_not_send_are_named():
    """The server's API request count (http_requests_total on /v1) against the rows: a foreign request that the
    token and finished-request checks cannot see (refused or failed: no tokens, no success) still flags the cell."""
    before = vllm_text(gen=0.0, drafts=0, draft_tokens=0, accepted=0, per_pos=(0, 0, 0)) + _http(10) + _http(
        2, handler="/v1/models", method="GET")
    after = vllm_text(gen=44.0, drafts=20, draft_tokens=60, accepted=24, per_pos=(12, 8, 4), success=succ(4))
    clean = summ(four_rows(), before=before, after=after + _http(14) + _http(2, handler="/v1/models", method="GET")
                 + _http(50, handler="/tokenize"))
    assert codes(clean) == [] and clean["server_deltas"]["foreign_request_check"] == "done"
    assert (clean["server_deltas"]["requests_received"], clean["server_deltas"]["requests_sent"],
            clean["server_deltas"]["requests_not_sent_by_loadgen"]) == (4, 4, 0)
    refused = summ(four_rows(), before=before, after=after + _http(14) + _http(3, status="4xx")
                   + _http(2, handler="/v1/models", method="GET"))
    assert codes(refused) == ["foreign_traffic"] and refused["validity"]["throughput_valid"] is False
    assert refused["server_deltas"]["requests_not_sent_by_loadgen"] == 3
    assert "server answered 7 API requests in the window, the load generator sent 4: 3 came from another client" in \
        refused["validity"]["reasons"][0]["detail"]
    models = summ(four_rows(), before=before, after=after + _http(14) + _http(3, handler="/v1/models", method="GET"))
    assert codes(models) == ["foreign_traffic"]  # any API request counts, not only generation
    without = summ(four_rows(), before=vllm_text(gen=0.0, drafts=0, draft_tokens=0, accepted=0, per_pos=(0, 0, 0)))
    assert codes(without) == [] and without["server_deltas"]["requests_not_sent_by_loadgen"] is None
    assert without["server_deltas"]["foreign_request_check"].startswith("not made: the server exposes no")


def test_the_request_count_of_a_real_vllm_window_matches_its_rows():
    from pathlib import Path

    from specstudy.measure import prom

    d = (Path(__file__).parent / "data" / "upstream-8b" / "results" / "8b" / "eagle" / "confirm"
         / "apertus15-8b-eagle31-k2-confirm-c1-20260926T132526Z" / "cells" / "code" / "c1")
    rows = (d / "requests.jsonl").read_text().splitlines()
    assert prom.api_requests((d / "metrics_before.prom").read_text(), (d / "metrics_after.prom").read_text()) == \
        len(rows) == 128
