# Helpers shared by all rule files. Only functions and constants live here; rules live in their stage files.
import json
import os
import sys
from pathlib import Path

from snakemake.exceptions import IncompleteCheckpointException

sys.path.insert(0, os.path.join(workflow.basedir, "scripts"))

import yaml  # noqa: E402

from specstudy.core import layout  # noqa: E402  (every results path: built here from the one layout)
from specstudy.core import arms as _arms  # noqa: E402
from specstudy.study import plan as _plan  # noqa: E402
from specstudy.study.config import ConfigError, check_config, effective_config_files  # noqa: E402
from specstudy.study.prereg import load_prereg, prereg_path  # noqa: E402
from specstudy.study.prereg_guard import verify_lock as _verify_lock, verify_recorded as _verify_recorded  # noqa: E402
from specstudy.analysis import stale as _stale  # noqa: E402
from specstudy.report import files as _report_files  # noqa: E402

# The config as specstudy's reader parsed it (rules/studyconfig.smk): same merge as Snakemake's, but a
# `1e3` is the number it spells. Messages name the file(s) actually given.
config.clear()
config.update(STUDY_CONFIG)
_CONFIG_SOURCE = " + ".join(STUDY_CONFIG_FILES) or "the study config"
try:
    check_config(config, _CONFIG_SOURCE)
    PREREG = load_prereg(config)
    # The same pre-flight as `specstudy check-config`: the engine's files, the client's CPU pinning (when
    # the deployments run on this machine) and the extension arms; a dry run stops here too.
    from specstudy.study.preflight import check_study as _preflight  # noqa: E402

    _preflight(config, _CONFIG_SOURCE, cpus=workflow.local_exec, datasets=workflow.is_main_process)
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None


def verify_datasets():
    """Before the first job of a real run (the Snakefile's onstart; never in a dry run): every dataset's sha256
    against its spec, unless its corpus was already built from that file."""
    from specstudy.study.preflight import dataset_problems

    problems = dataset_problems(config, digests=True, skip_built=layout.ROOT)
    if problems:
        raise WorkflowError(f"{_CONFIG_SOURCE}: the datasets do not match their corpus specs; nothing was submitted:"
                            "\n  - " + "\n  - ".join(problems))

PREREG_FILE = str(prereg_path(config))
_LOCK = Path(layout.prereg_lock())
def _read_result(path):
    """A result file read at DAG time; a corrupt one is a WorkflowError naming the file and the fix."""
    from specstudy.core.atomic import BadFile, read_json

    try:
        return read_json(path)
    except BadFile as exc:
        raise WorkflowError(str(exc)) from None


if _LOCK.exists():
    _locked = _read_result(_LOCK).get("preregistration")
    if _locked and os.path.abspath(_locked) != os.path.abspath(PREREG_FILE):
        raise WorkflowError(
            f"results/ belongs to the study pre-registered in {_locked} ({_LOCK}), but this config "
            f"pre-registers {PREREG_FILE}. One study per results/ directory: move results/ away "
            "(or run from another working directory with --directory) before starting this study.")
    # Every rule consumes the pre-registration (plans, deployments, gates, selection, capacity, tables,
    # report): a pre-registration edited after the lock stops the whole workflow, naming what changed.
    try:
        _verify_lock(_LOCK, PREREG_FILE)
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None
# The hash every screening deployment recorded, checked with or without the lock (a deleted lock must not
# let a fresh lock of an edited pre-registration be scheduled).
try:
    _verify_recorded(layout.ROOT, PREREG_FILE)
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None
# Once confirmation has a plan the selection is locked (specstudy.study.selection_lock): an edited selection, or
# screening files whose content changed since it was made, stop every run here, before any job, naming the
# files and the fix (never an InputFunctionException, never a silent new selection). Checked by the main
# Snakemake process only: a job's own parse (a Slurm job) runs what the main process already scheduled.
from specstudy.study import selection_lock as _selection_lock  # noqa: E402

if workflow.is_main_process:
    try:
        _selection_lock.check(".")
    except _selection_lock.LockBroken as exc:
        raise WorkflowError(str(exc)) from None
SELECTION_LOCKED = _selection_lock.locked(".")


