"""Tests for specstudy.measure.prom: parsing, deltas, decreases, restarts, speculative definitions."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from specstudy.measure import prom

MODEL = 'model_name="m"'


def vllm_text(
    *,
    gen=100.0,
    prompt=50.0,
    drafts=10.0,
    draft_tokens=30.0,
    accepted=15.0,
    per_pos=(8.0, 5.0, 2.0),
    success=(("stop", 3.0), ("length", 1.0), ("abort", 0.0)),
    start=1000.0,
    created=2000.0,
    ttft_count=4.0,
    running=0.0,
    waiting=0.0,
    kv_name="vllm:kv_cache_usage_perc",
    kv=0.25,
    engines=("0",),
    spec=True,
) -> str:
    """A small /metrics text shaped like vLLM's (counters with _total and _created, one histogram)."""
    lines = [
        "# HELP process_start_time_seconds Start time.",
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {start}",
    ]

    def counter(name, value, extra=""):
        lines.append(f"# HELP {name}_total x")
        lines.append(f"# TYPE {name}_total counter")
        for e in engines:
            lab = f'engine="{e}",{MODEL}' + (f",{extra}" if extra else "")
            lines.append(f"{name}_total{{{lab}}} {value / len(engines)}")
        lines.append(f"# HELP {name}_created x")
        lines.append(f"# TYPE {name}_created gauge")
        for e in engines:
            lab = f'engine="{e}",{MODEL}' + (f",{extra}" if extra else "")
            lines.append(f"{name}_created{{{lab}}} {created}")

    counter("vllm:generation_tokens", gen)
    counter("vllm:prompt_tokens", prompt)
    counter("vllm:num_preemptions", 0.0)
    lines.append("# HELP vllm:request_success_total x")
    lines.append("# TYPE vllm:request_success_total counter")
    for reason, v in success:
        lines.append(f'vllm:request_success_total{{engine="0",finished_reason="{reason}",{MODEL}}} {v}')
    if spec:
        counter("vllm:spec_decode_num_drafts", drafts)
        counter("vllm:spec_decode_num_draft_tokens", draft_tokens)
        counter("vllm:spec_decode_num_accepted_tokens", accepted)
        lines.append("# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total x")
        lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
        for e in engines:
            for i, v in enumerate(per_pos):
                lines.append(
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{e}",{MODEL},position="{i}"}} {v / len(engines)}'
                )
    lines += [
        "# HELP vllm:time_to_first_token_seconds x",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        f'vllm:time_to_first_token_seconds_bucket{{{MODEL},le="0.1"}} {ttft_count}',
        f'vllm:time_to_first_token_seconds_bucket{{{MODEL},le="+Inf"}} {ttft_count}',
        f"vllm:time_to_first_token_seconds_count{{{MODEL}}} {ttft_count}",
        f"vllm:time_to_first_token_seconds_sum{{{MODEL}}} {ttft_count * 0.05}",
        "# HELP vllm:num_requests_running x",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{MODEL}}} {running}",
        "# HELP vllm:num_requests_waiting x",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{MODEL}}} {waiting}",
        f"# HELP {kv_name} x",
        f"# TYPE {kv_name} gauge",
        f"{kv_name}{{{MODEL}}} {kv}",
        "# HELP vllm:cache_config_info x",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="True",{MODEL},num_gpu_blocks="26040",num_cpu_blocks="None",gpu_memory_utilization="0.8"}} 1.0',
    ]
    return "\n".join(lines) + "\n"


def test_totals_sum_over_label_sets_and_keep_position():
    snap = prom.parse(vllm_text(engines=("0", "1"), gen=100.0))
    assert prom.total(snap, prom.GENERATION_TOKENS) == 100.0
    assert len(snap.series(prom.GENERATION_TOKENS)) == 2
    per = prom.total(snap, prom.SPEC_ACCEPTED_PER_POS, keep=("position",))
    assert per == {("0",): 8.0, ("1",): 5.0, ("2",): 2.0}
    assert prom.total(snap, "vllm:does_not_exist") is None


