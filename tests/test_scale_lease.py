"""envs/gpu/lease.sh's prebuild (issue 27): the fixture models, then the scale model the config asks for,
both before `start` runs the study. A fake `python3` stands in for the two builds (they are tested in
test_fixture_models.py / test_scale_model.py); whether the config asks for a scale model is answered by
the real specstudy.inputs.scale_model.wanted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEASE = ROOT / "envs" / "gpu" / "lease.sh"


def _env(tmp: Path, config: str) -> dict:
    b = tmp / "bin"
    b.mkdir()
    # the builds are logged and stubbed; any other python3 call (scale_model.wanted) is the real interpreter
    (b / "python3").write_text(
        "#!/bin/sh\ncase \"$*\" in\n"
        "  *build_fixture_models*) echo fixture >> \"$SPECSTUDY_LEASE_DIR/builds\"; exit 0 ;;\n"
        "  *build_from_config*) echo \"scale $*\" >> \"$SPECSTUDY_LEASE_DIR/builds\"; exit 0 ;;\n"
        f"  *) exec {sys.executable} \"$@\" ;;\nesac\n")
    (b / "python3").chmod(0o755)
    (tmp / "work" / "results" / "logs" / "models").mkdir(parents=True)
    (tmp / "lease").mkdir()
    # SPECSTUDY_LEASE_START_SLEEP_S: `start` prints its first progress line at once (5 s on the device)
    return dict(os.environ, PATH=f"{b}:{os.environ['PATH']}", SPECSTUDY_LEASE_DIR=str(tmp / "lease"),
                SPECSTUDY_LEASE_START_SLEEP_S="0",
                SPECSTUDY_WORKDIR=str(tmp / "work"), SPECSTUDY_GPU_CONFIG=str(ROOT / "config" / config))


@pytest.mark.parametrize("config,scale", [("gpu-h200-scale.yaml", True), ("gpu-h200.yaml", False)])
def test_prebuild_builds_the_fixture_then_the_scale_model_the_config_asks_for(tmp_path, config, scale):
    env = _env(tmp_path, config)
    subprocess.run(["bash", str(LEASE), "_prebuild", ""], env=env, check=True, timeout=120, capture_output=True, text=True)
    lease = tmp_path / "lease"
    builds = (lease / "builds").read_text().splitlines()
    assert builds[0] == "fixture"
    assert (lease / "prebuild.rc").read_text().strip() == "0" and (lease / "prebuild.done").exists()
    if scale:
        assert len(builds) == 2 and "build_from_config" in builds[1] and "gpu-h200-scale.yaml" in builds[1]
        assert (lease / "scale.rc").read_text().strip() == "0"
        assert "prebuild: scale model rc 0" in (lease / "lease.log").read_text()
    else:
        assert builds == ["fixture"] and not (lease / "scale.rc").exists()


def test_a_failed_fixture_build_skips_the_scale_model_but_ends_the_prebuild(tmp_path):
    env = _env(tmp_path, "gpu-h200-scale.yaml")
    fake = tmp_path / "bin" / "python3"
    fake.write_text(fake.read_text().replace('echo fixture >> "$SPECSTUDY_LEASE_DIR/builds"; exit 0',
                                             'echo fixture >> "$SPECSTUDY_LEASE_DIR/builds"; exit 3'))
    subprocess.run(["bash", str(LEASE), "_prebuild", ""], env=env, check=True, timeout=120, capture_output=True, text=True)
    lease = tmp_path / "lease"
    assert (lease / "builds").read_text().splitlines() == ["fixture"]
    assert (lease / "prebuild.rc").read_text().strip() == "3" and not (lease / "scale.rc").exists()
    assert (lease / "prebuild.done").exists()  # `start` does not wait forever; the study's rules retry the builds


@pytest.mark.parametrize("scale_rc,scale_touched", [("0", True), ("1", False)])
def test_start_touches_only_what_the_prebuild_built(tmp_path, scale_rc, scale_touched):
    env = _env(tmp_path, "gpu-h200-scale.yaml")
    work, lease = tmp_path / "work", tmp_path / "lease"
    records = [work / "results" / "models" / "fixture" / "models.json", work / "results" / "models" / "scale" / "scale.json"]
    for r in records:
        r.parent.mkdir(parents=True)
        r.write_text("{}")
        os.utime(r, (1_000_000_000, 1_000_000_000))  # older than any input a device call may re-copy
    (lease / "prebuild.rc").write_text("0\n")
    (lease / "scale.rc").write_text(scale_rc + "\n")
    subprocess.run(["bash", str(LEASE), "_touch_prebuilt"], env=env, check=True, timeout=60, capture_output=True, text=True)
    fixture, scale = (r.stat().st_mtime_ns for r in records)
    assert fixture > 1_000_000_000 * 10**9
    if scale_touched:
        assert scale >= fixture  # the scale record stays newer than its input, the fixture record
    else:
        assert scale == 1_000_000_000 * 10**9  # a failed scale prebuild is left for the study's rule to redo


def test_start_from_a_second_lease_dir_neither_waits_for_anothers_prebuild_nor_takes_an_old_done(tmp_path):
    """A second background run in the same lease (its own SPECSTUDY_LEASE_DIR, the fixture log of the first
    run's prebuild present) starts at once: it hung before, waiting for a prebuild.done that only the first
    dir gets (seen on the H200 on 2026-12-03). An old `done` in the dir is removed, so `wait` waits anew."""
    env = _env(tmp_path, "gpu-h200-scale.yaml")
    work, lease, go = tmp_path / "work", tmp_path / "lease", tmp_path / "go"
    (work / "results" / "logs" / "models" / "fixture.log").write_text("built by another lease dir\n")
    (lease / "done").write_text("")  # left by an earlier run from this dir
    # the study stands in: it holds until the test says go (at most 60 s), then fails; no extras after it
    (tmp_path / "bin" / "snakemake").write_text(
        f"#!/bin/sh\nfor i in $(seq 600); do [ -f {go} ] && exit 1; sleep 0.1; done\nexit 2\n")
    (tmp_path / "bin" / "snakemake").chmod(0o755)
    env.update(SPECSTUDY_GPU_EXTRAS="0", SPECSTUDY_LEASE_POLL_S="0.5")
    proc = subprocess.run(["bash", str(LEASE), "start", "900"], env=env, timeout=60, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (lease / "lease.log").read_text()
    assert "waiting for the prebuild" not in log and "background run starts" in log
    assert not (lease / "done").exists()  # the old one is gone while the new run holds
    go.write_text("")
    proc = subprocess.run(["bash", str(LEASE), "wait", "60"], env=dict(env, OUT=str(tmp_path / "out")), timeout=120,
                          capture_output=True, text=True)
    assert (lease / "done").exists() and "background run finished" in proc.stdout, proc.stdout[-2000:]
    assert (lease / "study.rc").read_text().strip() == "1"


SNAKEFILE = ('rule cell:\n    input: "inputs.txt"\n'
             '    output: "results/screen/baseline/rep1/attempts/a1/open_chat/c1/summary.json"\n'
             '    shell: "cp {input} {output}"\n')


def _snakemake(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _packed(tmp: Path, weights: dict[str, bytes]) -> Path:
    """An earlier lease's `pack`: results/ with model records (no weights), a cell a real Snakemake made and
    its metadata, split into parts as `lease.sh pack` splits them."""
    import hashlib
    import json
    import tarfile

    first = tmp / "first"
    models = first / "results" / "models" / "fixture"
    models.mkdir(parents=True)
    (models / "models.json").write_text(json.dumps(
        {role: {"weights_sha256": hashlib.sha256(data).hexdigest()} for role, data in weights.items()}))
    (first / "Snakefile").write_text(SNAKEFILE)
    (first / "inputs.txt").write_text('{"measured": "in the first lease"}')
    proc = _snakemake(first)
    assert proc.returncode == 0 and (first / ".snakemake" / "metadata").is_dir(), proc.stderr[-2000:]
    with tarfile.open(tmp / "results.tgz", "w:gz") as tar:
        tar.add(first / "results", arcname="results")
        tar.add(first / ".snakemake" / "metadata", arcname=".snakemake/metadata")
    parts = tmp / "parts"
    parts.mkdir()
    data = (tmp / "results.tgz").read_bytes()
    half = len(data) // 2
    (parts / "results.tgz.part0").write_bytes(data[:half])
    (parts / "results.tgz.part1").write_bytes(data[half:])
    return parts


def _rebuilt(work: Path, weights: dict[str, bytes]) -> None:
    """This lease: the tree copied anew (the workflow's input newer than every packed output), models rebuilt."""
    for role, data in weights.items():
        d = work / "results" / "models" / "fixture" / role
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(data)
    (work / "results" / "models" / "fixture" / "models.json").write_text('{"rebuilt": "in this lease"}')
    (work / "Snakefile").write_text(SNAKEFILE)
    (work / "inputs.txt").write_text('{"measured": "in the first lease"}')


def _with_specstudy(env: dict, tmp: Path) -> dict:
    shim = tmp / "bin" / "specstudy"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; from specstudy.cli import main; "
                    "sys.exit(main())' \"$@\"\n")
    shim.chmod(0o755)
    return dict(env, PYTHONPATH=str(ROOT / "scripts"))


def test_resume_restores_the_packed_results_when_the_rebuilt_models_are_the_measured_ones(tmp_path):
    """issue 27 item 3: the rebuilt weights have the packed records' sha256, so the packed results, records and
    Snakemake metadata come back, and a real Snakemake then has nothing to re-run although the tree's input is
    newer than every packed output (the device call's fresh copy); without the metadata it would re-run."""
    env = _with_specstudy(_env(tmp_path, "gpu-h200.yaml"), tmp_path)
    weights = {"target": b"target weights", "draft": b"draft weights"}
    parts = _packed(tmp_path, weights)
    work, lease = tmp_path / "work", tmp_path / "lease"
    _rebuilt(work, weights)
    proc = subprocess.run(["bash", str(LEASE), "resume", str(parts)], env=env, timeout=120, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "models-verify: 2 rebuilt model files have the sha256 of the packed records" in proc.stdout
    assert "resumed from" in proc.stdout and "1 cells" in proc.stdout
    record = work / "results" / "models" / "fixture" / "models.json"
    assert record.read_text() == (tmp_path / "first" / "results" / "models" / "fixture" / "models.json").read_text()
    assert (work / "results" / "models" / "fixture" / "target" / "model.safetensors").read_bytes() == b"target weights"
    assert (lease / "resumed").exists()
    summary = work / "results/screen/baseline/rep1/attempts/a1/open_chat/c1/summary.json"
    assert summary.read_text() == '{"measured": "in the first lease"}'
    assert (work / "inputs.txt").stat().st_mtime > summary.stat().st_mtime
    dry = _snakemake(work, "-n")
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-2000:]
    shutil.rmtree(work / ".snakemake" / "metadata")  # the control: the same tree without the packed metadata
    dry = _snakemake(work, "-n")
    assert "Nothing to be done" not in dry.stdout + dry.stderr and "Updated input files" in dry.stdout + dry.stderr


def test_resume_is_refused_when_a_rebuilt_model_differs_and_restores_nothing(tmp_path):
    env = _with_specstudy(_env(tmp_path, "gpu-h200.yaml"), tmp_path)
    parts = _packed(tmp_path, {"target": b"target weights", "draft": b"draft weights"})
    work, lease = tmp_path / "work", tmp_path / "lease"
    _rebuilt(work, {"target": b"target weights", "draft": b"another torch build's draft"})
    proc = subprocess.run(["bash", str(LEASE), "resume", str(parts)], env=env, timeout=120, capture_output=True, text=True)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "1 of 2 rebuilt model files are not the ones" in proc.stdout
    assert "fixture/draft/model.safetensors: sha256" in proc.stdout and "resume refused" in proc.stdout
    assert (work / "results" / "models" / "fixture" / "models.json").read_text() == '{"rebuilt": "in this lease"}'
    assert not list((work / "results").rglob("summary.json")) and not (lease / "resumed").exists()
    assert not (work / ".snakemake").exists()


def test_resume_from_a_committed_tar_xz_restores_the_same_as_the_parts(tmp_path):
    """A pack committed recompressed (docs/gpu-results/*/results.tar.xz) travels with the tree: `resume FILE`
    reads it without a carried .stage/resume, and restores what the parts restore."""
    import lzma

    env = _with_specstudy(_env(tmp_path, "gpu-h200.yaml"), tmp_path)
    weights = {"target": b"target weights", "draft": b"draft weights"}
    parts = _packed(tmp_path, weights)
    import gzip
    raw = gzip.decompress(b"".join(p.read_bytes() for p in sorted(parts.glob("results.tgz.part*"))))
    pack = tmp_path / "results.tar.xz"
    pack.write_bytes(lzma.compress(raw))
    work, lease = tmp_path / "work", tmp_path / "lease"
    _rebuilt(work, weights)
    proc = subprocess.run(["bash", str(LEASE), "resume", str(pack)], env=env, timeout=120, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from" in proc.stdout and "1 cells" in proc.stdout and (lease / "resumed").exists()
    summary = work / "results/screen/baseline/rep1/attempts/a1/open_chat/c1/summary.json"
    assert summary.read_text() == '{"measured": "in the first lease"}'
    dry = _snakemake(work, "-n")
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-2000:]


@pytest.mark.parametrize("name,content,says", [
    ("results.tgz", b"not a folder of parts", "is a file but not a .tar.xz pack"),
    ("results.tar.xz", b"not xz at all", "is not a readable .tar.xz"),
])
def test_resume_from_a_bad_file_says_what_to_give_and_restores_nothing(tmp_path, name, content, says):
    env = _with_specstudy(_env(tmp_path, "gpu-h200.yaml"), tmp_path)
    bad = tmp_path / name
    bad.write_bytes(content)
    work, lease = tmp_path / "work", tmp_path / "lease"
    _rebuilt(work, {"target": b"t", "draft": b"d"})
    proc = subprocess.run(["bash", str(LEASE), "resume", str(bad)], env=env, timeout=120, capture_output=True, text=True)
    assert proc.returncode == 2 and says in proc.stdout and str(bad) in proc.stdout, proc.stdout + proc.stderr
    assert not (lease / "resumed").exists() and not (work / ".snakemake").exists()


def _profile_env(tmp: Path) -> tuple[dict, Path, Path]:
    """A finished study's working directory (models with weights, a measured cell) and a fake `snakemake`
    that logs where it runs and, asked for `profile`, writes a profile record and a trace as the phase does."""
    env = _env(tmp, "gpu-h200-scale.yaml")
    work, lease = tmp / "work", tmp / "lease"
    for rel, data in {"results/models/fixture/models.json": "{}", "results/models/fixture/target/model.safetensors": "w",
                      "results/models/scale/scale.json": "{}", "results/models/scale/target/model.safetensors": "W",
                      "results/screen/baseline/rep1/attempts/a1/open_chat/c1/summary.json": '{"study": 1}'}.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(data)
    for rec in ("results/models/fixture/models.json", "results/models/scale/scale.json"):
        os.utime(work / rec, (1_000_000_000, 1_000_000_000))
    (tmp / "bin" / "snakemake").write_text(
        "#!/bin/sh\necho \"$PWD|$*\" >> \"$SPECSTUDY_LEASE_DIR/snakemake-calls\"\n"
        "if [ \"$1\" = profile ]; then d=results/profile/draft-k3-tp1/rep1; mkdir -p $d/traces\n"
        "  echo '{\"launches\": 1}' > $d/kernel-profile.json; echo big > $d/traces/rank0.1.pt.trace.json.gz; fi\n"
        "exit 0\n")
    (tmp / "bin" / "snakemake").chmod(0o755)
    env.update(SPECSTUDY_GPU_EXTRAS="0", SPECSTUDY_LEASE_POLL_S="0.2",
               SPECSTUDY_GPU_PROFILE_CONFIG="config/gpu-h200-scale-profile.yaml", OUT=str(tmp / "out"))
    (tmp / "out").mkdir()
    return env, work, lease


def test_the_profile_after_the_study_runs_in_its_own_workdir_and_comes_back_without_traces(tmp_path):
    """issue 27 item 5: the drafter's profile follows the study in the same background run, in
    $LEASE/profile-work (the study's results/ untouched, its models hard-linked, not rebuilt: their records
    newer than the copied tree); `pack` brings the profile's records back but not its traces."""
    import tarfile

    env, work, lease = _profile_env(tmp_path)
    proc = subprocess.run(["bash", str(LEASE), "start", "900"], env=env, timeout=60, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run(["bash", str(LEASE), "wait", "60"], env=env, timeout=120, capture_output=True, text=True)
    assert "background run finished" in proc.stdout, proc.stdout[-2000:]
    calls = (lease / "snakemake-calls").read_text().splitlines()
    assert [c.split("|")[0] for c in calls] == [str(work), str(lease / "profile-work")]
    assert calls[1].split("|")[1].startswith("profile ") and "--configfile config/gpu-h200-scale-profile.yaml" in calls[1]
    assert (lease / "profile.rc").read_text().strip() == "0"
    pw = lease / "profile-work"
    assert (pw / "Snakefile").is_file() and (pw / "config" / "gpu-h200-scale-profile.yaml").is_file()
    assert not (pw / "results" / "screen").exists() and not (pw / ".venv").exists()
    for rel in ("results/models/fixture/target/model.safetensors", "results/models/scale/target/model.safetensors"):
        assert (pw / rel).stat().st_ino == (work / rel).stat().st_ino  # linked, not copied
    tree_newest = max(p.stat().st_mtime_ns for p in (pw / "scripts").rglob("*.py"))
    fixture, scale = ((pw / "results/models" / r).stat().st_mtime_ns for r in ("fixture/models.json", "scale/scale.json"))
    assert tree_newest <= fixture <= scale
    assert not (work / "results" / "profile").exists()  # the study's results/ got nothing of the profile
    names = tarfile.open(sorted((tmp_path / "out").glob("results.tgz.part*"))[0]).getnames()
    assert any(n.endswith("profile-work/results/profile/draft-k3-tp1/rep1/kernel-profile.json") for n in names)
    assert not any(".pt.trace.json" in n or n.endswith(".safetensors") for n in names)
    assert "results/screen/baseline/rep1/attempts/a1/open_chat/c1/summary.json" in names


def test_the_profile_is_skipped_when_its_estimate_does_not_fit_the_deadline(tmp_path):
    env, work, lease = _profile_env(tmp_path)
    env["SPECSTUDY_GPU_PROFILE_S"] = "5000"
    subprocess.run(["bash", str(LEASE), "start", "900"], env=env, timeout=60, capture_output=True, text=True, check=True)
    proc = subprocess.run(["bash", str(LEASE), "wait", "60"], env=env, timeout=120, capture_output=True, text=True)
    assert "background run finished" in proc.stdout
    assert "profile skipped:" in (lease / "lease.log").read_text() and "needs ~5000" in (lease / "lease.log").read_text()
    assert len((lease / "snakemake-calls").read_text().splitlines()) == 1 and not (lease / "profile-work").exists()


def test_the_better_pair_stage_builds_it_and_measures_both_pairs_in_bf16_on_cuda(tmp_path):
    """issue 27 item 2: with SPECSTUDY_GPU_PAIR=1 the background run, after the study, builds the
    target_generations pair and runs benchmarks/acceptance_gap.py (bf16, cuda, served) for it and for the
    study's own pair; the figures and logs come back in the pack, the weights do not."""
    import tarfile

    env, work, lease = _profile_env(tmp_path)
    del env["SPECSTUDY_GPU_PROFILE_CONFIG"]
    env["SPECSTUDY_GPU_PAIR"] = "1"
    calls = lease / "pair-calls"
    (tmp_path / "bin" / "specstudy").write_text(
        f"#!/bin/sh\necho \"specstudy $*\" >> {calls}\nwhile [ $# -gt 0 ]; do [ \"$1\" = --out ] && out=$2; shift; done\n"
        "mkdir -p $out/draft && echo w > $out/draft/model.safetensors && echo '{}' > $out/models.json\n")
    (tmp_path / "bin" / "specstudy").chmod(0o755)
    py = (tmp_path / "bin" / "python3").read_text()
    (tmp_path / "bin" / "python3").write_text(py.replace(
        "  *) exec", f"  *acceptance_gap.py*) echo \"gap $*\" >> {calls}; "
        "while [ $# -gt 0 ]; do [ \"$1\" = --json ] && j=$2; shift; done; echo '{\"by_k\": {}}' > $j; exit 0 ;;\n  *) exec"))
    subprocess.run(["bash", str(LEASE), "start", "900"], env=env, timeout=60, capture_output=True, text=True, check=True)
    proc = subprocess.run(["bash", str(LEASE), "wait", "60"], env=env, timeout=120, capture_output=True, text=True)
    assert "background run finished" in proc.stdout, proc.stdout[-2000:]
    build, better, study = (calls.read_text().splitlines())
    assert build.startswith("specstudy fixture-models --out") and "target_generations" in build
    for line, models in ((better, f"{lease}/pair/models"), (study, f"{work}/results/models/fixture")):
        assert f"--models {models} " in line and "--dtypes bfloat16 --device cuda --serve" in line
        assert "config/gpu-h200.yaml" in line
    assert [(lease / f"pair-{n}.rc").read_text().strip() for n in ("build", "better", "study")] == ["0", "0", "0"]
    names = tarfile.open(sorted((tmp_path / "out").glob("results.tgz.part*"))[0]).getnames()
    assert any(n.endswith("pair/better.json") for n in names) and any(n.endswith("pair/study.json") for n in names)
    assert not any(n.endswith(".safetensors") for n in names)


def test_the_committed_main_lease_1_pack_resumes_into_only_what_is_missing(tmp_path):
    """The scale study on `main` (docs/gpu-results/2026-12-04-scale-main-lease1) resumed with today's code: a real
    Snakemake on this tree with the pack unpacked (as `resume` restores it) measures no packed deployment again,
    although every file of the tree is newer than the packed outputs (the device call's copy): the packed
    metadata's checksums say the models and the measured deployments are unchanged. The plan files, the
    selection and the report are planned again (the code that writes them changed since the pack: the method
    registry, the engine builds), which a resume may do; a change that would re-run measured work fails here."""
    import lzma
    import tarfile

    pack = ROOT / "docs" / "gpu-results" / "2026-12-04-scale-main-lease1" / "results.tar.xz"
    work = tmp_path / "tree"
    work.mkdir()
    keep = ("Snakefile", "rules", "config", "corpora", "scripts", "envs", "profiles", "report")
    for name in keep:
        src = ROOT / name
        if src.is_dir():
            # copied with new mtimes, as a device call copies the tree: newer than every packed output
            shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                            copy_function=shutil.copy)
        elif src.exists():
            shutil.copy(src, work / name)
    with tarfile.open(fileobj=lzma.open(pack)) as tar:
        tar.extractall(work, filter="data")
    packed = work / "results" / "plan" / "confirm.json"
    assert (work / "Snakefile").stat().st_mtime > packed.stat().st_mtime
    # `start` then touches the model records the prebuild made (touch_prebuilt; fixture first, its input)
    for rec in ("fixture/models.json", "scale/scale.json"):
        os.utime(work / "results" / "models" / rec)
    dry = subprocess.run([sys.executable, "-m", "snakemake", "-n", "all", "--configfile", "config/gpu-h200-scale.yaml",
                          "--cores", "2"], cwd=work, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=str(work / "scripts")))
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out[-3000:]
    stats = out[out.index("Job stats:"):]
    stats = stats[:stats.index("total")]
    jobs = {ln.split()[0]: int(ln.split()[1]) for ln in stats.splitlines()[3:] if ln.strip()}
    assert "deploy_screen" not in jobs and "scale_models" not in jobs and "fixture_models" not in jobs, stats
    assert set(jobs) <= {"effective_config", "plan_screen", "select", "plan_confirm", "deploy_confirm", "gate",
                         "final_candidate", "build_report", "all"}, stats
    assert jobs.get("deploy_confirm", 0) <= 1, stats  # at most the deployment cut by lease 1's end
    # the control: the scale model is up to date as packed, and an edit of its module (an input of rule
    # scale_models) re-runs it (and so, behind the plan's checkpoint, every deployment that loads it)
    def scale_planned() -> bool:
        dry = subprocess.run([sys.executable, "-m", "snakemake", "-n", "results/models/scale/scale.json",
                              "--configfile", "config/gpu-h200-scale.yaml", "--cores", "2"], cwd=work,
                             capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(work / "scripts")))
        return "rule scale_models:" in dry.stdout

    assert not scale_planned()
    with open(work / "scripts" / "specstudy" / "inputs" / "scale_model.py", "a") as f:
        f.write("\n# edited\n")
    assert scale_planned()