def unless_locked(inputs):
    """The selection's inputs, ``ancient`` while the selection is locked: a re-run screening cell never
    re-runs the selection (a changed one stops the next run at parse, above)."""
    def wrapped(wildcards):
        files = inputs(wildcards)
        return [ancient(f) for f in files] if SELECTION_LOCKED else files

    return wrapped


# Nothing is written while the workflow is parsed (a dry run writes nothing). A report or tables built
# from a checkpoint output that is now missing are stale: report_inputs/tables_inputs plan them again
# (so a dry run shows it), and the onstart handler below moves them aside (never deleted) before any
# job runs, so that they are rebuilt, not shown as current (the handler lives in the Snakefile).
STALE_CAPACITY = bool((config.get("capacity") or {}).get("enabled"))


def quarantine_stale_outputs():
    _stale.quarantine_stale(".", log=lambda msg: print(f"specstudy: {msg}", file=sys.stderr), capacity=STALE_CAPACITY)


WORKLOADS = list(config["corpora"]["workloads"])
SCREEN_CONC = list(config["screen"]["concurrency"])
CONFIRM_CONC = list(PREREG["confirmation"]["concurrency"])
CONFIRM_INITIAL = int(PREREG["confirmation"]["repeats"])
CONFIRM_CAP = int(PREREG["confirmation"]["stopping"]["max_repeats"])
# The drift cell is a config fact (plan.drift_cell); every deployment and cell comes from the plan files.
DRIFT_CELL = _plan.drift_cell(config, "screen", PREREG)
GATE_MARGINS = json.dumps(PREREG["gate"]["margins"], sort_keys=True)
CAPACITY = config.get("capacity") or {}
FIXTURES = (config.get("fixture_models") or {}).get("build", False)
FIXTURE_RECORD = layout.models_dir("fixture", "models.json")
FIXTURE_HELDOUT = layout.models_dir("fixture", "heldout.json")
# The scale model (issue 27): the fixture pair widened into results/models/scale/{target,draft}.
SCALE = (config.get("scale_model") or {}).get("build", False)
SCALE_RECORD = layout.models_dir("scale", "scale.json")

wildcard_constraints:
    phase="screen|confirm",
    arm=_plan.ARM_PATTERN,
    rep=layout.REPEAT_PATTERN,
    drift=layout.DRIFT_PATTERN,
    workload=layout.WORKLOAD_PATTERN,
    conc=layout.CONC_PATTERN,
    corpus=layout.CORPUS_PATTERN,
    version=layout.VERSION_PATTERN,


# The effective config (Snakefile default merged with --configfile/--config), content-addressed; written
# by effective_config (rules/plan.smk), never at parse time.
# CONFIG_FILE: the whole config. DEPLOYMENT_CONFIG_FILE: the sections a deployment job reads
# (specstudy.study.config.DEPLOYMENT_SECTIONS).
CONFIG_TEXTS = effective_config_files(config)
CONFIG_FILE, DEPLOYMENT_CONFIG_FILE = CONFIG_TEXTS


def write_config_file(path):
    from specstudy.core.atomic import write_text

    write_text(path, CONFIG_TEXTS[path])


# ------------------------------------------------------------------ corpora

def _corpus_id(spec_path, field):
    """(name, version) of a corpus spec, validated with the config: a broken spec fails the dry run."""
    from specstudy.inputs.corpus import CorpusError, load_spec

    try:
        spec = load_spec(spec_path)
    except CorpusError as exc:
        raise WorkflowError(f"{_CONFIG_SOURCE}: field '{field}': {exc}") from None
    return spec["name"], str(spec["version"])


CORPUS_SPECS = {w: s for w, s in config["corpora"]["workloads"].items()}
CORPUS_SPECS["smoke"] = config["corpora"]["smoke"]
_SPEC_FIELDS = {w: ("corpora.smoke" if w == "smoke" else f"corpora.workloads.{w}") for w in CORPUS_SPECS}
CORPUS_IDS = {w: _corpus_id(s, _SPEC_FIELDS[w]) for w, s in CORPUS_SPECS.items()}
CORPUS_DIRS = {w: layout.corpus_dir(*cid) for w, cid in CORPUS_IDS.items()}
SPEC_BY_CORPUS = {CORPUS_IDS[w]: s for w, s in CORPUS_SPECS.items()}


