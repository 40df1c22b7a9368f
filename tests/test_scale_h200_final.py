"""The positive path on real measurements: the finished scale-model study of the lent H200 (issues 27, 28).

The pack committed under docs/gpu-results/2026-12-03-scale-lease3/ holds the whole study as the scale-run code
(commit a1c5fca) measured it over three leases: screening, three confirmation rounds of baseline,
draft-k3-tp1, draft-k5-tp1 and ngram-k5, and the capacity searches of the baseline and the final candidate.
This code rebuilds the tables from its raw records and decides on them: enable ngram-k5, with the capacity
half of the rule met, and a patch that adds its speculative config. Every expected figure is recomputed here
from the raw JSON of the pack (cell summaries, knee records), not taken from the tables or the report.
"""

from __future__ import annotations

import json
import math
import statistics
import tarfile
from pathlib import Path

import pytest

from specstudy.cli import main
from specstudy.study.config import REPO_ROOT

PACK = REPO_ROOT / "docs" / "gpu-results" / "2026-12-03-scale-lease3" / "results.tar.xz"
CONFIG = REPO_ROOT / "config" / "gpu-h200-scale.yaml"
WORKLOADS = ("code", "open_chat", "summarization")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The pack's ``results/`` tree, and the tables and report this code builds from it."""
    out = tmp_path_factory.mktemp("scale-final")
    with tarfile.open(PACK) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith("results/")]
        assert len(members) > 1000
        tf.extractall(out, members=members, filter="data")
    results = out / "results"
    assert main(["tables", "--results", str(results), "--out", str(out / "tables")]) == 0
    assert main(["report", "--results", str(results), "--tables", str(out / "tables"), "--config", str(CONFIG),
                 "--out", str(out / "report")]) == 0
    rec = json.loads((out / "report" / "recommendation.json").read_text())
    return results, out / "report", rec


def _summary(results: Path, arm: str, rep: int, workload: str, c: int) -> dict:
    return json.loads((results / "confirm" / arm / f"rep{rep}" / workload / f"c{c}" / "summary.json").read_text())


def _speedups(results: Path, arm: str, workload: str, c: int) -> list[float]:
    """Per-deployment speedups (arm over baseline output tokens/s, same repeat), valid pairs only."""
    out = []
    for rep in (1, 2, 3):
        a, b = _summary(results, arm, rep, workload, c), _summary(results, "baseline", rep, workload, c)
        if a["validity"]["valid"] and b["validity"]["valid"]:
            out.append(a["tokens"]["output_tokens_per_second"] / b["tokens"]["output_tokens_per_second"])
    return out


def _candidate(rec: dict, arm: str) -> dict:
    return next(c for c in rec["recommendation"]["candidates"] if c["arm"] == arm)


def test_the_study_is_complete_and_not_provisional(study):
    results, report, rec = study
    assert rec["missing"] == [] and rec["recommendation"]["missing"] == []
    md = (report / "report.md").read_text()
    assert "PROVISIONAL" not in md and "- nothing: all inputs present" in md
    for arm in ("baseline", "draft-k3-tp1", "draft-k5-tp1", "ngram-k5"):  # three deployments each
        assert sorted(p.parent.name for p in (results / "confirm" / arm).glob("rep*/deployment.json")) == [
            "rep1", "rep2", "rep3"], arm


