# The effective config, the pre-registration lock and the ordered plans of both phases.


rule effective_config:
    # Content-addressed (rules/common.smk: CONFIG_FILE, DEPLOYMENT_CONFIG_FILE); written here, never at parse time.
    output:
        config=layout.config_file("{name}"),
    log:
        layout.log("config", "{name}"),
    wildcard_constraints:
        name="(deployment-)?[0-9a-f]+",
    run:
        write_config_file(output.config)


rule prereg_lock:
    output:
        # Written once, before any screening deployment; protected so that nothing regenerates it.
        lock=protected(LOCK_FILE),
    log:
        layout.log("plan", "prereg-lock"),
    benchmark:
        layout.benchmark("plan", "prereg-lock")
    params:
        prereg=PREREG_FILE,
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy prereg-lock --prereg {params.prereg} --out {output.lock} > {log} 2>&1"


# The plans are checkpoints: the DAG of each phase is read from its plan file (rules/common.smk: screen_plan,
# confirm_plan), so the deployments and cells that run are exactly those the plan records.
checkpoint plan_screen:
    input:
        corpora=all_corpus_json(),
        methods=methods_record_input(),
        lock=ancient(LOCK_FILE),
        config=ancient(CONFIG_FILE),
    output:
        plan=layout.plan("screen"),
    log:
        layout.log("plan", "screen"),
    benchmark:
        layout.benchmark("plan", "screen")
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy plan --config {input.config} --phase screen --corpora {input.corpora} --out {output.plan} > {log} 2>&1"


checkpoint plan_confirm:
    input:
        corpora=all_corpus_json(),
        methods=methods_record_input(),
        selection=ancient(verified_selection_file),
        config=ancient(CONFIG_FILE),
    output:
        plan=layout.plan("confirm"),
    log:
        layout.log("plan", "confirm"),
    benchmark:
        layout.benchmark("plan", "confirm")
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy plan --config {input.config} --phase confirm --selection {input.selection} "
        "--corpora {input.corpora} --out {output.plan} > {log} 2>&1"