def corpus_spec_for(wildcards):
    return SPEC_BY_CORPUS[(wildcards.corpus, wildcards.version)]


def corpus_json(workload):
    return layout.corpus_json(*CORPUS_IDS[workload])


def all_corpus_json():
    return [corpus_json(w) for w in CORPUS_DIRS]


def workload_corpus_json():
    return [corpus_json(w) for w in WORKLOADS]


def tokenizer_dir():
    target = config["engine"]["target"]
    return target.get("tokenizer") or target["path"]


def methods_record_input():
    """The engine's recorded probe of the further methods (engine.methods_record; each engine build's in a study
    of several): a re-probe re-plans."""
    from specstudy.study.config import engine_builds

    records = [e.get("methods_record") for e in engine_builds(config).values()]
    return list(dict.fromkeys(r for r in records if r))


def model_inputs():
    return [FIXTURE_RECORD] if FIXTURES else []


def served_model_inputs():
    """What a deployment serves: the fixture pair, and the scale model widened from it when configured
    (not an input of the corpora, which the scale model's function check reads)."""
    return model_inputs() + ([SCALE_RECORD] if SCALE else [])


# The scale model's rule parameters (rule scale_models, rules/models.smk).
def fixture_draft_training_arg():
    """``--draft-training '<json>'`` for rule fixture_models when fixture_models.draft_training is set, else nothing."""
    import json as _json

    spec = (config.get("fixture_models") or {}).get("draft_training")
    return "" if spec is None else "--draft-training '{}'".format(_json.dumps(spec, sort_keys=True))


def scale_param(key, default):
    return (config.get("scale_model") or {}).get(key, default)


def scale_shape_arg(role):
    import json as _json

    shape = ((config.get("scale_model") or {}).get(role) or {}).get("shape")
    return "" if shape is None else "--{}-shape '{}'".format(role, shape if isinstance(shape, str) else _json.dumps(shape, sort_keys=True))


def scale_smoke_prompts():
    """The smoke corpus's bundled source rows (id + messages): the function check's prompts, all of them."""
    from specstudy.inputs.scale_model import smoke_source

    return smoke_source(config["corpora"]["smoke"])


def corpus_build_inputs(wildcards):
    return {"spec": corpus_spec_for(wildcards), "models": model_inputs()}


# ------------------------------------------------------------------ plans and deployments

def phase_conc(phase):
    if phase in EXT_PHASES:  # as the phase's declaration expands its cells
        return _ext.DECLS[phase].cell_concurrency(config)
    return SCREEN_CONC if phase == "screen" else CONFIRM_CONC


def phase_workloads(phase):
    if phase in EXT_PHASES:
        return _ext.DECLS[phase].cell_workloads(config)
    return WORKLOADS


cell_path = layout.cell_summary
record_path = layout.deployment_record
#: the pre-registration lock, and a phase's plan
LOCK_FILE = layout.prereg_lock()
plan_file = layout.plan


class DeploymentPaths:
    """The path patterns of one kind of deployment job (wildcards {arm} and ``rep``: {rep} or {drift}), all
    from specstudy.core.layout: its record, folder, log, benchmark, the job's --deployment reference and plan."""

    def __init__(self, phase, rep="{rep}", arm="{arm}"):
        self.record = layout.deployment_record(phase, arm, rep)
        self.dir = layout.deployment_dir(phase, arm, rep)
        self.log = layout.deployment_log(phase, arm, rep)
        self.benchmark = layout.deployment_benchmark(phase, arm, rep)
        self.ref = layout.deployment_dir(phase, arm, rep, root="")  # --deployment <phase>/<arm>/<rep>
        self.plan = layout.plan(phase)


def results_root_of(kind, name, under=lambda root: root, files="output"):
    """A params function: ``under(root)`` of the results root of a job's file ``name`` (its output, or input), read
    back through the layout, so that a rule names no root or prefix of its own."""
    def root(wildcards, input, output):
        return under(layout.parse(kind, getattr(input if files == "input" else output, name))["root"])

    return root


