"""The upstream 8B study (tests/data/upstream-8b, see its MANIFEST.md): the importer's 8B layouts and methods,
and the project's analysis on upstream's EAGLE k = 2 confirmation beside upstream's confirm-report.json."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import data_path
from specstudy.analysis import upstream, upstream_confirm
from specstudy.core import atomic, schemas
from specstudy.measure import prom

DATA = data_path("upstream-8b")
EAGLE = DATA / "results" / "8b" / "eagle"
CONFIRM = EAGLE / "confirm"
REPORT = EAGLE / "confirm-report.json"
K2_CELL = CONFIRM / "apertus15-8b-eagle31-k2-confirm-c1-20260926T132526Z" / "cells" / "code" / "c1"
K2_META = K2_CELL / "metadata.json"
RAW_FILES = ("requests.jsonl", "metrics_before.prom", "metrics_after.prom")
DSPARK = DATA / "results" / "8b" / "sweeps" / "calibrate-20261008T224745Z" / "dspark-e10-k7" / "probe"
# real raw cells (requests.jsonl + .prom pairs) of the 70B set, for the layout tests below
SMOKE70 = data_path("upstream-70b", "results", "70b", "smoke-screening-20260913-debug")
DRAFT70 = SMOKE70 / "draft-n3-tp4-3391426" / "open_chat" / "c1" / "repeat-01"
BASE70 = SMOKE70 / "baseline-3391425" / "open_chat" / "c1" / "repeat-01"
ARMS = {"baseline": "baseline", "eagle31-k2": "eagle3-k2"}


# ------------------------------------------------------------------------------------------- the data set
def test_manifest_matches_files():
    text = (DATA / "MANIFEST.md").read_text(encoding="utf-8")
    listed = {}
    for m in re.finditer(r"^\| `([^`]+)` \| swiss-ai/apertus-speculative-decoding \| `([0-9a-f]{40})` \| ([0-9]+) \| "
                         r"`([0-9a-f]{64})` \| verbatim \|", text, re.M):
        listed[m[1]] = (int(m[3]), m[4])
    present = {str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file() and p.name != "MANIFEST.md"}
    assert present == set(listed), (present ^ set(listed))
    for rel, (size, sha) in listed.items():
        raw = (DATA / rel).read_bytes()
        assert len(raw) == size, rel
        assert hashlib.sha256(raw).hexdigest() == sha, rel
        if rel.endswith(".json"):
            json.loads(raw)
        elif rel.endswith(".jsonl"):
            assert all(json.loads(line) for line in raw.decode().splitlines())
        else:
            assert rel.endswith(".prom") and prom.parse(raw.decode()).index, rel
    assert f"**Total: {len(listed)} files, {sum(s for s, _ in listed.values())} bytes.**" in text


# ------------------------------------------------------------------------------------------- the importer
def test_eagle3_and_dspark_map_to_arms_with_their_settings():
    meta = atomic.read_json(K2_META)
    name, spec = upstream.arm_of(meta["variant"], meta["extra"])
    assert name == "eagle3-k2" and spec["method"] == "eagle3" and spec["num_speculative_tokens"] == 2
    assert spec["upstream_variant"]["algorithm"] == "eagle31" and spec["draft_tensor_parallel_size"] == 1
    assert spec["drafter"] == meta["extra"]["eagle_head"] and "note" not in spec

    dmeta = atomic.read_json(DSPARK / "metadata.json")
    name, spec = upstream.arm_of(dmeta["variant"], dmeta["extra"])
    # the checkpoint tag of upstream's sweep arm label (dspark-e10-k7) is the arm's variant
    assert name == "dspark-k7+e10" and spec["method"] == "dspark" and spec["variant"] == "e10"
    assert "dspark-e10-k7" in spec["variant_source"]
    assert spec["speculative_config"] == json.loads(dmeta["extra"]["speculative_config"])
    assert spec["drafter"] == dmeta["extra"]["dspark_checkpoint"]
    # one of the project's arm methods now: no note, and the arm name is one core.arms parses back
    assert "note" not in spec and "draft_tensor_parallel_size" not in spec  # upstream's null is not a TP
    from specstudy.core.arms import parse_arm

    assert parse_arm(name) == {"name": name, "method": "dspark", "num_speculative_tokens": 7, "variant": "e10"}


def test_any_engine_method_is_an_arm_and_a_method_without_depth_is_a_named_error():
    name, spec = upstream.arm_of({"method": "Medusa", "num_speculative_tokens": 4})
    assert name == "medusa-k4" and spec["upstream_variant"]["method"] == "Medusa" and spec["note"]
    with pytest.raises(upstream.UpstreamError, match=r"variant.num_speculative_tokens' = None for method 'mtp'"):
        upstream.arm_of({"method": "mtp"}, where="x/metadata.json")
    bad = {"speculative_config": "{not json"}
    with pytest.raises(upstream.UpstreamError, match=r"extra.speculative_config' is not JSON"):
        upstream.arm_of({"method": "dspark", "num_speculative_tokens": 7}, bad)


def test_block_id_is_the_deployment_repeat():
    meta = atomic.read_json(K2_META)
    assert meta["cell"]["repeat"] == 1 and meta["extra"]["block_id"] == "c1"
    assert upstream.repeat_of(meta, K2_META) == 1
    m3 = copy.deepcopy(meta)
    m3["extra"]["block_id"] = "c3"
    assert upstream.repeat_of(m3, K2_META) == 3
    m3["extra"]["block_id"] = "last"
    with pytest.raises(upstream.UpstreamError, match=r"extra.block_id' = 'last' is not a block label"):
        upstream.repeat_of(m3, K2_META)
    m3["extra"]["block_id"], m3["cell"]["repeat"] = "c2", 2
    with pytest.raises(upstream.UpstreamError, match=r"cell.repeat' = 2 inside block 'c2'"):
        upstream.repeat_of(m3, K2_META)
    del m3["extra"]["block_id"]
    assert upstream.repeat_of(m3, K2_META) == 2  # the 70B layout: cell.repeat


def test_the_dspark_cell_reproduces_upstreams_summary(tmp_path, capsys):
    """The one complete real 8B cell: a DSpark k = 7 drafter, imported from the sweep layout."""
    rows, s, up = upstream.convert_cell(DSPARK)
    u = up["summary"]
    schemas.validate(s, "cell-summary", "converted")
    assert s["keys"]["arm"] == "dspark-k7+e10" and s["keys"]["method"] == "dspark" and s["keys"]["concurrency"] == 8
    assert s["keys"]["deployment_id"] == "calibrate-3619818-dspark-e10-k7"
    assert s["validity"]["valid"] is True and s["validity"]["throughput_valid"] is True
    assert s["requests"]["attempted"] == u["requests"]["attempted"] == 64
    assert s["tokens"]["completion"] == u["tokens"]["completion"] == 18457
    assert s["tokens"]["output_tokens_per_second"] == u["tokens"]["output_tokens_per_second"]
    sp, us = s["speculative"], u["speculative_decoding"]
    for k in ("drafts", "draft_tokens", "accepted_tokens", "acceptance_rate", "mean_acceptance_length"):
        assert sp[k] == us[k], k
    assert sp["per_position"] == us["acceptance_rate_per_position"] and len(sp["per_position"]) == 7
    for metric in ("ttft", "stream_event_gap"):
        for k in ("count", "mean", "p50", "p95", "p99"):
            assert s["latency_ms"][metric][k] == pytest.approx(u["latency_ms"][metric][k], rel=1e-12)
    ud = s["upstream"]["latency_ms_upstream_definition"]
    for metric in ("e2e", "tpot"):
        for k in ("count", "mean", "p50", "p95", "p99"):
            assert ud[metric][k] == pytest.approx(u["latency_ms"][metric][k], rel=1e-12)
    sd = s["server_deltas"]
    assert sd["generation_tokens"] == 18457 and sd["requests_finished"] == 64 and sd["generation_tokens_minus_client"] == 0
    # ours ends at the last content event, upstream's after the usage chunk: ours is never longer
    assert all(r["e2e_ms"] <= r["upstream"]["e2e_ms"] for r in rows)
    assert s["latency_ms"]["tpot"]["p50"] < u["latency_ms"]["tpot"]["p50"]
    # the sweep layout through the CLI: <out>/<arm>/rep1/<workload>/c<c>
    sweep = DATA / "results" / "8b" / "sweeps"
    assert upstream.cmd_import(_args(sweep, tmp_path / "out")) == 0
    out = tmp_path / "out" / "screen" / "dspark-k7+e10" / "rep1" / "probe" / "c8"
    assert atomic.read_json(out / "summary.json")["upstream"]["variant"]["method"] == "dspark"
    assert (out / "metrics_after.prom").read_bytes() == (DSPARK / "metrics_after.prom").read_bytes()
    captured = capsys.readouterr()
    assert " valid " in next(x for x in captured.out.splitlines() if x.startswith("dspark-k7+e10"))
    # the deployment record: KV from the scrape's cache_config_info, provenance from the manifest, the rest null
    dep = atomic.read_json(out.parent.parent / "deployment.json")
    assert dep["deployment_id"] == "calibrate-3619818-dspark-e10-k7" and dep["arm"]["method"] == "dspark"
    assert dep["cache_config"]["kv_cache_tokens"] == prom.kv_cache_config(
        (DSPARK / "metrics_before.prom").read_text())["kv_cache_tokens"] == 342693
    assert dep["provenance"]["imported_from"] == ("imported from upstream swiss-ai/apertus-speculative-decoding@"
                                                  "869be8c340c7580d761da981075c1a3b48dd4dc4")
    # this sweep's metadata.json names no target TP (extra.target_tensor_parallel_size): null, with the reason
    assert "target_tensor_parallel_size" not in atomic.read_json(DSPARK / "metadata.json")["extra"]
    assert dep["tensor_parallel_size"] is None and "tensor_parallel_size" in dep["provenance"]["fields_not_measured"]
    assert dep["command"] is None and "command" in dep["provenance"]["fields_not_measured"]
    # dspark is a registered method (core.methods): a project arm, its record valid against the generated schema
    assert "is not one of this project's arms" not in captured.err
    schemas.validate(dep, "deployment")


def test_the_eagle_confirmation_cell_reproduces_upstreams_summary(tmp_path, capsys):
    """The one complete raw confirmation cell (EAGLE-3.1 k = 2, block c1, code, c1): recomputed from its
    requests.jsonl and .prom pair, against upstream's own summary.json and confirm-report.json."""
    rows, s, up = upstream.convert_cell(K2_CELL, "confirm")
    u = up["summary"]
    assert u == atomic.read_json(K2_CELL / "summary.json")
    schemas.validate(s, "cell-summary", "converted")
    assert s["keys"] == {"phase": "confirm", "arm": "eagle3-k2", "method": "eagle3", "num_speculative_tokens": 2,
                         "draft_tensor_parallel_size": 1, "rep": 1, "workload": "code", "concurrency": 1,
                         "deployment_id": "apertus15-8b-eagle31-k2-confirm-c1-20260926T132526Z"}
    assert s["validity"]["valid"] is True and s["validity"]["throughput_valid"] is True and s["validity"]["notes"] == []
    # requests and tokens: the project's success rule over the rows gives upstream's counts
    for k in ("attempted", "successful", "failed", "success_rate", "requests_per_second"):
        assert s["requests"][k] == u["requests"][k], k
    assert s["requests"]["attempted"] == 128 and s["requests"]["missing_usage"] == 0
    assert (s["tokens"]["prompt"], s["tokens"]["completion"]) == (u["tokens"]["prompt"], u["tokens"]["completion"]) \
        == (64445, 25837)
    # output tokens/s: completion tokens / upstream's wall (the same definition): exact
    assert s["tokens"]["output_tokens_per_second"] == u["tokens"]["output_tokens_per_second"] == 25837 / u["wall_seconds"]
    # the speculative counters from the .prom deltas (the same definition): exact
    sp, us = s["speculative"], u["speculative_decoding"]
    for k in ("drafts", "draft_tokens", "accepted_tokens", "acceptance_rate", "mean_acceptance_length"):
        assert sp[k] == us[k], k
    assert (sp["drafts"], sp["draft_tokens"], sp["accepted_tokens"]) == (11273, 22546, 14544)
    assert sp["per_position"] == us["acceptance_rate_per_position"] == {"0": 8437 / 11273, "1": 6107 / 11273}
    # TTFT and stream-event gaps (the same definitions)
    for metric in ("ttft", "stream_event_gap"):
        assert s["latency_ms"][metric]["count"] == u["latency_ms"][metric]["count"]
        for k in ("mean", "p50", "p95", "p99"):
            assert s["latency_ms"][metric][k] == pytest.approx(u["latency_ms"][metric][k], rel=1e-12), (metric, k)
    assert s["latency_ms"]["stream_event_gap"]["count"] == 11234
    # E2E and TPOT: upstream's definition (to the end of the stream, usage chunk and [DONE] included), recomputed
    ud = s["upstream"]["latency_ms_upstream_definition"]
    for metric in ("e2e", "tpot"):
        assert ud[metric]["count"] == u["latency_ms"][metric]["count"] == 128
        for k in ("mean", "p50", "p95", "p99"):
            assert ud[metric][k] == pytest.approx(u["latency_ms"][metric][k], rel=1e-12), (metric, k)
    # the project's E2E/TPOT end at the last content event: never longer, TPOT p50 0.56 % below upstream's
    assert all(r["e2e_ms"] <= r["upstream"]["e2e_ms"] for r in rows)
    assert s["latency_ms"]["tpot"]["p50"] == pytest.approx(2.94475, abs=5e-5)
    assert s["latency_ms"]["tpot"]["p50"] < u["latency_ms"]["tpot"]["p50"]
    assert 0.005 < 1 - s["latency_ms"]["tpot"]["p50"] / u["latency_ms"]["tpot"]["p50"] < 0.006
    # the server's deltas account for exactly the clients' requests and tokens (no foreign traffic)
    sd = s["server_deltas"]
    assert sd["generation_tokens"] == 25837 and sd["prompt_tokens"] == 64445 and sd["generation_tokens_minus_client"] == 0
    assert sd["requests_finished"] == 128 and sd["preemptions"] == 0
    by_reason = {k: v for k, v in sd["requests_finished_by_reason"].items() if v}
    assert by_reason == {"stop": 122, "length": 6} == {
        f: sum(1 for r in rows if r["finish_reason"] == f) for f in ("stop", "length")}
    # EAGLE streams several accepted tokens per event: 25837 tokens in 11234 gaps + 128 first events
    assert s["tokens_per_event"]["completion_tokens_per_content_event"] == pytest.approx(25837 / (11234 + 128), rel=1e-12)
    # through the CLI, the confirmation layout: <out>/confirm/eagle3-k2/rep1/code/c1 and the deployment record
    assert upstream.cmd_import(_args(K2_CELL, tmp_path / "out", phase="confirm")) == 0
    out = tmp_path / "out" / "confirm" / "eagle3-k2" / "rep1" / "code" / "c1"
    assert atomic.read_json(out / "summary.json")["upstream"]["block_id"] == "c1"
    for name in RAW_FILES[1:]:
        assert (out / name).read_bytes() == (K2_CELL / name).read_bytes()
    assert " valid " in next(x for x in capsys.readouterr().out.splitlines() if x.startswith("eagle3-k2"))
    dep = atomic.read_json(out.parent.parent / "deployment.json")
    schemas.validate(dep, "deployment", "deployment.json")
    # the KV pool of upstream's scrape is the one upstream's report states for this deployment
    kv = json.loads(REPORT.read_text())["deployments"][dep["deployment_id"]]["kv_cache_tokens"]
    assert dep["cache_config"]["kv_cache_tokens"] == kv == 438784 and dep["cache_config"]["num_gpu_blocks"] == 27424
    assert "vllm:cache_config_info" in dep["provenance"]["cache_config_source"]
    assert dep["provenance"]["summary_only"] is False and dep["tensor_parallel_size"] == {"target": 1, "draft": 1}
    assert dep["provenance"]["imported_from"] == ("imported from upstream swiss-ai/apertus-speculative-decoding@"
                                                  "8ffc38d7a32e5509f51a6dd9fcd48d249b5569dc")
    assert {Path(f["path"]).name for f in dep["provenance"]["files"]} == {*RAW_FILES, "summary.json", "metadata.json"}


