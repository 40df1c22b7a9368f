"""Re-running one cell by its path on a finished study (issue #33): nothing changes that did not change.

The module builds one finished mini-study of the embedded default (a copy of the workflow, as the fault
tests do): every deployment with its attempt (cells with the fingerprints the deployment job computes, a
schema-valid record), the gates, tables, report and capacity results written as files, and everything that
only reads files run by the real Snakemake (select, plan_confirm, the round checkpoints, final_candidate);
then ``snakemake --touch --forceall all`` records every job's metadata, so the tree is what a finished
``make study`` leaves: Snakemake has recorded every job's inputs and their sha256. A deployment job re-run by its path
runs for real (``specstudy deployment run``): its cells are valid with the same fingerprint, so it reuses
them and starts no server (vLLM only has to exist). Each test works on its own copy of the finished tree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_workflow_dag import CLEAR, ROOT, _corpus_dirs, fake_cell_summary, fake_planned, job_counts, sm, workflow_copy

sys.path.insert(0, str(ROOT / "scripts"))

from specstudy.core import atomic  # noqa: E402

SPEED = {"baseline": 10.0, "draft-k2-tp1": 7.0, "draft-k4-tp1": 7.5, "ngram-k2": 9.0, "ngram-k4": 9.5}
SELECTION = "results/selection/selection.json"
CONFIRM_PLAN = "results/plan/confirm.json"


def _env() -> dict:
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                PYTHONPATH=str(ROOT / "scripts"))


def _settings(wd: Path):
    from specstudy.job.spec import load_settings
    from specstudy.study.config import effective_config_files, load_config

    cfg = load_config(wd / "config" / "config.yaml")
    dep_cfg = next(p for p in effective_config_files(cfg) if "deployment-" in p)
    return load_settings(wd / dep_cfg)


def _fake_deployment(wd: Path, plan_path: str, key: str, settings: dict, lock_sha: str, speedup: float) -> None:
    """One deployment as the deployment job leaves it: its attempt (cells, record.json, smoke captures named)
    and the declared copies, every cell valid with the fingerprint the job computes for it."""
    from specstudy.core import schemas
    from specstudy.core.records import read_plan
    from specstudy.job.spec import deployment_spec, fingerprint, fingerprint_context

    spec = deployment_spec(read_plan(plan_path), key, settings)
    ctx = fingerprint_context(spec)
    phase, arm, rep = key.split("/")
    dep_id = f"{phase}-{arm}-{rep}-t0"
    out = Path("results") / phase / arm / rep
    attempt = out / "attempts" / dep_id
    cells = []
    for c in spec["cells"]:
        w, conc = c["workload"], int(c["concurrency"])
        s = fake_cell_summary(phase, arm, rep, w, conc, tpot_p50_ms=SPEED.get(arm, 10.0) * conc / speedup,
                              output_tokens_per_second=100.0 * speedup * (SPEED["baseline"] / SPEED.get(arm, 10.0)))
        s["keys"]["deployment_id"] = dep_id
        s["fingerprint"] = fingerprint(spec, c, "x" * 64, ctx)
        src = attempt / w / f"c{conc}" / "summary.json"
        atomic.write_json(src, s)
        atomic.write_bytes(out / w / f"c{conc}" / "summary.json", src.read_bytes())
        cells.append({"workload": w, "concurrency": conc, "summary": str(src), "status": "valid",
                      "deployment_id": dep_id})
    caps = [str(attempt / "smoke" / f"capture-{i}.json") for i in (1, 2)]
    rec = {"schema": "specstudy.deployment/1", "deployment_id": dep_id, "phase": phase, "arm": spec["arm"],
           "rep": int("".join(ch for ch in rep if ch.isdigit())), "rep_label": rep, "kind": spec["kind"],
           "status": "ok", "failure": None, "command": ["vllm", "serve"], "provenance": None, "confounds": None,
           "startup": None, "cache_config": None, "smoke": {"captures": caps}, "cells": cells,
           "times": {"start": "2026-12-01T10:00:00+00:00", "ready": "2026-12-01T10:00:10+00:00",
                     "stop": "2026-12-01T10:01:00+00:00"},
           "prereg_sha256": lock_sha, "block": spec["block"], "order": spec["order"], "phases": []}
    schemas.validate(rec, "deployment", str(attempt / "record.json"))
    atomic.write_json(attempt / "record.json", rec)
    atomic.write_bytes(out / "deployment.json", (attempt / "record.json").read_bytes())


def _build(wd: Path) -> None:
    from specstudy.core.records import read_plan
    from specstudy.study import plan as planmod

    cfg, _, write = fake_planned(wd)  # models, corpora, lock, the real screening plan (and os.chdir(wd))
    for d in _corpus_dirs(wd).values():  # the deployment job reads the smoke prompts before it decides to reuse
        atomic.write_jsonl(wd / d / "prompts.jsonl", [{"prompt_id": "p0", "stratum": "s", "max_tokens": 8,
                                                       "messages": [{"role": "user", "content": "hi"}]}])
    settings = _settings(wd)
    lock_sha = planmod.prereg_lock(cfg)["sha256"]
    for d in read_plan("results/plan/screen.json").deployments:
        _fake_deployment(wd, "results/plan/screen.json", f"screen/{d.arm}/{d.rep}", settings, lock_sha, 1.0)
    for arm in SPEED:
        if arm != "baseline":
            atomic.write_json(f"results/gates/screen/{arm}.json", {"arm": arm, "phase": "screen", "verdict": "pass"})
    sm(wd, SELECTION, CONFIRM_PLAN)  # the real select and plan_confirm
    sel = atomic.read_json(SELECTION)
    for d in read_plan(CONFIRM_PLAN).deployments:
        if d.kind == "repeat" and d.round > 3:
            continue
        sp = 1.0 if d.arm == "baseline" else CLEAR.get(d.arm, [1.2] * 5)[(d.round or 1) - 1]
        _fake_deployment(wd, CONFIRM_PLAN, f"confirm/{d.arm}/{d.rep}", settings, lock_sha, sp)
    for arm in sel["confirmation_arms"]:
        if arm != "baseline":
            atomic.write_json(f"results/gates/confirm/{arm}.json", {"arm": arm, "phase": "confirm", "verdict": "pass"})
    sm(wd, "results/confirm/rounds/round3.json", "results/selection/final-candidate.json")  # real checkpoints
    final = atomic.read_json("results/selection/final-candidate.json")["arm"]
    for arm in ("baseline", final):
        atomic.write_json(f"results/capacity/{arm}/knee.json", {"knee_rps": 5.0, "arm": arm})
    for f in ("cells", "requests", "deployments", "gates"):
        atomic.write_text(f"results/tables/{f}.parquet", "faked\n")
    for f in ("report.md", "report.html", "recommendation.json"):
        atomic.write_text(f"results/report/{f}", "faked\n")
    (wd / "results/report/plots").mkdir(parents=True, exist_ok=True)
    sm(wd, "--touch", "--forceall", "all")  # every job's metadata (input sha256s), as a finished run leaves it
    del write


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished mini-study (built once per module; each test copies it)."""
    cwd = os.getcwd()
    wd = workflow_copy(tmp_path_factory.mktemp("finished"))
    try:
        _build(wd)
    finally:
        os.chdir(cwd)
    assert "Nothing to be done" in sm(wd, "-n", "all").stdout, "the finished mini-study is not finished"
    return wd


