"""Live progress of a deployment job, its phase timeline, the duty cycle and the cost preview.

The end-to-end test runs the real deployment job (``specstudy deployment run``, as Snakemake runs
it: stdout and stderr redirected to a log file) against a fake vLLM (tests/progress_fake_vllm.py)
and reads the log WHILE the job runs: progress lines must arrive at least every few seconds, in
every phase (launching, smoke, cell i/N warm-up/measure/drain, stopping).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specstudy.core import atomic, schemas
from specstudy.measure.progress import Progress
from specstudy.study import cost, duty
from specstudy.study.config import load_config

ROOT = Path(__file__).resolve().parents[1]
INTERVAL_S = 5.0  # the default heartbeat of specstudy.measure.progress


class Clock:
    def __init__(self):
        self.t = 1_000_000.0

    def __call__(self):
        return self.t


def test_progress_lines_eta_and_timeline():
    clock, out = Clock(), io.StringIO()
    p = Progress("dep-x", stream=out, total_requests=20, clock=clock, live=False)
    p.phase("launch")
    clock.t += 30
    p.end_phase()
    p.set_context("cell 1/2 code c4")
    p.phase("measure", cell="code/c4")
    p.start_requests(10)
    for _ in range(10):
        clock.t += 1
        p.request_done({"completion_tokens": 50})
    assert p.eta_seconds() == pytest.approx(10.0)  # 10 requests left at 1 s each
    assert p.tokens_per_second() == pytest.approx(500 / 9, rel=0.01)
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[progress 00:00:00] launch")
    assert any("cell 1/2 code c4 | measure | requests 10/10 | deployment requests 10/20" in x for x in lines), lines
    tl = p.timeline()
    assert [e["phase"] for e in tl] == ["launch", "measure"]
    assert tl[0]["seconds"] == 30 and tl[1]["cell"] == "code/c4" and tl[1]["seconds"] == 10


def _corpus(d: Path, name: str, n: int, max_tokens: int) -> str:
    rows = [{"prompt_id": f"{name}-{i}", "stratum": "s", "max_tokens": max_tokens,
             "messages": [{"role": "user", "content": f"prompt {i}"}]} for i in range(n)]
    atomic.write_jsonl(d / name / "prompts.jsonl", rows)
    atomic.write_json(d / name / "corpus.json", {"name": name, "version": "1", "digest": f"digest-{name}"})
    return str(d / name)


def _plan_and_settings(tmp_path: Path) -> tuple[dict, dict]:
    """A one-deployment plan and the deployment settings of a study (the job reads its spec from both);
    the corpora are small fakes where the embedded specs' names put them (results/corpora/<name>/<version>)."""
    fakepy = tmp_path / "fakepy"
    fakepy.write_text(f'#!/bin/sh\nshift 2\nexec "{sys.executable}" "{ROOT / "tests" / "progress_fake_vllm.py"}" "$@"\n')
    fakepy.chmod(0o755)
    _corpus(tmp_path / "results" / "corpora" / "bundled-code", "1", 12, 40)
    _corpus(tmp_path / "results" / "corpora" / "bundled-smoke", "1", 2, 8)
    plan = {"schema": "specstudy.plan/1", "phase": "screen", "seed": 1, "design": {},
            "arms": [{"name": "baseline", "method": "baseline"}], "skipped": [],
            "deployments": [{"phase": "screen", "arm": "baseline", "rep": "rep1", "kind": "repeat", "block": 1,
                             "order": 0, "after": None, "cells": [{"workload": "code", "concurrency": 1},
                                                   {"workload": "code", "concurrency": 2}]}]}
    settings = {
        "study": {"name": "t", "seed": 1},
        "corpora": {"workloads": {"code": str(ROOT / "corpora" / "embedded" / "code.yaml")},
                    "smoke": str(ROOT / "corpora" / "embedded" / "smoke.yaml")},
        "engine": {"backend": "local", "python": str(fakepy),
                   "target": {"path": str(tmp_path), "served_model_name": "fake", "tensor_parallel_size": 1,
                              "max_model_len": 1024},
                   "server": {"ready_timeout_s": 60, "stop_grace_s": 5,
                              "env": {"FAKE_STARTUP_S": "7", "FAKE_TOKEN_DELAY_MS": "25"}}},
        "cells": {"requests": 8, "warmup_requests": 2, "temperature": 0.0, "seed": 1,
                  "request_timeout_s": 60, "drain_timeout_s": 10, "reuse_valid": True,
                  "client_limits": {"event_loop_lag_p99_ms": 1000, "cpu_share": 1.0, "pool_wait_p99_ms": 1000}},
    }
    return plan, settings


