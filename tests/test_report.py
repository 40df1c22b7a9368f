"""Smoke tests for specstudy.report.document: renders from a fake results tree and says what is missing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from specstudy.analysis import tables
from specstudy.report import document as report
from specstudy.report.files import from_root
from test_tables import EFFECTS, make_results_tree

LAUNCH = ["vllm", "serve", "/models/apertus-70b", "--tensor-parallel-size", "4"]


def _build(tmp_path, **kw):
    res = make_results_tree(tmp_path, **kw)
    tables.build_tables(res, res / "tables")
    return res


# chat@c8 at a clear 5% gain: with the fixture's ±2% pseudo-noise every cell is non-inferior or better
CLEAR = {**EFFECTS, "draft-k3-tp4": {**EFFECTS["draft-k3-tp4"], ("chat", 8): 1.05}}


def _prereg(tmp_path):
    """The embedded pre-registration with H2's low workload renamed to this tree's 'chat'."""
    import yaml

    from specstudy.study.config import REPO_ROOT

    prereg = yaml.safe_load((REPO_ROOT / "config" / "preregistration.yaml").read_text())
    next(h for h in prereg["hypotheses"] if h["id"] == "H2")["roles"]["low"] = "chat"
    prereg["traffic"]["mixture"] = {"chat": 0.5, "code": 0.3, "summarization": 0.2}  # the same rename
    # The fixture tree has its 3 rounds and no adaptive look left: one look, no correction for repeated looks.
    prereg["confirmation"]["stopping"]["max_repeats"] = prereg["confirmation"]["repeats"]
    p = tmp_path / "prereg.yaml"
    p.write_text(yaml.safe_dump(prereg))
    return p


def _with_knees(res):
    for arm, knee, kv in (("baseline", 4.0, 100000), ("draft-k3-tp4", 5.0, 80000)):
        (res / "capacity" / arm).mkdir(parents=True)
        (res / "capacity" / arm / "knee.json").write_text(json.dumps(
            {"schema": "specstudy.capacity-knee/1", "arm": arm, "status": "confirmed", "knee_rps": knee,
             "step_above_rps": knee * 1.25,
             "bracket": {"last_pass_rps": knee * 1.25, "first_fail_rps": knee * 1.5, "client_limited_rps": None},
             "resolution_frac": 0.05, "client_capacity": {"rps": 64.0, "source": "config"},
             "deployment": {"cache_config": {"kv_cache_tokens": kv}}, "reasons": [],
             "confirmation": {"count": 3, "duration_s": 60, "knee_verdicts": ["pass"] * 3,
                              "above_verdicts": ["fail", "pass", "fail"], "confirmed": True,
                              "moves": [{"from_knee_rps": knee * 1.25, "to_knee_rps": knee, "direction": "down"}]}}))
    return res


def _config(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"recommendation": {"launch_args": LAUNCH,
                                                  "model_launch": "tests/data/model-launch/manifest.json"},
                               "engine": {"draft": {"path": "/models/swiss-ai/Apertus-v1.5-8B"}},
                               "study": {"preregistration": str(_prereg(tmp_path))},
                               "corpora": {"workloads": {w: f"{w}.yaml" for w in ("code", "chat", "summarization")}}}))
    return cfg


def test_report_full_tree(tmp_path):
    res = _with_knees(_build(tmp_path, effects=CLEAR))
    # the workflow's checkpoint after the 3 initial rounds: a full tree has it (else it is a missing piece)
    (res / "confirm" / "rounds").mkdir(parents=True)
    (res / "confirm" / "rounds" / "round3.json").write_text(json.dumps(
        {"round": 3, "decision": "enable draft-k3-tp4", "continue": False, "why": "decided after 3 rounds"}))
    cfg = _config(tmp_path)
    from specstudy.cli import main

    assert main(["report", "--results", str(res), "--tables", str(res / "tables"), "--config", str(cfg),
                 "--out", str(res / "report")]) == 0
    md = (res / "report" / "report.md").read_text()
    html = (res / "report" / "report.html").read_text()
    assert "Decision: enable — enable draft-k3-tp4" in md
    patch = (res / "report" / "vllm-args.patch").read_text()
    assert "+--speculative-config" in patch and "/models/draft" in patch and " --tensor-parallel-size 4" in patch
    for needle in ("Results per workload × concurrency (confirm)", "1.409 [1.312, 1.514]",
                   "NO — every selection input comes from screening", "winner's curse", "CC-BY-4.0",
                   "loadgen_limited", "engine refused draft TP 1", "Drift", "EXPLANATORY",
                   "| H4 |", "untestable", "draft-k3-tp4 vs baseline: differs in async_scheduling",
                   "| draft-k3-tp4 | 5 | 6.25 | confirmed | 3/3 pass, 2/3 fail |", "knee moved down from 6.25", "the draft costs 20.0% of the KV pool",
                   "moves the knee by +1 req/s", "Control's worst case", "nothing: all inputs present",
                   "Stability: enable draft-k3-tp4 in", "Per-cell verdicts", "| draft-k3-tp4 | code@c1 | 3 | 1.409 | "
                   "[1.312, 1.514] | gain |",
                   "Correctness gates", "| H2 | Code and summarization accept more and gain more than open chat. | screen |",
                   "Gate rule: A candidate is eligible only with a correctness-gate verdict 'pass' from the confirm phase"):
        assert needle in md, needle
    assert "<table>" in html and "plots/speedup.png" in html
    for png in ("speedup", "tpot", "acceptance_vs_speedup", "per_position", "memory", "latency", "drift"):
        assert (res / "report" / "plots" / f"{png}.png").stat().st_size > 1000, png
    rec = json.loads((res / "report" / "recommendation.json").read_text())
    assert rec["selection"]["used_confirmation"] is False
    # the model-launch example already runs draft k3 / TP 4: nothing to change, and the evidence says why it stays
    assert (res / "report" / "model-launch.patch").read_bytes() == b""
    pr = (res / "report" / "model-launch-pr.md").read_text()
    assert "the example already sets draft-k3-tp4's settings" in pr and "| draft-k3-tp4 | code | 1 | 1.409 |" in pr
    assert rec["model_launch"]["example"]["commit"] == "2fd9e2062cd4219a9e8c231282aafe51aaf7ddf0"
    assert "model-launch pull request (model-launch-pr.md): nothing proposed" in md
    assert {h["id"]: h["verdict"] for h in rec["hypotheses"]}["H4"] == "untestable"


def test_report_without_confirmation_or_capacity(tmp_path):
    res = _build(tmp_path, confirm=False)
    summary = report.build(from_root(res, res / "tables"), {}, res / "report")
    md = (res / "report" / "report.md").read_text()
    assert summary["recommendation"]["decision"] == "insufficient_evidence"
    assert "no confirm cells" in md
    # what was left out of the comparisons, and why: the screen cells, named by arm, and the fix
    assert "No confirm comparisons: the cells table holds no confirm cells, so every cell it holds was left out" in md
    (why,) = [m for m in summary["recommendation"]["missing"] if m.startswith("no confirm comparisons")]
    assert "(screen: baseline (" in why and "recommendation.phase" in why and "has the confirm phase run" not in why
    assert "Missing: no results/capacity/" in md
    assert not (res / "report" / "vllm-args.patch").exists()
    assert (res / "report" / "model-launch.patch").read_bytes() == b""  # an output of the rule either way
    assert "the decision is insufficient_evidence" in (res / "report" / "model-launch-pr.md").read_text()


def test_report_flags_selection_that_read_confirmation(tmp_path):
    res = _build(tmp_path)
    sel = json.loads((res / "selection" / "selection.json").read_text())
    sel["inputs"] = [{"path": "results/confirm/draft-k3-tp4/rep0/code/c1/summary.json", "sha256": "1" * 64}]
    (res / "selection" / "selection.json").write_text(json.dumps(sel))
    report.build(from_root(res, res / "tables"), {}, res / "report")
    assert "YES — the selection read confirmation data" in (res / "report" / "report.md").read_text()


def test_report_empty_results(tmp_path):
    tables.build_tables(tmp_path / "results", tmp_path / "t")
    report.build(from_root(tmp_path / "results", tmp_path / "t"), None, tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    assert "no screen cells" in md and "no gate verdicts" in md and "no selection" in md
    shutil.rmtree(tmp_path / "r")


def test_report_names_inconclusive_cells_and_the_rounds_run(tmp_path):
    """The fixture's chat@c8 (true 0.99) is neither a shown loss nor non-inferior after 3 rounds: it blocks."""
    res = _build(tmp_path)
    rounds = res / "confirm" / "rounds"
    rounds.mkdir(parents=True)
    (rounds / "round3.json").write_text(json.dumps(
        {"round": 3, "decision": "do_not_enable", "continue": True, "why": "undecided after 3 rounds: draft-k3-tp4 chat@c8",
         "stability": {"resamples": 10, "outcomes": {"do_not_enable": 0.8, "enable draft-k3-tp4": 0.2}}}))
    summary = report.build(from_root(res, res / "tables"), {}, res / "report")
    md = (res / "report" / "report.md").read_text()
    rec = summary["recommendation"]
    assert rec["decision"] == "do_not_enable" and rec["undecided"][0]["what"] == "chat@c8"
    assert "- draft-k3-tp4 chat@c8: inconclusive [" in md and "more round(s)" in md
    assert "| 3 | do_not_enable | one more round | undecided after 3 rounds: draft-k3-tp4 chat@c8 |" in md
    assert "do_not_enable in 80% of resamples, enable draft-k3-tp4 in 20% of resamples" in md
    assert abs(sum(rec["stability"]["outcomes"].values()) - 1) < 1e-9


