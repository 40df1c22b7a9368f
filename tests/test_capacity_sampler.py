"""The capacity search's telemetry must not starve its own load generator (issue 28, item 6).

* ``prom.scan_gauges`` (the line-prefix scan the sampler uses) agrees with the full parse on the real vLLM 0.23
  page from the H200 and on constructed multi-engine pages, and costs a small fraction of a parse;
* the sampler reads through the scan, never through ``prom.gauges``, and keeps the raw pages;
* lateness is judged over the measured sends only (the warm-up's do not count), by a gate whose sample size
  makes it meaningful (fraction of late sends, one-sided exact binomial test).
"""

from __future__ import annotations

import gzip
import http.server
import os
import re
import sys
import threading
import time

import pytest
from scipy.stats import binom

from specstudy.measure import capacity, prom
from specstudy.measure.capacity.runner import MetricsSampler, load_requests, loadgen_limits, write_sampled_pages
from specstudy.measure.capacity.step import judge_lateness, step_row

sys.path.insert(0, os.path.dirname(__file__))
import capacity_fake_server as fake  # noqa: E402
from conftest import data_path  # noqa: E402

# A real vLLM 0.23 /metrics page, part of the repository's test data (tests/data/gpu, see its MANIFEST.md).
REAL_PAGE = data_path("gpu", "metrics-vllm-0.23.0-h200.prom")


@pytest.fixture(scope="module")
def real_page() -> str:
    return REAL_PAGE.read_text()


def _set(page: str, name: str, values: list[float]) -> str:
    """Replace the sample lines of ``name`` by one line per value (engines 0, 1, ...), same labels otherwise."""
    lines = page.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith(name + "{"))
    rest = [ln for ln in lines if not ln.startswith(name + "{")]
    new = [f'{name}{{engine="{e}",model_name="m x}}"}} {v!r}' for e, v in enumerate(values)]
    return "\n".join(rest[:first] + new + rest[first:]) + "\n"


def test_scan_agrees_with_the_full_parse_on_the_real_h200_page(real_page):
    assert len(real_page) > 50_000 and real_page.count("\n") > 400  # the 57-KB page, not a toy
    assert prom.scan_gauges(real_page) == prom.gauges(real_page)
    # the same page under load: two engines, waiting/running summed, KV usage the maximum; the per-reason
    # waiting gauge (a longer name with the same prefix) must not be counted
    busy = _set(_set(_set(real_page, prom.WAITING, [3.0, 4.0]), prom.RUNNING, [17.0, 9.0]),
                "vllm:kv_cache_usage_perc", [0.25, 0.75])
    busy = busy.replace('reason="capacity"} 0.0', 'reason="capacity"} 7.0')
    g = prom.scan_gauges(busy)
    assert g == prom.gauges(busy)
    assert (g["num_requests_waiting"], g["num_requests_running"], g["kv_cache_usage"]) == (7.0, 26.0, 0.75)
    assert g["kv_cache_usage_metric"] == "vllm:kv_cache_usage_perc"


def test_scan_edge_cases():
    assert prom.scan_gauges("") == prom.gauges("")
    # no labels, a timestamp, the V0 KV alias, a gauge as the page's first line
    text = "vllm:num_requests_waiting 5 1700000000000\nvllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_running 2\n"
    assert prom.scan_gauges(text) == prom.gauges(text)
    assert prom.scan_gauges(text)["num_requests_waiting"] == 5.0
    with pytest.raises(prom.MetricsParseError, match="vllm:num_requests_waiting"):
        prom.scan_gauges("vllm:num_requests_waiting{engine=\"0\"} many\n")


def test_scan_costs_a_small_fraction_of_a_parse(real_page):
    def cpu(fn, reps):
        t = time.process_time()
        for _ in range(reps):
            fn(real_page)
        return (time.process_time() - t) / reps

    parse, scan = cpu(prom.gauges, 5), cpu(prom.scan_gauges, 200)
    # measured: ~14 ms vs ~55 us on this machine; a factor of 20 leaves room for a busy machine
    assert scan * 20 < parse, (scan, parse)
    assert scan < 0.002, scan


class _PageHandler(http.server.BaseHTTPRequestHandler):
    page = b""

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *a):
        pass


