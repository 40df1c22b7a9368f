# Opt-in extension phases after the greedy core, each declared once (specstudy.study.phase_decl) with its
# behaviour registered once (specstudy.phases; docs/extensions.md): each phase plans its deployments from the
# confirmation plan's arms, runs them through the same deployment job, and summarises them into
# results/<phase>/{summary.json,section.md} (the sampling phase: also its judges, results/sampling/gates/<arm>.json).
# Never pooled with screen/confirm. Targets (the declarations' `target`): sampling, ignore_eos, memory, profile.
# The phase's target and summary rules are made here for every declared phase; the deployment rules name each
# phase's outputs (a rule's outputs cannot depend on a wildcard's value). Every path pattern comes from
# specstudy.core.layout (rules/common.smk: EXTENSION, one DeploymentPaths per phase).


checkpoint plan_extension:
    input:
        unpack(ext_plan_inputs),
    output:
        plan=layout.plan("{ext}"),
    log:
        layout.log("plan", "{ext}"),
    benchmark:
        layout.benchmark("plan", "{ext}")
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
        record=EXTENSION["sampling"].record,
        cells=deployment_outputs("sampling") if "sampling" in EXT_PHASES else [],
    log:
        EXTENSION["sampling"].log,
    benchmark:
        EXTENSION["sampling"].benchmark
    params:
        deployment=EXTENSION["sampling"].ref,
        out=EXTENSION["sampling"].dir,
        plan=EXTENSION["sampling"].plan,
        config=DEPLOYMENT_CONFIG_FILE,
        lock=LOCK_FILE,
    priority: deployment_priority("sampling", 1)


use rule deploy_screen as deploy_ignore_eos with:
    input:
        unpack(ext_deployment_inputs("ignore_eos")),
    output:
        record=EXTENSION["ignore_eos"].record,
        cells=deployment_outputs("ignore_eos") if "ignore_eos" in EXT_PHASES else [],
    log:
        EXTENSION["ignore_eos"].log,
    benchmark:
        EXTENSION["ignore_eos"].benchmark
    params:
        deployment=EXTENSION["ignore_eos"].ref,
        out=EXTENSION["ignore_eos"].dir,
        plan=EXTENSION["ignore_eos"].plan,
        config=DEPLOYMENT_CONFIG_FILE,
        lock=LOCK_FILE,
    priority: deployment_priority("ignore_eos", 1)


use rule deploy_screen as deploy_memory with:
    input:
        unpack(ext_deployment_inputs("memory")),
    output:
        record=EXTENSION["memory"].record,
    log:
        EXTENSION["memory"].log,
    benchmark:
        EXTENSION["memory"].benchmark
    params:
        deployment=EXTENSION["memory"].ref,
        out=EXTENSION["memory"].dir,
        plan=EXTENSION["memory"].plan,
        config=DEPLOYMENT_CONFIG_FILE,
        lock=LOCK_FILE,
    priority: deployment_priority("memory", 1)


use rule deploy_screen as deploy_profile with:
    input:
        unpack(ext_deployment_inputs("profile")),
    output:
        record=EXTENSION["profile"].record,
        cells=deployment_outputs("profile") if "profile" in EXT_PHASES else [],
    log:
        EXTENSION["profile"].log,
    benchmark:
        EXTENSION["profile"].benchmark
    params:
        deployment=EXTENSION["profile"].ref,
        out=EXTENSION["profile"].dir,
        plan=EXTENSION["profile"].plan,
        config=DEPLOYMENT_CONFIG_FILE,
        lock=LOCK_FILE,
    priority: deployment_priority("profile", 1)


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
            summary=layout.phase_summary(_phase),
            section=layout.phase_section(_phase),
            **{d: directory(layout.phase_file(_phase, d)) for d in _ext.DECLS[_phase].summary_dirs},
        log:
            layout.log(_phase, "summary"),
        benchmark:
            layout.benchmark(_phase, "summary")
        params:
            prereg=PREREG_FILE,
            # named here, not from input: (which waits on the phase's plan checkpoint), so a dry run prints the command
            plan=layout.plan(_phase),
            config=CONFIG_FILE,
            phase=_phase,
            out=lambda wildcards, output: os.path.dirname(output.section),
            results=results_root_of("phase_summary", "summary"),
        localrule: True
        conda:
            "../envs/specstudy.yaml"
        shell:
            "specstudy phase summary {params.phase} --plan {params.plan} --config {params.config} "
            "--prereg {params.prereg} --results {params.results} --out {params.out} > {log} 2>&1"