@pytest.fixture()
def study(finished, tmp_path):
    dest = tmp_path / "study"
    shutil.copytree(finished, dest, symlinks=True)
    return dest


def _bytes(root: Path, paths) -> dict[str, tuple[bytes, int]]:
    return {p: ((root / p).read_bytes(), (root / p).stat().st_mtime_ns) for p in paths}


def _check_results(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specstudy.cli", "check-results", *args], cwd=root,
                          capture_output=True, text=True, timeout=120, env=_env())


def _nothing_to_do(root: Path, target: str = "all") -> None:
    proc = sm(root, "-n", target, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Nothing to be done" in out, out[-3000:]
    assert "Traceback" not in out


def _remeasured(root: Path, cell: str, tpot_factor: float) -> None:
    """What a re-run deployment that measured ``cell`` again leaves: a new attempt (new deployment id) whose
    summary differs, published as the declared cell."""
    src = root / cell
    s = json.loads(src.read_text())
    rel = Path(cell)
    new_id = s["keys"]["deployment_id"] + "-again"
    s["keys"]["deployment_id"] = new_id
    s["latency_ms"]["tpot"]["p50"] *= tpot_factor
    attempt = root / Path(*rel.parts[:4]) / "attempts" / new_id / rel.parts[4] / rel.parts[5] / "summary.json"
    atomic.write_json(attempt, s)
    atomic.write_bytes(src, attempt.read_bytes())


# ------------------------------------------------------------------ the four steps, screening cell

def test_rerun_of_an_unchanged_screening_cell_leaves_the_study_as_it_was(study):
    dep = "results/screen/ngram-k4/rep1"
    cell = f"{dep}/code/c4/summary.json"
    kept = [SELECTION, CONFIRM_PLAN, f"{dep}/deployment.json", "results/gates/screen/ngram-k4.json",
            *[str(p.relative_to(study)) for p in (study / dep).glob("*/c*/summary.json")]]
    before = _bytes(study, kept)
    # 1. remove the cell and ask for it by its path: the deployment job runs for real, finds every cell valid
    #    in its attempt and republishes them without a server
    (study / cell).unlink()
    sm(study, cell)
    after = _bytes(study, kept)
    for p in kept:  # the same content; files the job did not have to write keep their time too
        assert after[p][0] == before[p][0], f"{p} changed content on a no-op re-run"
        if p != cell and not p.startswith(dep):
            assert after[p][1] == before[p][1], f"{p} was rewritten"
    log = (study / "results/logs/screen/ngram-k4/rep1.log").read_text()
    assert "no cell to measure" in log and "deployment record unchanged" in log, log[-2000:]
    # a second re-run republishes the measured record again, not the first republication's
    (study / cell).unlink()
    sm(study, cell)
    assert [p for p in kept if (study / p).read_bytes() != before[p][0]] == []
    # 2. nothing downstream looks out of date: no gate, selection, round checkpoint, capacity search or report
    _nothing_to_do(study)
    # 3. asking for the selection runs nothing and leaves the protected file as it was
    _nothing_to_do(study, SELECTION)
    assert _bytes(study, [SELECTION]) == {SELECTION: before[SELECTION]}
    # 4. every later call works; the tree checks out consistent
    _nothing_to_do(study, "report")
    proc = _check_results(study)
    assert proc.returncode == 0 and "consistent: nothing to repair" in proc.stdout, proc.stdout + proc.stderr
    assert "NOT OK" not in proc.stdout


def test_screening_data_changed_after_the_lock_stops_before_any_job(study):
    cell = "results/screen/ngram-k4/rep1/code/c4/summary.json"
    sel = _bytes(study, [SELECTION])
    _remeasured(study, cell, 0.5)  # a re-measured screening cell with other figures, after confirmation was planned
    for target in ("all", "report", SELECTION, "confirm"):
        proc = sm(study, "-n", target, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, f"-n {target} ran on changed screening data:\n{out[-2000:]}"
        assert cell in out and "locked" in out and "make confirm-again RESELECT=1" in out, out[-2000:]
        assert "specstudy check-results --repair" in out
        assert "Traceback" not in out and "InputFunctionException" not in out, out[-2000:]
    proc = sm(study, "all", check=False)  # a real run stops before any job too
    assert proc.returncode != 0 and "Job stats" not in proc.stdout
    assert _bytes(study, [SELECTION]) == sel, "the locked selection was rewritten"
    # check-results names the file, says it is restorable, and prints the one repairing command
    proc = _check_results(study)
    assert proc.returncode == 1, proc.stdout
    assert f"NOT OK screening inputs: {cell}" in proc.stdout and "restorable from" in proc.stdout, proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "repair: specstudy check-results --repair"
    proc = _check_results(study, "--repair")
    assert proc.returncode == 0 and f"restored {cell}" in proc.stdout, proc.stdout + proc.stderr
    _nothing_to_do(study)


def test_reselect_archives_confirmation_with_the_selection(study):
    cell = "results/screen/ngram-k4/rep1/code/c4/summary.json"
    _remeasured(study, cell, 0.5)
    proc = subprocess.run([sys.executable, "-m", "specstudy.cli", "confirm-archive", "--results", "results", "--to",
                           "results-archive", "--stamp", "t", "--reselect"], cwd=study, capture_output=True,
                          text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    arch = study / "results-archive" / "confirm-t"
    assert (arch / SELECTION.removeprefix("results/")).exists() and (arch / "plan/confirm.json").exists()
    assert not (study / SELECTION).exists() and not (study / CONFIRM_PLAN).exists()
    counts = job_counts(sm(study, "-n", "confirm").stdout)  # the run selects again from the screening files
    assert counts.get("select") == 1 and counts.get("plan_confirm") == 1, counts
    assert "deploy_screen" not in counts and "gate" not in counts


def test_select_refuses_a_selection_other_than_the_locked_one(study):
    from specstudy.analysis.select import SelectionError, run_selection

    cell = "results/screen/ngram-k4/rep1/code/c4/summary.json"
    sel = atomic.read_json(study / SELECTION)
    paths = [i["path"] for i in sel["inputs"]]
    summaries = [p for p in paths if p.endswith("summary.json")]
    records = [p for p in paths if p.endswith("deployment.json")]
    gates = [p for p in paths if "/gates/" in p]
    cwd = os.getcwd()
    os.chdir(study)
    try:
        out = "results/selection/again.json"
        # same screening content: the same bytes as the locked selection, so writing it is allowed
        run_selection("config/config.yaml", "results/screen/prereg-lock.json", summaries, records, out,
                      gate_paths=gates, confirm_plan=CONFIRM_PLAN)
        assert (study / out).read_bytes() == (study / SELECTION).read_bytes()
        _remeasured(study, cell, 0.5)
        with pytest.raises(SelectionError, match="never rewritten"):
            run_selection("config/config.yaml", "results/screen/prereg-lock.json", summaries, records, SELECTION,
                          gate_paths=gates, confirm_plan=CONFIRM_PLAN)
    finally:
        os.chdir(cwd)
    assert atomic.read_json(study / SELECTION) == sel


# ------------------------------------------------------------------ a confirmation cell

def test_rerun_of_a_confirmation_cell(study):
    dep = "results/confirm/baseline/rep1"
    cell = f"{dep}/code/c1/summary.json"
    knees = [str(p.relative_to(study)) for p in (study / "results/capacity").glob("*/knee.json")]
    kept = [SELECTION, CONFIRM_PLAN, "results/confirm/rounds/round3.json", f"{dep}/deployment.json", cell, *knees]
    before = _bytes(study, kept)
    (study / cell).unlink()
    sm(study, cell)
    after = _bytes(study, kept)
    assert [p for p in kept if after[p][0] != before[p][0]] == [], "changed content on a no-op re-run"
    _nothing_to_do(study)
    # the same cell measured again with other figures: exactly what reads it runs again (the round checkpoint,
    # then the final candidate, tables and report); never the selection, the plans or a capacity search
    _remeasured(study, cell, 0.8)
    proc = sm(study, "-n", "all")
    counts = job_counts(proc.stdout)
    assert counts.get("confirm_round") == 1, proc.stdout[-3000:]
    for rule in ("select", "plan_confirm", "plan_screen", "deploy_confirm", "deploy_screen", "capacity_search", "gate"):
        assert rule not in counts, (rule, counts)
    assert "results/confirm/rounds/round3.json" in proc.stdout


# ------------------------------------------------------------------ a capacity result

def test_capacity_never_reruns_for_touched_rounds_or_records_and_an_unchanged_result_stays(study):
    from specstudy.job import run as deployment_run

    later = time.time() + 10
    for f in [*(study / "results/confirm/rounds").glob("round*.json"), *(study / "results/confirm").glob("*/rep*/deployment.json")]:
        os.utime(f, (later, later))  # touched, same content
    _nothing_to_do(study)
    _nothing_to_do(study, "capacity")
    # a capacity search that found the same result republishes nothing: its files keep their bytes and time
    out = study / "results/capacity/baseline"
    work = out / "attempts" / "capacity-baseline-again" / "capacity"
    work.mkdir(parents=True)
    shutil.copy(out / "knee.json", work / "knee.json")
    before = _bytes(study, ["results/capacity/baseline/knee.json"])
    deployment_run.publish_capacity(work, out)
    assert _bytes(study, ["results/capacity/baseline/knee.json"]) == before
    _nothing_to_do(study)
    # a different knee is new content: only the report, which reads it, runs again
    atomic.write_json(work / "knee.json", {"knee_rps": 6.0, "arm": "baseline"})
    deployment_run.publish_capacity(work, out)
    counts = job_counts(sm(study, "-n", "all").stdout)
    assert counts.get("build_report") == 1 and "capacity_search" not in counts and "select" not in counts, counts


def test_a_tree_whose_selection_was_rewritten_stops_cleanly_and_names_the_repair(study):
    """The state the issue ended in: the selection rewritten after confirmation was planned (same arms,
    new digest). Every run stops at parse with the file and the fix, never an InputFunctionException."""
    from specstudy.analysis.select import selection_digest

    sel_path = study / SELECTION
    sel = json.loads(sel_path.read_text())
    sel["inputs"][0]["sha256"] = "0" * 64
    sel["digest"] = selection_digest(sel)
    sel_path.chmod(0o644)
    atomic.write_json(sel_path, sel)
    for target in ("all", "report"):
        proc = sm(study, "-n", target, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "differs from the one recorded in" in out, out[-2000:]
        assert "specstudy check-results" in out and "Traceback" not in out and "InputFunctionException" not in out
    proc = _check_results(study)
    assert proc.returncode == 1 and "NOT OK confirmation plan" in proc.stdout, proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "repair: make confirm-again RESELECT=1"
    proc = _check_results(study, "--repair")  # needs a decision: printed, never run
    assert proc.returncode == 1 and (study / CONFIRM_PLAN).exists()


def test_replace_if_changed_and_what_a_deployment_record_s_content_is(tmp_path):
    from specstudy.core.content import same_deployment

    f = tmp_path / "x.json"
    assert atomic.write_json_if_changed(f, {"a": 1})
    os.utime(f, (1000, 1000))
    assert not atomic.write_json_if_changed(f, {"a": 1}) and f.stat().st_mtime == 1000
    assert atomic.write_json_if_changed(f, {"a": 2}) and f.stat().st_mtime != 1000
    cells = [{"workload": "code", "concurrency": 1, "summary": "s1", "status": "valid", "deployment_id": "d"},
             {"workload": "code", "concurrency": 4, "summary": "s4", "status": "rejected", "deployment_id": "d"}]
    rec = {"deployment_id": "d", "status": "ok", "cells": cells}
    republished = dict(rec, reused_by="d2", cells=[dict(c, status="reused") for c in reversed(cells)])
    assert same_deployment(rec, republished)
    assert not same_deployment(rec, dict(rec, deployment_id="d2"))
    assert not same_deployment(rec, dict(rec, cells=[dict(cells[0], summary="other"), cells[1]]))
    assert atomic.write_json_if_changed(f, rec)
    assert not atomic.write_json_if_changed(f, republished, same=same_deployment)
    f.write_text("{truncated")
    assert atomic.write_json_if_changed(f, rec, same=same_deployment)  # an unreadable old file is never the same