def test_report_shows_drift_from_drift_deployments(tmp_path):
    """Review #16.1: the report's drift section names the drift<n> deployments it used."""
    from test_tables import _add_drift_deployment

    res = make_results_tree(tmp_path)
    _add_drift_deployment(res)
    tables.build_tables(res, res / "tables")
    summary = report.build(from_root(res, res / "tables"), {}, res / "report")
    md = (res / "report" / "report.md").read_text()
    assert "Interleaved drift baseline deployments (screen/drift1): 1 valid cell(s), 1 in the trend" in md
    assert summary["drift"]["n_by_kind"]["drift"] == 1


def test_report_from_named_files_equals_the_report_from_the_results_root(tmp_path):
    """The workflow's way (every file named, as rules/report.smk passes its inputs) and the interactive
    ``--results`` give the same report of the same tree."""
    import glob

    from specstudy.cli import main
    from specstudy.core import layout

    res = _with_knees(_build(tmp_path, effects=CLEAR))
    cfg = _config(tmp_path)
    for n in (3, 4, 10):  # the checkpoints, in round order (10 after 4)
        Path(layout.confirm_round(n, res)).parent.mkdir(parents=True, exist_ok=True)
        Path(layout.confirm_round(n, res)).write_text(json.dumps(
            {"round": n, "decision": "enable", "continue": n < 10, "why": f"checkpoint {n}"}))
    assert main(["report", "--results", str(res), "--config", str(cfg), "--out", str(tmp_path / "by-root")]) == 0
    root = str(res)
    records = [p for ph in ("screen", "confirm") for p in glob.glob(layout.glob_pattern("deployment", root, phase=ph))]
    named = {
        "--table-files": [layout.table(t, root) for t in ("cells", "requests", "deployments", "gates")],
        "--selection": [layout.selection(root)],
        "--rounds": glob.glob(layout.glob_pattern("round", root)),
        "--knees": [layout.capacity_knee("draft-k3-tp4", root), layout.capacity_knee("baseline", root)],
        "--corpora": glob.glob(layout.glob_pattern("corpus", root)),
        "--records": records[::-1],  # any order
    }
    assert named["--rounds"] and named["--corpora"] and records
    for f in (layout.final_candidate(root),):
        if Path(f).exists():
            named["--final-candidate"] = [f]
    argv = ["report", "--config", str(cfg), "--out", str(tmp_path / "by-files")]
    for opt, files in named.items():
        argv += [opt, *files]
    assert main(argv) == 0
    a, b = tmp_path / "by-root", tmp_path / "by-files"
    assert (b / "report.md").read_text() == (a / "report.md").read_text()
    assert json.loads((b / "recommendation.json").read_text()) == json.loads((a / "recommendation.json").read_text())
    assert sorted(p.name for p in (b / "plots").iterdir()) == sorted(p.name for p in (a / "plots").iterdir())
    md = (b / "report.md").read_text()
    assert md.index("checkpoint 4") < md.index("checkpoint 10") and "| draft-k3-tp4 | 5 | 6.25 |" in md
    # named files are the only ones read: without the knees, the capacity section says they are missing
    argv = [x for x in argv if x not in named["--knees"]]
    assert main(argv[:argv.index("--out") + 1] + [str(tmp_path / "no-knees")] + argv[argv.index("--out") + 2:]) == 0
    assert "Missing: no results/capacity/*/knee.json" in (tmp_path / "no-knees" / "report.md").read_text()
