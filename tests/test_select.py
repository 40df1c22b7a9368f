"""The pre-registered selection: screening only, locked pre-registration, the declared rule."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from specstudy.analysis import select
from specstudy.core.atomic import write_json

ROOT = Path(__file__).resolve().parents[1]
PREREG = {"version": 1, "selection": {"metric": "tpot_p50", "retain_within": 0.05,
                                      "retain_if": ["lower_memory", "better_worst_workload"], "best_ngram": True},
          "confirmation": {"concurrency": [1, 4, 8], "repeats": 3,
                           "stopping": {"max_repeats": 5, "correction": "bonferroni"},
                           "decision": {"min_gain": 0.05, "max_regression": 0.02}},
          "capacity_criteria": {"min_knee_ratio": 0.9, "matched_load_fraction": 0.8, "max_ttft_p95_ratio": 1.2,
                                "max_tpot_p95_ratio": 1.2, "max_kv_tokens_lost_fraction": 0.6},
          "traffic": {"route_by_workload": False, "shares": "output_tokens", "mixture": {"code": 0.6, "open_chat": 0.4}},
          "gate": {"margins": {"min_common_prefix_fraction": 0.05, "max_normalized_edit_distance": 0.05,
                               "max_completion_token_difference": 4}}}
METHOD = {"baseline": "baseline", "draft-k2-tp1": "draft_model", "draft-k4-tp1": "draft_model",
          "ngram-k2": "ngram", "ngram-k4": "ngram"}
# TPOT p50 (ms) per arm and workload; concurrency 4 is 1.5x slower for everyone.
TPOT = {"baseline": {"code": 10.0, "chat": 10.0},
        "draft-k2-tp1": {"code": 7.0, "chat": 8.0},
        "draft-k4-tp1": {"code": 6.0, "chat": 8.3},
        "ngram-k2": {"code": 9.0, "chat": 9.9},
        "ngram-k4": {"code": 8.5, "chat": 10.5}}


def summary(arm, workload, conc, rep, tpot, valid=True):
    return {"keys": {"phase": "screen", "arm": arm, "method": METHOD[arm], "rep": f"rep{rep}", "workload": workload,
                     "concurrency": conc},
            "validity": {"valid": valid, "reasons": [] if valid else [{"code": "low_success_rate"}]},
            "latency_ms": {"tpot": {"p50": tpot}}, "tokens": {"output_tokens_per_second": 1000.0 / tpot}}


def all_summaries(tpot=TPOT, noise=0.0):
    out = []
    for arm, per in tpot.items():
        for w, v in per.items():
            for c, f in ((1, 1.0), (4, 1.5)):
                for rep in (1, 2):
                    out.append(summary(arm, w, c, rep, v * f * (1 + noise * (rep - 1.5))))
    return out


def deployments(kv):
    return [{"arm": {"name": a}, "status": "ok", "cache_config": {"kv_cache_tokens": t}} for a, t in kv.items()]


def test_best_per_workload_and_best_ngram():
    res = select.select(all_summaries(), deployments({}), PREREG)
    assert res["per_workload"]["code"]["best"] == "draft-k4-tp1"
    assert res["per_workload"]["chat"]["best"] == "draft-k2-tp1"
    assert res["best_ngram"] == "ngram-k2"
    assert res["confirmation_arms"] == ["baseline", "draft-k2-tp1", "draft-k4-tp1", "ngram-k2"]


def test_max_candidates_keeps_the_lowest_mean_scores_and_records_the_rest():
    import copy
    import math

    pr = copy.deepcopy(PREREG)
    pr["selection"]["max_candidates"] = 1
    res = select.select(all_summaries(), deployments({}), pr)
    # mean log TPOT ratio over workloads: draft-k4 (0.6, 0.83) beats draft-k2 (0.7, 0.8) and ngram-k2 (0.9, 0.99)
    assert res["confirmation_arms"] == ["baseline", "draft-k4-tp1"]
    assert {c["arm"] for c in res["capped"]} == {"draft-k2-tp1", "ngram-k2"}
    k2 = next(c for c in res["capped"] if c["arm"] == "draft-k2-tp1")
    assert k2["mean_score"] == pytest.approx((math.log(0.7) + math.log(0.8)) / 2) and "max_candidates 1" in k2["why"]
    pr["selection"]["max_candidates"] = 2
    assert select.select(all_summaries(), deployments({}), pr)["confirmation_arms"] == \
        ["baseline", "draft-k2-tp1", "draft-k4-tp1"]
    assert "capped" not in select.select(all_summaries(), deployments({}), PREREG)  # no cap: the record as before


def test_within_margin_kept_only_with_lower_memory_or_better_worst_workload():
    tp = {k: dict(v) for k, v in TPOT.items()}
    tp["draft-k2-tp1"] = {"code": 6.2, "chat": 8.6}   # within 5% on code, worse on chat
    tp["draft-k4-tp1"] = {"code": 6.0, "chat": 8.3}   # best on both
    res = select.select(all_summaries(tp), deployments({}), PREREG)
    assert res["per_workload"]["code"]["best"] == "draft-k4-tp1"
    assert res["per_workload"]["code"]["retained"] == []   # neither lower memory (unknown) nor better worst case
    res = select.select(all_summaries(tp), deployments({"draft-k4-tp1": 1000, "draft-k2-tp1": 1200}), PREREG)
    kept = res["per_workload"]["code"]["retained"]
    assert [k["arm"] for k in kept] == ["draft-k2-tp1"] and "lower memory" in kept[0]["reasons"][0]
    assert "draft-k2-tp1" in res["confirmation_arms"]


def test_invalid_cells_are_excluded_and_listed():
    s = all_summaries()
    s = [x for x in s if not (x["keys"]["arm"] == "draft-k4-tp1" and x["keys"]["workload"] == "code")]
    s += [summary("draft-k4-tp1", "code", c, r, 1.0, valid=False) for c in (1, 4) for r in (1, 2)]
    res = select.select(s, deployments({}), PREREG)
    assert res["per_workload"]["code"]["best"] == "draft-k2-tp1"   # the super-fast but invalid cells do not count
    assert len(res["excluded_cells"]) == 4


@pytest.fixture()
def study(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(ROOT / "config" / "config.yaml") as fh:
        cfg = yaml.safe_load(fh)
    cfg["arms"]["num_speculative_tokens"] = [2, 4]  # the constructed screening below is of depths 2 and 4
    prereg = tmp_path / "prereg.yaml"
    prereg.write_text(yaml.safe_dump(PREREG))
    cfg["study"]["preregistration"] = str(prereg)
    cfgf = tmp_path / "config.json"
    cfgf.write_text(json.dumps(cfg))
    from specstudy.study.plan import prereg_lock

    write_json("results/screen/prereg-lock.json", prereg_lock(cfg))
    paths = []
    for i, s in enumerate(all_summaries()):
        k = s["keys"]
        p = Path(f"results/screen/{k['arm']}/{k['rep']}/{k['workload']}/c{k['concurrency']}/summary.json")
        write_json(p, s)
        paths.append(str(p))
        assert i >= 0
    return {"cfg": str(cfgf), "prereg": prereg, "summaries": paths, "tmp": tmp_path}


def test_selection_cli_writes_inputs_and_refuses_changed_prereg(study):
    out = "results/selection/selection.json"
    res = select.run_selection(study["cfg"], "results/screen/prereg-lock.json", study["summaries"], [], out)
    assert res["phase_of_inputs"] == "screen" and len(res["inputs"]) == len(study["summaries"])
    assert all(i["path"].startswith("results/screen/") for i in res["inputs"])
    study["prereg"].write_text(study["prereg"].read_text().replace("0.05", "0.10", 1))
    with pytest.raises(select.SelectionError, match="pre-registration changed since screening started"):
        select.run_selection(study["cfg"], "results/screen/prereg-lock.json", study["summaries"], [], out)


def test_selection_refuses_non_screening_files(study):
    src = Path(study["summaries"][0])
    dst = Path("results/confirm/baseline/rep1/code/c1/summary.json")
    dst.parent.mkdir(parents=True)
    shutil.copy(src, dst)
    with pytest.raises(select.SelectionError, match="screening outputs only"):
        select.run_selection(study["cfg"], "results/screen/prereg-lock.json", study["summaries"] + [str(dst)], [],
                             "results/selection/selection.json")


def test_final_candidate_requires_a_passing_gate():
    def conf(arm, w, c, rep, tput):
        return {"keys": {"phase": "confirm", "arm": arm, "workload": w, "concurrency": c, "rep": f"rep{rep}"},
                "validity": {"valid": True}, "tokens": {"output_tokens_per_second": tput}}
    s = [conf("baseline", "code", 1, r, 100) for r in (1, 2, 3)]
    s += [conf("draft-k2-tp1", "code", 1, r, 150) for r in (1, 2, 3)]
    s += [conf("ngram-k2", "code", 1, r, 120) for r in (1, 2, 3)]
    sel = {"confirmation_arms": ["baseline", "draft-k2-tp1", "ngram-k2"]}
    res = select.final_candidate(s, [{"arm": "draft-k2-tp1", "phase": "confirm", "verdict": "pass"},
                                      {"arm": "ngram-k2", "phase": "confirm", "verdict": "pass"}], sel)
    assert res["arm"] == "draft-k2-tp1" and res["beats_baseline"]
    res = select.final_candidate(s, [{"arm": "draft-k2-tp1", "phase": "confirm", "verdict": "fail"},
                                      {"arm": "ngram-k2", "phase": "confirm", "verdict": "pass"}], sel)
    assert res["arm"] == "ngram-k2"
    res = select.final_candidate(s, [{"arm": "draft-k2-tp1", "phase": "confirm", "verdict": "no_verdict"}], sel)
    assert res["arm"] is None


def test_select_respects_the_screening_gates():
    """Review #16.5: an arm whose screening gate failed used to be selected anyway."""
    gates = [{"arm": "draft-k4-tp1", "phase": "screen", "verdict": "fail"},
             {"arm": "draft-k2-tp1", "phase": "screen", "verdict": "pass"}]
    res = select.select(all_summaries(), deployments({}), PREREG, gates)
    assert "draft-k4-tp1" not in res["confirmation_arms"]
    assert res["per_workload"]["code"]["best"] == "draft-k2-tp1"
    assert res["gate_excluded"] == [{"arm": "draft-k4-tp1", "why": "screening correctness gate verdict fail"}]


