# specstudy: should speculative decoding be switched on for this vLLM deployment?
# Table of contents only; stages live in rules/*.smk, all code in scripts/specstudy/.
from snakemake.utils import min_version

min_version("9.0")


# specstudy's own reader first: file and line for a YAML error, a duplicate key or a non-finite number.
include: "rules/studyconfig.smk"


# The embedded default study, unless --configfile names another study: a study config is complete
# on its own and is never merged with this one (defaults of the CPU study must not leak into it).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/models.smk"
include: "rules/corpus.smk"
include: "rules/plan.smk"
include: "rules/deploy.smk"
include: "rules/gate.smk"
include: "rules/select.smk"
include: "rules/capacity.smk"
include: "rules/report.smk"
include: "rules/mechanics.smk"
include: "rules/extensions.smk"


# Before the first job (never in a dry run): move a report/tables built from a missing checkpoint output aside.
onstart:
    verify_datasets()
    quarantine_stale_outputs()


localrules:
    all,
    effective_config,
    screen,
    confirm,
    capacity,
    build_report,
    prereg_lock,
    plan_screen,
    plan_confirm,
    corpus,
    gate,
    select,
    final_candidate,
    confirm_round,
    tables,
    plan_extension,


rule all:
    input:
        report=layout.report_file("report.md"),
        capacity=capacity_targets,


rule screen:
    input:
        screen_targets,


rule confirm:
    input:
        confirm_targets,


rule capacity:
    input:
        capacity_targets,


rule report:
    input:
        layout.report_file("report.md"),


# Last, once every rule exists: a target no rule can make (`snakemake scren`, a misspelt result path) is
# answered with the nearest rules or existing outputs, not Snakemake's bare MissingRuleException.
check_snakemake_targets(workflow)

# Every results file written through specstudy.core.atomic still holds the bytes recorded then: a hand-edited
# or truncated plan, summary, record, table or selection stops the run here, before any job, naming the fix.
from specstudy.study.snakemake_preflight import check_recorded_results  # noqa: E402

check_recorded_results(workflow)
