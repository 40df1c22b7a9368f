# Opt-in extension phases after the greedy core (specstudy.study.extensions; docs/extensions.md): each phase
# plans its deployments from the confirmation plan's arms, runs them through the same deployment job,
# and summarises them into results/<phase>/{summary.json,section.md} (the sampling phase: also its judges,
# results/sampling/gates/<arm>.json). Never pooled with screen/confirm.
# Targets: sampling, mechanics (ignore_eos), memory, profile.


rule sampling:
    input:
        ext_targets("sampling"),


rule mechanics:
    input:
        ext_targets("ignore_eos"),


rule memory:
    input:
        ext_targets("memory"),


rule profile:
    input:
        ext_targets("profile"),


checkpoint plan_extension:
    input:
        unpack(ext_plan_inputs),
    output:
        plan="results/plan/{ext}.json",
    log:
        "results/logs/plan/{ext}.log",
    benchmark:
        "results/benchmarks/plan/{ext}.tsv"
    params:
        # the files the job reads, named here (not from input:, which waits on the confirmation checkpoint)
        # so that a dry run prints the command
        arms=EXT_ARMS_OPTION,
        config=CONFIG_FILE,
        corpora=all_corpus_json(),
    wildcard_constraints:
        ext="sampling|ignore_eos|memory|profile",
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy plan --config {params.config} --phase {wildcards.ext} {params.arms} --corpora {params.corpora} "
        "--out {output.plan} > {log} 2>&1"


use rule deploy_screen as deploy_sampling with:
    input:
        unpack(ext_deployment_inputs("sampling")),
    output:
        record="results/sampling/{arm}/{rep}/deployment.json",
        cells=deployment_outputs("sampling") if "sampling" in EXT_PHASES else [],
    log:
        "results/logs/sampling/{arm}/{rep}.log",
    benchmark:
        "results/benchmarks/sampling/{arm}/{rep}.tsv"
    params:
        deployment="sampling/{arm}/{rep}",
        out="results/sampling/{arm}/{rep}",
        plan="results/plan/sampling.json",
        config=DEPLOYMENT_CONFIG_FILE,
        lock="results/screen/prereg-lock.json",
    priority: 1


use rule deploy_screen as deploy_ignore_eos with:
    input:
        unpack(ext_deployment_inputs("ignore_eos")),
    output:
        record="results/ignore_eos/{arm}/{rep}/deployment.json",
        cells=deployment_outputs("ignore_eos") if "ignore_eos" in EXT_PHASES else [],
    log:
        "results/logs/ignore_eos/{arm}/{rep}.log",
    benchmark:
        "results/benchmarks/ignore_eos/{arm}/{rep}.tsv"
    params:
        deployment="ignore_eos/{arm}/{rep}",
        out="results/ignore_eos/{arm}/{rep}",
        plan="results/plan/ignore_eos.json",
        config=DEPLOYMENT_CONFIG_FILE,
        lock="results/screen/prereg-lock.json",
    priority: 1


use rule deploy_screen as deploy_memory with:
    input:
        unpack(ext_deployment_inputs("memory")),
    output:
        record="results/memory/{arm}/{rep}/deployment.json",
    log:
        "results/logs/memory/{arm}/{rep}.log",
    benchmark:
        "results/benchmarks/memory/{arm}/{rep}.tsv"
    params:
        deployment="memory/{arm}/{rep}",
        out="results/memory/{arm}/{rep}",
        plan="results/plan/memory.json",
        config=DEPLOYMENT_CONFIG_FILE,
        lock="results/screen/prereg-lock.json",
    priority: 1


use rule deploy_screen as deploy_profile with:
    input:
        unpack(ext_deployment_inputs("profile")),
    output:
        record="results/profile/{arm}/{rep}/deployment.json",
        cells=deployment_outputs("profile") if "profile" in EXT_PHASES else [],
    log:
        "results/logs/profile/{arm}/{rep}.log",
    benchmark:
        "results/benchmarks/profile/{arm}/{rep}.tsv"
    params:
        deployment="profile/{arm}/{rep}",
        out="results/profile/{arm}/{rep}",
        plan="results/plan/profile.json",
        config=DEPLOYMENT_CONFIG_FILE,
        lock="results/screen/prereg-lock.json",
    priority: 1


rule extension_summary:
    input:
        unpack(lambda wildcards: ext_summary_inputs(wildcards.ext)(wildcards)),
    output:
        summary="results/{ext}/summary.json",
        section="results/{ext}/section.md",
    log:
        "results/logs/{ext}/summary.log",
    benchmark:
        "results/benchmarks/{ext}/summary.tsv"
    params:
        prereg=PREREG_FILE,
        # named here, not from input: (which waits on the phase's plan checkpoint), so a dry run prints the command
        plan="results/plan/{ext}.json",
        config=CONFIG_FILE,
        phase="{ext}",
        out=lambda wildcards, output: os.path.dirname(output.section),
    wildcard_constraints:
        ext="ignore_eos|memory|profile",
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy extension summary --phase {params.phase} --plan {params.plan} --config {params.config} "
        "--prereg {params.prereg} --results results --out {params.out} > {log} 2>&1"


# The sampling phase's summary also judges every speculative arm (results/sampling/gates/<arm>.json) from
# the deployment records' sampled captures, so the section is never built without its verdicts.
use rule extension_summary as sampling_summary with:
    input:
        unpack(ext_summary_inputs("sampling")),
    output:
        summary="results/sampling/summary.json",
        section="results/sampling/section.md",
        gates=directory("results/sampling/gates"),
    log:
        "results/logs/sampling/summary.log",
    benchmark:
        "results/benchmarks/sampling/summary.tsv"
    params:
        prereg=PREREG_FILE,
        plan="results/plan/sampling.json",
        config=CONFIG_FILE,
        phase="sampling",
        out=lambda wildcards, output: os.path.dirname(output.section),
