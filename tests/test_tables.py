"""Tests for specstudy.analysis.tables; also home of ``make_results_tree``, the fake results tree other tests use."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from specstudy.analysis import tables
from specstudy.core.arms import parse_arm

WORKLOADS = ("code", "chat", "summarization")
CONCS = (1, 8)
ACCEPT = {"code": 0.7, "chat": 0.4, "summarization": 0.65}
# true speedups by (arm, workload, concurrency)
EFFECTS = {
    "draft-k3-tp4": {("code", 1): 1.40, ("code", 8): 1.15, ("chat", 1): 1.10, ("chat", 8): 0.99,
                     ("summarization", 1): 1.35, ("summarization", 8): 1.12},
    "ngram-k3": {("code", 1): 1.20, ("code", 8): 1.05, ("chat", 1): 1.02, ("chat", 8): 0.97,
                 ("summarization", 1): 1.30, ("summarization", 8): 1.10},
    "draft-k5-tp4": {("code", 1): 1.45, ("code", 8): 1.05, ("chat", 1): 1.05, ("chat", 8): 0.93,
                     ("summarization", 1): 1.40, ("summarization", 8): 1.04},
}
KV = {"baseline": 400000, "draft-k3-tp4": 300000, "draft-k5-tp4": 295000, "ngram-k3": 399000}


def _spec(arm: str) -> dict:
    return parse_arm(arm) | ({"prompt_lookup_min": 2, "prompt_lookup_max": 4} if "ngram" in arm else {})


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True))


def make_results_tree(root: Path, *, confirm: bool = True, effects: dict | None = None,
                      reps: int = 3, invalid: bool = True) -> Path:
    """A small results tree following docs/DESIGN.md (deterministic pseudo-noise)."""
    effects = effects or EFFECTS
    res = Path(root) / "results"
    phases = [("screen", ["baseline", *effects])]
    if confirm:
        phases.append(("confirm", ["baseline", "draft-k3-tp4"]))
    t = 1_760_000_000.0
    for phase, arms in phases:
        for rep in range(reps):
            for arm in arms:
                dep_id = f"{phase}-{arm}-rep{rep}-a1"
                rdir = res / phase / arm / f"rep{rep}"
                spec = _spec(arm)
                cells = []
                for w in WORKLOADS:
                    for c in CONCS:
                        noise = 1 + 0.01 * (((rep * 7 + c + len(w) * 3 + len(arm)) % 5) - 2)
                        base = 100.0 * c ** 0.7
                        eff = 1.0 if arm == "baseline" else effects[arm][(w, c)]
                        otps = base * eff * noise
                        valid = not (invalid and phase == "screen" and arm == "ngram-k3" and rep == 2
                                     and w == "chat" and c == 8)
                        spec_block = {"enabled": arm != "baseline"}
                        if arm != "baseline":
                            k = spec["num_speculative_tokens"]
                            acc = ACCEPT[w] * (0.9 if "ngram" in arm else 1.0) * (1 - 0.02 * (k - 3))
                            spec_block.update({"drafts": 100, "draft_tokens": 100 * k,
                                               "accepted_tokens": 100 * k * acc, "acceptance_rate": acc,
                                               "mean_acceptance_length": 1 + k * acc,
                                               "per_position": {str(i): acc ** (i + 0.5) for i in range(k)}})
                        summary = {
                            "schema": "specstudy.cell/1",
                            "keys": {"phase": phase, "arm": arm, "method": spec["method"],
                                     "num_speculative_tokens": spec.get("num_speculative_tokens"),
                                     "draft_tensor_parallel_size": spec.get("draft_tensor_parallel_size"),
                                     "rep": rep, "workload": w, "concurrency": c, "deployment_id": dep_id},
                            "fingerprint": hashlib.sha256(f"{arm}{w}{c}".encode()).hexdigest(),
                            "corpus": {"name": "mini", "version": "1", "digest": "sha256:abc"},
                            "validity": {"valid": valid, "throughput_valid": valid, "latency_valid": valid,
                                         "reasons": [] if valid else [{"code": "loadgen_limited",
                                                                       "detail": "event loop lag p99 31 ms"}]},
                            "requests": {"attempted": 4, "successful": 4, "failed": 0, "success_rate": 1.0,
                                         "missing_usage": 0},
                            "tokens": {"prompt": 400, "completion": 384, "output_tokens_per_second": otps},
                            "wall_seconds": 384 / otps,
                            "latency_ms": {"ttft": {"count": 4, "mean": 50.0 * noise, "p50": 48.0 * noise,
                                                    "p95": 70.0, "p99": 80.0},
                                           "tpot": {"count": 4, "mean": 1000 * c / otps, "p50": 1000 * c / otps,
                                                    "p95": 1200 * c / otps, "p99": 1300 * c / otps},
                                           "e2e": {"count": 4, "mean": 900.0, "p50": 880.0, "p95": 990.0,
                                                   "p99": 999.0}},
                            "speculative": spec_block,
                            "loadgen": {"limited": not valid},
                            "telemetry": {"gpu_memory_used_mib": {"mean": 1000.0, "max": 1100.0}},
                            "confounds": {"async_scheduling": arm == "baseline"},
                            "times": {"started_at": t, "ended_at": t + 30},
                        }
                        t += 60
                        _write(rdir / w / f"c{c}" / "summary.json", summary)
                        att = rdir / "attempts" / dep_id / w / f"c{c}"
                        att.mkdir(parents=True, exist_ok=True)
                        rows = []
                        for i in range(4):
                            rows.append({"request_index": i, "prompt_id": f"{w}-{i:04d}", "workload": w,
                                         "scheduled_s": None, "start_s": 0.1 * i, "end_s": 0.1 * i + 0.9,
                                         "start_unix": t + i, "ttft_ms": 40.0 + i, "e2e_ms": 900.0 + i,
                                         "tpot_ms": 9.0 + 0.1 * i, "completion_tokens": 96, "prompt_tokens": 100,
                                         "usage_present": True, "finish_reason": "length", "status_code": 200,
                                         "error": None, "success": True, "n_content_events": 90,
                                         "stream_event_gaps_ms": [1.0, 2.5], "tokens_per_event": [1, 2, 1],
                                         "output_sha256": "ff" * 32, "output_chars": 300})
                        (att / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
                        cells.append({"workload": w, "concurrency": c, "summary": str(rdir / w / f"c{c}" / "summary.json"),
                                      "status": "ok", "deployment_id": dep_id})
                cmd = ["vllm", "serve", "/models/target", "--tensor-parallel-size", "4"]
                if arm != "baseline":
                    sc = {k: v for k, v in spec.items() if k not in ("name",)}
                    if "draft" in arm:
                        sc["model"] = "/models/draft"
                    cmd += ["--speculative-config", json.dumps(sc, sort_keys=True)]
                _write(rdir / "deployment.json", {
                    "schema": "specstudy.deployment/1", "deployment_id": dep_id, "phase": phase, "arm": spec,
                    "rep": rep, "status": "ok", "failure": None, "command": cmd,
                    "provenance": {"hardware": {"hostname": f"nid00{rep % 2}"}, "vllm_version": "0.32.0"},
                    "confounds": {"async_scheduling": arm == "baseline",
                                  "max_num_batched_tokens": 8192, "max_num_scheduled_tokens": 8192 - (0 if arm == "baseline" else 512)},
                    "cache_config": {"block_size": 16, "num_gpu_blocks": KV[arm] // 16, "kv_cache_tokens": KV[arm]},
                    "smoke": {"captures": []}, "cells": cells,
                    "times": {"start": t - 500, "ready": t - 380, "stop": t + 5}})
    # an unservable configuration
    fdir = res / "deployment-failures" / "screen" / "draft-k3-tp1" / "rep0" / "screen-draft-k3-tp1-rep0-a1"
    _write(fdir / "failure.json", {"schema": "specstudy.deployment-failure/1", "deployment_id": "screen-draft-k3-tp1-rep0-a1",
                                   "phase": "screen", "arm": _spec("draft-k3-tp1"), "rep": 0, "rep_label": "rep0",
                                   "status": "failed", "command": None,
                                   "times": {"start": None, "ready": None, "stop": None},
                                   "failure": {"stage": "startup", "reason": "engine refused draft TP 1 with target TP 4",
                                               "error_excerpt": "AssertionError: draft_tensor_parallel_size",
                                               "log": "launch.log"}})
    (fdir / "launch.log").write_text("AssertionError\n")
    for phase in ("screen",) + (("confirm",) if confirm else ()):
        for arm, verdict in (("draft-k3-tp4", "pass"), ("ngram-k3", "fail"), ("draft-k5-tp4", "no_verdict")):
            if phase == "confirm" and arm != "draft-k3-tp4":
                continue
            worst = {"exact_matches": 5, "comparable": 6, "min_common_prefix_chars": 120,
                     "min_common_prefix_fraction": 0.4, "max_normalized_edit_distance": 0.3,
                     "max_completion_token_difference": 3}
            _write(res / "gates" / phase / f"{arm}.json", {
                "schema": "specstudy.gate/1", "arm": arm, "phase": phase, "verdict": verdict,
                "reasons": [] if verdict == "pass" else [{"code": "exceeds_control", "detail": "edit distance"}],
                "blocks_recommendation": verdict != "pass", "claim": "consistent with losslessness; not a proof",
                "margins": {"min_common_prefix_fraction": 0.0, "max_normalized_edit_distance": 0.05,
                            "max_completion_token_difference": 2},
                "control": {"kind": "cross_deployment", "arm": "baseline", "deployment_ids": [], "captures": [],
                            "pairs": [], "worst_case": worst, "n_pairs": 0, "n_deployments": 0},
                "treatment": {"pairs": [], "worst_case": worst, "all_prompts_succeeded": True, "n_pairs": 0}})
    _write(res / "selection" / "selection.json", {
        "schema": "specstudy.selection/1", "phase_of_inputs": "screen", "prereg_sha256": "0" * 64,
        "confirmation_arms": ["baseline", "draft-k3-tp4"], "candidates": [{"arm": "draft-k3-tp4", "why": "best"}],
        "inputs": [{"path": "results/screen/draft-k3-tp4/rep0/code/c1/summary.json", "sha256": "1" * 64}],
        "rule": "max median speedup"})
    cdir = res / "corpora" / "mini" / "1"
    _write(cdir / "corpus.json", {"name": "mini", "version": "1", "digest": "sha256:abc", "count": 12,
                                  "sources": [{"path": "code.jsonl", "sha256": "00", "license": "MIT"},
                                              {"path": "chat.jsonl", "sha256": "11", "license": "CC-BY-4.0"}]})
    _write(cdir / "token_stats.json", {"code": {"prompt_tokens": {"mean": 100, "p50": 98, "max": 200}},
                                       "chat": {"prompt_tokens": {"mean": 50, "p50": 45, "max": 90}}})
    return res


@pytest.fixture
def tree(tmp_path):
    return make_results_tree(tmp_path)


def test_rebuild_is_byte_identical(tree, tmp_path):
    out = tree / "tables"
    first = tables.build_tables(tree, out)
    digests = {t: hashlib.sha256(p.read_bytes()).hexdigest() for t, p in first.items()}
    shutil.rmtree(out)
    second = tables.build_tables(tree, out)
    assert {t: hashlib.sha256(p.read_bytes()).hexdigest() for t, p in second.items()} == digests
    # and a copy of the tree elsewhere gives the same bytes (no paths or times leak into the tables)
    other = tmp_path / "copy"
    shutil.copytree(tree, other / "results", ignore=shutil.ignore_patterns("tables"))
    third = tables.build_tables(other / "results", other / "t")
    assert {t: hashlib.sha256(p.read_bytes()).hexdigest() for t, p in third.items()} == digests


def test_table_contents(tree):
    tables.build_tables(tree, tree / "tables")
    t = tables.read_tables(tree / "tables")
    cells, reqs, deps, gates = t["cells"], t["requests"], t["deployments"], t["gates"]
    # screen: 4 arms x 3 reps x 6 cells; confirm: 2 arms x 3 reps x 6 cells
    assert len(cells) == 4 * 3 * 6 + 2 * 3 * 6
    assert len(reqs) == 4 * len(cells)
    assert reqs["chosen"].all()
    assert list(cells.columns[:6]) == [n for n, _ in tables.KEY_COLUMNS]
    bad = cells[~cells["valid"]]
    assert len(bad) == 1 and bad.iloc[0]["invalid_reasons"] == "loadgen_limited"
    row = cells[(cells.arm == "draft-k3-tp4") & (cells.workload == "code") & (cells.concurrency == 1)].iloc[0]
    assert row["num_speculative_tokens"] == 3 and row["draft_tensor_parallel_size"] == 4
    assert row["acceptance_rate"] == pytest.approx(0.7)
    assert len(row["per_position_acceptance"]) == 3
    assert row["corpus_digest"] == "sha256:abc"
    assert "telemetry.gpu_memory_used_mib.max" in cells.columns
    # sorted rows
    keys = list(zip(cells.phase, cells.arm, cells.rep, cells.workload, cells.concurrency, strict=True))
    assert keys == sorted(keys)
    failed = deps[deps.status == "failed"]
    assert list(failed.arm) == ["draft-k3-tp1"] and failed.iloc[0]["source"] == "failure_record"
    assert "refused" in failed.iloc[0]["failure_reason"]
    ok = deps[(deps.arm == "draft-k3-tp4") & (deps.phase == "screen")].iloc[0]
    assert ok["init_seconds"] == pytest.approx(120.0)
    assert ok["kv_cache_tokens"] == 300000 and not ok["async_scheduling"]
    assert json.loads(ok["speculative_config"])["model"] == "/models/draft"
    assert ok["hostname"] == "nid000"
    assert set(gates.verdict) == {"pass", "fail", "no_verdict"}
    assert gates[gates.arm == "ngram-k3"].iloc[0]["blocks_recommendation"]


def test_bad_summary_names_file(tmp_path):
    p = tmp_path / "results" / "screen" / "baseline" / "rep0" / "code" / "c1" / "summary.json"
    p.parent.mkdir(parents=True)
    p.write_text('{"keys": ')
    with pytest.raises(tables.TablesError, match="summary.json"):
        tables.collect(tmp_path / "results")


def test_type_violation_names_column():
    rows = [{"phase": "screen", "arm": "baseline", "rep": 0, "workload": "code", "concurrency": "many"}]
    with pytest.raises(tables.TablesError, match="concurrency"):
        tables.build_table("cells", rows)


def test_schema_rejects_bad_row():
    from specstudy.core.schemas import ValidationError

    with pytest.raises(ValidationError, match="arm"):
        tables.validate_rows("cells", [{"phase": "screen", "arm": "bogus", "rep": 0, "workload": "code",
                                        "concurrency": 1, "valid": True}], "x")


def test_empty_results(tmp_path):
    out = tables.build_tables(tmp_path, tmp_path / "t")
    t = tables.read_tables(tmp_path / "t")
    assert set(out) == set(tables.TABLE_NAMES) and len(t["cells"]) == 0


def test_cli(tree):
    from specstudy.cli import main

    assert main(["tables", "--results", str(tree), "--out", str(tree / "tables")]) == 0
    assert (tree / "tables" / "cells.parquet").exists()


def test_confounds_read_the_launch_log_parser_shape():
    """deployment.launchlog.parse_launch_log records async scheduling as {enabled, method, source, statement}."""
    from specstudy.analysis.tables import confound_fields

    row = confound_fields({"async_scheduling": {"enabled": False, "method": "ngram", "source": "log"}})
    assert row["async_scheduling"] is False
    assert confound_fields({"async_scheduling": {"enabled": True}})["async_scheduling"] is True
    assert confound_fields({})["async_scheduling"] is None


def _add_drift_deployment(res: Path, label: str = "drift1", t: float = 1_760_900_000.0) -> str:
    """Copy baseline rep0's chat/c1 cell into an interleaved drift baseline deployment ``screen/baseline/<label>``."""
    src = res / "screen" / "baseline" / "rep0"
    dst = res / "screen" / "baseline" / label
    dep_id = f"screen-baseline-{label}-a1"
    summary = json.loads((src / "chat" / "c1" / "summary.json").read_text())
    summary["keys"].update(rep=int(label.removeprefix("drift")), deployment_id=dep_id, kind="drift", rep_label=label)
    summary["times"] = {"started_at": t, "ended_at": t + 30}
    summary["tokens"]["output_tokens_per_second"] *= 0.9
    _write(dst / "chat" / "c1" / "summary.json", summary)
    dep = json.loads((src / "deployment.json").read_text())
    dep.update(deployment_id=dep_id, rep=summary["keys"]["rep"], rep_label=label, kind="drift",
               cells=[{"workload": "chat", "concurrency": 1, "summary": "x", "status": "valid", "deployment_id": dep_id}])
    _write(dst / "deployment.json", dep)
    return dep_id


