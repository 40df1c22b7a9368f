# The pre-registered selection (reads screening outputs only) and the final candidate for capacity.


checkpoint select:
    input:
        summaries=screen_repeat_cells(),
        deployments=screen_repeat_records(),
        lock="results/screen/prereg-lock.json",
    output:
        selection="results/selection/selection.json",
    log:
        "results/logs/selection/selection.log",
    params:
        config=CONFIG_FILE,
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy select --config {params.config} --lock {input.lock} --summaries {input.summaries} "
        "--deployments {input.deployments} --screen-root results/screen --out {output.selection} > {log} 2>&1"


checkpoint final_candidate:
    input:
        summaries=confirm_cells,
        gates=gates_of_confirm,
        selection=ancient(selection_file),
    output:
        decision="results/selection/final-candidate.json",
    log:
        "results/logs/selection/final-candidate.log",
    params:
        config=CONFIG_FILE,
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy final-candidate --config {params.config} --summaries {input.summaries} --gates {input.gates} "
        "--selection {input.selection} --out {output.decision} > {log} 2>&1"
