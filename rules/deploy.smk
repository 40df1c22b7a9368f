# One Snakemake job per deployment: start vLLM, readiness, two greedy smoke captures, the cells in
# planned order, stop. The job reads what to run from the plan (--plan, --deployment <phase>/<arm>/<rep>)
# and how from the effective config; raw artifacts go to attempts/<deployment_id>/, declared outputs
# are atomic copies. Measurement failures are data (exit 0); see docs/DESIGN.md "Deployment job shape".
# Every path pattern comes from specstudy.core.layout (rules/common.smk: SCREEN, CONFIRM, DRIFT).


rule deploy_screen:
    input:
        unpack(screen_deployment_inputs),
    output:
        record=SCREEN.record,
        cells=deployment_outputs("screen"),
    log:
        SCREEN.log,
    benchmark:
        SCREEN.benchmark
    params:
        deployment=SCREEN.ref,
        out=SCREEN.dir,
        # the files the job reads, named here (not from input:) so that a dry run can print the command
        # before checkpoint plan_screen has run
        plan=SCREEN.plan,
        config=DEPLOYMENT_CONFIG_FILE,
        lock=LOCK_FILE,
    threads: 2
    resources:
        deployments=1,
    priority: deployment_priority("screen")
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy deployment run --plan {params.plan} --deployment {params.deployment} --config {params.config} "
        "--lock {params.lock} --out {params.out} > {log} 2>&1"


rule deploy_confirm:
    input:
        unpack(confirm_deployment_inputs),
    output:
        record=CONFIRM.record,
        cells=deployment_outputs("confirm"),
    log:
        CONFIRM.log,
    benchmark:
        CONFIRM.benchmark
    params:
        deployment=CONFIRM.ref,
        out=CONFIRM.dir,
        # the files the job reads, named here (not from input:) so that a dry run can print the command
        # before checkpoint plan_confirm has run
        plan=CONFIRM.plan,
        config=DEPLOYMENT_CONFIG_FILE,
        lock=LOCK_FILE,
    threads: 2
    resources:
        deployments=1,
    priority: deployment_priority("confirm")
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy deployment run --plan {params.plan} --deployment {params.deployment} --config {params.config} "
        "--lock {params.lock} --out {params.out} > {log} 2>&1"


use rule deploy_screen as deploy_drift with:
    input:
        unpack(deployment_inputs),
    output:
        record=DRIFT.record,
        cells=drift_outputs(),
    log:
        DRIFT.log,
    benchmark:
        DRIFT.benchmark
    params:
        deployment=DRIFT.ref,
        out=DRIFT.dir,
        plan=DRIFT.plan,
        config=DEPLOYMENT_CONFIG_FILE,
        lock=LOCK_FILE,
    priority: deployment_priority()
    wildcard_constraints:
        arm=_plan.BASELINE_PATTERN,
