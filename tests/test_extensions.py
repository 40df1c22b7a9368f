"""The extension phases' framework: plans, deployment specs, requests, config checks and the DAG (issue #20).

The phases' own measurements and analyses have their own test files (test_sampling*, test_ignore_eos,
test_memory, test_profiling); the real deployments of each phase run in test_extensions_real.py.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from specstudy.core import schemas  # noqa: E402
from specstudy.job.run import WARMUP_SEED_OFFSET, _request_specs  # noqa: E402
from specstudy.job.spec import deployment_spec  # noqa: E402
from specstudy.measure.loadgen import _payload  # noqa: E402
from specstudy.study import phase_decl, plan  # noqa: E402
from specstudy.study.config import ConfigError, load_config  # noqa: E402
from specstudy.study.prereg import load_prereg  # noqa: E402

ARMS = ["baseline", "draft-k2-tp1", "ngram-k4"]


@pytest.fixture(scope="module")
def cfg():
    c = load_config(ROOT / "config" / "config.yaml")
    c["arms"]["num_speculative_tokens"] = [2, 4]  # ARMS' depths (the shipped study screens depth 3 only)
    return c


@pytest.fixture(scope="module")
def prereg(cfg):
    return load_prereg(cfg)


def test_every_phase_plans_the_declared_arms_and_design(cfg, prereg):
    sampling = plan.make_plan(cfg, "sampling", ARMS, prereg)
    schemas.validate(sampling, "plan", "<sampling plan>")
    deps = [(d["arm"], d["rep"]) for d in sampling["deployments"]]
    # every arm once, the baseline twice: the baseline-vs-baseline control of the sampling judge
    assert sorted(deps) == [("baseline", "rep1"), ("baseline", "rep2"), ("draft-k2-tp1", "rep1"), ("ngram-k4", "rep1")]
    s = cfg["extensions"]["sampling"]
    for d in sampling["deployments"]:
        assert d["kind"] == "repeat"
        assert sorted((c["workload"], c["concurrency"]) for c in d["cells"]) == sorted(
            (w, c) for w in s["workloads"] for c in s["concurrency"])
    design = sampling["design"]
    assert design["cell_settings"]["temperature"] == prereg["sampling"]["temperature"] == 0.8
    assert design["cell_settings"]["seed_policy"] == "per_request"
    seeds = prereg["sampling"]["seeds"]
    assert design["capture"]["seeds"] == [seeds["base"] + i for i in range(seeds["per_prompt"])]

    mech = plan.make_plan(cfg, "ignore_eos", ARMS, prereg)
    assert [d["arm"] for d in mech["deployments"]].count("baseline") == 1
    assert mech["design"]["cell_settings"] == {"ignore_eos": True,
                                               "output_tokens": cfg["extensions"]["ignore_eos"]["output_tokens"]}

    memory = plan.make_plan(cfg, "memory", ARMS, prereg)
    schemas.validate(memory, "plan", "<memory plan>")
    assert {d["kind"] for d in memory["deployments"]} == {"memory"}
    assert all(d["cells"] == [] for d in memory["deployments"])
    assert memory["design"]["sweep"]["concurrency"] == sorted(cfg["extensions"]["memory"]["concurrency"])

    profile = plan.make_plan(cfg, "profile", ARMS, prereg)
    p = cfg["extensions"]["profile"]
    assert [d["cells"] for d in profile["deployments"]] == [[{"workload": p["workload"], "concurrency": p["concurrency"]}]] * 3
    assert {d["kind"] for d in profile["deployments"]} == {"profile"}


def test_the_core_plans_are_unchanged_by_the_extensions(cfg, prereg):
    """Adding the extension machinery must not move a single screening or confirmation deployment."""
    bare = copy.deepcopy(cfg)
    bare.pop("extensions")
    for phase, arms in (("screen", None), ("confirm", ARMS)):
        assert plan.make_plan(cfg, phase, arms, prereg) == plan.make_plan(bare, phase, arms, prereg)


def test_the_deployment_spec_carries_the_phase_settings(cfg, prereg):
    p = plan.make_plan(cfg, "sampling", ARMS, prereg)
    spec = deployment_spec(p, "sampling/ngram-k4/rep1", cfg)
    assert spec["cell_settings"]["temperature"] == 0.8 and spec["cell_settings"]["seed_policy"] == "per_request"
    assert spec["cell_settings"]["requests"] == cfg["cells"]["requests"]  # everything else from the study's cells
    cap = spec["sampled_capture"]
    assert cap["workload"] == "open_chat" and cap["corpus_dir"].startswith("results/corpora/")
    assert "memory" not in spec and "profile" not in spec

    m = plan.make_plan(cfg, "memory", ARMS, prereg)
    spec = deployment_spec(m, "memory/baseline/rep1", cfg)
    assert spec["kind"] == "memory" and spec["cells"] == []
    server = spec["engine"]["server"]
    assert server["extra_args"][-2:] == ["--kv-cache-memory-bytes", "16777216"]
    # a null in the phase's env removes the study's variable (it would override the byte budget)
    assert "VLLM_CPU_KVCACHE_SPACE" not in server["env"] and server["env"]["OMP_NUM_THREADS"] == "1"
    assert "--kv-cache-memory-bytes" not in cfg["engine"]["server"]["extra_args"]  # the study's engine untouched
    assert cfg["engine"]["server"]["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"

    screen = deployment_spec(plan.make_plan(cfg, "screen", None, prereg), "screen/baseline/rep1", cfg)
    assert screen["cell_settings"] == cfg["cells"] and "sampled_capture" not in screen


def test_per_request_seeds_are_the_same_in_every_arm_and_fixed_lengths_ignore_eos():
    prompts = [{"prompt_id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 10 + i}
               for i in range(3)]
    settings = {"seed_policy": "per_request", "seed": 1000, "top_p": 0.95, "temperature": 0.8}
    a = _request_specs(prompts, 5, "code", settings=settings)
    b = _request_specs(prompts, 5, "code", settings=settings)  # another arm: the same request list
    assert [r.extra_body["seed"] for r in a] == [1000, 1001, 1002, 1003, 1004] == [r.extra_body["seed"] for r in b]
    assert [r.max_tokens for r in a] == [10, 11, 12, 10, 11]
    warm = _request_specs(prompts, 2, "code", settings=settings, seed_offset=WARMUP_SEED_OFFSET)
    assert {r.extra_body["seed"] for r in warm}.isdisjoint(r.extra_body["seed"] for r in a)
    body = json.loads(_payload("m", a[3], 0.8, 1))
    assert body["seed"] == 1003 and body["top_p"] == 0.95 and body["temperature"] == 0.8  # the request's own seed wins

    fixed = _request_specs(prompts, 3, "code", settings={"ignore_eos": True, "output_tokens": 48})
    assert [r.max_tokens for r in fixed] == [48, 48, 48]
    assert all(r.extra_body == {"ignore_eos": True} for r in fixed)
    plain = _request_specs(prompts, 2, "code", settings={"temperature": 0.0, "seed": 1})
    assert all(r.extra_body == {} for r in plain)  # the core phases' requests are unchanged


def test_bad_extension_config_is_named(cfg, prereg):
    bad = copy.deepcopy(cfg)
    bad["extensions"]["ignore_eos"]["workloads"] = ["chat"]
    with pytest.raises(ConfigError, match=r"extensions.ignore_eos.*'chat' is not under corpora.workloads"):
        phase_decl.check(bad, prereg, "cfg.yaml")
    with pytest.raises(ConfigError, match=r"cfg.yaml: field 'extensions.sampling' needs the pre-registration's 'sampling'"):
        phase_decl.check(cfg, {k: v for k, v in prereg.items() if k != "sampling"}, "cfg.yaml")
    bad = copy.deepcopy(cfg)
    bad["extensions"]["report"] = ["profile"]
    del bad["extensions"]["profile"]
    with pytest.raises(ConfigError, match=r"'extensions.report' names 'profile'.*not declared"):
        phase_decl.check(bad, prereg, "cfg.yaml")
    bad = copy.deepcopy(cfg)
    del bad["extensions"]["memory"]
    with pytest.raises(ConfigError, match=r"field 'extensions.memory' is missing.*snakemake memory"):
        plan.make_plan(bad, "memory", ARMS, prereg)
    with pytest.raises(ConfigError, match="needs the confirmation plan"):
        phase_decl.arm_names(cfg, None)
    assert phase_decl.arm_names(dict(cfg, extensions={"arms": ["ngram-k4"]})) == ["baseline", "ngram-k4"]


# ---------------------------------------------------------------------------------------------- the DAG
from test_workflow_dag import fake_screening, job_counts, sm, workflow_copy  # noqa: E402


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    return workflow_copy(tmp_path)


def test_each_phase_is_an_opt_in_target_planned_from_the_confirmation_arms(workdir):
    fake_screening(workdir)
    sm(workdir, "results/selection/selection.json")
    sm(workdir, "results/plan/confirm.json")
    # nothing of an extension phase is in the core study's DAG
    out = sm(workdir, "-n", "-p", "all").stdout
    assert not re.search(r"results/(sampling|ignore_eos|memory|profile)/", out)
    # before its plan exists a phase's DAG ends at its plan checkpoint
    counts = job_counts(sm(workdir, "-n", "sampling").stdout)
    assert counts.get("plan_extension") == 1 and "deploy_sampling" not in counts, counts
    proc = sm(workdir, "-p", "results/plan/sampling.json", "results/plan/ignore_eos.json", "results/plan/memory.json",
              "results/plan/profile.json")
    assert "--arms-from results/plan/confirm.json" in proc.stdout + proc.stderr
    confirm_arms = json.loads((workdir / "results/plan/confirm.json").read_text())["arms"]
    names = [a["name"] for a in confirm_arms]
    sampling = json.loads((workdir / "results/plan/sampling.json").read_text())
    assert sorted({d["arm"] for d in sampling["deployments"]}) == sorted(names)

    out = sm(workdir, "-n", "-p", "sampling").stdout
    counts = job_counts(out)
    assert counts["deploy_sampling"] == len(names) + 1             # + the baseline's second deployment
    assert counts["sampling_summary"] == 1                         # which also judges every speculative arm
    summary_job = out[out.index("rule sampling_summary"):].split("\n\n")[0]
    # its judges are its own output; its inputs wait for the confirmation's checkpoints here (the greedy
    # figures it shows beside the sampled ones come from the finished confirmation)
    assert "results/sampling/gates" in summary_job and "input: <TBD>" in summary_job
    for target, deploy in (("ignore_eos", "deploy_ignore_eos"), ("memory", "deploy_memory"), ("profile", "deploy_profile")):
        counts = job_counts(sm(workdir, "-n", target).stdout)
        assert counts[deploy] == len(names), (target, counts)
    # one deployment of a phase is re-run by asking for its record
    out = sm(workdir, "-n", "-p", "results/memory/ngram-k2/rep1/deployment.json").stdout
    assert job_counts(out) == {"deploy_memory": 1}
    assert "--deployment memory/ngram-k2/rep1" in out
    # an arm outside the phase's plan is refused, naming the plan
    proc = sm(workdir, "-n", "results/profile/draft-k4-tp1/rep1/deployment.json", check=False)
    assert proc.returncode != 0 and "not in the profile plan" in proc.stdout + proc.stderr


def test_a_study_without_the_phase_says_how_to_declare_it(workdir):
    cfg = yaml.safe_load((workdir / "config/config.yaml").read_text())
    del cfg["extensions"]["memory"]
    (workdir / "config/config.yaml").write_text(yaml.safe_dump(cfg))
    proc = sm(workdir, "-n", "memory", check=False)
    assert proc.returncode != 0
    assert "declares no 'extensions.memory' section" in proc.stdout + proc.stderr


def test_a_summary_names_every_planned_deployment_that_produced_nothing(tmp_path, cfg, prereg):
    """The phase summary reads what ran from the plan and the records: a missing record, a failed deployment and
    an ok one whose artifact is gone are each listed with why, never dropped silently."""
    from specstudy.core import atomic
    from specstudy.phases import summary as phase_summary

    p = plan.make_plan(cfg, "profile", ARMS, prereg)
    atomic.write_json(tmp_path / "plan" / "profile.json", p)

    def record(arm, status, extension=None, failure=None):
        atomic.write_json(tmp_path / "profile" / arm / "rep1" / "deployment.json",
                          {"schema": "specstudy.deployment/1", "deployment_id": f"dep-{arm}", "phase": "profile",
                           "arm": {"name": arm}, "rep": 1, "status": status, "failure": failure, "command": None,
                           "times": {}, "extension": extension})

    record("baseline", "ok", {"profile": str(tmp_path / "gone.json")})
    record("draft-k2-tp1", "failed", None, {"stage": "readiness", "reason": "exited", "message": "boom"})
    files = phase_summary.planned_files(tmp_path / "plan" / "profile.json", tmp_path)
    failed = {f["arm"]: f["reason"] for f in phase_summary.failed_deployments(files, "profile")}
    assert failed == {"baseline": "the deployment record names no profile (or the file is gone)",
                      "draft-k2-tp1": "deployment failed at readiness: exited",
                      "ngram-k4": f"no deployment record ({tmp_path}/profile/ngram-k4/rep1/deployment.json)"}
    with pytest.raises(Exception, match="a plan of phase 'profile', not 'memory'"):
        phase_summary.summarize("memory", tmp_path / "plan" / "profile.json", cfg, prereg, tmp_path, tmp_path / "out")


def test_a_phase_section_joins_the_report_under_extensions(tmp_path):
    """extensions.report: a phase's own section is appended under 'Extensions', one heading level down, and
    its Markdown tables become HTML tables in report.html."""
    from specstudy.report.blocks import render_html, render_markdown
    from specstudy.report.sections.extensions import extension_sections

    section = tmp_path / "section.md"
    section.write_text("## Memory capacity\n\n| arm | L=256 |\n|---|---|\n| baseline | 5 |\n\n### detail\n\ntext <b>x</b>\n")
    blocks: list = []
    extension_sections(blocks, [str(section)])
    md = render_markdown(blocks)
    assert "## Extensions (opt-in phases, kept apart" in md
    assert "### Memory capacity" in md and "#### detail" in md and f"*Source: `{section}`*" in md
    html = render_html(blocks, "t")
    assert "<table>" in html and "<td>baseline</td>" in html and "<h3>Memory capacity</h3>" in html
    assert "<b>x</b>" not in html  # raw HTML in a section is escaped, not passed through
    empty: list = []
    extension_sections(empty, [])
    assert empty == []  # no phase listed: the report is unchanged


# ---------------------------------------------------------------------------------------------- the registry
def test_every_phase_is_declared_once_and_registers_its_behaviour_once():
    """One list of phase names: the declarations; each has its behaviour, and the schemas name the same phases."""
    import json as _json

    from specstudy.phases import cli as phase_cli
    from specstudy.phases import registry

    assert registry.names() == phase_decl.PHASES == plan.PHASES
    assert phase_decl.CORE_PHASES == ("screen", "confirm")
    for name in phase_decl.EXTENSION_PHASES:
        behaviour = registry.get(name)
        assert behaviour.name == name and type(behaviour) is not registry.Phase, name  # its own module registered it
        assert type(behaviour).summarize is not registry.Phase.summarize, name
    assert type(registry.get("capacity")) is registry.Phase  # a deployment of no declared phase: nothing extra
    plan_schema = _json.loads((ROOT / "config/schemas/plan.schema.json").read_text())
    assert tuple(plan_schema["properties"]["phase"]["enum"]) == phase_decl.PHASES
    kinds = set(plan_schema["properties"]["deployments"]["items"]["properties"]["kind"]["enum"])
    assert {d.kind for d in phase_decl.DECLS.values()} <= kinds
    cfg_schema = _json.loads((ROOT / "config/schemas/config.schema.json").read_text())
    report = cfg_schema["properties"]["extensions"]["properties"]["report"]["items"]["enum"]
    assert tuple(report) == phase_decl.EXTENSION_PHASES
    # every other phase enum of the schemas (JSON cannot import the declarations): the core phases, or every
    # declared phase plus the deployments of no declared phase (capacity search, the mechanics point)
    def schema(name):
        return _json.loads((ROOT / f"config/schemas/{name}.schema.json").read_text())

    recommend = cfg_schema["properties"]["recommendation"]["properties"]["phase"]["enum"]
    hypothesis = cfg_schema["properties"]["analysis"]["properties"]["hypothesis_phase"]["enum"]
    prereg_hyp = schema("preregistration")["properties"]["hypotheses"]["items"]["properties"]["phase"]["enum"]
    tables = [schema(f"table-{t}")["properties"]["phase"]["enum"] for t in ("cells", "deployments", "gates", "requests")]
    for enum in (recommend, hypothesis, prereg_hyp, *tables):
        assert tuple(enum) == phase_decl.CORE_PHASES
    assert tuple(schema("deployment")["properties"]["phase"]["enum"]) == (*phase_decl.CORE_PHASES, "capacity", "mechanics",
                                                                        *phase_decl.EXTENSION_PHASES)
    # `specstudy phase summary <phase>` offers exactly the opt-in phases
    import argparse

    parser = argparse.ArgumentParser()
    phase_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["phase", "summary", "memory", "--plan", "p", "--config", "c", "--out", "o"])
    assert args.phase == "memory"
    with pytest.raises(SystemExit):
        parser.parse_args(["phase", "summary", "screen", "--plan", "p", "--config", "c", "--out", "o"])


def test_the_memory_summary_joins_the_knees_only_when_declared(tmp_path, cfg, prereg):
    """`extensions.memory.join_capacity` is read by the one summary step (it was ignored by a second CLI)."""
    from specstudy.core import atomic
    from specstudy.phases.summary import PhaseRun

    atomic.write_json(tmp_path / "capacity" / "baseline" / "knee.json", {})
    on = dict(cfg, capacity=dict(cfg.get("capacity") or {}, enabled=True))
    run = PhaseRun(phase="memory", files={"deployments": []}, cells=[], cfg=on, prereg=prereg, prereg_file=None,
                   results=tmp_path, out=tmp_path / "memory")
    assert run.knee("baseline") == str(tmp_path / "capacity" / "baseline" / "knee.json")
    assert run.knee("ngram-k4") is None  # no search for this arm
    off = dict(on, extensions=dict(on["extensions"], memory=dict(on["extensions"]["memory"], join_capacity=False)))
    assert PhaseRun(**dict(vars(run), cfg=off)).knee("baseline") is None
    assert phase_decl.DECLS["memory"].joins(off) == () and phase_decl.DECLS["sampling"].joins(off) == ("natural",)
