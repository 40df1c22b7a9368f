"""Stopping a server from a signal handler (issue #31): a SIGTERM/SIGINT that lands while the job's main thread
is itself inside ``Server.stop`` must neither deadlock (the old non-reentrant ``_stop_lock``) nor cut the running
stop short; a stop under way in another thread (idle watchdog) is waited for.

Each scenario runs in its own interpreter (a deadlock there fails the test at its deadline instead of hanging the
suite); the signal is sent at an exact point of the stop (right after the SIGTERM to the server's group), so the
race that a real Ctrl-C only sometimes hits happens every time. The "server" is a child that ignores SIGTERM, so
the stop has to wait out its grace period and SIGKILL it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from test_deploy import fake_python as fake_python  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]

SCENARIO = r"""
import json, os, signal, subprocess, sys, threading, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from specstudy.deployment import launch, readiness

where, log = sys.argv[2], Path(sys.argv[3])
child = subprocess.Popen([sys.executable, "-c",
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('child-ready', flush=True); "
    "time.sleep(600)"], stdout=subprocess.PIPE, text=True, process_group=0)
assert child.stdout.readline().strip() == "child-ready"
print(f"child {child.pid}", flush=True)
srv = launch.Server(proc=child, log_path=log, base_url="http://127.0.0.1:9", served_model_name="m",
                    command=["fake"], record_command=["fake"])
real_signal_all = launch._signal_all
sent = threading.Event()

def signal_all(pgid, pids, sig):
    real_signal_all(pgid, pids, sig)
    if sig == signal.SIGTERM and not sent.is_set():  # the job is now inside Server.stop, holding its lock
        sent.set()
        os.kill(os.getpid(), signal.SIGINT)

launch._signal_all = signal_all
result = {}
try:
    with readiness.stop_on_signals(lambda: srv, grace_s=1.0):
        if where == "main":      # the job's own stop (its finally) is interrupted by the signal
            srv.stop(grace_s=1.0, reason="finished")
            result["returned"] = True
        else:                    # the idle watchdog's thread is stopping when the signal reaches the main thread
            with readiness.IdleWatchdog(srv, idle_s=0.05, grace_s=1.0, check_s=0.02):
                if not sent.wait(30):
                    raise SystemExit("the watchdog never stopped the server")
                time.sleep(30)   # interrupted by the handler; never returns normally
            result["returned"] = True
except readiness.TerminatedBySignal as exc:
    result["terminated"] = exc.code
result["stop_report"] = srv.stop_report
result["child_exit"] = child.poll()
print("RESULT " + json.dumps(result), flush=True)
"""


def _run(where: str, tmp_path: Path) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", SCENARIO, str(ROOT / "scripts"), where, str(tmp_path / "log")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        out = ""
        pytest.fail(f"the job deadlocked: a signal during Server.stop ({where}) never let it finish")
    finally:
        _kill_tree(proc)
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, out[-3000:]
    child = int(next(x for x in out.splitlines() if x.startswith("child ")).split()[1])
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    return json.loads(lines[0][len("RESULT "):])


def _kill_tree(proc: subprocess.Popen) -> None:
    """The scenario and its child each lead a process group; kill both whatever happened."""
    pids = [proc.pid]
    try:
        pids += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        pass
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait(timeout=10)


def test_signal_inside_the_jobs_own_stop_lets_the_stop_finish_then_terminates(tmp_path):
    r = _run("main", tmp_path)
    assert r.get("terminated") == 128 + signal.SIGINT and "returned" not in r, r
    rep = r["stop_report"]
    # the interrupted stop ran to its end: SIGTERM ignored, grace period, SIGKILL, nothing left
    assert rep["reason"] == "finished" and rep["sigterm"] and rep["sigkill"] and rep["remaining"] == [], rep
    assert r["child_exit"] == -signal.SIGKILL


def test_signal_while_the_watchdog_stops_waits_for_that_stop(tmp_path):
    r = _run("watchdog", tmp_path)
    assert r.get("terminated") == 128 + signal.SIGINT and "returned" not in r, r
    rep = r["stop_report"]
    assert rep["reason"] == "idle_timeout" and rep["sigkill"] and rep["remaining"] == [], rep
    assert r["child_exit"] == -signal.SIGKILL


def test_server_reports_stopping_while_its_stop_runs(tmp_path, monkeypatch):
    """The death watch tells "stopped by us" from a crash by ``Server.stopping`` (set before any signal)."""
    from specstudy.deployment import launch

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], process_group=0)
    srv = launch.Server(proc=child, log_path=tmp_path / "log", base_url="http://127.0.0.1:9", served_model_name="m",
                        command=["x"], record_command=["x"])
    seen = []
    real = launch._signal_all

    def spy(pgid, pids, sig):
        seen.append(srv.stopping)
        real(pgid, pids, sig)

    monkeypatch.setattr(launch, "_signal_all", spy)
    try:
        assert not srv.stopping
        srv.stop(grace_s=5)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)
    assert seen and all(seen) and srv.stopping and srv.stop_report["graceful"]


JOB = r"""
import json, os, signal, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from specstudy.core import atomic
from specstudy.measure import greedy_capture
from specstudy.measure import cell as cellmod
from specstudy.deployment import launch
from specstudy.job.run import run_deployment