def test_deployment_id_of_each_layout(tmp_path):
    meta = atomic.read_json(K2_META)
    assert upstream._deployment_id(K2_META.parent, meta) == meta["extra"]["deployment_id"]
    bare = {"extra": {}}
    assert upstream._deployment_id(Path("r/70b/smoke/draft-n3-tp4-3391426/open_chat/c1/repeat-01"), bare) == \
        "draft-n3-tp4-3391426"
    assert upstream._deployment_id(Path("r/confirm/dep-c2/cells/code/c8"), bare) == "dep-c2"
    assert upstream._deployment_id(Path("r/sweeps/calibrate-x/dspark-e10-k7/chat/chat/c1"), bare) == \
        "calibrate-x/dspark-e10-k7"


def _block_cell(root: Path, block: str, meta: dict) -> Path:
    """An 8B confirmation-layout cell: the real raw cell of block c1 (code, c1) with its metadata.json's block and
    deployment set to ``block`` (the data set holds the raw files of that one confirmation cell, MANIFEST.md)."""
    dep = f"apertus15-8b-eagle31-k2-confirm-{block}-20260926T132526Z"
    d = root / dep / "cells" / "code" / "c1"
    d.mkdir(parents=True)
    for name in (*RAW_FILES, "summary.json"):
        shutil.copyfile(K2_CELL / name, d / name)
    m = copy.deepcopy(meta)
    m["extra"].update(block_id=block, deployment_id=dep)
    (d / "metadata.json").write_text(json.dumps(m, indent=2) + "\n")
    # kept verbatim beside the converted cell (its content is not interpreted)
    (d / "metrics_timeseries.jsonl").write_text(json.dumps({"t": 0.0, "block": block}) + "\n")
    return d