#: the deployment jobs' path patterns (rules/deploy.smk)
SCREEN = DeploymentPaths("screen")
CONFIRM = DeploymentPaths("confirm")
DRIFT = DeploymentPaths("{phase}", rep="{drift}")


def deployment_outputs(phase):
    pattern = layout.cell_summary(phase, "{{arm}}", "{{rep}}", "{workload}", "{conc}")
    return expand(pattern, workload=phase_workloads(phase), conc=phase_conc(phase))


def selection_file(wildcards=None):
    return checkpoints.select.get().output.selection


_PLANS = {}


def _read_plan(path):
    """A plan file as the DAG reads it: the typed record (records.read_plan; a bad file names itself, the
    field and the fix) as plain data, cached by mtime (input functions ask for it many times)."""
    import msgspec
    from specstudy.core.records import RecordError, read_plan

    key = (path, os.stat(path).st_mtime_ns)
    if key not in _PLANS:
        try:
            _PLANS[key] = msgspec.to_builtins(read_plan(path))
        except RecordError as exc:
            raise WorkflowError(str(exc)) from None
    return _PLANS[key]


def screen_plan():
    """The screening plan: results/plan/screen.json, the output of checkpoint plan_screen (the DAG of
    screening exists once that file does; asking for it makes Snakemake run the checkpoint first)."""
    return _read_plan(checkpoints.plan_screen.get().output.plan)


def verified_selection_file(wildcards=None, plan_file=None):
    """The selection checkpoint's output, verified when the DAG is built (its digest; with ``plan_file``, also
    the sha256 that plan recorded): a corrupt or edited selection stops the dry run, naming the file."""
    from specstudy.analysis.select import SelectionError, verify_selection

    path = selection_file()
    try:
        verify_selection(path, plan_file)
    except SelectionError as exc:
        raise WorkflowError(str(exc)) from None
    return path


def confirm_plan():
    """The confirmation plan: results/plan/confirm.json, the output of checkpoint plan_confirm, which is
    built from the selection checkpoint's output; the selection is verified against the plan."""
    plan_file = checkpoints.plan_confirm.get().output.plan
    verified_selection_file(plan_file=plan_file)
    return _read_plan(plan_file)


def plan_for(phase):
    if phase in EXT_PHASES:
        return ext_plan(phase)
    return screen_plan() if phase == "screen" else confirm_plan()


# ------------------------------------------------------------------ adaptive confirmation rounds

def round_file(n):
    return layout.confirm_round(n)


def round_state(n):
    """The checkpoint of round n (asking for it makes Snakemake run that checkpoint first)."""
    with open(checkpoints.confirm_round.get(n=str(n)).output.state) as fh:
        return json.load(fh)


def confirm_rounds_run():
    """Rounds that run: the initial ones, then one more each time the previous round's checkpoint asks."""
    n = CONFIRM_INITIAL
    while n < CONFIRM_CAP and round_state(n)["continue"]:
        n += 1
    return n


def require_round(r, what):
    """Refuse work of adaptive round r unless the checkpoint of round r-1 asked for it."""
    if r <= CONFIRM_INITIAL:
        return
    if r > CONFIRM_CAP:
        raise WorkflowError(f"{what}: round {r} is beyond the pre-registered cap confirmation.stopping.max_repeats = "
                            f"{CONFIRM_CAP} ({PREREG_FILE})")
    require_round(r - 1, what)
    state = round_state(r - 1)
    if not state["continue"]:
        raise WorkflowError(f"{what}: round {r} was not asked for: the checkpoint {round_file(r - 1)} stopped "
                            f"confirmation ({state['why']}). Rounds beyond confirmation.repeats = {CONFIRM_INITIAL} "
                            "run only when the checkpoint of the round before asks for them.")


def confirm_plan_active():
    """The confirmation plan restricted to the rounds the checkpoints asked for."""
    p = confirm_plan()
    n = confirm_rounds_run()
    return dict(p, deployments=[d for d in p["deployments"] if d["kind"] != "repeat" or d["round"] <= n])


