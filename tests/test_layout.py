"""The results-path layout (specstudy.core.layout): every kind of path builds and parses back to its keys, a
malformed path is refused naming the path and what is wrong, and the rules take their path patterns from it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specstudy.core import layout
from specstudy.core.layout import LayoutError

ROOT = Path(__file__).resolve().parents[1]

#: keys of one path of every kind
EXAMPLES = {
    "cell": dict(phase="screen", arm="draft-k3-tp1", rep="rep2", workload="code", concurrency=4),
    "cell_dir": dict(phase="confirm", arm="baseline", rep="drift1", workload="open_chat", concurrency=16),
    "cell_rel": dict(workload="code", concurrency=1),
    "deployment": dict(phase="sampling", arm="ngram-k3", rep="rep1"),
    "deployment_dir": dict(phase="mechanics", arm="self-draft-k4", rep="rep1"),
    "attempt": dict(phase="screen", arm="baseline", rep="rep3", deployment_id="screen-baseline-rep3-20260101T000000Z-p12"),
    "attempt_cell_dir": dict(phase="screen", arm="baseline", rep="rep3", deployment_id="d-1", workload="code",
                             concurrency=4),
    "failure": dict(phase="confirm", arm="suffix-k8", rep="rep2", deployment_id="confirm-suffix-k8-rep2-x-j7"),
    "gate": dict(phase="screen", arm="eagle3-k4"),
    "plan": dict(phase="confirm"),
    "lock": {},
    "selection": {},
    "final_candidate": {},
    "round": dict(n=4),
    "knee": dict(arm="baseline"),
    "capacity_dir": dict(arm="draft-k2-tp1"),
    "table": dict(table="cells"),
    "report_file": dict(name="report.md"),
    "phase_summary": dict(phase="memory"),
    "phase_section": dict(phase="ignore_eos"),
    "corpus": dict(corpus="bundled-code", version="1"),
    "corpus_dir": dict(corpus="bundled-smoke", version="2.1"),
    "deployment_log": dict(phase="screen", arm="baseline", rep="rep1"),
    "deployment_benchmark": dict(phase="confirm", arm="ngram-k2", rep="drift3"),
    "config": dict(name="deployment-0123abcd"),
    "hash_cache": {},
    "mechanics_model": dict(role="draft"),
    "mechanics_arm": dict(phase="mechanics", arm="small-draft-k3", rep="rep1"),
}


def test_every_kind_has_an_example():
    assert set(EXAMPLES) == set(layout.TEMPLATES)


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
@pytest.mark.parametrize("root", ["results", "/tmp/study/results", "."])
def test_build_then_parse_gives_the_keys_back(kind, root):
    keys = EXAMPLES[kind]
    path = layout.build(kind, root, **keys)
    parsed = layout.parse(kind, path)
    assert parsed.pop("root") == root
    assert parsed == keys
    assert layout.build(kind, root, **parsed) == path


def test_the_named_builders_are_the_templates():
    assert layout.cell_summary("screen", "baseline", 1, "code", 4) == "results/screen/baseline/rep1/code/c4/summary.json"
    assert layout.deployment_record("confirm", "ngram-k2", "drift2") == "results/confirm/ngram-k2/drift2/deployment.json"
    assert layout.deployment_dir("screen", "baseline", "rep1", root="/x") == "/x/screen/baseline/rep1"
    assert layout.cell_rel("code", 4) == "code/c4"
    assert layout.gate("screen", "ngram-k2") == "results/gates/screen/ngram-k2.json"
    assert layout.plan("screen") == "results/plan/screen.json"
    assert layout.prereg_lock() == "results/screen/prereg-lock.json"
    assert layout.selection() == "results/selection/selection.json"
    assert layout.final_candidate() == "results/selection/final-candidate.json"
    assert layout.confirm_round(3) == "results/confirm/rounds/round3.json"
    assert layout.capacity_knee("baseline") == "results/capacity/baseline/knee.json"
    assert layout.table("gates") == "results/tables/gates.parquet"
    assert layout.report_file("report.md") == "results/report/report.md"
    assert layout.failure_dir("screen", "baseline", 2, "d") == "results/deployment-failures/screen/baseline/rep2/d"
    assert layout.log("screen", "baseline", "rep1") == "results/logs/screen/baseline/rep1.log"
    assert layout.benchmark("plan", "screen") == "results/benchmarks/plan/screen.tsv"
    assert layout.corpus_json("bundled-code", "1") == "results/corpora/bundled-code/1/corpus.json"
    assert layout.mechanics_model("target") == "results/models/mechanics/target/model.json"
    assert layout.mechanics_arm("ngram-k3") == "results/mechanics/ngram-k3/rep1/mechanics-arm.json"


def test_cells_and_deployments_as_records():
    cell = layout.parse_cell("results/screen/baseline/drift2/code/c4/summary.json")
    assert (cell.phase, cell.arm, cell.rep, cell.workload, cell.concurrency) == ("screen", "baseline", "drift2", "code", 4)
    assert cell.deployment.kind == "drift" and cell.deployment.number == 2
    assert cell.summary == "results/screen/baseline/drift2/code/c4/summary.json"
    assert cell.deployment.record == "results/screen/baseline/drift2/deployment.json"
    dep = layout.parse_deployment("/abs/results/confirm/ngram-k2/rep3/deployment.json")
    assert dep == layout.Deployment("confirm", "ngram-k2", "rep3", "/abs/results")
    assert dep.cell("code", 1).dir == "/abs/results/confirm/ngram-k2/rep3/code/c1"


def test_the_keys_in_the_file_decide_the_path():
    keys = {"phase": "confirm", "arm": "ngram-k2", "rep": 3, "rep_label": None, "workload": "code", "concurrency": 4}
    assert layout.cell_of_keys(keys).summary == "results/confirm/ngram-k2/rep3/code/c4/summary.json"
    assert layout.cell_of_keys(dict(keys, rep_label="drift1"), root="r").summary == "r/confirm/ngram-k2/drift1/code/c4/summary.json"


def test_wildcards_pass_through_as_snakemake_patterns():
    assert (layout.cell_summary("screen", "{{arm}}", "{{rep}}", "{workload}", "{conc}")
            == "results/screen/{{arm}}/{{rep}}/{workload}/c{conc}/summary.json")
    assert layout.deployment_record("{phase}", "{arm}", "{drift}") == "results/{phase}/{arm}/{drift}/deployment.json"
    assert layout.gate("{phase}", "{arm}") == "results/gates/{phase}/{arm}.json"


@pytest.mark.parametrize("path, what", [
    ("results/screen/baseline/rep1/code/c4x/summary.json", "segment 'c4x' does not fit 'c<concurrency>'"),
    ("results/screen/baseline/repX/code/c4/summary.json", "segment 'repX' does not fit '<rep>'"),
    ("results/screen/baseline/rep1/Code/c4/summary.json", "segment 'Code' does not fit '<workload>'"),
    ("results/screen/baseline/rep1/code/c4/summary.jsn", "segment 'summary.jsn' does not fit 'summary.json'"),
    ("code/c4/summary.json", "it has 3 path segment(s), the pattern needs 6"),
    ("results/screen/baseline/rep1/attempts/d-1/code/c4/summary.json", "segment 'd-1' does not fit '<rep>'"),
])
def test_a_malformed_cell_path_is_refused_naming_path_and_fault(path, what):
    with pytest.raises(LayoutError) as exc:
        layout.parse_cell(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: not a cell path (<root>/<phase>/<arm>/<rep>/<workload>/c<concurrency>/summary.json)")
    assert what in msg


def test_an_attempt_copy_is_not_a_declared_cell():
    with pytest.raises(LayoutError, match="an attempt's copy"):
        layout.parse_cell("results/screen/baseline/rep1/attempts/rep2/code/c4/summary.json")


@pytest.mark.parametrize("call, what", [
    (lambda: layout.cell_summary("screen", "baseline", "x1", "code", 4), "deployment label 'x1'"),
    (lambda: layout.cell_summary("screen", "baseline", 1, "code", "four"), "key 'concurrency' is 'four'"),
    (lambda: layout.cell_summary("screen", "base/line", 1, "code", 4), "key 'arm' is 'base/line'"),
    (lambda: layout.gate("Screen", "baseline"), "key 'phase' is 'Screen'"),
    (lambda: layout.build("gate", phase="screen"), "missing key(s) arm"),
])
def test_keys_that_cannot_make_a_path_are_refused(call, what):
    with pytest.raises(LayoutError) as exc:
        call()
    assert what in str(exc.value)



def test_the_rules_take_their_result_paths_from_the_layout():
    """No rule file spells a results path: common.smk builds every pattern with specstudy.core.layout (the
    extension phases' rules too: rules/extensions.smk)."""
    common = (ROOT / "rules/common.smk").read_text()
    assert "from specstudy.core import layout" in common
    offenders = []
    for smk in sorted((ROOT / "rules").glob("*.smk")):
        if smk.name == "common.smk":
            continue
        for n, line in enumerate(smk.read_text().splitlines(), 1):
            if re.search(r"rep\{|/c\{|\{rep\}|\{drift\}|\"results/", line) and not line.lstrip().startswith("#"):
                offenders.append(f"{smk.name}:{n}: {line.strip()}")
    assert not offenders, "result paths spelt in rule files (build them with specstudy.core.layout in common.smk):\n" \
        + "\n".join(offenders)
    # common.smk itself spells no cell or deployment path by hand
    code = [ln for ln in common.splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in code if re.search(r"rep\{|/c\{", ln)]


def test_globs_and_messages_come_from_the_templates():
    assert layout.glob_pattern("cell") == "results/*/*/*/*/c*/summary.json"
    assert layout.glob_pattern("deployment", "", phase="screen") == "screen/*/*/deployment.json"
    assert (layout.glob_pattern("attempt_cell_dir", "r", phase="confirm", arm="baseline", rep=2, workload="code",
                                concurrency=4) == "r/confirm/baseline/rep2/attempts/*/code/c4")
    with pytest.raises(LayoutError, match="unknown key"):
        layout.glob_pattern("gate", phase="screen", rep="rep1")
    assert layout.readable("cell") == "results/<phase>/<arm>/<rep>/<workload>/c<concurrency>/summary.json"
    assert layout.readable("deployment", None) == "<root>/<phase>/<arm>/<rep>/deployment.json"
    assert layout.phase_file("sampling", "gates") == "results/sampling/gates"
    assert layout.confirm_rounds_dir("/x") == "/x/confirm/rounds"


# ---------------------------------------------------------------------------------------------
# Modules whose paths now come from the layout
# ---------------------------------------------------------------------------------------------
def _confirm_summary(tmp_path, folder_arm, arm, rep="rep2", workload="code", concurrency=4, rep_label=True):
    """A real cell summary of ``arm`` written into ``folder_arm``'s folder; returns its path."""
    from test_workflow_dag import fake_cell_summary

    s = fake_cell_summary("confirm", arm, rep, workload, concurrency, tpot_p50_ms=10.0, output_tokens_per_second=100.0)
    if not rep_label:
        s["keys"].pop("rep_label")
    path = Path(layout.cell_summary("confirm", folder_arm, rep, workload, concurrency, root=tmp_path / "results"))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(s))
    return str(path)