def test_confirmation_blocks_import_as_repeats_without_overwriting(tmp_path, capsys):
    meta = atomic.read_json(K2_META)
    src = tmp_path / "confirm"
    for b in ("c1", "c2", "c3"):
        _block_cell(src, b, meta)
    results = tmp_path / "results"
    assert upstream.cmd_import(_args(src, results, phase="confirm")) == 0
    assert "3 cell(s) imported, 0 incomplete, 0 with errors, 3 deployment record(s)" in capsys.readouterr().err
    out = results / "confirm"
    deps = set()
    for rep in (1, 2, 3):
        cell_dir = out / "eagle3-k2" / f"rep{rep}" / "code" / "c1"
        s = atomic.read_json(cell_dir / "summary.json")
        schemas.validate(s, "cell-summary")
        assert s["keys"]["phase"] == "confirm" and s["keys"]["rep"] == rep and s["keys"]["method"] == "eagle3"
        assert s["upstream"]["block_id"] == f"c{rep}" and s["upstream"]["raw_artifacts"] == ["metrics_timeseries.jsonl"]
        src_ts = src / s["keys"]["deployment_id"] / "cells" / "code" / "c1" / "metrics_timeseries.jsonl"
        assert (cell_dir / "metrics_timeseries.jsonl").read_bytes() == src_ts.read_bytes()
        deps.add(s["keys"]["deployment_id"])
    assert len(deps) == 3
    # a second deployment of block c1 would land on rep1: refused, the first stays
    other = tmp_path / "other"
    d = _block_cell(other, "c1", meta)
    m = atomic.read_json(d / "metadata.json")
    m["extra"]["deployment_id"] = "another-deployment"
    (d / "metadata.json").write_text(json.dumps(m))
    with pytest.raises(upstream.UpstreamError, match=r"already holds deployment 'apertus15-8b-eagle31-k2-confirm-c1-"):
        upstream.import_cell(d, results, "confirm")
    # re-importing the same deployment is fine (same path, same deployment)
    upstream.import_cell(src / "apertus15-8b-eagle31-k2-confirm-c1-20260926T132526Z" / "cells" / "code" / "c1", results,
                         "confirm")