def test_drift_deployments_reach_the_tables(tree):
    """Review #16.1: drift<n> deployments were measured and then ignored (tables read rep<n> only)."""
    dep_id = _add_drift_deployment(tree)
    rows = tables.collect(tree)
    drift_cells = [r for r in rows["cells"] if r["deployment_id"] == dep_id]
    assert len(drift_cells) == 1
    assert drift_cells[0]["kind"] == "drift" and drift_cells[0]["rep_label"] == "drift1"
    assert drift_cells[0]["rep"] == 1
    repeat = [r for r in rows["cells"] if r["arm"] == "baseline" and r["rep"] == 1 and r["kind"] == "repeat"]
    assert repeat and all(r["rep_label"] == "rep1" for r in repeat)
    reqs = {(r["kind"], r["rep_label"]) for r in rows["requests"] if r["arm"] == "baseline" and r["rep"] == 1}
    assert reqs == {("repeat", "rep1")}  # the copied drift cell has no attempt; rep1's requests are labelled
    deps = [r for r in rows["deployments"] if r["deployment_id"] == dep_id]
    assert len(deps) == 1 and deps[0]["kind"] == "drift" and deps[0]["rep_label"] == "drift1"
    tables.build_tables(tree, tree / "tables")
    from specstudy.inference import stats

    t = tables.read_tables(tree / "tables")
    dr = stats.drift(t["cells"], t["deployments"])
    assert dr["n_by_kind"]["drift"] == 1 and dr["drift_deployments"] == ["screen/drift1"]
    assert any(p["kind"] == "drift" for p in dr["points"])
    # drift baselines are never paired with arms
    comps = stats.comparisons(t["cells"])
    assert all(dep_id not in (r["base_deployment"] for r in c["repeats"]) for c in comps)