def confirm_round_inputs(wildcards):
    n = int(wildcards.n)
    if n < CONFIRM_INITIAL:
        raise WorkflowError(f"{round_file(n)}: the first checkpoint is after round confirmation.repeats = "
                            f"{CONFIRM_INITIAL} ({PREREG_FILE})")
    require_round(n, round_file(n))
    p = confirm_plan()
    reps = [d for d in p["deployments"] if d["kind"] == "repeat" and d["round"] <= n]
    arms = spec_arms(p)
    inputs = {
        "summaries": [cell_path("confirm", d["arm"], d["rep"], c["workload"], c["concurrency"])
                      for d in reps for c in d["cells"]],
        "records": [record_path("confirm", d["arm"], d["rep"]) for d in reps],
        # Screening gates (confirmation gates need the final rounds): a failed gate takes a candidate out of contention.
        "gates": [layout.gate("screen", a) for a in arms if a in spec_arms(screen_plan())],
        "plan": layout.plan("confirm"),
        "lock": ancient(LOCK_FILE),
    }
    if n > CONFIRM_INITIAL:
        inputs["previous"] = round_file(n - 1)
    return inputs


def confirm_round_files(wildcards=None):
    return [round_file(k) for k in range(CONFIRM_INITIAL, confirm_rounds_run() + 1)]


def planned(phase, arm, rep):
    """The plan entry of a deployment; refuses deployments the plan (or the selection) does not contain."""
    p = plan_for(phase)
    try:
        return _plan.find_deployment(p, arm, rep)
    except KeyError:
        if phase == "confirm":
            raise WorkflowError(
                f"{layout.deployment_dir('confirm', arm, rep)}: '{arm}' was not selected for confirmation "
                f"(selection: {selection_file()} picks {sorted({d['arm'] for d in p['deployments']})}). "
                "Confirmation runs only what the pre-registered selection picked.") from None
        raise WorkflowError(f"{layout.deployment_dir(phase, arm, rep)}: not in the {phase} plan "
                            f"({len(p['deployments'])} deployments; skipped arms: {p['skipped']})") from None


def deployment_inputs(wildcards, phase=None):
    phase = phase or wildcards.phase
    rep = getattr(wildcards, "rep", None) or wildcards.drift
    dep = planned(phase, wildcards.arm, rep)
    # The job reads its spec from the plan (--deployment <phase>/<arm>/<rep>) and the effective config.
    inputs = {"corpora": all_corpus_json(), "models": served_model_inputs(),
              "plan": layout.plan(phase), "config": ancient(DEPLOYMENT_CONFIG_FILE),
              "lock": ancient(LOCK_FILE)}
    if phase == "confirm":
        inputs["selection"] = ancient(selection_file())
        if dep["kind"] == "repeat" and dep["round"] > CONFIRM_INITIAL:
            require_round(dep["round"], layout.deployment_dir("confirm", wildcards.arm, rep))
            inputs["round"] = ancient(round_file(dep["round"] - 1))
    # The phase's first deployment goes alone: a configuration fault (image, EDF, model path) stops the study
    # there (its job exits non-zero, docs/slurm.md), not once per node. After it, as many deployments run at
    # once as the profile allows (--jobs, resources: deployments), started in plan order (deployment_priority).
    first = _first_deployment(plan_for(phase))
    if (first["arm"], first["rep"]) != (dep["arm"], dep["rep"]):
        inputs["first"] = ancient(record_path(phase, first["arm"], first["rep"]))
    return inputs


def _first_deployment(p):
    return min(p["deployments"], key=lambda d: d["order"])


def screen_deployment_inputs(wildcards):
    return deployment_inputs(wildcards, "screen")


def confirm_deployment_inputs(wildcards):
    return deployment_inputs(wildcards, "confirm")


def drift_outputs():
    return layout.cell_summary("{phase}", "{arm}", "{drift}", DRIFT_CELL["workload"], DRIFT_CELL["concurrency"])


def deployment_priority(phase=None, base=None):
    """Snakemake priority of a deployment job: the phase's base (screening first), plus a fraction that falls
    with the deployment's place in the plan, so that whatever the parallelism, ready deployments start in the
    plan's seeded order (randomized blocks, drift baselines last in their block)."""

    def priority(wildcards):
        ph = phase or wildcards.phase
        start = base if base is not None else (10 if ph == "screen" else 5)
        rep = getattr(wildcards, "rep", None) or wildcards.drift
        try:
            p = plan_for(ph)
        except IncompleteCheckpointException:  # a dry run before the plan exists: the job is not scheduled yet
            return start
        n = len(p["deployments"])
        return start + (n - planned(ph, wildcards.arm, rep)["order"]) / (n + 1)

    return priority