def test_a_hand_edited_selection_is_never_consumed(study):
    """Review #16.5: confirmation trusted selection.json without checking it."""
    from specstudy.core import atomic
    from specstudy.job.run import run_deployment

    out = "results/selection/selection.json"
    select.run_selection(study["cfg"], "results/screen/prereg-lock.json", study["summaries"], [], out)
    assert select.verify_selection(out)["confirmation_arms"][0] == "baseline"
    # the plan records the selection's sha256
    from specstudy.cli import main

    assert main(["plan", "--config", study["cfg"], "--phase", "confirm", "--selection", out,
                 "--out", "results/plan/confirm.json"]) == 0
    select.verify_selection(out, "results/plan/confirm.json")
    # a hand edit: one more arm for confirmation
    sel = json.loads(Path(out).read_text())
    sel["confirmation_arms"].append("ngram-k4")
    Path(out).write_text(json.dumps(sel))
    # first the record every results file carries (specstudy.core.atomic) ...
    with pytest.raises(select.SelectionError, match="was changed after it was written"):
        select.verify_selection(out)
    # ... and, with that record deleted too, the selection's own digest
    atomic.sidecar(out).unlink()
    with pytest.raises(select.SelectionError, match="field 'digest'"):
        select.verify_selection(out)
    assert main(["plan", "--config", study["cfg"], "--phase", "confirm", "--selection", out,
                 "--out", "results/plan/confirm2.json"]) == 2
    # a selection re-written with a valid digest but not the one the plan was built from
    sel["digest"] = select.selection_digest(sel)
    Path(out).write_text(json.dumps(sel))
    select.verify_selection(out)
    with pytest.raises(select.SelectionError, match="recorded in results/plan/confirm.json"):
        select.verify_selection(out, "results/plan/confirm.json")
    # a confirmation deployment refuses to run on it (before any server starts)
    spec = {"phase": "confirm", "rep": "rep1", "kind": "repeat", "arm": {"name": "baseline", "method": "baseline"},
            "cells": [], "engine": {"target": {"path": "m", "max_model_len": 8}}, "cell_settings": {}}
    assert run_deployment(spec, "results/confirm/baseline/rep1", "results/plan/confirm.json",
                          results_root="results") == 2
    assert not Path("results/confirm/baseline/rep1/deployment.json").exists()
    assert atomic.read_json("results/plan/confirm.json")["selection"]["path"] == out
