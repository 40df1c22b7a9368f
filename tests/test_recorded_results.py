"""Results files recorded when written, checked when read (specstudy.core.atomic), and what repairs them
(specstudy check-results --repair); the re-run of a cell before its phase is planned (specstudy.study.rerun)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from specstudy.analysis import check_results
from specstudy.core import atomic
from specstudy.core.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_cache():
    atomic._VERIFIED.clear()
    yield
    atomic._VERIFIED.clear()


def _edit(path: Path, text: str) -> None:
    """A hand edit: new bytes, and a modification time that surely differs from the recorded one."""
    st = path.stat()
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_a_results_file_is_recorded_and_an_edit_is_refused_when_read(tmp_path):
    p = atomic.write_json(tmp_path / "results/plan/screen.json", {"deployments": [1, 2]})
    rec = json.loads(atomic.sidecar(p).read_text())
    assert rec["sha256"] == atomic.sha256_file(p) and rec["size"] == p.stat().st_size
    assert atomic.sidecar(p).name == ".screen.json.sha256"
    assert atomic.read_json(p) == {"deployments": [1, 2]}
    _edit(p, json.dumps({"deployments": [1]}))
    atomic._VERIFIED.clear()
    with pytest.raises(atomic.Changed) as exc:
        atomic.read_json(p)
    msg = str(exc.value)
    assert str(p) in msg and "changed after it was written" in msg and "specstudy check-results --repair" in msg
    assert isinstance(exc.value, atomic.BadFile)  # every reader that names a corrupt file names this one too
    assert [c.path for c in atomic.recorded_problems(tmp_path / "results")] == [str(p)]


def test_a_truncated_jsonl_is_refused(tmp_path):
    p = atomic.write_jsonl(tmp_path / "results/x/requests.jsonl", [{"a": 1}, {"a": 2}])
    p.write_bytes(p.read_bytes()[:9])
    with pytest.raises(atomic.Changed, match="requests.jsonl"):
        atomic.read_jsonl(p)


def test_files_outside_a_results_tree_are_not_recorded(tmp_path):
    p = atomic.write_json(tmp_path / "config/engines/x.json", {"a": 1})
    assert not atomic.sidecar(p).exists()
    p.write_text("{}")
    assert atomic.read_json(p) == {}
    assert atomic.is_recorded(tmp_path / "results-archive/confirm-t/rounds/round1.json")
    # model directories are identified by their files (specstudy.job.spec.model_identity): no sidecar among them
    m = atomic.write_json(tmp_path / "results/models/fixture/target/config.json", {"a": 1})
    assert not atomic.sidecar(m).exists()
    assert not atomic.is_recorded(tmp_path / "results/.config/abc.json")


def test_the_same_bytes_with_a_new_mtime_are_intact_and_only_moved_files_are_hashed(tmp_path, monkeypatch):
    kept = atomic.write_json(tmp_path / "results/a.json", {"a": 1})
    touched = atomic.write_json(tmp_path / "results/b.json", {"b": 1})
    os.utime(touched, ns=(0, touched.stat().st_mtime_ns + 5_000_000_000))  # `touch`: same content
    hashed = []
    real = atomic.sha256_file
    monkeypatch.setattr(atomic, "sha256_file", lambda p, *a: hashed.append(Path(p).name) or real(p, *a))
    assert atomic.recorded_problems(tmp_path / "results") == []
    assert hashed == ["b.json"]  # the file whose size and mtime are the recorded ones is not read
    assert kept.exists()


def test_a_file_is_hashed_once_per_process(tmp_path, monkeypatch):
    p = atomic.write_json(tmp_path / "results/a.json", {"a": 1})
    atomic._VERIFIED.clear()
    hashed = []
    real = atomic.sha256_file
    monkeypatch.setattr(atomic, "sha256_file", lambda q, *a: hashed.append(q) or real(q, *a))
    atomic.check_recorded(p)
    atomic.check_recorded(p)
    assert len(hashed) == 1


def test_check_results_repair_restores_from_the_attempt_or_moves_aside(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rel = "results/screen/baseline/rep1/code/c1/summary.json"
    body = {"keys": {"arm": "baseline"}, "latency_ms": {"tpot": {"p50": 10.0}}}
    atomic.write_json("results/screen/baseline/rep1/attempts/screen-baseline-rep1-a1/code/c1/summary.json", body)
    atomic.write_json(rel, body)
    atomic.write_json("results/plan/screen.json", {"deployments": []})
    _edit(Path(rel), json.dumps({**body, "latency_ms": {"tpot": {"p50": 5.0}}}))
    _edit(Path("results/plan/screen.json"), "{\"deployments\": [")
    res = check_results.check_tree(".")
    bad = [f.detail for f in res.findings if not f.ok]
    assert any(rel in b and "restorable from" in b for b in bad), bad
    assert any("results/plan/screen.json" in b and "snakemake --profile profiles/local results/plan/screen.json" in b
               for b in bad), bad
    assert res.repair == "specstudy check-results --repair"
    done = check_results.repair(".")
    assert any(line.startswith(f"restored {rel} from ") for line in done), done
    assert json.loads(Path(rel).read_text()) == body
    assert not Path("results/plan/screen.json").exists()
    assert [p.name for p in Path("results/plan").iterdir()] == [f"screen.json.changed-{atomic.sha256_file(p)[:12]}"
                                                              for p in Path("results/plan").iterdir()]
    atomic._VERIFIED.clear()
    assert check_results.check_tree(".").consistent


def test_rerun_before_the_plan_checks_the_study_config(tmp_path):
    from specstudy.study.rerun import check_targets

    cfg = yaml.safe_load((ROOT / "tests/data/study-small.yaml").read_text())
    with pytest.raises(UserError, match=r"'draft-k3-tp4' is not an arm of this study \(s.yaml, arms: baseline, ngram-k2\)"):
        check_targets(["results/screen/draft-k3-tp4/rep1/code/c1/summary.json"], tmp_path, cfg, "s.yaml")
    with pytest.raises(UserError, match="'chat' is not a workload of this study"):
        check_targets(["results/screen/baseline/rep1/chat/c1/summary.json"], tmp_path, cfg, "s.yaml")
    check_targets(["results/screen/ngram-k2/rep1/code/c1/summary.json"], tmp_path, cfg, "s.yaml")
