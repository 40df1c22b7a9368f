"""The scale-model study's records as the scale-run code (commit a1c5fca) wrote them on the lent H200
(tests/data/scale-h200: baseline and ngram-k5, confirmation rounds 1 and 2 of the pre-registered 3, the
open_chat cell at concurrency 1), read by this code: the tables from the rule's files, then the report on a
confirmation stopped part-way — every heading and table labelled "scale model", the missing pieces named, and
the confounds, the JIT account, the cost model, the energy per token and the throughput–interactivity figure
from the real records. Expected figures are recomputed here from the raw JSON, not from the tables."""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from conftest import data_path
from specstudy.cli import main
from specstudy.study.config import REPO_ROOT

DATA = data_path("scale-h200")
ROOT = DATA / "results"
CONFIG = REPO_ROOT / "config" / "gpu-h200-scale.yaml"
ARMS = ("baseline", "ngram-k5")


def _json(p):
    return json.loads(Path(p).read_text())


def _cells(arm):
    return sorted(ROOT.glob(f"confirm/{arm}/rep*/open_chat/c1/summary.json"))


def _records(arm=None):
    return sorted(ROOT.glob(f"confirm/{arm or '*'}/rep*/deployment.json"))


def _unix(stamp):  # an ISO 8601 stamp read by the standard library alone (both forms the records carry)
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_manifest_matches_files():
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) \| `([0-9a-f]{64})` \|", (DATA / "MANIFEST.md").read_text(), re.M)
    listed = {path for path, _, _ in rows}
    on_disk = {str(p.relative_to(DATA)) for p in ROOT.rglob("*") if p.is_file()}
    assert listed == on_disk
    for path, size, sha in rows:
        b = (DATA / path).read_bytes()
        assert (len(b), hashlib.sha256(b).hexdigest()) == (int(size), sha), path
    assert sum(int(size) for _, size, _ in rows) < 200_000  # small real extracts only


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("scale-h200")
    cells = [str(p) for a in ARMS for p in _cells(a)]
    # what rule tables passes (rules/common.smk: tables_args); no confirm gate was written yet
    assert main(["tables", "--cells", *cells, "--deployments", *map(str, _records()), "--gates",
                 "--out", str(out / "tables")]) == 0
    assert main(["report", "--results", str(ROOT), "--tables", str(out / "tables"), "--config", str(CONFIG),
                 "--out", str(out / "report")]) == 0
    return out


def test_the_older_records_read_into_the_tables(built):
    """The scale-run records stamp times two ways (``…+00:00`` with microseconds in the phase timeline and the
    cells, ``…Z`` to the ms in times/startup) and keep the start-up steps under ``startup.phases``: both read."""
    import pandas as pd

    deps = pd.read_parquet(built / "tables" / "deployments.parquet").set_index("deployment_id")
    cells = pd.read_parquet(built / "tables" / "cells.parquet").set_index("deployment_id")
    for p in _records():
        rec = _json(p)
        row = deps.loc[rec["deployment_id"]]
        assert rec["times"]["start"].endswith("Z") and rec["phases"][0]["start"].endswith("+00:00")
        assert row["deployment_seconds"] == pytest.approx(_unix(rec["times"]["stop"]) - _unix(rec["times"]["start"]))
        assert row["startup_total_s"] == rec["startup"]["total_s"]
        for step, seconds in rec["startup"]["phases"].items():
            assert row[f"startup_{step}_s"] == seconds, step
        assert row["measuring_seconds"] > 0
    for a in ARMS:
        for p in _cells(a):
            s = _json(p)
            c = cells.loc[s["keys"]["deployment_id"]]
            assert c["started_unix"] == pytest.approx(_unix(s["times"]["started_at"]))


def _md(built):
    return (built / "report" / "report.md").read_text()


def test_partial_confirmation_report_labels_every_heading_and_table(built):
    md, html = _md(built), (built / "report" / "report.html").read_text()
    headings = [ln for ln in md.splitlines() if ln.startswith("#")]
    assert headings[0] == "# Speculative decoding study report (scale model)" and len(headings) > 20
    assert [h for h in headings if "(scale model)" not in h] == []
    lines = md.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("| ") and not lines[i - 1].startswith("|")]
    assert len(starts) > 10
    assert [lines[i] for i in starts if not lines[i - 2].startswith("*Table (scale model): ")] == []
    assert html.count("<table>") == html.count("<caption>Table (scale model): ") > 10
    assert "<title>specstudy report (scale model)</title>" in html


def test_partial_confirmation_report_names_what_is_missing(built):
    md = _md(built)
    initial = yaml.safe_load((REPO_ROOT / "config" / "preregistration-gpu-h200-scale.yaml").read_text())[
        "confirmation"]["repeats"]
    reps = {a: sorted(p.parents[2].name for p in _cells(a)) for a in ARMS}
    assert len(reps["baseline"]) < initial
    progress = (f"confirmation incomplete: {len(reps['baseline'])} of the {initial} pre-registered initial rounds "
                f"measured for every arm (" + "; ".join(f"{a}: {', '.join(r)}" for a, r in reps.items()) + ")")
    missing = md.split("## Missing pieces (scale model)\n", 1)[1].split("\n## ", 1)[0]
    for needle in (progress, "no confirm gate verdict for ngram-k5 (results/gates/confirm/ngram-k5.json)",
                   "no confirmation round checkpoint (results/confirm/rounds/round<n>.json)",
                   "no final candidate (results/selection/final-candidate.json)",
                   "no capacity knee for baseline (results/capacity/baseline/knee.json)"):
        assert f"- {needle}" in missing, needle
    assert "nothing: all inputs present" not in md and "for None" not in md
    rec = md.split("## Recommendation (scale model)\n", 1)[1]
    assert rec.index(f"PROVISIONAL — {progress}.") < rec.index("Decision: ")
    assert "capacity — not evaluated: no final candidate (results/selection/final-candidate.json)" in rec
    assert "Gate (confirm): missing (blocks the recommendation)." in md


