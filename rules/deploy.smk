# One Snakemake job per deployment: start vLLM, readiness, two greedy smoke captures, the cells in
# planned order, stop. The job reads what to run from the plan (--plan, --deployment <phase>/<arm>/<rep>)
# and how from the effective config; raw artifacts go to attempts/<deployment_id>/, declared outputs
# are atomic copies. Measurement failures are data (exit 0); see docs/DESIGN.md "Deployment job shape".


rule deploy_screen:
    input:
        unpack(screen_deployment_inputs),
    output:
        record="results/screen/{arm}/{rep}/deployment.json",
        cells=deployment_outputs("screen"),
    log:
        "results/logs/screen/{arm}/{rep}.log",
    benchmark:
        "results/benchmarks/screen/{arm}/{rep}.tsv"
    params:
        deployment="screen/{arm}/{rep}",
        out="results/screen/{arm}/{rep}",
        # the files the job reads, named here (not from input:) so that a dry run can print the command
        # before checkpoint plan_screen has run
        plan="results/plan/screen.json",
        config=DEPLOYMENT_CONFIG_FILE,
        lock="results/screen/prereg-lock.json",
    threads: 2
    resources:
        deployments=1,
    priority: 10
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy deployment run --plan {params.plan} --deployment {params.deployment} --config {params.config} "
        "--lock {params.lock} --out {params.out} > {log} 2>&1"


rule deploy_confirm:
    input:
        unpack(confirm_deployment_inputs),
    output:
        record="results/confirm/{arm}/{rep}/deployment.json",
        cells=deployment_outputs("confirm"),
    log:
        "results/logs/confirm/{arm}/{rep}.log",
    benchmark:
        "results/benchmarks/confirm/{arm}/{rep}.tsv"
    params:
        deployment="confirm/{arm}/{rep}",
        out="results/confirm/{arm}/{rep}",
        # the files the job reads, named here (not from input:) so that a dry run can print the command
        # before checkpoint plan_confirm has run
        plan="results/plan/confirm.json",
        config=DEPLOYMENT_CONFIG_FILE,
        lock="results/screen/prereg-lock.json",
    threads: 2
    resources:
        deployments=1,
    priority: 5
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy deployment run --plan {params.plan} --deployment {params.deployment} --config {params.config} "
        "--lock {params.lock} --out {params.out} > {log} 2>&1"


use rule deploy_screen as deploy_drift with:
    input:
        unpack(deployment_inputs),
    output:
        record="results/{phase}/{arm}/{drift}/deployment.json",
        cells=drift_outputs(),
    log:
        "results/logs/{phase}/{arm}/{drift}.log",
    benchmark:
        "results/benchmarks/{phase}/{arm}/{drift}.tsv"
    params:
        deployment="{phase}/{arm}/{drift}",
        out="results/{phase}/{arm}/{drift}",
        plan="results/plan/{phase}.json",
        config=DEPLOYMENT_CONFIG_FILE,
        lock="results/screen/prereg-lock.json",
    wildcard_constraints:
        arm="baseline",