# ------------------------------------------------------------------ targets

def _cells_of(p):
    out = []
    for dep in p["deployments"]:
        for c in dep["cells"]:
            out.append(cell_path(p["phase"], dep["arm"], dep["rep"], c["workload"], c["concurrency"]))
    return out


def _records_of(p):
    return [record_path(p["phase"], d["arm"], d["rep"]) for d in p["deployments"]]


def screen_cells():
    return _cells_of(screen_plan())


def screen_records():
    return _records_of(screen_plan())


def screen_repeat_cells(wildcards=None):
    return [c for d in screen_plan()["deployments"] if d["kind"] == "repeat"
            for c in [cell_path("screen", d["arm"], d["rep"], x["workload"], x["concurrency"]) for x in d["cells"]]]


def screen_repeat_records(wildcards=None):
    return [record_path("screen", d["arm"], d["rep"]) for d in screen_plan()["deployments"] if d["kind"] == "repeat"]


def spec_arms(p):
    return sorted({d["arm"] for d in p["deployments"] if not _arms.is_baseline(d["arm"])})


def gates_of(phase):
    p = screen_plan() if phase == "screen" else confirm_plan_active()
    return [layout.gate(phase, a) for a in spec_arms(p)]


def screen_targets(wildcards):
    return screen_cells() + screen_records() + gates_of("screen")


def confirm_cells(wildcards=None):
    return _cells_of(confirm_plan_active())


def confirm_records(wildcards=None):
    return _records_of(confirm_plan_active())


def confirm_targets(wildcards):
    return confirm_cells() + confirm_records() + gates_of("confirm") + confirm_round_files()


def gates_of_confirm(wildcards):
    return gates_of("confirm")


def gates_of_screen(wildcards):
    return gates_of("screen")


def gate_inputs(wildcards):
    p = screen_plan() if wildcards.phase == "screen" else confirm_plan_active()
    reps = [d for d in p["deployments"] if d["kind"] == "repeat"]
    own = _arms.baseline_of(wildcards.arm)  # the baseline of the arm's own engine build
    base = [record_path(wildcards.phase, d["arm"], d["rep"]) for d in reps if d["arm"] == own]
    cand = [record_path(wildcards.phase, d["arm"], d["rep"]) for d in reps if d["arm"] == wildcards.arm]
    if not cand:
        raise WorkflowError(f"no {wildcards.phase} deployments of arm {wildcards.arm}")
    # Cross-deployment control: every pair of independently launched baseline deployments (the repeats);
    # the treatment pairs each candidate repeat with the baseline of the same repeat (docs/correctness.md).
    return {"baseline": base, "candidate": cand}


def final_candidate_file(wildcards=None):
    return checkpoints.final_candidate.get().output.decision


def capacity_arms():
    decision = _read_result(final_candidate_file())
    arm = decision.get("arm")
    if not arm:  # no candidate: the baseline alone (of the first engine build, in a study of several)
        return [next(a["name"] for a in _plan.all_arms(config) if _arms.is_baseline(a["name"]))]
    return [_arms.baseline_of(arm), arm]


def capacity_targets(wildcards):
    if not CAPACITY.get("enabled"):
        return []
    return [layout.capacity_knee(a) for a in capacity_arms()]


def capacity_inputs(wildcards):
    if wildcards.arm not in capacity_arms():
        raise WorkflowError(f"{layout.capacity_dir(wildcards.arm)}: capacity runs only for baseline and the final candidate "
                            f"from confirmation ({final_candidate_file()})")
    return {"decision": ancient(final_candidate_file()), "corpora": all_corpus_json(), "models": served_model_inputs(),
            # the arm's spec comes from the confirmation plan, the search from the effective config
            "plan": ancient(layout.plan("confirm")), "config": ancient(DEPLOYMENT_CONFIG_FILE),
            # ancient: re-measuring a confirmation cell rewrites the record but does not redo the capacity search
            "record": [ancient(r) for r in confirm_records_of_arm(wildcards.arm)]}


