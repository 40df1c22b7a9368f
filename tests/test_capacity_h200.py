"""The H200 capacity run of 2026-12-03 (issue 28 item 7), read back from its real records.

`docs/gpu-results/2026-12-03-capacity/` holds what the capacity jobs wrote on the lent H200 (CUDA vLLM
0.23.0, the 8B/1B scale model, config/gpu-h200-scale.yaml): each arm's knee, steps, soaks, gates and
deployment record, and an excerpt of its launch log. These tests run the product's own readers and the
pre-registered capacity criteria over them; the figures asserted are the ones docs/gpu.md reports.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from specstudy.analysis import capacity_criteria as cc
from specstudy.measure.capacity.knee import compare_knees, kv_capacity_tokens
from specstudy.measure.capacity.step import CLIENT_GATES, SERVER_GATES

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "docs" / "gpu-results" / "2026-12-03-capacity"
ARMS = ("baseline", "ngram-k3", "draft-k3-tp1")
PREREG = ROOT / "config" / "preregistration-gpu-h200-scale.yaml"


def _arm(arm: str) -> tuple[dict, list[dict], list[dict]]:
    knee = json.loads((RUN / arm / "knee.json").read_text())
    steps = [json.loads(line) for line in (RUN / arm / "steps.jsonl").read_text().splitlines()]
    soaks = [json.loads(line) for line in (RUN / arm / "soaks.jsonl").read_text().splitlines()]
    return knee, steps, soaks


@pytest.mark.parametrize("arm", ARMS)
def test_the_kv_pool_read_from_the_record_is_the_launch_logs(arm):
    knee, _, _ = _arm(arm)
    logged = re.findall(r"GPU KV cache size: ([\d,]+) tokens", (RUN / arm / "launch-excerpt.log").read_text())
    assert len(logged) == 1
    assert kv_capacity_tokens(knee["deployment"]) == int(logged[0].replace(",", ""))


@pytest.mark.parametrize("arm", ARMS)
def test_the_search_is_not_client_limited_up_to_the_servers_knee(arm):
    """Every step and soak ran with the client inside its gates, and every failed step failed on a server
    gate: the knee is the server's (the search before issue 28 stopped at 128 req/s with no knee)."""
    knee, steps, soaks = _arm(arm)
    assert knee["status"] == "confirmed" and knee["step_above_rps"] > knee["knee_rps"]
    for row in steps + soaks:
        assert not row["client_limited"] and not row["loadgen_limited"], row
        assert all(row["gates"][g] != "fail" for g in CLIENT_GATES), row["gates"]
        failed = set(row["failed_gates"])
        assert failed <= set(SERVER_GATES), failed
        assert (row["verdict"] == "pass") == (not failed)
    # the knee is the rate whose soaks all passed, and a step or soak above it failed
    conf = knee["confirmation"]
    assert conf["confirmed"] and conf["knee_all_pass"]
    assert {round(s["rate_rps"], 6): s["verdicts"] for s in conf["soaked"]}[round(knee["knee_rps"], 6)] == ["pass"] * 2
    at_knee = [r for r in soaks if r["phase"] == "soak_knee" and abs(r["offered_rate"] - knee["knee_rps"]) < 1e-6]
    assert [r["verdict"] for r in at_knee] == ["pass", "pass"]
    assert any(r["verdict"] != "pass" and r["offered_rate"] > knee["knee_rps"] for r in steps + soaks)


def test_the_preregistered_capacity_criteria_on_the_h200():
    crit = yaml.safe_load(PREREG.read_text())["capacity_criteria"]
    base_knee, base_steps, _ = _arm("baseline")
    ngram_knee, ngram_steps, _ = _arm("ngram-k3")
    draft_knee, draft_steps, _ = _arm("draft-k3-tp1")
    ngram = cc.evaluate(crit, base_knee, ngram_knee, base_steps, ngram_steps)
    by = {r["criterion"]: r for r in ngram["criteria"]}
    assert ngram["met"] and ngram["missed"] == []
    assert by["knee_ratio"]["value"] == pytest.approx(128.0 / 107.63474115247547)
    assert by["ttft_p95_at_matched_load"]["matched_rps"] == 64.0
    assert by["ttft_p95_at_matched_load"]["value"] == pytest.approx(73.24 / 166.3, rel=1e-3)
    assert by["tpot_p95_at_matched_load"]["value"] == pytest.approx(2.924 / 7.011, rel=1e-3)
    assert by["kv_tokens_lost"]["value"] == pytest.approx(1 - 337_792 / 341_840)
    draft = cc.evaluate(crit, base_knee, draft_knee, base_steps, draft_steps)
    assert not draft["met"]
    assert draft["missed"] == ["knee_ratio", "ttft_p95_at_matched_load", "tpot_p95_at_matched_load"]
    assert {r["criterion"]: r for r in draft["criteria"]}["kv_tokens_lost"]["value"] == pytest.approx(
        1 - 246_400 / 341_840)


def test_compare_names_the_kv_cost_and_the_knee_move():
    text = compare_knees(RUN / "baseline" / "knee.json", RUN / "ngram-k3" / "knee.json")
    assert text == (RUN / "capacity-compare.txt").read_text().strip()
    assert text.startswith("n-gram speculation (no draft model) costs 1.2% of the KV pool (341,840 -> 337,792")
    draft = compare_knees(RUN / "baseline" / "knee.json", RUN / "draft-k3-tp1" / "knee.json")
    assert draft.startswith("the draft costs 27.9% of the KV pool (341,840 -> 246,400 tokens)")