def _args(source, out=None, strict=False, phase="screen", **kw):
    import argparse

    ns = {"from_summaries": False, "arm": [], "report": None, "source_commit": None, **kw}
    return argparse.Namespace(source=str(source), out=None if out is None else str(out), strict=strict, phase=phase, **ns)


def test_swapped_scrapes_say_counter_decreased_in_the_files(tmp_path):
    d = tmp_path / "cell"
    shutil.copytree(DRAFT70, d)
    before, after = (d / "metrics_before.prom").read_text(), (d / "metrics_after.prom").read_text()
    (d / "metrics_before.prom").write_text(after)
    (d / "metrics_after.prom").write_text(before)
    with pytest.raises(upstream.UpstreamError) as exc:
        upstream.convert_cell(d)
    msg = str(exc.value)
    assert msg.startswith(f"counter decreased in {d / 'metrics_before.prom'} -> {d / 'metrics_after.prom'}")
    assert "swapped" in msg and "summary.json (converted)" not in msg


def test_console_shows_throughput_validity(tmp_path, capsys):
    d = tmp_path / "baseline-1" / "open_chat" / "c1" / "repeat-01"
    shutil.copytree(BASE70, d)
    rows = atomic.read_jsonl(d / "requests.jsonl")
    rows[3]["completion_tokens"] = None  # a successful request whose usage record never arrived
    atomic.write_jsonl(d / "requests.jsonl", rows)
    s = upstream.convert_cell(d)[1]
    assert s["validity"]["valid"] is True and s["validity"]["throughput_valid"] is False
    assert upstream.cmd_import(_args(tmp_path)) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("baseline"))
    assert " lat-only " in line and " True " not in line and " valid " not in line
    assert upstream.validity_label({"valid": True, "throughput_valid": True, "tpot_valid": True}) == "valid"
    assert upstream.validity_label({"valid": False, "throughput_valid": False}) == "invalid"