def confirm_records_of_arm(arm):
    """The arm's first confirmation record (round 1, always run): read from the plan, not from the round
    checkpoints, so that a round checkpoint planned again never puts the capacity search in the DAG."""
    p = confirm_plan()
    return [record_path("confirm", d["arm"], d["rep"]) for d in p["deployments"]
            if d["arm"] == arm and d["kind"] == "repeat" and d["round"] <= CONFIRM_INITIAL][:1]


def stale_inputs(dependent):
    """Checkpoint outputs that are missing while ``dependent`` (results/report, results/tables) still
    holds files built from them; read-only (the onstart handler moves the stale files aside)."""
    return [cp for cp, dep in _stale.stale_dependents(".", capacity=STALE_CAPACITY) if dep == dependent]


def model_launch_files():
    """The pinned model-launch example the report patches (recommendation.model_launch): its manifest and the
    verbatim copy it names (checked at parse by check_config); none when the config pins none."""
    from specstudy.inputs.model_launch import manifest_path
    from specstudy.study.config import REPO_ROOT

    ref = (config.get("recommendation") or {}).get("model_launch")
    if not ref:
        return []
    manifest = manifest_path(ref, REPO_ROOT)
    return [str(manifest), str(manifest.parent / json.loads(manifest.read_text())["local"])]


def report_inputs(wildcards):
    # A stale report depends on the missing checkpoint outputs as plain files: Snakemake plans the
    # checkpoint and the report again (through the checkpoint's own lookup it would see the old report
    # as current); once the checkpoint has run, the full inputs below apply.
    stale = stale_inputs(layout.report_dir())
    if stale:
        return {"stale": stale}
    # every file the report reads (specstudy.report.files.ReportFiles), named; cells and gates: through the tables
    return {
        "cells": screen_cells() + confirm_cells(),
        "records": screen_records() + confirm_records(),
        "gates": gates_of("screen") + gates_of("confirm"),
        "selection": selection_file(),
        # the final candidate, a checkpoint the DAG holds only with the capacity search (the capacity half's arm)
        "final_candidate": [final_candidate_file()] if CAPACITY.get("enabled") else [],
        "rounds": confirm_round_files(),
        "tables": [layout.table(t) for t in _report_files.TABLES],
        "knees": capacity_targets(wildcards),
        "corpora": all_corpus_json(),
        "heldout": [FIXTURE_HELDOUT] if FIXTURES else [],
        "scale": [SCALE_RECORD] if SCALE else [],
        # the profile phase's summary, when its section is in the report (the cost model reads it)
        "profile": [layout.phase_summary("profile")] if "profile" in _ext.in_report(config) else [],
        "sections": report_extension_sections(),
    }


#: report_inputs' name → specstudy report's option; a name holding one file at most
REPORT_OPTIONS = {"tables": "--table-files", "selection": "--selection", "final_candidate": "--final-candidate",
                  "rounds": "--rounds", "knees": "--knees", "corpora": "--corpora", "heldout": "--heldout",
                  "scale": "--scale-record", "records": "--records", "profile": "--profile",
                  "sections": "--sections"}
_REPORT_SINGLE = {"selection", "final_candidate", "heldout", "scale", "profile"}


def report_args(wildcards, input):
    """The report job's files: every input it was given, each under its option. Planned stale (a checkpoint output
    it was built from is missing, the real inputs are not known yet), it reads the whole results tree."""
    names = input.keys()
    if "stale" in names:
        return f"--results {layout.ROOT} --sections " + " ".join(report_extension_sections())
    args = []
    for name, option in REPORT_OPTIONS.items():
        # before the checkpoints have run (a dry run), the files are not known yet
        files = getattr(input, name) if name in names else []
        files = [files] if isinstance(files, str) else list(files)
        if name in _REPORT_SINGLE:
            args += [option, files[0]] if files else []
        else:
            args += [option, *files]
    return " ".join(args)


def tables_inputs(wildcards):
    stale = stale_inputs(layout.tables_dir())
    if stale:
        return {"stale": stale}
    return {"cells": screen_cells() + confirm_cells(), "records": screen_records() + confirm_records(),
            "gates": gates_of("screen") + gates_of("confirm")}