def test_engines_mode_runs_the_engine_builds_benchmark_instead_of_the_study(tmp_path):
    """SPECSTUDY_GPU_ENGINES: the background run is benchmarks/engine_builds.py over the named builds and arms with
    the lease's config, its records under $LEASE/engines; no Snakemake study runs."""
    env = _env(tmp_path, "gpu-h200-scale.yaml")
    fake = tmp_path / "bin" / "python3"
    fake.write_text(fake.read_text().replace(
        "  *) exec", "  *engine_builds.py*) echo \"$*\" >> \"$SPECSTUDY_LEASE_DIR/engines-call\"; exit 0 ;;\n  *) exec"))
    (tmp_path / "bin" / "snakemake").write_text("#!/bin/sh\necho snakemake >> \"$SPECSTUDY_LEASE_DIR/builds\"\n")
    (tmp_path / "bin" / "snakemake").chmod(0o755)
    env.update(SPECSTUDY_GPU_ENGINES="0.26.0=/sites/a 0.23.0=/sites/b", SPECSTUDY_GPU_ENGINE_ARMS="baseline,draft-k3-tp1")
    deadline = int(__import__("time").time()) + 600
    subprocess.run(["bash", str(LEASE), "_background", str(deadline)], env=env, check=True, timeout=60,
                   capture_output=True, text=True)
    lease = tmp_path / "lease"
    call = (lease / "engines-call").read_text().split()
    assert call[call.index("--config") + 1].endswith("config/gpu-h200-scale.yaml")
    assert [call[i + 1] for i, a in enumerate(call) if a == "--build"] == ["0.26.0=/sites/a", "0.23.0=/sites/b"]
    assert call[call.index("--arms") + 1] == "baseline,draft-k3-tp1"
    assert call[call.index("--out") + 1] == str(lease / "engines")
    assert int(call[call.index("--deadline") + 1]) == deadline - 30
    assert (lease / "engines.rc").read_text().strip() == "0" and (lease / "done").exists()
    assert not (lease / "builds").exists()  # no study


