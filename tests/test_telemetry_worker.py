"""specstudy.measure.telemetry_worker: the cells' telemetry sampled in a process of its own (issue 28 item 6)."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading

import pytest

from conftest import CpuShare, data_path, wait_for_rows
from specstudy.core import atomic
from specstudy.measure import telemetry, telemetry_worker

H200_PAGE = data_path("gpu", "metrics-vllm-0.23.0-h200.prom")


class _Page(http.server.BaseHTTPRequestHandler):
    body = b""
    pids: list[int] = []

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)


@pytest.fixture
def h200_metrics():
    """A real vLLM 0.23 /metrics page (57 KB, the page that starved the capacity search) served locally."""
    _Page.body = H200_PAGE.read_bytes()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    srv.shutdown()


@pytest.fixture
def burner():
    p = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<60: pass"],
                         start_new_session=True)
    yield p
    p.kill()
    p.wait()


def test_the_sampler_runs_in_another_process_and_writes_what_the_thread_would(tmp_path, h200_metrics, burner):
    out = tmp_path / "cell" / "telemetry.jsonl"
    with telemetry_worker.SamplerProcess() as worker:
        assert worker.pid != os.getpid() and worker.alive()
        got = CpuShare(burner.pid)
        sampler = telemetry.TelemetrySampler(out, metrics_url=h200_metrics, pgid=burner.pid, interval_s=0.05,
                                             gpu=False, worker=worker).start()
        wait_for_rows(out, 3)
        assert not out.exists()  # renamed into place only at stop, as in the thread
        s = sampler.stop()
        share = got.pct()
        rows = atomic.read_jsonl(out)
        # one process serves the next cell's sampler too
        second = telemetry.TelemetrySampler(tmp_path / "c2" / "telemetry.jsonl", metrics_url=h200_metrics,
                                            pgid=burner.pid, interval_s=0.05, gpu=False, worker=worker).start()
        wait_for_rows(tmp_path / "c2" / "telemetry.jsonl", 2)
        assert second.stop()["samples"] >= 3
    assert not worker.alive()
    assert s["process"] == "worker" and s["samples"] == len(rows) >= 4  # stop() adds the window's last sample
    assert s["hardware_source"] == "psutil" and s["errors"] == {}
    assert s["gpm"] == "unavailable: GPU sampling is off"  # the child's summary carries the GPM block too
    # the real page's gauges, parsed in the child exactly as the thread parses them here
    expected = telemetry.parse_vllm_gauges(H200_PAGE.read_text())
    assert {k: rows[0][k] for k in expected} == expected
    assert all(r["proc.count"] == 1 for r in rows)
    # the burner's busy loop, seen from the child: as much CPU as it got, however loaded the machine is
    assert share > 1 and s["series"]["proc.cpu_pct"]["mean"] >= 0.4 * share, (share, s["series"]["proc.cpu_pct"])


def test_a_worker_that_dies_leaves_the_cell_without_telemetry_and_says_why(tmp_path, h200_metrics):
    out = tmp_path / "telemetry.jsonl"
    worker = telemetry_worker.SamplerProcess()
    try:
        sampler = telemetry.TelemetrySampler(out, metrics_url=h200_metrics, interval_s=0.05, gpu=False,
                                             worker=worker).start()
        wait_for_rows(out, 1)
        os.kill(worker.pid, signal.SIGKILL)
        s = sampler.stop()  # no exception: telemetry never kills a cell
    finally:
        worker.close()
    assert s["samples"] == 0 and s["process"] == "worker"
    (why,) = s["errors"]
    assert why.startswith("worker: telemetry worker") and ("exited" in why or "ended" in why)
    assert "no telemetry" in s["gpu"]["note"] and s["gpm"] == "unavailable: the sampler process failed"


def test_a_sampler_that_cannot_start_there_is_an_error_reply_not_a_dead_worker(tmp_path):
    with telemetry_worker.SamplerProcess() as worker:
        (tmp_path / ".t.jsonl.partial").mkdir()  # the child cannot open its partial file: begin fails there
        s = telemetry.TelemetrySampler(tmp_path / "t.jsonl", interval_s=0.05, gpu=False, worker=worker)
        s.start()
        summary = s.stop()
        assert worker.alive()  # the failed begin was a reply; the process serves the next cell
        ok = telemetry.TelemetrySampler(tmp_path / "u.jsonl", interval_s=0.05, gpu=False, worker=worker).start()
        assert ok.stop()["errors"] == {}
    (why,) = summary["errors"]
    assert "'begin' failed: IsADirectoryError" in why


def test_begin_refuses_arguments_the_sampler_does_not_take():
    with telemetry_worker.SamplerProcess() as worker, pytest.raises(ValueError, match="not a sampler argument"):
        worker.begin({"out_path": "x", "nvml": "fake"})
    with pytest.raises(ValueError, match="worker process samples with its own NVML"):
        telemetry.TelemetrySampler("x", nvml=object(), worker=object())


def test_serve_answers_each_line_and_stops_a_running_sampler_at_end_of_input(tmp_path):
    import io
    import json

    out = tmp_path / "t.jsonl"
    lines = [{"op": "ping"}, {"op": "end"}, {"op": "nope"},
             {"op": "begin", "args": {"out_path": str(out), "interval_s": 0.05, "gpu": False}},
             {"op": "begin", "args": {"out_path": str(out), "interval_s": 0.05, "gpu": False}}]
    stdout = io.StringIO()
    assert telemetry_worker.serve(io.StringIO("".join(json.dumps(x) + "\n" for x in lines)), stdout) == 0
    replies = [json.loads(x) for x in stdout.getvalue().splitlines()]
    assert replies[0] == {"ok": True, "pid": os.getpid()}
    assert replies[1] == {"ok": False, "error": "RuntimeError: no sampler is running"}
    assert replies[2] == {"ok": False, "error": "ValueError: unknown op 'nope'"}
    assert replies[3] == {"ok": True}
    assert replies[4]["ok"] is False and "already running" in replies[4]["error"]
    assert out.exists()  # end of input stopped the running sampler, which renamed its file into place