def test_counter_delta_and_request_success_summed_over_finished_reason():
    b = vllm_text(gen=100.0, success=(("stop", 3.0), ("length", 1.0), ("abort", 0.0)))
    a = vllm_text(gen=350.0, success=(("stop", 10.0), ("length", 2.0), ("abort", 1.0)))
    assert prom.counter_delta(b, a, prom.GENERATION_TOKENS) == 250.0
    d = prom.server_deltas(prom.parse(b), prom.parse(a))
    assert d["requests_finished"] == 9.0
    assert d["requests_finished_by_reason"] == {"abort": 1.0, "length": 1.0, "stop": 7.0}
    assert d["generation_tokens"] == 250.0


def test_no_decrease_and_no_restart_for_normal_growth():
    b, a = vllm_text(), vllm_text(gen=200.0, drafts=20.0, draft_tokens=60.0, accepted=30.0, per_pos=(16, 10, 4), ttft_count=8)
    assert prom.decreased_counters(b, a) == []
    assert prom.restart_evidence(b, a) == []


def test_counter_reset_is_detected():
    b, a = vllm_text(gen=500.0), vllm_text(gen=20.0)
    dec = prom.decreased_counters(b, a)
    assert [d["name"] for d in dec] == [prom.GENERATION_TOKENS]
    assert dec[0]["before"] == 500.0 and dec[0]["after"] == 20.0


def test_histogram_count_decrease_is_detected():
    dec = prom.decreased_counters(vllm_text(ttft_count=9), vllm_text(ttft_count=3))
    names = {d["name"] for d in dec}
    assert "vllm:time_to_first_token_seconds_count" in names
    assert "vllm:time_to_first_token_seconds_bucket" in names
    assert "vllm:time_to_first_token_seconds_sum" in names


def test_vanished_nonzero_counter_counts_as_decrease():
    dec = prom.decreased_counters(vllm_text(spec=True), vllm_text(spec=False))
    assert prom.SPEC_DRAFTS in {d["name"] for d in dec}


def test_gauge_going_down_is_not_a_decrease():
    assert prom.decreased_counters(vllm_text(running=5), vllm_text(running=0)) == []


def test_restart_via_process_start_time():
    ev = prom.restart_evidence(vllm_text(start=1000.0), vllm_text(start=1500.0))
    assert ev and "process_start_time_seconds" in ev[0]


def test_restart_via_created_without_process_start():
    b = "\n".join(ln for ln in vllm_text(created=2000.0).splitlines() if not ln.startswith(("process_start", "# HELP process", "# TYPE process")))
    a = "\n".join(ln for ln in vllm_text(created=2600.0).splitlines() if not ln.startswith(("process_start", "# HELP process", "# TYPE process")))
    assert not prom.parse(b).has(prom.PROCESS_START)
    ev = prom.restart_evidence(b + "\n", a + "\n")
    assert ev and all("_created" in e for e in ev)


def test_speculative_definitions_draft_model_full_depth():
    b = vllm_text(drafts=10, draft_tokens=30, accepted=15, per_pos=(8, 5, 2))
    a = vllm_text(drafts=110, draft_tokens=330, accepted=215, per_pos=(88, 75, 52))
    s = prom.speculative_block(b, a)
    assert s["enabled"] is True
    assert (s["drafts"], s["draft_tokens"], s["accepted_tokens"]) == (100.0, 300.0, 200.0)
    assert s["acceptance_rate"] == 200 / 300
    assert s["mean_acceptance_length"] == 1 + 200 / 100
    assert s["per_position"] == {"0": 0.8, "1": 0.7, "2": 0.5}
    assert s["per_position_sum_matches"] is True
    assert s["mean_proposal_length"] == 3.0


def test_ngram_short_proposals_never_assume_full_depth():
    # k=3 but n-gram proposals are often shorter: 40 drafts carried only 70 draft tokens (not 120).
    b = vllm_text(drafts=0, draft_tokens=0, accepted=0, per_pos=(0, 0, 0))
    a = vllm_text(drafts=40, draft_tokens=70, accepted=35, per_pos=(20, 10, 5))
    s = prom.speculative_block(b, a)
    k = 3
    assert s["drafts"] * k != s["draft_tokens"]
    assert s["acceptance_rate"] == 35 / 70  # accepted / draft tokens ...
    assert s["acceptance_rate"] != 35 / (40 * k)  # ... not accepted / (drafts*k)
    assert s["mean_acceptance_length"] == 1 + 35 / 40  # from drafts, not from the acceptance rate
    assert s["mean_acceptance_length"] != 1 + k * s["acceptance_rate"]
    assert s["per_position"] == {"0": 0.5, "1": 0.25, "2": 0.125}
    assert s["mean_proposal_length"] == 70 / 40


