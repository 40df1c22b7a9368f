"""Reproduce the real 70B smoke-screening cells from their raw files (requests.jsonl + .prom pairs).

Upstream definitions that differ from ours (docs/metrics.md, "Upstream 70B cells") are tested both
ways: the upstream number from the upstream definition, and our number snapshotted.
"""

from __future__ import annotations

import argparse

import pytest

from conftest import data_path
from specstudy.analysis import upstream
from specstudy.core import atomic, schemas
from specstudy.measure import cell, prom

# The upstream 70B data set is part of the repository's test data (tests/data/upstream-70b, see its MANIFEST.md).
DATA70 = data_path("upstream-70b")
ROOT = data_path("upstream-70b", "results", "70b", "smoke-screening-20260913-debug")
CELLS = sorted(ROOT.glob("*/open_chat/c*/repeat-01"))
assert len(CELLS) == 6, f"{ROOT} has {len(CELLS)} of the 6 smoke cells (see tests/data/upstream-70b/MANIFEST.md)"
REL = 1e-9


def close(a, b, rel=REL):
    if a is None or b is None:
        return a is b
    return abs(a - b) <= rel * max(abs(a), abs(b))


@pytest.fixture(scope="module", params=CELLS, ids=lambda p: f"{p.parents[2].name}-{p.parents[0].name}")
def converted(request):
    rows, summary, up = upstream.convert_cell(request.param)
    return rows, summary, up["summary"], up


def test_summary_is_schema_valid_and_valid(converted):
    rows, s, u, _ = converted
    schemas.validate(s, "cell-summary", "converted")
    assert s["validity"]["valid"] is True and s["validity"]["reasons"] == []
    assert s["requests"]["attempted"] == u["requests"]["attempted"] == 24
    assert s["requests"]["successful"] == u["requests"]["successful"]
    assert s["tokens"]["prompt"] == u["tokens"]["prompt"]
    assert s["tokens"]["completion"] == u["tokens"]["completion"]


def test_speculative_block_exact(converted):
    _, s, u, _ = converted
    us, sp = u["speculative_decoding"], s["speculative"]
    assert sp["enabled"] == us["enabled"]
    if not us["enabled"]:
        return
    for k in ("drafts", "draft_tokens", "accepted_tokens", "acceptance_rate", "mean_acceptance_length"):
        assert sp[k] == us[k], k
    assert sp["per_position"] == us["acceptance_rate_per_position"]
    assert sp["per_position_sum_matches"] is True


def test_throughput_exact_with_upstream_wall(converted):
    _, s, u, _ = converted
    assert s["wall_seconds"] == u["wall_seconds"]
    assert s["tokens"]["output_tokens_per_second"] == u["tokens"]["output_tokens_per_second"]
    assert close(s["requests"]["requests_per_second"], u["requests"]["requests_per_second"])


@pytest.mark.parametrize("metric", ["ttft", "stream_event_gap"])
def test_same_definition_latencies_match(converted, metric):
    _, s, u, _ = converted
    ours, theirs = s["latency_ms"][metric], u["latency_ms"][metric]
    assert ours["count"] == theirs["count"]
    for k in ("mean", "p50", "p95", "p99"):
        assert close(ours[k], theirs[k]), (metric, k, ours[k], theirs[k])


@pytest.mark.parametrize("metric", ["e2e", "tpot"])
def test_upstream_definition_e2e_tpot_reproduced(converted, metric):
    rows, s, u, _ = converted
    dist = cell.distribution(r["upstream"][f"{metric}_ms"] for r in rows if cell.is_success(r))
    for k in ("count", "mean", "p50", "p95", "p99"):
        assert close(dist[k], u["latency_ms"][metric][k]), (metric, k)


def test_our_e2e_ends_at_last_content_event(converted):
    rows, s, u, _ = converted
    for r in rows:
        # ours stops at the last content event; upstream waited for the usage chunk and [DONE]
        assert r["e2e_ms"] <= r["upstream"]["e2e_ms"]
        assert r["upstream"]["e2e_ms"] - r["e2e_ms"] < 50.0
    assert s["latency_ms"]["e2e"]["p50"] < u["latency_ms"]["e2e"]["p50"]
    assert s["latency_ms"]["tpot"]["p50"] < u["latency_ms"]["tpot"]["p50"]


def test_server_deltas_match_client_totals(converted):
    _, s, u, _ = converted
    sd = s["server_deltas"]
    assert sd["generation_tokens"] == u["tokens"]["completion"]
    assert sd["prompt_tokens"] == u["tokens"]["prompt"]
    assert sd["requests_finished"] == 24
    assert sd["generation_tokens_minus_client"] == 0
    assert sd["cache_config"]["block_size"] == 16 and sd["cache_config"]["num_gpu_blocks"] > 0