@pytest.mark.parametrize("rep_label", [True, False])
def test_a_checkpoint_row_takes_the_keys_written_in_the_summary(tmp_path, rep_label):
    from specstudy.analysis.checkpoint import _round_row

    row = _round_row(_confirm_summary(tmp_path, "ngram-k2", "ngram-k2", rep_label=rep_label), 3)
    assert (row["phase"], row["arm"], row["rep"], row["workload"], row["concurrency"]) == ("confirm", "ngram-k2", 2,
                                                                                          "code", 4)


def test_a_checkpoint_refuses_a_summary_whose_keys_name_another_place(tmp_path):
    from specstudy.analysis.checkpoint import _round_row
    from specstudy.core.integrity import IntegrityError

    path = _confirm_summary(tmp_path, "ngram-k2", "draft-k2-tp1")  # draft-k2-tp1's summary in ngram-k2's folder
    with pytest.raises(IntegrityError) as exc:
        _round_row(path, 3)
    assert str(exc.value).startswith(f"{path}: this summary belongs elsewhere: keys.arm is 'draft-k2-tp1', the path "
                                     "says 'ngram-k2'")


def test_a_checkpoint_refuses_other_paths_and_later_rounds(tmp_path):
    from specstudy.analysis.checkpoint import _round_row
    from specstudy.inference.decision import DecisionRuleError

    with pytest.raises(DecisionRuleError, match="round 2 is after the checkpoint's round 1"):
        _round_row(_confirm_summary(tmp_path, "ngram-k2", "ngram-k2"), 1)
    for bad in ("results/screen/ngram-k2/rep1/code/c4/summary.json", "results/confirm/ngram-k2/drift1/code/c4/summary.json",
                "results/confirm/ngram-k2/rep1/code/c4x/summary.json"):
        with pytest.raises(DecisionRuleError, match=re.escape(f"{bad}: not a confirmation cell summary (expected "
                                                              "results/confirm/<arm>/<rep>/")):
            _round_row(bad, 3)