# --------------------------------------------------- the pipeline (import, tables, report) vs upstream's report
IMPORT_ARGS = [str(CONFIRM), "--phase", "confirm", "--from-summaries", "--arm", "eagle31-k2=eagle3-k2",
               "--report", str(REPORT)]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """`specstudy import-upstream` the 36 summaries, `specstudy tables`, `specstudy report` (the project's CLI)."""
    from specstudy.cli import main

    results = tmp_path_factory.mktemp("up8b") / "results"
    assert main(["import-upstream", IMPORT_ARGS[0], str(results), *IMPORT_ARGS[1:]]) == 0
    assert main(["tables", "--results", str(results), "--out", str(results / "tables")]) == 0
    assert main(["report", "--results", str(results), "--tables", str(results / "tables"),
                 "--out", str(results / "report")]) == 0
    report = json.loads(REPORT.read_text())
    res = upstream_confirm.pipeline_outputs(results / "tables", results / "report" / "recommendation.json")
    table = upstream_confirm.compare_with_report(res, report, res["rows"], {"k2": "eagle3-k2"})
    return results, report, res, table


def test_summary_only_import_writes_cells_and_deployment_records(pipeline):
    results, report, _, _ = pipeline
    sums = sorted((results / "confirm").glob("*/rep*/*/c*/summary.json"))
    assert len(sums) == 36
    for path in sums:
        s = atomic.read_json(path)
        schemas.validate(s, "cell-summary")
        up = s["upstream"]["summary"]
        src = Path(s["upstream"]["cell_dir"]) / "summary.json"
        assert up == atomic.read_json(src)  # upstream's summary kept verbatim
        assert s["keys"]["deployment_id"] == src.parents[3].name and f"-confirm-c{s['keys']['rep']}-" in src.parents[3].name
        # every figure upstream's, TPOT/E2E with upstream's definition named, what cannot be recomputed listed
        assert s["latency_ms"]["tpot"]["p50"] == up["latency_ms"]["tpot"]["p50"]
        assert s["tokens"]["output_tokens_per_second"] == up["tokens"]["output_tokens_per_second"]
        assert [n["code"] for n in s["validity"]["notes"]] == ["summary_only"]
        assert "upstream's definitions: e2e" in s["validity"]["notes"][0]["detail"].lower()
        # the one raw cell of the set is read from its summary.json too (one E2E/TPOT definition), and says so
        raw = src.parent == K2_CELL
        assert s["upstream"]["raw_files_not_read"] == (list(RAW_FILES) if raw else [])
        assert s["validity"]["notes"][0]["detail"].startswith("summary-level import" if raw else "summary-only import")
        reason = upstream.RAW_NOT_READ_SERVER_DELTAS if raw else upstream.SUMMARY_NOT_RECOMPUTED["server_deltas"]
        assert s["server_deltas"] == {"available": False, "reason": reason}
        assert s["fingerprint"] is None and "latency_ms.tpot" in s["upstream"]["not_recomputed"]
    deps = sorted((results / "confirm").glob("*/rep*/deployment.json"))
    assert [str(p.relative_to(results / "confirm").parent) for p in deps] == [
        f"{a}/rep{r}" for a in ("baseline", "eagle3-k2") for r in (1, 2, 3)]
    for path in deps:
        d = atomic.read_json(path)
        schemas.validate(d, "deployment", str(path))
        prov = d["provenance"]
        # provenance: the data set's manifest (sha256 checked), never a measurement of ours
        assert prov["imported_from"] == ("imported from upstream swiss-ai/apertus-speculative-decoding@"
                                         "8ffc38d7a32e5509f51a6dd9fcd48d249b5569dc")
        assert all(f["commit_source"].endswith("upstream-8b/MANIFEST.md") for f in prov["files"])
        assert len(prov["files"]) == 6 + (1 if "eagle31-k2-confirm-c1" in d["deployment_id"] else 0)
        assert d["command"] is None and d["times"] == {"start": None, "ready": None, "stop": None}
        assert set(prov["fields_not_measured"]) >= {"command", "times", "startup", "confounds"}
        kv = report["deployments"][d["deployment_id"]]["kv_cache_tokens"]
        assert d["cache_config"] == {"num_gpu_blocks": None, "block_size": None, "kv_cache_tokens": kv}
        assert "upstream's stated figure" in prov["cache_config_source"] and prov["summary_only"] is True
        assert len(d["cells"]) == 6 and {c["status"] for c in d["cells"]} == {"ok"}