# our-definition numbers, snapshotted (e2e/tpot end at the last content event)
SNAPSHOT = {
    ("baseline-3391425", "c1"): {"e2e_p50": 1916.4653370389715, "tpot_p50": 14.029054479315906},
    ("ngram-n3-3392370", "c8"): {"e2e_p50": 2264.9955595843494, "tpot_p50": 17.225362865898994},
    ("draft-n3-tp4-3391426", "c1"): {"e2e_p50": 4359.949954086915, "tpot_p50": 31.746044888000522},
}


def test_our_definition_snapshot():
    for d in CELLS:
        key = (d.parents[2].name, d.parents[0].name)
        if key not in SNAPSHOT:
            continue
        _, s, _ = upstream.convert_cell(d)
        assert close(s["latency_ms"]["e2e"]["p50"], SNAPSHOT[key]["e2e_p50"], 1e-12)
        assert close(s["latency_ms"]["tpot"]["p50"], SNAPSHOT[key]["tpot_p50"], 1e-12)


def test_keys_and_arm_names():
    names = {upstream.convert_cell(d)[1]["keys"]["arm"] for d in CELLS}
    assert names == {"baseline", "draft-k3-tp4", "ngram-k3"}


def test_cli_imports_a_root(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    upstream.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["import-upstream", str(ROOT / "ngram-n3-3392370"), str(tmp_path)])
    assert args.func(args) == 0
    out = tmp_path / "screen" / "ngram-k3" / "rep1" / "open_chat" / "c8"
    s = atomic.read_json(out / "summary.json")
    schemas.validate(s, "cell-summary")
    assert s["upstream"]["summary"]["speculative_decoding"]["acceptance_rate"] == s["speculative"]["acceptance_rate"]
    assert len(atomic.read_jsonl(out / "requests.jsonl")) == 24
    assert (tmp_path / "screen" / "ngram-k3" / "rep1" / "open_chat" / "c1" / "metrics_after.prom").exists()
    assert "ngram-k3" in capsys.readouterr().out


def test_cli_rejects_non_cell(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    upstream.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["import-upstream", str(tmp_path), str(tmp_path / "out")])
    assert args.func(args) == 2
    assert "no upstream cell found" in capsys.readouterr().err
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "requests.jsonl").write_text("")
    args = parser.parse_args(["import-upstream", str(tmp_path / "x"), str(tmp_path / "out")])
    assert args.func(args) == 2
    assert "missing" in capsys.readouterr().err


# ---------------------------------------------------------------- review #16.9: the importer's honesty


def _copy_cell(tmp_path, name="draft-n3-tp4-3391426", conc="c1"):
    import shutil

    src = ROOT / name / "open_chat" / conc / "repeat-01"
    dst = tmp_path / "up" / name / "open_chat" / conc / "repeat-01"
    shutil.copytree(src, dst)
    return dst


def _cli(argv):
    parser = argparse.ArgumentParser()
    upstream.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["import-upstream", *argv])
    return args.func(args)


def test_empty_metrics_files_are_an_error_not_a_valid_cell_without_speculation(tmp_path):
    d = _copy_cell(tmp_path)
    (d / "metrics_before.prom").write_text("")
    with pytest.raises(upstream.UpstreamError, match=r"metrics_before.prom: empty file"):
        upstream.convert_cell(d)
    # a draft arm whose scrapes carry no speculative counters is refused too
    d2 = _copy_cell(tmp_path, conc="c8")
    base = ROOT / "baseline-3391425" / "open_chat" / "c8" / "repeat-01"
    for name in ("metrics_before.prom", "metrics_after.prom"):
        (d2 / name).write_text((base / name).read_text())
    with pytest.raises(upstream.UpstreamError, match=r"no vllm:spec_decode_\* counters.*'draft_model'"):
        upstream.convert_cell(d2)


def test_directory_run_imports_the_complete_cells_and_lists_the_incomplete(tmp_path, capsys):
    good = _copy_cell(tmp_path, conc="c8")
    bad = _copy_cell(tmp_path, conc="c1")
    (bad / "metrics_after.prom").unlink()
    (bad / "summary.json").unlink()
    out = tmp_path / "out"
    assert _cli([str(tmp_path / "up"), str(out)]) == 0
    err = capsys.readouterr().err
    assert f"incomplete: {bad}: missing metrics_after.prom, summary.json" in err
    assert "1 cell(s) imported, 1 incomplete, 0 with errors" in err
    assert (out / "screen" / "draft-k3-tp4" / "rep1" / "open_chat" / "c8" / "summary.json").exists()
    assert not (out / "screen" / "draft-k3-tp4" / "rep1" / "open_chat" / "c1").exists()
    assert good.exists()
    # asked to be strict: the same run exits non-zero
    assert _cli([str(tmp_path / "up"), str(tmp_path / "out2"), "--strict"]) == 2


