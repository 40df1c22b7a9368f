# The effective config, the pre-registration lock and the ordered plans of both phases.


rule effective_config:
    # Content-addressed (rules/common.smk: CONFIG_FILE, DEPLOYMENT_CONFIG_FILE); written here, never at parse time.
    output:
        config="results/.config/{name}.json",
    log:
        "results/logs/config/{name}.log",
    wildcard_constraints:
        name="(deployment-)?[0-9a-f]+",
    run:
        write_config_file(output.config)


rule prereg_lock:
    output:
        # Written once, before any screening deployment; protected so that nothing regenerates it.
        lock=protected("results/screen/prereg-lock.json"),
    log:
        "results/logs/plan/prereg-lock.log",
    benchmark:
        "results/benchmarks/plan/prereg-lock.tsv"
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
        lock=ancient("results/screen/prereg-lock.json"),
        config=ancient(CONFIG_FILE),
    output:
        plan="results/plan/screen.json",
    log:
        "results/logs/plan/screen.log",
    benchmark:
        "results/benchmarks/plan/screen.tsv"
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
        plan="results/plan/confirm.json",
    log:
        "results/logs/plan/confirm.log",
    benchmark:
        "results/benchmarks/plan/confirm.tsv"
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy plan --config {input.config} --phase confirm --selection {input.selection} "
        "--corpora {input.corpora} --out {output.plan} > {log} 2>&1"