def test_cell_keys_keep_kind_and_rep_label():
    from specstudy.measure import cell

    keys = {"phase": "screen", "arm": "baseline", "method": "baseline", "num_speculative_tokens": None,
            "draft_tensor_parallel_size": None, "rep": 1, "workload": "chat", "concurrency": 1,
            "deployment_id": "d", "kind": "drift", "rep_label": "drift1"}
    s = cell.failed_summary(keys, {}, "deployment_failed", "x")
    assert s["keys"]["kind"] == "drift" and s["keys"]["rep_label"] == "drift1"
    cell.validate_summary(s)


def test_the_files_given_make_the_tables_of_the_tree(tree, tmp_path):
    """What rule tables passes (cell summaries, deployment records, gates) gives the bytes of the whole tree
    (attempts' request files and failure records are found beside the records through the layout)."""
    _add_drift_deployment(tree)
    whole = tables.build_tables(tree, tmp_path / "whole")
    cells = [p for p in tree.glob("*/*/*/*/c*/summary.json") if "attempts" not in p.parts]
    records = sorted(tree.glob("*/*/*/deployment.json"))
    gates = sorted(tree.glob("gates/*/*.json"))
    from specstudy.cli import main
    from specstudy.core.errors import UserError

    code = main(["tables", "--cells", *map(str, cells), "--deployments", *map(str, records),
                 "--gates", *map(str, gates), "--out", str(tmp_path / "given")])
    assert code == 0
    for t, p in whole.items():
        assert (tmp_path / "given" / p.name).read_bytes() == p.read_bytes(), t
    with pytest.raises(UserError, match="not a cell path"):
        tables.build_tables(None, tmp_path / "bad", files={"cells": [str(tree / "screen/baseline/code/c1/summary.json")]})