def test_attempt_copies_are_found_through_the_layout(tmp_path):
    from specstudy.analysis.check_results import attempt_copy
    from specstudy.core.atomic import sha256_file
    from specstudy.core.integrity import sealed_copies

    dep = layout.Deployment("screen", "baseline", "rep1")
    att = tmp_path / layout.attempt_dir("screen", "baseline", "rep1", "d-1")
    (att / layout.cell_rel("code", 4)).mkdir(parents=True)
    copy = att / layout.cell_rel("code", 4) / layout.CELL_SUMMARY
    copy.write_text('{"integrity": {"sha256": "x"}}')
    (att / layout.ATTEMPT_RECORD).write_text("{}")
    cell = dep.cell("code", 4).summary
    assert attempt_copy(tmp_path, cell, sha256_file(copy)) == copy
    assert attempt_copy(tmp_path, dep.record, sha256_file(att / layout.ATTEMPT_RECORD)) == att / layout.ATTEMPT_RECORD
    assert attempt_copy(tmp_path, "elsewhere/screen/baseline/rep1/code/c4/summary.json", sha256_file(copy)) is None
    assert sealed_copies(tmp_path / cell) == [copy]
    assert sealed_copies(tmp_path / "code/c4/summary.json") == []  # no cell summary: no attempt copies