def test_summary_only_cells_need_the_flag_and_an_arm(tmp_path, capsys):
    from specstudy.cli import main

    # without --from-summaries only the one complete raw cell is imported (recomputed); summary-only cells are not cells
    assert main(["import-upstream", str(CONFIRM), str(tmp_path / "raw"), "--phase", "confirm"]) == 0
    err = capsys.readouterr().err
    assert "1 cell(s) imported, 0 incomplete, 0 with errors, 1 deployment record(s)" in err
    assert [str(p.relative_to(tmp_path / "raw")) for p in sorted((tmp_path / "raw").rglob("summary.json"))] == [
        "confirm/eagle3-k2/rep1/code/c1/summary.json"]
    # a cell with metadata.json but no raw files is incomplete without the flag, its missing files named
    part = tmp_path / "part" / K2_CELL.relative_to(CONFIRM)
    part.mkdir(parents=True)
    for name in ("metadata.json", "summary.json"):
        shutil.copyfile(K2_CELL / name, part / name)
    assert main(["import-upstream", str(tmp_path / "part"), str(tmp_path / "r"), "--phase", "confirm"]) == 2
    err = capsys.readouterr().err
    assert "missing requests.jsonl, metrics_before.prom, metrics_after.prom" in err and "0 cell(s) imported" in err
    # a deployment whose variant label has no arm is a named error, and nothing of it is imported
    assert main(["import-upstream", str(CONFIRM), str(tmp_path / "r"), "--phase", "confirm", "--from-summaries"]) == 2
    err = capsys.readouterr().err
    # (the one k = 2 cell with metadata.json gives its deployment, block c1, its arm: 18 baseline cells + 6)
    assert "pass --arm eagle31-k2=<arm>" in err and "24 cell(s) imported" in err and "12 with errors" in err
    # that cell's raw files are in the source, but beside summary-only pairs it is read from its summary.json
    assert f"note: {K2_CELL}: its raw files are in the source but this --from-summaries import read it" in err
    # a mapping that contradicts the cell's metadata.json is refused
    with pytest.raises(upstream.UpstreamError, match=r"maps to arm 'eagle3-k2', but --arm eagle31-k2=eagle3-k3"):
        upstream.convert_summary(K2_META.parent, "confirm", {"eagle31-k2": "eagle3-k3"})