greedy_capture.capture_greedy = lambda url, served, prompts, path, **k: atomic.write_json(path, {"fake": True})

def run_cell(base_url, served, reqs, warm, conc, cdir, *, keys, corpus, fingerprint, **k):
    summary = {"keys": keys, "corpus": corpus, "fingerprint": fingerprint, "validity": {"valid": True, "reasons": []}}
    atomic.write_json(cdir / "summary.json", summary)
    return summary

cellmod.run_cell = run_cell
real_signal_all, sent = launch._signal_all, []

def signal_all(pgid, pids, sig):
    real_signal_all(pgid, pids, sig)
    if sig == signal.SIGTERM and not sent:  # the job's own final stop is under way: scancel lands now
        sent.append(pgid)
        print(f"HANDSHAKE stopping {pgid}", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

launch._signal_all = signal_all
spec = json.loads(open(sys.argv[3]).read())
sys.exit(run_deployment(spec, sys.argv[4], results_root=sys.argv[5]))
"""


def test_a_signal_while_the_job_stops_its_server_is_a_cancelled_deployment(tmp_path, fake_python):
    """The job measured its cells and is stopping the server when SIGTERM arrives (the race of the SIGINT and
    scancel tests): the stop completes, the job records a cancelled deployment and exits 128+SIGTERM."""
    from specstudy.core import atomic
    from test_deploy import BASELINE, fake_engine_section, job_spec

    spec = job_spec(tmp_path, BASELINE, fake_engine_section(tmp_path, fake_python, env={"FAKE_MODE": "stubborn"},
                                                            stop_grace_s=2))
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "results" / "screen" / "baseline" / "rep1"
    proc = subprocess.Popen([sys.executable, "-c", JOB, str(ROOT / "scripts"), str(ROOT / "tests"),
                             str(tmp_path / "spec.json"), str(out), str(tmp_path / "results")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0)
    try:
        log, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        log = ""
        pytest.fail("the job deadlocked: SIGTERM during its final Server.stop never let it finish")
    finally:
        _kill_tree(proc)
    assert proc.returncode == 128 + signal.SIGTERM, log[-3000:]
    pgid = int(next(x for x in log.splitlines() if x.startswith("HANDSHAKE stopping")).split()[-1])
    assert not [p for p in psutil.process_iter() if _pgid(p) == pgid], "the stubborn server outlived the job"
    assert not (out / "deployment.json").exists()  # cancelled: nothing published, the study resumes
    (failure,) = (tmp_path / "results" / "deployment-failures").rglob("failure.json")
    rec = atomic.read_json(failure)["failure"]
    assert rec["stage"] == "cancelled" and "while stopping the server" in rec["message"], rec
    record = atomic.read_json(next((out / "attempts").glob("*/record.json")))
    assert record["provenance"]["stop"]["sigkill"] is True and record["provenance"]["stop"]["remaining"] == []


def _pgid(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid) if p.status() != psutil.STATUS_ZOMBIE else None
    except (ProcessLookupError, psutil.Error):
        return None
