"""The DAG enforces the pre-registered order of work (dry runs on a copy of the workflow).

Screening outputs are faked (synthetic summaries), so no server starts; `select` runs for real
because it only reads files.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def sm(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run([*SNAKEMAKE, "--cores", "2", *args], cwd=workdir, capture_output=True, text=True, timeout=300,
                          env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def job_counts(out: str) -> dict[str, int]:
    counts = {}
    m = re.search(r"Job stats:\n(.*?)\n\s*total", out, re.S)
    if not m:
        return counts
    for line in m.group(1).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    return counts


def workflow_copy(dest: Path) -> Path:
    """A copy of the workflow (Snakefile, rules, config, corpora, envs, scripts) to dry-run in."""
    for name in ("Snakefile", "rules", "config", "corpora", "envs"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / name)
    # A copy, not a link: rule fixture_models declares scripts/specstudy/inputs/fixture_models.py as an input, and the
    # faked outputs must be newer than it (fake_screening ages every file of the copy).
    shutil.copytree(ROOT / "scripts", dest / "scripts", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    # The DAG tests' own design (tests/data/dag-*.yaml: 5 screening arms at c1/c4, one drift baseline,
    # confirmation 3 -> 5 rounds): the shipped embedded study is sized for a 20-minute `make study` (issue 31)
    # and its shape is checked in tests/test_plan.py and tests/test_progress.py.
    shutil.copy(ROOT / "tests/data/dag-config.yaml", dest / "config/config.yaml")
    shutil.copy(ROOT / "tests/data/dag-preregistration.yaml", dest / "config/preregistration.yaml")
    return dest


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    return workflow_copy(tmp_path)


@pytest.fixture(scope="module")
def screened_template(tmp_path_factory) -> Path:
    """Built once per module: a workflow copy with faked screening outputs and the real ``select`` run on them."""
    import contextlib

    root = workflow_copy(tmp_path_factory.mktemp("screened"))
    with contextlib.chdir(os.getcwd()):  # fake_planned plans inside the copy; the module's tests start where they did
        fake_screening(root)
    sm(root, "results/selection/selection.json")
    return root


@pytest.fixture()
def screened(screened_template: Path, tmp_path: Path) -> Path:
    """A test's own copy of :func:`screened_template` (times kept: Snakemake sees the same up-to-date outputs)."""
    dest = tmp_path / "workflow"
    shutil.copytree(screened_template, dest, symlinks=True, ignore=shutil.ignore_patterns("log"))
    return dest


def _corpus_dirs(workdir: Path, config: str = "config/config.yaml") -> dict[str, str]:
    cfg = yaml.safe_load((workdir / config).read_text())
    specs = dict(cfg["corpora"]["workloads"], smoke=cfg["corpora"]["smoke"])
    out = {}
    for w, s in specs.items():
        spec = yaml.safe_load((workdir / s).read_text())
        out[w] = f"results/corpora/{spec['name']}/{spec['version']}"
    return out


def json_writer(root: Path, start: float, step: float):
    """``write(path, obj)``: JSON under ``root``, each file's mtime ``step`` after the previous one from
    ``start``, so that faked outputs look made in the order written (Snakemake compares mtimes)."""
    t = [start]

    def write(path: str, obj) -> None:
        f = root / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(obj))
        t[0] += step
        os.utime(f, (t[0], t[0]))

    return write


