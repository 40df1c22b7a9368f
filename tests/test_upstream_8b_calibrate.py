"""Upstream's 8B calibration sweep (tests/data/upstream-8b-calibrate, see its MANIFEST.md): two plain arms, a DSpark
and an EAGLE-3 drafter, imported from their summaries, placed in the tables with their KV cost, the two plain arms a
baseline-vs-baseline calibration; malformed input and unplaceable folders refused by name."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from specstudy.analysis import upstream
from specstudy.analysis.tables import TablesError, collect
from specstudy.core import atomic
from specstudy.inference import stats

DATA = Path(__file__).resolve().parent / "data" / "upstream-8b-calibrate"
SWEEP = DATA / "results" / "8b" / "sweeps" / "calibrate-20261008T224745Z"
COMMIT = "869be8c340c7580d761da981075c1a3b48dd4dc4"
# upstream's own statement of this sweep (docs/system-optimizations-8b.md of swiss-ai/apertus-speculative-decoding):
# output tokens/s relative to plain, k = 7, per (workload, concurrency); the two plain arms within 1.5 % at any C
UPSTREAM_SPEEDUP = {("dspark-k7+e10", "chat", 1): 1.87, ("dspark-k7+e10", "chat", 256): 0.74,
                    ("dspark-k7+e10", "summarization", 1): 1.52, ("dspark-k7+e10", "summarization", 256): 0.89,
                    ("eagle3-k7+e1", "chat", 1): 1.36, ("eagle3-k7+e1", "chat", 256): 0.74,
                    ("eagle3-k7+e1", "summarization", 1): 1.19, ("eagle3-k7+e1", "summarization", 256): 0.93}
UPSTREAM_PLAIN_SPREAD = 0.015
KV = {"baseline": 469840, "dspark-k7+e10": 342693, "eagle3-k7+e1": 433872}


def test_manifest_matches_files():
    text = (DATA / "MANIFEST.md").read_text(encoding="utf-8")
    listed = {}
    for m in re.finditer(r"^\| `([^`]+)` \| swiss-ai/apertus-speculative-decoding \| `([0-9a-f]{40})` \| ([0-9]+) \| "
                         r"`([0-9a-f]{64})` \| verbatim \|", text, re.M):
        assert m[2] == COMMIT
        listed[m[1]] = (int(m[3]), m[4])
    present = {str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file() and p.name != "MANIFEST.md"}
    assert present == set(listed), present ^ set(listed)
    for rel, (size, sha) in listed.items():
        raw = (DATA / rel).read_bytes()
        assert len(raw) == size and hashlib.sha256(raw).hexdigest() == sha, rel
        # the format upstream's harness writes: json.dumps(indent=2) and a newline
        assert raw.decode("ascii") == json.dumps(json.loads(raw), indent=2) + "\n", rel
    assert f"**Total: {len(listed)} files, {sum(s for s, _ in listed.values())} bytes.**" in text


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """`specstudy import-upstream <sweeps> --from-summaries`, `specstudy tables`, `specstudy report`."""
    from specstudy.cli import main

    results = tmp_path_factory.mktemp("calibrate") / "results"
    assert main(["import-upstream", str(DATA / "results" / "8b" / "sweeps"), str(results), "--from-summaries"]) == 0
    assert main(["tables", "--results", str(results), "--out", str(results / "tables")]) == 0
    assert main(["report", "--results", str(results), "--tables", str(results / "tables"),
                 "--out", str(results / "report")]) == 0
    return results


def test_the_calibrate_cells_import_as_arms_with_their_settings_from_their_summaries(imported):
    screen = imported / "screen"
    assert sorted(p.name for p in screen.iterdir()) == ["baseline", "dspark-k7+e10", "eagle3-k7+e1"]
    dspark = atomic.read_json(screen / "dspark-k7+e10" / "rep1" / "deployment.json")
    meta = atomic.read_json(SWEEP / "dspark-e10-k7" / "chat" / "chat" / "c1" / "metadata.json")
    assert dspark["arm"]["method"] == "dspark" and dspark["arm"]["num_speculative_tokens"] == 7
    assert dspark["arm"]["variant"] == "e10" and dspark["arm"]["drafter"] == meta["extra"]["dspark_checkpoint"]
    assert dspark["arm"]["speculative_config"] == json.loads(meta["extra"]["speculative_config"])
    eagle = atomic.read_json(screen / "eagle3-k7+e1" / "rep1" / "deployment.json")
    assert eagle["arm"]["method"] == "eagle3" and eagle["arm"]["upstream_variant"]["algorithm"] == "eagle31"
    assert eagle["arm"]["drafter"].endswith("e31-opb-thinkoff-stage1-ep1-se")
    assert eagle["tensor_parallel_size"] == {"target": 1, "draft": 1}
    # summary-only, and marked so in the deployment record and every cell
    for rec in (dspark, eagle):
        assert rec["provenance"]["summary_only"] is True and rec["status"] == "ok"
        assert rec["provenance"]["imported_from"] == f"imported from upstream swiss-ai/apertus-speculative-decoding@{COMMIT}"
        # the cells without a metadata.json of their own take the deployment's, which provenance lists
        assert any(f["path"].endswith("chat/chat/c1/metadata.json") for f in rec["provenance"]["files"])
    cell = atomic.read_json(screen / "dspark-k7+e10" / "rep1" / "chat" / "c256" / "summary.json")
    assert cell["upstream"]["summary_only"] is True and cell["upstream"]["layout"] == "sweep"
    assert [n["code"] for n in cell["validity"]["notes"]] == ["summary_only"]
    assert cell["server_deltas"]["available"] is False
    up = atomic.read_json(SWEEP / "dspark-e10-k7" / "chat" / "chat" / "c256" / "summary.json")
    assert cell["tokens"]["output_tokens_per_second"] == up["tokens"]["output_tokens_per_second"]
    assert cell["speculative"]["accepted_tokens"] == up["speculative_decoding"]["accepted_tokens"] == 119941.0


def test_the_kv_pool_of_each_summary_fills_the_deployment_record_and_the_tables(imported):
    deps = pd.read_parquet(imported / "tables" / "deployments.parquet")
    assert sorted(zip(deps["arm"], deps["rep"], deps["kv_cache_tokens"].astype(int), strict=True)) == [
        ("baseline", 1, KV["baseline"]), ("baseline", 2, KV["baseline"]),
        ("dspark-k7+e10", 1, KV["dspark-k7+e10"]), ("eagle3-k7+e1", 1, KV["eagle3-k7+e1"])]
    rec = atomic.read_json(imported / "screen" / "dspark-k7+e10" / "rep1" / "deployment.json")
    assert rec["cache_config"] == {"num_gpu_blocks": None, "block_size": None, "kv_cache_tokens": 342693}
    assert "load.kv_cache_size_tokens of 4 summary.json" in rec["provenance"]["cache_config_source"]
    assert "cache_config" not in rec["provenance"]["fields_not_measured"]
    # the drafter's KV cost: 27 % of the baseline's pool for DSpark, 8 % for EAGLE (upstream: -27 %, -8 %)
    cost = stats.memory_costs(deps)
    assert cost == pytest.approx({"dspark-k7+e10": 1 - 342693 / 469840, "eagle3-k7+e1": 1 - 433872 / 469840})
    assert round(cost["dspark-k7+e10"], 2) == 0.27 and round(cost["eagle3-k7+e1"], 2) == 0.08
    report = (imported / "report" / "report.md").read_text()
    assert "dspark-k7+e10 vs baseline: differs in kv_cache_tokens" in report


def test_the_arms_speedups_are_upstreams_and_plain_a_b_are_a_baseline_calibration(imported):
    cells = pd.read_parquet(imported / "tables" / "cells.parquet")
    base = cells[cells["arm"] == "baseline"]
    # plain-a and plain-b: two deployments of the one baseline arm, repeats 1 and 2
    assert dict(zip(base["rep"], base["deployment_id"], strict=True)) == {1: "calibrate-3619818-plain-a", 2: "calibrate-3619818-plain-b"}
    rec = atomic.read_json(imported / "screen" / "baseline" / "rep2" / "deployment.json")
    assert rec["deployment_id"] == "calibrate-3619818-plain-b" and rec["arm"] == {"name": "baseline", "method": "baseline"}
    two = base.pivot_table(index=["workload", "concurrency"], columns="rep", values="output_tokens_per_second")
    spread = (two[2] / two[1] - 1).abs()
    assert len(spread) == 4 and (spread < UPSTREAM_PLAIN_SPREAD).all() and spread.max() > 0.005  # 0.46..0.72 %
    comps = {(c["arm"], c["workload"], c["concurrency"]): c for c in stats.comparisons(cells) if c["phase"] == "screen"}
    assert set(comps) == set(UPSTREAM_SPEEDUP)
    for key, stated in UPSTREAM_SPEEDUP.items():
        (r,) = comps[key]["repeats"]  # paired with rep 1, plain-a: upstream's "plain (calibration)"
        assert r["base_deployment"] == "calibrate-3619818-plain-a"
        assert round(r["speedup"], 2) == stated, key


def test_a_report_without_comparisons_says_what_was_left_out_and_why(imported):
    rec = json.loads((imported / "report" / "recommendation.json").read_text())
    (why,) = [m for m in rec["recommendation"]["missing"] if m.startswith("no confirm comparisons")]
    assert "has the confirm phase run" not in why
    assert "holds no confirm cells" in why and "screen: baseline (8 cells), dspark-k7+e10 (4 cells), eagle3-k7+e1 (4 cells)" in why
    assert "recommendation.phase" in why and "--phase confirm" in why
    report = (imported / "report" / "report.md").read_text()
    assert "No confirm comparisons: the cells table holds no confirm cells" in report
    assert "has the confirm phase run" not in report


def test_a_malformed_summary_is_refused_naming_the_file_and_the_field(tmp_path):
    src = SWEEP / "eagle-e1-k7"
    dep = tmp_path / "calibrate-x" / "eagle-e1-k7"
    shutil.copytree(src, dep)
    cell = dep / "chat" / "chat" / "c256"
    bad = json.loads((cell / "summary.json").read_text())
    bad["tokens"]["output_tokens_per_second"] = "fast"
    (cell / "summary.json").write_text(json.dumps(bad))
    with pytest.raises(upstream.UpstreamError) as exc:
        upstream.convert_summary(cell, "screen")
    assert str(exc.value).startswith(f"{cell / 'summary.json'}: field 'tokens.output_tokens_per_second' = 'fast'")
    del bad["latency_ms"]["tpot"]["p50"]
    bad["tokens"]["output_tokens_per_second"] = 4153.2
    (cell / "summary.json").write_text(json.dumps(bad))
    with pytest.raises(upstream.UpstreamError, match=r"c256/summary.json: upstream summary lacks field 'latency_ms.tpot.p50'"):
        upstream.convert_summary(cell, "screen")
    # through the CLI: the cell is an error naming file and field, and the exit status says so
    from specstudy.cli import main

    assert main(["import-upstream", str(tmp_path), str(tmp_path / "out"), "--from-summaries"]) == 2
    # a deployment whose summaries state two KV pools is refused, naming the field
    (cell / "summary.json").write_bytes((src / "chat" / "chat" / "c256" / "summary.json").read_bytes())
    other = json.loads((cell / "summary.json").read_text())
    other["load"]["kv_cache_size_tokens"] = 1234
    (cell / "summary.json").write_text(json.dumps(other))
    assert main(["import-upstream", str(tmp_path), str(tmp_path / "out2"), "--from-summaries"]) == 2


def test_two_sweep_deployments_of_one_arm_name_with_different_settings_are_refused(tmp_path):
    sweep = tmp_path / "calibrate-y"
    shutil.copytree(SWEEP / "dspark-e10-k7", sweep / "dspark-e10-k7")
    shutil.copytree(SWEEP / "dspark-e10-k7", sweep / "dspark-copy")
    meta_path = sweep / "dspark-copy" / "chat" / "chat" / "c1" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["extra"]["deployment_id"] = "calibrate-y-dspark-copy"
    meta["extra"]["speculative_config"] = meta["extra"]["speculative_config"].replace("epoch10_final", "epoch10_other")
    meta_path.write_text(json.dumps(meta))
    cells = sorted(p.parent for p in sweep.rglob("summary.json"))
    with pytest.raises(upstream.UpstreamError, match=r"two upstream deployments map to arm 'dspark-k7\+e10' with "
                                                     r"different settings"):
        upstream.sweep_repeats(cells)
    # identical settings (only upstream's label and deployment id differ) are the arm's repeats 1, 2
    meta["extra"]["speculative_config"] = meta["extra"]["speculative_config"].replace("epoch10_other", "epoch10_final")
    meta_path.write_text(json.dumps(meta))
    reps = upstream.sweep_repeats(cells)
    # in the order of their deployment ids: calibrate-3619818-dspark-e10-k7 before calibrate-y-dspark-copy
    assert {d.parts[-4]: r["rep"] for d, r in reps.items()} == {"dspark-e10-k7": 1, "dspark-copy": 2}


def test_tables_refuse_a_folder_they_cannot_place_naming_it_and_the_fix(imported, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(imported / "screen", results / "screen")
    assert {r["arm"] for r in collect(results)["cells"]} == {"baseline", "dspark-k7+e10", "eagle3-k7+e1"}
    # an arm of an unregistered method (what an older import wrote for DSpark): refused, not left out
    (results / "screen" / "dspark-k7+e10").rename(results / "screen" / "medusa-k7")
    with pytest.raises(TablesError) as exc:
        collect(results)
    msg = str(exc.value)
    assert msg.startswith(f"{results / 'screen' / 'medusa-k7'}: folder of phase screen whose name 'medusa-k7' is not "
                          "an arm name") and "Fix: rename the folder" in msg and "core/arms.py" in msg
    (results / "screen" / "medusa-k7").rename(results / "screen" / "dspark-k7+e10")
    (results / "screen" / "eagle3-k7+e1" / "rep1").rename(results / "screen" / "eagle3-k7+e1" / "rep1-old")
    with pytest.raises(TablesError, match=r"rep1-old: folder of arm eagle3-k7\+e1 whose name 'rep1-old' is not a "
                                          r"deployment"):
        collect(results)


def test_a_sweep_deployment_without_metadata_takes_its_arm_from_the_arm_flag(tmp_path, capsys):
    from specstudy.cli import main

    sweep = tmp_path / "calibrate-z"
    for arm in ("plain-b", "dspark-e10-k7"):
        shutil.copytree(SWEEP / arm, sweep / arm, ignore=shutil.ignore_patterns("metadata.json"))
    assert main(["import-upstream", str(tmp_path), str(tmp_path / "out"), "--from-summaries"]) == 2
    err = capsys.readouterr().err
    assert "names no arm: pass --arm dspark-e10-k7=<arm>" in err and "pass --arm plain-b=<arm>" in err
    assert main(["import-upstream", str(tmp_path), str(tmp_path / "out"), "--from-summaries",
                 "--arm", "plain-b=baseline", "--arm", "dspark-e10-k7=dspark-k7+e10"]) == 0
    assert "8 cell(s) imported" in capsys.readouterr().err
    s = atomic.read_json(tmp_path / "out" / "screen" / "dspark-k7+e10" / "rep1" / "chat" / "c1" / "summary.json")
    assert s["upstream"]["arm_source"].startswith("--arm dspark-e10-k7=dspark-k7+e10")
    assert s["keys"]["deployment_id"] == "calibrate-z/dspark-e10-k7"
    # the record says what it lacks: no metadata.json, so no drafter path or TP, but the KV pool of the summaries
    rec = atomic.read_json(tmp_path / "out" / "screen" / "dspark-k7+e10" / "rep1" / "deployment.json")
    assert rec["arm"]["method"] == "dspark" and rec["cache_config"]["kv_cache_tokens"] == KV["dspark-k7+e10"]
    assert "tensor_parallel_size" in rec["provenance"]["fields_not_measured"]