def test_it_decides_enable_ngram_k5_from_the_raw_speedups(study):
    results, _, rec = study
    r = rec["recommendation"]
    assert (r["decision"], r["enable"], r["phase"]) == ("enable", "ngram-k5", "confirm")
    assert r["rule"]["source"] == "pre-registration" and r["rule"]["non_inferiority_on"] == "mixture"
    ngram = _candidate(rec, "ngram-k5")
    assert ngram["enable"] is True and ngram["gate_verdict"] == "pass" and ngram["blockers"] == []
    for w in WORKLOADS:
        for c in (1, 8, 32):
            cell = ngram["cells"][f"{w}@c{c}"]
            values = _speedups(results, "ngram-k5", w, c)
            assert cell["values"] == pytest.approx(values, rel=1e-9), (w, c)
            assert cell["geomean"] == pytest.approx(math.exp(statistics.fmean(map(math.log, values))), rel=1e-9)
            assert cell["lo"] <= cell["geomean"] <= cell["hi"]
            # the verdicts follow the declared margins (gain: lo > 1 + 5 %; regression: hi < 1 − 5 %)
            want = ("gain" if cell["lo"] > 1 + r["min_gain"] else
                    "regression" if cell["hi"] < 1 - r["max_regression"] else "inconclusive")
            assert cell["verdict"] == want, (w, c)
    # the gains where the n-gram drafter finds its prompt in the output, none shown on code
    assert {k for k, v in ngram["cells"].items() if v["verdict"] == "gain"} == {
        "open_chat@c1", "open_chat@c8", "open_chat@c32", "summarization@c1", "summarization@c32"}
    assert all(not k.startswith("code") for k, v in ngram["cells"].items() if v["verdict"] == "regression")
    # the declared mixture gains at every concurrency: the non-inferiority is judged on it
    assert {k: v["verdict"] for k, v in ngram["mixture"].items()} == {f"mix@c{c}": "gain" for c in (1, 8, 32)}


def test_the_draft_model_arms_regress_everywhere_the_intervals_decide(study):
    results, _, rec = study
    for arm in ("draft-k3-tp1", "draft-k5-tp1"):
        cand = _candidate(rec, arm)
        assert cand["enable"] is False and cand["excluded"] is True
        assert any(b.startswith("regression shown") for b in cand["blockers"])
        for key, cell in cand["cells"].items():
            w, c = key.split("@")
            values = _speedups(results, arm, w, int(c.removeprefix("c")))
            assert cell["values"] == pytest.approx(values, rel=1e-9) and max(values) < 0.5, (arm, key)
            assert cell["verdict"] in ("regression", "inconclusive")


def test_the_capacity_half_is_met_from_the_knee_records(study):
    results, report, rec = study
    knee = {a: json.loads((results / "capacity" / a / "knee.json").read_text()) for a in ("baseline", "ngram-k5")}
    assert {a: k["status"] for a, k in knee.items()} == {"baseline": "confirmed", "ngram-k5": "confirmed"}
    # every soak at the knee passed, at least one a step above failed: the knee is confirmed, not a single step
    for k in knee.values():
        conf = k["confirmation"]
        assert conf["knee_all_pass"] and conf["above_any_fail"] and k["client_capacity"]["source"] == "measured"
        assert k["knee_rps"] < k["client_capacity"]["rps"]  # the client was not the limit
    assert knee["baseline"]["confirmation"]["moves"][0]["direction"] == "down"  # a failed soak moved it
    half = rec["recommendation"]["capacity_half"]
    assert half["arm"] == "ngram-k5" and half["evaluated"] and half["evaluation"]["met"]
    crit = {c["criterion"]: c for c in half["evaluation"]["criteria"]}
    assert crit["knee_ratio"]["value"] == pytest.approx(knee["ngram-k5"]["knee_rps"] / knee["baseline"]["knee_rps"])
    kv = {a: k["deployment"]["cache_config"]["kv_cache_tokens"] for a, k in knee.items()}
    assert crit["kv_tokens_lost"]["value"] == pytest.approx(1 - kv["ngram-k5"] / kv["baseline"])
    assert all(c["verdict"] == "met" for c in crit.values())
    assert (report / "plots" / "capacity-ngram-k5.png").stat().st_size > 1000


def test_the_patch_adds_the_enabled_arms_speculative_config(study):
    results, report, rec = study
    plan = json.loads((results / "plan" / "confirm.json").read_text())
    arm = next(a for a in plan["arms"] if a["name"] == "ngram-k5")  # what the confirmation deployed
    added = [ln[1:] for ln in (report / "vllm-args.patch").read_text().splitlines()
             if ln.startswith("+") and not ln.startswith("+++")]
    assert len(added) == 1 and added[0].startswith("--speculative-config ")
    spec = json.loads(added[0].split(" ", 1)[1].strip("'"))
    assert spec == {k: v for k, v in arm.items() if k != "name"} and spec["num_speculative_tokens"] == 5
    assert rec["patches"] == {"all": "vllm-args.patch"}