def test_speculative_disabled_and_zero_denominators():
    assert prom.speculative_block(vllm_text(spec=False), vllm_text(spec=False)) == {"enabled": False}
    s = prom.speculative_block(vllm_text(), vllm_text())
    assert s["enabled"] is True and s["acceptance_rate"] is None and s["mean_acceptance_length"] is None
    assert s["per_position"] == {"0": None, "1": None, "2": None}


def test_gauges_aliases_and_cache_config():
    g = prom.gauges(vllm_text(running=3, waiting=2, kv=0.5))
    assert (g["num_requests_running"], g["num_requests_waiting"], g["kv_cache_usage"]) == (3.0, 2.0, 0.5)
    assert g["kv_cache_usage_metric"] == "vllm:kv_cache_usage_perc"
    old = prom.gauges(vllm_text(kv_name="vllm:gpu_cache_usage_perc", kv=0.75))
    assert old["kv_cache_usage"] == 0.75 and old["kv_cache_usage_metric"] == "vllm:gpu_cache_usage_perc"
    cc = prom.cache_config(vllm_text())
    assert cc["num_gpu_blocks"] == 26040 and cc["block_size"] == 16
    assert cc["num_cpu_blocks"] is None and cc["enable_prefix_caching"] is True
    assert cc["gpu_memory_utilization"] == 0.8


def test_parse_error_is_clear():
    with pytest.raises(prom.MetricsParseError):
        prom.parse("vllm:foo{bad 1 2 3 4\n")


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""
    auth: list[str | None] = []  # the Authorization header of every GET, in order
    served = threading.Semaphore(0)  # released once per answered GET

    def do_GET(self):  # noqa: N802
        _Handler.auth.append(self.headers.get("Authorization"))
        try:
            if self.path != "/metrics":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(self.body)
        finally:
            _Handler.served.release()

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_server():
    _Handler.body = vllm_text().encode()
    _Handler.auth = []
    _Handler.served = threading.Semaphore(0)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_fetch_metrics_ok_and_errors(metrics_server):
    text = prom.fetch_metrics(metrics_server + "/metrics", timeout=5)
    assert prom.total(text, prom.GENERATION_TOKENS) == 100.0
    with pytest.raises(prom.MetricsUnavailable, match="HTTP 404"):
        prom.fetch_metrics(metrics_server + "/nope", timeout=5)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(prom.MetricsUnavailable, match="127.0.0.1"):
        prom.fetch_metrics(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_poller_hands_each_page_over_and_counts_what_fails(metrics_server):
    """MetricsPoller (the capacity and memory samplers' loop): every scrape reaches ``take`` with its monotonic
    time and the bearer token; a ``take`` that raises and a scrape that fails are counted, and the loop goes on."""
    pages: list[tuple[float, str]] = []
    third = threading.Event()

    def take(t, text):
        pages.append((t, text))
        if len(pages) == 2:
            raise ValueError("an unreadable page")
        if len(pages) == 3:
            third.set()

    poller = prom.MetricsPoller(metrics_server + "/metrics", 0.01, take, timeout=5, api_key="k", name="p").start()
    assert third.wait(10), "the poller did not scrape three times in 10 s"
    poller.stop(join_timeout=10)
    assert not poller._thread.is_alive() and poller._thread.name == "p"
    assert poller.errors == 1 and len(pages) >= 3
    assert all(text == _Handler.body.decode() for _, text in pages)
    ts = [t for t, _ in pages]
    assert ts == sorted(ts) and len(set(ts)) == len(ts) and ts[-1] <= time.monotonic()
    assert set(_Handler.auth) == {"Bearer k"}

    _Handler.served = threading.Semaphore(0)
    taken = threading.Event()
    bad = prom.MetricsPoller(metrics_server + "/nope", 0.01, lambda t, text: taken.set(), timeout=5).start()
    assert _Handler.served.acquire(timeout=10) and _Handler.served.acquire(timeout=10), "no two scrapes in 10 s"
    bad.stop(join_timeout=10)  # the second 404 is answered: its scrape has failed once the thread has ended
    assert bad.errors >= 2 and not taken.is_set() and not bad._thread.is_alive()