def test_confounds_and_jit_account_from_the_launch_logs(built):
    md = _md(built)
    for arm, runner, asynchronous in (("baseline", "V2", "enabled"), ("ngram-k5", "V1", "disabled")):
        rec = _json(_records(arm)[0])
        ev = rec["confounds"]["evidence"]
        assert ("Using V2 Model Runner" in ev["model_runner"]) == (runner == "V2")
        assert f"Asynchronous scheduling is {asynchronous}." in ev["async_scheduling"]
        row = next(ln for ln in md.splitlines() if ln.startswith(f"| confirm | {arm} | {asynchronous} |"))
        assert row.split(" | ")[-1].startswith(runner)
    logs = {p: p.read_text() for p in ROOT.glob("confirm/*/rep*/attempts/*/launch.log")}
    per_log = {p: t.count("Triton kernel JIT compilation during inference") for p, t in logs.items()}
    n, with_any = sum(per_log.values()), sum(1 for v in per_log.values() if v)
    assert n > 0 and with_any < len(logs)
    assert (f"No cell's window holds a logged JIT compilation: {n} compilation(s) logged by {with_any} of "
            f"{len(logs)} deployments' launch logs, none inside a cell's window") in md
    for rec_path in _records():
        rec = _json(rec_path)
        first_window = min(_unix(p["start"]) for p in rec["phases"] if p["phase"] == "measure")
        text = next(t for p, t in logs.items() if rec["deployment_id"] in str(p))
        stamps = re.findall(r"WARNING (\d\d-\d\d \d\d:\d\d:\d\d) \[jit_monitor", text)
        for s in stamps:  # log clock utc (the record's alignment): every compilation came before the first window
            assert rec["startup"]["log_clock"] == "utc"
            assert datetime.strptime(f"2026-{s}+0000", "%Y-%m-%d %H:%M:%S%z").timestamp() + 1 <= first_window
        row = next(ln for ln in md.splitlines() if f"| {rec['deployment_id']} | {len(stamps)} |" in ln)
        assert row.endswith(f"| {_iso_ms(first_window)} |")


def _iso_ms(ts):
    from datetime import UTC

    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_cost_model_energy_and_interactivity_from_the_summaries(built):
    md = _md(built)
    s = {a: [_json(p) for p in _cells(a)] for a in ARMS}
    tpot = {a: statistics.median(x["latency_ms"]["tpot"]["p50"] for x in s[a]) for a in ARMS}
    step = statistics.median(x["latency_ms"]["tpot"]["p50"] * x["speculative"]["mean_acceptance_length"]
                             for x in s["ngram-k5"])
    k = s["ngram-k5"][0]["keys"]["num_speculative_tokens"]
    tb = tpot["baseline"]
    # time per decoding step split into target verification (memory-bound: one baseline step) and drafting
    assert (f"| ngram-k5 | 1 | {k} | {tb:.2f} | {step:.2f} | {tb:.2f} (memory-bound) | {step - tb:.2f} | "
            f"{(step - tb) / k:.2f} ({(step - tb) / k / tb:.2f}) |") in md
    length = statistics.median(x["speculative"]["mean_acceptance_length"] for x in s["ngram-k5"])
    otps = {a: statistics.median(x["tokens"]["output_tokens_per_second"] for x in s[a]) for a in ARMS}
    pred = next(ln for ln in md.splitlines() if ln.startswith("| ngram-k5 | open_chat | 1 | "))
    cols = pred.split(" | ")
    assert float(cols[5]) == pytest.approx(length * tb / step, abs=6e-4)  # predicted from step costs
    assert float(cols[7]) == pytest.approx(otps["ngram-k5"] / otps["baseline"], abs=6e-4)  # measured
    assert "break-even L*" in md
    for a in ARMS:
        jpt = statistics.median(x["telemetry"]["series"]["gpu0.energy_j"]["delta"] / x["tokens"]["completion"]
                                for x in s[a])
        assert f"| confirm | open_chat | 1 | {a} | {len(s[a])} | {jpt:.4f} |" in md, a
        per_user = statistics.median(1000 / x["latency_ms"]["tpot"]["p50"] for x in s[a])
        assert f"| open_chat | {a} | 1 | {len(s[a])} | 1 | " in md
        row = next(ln for ln in md.splitlines() if ln.startswith(f"| open_chat | {a} | 1 | {len(s[a])} | 1 | "))
        assert float(row.split(" | ")[5]) == pytest.approx(per_user, abs=0.06)
    assert (built / "report" / "plots" / "throughput_interactivity.png").stat().st_size > 1000