def test_prebuild_takes_the_draft_training_override(tmp_path):
    """SPECSTUDY_GPU_DRAFT_TRAINING (JSON) reaches build_fixture_models as draft_training; unset, the config's."""
    env = _env(tmp_path, "gpu-h200.yaml")
    fake = tmp_path / "bin" / "python3"
    # the stand-in runs the prebuild's own Python with build_fixture_models replaced by a recorder
    stub = tmp_path / "stub" / "specstudy" / "inputs"
    stub.mkdir(parents=True)
    (tmp_path / "stub" / "specstudy" / "__init__.py").write_text("")
    (stub / "__init__.py").write_text("")
    (stub / "fixture_models.py").write_text(
        "import json, os\n"
        "def build_fixture_models(out, **kw):\n"
        "    open(os.path.join(os.environ['SPECSTUDY_LEASE_DIR'], 'fixture-kw'), 'w').write(json.dumps(kw))\n")
    fake.write_text(fake.read_text().replace(
        "  *build_fixture_models*) echo fixture >> \"$SPECSTUDY_LEASE_DIR/builds\"; exit 0 ;;\n",
        f"  *build_fixture_models*) PYTHONPATH={tmp_path / 'stub'} exec {sys.executable} \"$@\" ;;\n"))
    env["SPECSTUDY_GPU_DRAFT_TRAINING"] = '{"method": "target_generations"}'
    subprocess.run(["bash", str(LEASE), "_prebuild", ""], env=env, check=True, timeout=120, capture_output=True, text=True)
    import json

    kw = json.loads((tmp_path / "lease" / "fixture-kw").read_text())
    assert kw["draft_training"] == {"method": "target_generations"} and kw["seed"] == 0
    del env["SPECSTUDY_GPU_DRAFT_TRAINING"]
    subprocess.run(["bash", str(LEASE), "_prebuild", ""], env=env, check=True, timeout=120, capture_output=True, text=True)
    assert json.loads((tmp_path / "lease" / "fixture-kw").read_text())["draft_training"] is None