def test_the_confirmation_reads_as_three_paired_blocks(pipeline):
    _, _, res, _ = pipeline
    comps = res["comparisons"]
    assert {(c["workload"], c["concurrency"]) for c in comps} == {(w, c) for w in ("chat", "code", "summarization")
                                                                  for c in (1, 8)}
    for c in comps:
        assert c["arm"] == "eagle3-k2" and c["n_excluded"] == 0 and len(c["repeats"]) == 3
        for r in c["repeats"]:  # paired within the block, as upstream paired them
            assert f"-confirm-c{r['rep']}-" in r["arm_deployment"] and f"-confirm-c{r['rep']}-" in r["base_deployment"]


def test_every_k2_figure_of_upstreams_report_beside_the_pipelines(pipeline):
    _, report, res, table = pipeline
    per_cell = {k: v for k, v in report["per_cell"].items() if k.startswith("k2/")}
    covered = {(t["cell"], t["figure"]) for t in table}
    for key, figs in per_cell.items():
        for fig in figs:
            if fig == "blocks":
                assert {(key, f"blocks.{b}") for b in figs["blocks"]} <= covered
            else:
                assert (key, fig) in covered, (key, fig)
    for t in table:
        if t["note"].startswith(("same definition", "rounded", "upstream's TTFT", "upstream's E2E")):
            # the same quantity: equal up to the last bits of floating-point summation
            assert t["rel_diff"] <= 1e-12, t
        elif "median over blocks" in t["note"]:
            # the project summarises the blocks by their median, upstream by the mean: recompute both
            c = next(c for c in res["comparisons"] if f"k2/{c['workload']}/c{c['concurrency']}" == t["cell"])
            field = "acceptance_rate" if t["figure"] == "acceptance_rate_mean" else "mean_acceptance_length"
            vals = sorted(r[field] for r in c["repeats"])
            assert t["project"] == vals[1]
            assert abs(sum(vals) / 3 - t["upstream"]) <= 1e-15
            assert t["rel_diff"] < 0.01
        else:
            # by_depth overall means: upstream averages the blocks arithmetically, the project takes one geomean
            assert "arithmetic mean over blocks" in t["note"], t
            blocks = report["by_depth"]["2"]["blocks"]
            sub = "all" if t["figure"].endswith("_all") else t["figure"].rsplit("_", 1)[1]
            assert abs(sum(b[sub] for b in blocks.values()) / 3 - t["upstream"]) <= 1e-15
            assert 0 < t["rel_diff"] < 1e-5


def test_the_issues_quoted_figures(pipeline):
    _, _, res, table = pipeline
    fig = {(t["cell"], t["figure"]): t["project"] for t in table}
    assert round(fig[("by_depth/2", "geomean_tpot_speedup_all")], 3) == 1.400
    assert round(fig[("by_depth/2", "geomean_tpot_speedup_c1")], 3) == 1.437
    assert round(fig[("by_depth/2", "geomean_tpot_speedup_c8")], 3) == 1.364
    assert round(fig[("by_depth/2", "worst_cell_speedup")], 3) == 1.147
    assert round(fig[("k2/code/c1", "geomean")], 3) == 1.950
    assert round(fig[("k2/code/c1", "throughput_speedup_geomean")], 3) == 1.838
    assert round(fig[("k2/code/c1", "acceptance_per_position_mean")][0], 3) == 0.749
    # the KV loss from the deployments table (stats.memory_costs), i.e. upstream's stated tokens
    assert res["kv_loss"]["eagle3-k2"] == pytest.approx(1 - 438784 / 466144, rel=1e-15)
    assert round(100 * res["kv_loss"]["eagle3-k2"], 1) == 5.9


def test_the_report_states_the_pipelines_figures(pipeline):
    results, _, res, _ = pipeline
    md = (results / "report" / "report.md").read_text()
    assert "Phases present: confirm." in md and "| eagle3-k2 | missing | no |" in md
    for c in res["comparisons"]:
        sp = c["speedup"]
        row = (f"| {c['workload']} | {c['concurrency']} | eagle3-k2 | {c['absolute']['base_otps']:.1f} | "
               f"{c['absolute']['arm_otps']:.1f} | {sp['geomean']:.3f} [{sp['ci_low']:.3f}, {sp['ci_high']:.3f}] |")
        assert row in md, row
    assert "lost vs baseline: 5.9%" in md