def fake_planned(workdir: Path, config: str = "config/config.yaml"):
    """Write what comes before the first deployment (models, corpora, lock) and the real screening plan
    (specstudy plan's own function, checked against the plan schema), as if checkpoint plan_screen had run.
    Returns the config, the plan and the writer (whose later files are newer)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from specstudy.study import plan as planmod
    from specstudy.study.config import effective_config_files, load_config

    os.chdir(workdir)
    cfg = load_config(config)
    old = time.time() - 4000
    for f in workdir.rglob("*"):
        if f.is_file() and not f.is_symlink():
            os.utime(f, (old, old))
    write = json_writer(workdir, time.time() - 3000, 1)

    for path, text in effective_config_files(cfg).items():  # written by rule effective_config
        f = workdir / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
        os.utime(f, (old, old))
    write("results/models/fixture/models.json", {})
    for w, d in _corpus_dirs(workdir, config).items():
        write(f"{d}/corpus.json", {"name": w, "version": "1", "digest": "x" * 64})
    write("results/screen/prereg-lock.json", planmod.prereg_lock(cfg))
    p = planmod.make_plan(cfg, "screen")
    write("results/plan/screen.json", dict(p, corpora={}))
    from specstudy.core import records

    assert records.read_plan(workdir / "results/plan/screen.json").deployments
    return cfg, p, write


def fake_screening(workdir: Path) -> None:
    """Write every screening output with increasing mtimes, as if screening had run."""
    from specstudy.core import layout
    from specstudy.study import plan as planmod

    cfg, p, write = fake_planned(workdir)
    speed = {"baseline": 10.0, "draft-k2-tp1": 7.0, "draft-k4-tp1": 7.5, "ngram-k2": 9.0, "ngram-k4": 9.5}
    for d in p["deployments"]:
        for c in d["cells"]:
            method = "baseline" if d["arm"] == "baseline" else ("draft_model" if d["arm"].startswith("draft") else "ngram")
            write(f"results/screen/{d['arm']}/{d['rep']}/{c['workload']}/c{c['concurrency']}/summary.json",
                  {"keys": {"phase": "screen", "arm": d["arm"], "method": method,
                            # as the deployment job writes them (job/run.py): the number, and the folder's label
                            "rep": layout.rep_number(d["rep"]), "rep_label": d["rep"], "kind": d["kind"],
                            "workload": c["workload"], "concurrency": c["concurrency"]},
                   "validity": {"valid": True, "reasons": []},
                   "latency_ms": {"tpot": {"p50": speed[d["arm"]] * c["concurrency"]}},
                   "tokens": {"output_tokens_per_second": 100.0}})
        write(f"results/screen/{d['arm']}/{d['rep']}/deployment.json",
              {"arm": {"name": d["arm"]}, "status": "ok", "prereg_sha256": planmod.prereg_lock(cfg)["sha256"]})
    for arm in speed:
        if arm != "baseline":
            write(f"results/gates/screen/{arm}.json", {"arm": arm, "phase": "screen", "verdict": "pass"})


def test_the_screening_dag_is_read_from_the_plan_file(workdir):
    """Before the plan exists the DAG ends at checkpoint plan_screen; the deployments are those the file lists."""
    counts = job_counts(sm(workdir, "-n", "screen").stdout)
    assert counts.get("plan_screen") == 1 and "deploy_screen" not in counts, counts
    cfg, p, write = fake_planned(workdir)
    # a plan that lists one deployment less: the DAG follows the file, not a plan computed at parse time
    # (the last one: the interleaved drift baseline, which no other deployment waits for)
    dropped = p["deployments"][-1]
    assert dropped["kind"] == "drift" and dropped["arm"] == "baseline", dropped
    assert job_counts(sm(workdir, "-n", "screen").stdout)["deploy_drift"] == 1
    write("results/plan/screen.json", dict(p, corpora={}, deployments=p["deployments"][:-1]))
    counts = job_counts(sm(workdir, "-n", "screen").stdout)
    assert "deploy_drift" not in counts and counts["deploy_screen"] == 10, counts
    # a plan file that is not a plan: refused, naming the file and the fix
    write("results/plan/screen.json", {"deployments": "?"})
    proc = sm(workdir, "-n", "screen", check=False)
    assert proc.returncode != 0
    assert "results/plan/screen.json: Expected `array`, got `str` - at `$.deployments`" in proc.stdout + proc.stderr
    assert "re-run the job that wrote it" in proc.stdout + proc.stderr


def test_screen_dag_contains_the_factorial_and_nothing_from_confirmation(workdir):
    fake_planned(workdir)
    out = sm(workdir, "-n", "screen").stdout
    counts = job_counts(out)
    # 5 arms x 2 repeats, and the embedded default's one interleaved drift baseline
    assert counts["deploy_screen"] == 10
    assert counts["deploy_drift"] == 1
    assert counts["gate"] == 4
    assert "deploy_confirm" not in counts and "select" not in counts
    # with two blocks and one interleaved drift baseline per block
    cfg = workdir / "config" / "config.yaml"
    cfg.write_text(cfg.read_text().replace("  blocks: 1\n", "  blocks: 2\n"))
    # planned again (the plan file of the old config removed): the DAG follows the new plan, not the old file
    (workdir / "results/plan/screen.json").unlink()
    counts = job_counts(sm(workdir, "-n", "-p", "screen").stdout)
    assert counts.get("plan_screen") == 1 and "deploy_screen" not in counts, counts
    sm(workdir, "results/plan/screen.json")
    counts = job_counts(sm(workdir, "-n", "-p", "screen").stdout)
    assert counts["deploy_screen"] == 10 and counts["deploy_drift"] == 2


def test_selection_reads_only_screening_files_and_confirmation_only_runs_its_picks(workdir):
    fake_screening(workdir)
    out = sm(workdir, "-n", "-p", "results/selection/selection.json").stdout
    assert job_counts(out) == {"select": 1}
    cmd = next(line for line in out.splitlines() if "specstudy select" in line)
    # the confirmation plan is named only as the lock (the selection is never rewritten once it exists), not read
    assert " --confirm-plan results/plan/confirm.json " in cmd
    cmd = cmd.replace(" --confirm-plan results/plan/confirm.json ", " ")
    inputs = [p for p in re.findall(r"results/\S+\.json", cmd)
              if not p.startswith("results/.config/") and p != "results/selection/selection.json"]
    # screening outputs only: cells, deployment records, and the screening gates (an arm whose gate failed
    # is never selected)
    assert inputs and all(p.startswith(("results/screen/", "results/gates/screen/")) for p in inputs), inputs
    assert any(p.startswith("results/gates/screen/") for p in inputs)
    assert "/confirm/" not in cmd

    sm(workdir, "results/selection/selection.json")
    selection = json.loads((workdir / "results/selection/selection.json").read_text())
    assert selection["confirmation_arms"] == ["baseline", "draft-k2-tp1", "ngram-k2"]

    # the confirmation DAG is read from its plan, a checkpoint built from the selection
    counts = job_counts(sm(workdir, "-n", "confirm").stdout)
    assert counts.get("plan_confirm") == 1 and "deploy_confirm" not in counts, counts
    sm(workdir, "results/plan/confirm.json")
    out = sm(workdir, "-n", "confirm").stdout
    counts = job_counts(out)
    assert counts["deploy_confirm"] == 3 * 3      # baseline + 2 candidates, 3 repeats each
    jobs = set(re.findall(r"results/confirm/([a-z0-9-]+)/rep\d+/deployment\.json", out))
    assert jobs == {"baseline", "draft-k2-tp1", "ngram-k2"}

    # asking for a cell of an unselected configuration fails before anything runs
    proc = sm(workdir, "-n", "results/confirm/draft-k4-tp1/rep1/code/c1/summary.json", check=False)
    assert proc.returncode != 0
    assert "was not selected for confirmation" in proc.stdout + proc.stderr


def test_selection_refuses_after_preregistration_changed(workdir):
    fake_screening(workdir)
    prereg = workdir / "config" / "preregistration.yaml"
    prereg.write_text(prereg.read_text().replace("retain_within: 0.05", "retain_within: 0.20"))
    proc = sm(workdir, "results/selection/selection.json", check=False)
    assert proc.returncode != 0
    # refused when the workflow is parsed (before select runs), naming the changed field (issue #21)
    out = proc.stdout + proc.stderr
    assert "pre-registration changed since screening started" in out
    assert "selection.retain_within: 0.05 -> 0.2" in out


def _files(root: Path) -> dict[str, int]:
    """Every file of the workflow copy (not Snakemake's own .snakemake/) with its mtime."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".snakemake"]
        for name in filenames:
            f = Path(dirpath) / name
            out[str(f.relative_to(root))] = f.stat().st_mtime_ns
    return out


def test_a_dry_run_writes_nothing(workdir):
    """Parsing the workflow writes no file: no effective config, no quarantine (issue #17 item 1)."""
    before = _files(workdir)
    for target in ("all", "screen", "report"):
        sm(workdir, "-n", target)
    assert _files(workdir) == before
    fake_screening(workdir)
    report = workdir / "results" / "report" / "report.md"
    report.parent.mkdir(parents=True)
    report.write_text("# a report of an earlier selection\n")  # stale: selection.json is missing
    before = _files(workdir)
    for target in ("all", "confirm", "report", "results/selection/selection.json"):
        sm(workdir, "-n", "-p", target)
    assert _files(workdir) == before


def test_the_deployment_job_reads_its_spec_from_the_plan(workdir):
    """No inline spec on the command line: the plan, the deployment's key and the effective config."""
    # before the plan exists the command already prints (the job's inputs come from checkpoint plan_screen)
    out = sm(workdir, "-n", "-p", "results/screen/ngram-k2/rep2/deployment.json").stdout
    assert "--plan results/plan/screen.json --deployment screen/ngram-k2/rep2 --config results/.config/deployment-" in out
    fake_planned(workdir)
    out = sm(workdir, "-n", "-p", "results/screen/ngram-k2/rep2/deployment.json").stdout
    # The asked-for deployment's job (the dry run also lists the deployments the plan orders before it).
    cmds = [line for line in out.splitlines() if "specstudy deployment run" in line and "screen/ngram-k2/rep2 " in line]
    assert len(cmds) == 1, out
    cmd = cmds[0]
    assert "--plan results/plan/screen.json --deployment screen/ngram-k2/rep2 --config results/.config/deployment-" in cmd
    assert "{" not in cmd and "--spec" not in cmd


def test_one_cell_is_rerun_by_asking_for_its_path(workdir):
    fake_screening(workdir)
    cell = workdir / "results/screen/ngram-k2/rep2/code/c4/summary.json"
    cell.unlink()
    out = sm(workdir, "-n", "-p", "results/screen/ngram-k2/rep2/code/c4/summary.json").stdout
    assert job_counts(out) == {"deploy_screen": 1}
    assert "--out results/screen/ngram-k2/rep2 " in out
    # everything else is up to date: the whole screen target needs only that deployment (+ its gate)
    counts = job_counts(sm(workdir, "-n", "screen").stdout)
    assert counts.get("deploy_screen") == 1 and "deploy_confirm" not in counts


@pytest.mark.parametrize("target", ["confirm", "report", "capacity", "all"])
def test_downstream_targets_dry_run_before_screening(workdir, target):
    """Before any result exists, later targets dry-run up to the plan checkpoint; once the plan exists,
    screening, then the selection checkpoint."""
    counts = job_counts(sm(workdir, "-n", target).stdout)
    assert counts.get("plan_screen") == 1 and "deploy_screen" not in counts, counts
    fake_planned(workdir)
    out = sm(workdir, "-n", target).stdout
    counts = job_counts(out)
    assert counts["deploy_screen"] == 10 and counts["select"] == 1, counts
    assert "deploy_confirm" not in counts   # decided only after the selection checkpoint has run


def fake_cell_summary(phase: str, arm: str, rep: str, workload: str, concurrency: int, *, tpot_p50_ms: float,
                      output_tokens_per_second: float) -> dict:
    """A valid cell summary of the shape the deployment job writes (schema cell-summary), with only the two
    figures the analysis compares filled in (the confirmation checkpoint reads it as a typed record)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from specstudy.core.arms import parse_arm
    from specstudy.measure import cell

    spec = parse_arm(arm)
    keys = {"phase": phase, "arm": arm, "method": spec["method"], "rep": int(rep.removeprefix("drift").removeprefix("rep")),
            "num_speculative_tokens": spec.get("num_speculative_tokens"),
            "draft_tensor_parallel_size": spec.get("draft_tensor_parallel_size"), "workload": workload,
            "concurrency": concurrency, "deployment_id": f"{phase}-{arm}-{rep}-fake",
            "kind": "drift" if rep.startswith("drift") else "repeat", "rep_label": rep}
    s = cell.failed_summary(keys, {"name": workload, "version": "1", "digest": "x" * 64}, "cell_error", "faked")
    s["validity"] = {"valid": True, "reasons": [], "throughput_valid": True, "latency_valid": True}
    s["latency_ms"]["tpot"]["p50"] = tpot_p50_ms
    s["tokens"]["output_tokens_per_second"] = output_tokens_per_second
    return cell.validate_summary(s)


def _fake_confirm_rounds(workdir: Path, speedups: dict[str, list[float]], rounds) -> None:
    """Write confirmation cells and records of ``rounds`` with per-round speedups (same for every cell of an arm,
    except draft-k2-tp1 on code@c8 which takes ``speedups['border']`` when given)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from specstudy.study import plan as planmod
    from specstudy.study.config import load_config

    os.chdir(workdir)
    cfg = load_config("config/config.yaml")
    p = json.loads((workdir / "results/plan/confirm.json").read_text())
    write = json_writer(workdir, time.time(), 0.01)

    for d in p["deployments"]:
        # interleaved drift baselines belong to the initial rounds' blocks: written with round 1
        if d["kind"] == "drift" and 1 in rounds:
            d = dict(d, round=1)
        elif d["kind"] != "repeat" or d["round"] not in rounds:
            continue
        r = d["round"] - 1
        for c in d["cells"]:
            sp = 1.0 if d["arm"] == "baseline" else speedups[d["arm"]][r]
            if d["arm"] == "draft-k2-tp1" and (c["workload"], c["concurrency"]) == ("code", 8) and "border" in speedups:
                sp = speedups["border"][r]
            write(f"results/confirm/{d['arm']}/{d['rep']}/{c['workload']}/c{c['concurrency']}/summary.json",
                  fake_cell_summary("confirm", d["arm"], d["rep"], c["workload"], c["concurrency"],
                                    tpot_p50_ms=10.0 / sp, output_tokens_per_second=100.0 * sp))
        write(f"results/confirm/{d['arm']}/{d['rep']}/deployment.json",
              {"arm": {"name": d["arm"]}, "status": "ok", "prereg_sha256": planmod.prereg_lock(cfg)["sha256"]})


CLEAR = {"draft-k2-tp1": [1.30, 1.31, 1.32, 1.30, 1.31], "ngram-k2": [0.80, 0.81, 0.79, 0.80, 0.80]}
BORDER = dict(CLEAR, border=[1.30, 0.95, 1.25, 1.28, 1.29])


def _to_confirmation(workdir: Path) -> None:
    fake_screening(workdir)
    sm(workdir, "results/selection/selection.json", "results/plan/confirm.json")


def test_adaptive_round_exists_only_when_the_checkpoint_asks(workdir):
    _to_confirmation(workdir)
    _fake_confirm_rounds(workdir, BORDER, {1, 2, 3})
    out = sm(workdir, "-n", "confirm").stdout
    counts = job_counts(out)
    assert counts.get("confirm_round") == 1 and "deploy_confirm" not in counts, counts
    sm(workdir, "results/confirm/rounds/round3.json")
    state = json.loads((workdir / "results/confirm/rounds/round3.json").read_text())
    assert state["continue"] is True and "draft-k2-tp1 code@c8" in state["why"]
    assert {d["arm"] for d in state["next_round"]} == {"baseline", "draft-k2-tp1", "ngram-k2"}
    assert state["candidates"][1]["verdicts"]["code@c1"] == "regression"  # ngram-k2: out of contention
    # round 4 (baseline + both candidates, counterbalanced from the seed) is now in the DAG, then its checkpoint
    counts = job_counts(sm(workdir, "-n", "confirm").stdout)
    assert counts["deploy_confirm"] == 3 and counts["confirm_round"] == 1, counts
    # round 4 does not settle code@c8 (a 0.95 round is still in the data): round 5, the cap, is asked for
    _fake_confirm_rounds(workdir, BORDER, {4})
    sm(workdir, "results/confirm/rounds/round4.json")
    state = json.loads((workdir / "results/confirm/rounds/round4.json").read_text())
    assert state["continue"] is True and state["rounds_run"] == [1, 2, 3, 4]
    counts = job_counts(sm(workdir, "-n", "confirm").stdout)
    assert counts["deploy_confirm"] == 3 and counts["confirm_round"] == 1, counts


def test_clear_result_stops_after_the_initial_rounds(workdir):
    _to_confirmation(workdir)
    _fake_confirm_rounds(workdir, CLEAR, {1, 2, 3})
    sm(workdir, "results/confirm/rounds/round3.json")
    state = json.loads((workdir / "results/confirm/rounds/round3.json").read_text())
    assert state["continue"] is False and state["decision"] == "enable draft-k2-tp1", state
    counts = job_counts(sm(workdir, "-n", "confirm").stdout)
    assert "deploy_confirm" not in counts and "confirm_round" not in counts
    proc = sm(workdir, "-n", "results/confirm/draft-k2-tp1/rep4/code/c1/summary.json", check=False)
    assert proc.returncode != 0
    assert "round 4 was not asked for" in proc.stdout + proc.stderr


def test_cap_reached_ends_confirmation(workdir):
    _to_confirmation(workdir)
    always_open = dict(CLEAR, border=[1.30, 0.90, 1.25, 0.92, 1.28])
    _fake_confirm_rounds(workdir, always_open, {1, 2, 3})
    sm(workdir, "results/confirm/rounds/round3.json")
    _fake_confirm_rounds(workdir, always_open, {4})
    sm(workdir, "results/confirm/rounds/round4.json")
    _fake_confirm_rounds(workdir, always_open, {5})
    sm(workdir, "results/confirm/rounds/round5.json")
    state = json.loads((workdir / "results/confirm/rounds/round5.json").read_text())
    assert state["continue"] is False and "cap of 5 rounds reached" in state["why"]
    assert state["decision"] == "do_not_enable"
    counts = job_counts(sm(workdir, "-n", "confirm").stdout)
    assert "deploy_confirm" not in counts and "confirm_round" not in counts



def _deployment_jobs(out: str) -> dict[tuple[str, str], dict]:
    """(arm, rep) -> {"records": the deployment records among its inputs, "priority"} from a dry run's printout."""
    jobs = {}
    for block in re.split(r"\n(?=rule )", out):
        if not block.startswith(("rule deploy_screen:", "rule deploy_drift:")):
            continue
        inputs = re.search(r"^\s*input: (.*)$", block, re.M).group(1).split(", ")
        wc = dict(kv.split("=", 1) for kv in re.search(r"^\s*wildcards: (.*)$", block, re.M).group(1).split(", "))
        jobs[(wc["arm"], wc.get("rep") or wc["drift"])] = {
            "records": [f for f in inputs if f.endswith("/deployment.json")],
            "priority": float(re.search(r"^\s*priority: (\S+)$", block, re.M).group(1))}
    return jobs


def test_deployments_wait_only_for_the_first_and_start_in_plan_order(workdir):
    """The phase's first deployment goes alone (a configuration fault stops the study there); every other
    deployment waits for it and for nothing else, so the profile's --jobs decides how many run at once (two
    blocks are not two chains), and the job priorities Snakemake schedules by follow the plan's order."""
    cfg = workdir / "config" / "config.yaml"
    cfg.write_text(cfg.read_text().replace("  blocks: 1\n", "  blocks: 2\n"))
    _, p, _ = fake_planned(workdir)
    ordered = sorted(p["deployments"], key=lambda d: d["order"])
    first = f"results/screen/{ordered[0]['arm']}/{ordered[0]['rep']}/deployment.json"
    jobs = _deployment_jobs(sm(workdir, "-n", "screen").stdout)
    assert len(jobs) == len(ordered) == 12, jobs.keys()
    assert {d["block"] for d in ordered} == {1, 2}
    for d in ordered:
        job = jobs[(d["arm"], d["rep"])]
        assert job["records"] == ([] if d is ordered[0] else [first]), (d["arm"], d["rep"], job)
    priorities = [jobs[(d["arm"], d["rep"])]["priority"] for d in ordered]
    assert priorities == sorted(priorities, reverse=True) and len(set(priorities)) == len(priorities), priorities
