# Opt-in extension phases after the greedy core, each declared once (specstudy.study.phase_decl) with its
# behaviour registered once (specstudy.phases; docs/extensions.md): each phase plans its deployments from the
# confirmation plan's arms, runs them through the same deployment job, and summarises them into
# results/<phase>/{summary.json,section.md} (the sampling phase: also its judges, results/sampling/gates/<arm>.json).
# Never pooled with screen/confirm. Targets (the declarations' `target`): sampling, ignore_eos, memory, profile.
# The phase's target and summary rules are made here for every declared phase; the deployment rules name each
# phase's outputs (a rule's outputs cannot depend on a wildcard's value).


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
        ext=EXT_PHASE_PATTERN,
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


for _phase in EXT_PHASE_NAMES:

    # The phase's target: its deployments, cells and its summary section.
    rule:
        name:
            _ext.DECLS[_phase].target
        input:
            ext_targets(_phase),
        localrule: True

    # The phase's summary and report section, by the phase's registered behaviour (the sampling phase's also
    # judges every speculative arm from the deployment records' sampled captures, so the section is never
    # built without its verdicts).
    rule:
        name:
            f"{_phase}_summary"
        input:
            unpack(ext_summary_inputs(_phase)),
        output:
            summary=f"results/{_phase}/summary.json",
            section=f"results/{_phase}/section.md",
            **{d: directory(f"results/{_phase}/{d}") for d in _ext.DECLS[_phase].summary_dirs},
        log:
            f"results/logs/{_phase}/summary.log",
        benchmark:
            f"results/benchmarks/{_phase}/summary.tsv"
        params:
            prereg=PREREG_FILE,
            # named here, not from input: (which waits on the phase's plan checkpoint), so a dry run prints the command
            plan=f"results/plan/{_phase}.json",
            config=CONFIG_FILE,
            phase=_phase,
            out=lambda wildcards, output: os.path.dirname(output.section),
        localrule: True
        conda:
            "../envs/specstudy.yaml"
        shell:
            "specstudy phase summary {params.phase} --plan {params.plan} --config {params.config} "
            "--prereg {params.prereg} --results results --out {params.out} > {log} 2>&1"