def test_wall_recomputed_from_the_rows_beside_upstreams(converted):
    rows, s, u, up = converted
    w = s["upstream"]["wall"]
    conc = s["keys"]["concurrency"]
    assert w["wall_seconds_upstream"] == u["wall_seconds"]
    assert w["wall_seconds_from_rows"] == pytest.approx(sum(r["upstream"]["e2e_ms"] for r in rows) / 1000 / conc)
    assert w["output_tokens_per_second_from_rows"] == pytest.approx(s["tokens"]["completion"] / w["wall_seconds_from_rows"])
    # busy time / workers never exceeds the wall; at concurrency 1 it is the wall up to the gaps between requests
    assert w["rows_to_upstream_wall"] <= 1.0
    if conc == 1:
        assert w["rows_to_upstream_wall"] > 0.95


def test_upstream_definition_latencies_reported_beside_ours(converted, capsys):
    rows, s, u, _ = converted
    ud = s["upstream"]["latency_ms_upstream_definition"]
    for metric in ("e2e", "tpot"):
        for k in ("count", "mean", "p50", "p95", "p99"):
            assert close(ud[metric][k], u["latency_ms"][metric][k]), (metric, k)


def test_cli_reports_both_definitions_for_the_whole_data_set(capsys):
    """`specstudy import-upstream tests/data/upstream-70b` (no output root: report only)."""
    from specstudy.cli import main

    assert main(["import-upstream", str(DATA70)]) == 0
    out, err = capsys.readouterr()
    assert "6 cell(s) read, 0 incomplete, 0 with errors" in err
    lines = out.splitlines()
    assert "e2e50" in lines[0] and "tpot50" in lines[0] and "ours" in lines[1] and "up" in lines[1]
    base_c1 = next(line for line in lines if line.startswith("baseline") and " 1   " in line)
    s = upstream.convert_cell(ROOT / "baseline-3391425" / "open_chat" / "c1" / "repeat-01")[1]
    assert f"{s['latency_ms']['e2e']['p50']:.1f}" in base_c1
    assert f"{s['upstream']['latency_ms_upstream_definition']['e2e']['p50']:.1f}" in base_c1
    assert "ours end at the last content event" in out


def test_imported_cells_run_through_tables_and_report(tmp_path):
    """The raw-cell path end to end: `specstudy import-upstream` -> `specstudy tables` -> `specstudy report`; the
    figures in the tables are the converted summaries', the deployments carry the scrape's KV pool."""
    from specstudy.analysis.tables import read_tables
    from specstudy.cli import main

    results = tmp_path / "results"
    assert main(["import-upstream", str(DATA70), str(results)]) == 0
    assert main(["tables", "--results", str(results), "--out", str(results / "tables")]) == 0
    assert main(["report", "--results", str(results), "--tables", str(results / "tables"),
                 "--out", str(results / "report")]) == 0
    t = read_tables(results / "tables")
    assert len(t["cells"]) == 6 and set(t["cells"]["phase"]) == {"screen"}
    for _, row in t["cells"].iterrows():
        s = atomic.read_json(results / "screen" / row["arm"] / "rep1" / row["workload"] / f"c{row['concurrency']}"
                             / "summary.json")
        assert row["output_tokens_per_second"] == s["tokens"]["output_tokens_per_second"]
        assert row["tpot_p50_ms"] == s["latency_ms"]["tpot"]["p50"]
    deps = t["deployments"].set_index("arm")
    assert set(deps.index) == {"baseline", "draft-k3-tp4", "ngram-k3"}
    for arm, d in deps.iterrows():
        before = next((results / "screen" / arm / "rep1").glob("*/c1/metrics_before.prom")).read_text()
        assert d["kv_cache_tokens"] == prom.kv_cache_config(before)["kv_cache_tokens"]
        assert d["provenance.imported_from"].startswith("imported from upstream swiss-ai/apertus-speculative-decoding@")
        assert d["command"] is None and d["source"] == "deployment.json"
    rec = atomic.read_json(results / "report" / "recommendation.json")
    comps = {(c["arm"], c["concurrency"]): c for c in rec["comparisons"]}
    assert set(comps) == {(a, c) for a in ("draft-k3-tp4", "ngram-k3") for c in (1, 8)}
    base = t["cells"][(t["cells"]["arm"] == "baseline") & (t["cells"]["concurrency"] == 8)].iloc[0]
    arm = t["cells"][(t["cells"]["arm"] == "ngram-k3") & (t["cells"]["concurrency"] == 8)].iloc[0]
    assert comps[("ngram-k3", 8)]["repeats"][0]["speedup"] == \
        arm["output_tokens_per_second"] / base["output_tokens_per_second"]
    # one screening round and no confirmation: the rule has nothing to decide on
    assert rec["recommendation"]["decision"] == "insufficient_evidence"