def test_rerun_names_cells_by_the_layout(tmp_path):
    from specstudy.core.errors import UserError
    from specstudy.study.rerun import check_targets

    with pytest.raises(UserError, match=re.escape("not a cell path (a cell is results/<phase>/<arm>/<rep>/<workload>/"
                                                  "c<concurrency>/summary.json)")):
        check_targets(["results/screen/baseline/repX/code/c1/summary.json"], tmp_path)
    plan = tmp_path / layout.plan("screen")
    plan.parent.mkdir(parents=True)
    plan.write_text('{"deployments": [{"arm": "baseline", "rep": "rep1", "cells": [{"workload": "code", "concurrency": 1}]}]}')
    with pytest.raises(UserError, match=re.escape("'ngram-k2' is not an arm of results/plan/screen.json (its arms: baseline)")):
        check_targets(["results/screen/ngram-k2/rep1/code/c1/summary.json"], tmp_path)
    check_targets([layout.cell_summary("screen", "baseline", 1, "code", 1)], tmp_path)


def test_a_failure_record_is_written_where_the_layout_says(tmp_path):
    from specstudy.deployment.records import write_failure_record

    path = write_failure_record(tmp_path, phase="confirm", arm="ngram-k2", rep=2, deployment_id="d-7", stage="launch",
                                reason="exited", log_path=None)
    assert path.parent == Path(layout.failure_dir("confirm", "ngram-k2", 2, "d-7", root=tmp_path))
    assert layout.parse("failure", path.parent)["rep"] == "rep2"