def tables_args(wildcards, input):
    """The tables job's files: the cells, records and gates it was given. Planned stale (a checkpoint output it
    was built from is missing, the real inputs are not known yet), it reads the whole results tree."""
    names = input.keys()
    if "stale" in names:
        return f"--results {layout.ROOT}"
    # before the plan checkpoints have run (a dry run), the files are not known yet
    files = {name: list(getattr(input, name)) if name in names else [] for name in ("cells", "records", "gates")}
    return " ".join(["--cells", *files["cells"], "--deployments", *files["records"], "--gates", *files["gates"]])


# ------------------------------------------------------------------ extension phases (rules/extensions.smk)
# Opt-in phases after the greedy core, each declared once (specstudy.study.phase_decl; docs/extensions.md): each
# has its own plan checkpoint (results/plan/<phase>.json), deployments under results/<phase>/, a summary and a
# report section; none is ever read by the core tables, gates, selection or decision.
from specstudy.study import phase_decl as _ext  # noqa: E402

try:
    _ext.check(config, PREREG, _CONFIG_SOURCE)
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None
EXT_PHASES = _ext.declared(config)
#: every opt-in phase (declared in this config or not: each has its target, which names what is missing)
EXT_PHASE_NAMES = _ext.EXTENSION_PHASES
EXT_PHASE_PATTERN = "|".join(EXT_PHASE_NAMES)
EXT_ARMS_FROM_CONFIRMATION = (config.get("extensions") or {}).get("arms", "confirmation") == "confirmation"


def require_extension(phase):
    if phase not in EXT_PHASES:
        raise WorkflowError(f"`snakemake {_ext.DECLS[phase].target}`: the study config declares no 'extensions.{phase}' "
                            "section; declare it (see config/config.yaml and docs/extensions.md)")


def ext_plan(phase):
    """An extension phase's plan: results/plan/<phase>.json, the output of checkpoint plan_extension."""
    require_extension(phase)
    return _read_plan(checkpoints.plan_extension.get(ext=phase).output.plan)


def ext_plan_inputs(wildcards):
    require_extension(wildcards.ext)
    inputs = {"corpora": all_corpus_json(), "config": ancient(CONFIG_FILE),
              "lock": ancient(LOCK_FILE)}
    if EXT_ARMS_FROM_CONFIRMATION:  # the arms of the confirmation plan (built from the verified selection)
        confirm_plan()
        inputs["arms"] = ancient(layout.plan("confirm"))
    return inputs


# named here, not from input: (which waits on the confirmation checkpoint), so a dry run prints the command
EXT_ARMS_OPTION = f"--arms-from {layout.plan('confirm')}" if EXT_ARMS_FROM_CONFIRMATION else ""
#: the extension phases' deployment jobs' path patterns (rules/extensions.smk), one per phase
EXTENSION = {phase: DeploymentPaths(phase) for phase in EXT_PHASE_NAMES}


def ext_deployment_inputs(phase):
    def inputs(wildcards):
        return deployment_inputs(wildcards, phase)

    return inputs


def ext_records(phase):
    return _records_of(ext_plan(phase))


def ext_cells(phase):
    return _cells_of(ext_plan(phase))


def ext_summary_inputs(phase):
    def inputs(wildcards):
        p = ext_plan(phase)
        out = {"plan": layout.plan(phase), "records": _records_of(p), "cells": _cells_of(p),
               "config": ancient(CONFIG_FILE)}
        joins = _ext.DECLS[phase].joins(config)  # what the phase's declaration joins besides its own cells
        if "natural" in joins:  # the greedy, natural-EOS figures shown beside them
            out["natural"] = confirm_cells() + confirm_records()
        if "knees" in joins:  # the capacity knees
            out["knees"] = capacity_targets(wildcards)
        return out

    return inputs


def ext_section(phase):
    return layout.phase_section(phase)


def ext_targets(phase):
    """A phase's target: its deployments, cells and its summary section."""
    def inputs(wildcards):
        p = ext_plan(phase)
        return _records_of(p) + _cells_of(p) + [ext_section(phase)]

    return inputs


def report_extension_sections():
    return [ext_section(p) for p in _ext.in_report(config)]