def test_the_projects_rule_on_upstreams_confirmation(pipeline):
    _, _, res, _ = pipeline
    rec = res["recommendation"]
    # no correctness gate of the project's kind exists for these deployments: the rule does not enable
    assert rec["decision"] == "do_not_enable" and rec["phase"] == "confirm"
    assert rec["candidates"][0]["blockers"] == ["no confirm gate verdict"]
    assert rec["stability"]["agreement"] == 1.0
    # on performance alone every cell shows a gain (interval above 1.05) and the decision is stable
    cf = upstream_confirm.counterfactual(res["comparisons"])
    assert cf["decision"] == "enable" and cf["enable"] == "eagle3-k2"
    cand = cf["candidates"][0]
    assert set(cand["status"].values()) == {"gain"}
    assert all(j["lo"] > 1.05 for j in cand["cells"].values())
    # the pipeline's own per-cell intervals are the counterfactual's (one rule, one source)
    assert {k: (j["lo"], j["hi"]) for k, j in rec["candidates"][0]["cells"].items()} == \
        {k: (j["lo"], j["hi"]) for k, j in cand["cells"].items()}
    assert cf["stability"]["agreement"] == 1.0 and cf["stability"]["rounds"] == 3


def test_cli_prints_the_comparison(pipeline, capsys, tmp_path):
    results = pipeline[0]
    args = [str(REPORT), "--tables", str(results / "tables"), "--recommendation",
            str(results / "report" / "recommendation.json"), "--depth", "k2=eagle3-k2"]
    assert upstream_confirm.main([*args, "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "pipeline decision" in out and ": do_not_enable" in out
    assert "decision if the correctness gate passed: enable eagle3-k2" in out
    assert json.loads((tmp_path / "r.json").read_text())["comparison"]
    with pytest.raises(upstream_confirm.UpstreamConfirmError, match=r"no recommendation.json; run `specstudy report"):
        upstream_confirm.pipeline_outputs(results / "tables", tmp_path / "nope" / "recommendation.json")


def test_the_production_rule_obrien_fleming_looks_and_traffic_mix(pipeline, capsys, tmp_path):
    """The Clariden pre-registration's rule (issue 28: non-inferiority at 5 %, any gain, O'Brien-Fleming looks from
    3 to 10 rounds) with its traffic mix over upstream's workload names (open_chat -> chat): at upstream's 3 blocks
    the first look spends almost no alpha, so the noisy c8 cells stay undecided and the capped data set cannot enable."""
    results = pipeline[0]
    # The production rule with its first look at round 3, as upstream's 3 blocks give (the Clariden
    # pre-registration itself now starts with five rounds, so it would not look at three at all)
    root = Path(__file__).resolve().parents[1]
    prereg = yaml.safe_load((root / "config" / "preregistration-clariden-70b.yaml").read_text())
    prereg["confirmation"]["repeats"] = 3
    (tmp_path / "prereg.yaml").write_text(yaml.safe_dump(prereg))
    study = yaml.safe_load((root / "config" / "clariden-70b.yaml").read_text())
    study["study"]["preregistration"] = str(tmp_path / "prereg.yaml")
    cfg = tmp_path / "clariden-70b.yaml"
    cfg.write_text(yaml.safe_dump(study))
    assert upstream_confirm.main([str(REPORT), "--tables", str(results / "tables"), "--recommendation",
                                  str(results / "report" / "recommendation.json"), "--depth", "k2=eagle3-k2",
                                  "--config", str(cfg), "--traffic-mix", "chat=0.6,code=0.3,summarization=0.1"]) == 0
    out = capsys.readouterr().out
    assert "counterfactual rule: pre-registration; min_gain 0.0, max_regression 0.05" in out
    assert "traffic mix {'chat': 0.6, 'code': 0.3, 'summarization': 0.1}" in out
    mix = re.search(r"eagle3-k2 mix@c1 +throughput speedup ([0-9.]+) \[([0-9.]+), ([0-9.]+)\] gain", out)
    assert mix and 1.0 < float(mix[2]) < float(mix[1]) < float(mix[3])
    for cell in ("chat@c8", "summarization@c8"):
        assert re.search(rf"eagle3-k2 {cell} +throughput speedup [0-9.]+ \[0\.[0-9]+, [0-9.]+\] inconclusive", out), cell
    assert "decision if the correctness gate passed: do_not_enable" in out
    assert "non-inferiority not shown (interval reaches below 0.95) on chat@c8, summarization@c8" in out
