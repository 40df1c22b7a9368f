"""Only the study reaches a deployment: a server on loopback needs no key; bound to anything else it gets a new
random API key per deployment, passed as VLLM_API_KEY (never on the command line), sent by the load generator and
written to no file of the results."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specstudy.core import atomic
from specstudy.job.spec import engine_flat, is_loopback
from test_progress import _plan_and_settings

ROOT = Path(__file__).resolve().parents[1]
TARGET = {"path": "/m", "served_model_name": "m", "tensor_parallel_size": 1, "max_model_len": 512}


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False), ("::", False),
                                            ("10.1.2.3", False), ("nid005424", False)])
def test_which_hosts_are_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_a_server_off_loopback_gets_a_new_random_key_per_deployment(monkeypatch):
    loop = engine_flat({"target": TARGET, "server": {"host": "127.0.0.1"}})
    assert loop["api_key"] is None and engine_flat({"target": TARGET})["api_key"] is None  # the default: loopback
    keys = {engine_flat({"target": TARGET, "server": {"host": "0.0.0.0"}})["api_key"] for _ in range(3)}
    assert len(keys) == 3 and all(len(k) >= 40 for k in keys)  # 32 random bytes each, never reused
    monkeypatch.setenv("MY_KEY", "operator-key-123")
    assert engine_flat({"target": TARGET, "server": {"host": "0.0.0.0", "api_key_env": "MY_KEY"}})["api_key"] == \
        "operator-key-123"
    # the production study runs its load generator on the server's node: loopback, nothing else reaches it
    clariden = yaml.safe_load((ROOT / "config" / "clariden-70b.yaml").read_text())
    assert is_loopback(clariden["engine"]["server"]["host"])


def test_a_deployment_off_loopback_sends_its_key_and_no_file_of_it_holds_the_key(tmp_path):
    """The deployment job against the fake vLLM (tests/progress_fake_vllm.py), bound to 0.0.0.0: the fake refuses
    /v1 requests without the key (as vLLM does) and refuses a key on its command line, echoes the key to its log
    and tells the test which key it got; every file the deployment wrote is then searched for it."""
    plan, settings = _plan_and_settings(tmp_path)
    settings["engine"]["server"].update(host="0.0.0.0")
    settings["engine"]["server"]["env"].update(FAKE_STARTUP_S="0", FAKE_TOKEN_DELAY_MS="5")
    atomic.write_json(tmp_path / "plan.json", plan)
    atomic.write_json(tmp_path / "deployment-settings.json", settings)
    out = tmp_path / "results" / "screen" / "baseline" / "rep1"
    seen = tmp_path / "seen-key"  # outside the results
    log = tmp_path / "results" / "logs" / "deploy" / "screen-baseline-rep1.log"  # the rule's log: results too
    log.parent.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"), FAKE_SEEN_KEY_FILE=str(seen))
    with open(log, "w") as fh:
        rc = subprocess.run([sys.executable, "-m", "specstudy.cli", "deployment", "run", "--plan", "plan.json",
                             "--deployment", "screen/baseline/rep1", "--config", "deployment-settings.json",
                             "--out", str(out)], stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                            timeout=300).returncode
    assert rc == 0, log.read_text()
    key = seen.read_text()
    assert len(key) >= 40, "the server got no key"
    rec = atomic.read_json(out / "deployment.json")
    assert rec["status"] == "ok" and [c["status"] for c in rec["cells"]] == ["valid", "valid"]  # the key was sent
    deltas = atomic.read_json(out / "code" / "c2" / "summary.json")["server_deltas"]
    assert deltas["foreign_request_check"] == "done" and deltas["requests_received"] == deltas["requests_sent"] == 8
    attempt = out / "attempts" / rec["deployment_id"]
    assert "VLLM_API_KEY=***REDACTED***" in (attempt / "launch.log").read_text()  # the engine's echo, redacted
    files = [p for p in (tmp_path / "results").rglob("*") if p.is_file()]
    assert len(files) > 15 and any(p.name == "requests.jsonl" for p in files)
    leaked = [str(p.relative_to(tmp_path)) for p in files if key.encode() in p.read_bytes()]
    assert leaked == []


def test_the_report_names_the_cells_that_saw_requests_the_load_generator_did_not_send():
    import json

    from specstudy.report.blocks import render_markdown
    from specstudy.report.sections.validity import foreign_section

    detail = "server answered 51 API requests in the window, the load generator sent 48: 3 came from another client"
    cells = [{"phase": "confirm", "arm": "ngram-k3", "rep": 2, "workload": "code", "concurrency": 8,
              "invalid_reasons": "foreign_traffic", "requests_attempted": 48,
              "invalid_details": json.dumps([{"code": "foreign_traffic", "detail": detail}]),
              "server_deltas.requests_received": 51.0, "server_deltas.requests_finished": 48.0,
              "server_deltas.requests_not_sent_by_loadgen": 3.0, "server_deltas.foreign_request_check": "done"},
             {"phase": "confirm", "arm": "baseline", "rep": 2, "workload": "code", "concurrency": 8,
              "invalid_reasons": "", "requests_attempted": 48, "server_deltas.requests_received": 48.0,
              "server_deltas.foreign_request_check": "done"},
             {"phase": "confirm", "arm": "baseline", "rep": 1, "workload": "code", "concurrency": 8,
              "invalid_reasons": "loadgen_limited", "requests_attempted": 48}]
    B: list = []
    foreign_section(B, cells)
    md = render_markdown(B)
    assert "1 cell(s) saw traffic of another client" in md and "compared in 2 of 3 cells" in md
    assert f"| confirm | ngram-k3 | 2 | code | 8 | 48 | 51 | 48 | 3 | {detail} |" in md
    assert "| baseline |" not in md