def test_cells_the_load_generator_limited_are_excluded_by_name(study):
    results, _, rec = study
    limited = set()
    for p in results.glob("confirm/*/rep*/*/c*/summary.json"):
        s = json.loads(p.read_text())
        if not s["validity"]["valid"]:
            assert [x["code"] for x in s["validity"]["reasons"]] == ["loadgen_limited"], p
            limited.add((p.parts[-5], int(p.parts[-4][3:]), p.parts[-3], int(p.parts[-2][1:])))
    assert len(limited) == 4  # recorded under the old p99 rule (docs/gpu.md, scale-model study)
    for comp in rec["comparisons"]:
        if comp["phase"] != "confirm":
            continue
        want = sorted(({"rep": rep, "reason": f"{'baseline' if a == 'baseline' else 'arm'}: loadgen_limited"}
                       for a, rep, w, c in limited
                       if (a in ("baseline", comp["arm"])) and (w, c) == (comp["workload"], comp["concurrency"])),
                      key=lambda e: (e["rep"], e["reason"]))
        assert sorted(comp["excluded"], key=lambda e: (e["rep"], e["reason"])) == want, comp["arm"]


def test_the_final_candidate_record_follows_the_locked_rule(study, tmp_path):
    """The pack's own final-candidate record (scale-run code) ranked by the library's default margins (2 % on
    every cell) and wrote ``do_not_enable``; ``final-candidate`` now reads the locked pre-registration, as
    the recommendation does, and records the same decision as the report."""
    results, _, rec = study
    recorded = json.loads((results / "selection" / "final-candidate.json").read_text())
    assert recorded["arm"] == "ngram-k5" and recorded["decision"] == "do_not_enable"  # what the device wrote
    assert any("below 0.98" in b for b in recorded["ranking"][0]["blockers"])
    out = tmp_path / "final-candidate.json"
    assert main(["final-candidate", "--config", str(CONFIG),
                 "--summaries", *map(str, sorted(results.glob("confirm/*/rep*/*/c*/summary.json"))),
                 "--gates", *map(str, sorted(results.glob("gates/confirm/*.json"))),
                 "--selection", str(results / "selection" / "selection.json"),
                 "--plan", str(results / "plan" / "confirm.json"),
                 "--lock", str(results / "screen" / "prereg-lock.json"), "--out", str(out)]) == 0
    fc = json.loads(out.read_text())
    assert (fc["arm"], fc["rule_enables"], fc["beats_baseline"]) == ("ngram-k5", True, True)
    assert fc["rule"] == {"source": "pre-registration", "min_gain": 0.05, "max_regression": 0.05,
                          "look_confidence": 0.95, "non_inferiority_on": "mixture"}
    assert fc["ranking"][0]["blockers"] == [] and rec["recommendation"]["enable"] == fc["arm"]


def test_the_rounds_table_says_its_checkpoint_decision_is_interim(study):
    """Round 3's checkpoint judged with the screening gates (no cross-deployment control: ``no_verdict``) and
    recorded ``do_not_enable``; the report labels that column as the interim look it is, beside the decision."""
    results, report, rec = study
    state = json.loads((results / "confirm" / "rounds" / "round3.json").read_text())
    assert state["decision"] == "do_not_enable" and not state["continue"]
    assert all("gate verdict no_verdict" in c["blockers"] for c in state["candidates"])
    md = (report / "report.md").read_text()
    assert "| after round | interim decision (screening gates) | next | why |" in md
    assert "| 3 | do_not_enable | stop |" in md and rec["recommendation"]["decision"] == "enable"


def test_stability_is_not_estimable_once_cells_without_two_valid_rounds_are_redrawn(study):
    """The device's report said "do_not_enable in 73 %": every flip a cell or the mixture left without two
    distinct valid rounds. Redrawing those leaves only the observed rounds reordered: not estimable."""
    results, report, rec = study
    device = json.loads((results / "report" / "recommendation.json").read_text())["recommendation"]["stability"]
    assert device["outcomes"] == {"do_not_enable": pytest.approx(0.728), "enable ngram-k5": pytest.approx(0.272)}
    stab = rec["recommendation"]["stability"]
    assert stab["resamples"] == 0 and stab["note"].startswith("not estimable: with 3 rounds")
    md = (report / "report.md").read_text()
    assert "Stability: not estimable: with 3 rounds and these exclusions" in md