def test_deployment_job_log_shows_progress_while_running(tmp_path):
    plan, settings = _plan_and_settings(tmp_path)
    atomic.write_json(tmp_path / "plan.json", plan)
    atomic.write_json(tmp_path / "deployment-settings.json", settings)
    out = tmp_path / "results" / "screen" / "baseline" / "rep1"
    log = tmp_path / "job.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"))
    env.pop("SPECSTUDY_PROGRESS_TTY", None)
    with open(log, "w") as fh:  # like the rule: specstudy deployment run ... > {log} 2>&1
        proc = subprocess.Popen([sys.executable, "-m", "specstudy.cli", "deployment", "run", "--plan", "plan.json",
                                 "--deployment", "screen/baseline/rep1", "--config", "deployment-settings.json",
                                 "--out", str(out)], stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    seen: dict[str, float] = {}  # progress line -> when the test first read it from the log

    def read_log() -> None:
        for line in log.read_text().splitlines():
            if line.startswith("[progress") and line not in seen:
                seen[line] = time.monotonic()

    # The log is sampled every 0.25 s because WHEN each line appears is what this test measures (not a wait
    # for a state): the job is killed at the deadline, and then its exit status below fails the test.
    t0 = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - t0 < 240:
            read_log()
            time.sleep(0.25)
        read_log()  # what the job wrote between the last sample and its exit (its stop line) is not missed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.wait() == 0, log.read_text()
    text = log.read_text()
    live = sorted(seen.values())
    assert len(live) >= 6, text
    gaps = [b - a for a, b in zip([t0] + live, live, strict=False)]
    assert max(gaps) <= INTERVAL_S + 2.5, f"gap of {max(gaps):.1f} s between progress lines:\n{text}"
    lines = list(seen)
    assert any(re.search(r"\] launch \|.*elapsed", x) for x in lines), text  # heartbeat while the server loads
    for needle in ("] smoke capture 1/2", "cell 1/2 code c1 | warmup", "cell 2/2 code c2 | measure", "| drain",
                   "out tok/s", "deployment requests", "ETA 00:", "] stop"):
        assert any(needle in x for x in lines), f"{needle!r} not seen while running:\n{text}"
    assert re.search(r"requests [1-8]/8", "\n".join(lines)), text  # requests done/total during a window
    rec = atomic.read_json(out / "deployment.json")
    schemas.validate(rec, "deployment", "deployment.json")
    phases = [e["phase"] for e in rec["phases"]]
    assert phases[0] == "launch" and rec["phases"][0]["seconds"] >= 6.5
    assert phases.count("smoke") == 2 and phases.count("warmup") == 2 and phases.count("measure") == 2
    assert phases.count("drain") == 2 and phases[-1] == "stop"
    s = duty.split(rec)
    assert s["timeline"] and s["total"] >= s["launch"] + s["measure"]
    assert 0.2 < s["launch"] / s["total"] < 0.8


def test_duty_cycle_from_records(tmp_path):
    def rec(phase, arm, start, ready, stop, phases=None):
        r = {"deployment_id": f"{phase}-{arm}", "status": "ok",
             "times": {"start": f"2026-12-01T10:00:{start:02d}+00:00", "ready": f"2026-12-01T10:00:{ready:02d}+00:00",
                       "stop": f"2026-12-01T10:00:{stop:02d}+00:00"}}
        if phases:
            r["phases"] = [{"phase": k, "start": "", "end": "", "seconds": v} for k, v in phases]
        atomic.write_json(tmp_path / phase / arm / "rep1" / "deployment.json", r)

    rec("screen", "baseline", 0, 20, 50, [("launch", 20), ("smoke", 5), ("warmup", 5), ("measure", 15), ("stop", 3)])
    rec("screen", "ngram-k2", 0, 10, 50)  # an old record: start-up only
    rows = {r["phase"]: r for r in duty.duty_cycle(duty.records(tmp_path))}
    sc = rows["screen"]
    assert sc["deployments"] == 2 and sc["with_timeline"] == 1 and sc["deployment_seconds"] == 100
    assert sc["launch_share"] == pytest.approx(0.30) and sc["measure_share"] == pytest.approx(0.15)
    assert sc["other_share"] == pytest.approx((2 + 40) / 100)
    assert rows["all"]["deployments"] == 2


@pytest.mark.parametrize("config,profile", [("config/config.yaml", "profiles/local"),
                                            ("config/clariden-70b.yaml", "profiles/clariden")])
def test_cost_preview_of_both_studies(tmp_path, config, profile):
    from specstudy.cli import main

    cfg = load_config(ROOT / config)
    pv = cost.preview(cfg, ROOT / profile, tmp_path / "no-results")
    screen = next(r for r in pv["phases"] if r["phase"] == "screen")
    from specstudy.study import plan

    sp = plan.make_plan(cfg, "screen")
    assert screen["deployments"] == len(sp["deployments"])
    assert screen["cells"] == sum(len(d["cells"]) for d in sp["deployments"])
    # requests and warm-up as the deployment job sends them (the embedded study: 6 at c1, 8 at c8; warm-up
    # by rule, one request per slot)
    from specstudy.job.run import request_counts

    counts = [request_counts(cfg["cells"], c["concurrency"]) for d in sp["deployments"] for c in d["cells"]]
    assert screen["requests"] == sum(n for n, _ in counts)
    assert screen["warmup_requests"] == sum(w for _, w in counts)
    if config == "config/config.yaml":
        assert sorted(set(counts)) == [(6, 1), (8, 8)]  # c1 and c8
    assert pv["total"]["wall_s"] > 0 and pv["total"]["node_hours"] > 0
    assert all(v.startswith("declared") for v in pv["sources"].values())
    if profile == "profiles/clariden":
        assert pv["profile"]["slots"] == 8 and screen["wall_s"] < screen["deployment_s"]
    else:
        assert pv["profile"]["slots"] == 1 and screen["wall_s"] == pytest.approx(screen["deployment_s"])
    assert main(["plan", "--cost", "--config", str(ROOT / config), "--profile", str(ROOT / profile),
                 "--results", str(tmp_path / "no-results")]) == 0


def test_cost_preview_wall_time_is_the_dags_schedule_at_the_profiles_parallelism(tmp_path):
    """The first deployment alone (the others wait for it in the DAG), then the profile's ``jobs`` at a time in
    plan order: the Clariden plan's two blocks are not two chains."""
    raw = yaml.safe_load((ROOT / "profiles/clariden/config.yaml").read_text())
    cfg = load_config(ROOT / "config/clariden-70b.yaml")
    assert cfg["plan"]["blocks"] == 2
    walls = {}
    for jobs in (1, 3, 100):
        profile = tmp_path / f"profile-{jobs}"
        profile.mkdir()
        (profile / "config.yaml").write_text(yaml.safe_dump({"executor": "slurm", "jobs": jobs,
                                                             "resources": {"deployments": 100},
                                                             "set-resources": raw["set-resources"]}))
        pv = cost.preview(cfg, profile, tmp_path / "no-results")
        screen = next(r for r in pv["phases"] if r["phase"] == "screen")
        walls[jobs] = screen["wall_s"]
        assert f"then {jobs} at a time" in cost.render(pv)
    assert walls[1] == pytest.approx(screen["deployment_s"])  # one at a time: the sum
    assert walls[1] > walls[3] > walls[100]
    # 20 deployments, all but the first at once: about two deployments' time, not the half of two chains
    assert walls[100] < screen["deployment_s"] / 5


def test_cost_makespan_runs_the_first_alone_then_fills_slots_in_plan_order():
    assert cost._makespan([10, 1, 1, 1, 1], 2) == 12  # 10 alone, then two at a time: 10 + 1 + 1
    assert cost._makespan([1, 10, 1, 1, 1], 2) == 11  # 1, then 10 | 1+1+1
    assert cost._makespan([1, 10, 1, 1, 1], 1) == 14
    assert cost._makespan([1, 10, 1, 1, 1], 8) == 11
    assert cost._makespan([3, 2, 2], 2, first_alone=False) == 4
    assert cost._makespan([], 4) == 0


def test_cost_preview_uses_measured_records(tmp_path):
    cfg = load_config(ROOT / "config/config.yaml")
    res = tmp_path / "results"
    for i, ready in enumerate((40, 50, 58)):
        atomic.write_json(res / "screen" / f"arm{i}" / "rep1" / "deployment.json", {
            "deployment_id": f"d{i}", "status": "ok",
            "times": {"start": "2026-12-01T10:00:00+00:00", "ready": f"2026-12-01T10:00:{ready:02d}+00:00",
                      "stop": "2026-12-01T10:05:00+00:00"}})
    atomic.write_json(res / "screen" / "arm0" / "rep1" / "code" / "c8" / "summary.json", {
        "keys": {"workload": "code", "concurrency": 8}, "validity": {"valid": True}, "wall_seconds": 6.0,
        "requests": {"attempted": 12}, "drain": {"seconds": 0.2}})
    pv = cost.preview(cfg, ROOT / "profiles/local", res)
    assert pv["figures"]["startup_s"] == 50 and pv["sources"]["startup_s"].startswith("measured")
    # per workload: the code cells at c=8 are measured, open chat at c=8 keeps its declared figure
    assert pv["figures"]["seconds_per_request"]["code"][8] == pytest.approx(0.5)
    assert pv["sources"]["seconds_per_request[code, c=8]"].startswith("measured")
    assert pv["sources"]["seconds_per_request[code, c=1]"].startswith("declared")
    assert pv["sources"]["seconds_per_request[open_chat, c=8]"] == \
        "declared: cost.seconds_per_request.open_chat 0.54 × c^-0.505"
    assert pv["figures"]["seconds_per_request"]["open_chat"][8] == pytest.approx(0.54 * 8 ** -0.505)


def test_cost_per_workload_prices_long_summaries_above_chat(tmp_path):
    """The Clariden preview: a deployment's time grows with its summarization cells' own figure, and a config
    without a figure for one of its workloads is refused naming it."""
    from specstudy.study.config import ConfigError, check_config

    cfg = load_config(ROOT / "config/clariden-70b.yaml")
    base = cost.preview(cfg, None, tmp_path)
    assert base["figures"]["seconds_per_request"]["summarization"][1] == 8.0
    assert base["figures"]["seconds_per_request"]["open_chat"][1] == 2.8
    cheaper = cost.preview(dict(cfg, cost=dict(cfg["cost"], seconds_per_request=dict(
        cfg["cost"]["seconds_per_request"], summarization=2.8))), None, tmp_path)
    screen = {r["phase"]: r for r in base["phases"]}["screen"]
    screen_cheap = {r["phase"]: r for r in cheaper["phases"]}["screen"]
    from specstudy.study.plan import make_plan, request_counts

    sp = make_plan(cfg, "screen")
    extra = sum(sum(request_counts(cfg["cells"], c["concurrency"])) * (8.0 - 2.8) * c["concurrency"] ** -0.87
                for d in sp["deployments"] for c in d["cells"] if c["workload"] == "summarization")
    assert screen["deployment_s"] - screen_cheap["deployment_s"] == pytest.approx(extra)
    spr = dict(cfg["cost"]["seconds_per_request"])
    spr.pop("summarization")
    with pytest.raises(ConfigError, match=r"cost.seconds_per_request': no figure for workload\(s\) summarization"):
        check_config(dict(cfg, cost=dict(cfg["cost"], seconds_per_request=spr)), "clariden.yaml")
    # a figure for a workload the study does not run is harmless (a trimmed copy of a config keeps its figures)
    check_config(dict(cfg, cost=dict(cfg["cost"], seconds_per_request=dict(spr, summarization=8, chat=1))), "c.yaml")


def test_progress_reaches_the_terminal_under_make_study(tmp_path):
    """SPECSTUDY_PROGRESS_TTY=1 (set by `make study`): lines also go to the controlling terminal, while
    stdout (the job log) still gets them; without a terminal nothing breaks."""
    import pty

    log = tmp_path / "job.log"
    # the child ends once its heartbeat has written a line (stdout counted as it is written), not after a fixed time
    code = (f"import sys, threading; sys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
            "from specstudy.measure.progress import Progress\n"
            "class Out:\n"
            "    lines, two = 0, threading.Event()\n"
            "    def write(self, s):\n"
            "        sys.stdout.write(s); Out.lines += s.count('[progress')\n"
            "        if Out.lines >= 2: Out.two.set()\n"
            "    def flush(self): sys.stdout.flush()\n"
            "p = Progress('screen-baseline-rep1', stream=Out(), interval_s=0.2).start(); p.phase('launch')\n"
            "assert Out.two.wait(60), 'no heartbeat line within 60 s'; p.close()\n")
    pid, fd = pty.fork()
    if pid == 0:  # child: its controlling terminal is the pty; stdout goes to the log, like a Snakemake job
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1)
        os.execve(sys.executable, [sys.executable, "-c", code], dict(os.environ, SPECSTUDY_PROGRESS_TTY="1"))
    seen = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.waitpid(pid, 0)
    tty_text = seen.decode()
    assert "[screen-baseline-rep1] [progress 00:00:00] launch" in tty_text, tty_text
    assert tty_text.count("[progress") >= 2  # the heartbeat too
    assert log.read_text().startswith("[progress 00:00:00] launch")
    env = dict(os.environ, SPECSTUDY_PROGRESS_TTY="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          start_new_session=True)  # no controlling terminal at all
    assert proc.returncode == 0 and "[progress" in proc.stdout, proc.stderr


def test_rich_live_status_on_a_terminal():
    out = io.StringIO()
    p = Progress("dep-x", stream=out, live=True, total_requests=4)
    p.phase("measure", cell="code/c1")
    p.start_requests(4)
    p.request_done({"completion_tokens": 3})
    p.close()
    assert "[progress 00:00:00] measure" in out.getvalue()  # phase lines are printed above the live status


def test_capacity_search_prints_each_step_and_soak_with_its_verdict(tmp_path, capsys):
    from specstudy.measure import capacity
    from test_capacity import GATES, synthetic

    search = {"start_rate_rps": 2.0, "growth": 2.0, "resolution_frac": 0.2, "step_duration_s": 8, "warmup_s": 2,
              "soak": {"count": 1, "duration_s": 12}}
    knee = capacity.run_capacity("http://x", "m", [], GATES, search, tmp_path, None, arm="baseline",
                                 step_runner=synthetic(6.0), soak_runner=synthetic(6.0))
    out = capsys.readouterr().out
    assert "[capacity] step 1: offering 2 req/s for 2 s warm-up + 8 s" in out, out
    assert re.search(r"\[capacity\] step \w+ #0: 2 req/s offered, 2 achieved, TTFT p95 120 ms, .* -> PASS; failed gates: none",
                     out), out
    assert re.search(r"-> FAIL; failed gates: [a-z_0-9, ]*ttft", out), out
    assert "[capacity] soak 1: offering" in out and re.search(r"\[capacity\] soak \w+ #0: .* -> (PASS|FAIL)", out), out
    assert f"[capacity] baseline: knee {knee['knee_rps']:.4g} req/s, status {knee['status']}" in out