def test_sampler_reads_by_scan_and_keeps_the_raw_pages(real_page, monkeypatch, tmp_path):
    page = _set(real_page, prom.WAITING, [2.0, 1.0])
    handler = type("H", (_PageHandler,), {"page": page.encode()})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()

    def no_parse(*a, **k):
        raise AssertionError("the sampler must not parse the whole page")

    monkeypatch.setattr(prom, "gauges", no_parse)
    monkeypatch.setattr(prom, "parse", no_parse)
    try:
        s = MetricsSampler(f"http://127.0.0.1:{srv.server_address[1]}/metrics", 0.02).start()
        deadline = time.monotonic() + 10
        while len(s.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        samples = s.stop()
    finally:
        srv.shutdown()
        srv.server_close()
    assert s.errors == 0 and len(samples) >= 3
    assert all(x["waiting"] == 3.0 and x["running"] == 0.0 and x["kv_cache_usage"] == 0.0 for x in samples)
    assert len(s.pages) == len(samples) and s.pages[0][1] == page
    out = tmp_path / "samples.prom.gz"
    write_sampled_pages(out, s.pages, t_call=s.pages[0][0])
    text = gzip.decompress(out.read_bytes()).decode()
    assert text.count("# specstudy-sample t=") == len(s.pages) and text.startswith("# specstudy-sample t=0.000000\n")
    assert text.count("vllm:num_requests_waiting{") == 2 * len(s.pages)


# ------------------------------------------------------------------------------------------ lateness gate


def test_lateness_gate_needs_evidence_not_one_hiccup():
    few = [0.3] * 47 + [40.0]  # 48 sends, one hiccup: a p99 over 48 sends would be decided by it
    j = judge_lateness(few, 2.0, 0.01)
    assert j["verdict"] == "pass" and j["late"] == 1 and j["n"] == 48 and j["p99_ms"] > 2.0
    three = [0.3] * 45 + [40.0] * 3
    j = judge_lateness(three, 2.0, 0.01)
    assert j["verdict"] == "fail" and j["late"] == 3
    assert j["p_value"] == pytest.approx(binom.sf(2, 48, 0.01)) and j["p_value"] < 0.05
    # 6000 sends (100 req/s x 60 s): 1 % late is the limit itself, 2 % is clear evidence
    assert judge_lateness([0.3] * 5940 + [9.0] * 60, 2.0, 0.01)["verdict"] == "pass"
    assert judge_lateness([0.3] * 5880 + [9.0] * 120, 2.0, 0.01)["verdict"] == "fail"
    assert judge_lateness([2.0] * 100, 2.0, 0.01)["late"] == 0  # "later than", not "at"
    assert judge_lateness([], 2.0, 0.01)["verdict"] == "no_data"
    assert judge_lateness(None, 2.0, 0.01)["verdict"] == "no_data"
    assert judge_lateness(three, None, 0.01)["verdict"] == "skipped"
    assert judge_lateness(three, 2.0, None)["verdict"] == "skipped"


def _rows(warm: int, measured: int, warm_late_ms: float, late_ms: list[float]) -> list[dict]:
    rows = []
    for i in range(warm + measured):
        sched = i * 0.01
        lat = warm_late_ms if i < warm else late_ms[(i - warm) % len(late_ms)]
        rows.append({"request_index": i, "scheduled_s": sched, "start_s": sched + lat / 1e3, "end_s": sched + 0.05,
                     "success": True, "ttft_ms": 10.0, "tpot_ms": 2.0})
    return rows


def test_lateness_counts_the_measured_window_only():
    gates = capacity.resolve_gates({})
    assert gates["client"]["max_lateness_p99_ms"] == 2.0 and gates["client"]["max_late_fraction"] == 0.01
    # a warm-up of 100 sends all 50 ms late (cold connections), then 500 punctual measured sends
    rows = _rows(100, 500, 50.0, [0.4])
    step = capacity.summarize_step(100.0, rows, {}, [], t_call=0.0, warmup_s=1.0, duration_s=5.0,
                                   before=None, after=None)
    assert len(step.lateness_ms) == 500 and max(step.lateness_ms) < 1.0
    j = capacity.judge(step, gates)
    assert j["gates"]["client_lateness"] == "pass" and j["lateness"]["n"] == 500
    row = step_row(step, j, index=0, phase="bracket", arm="a")
    assert row["lateness_sends"] == 500 and row["late_sends"] == 0 and row["lateness_p99_ms"] < 1.0
    # the same step with 5 % of its measured sends 9 ms late is client-limited
    rows = _rows(100, 500, 0.4, [0.4] * 19 + [9.0])
    step = capacity.summarize_step(100.0, rows, {}, [], t_call=0.0, warmup_s=1.0, duration_s=5.0,
                                   before=None, after=None)
    j = capacity.judge(step, gates)
    assert j["gates"]["client_lateness"] == "fail" and j["verdict"] == "client_limited"
    assert j["lateness"]["late"] == 25
    from specstudy.core import schemas

    schemas.validate(step_row(step, j, index=0, phase="bracket", arm="a"), "capacity-step", "<row>")


def test_the_load_generators_own_lateness_flag_is_off_in_the_search():
    """Its flag would take a p99 over the warm-up too; the search judges lateness itself."""
    limits = loadgen_limits(capacity.resolve_gates({"client": {"max_lateness_p99_ms": 5.0}}))
    assert limits["lateness_p99_ms"] >= 1e18 and limits["cpu_share"] == 0.9


def test_a_real_step_keeps_the_sampled_pages(tmp_path):
    base, metrics, proc = fake.start(max_concurrency=8, token_delay_ms=5.0)
    try:
        gates = capacity.resolve_gates({"client": {"max_lateness_p99_ms": 500.0, "max_cpu_share": None}})
        cfg = capacity.resolve_search({"warmup_s": 0.3, "step_duration_s": 1.0, "sample_interval_s": 0.1})
        prompts = [{"prompt_id": f"p{i}", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
                   for i in range(4)]
        runner = capacity.make_step_runner(base, "fake", load_requests(prompts), metrics, cfg, gates,
                                           artifacts_dir=tmp_path)
        step = runner(20.0)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    raw = gzip.decompress((tmp_path / "step-000" / "samples.prom.gz").read_bytes()).decode()
    n_pages = raw.count("# specstudy-sample t=")
    assert n_pages >= 5 and len(re.findall(r"^vllm:num_requests_waiting", raw, re.M)) == n_pages
    # only the measured sends (scheduled at or after the 0.3-s warm-up) are in the lateness
    assert step.lateness_ms is not None and len(step.lateness_ms) == step.n_requests
    assert step.waiting_samples >= 3
