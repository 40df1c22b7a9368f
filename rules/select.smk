# The pre-registered selection (reads screening outputs only) and the final candidate for capacity.


checkpoint select:
    input:
        # ancient while confirmation's plan locks the selection (rules/common.smk: unless_locked)
        summaries=unless_locked(screen_repeat_cells),
        deployments=unless_locked(screen_repeat_records),
        gates=unless_locked(gates_of_screen),
        lock=ancient("results/screen/prereg-lock.json"),
    output:
        # Protected: confirmation consumes it only while its digest and the plan's sha256 match.
        selection=protected("results/selection/selection.json"),
    log:
        "results/logs/selection/selection.log",
    benchmark:
        "results/benchmarks/selection/selection.tsv"
    params:
        config=CONFIG_FILE,
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy select --config {params.config} --lock {input.lock} --summaries {input.summaries} "
        "--deployments {input.deployments} --gates {input.gates} --screen-root results/screen "
        "--confirm-plan results/plan/confirm.json --out {output.selection} > {log} 2>&1"


checkpoint final_candidate:
    input:
        summaries=confirm_cells,
        gates=gates_of_confirm,
        selection=ancient(selection_file),
        plan=ancient("results/plan/confirm.json"),
    output:
        decision="results/selection/final-candidate.json",
    log:
        "results/logs/selection/final-candidate.log",
    benchmark:
        "results/benchmarks/selection/final-candidate.tsv"
    params:
        config=CONFIG_FILE,
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy final-candidate --config {params.config} --summaries {input.summaries} --gates {input.gates} "
        "--selection {input.selection} --plan {input.plan} --out {output.decision} > {log} 2>&1"


# Adaptive confirmation (pre-registered stopping rule, docs/report.md): after round confirmation.repeats and each
# later round, the rule is evaluated on rounds 1..n; round n+1 exists in the DAG only if this checkpoint asks for it.
checkpoint confirm_round:
    input:
        unpack(confirm_round_inputs),
    output:
        state="results/confirm/rounds/round{n}.json",
    log:
        "results/logs/confirm/rounds/round{n}.log",
    benchmark:
        "results/benchmarks/confirm/rounds/round{n}.tsv"
    params:
        config=CONFIG_FILE,
    wildcard_constraints:
        n="[0-9]+",
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy confirm-round --config {params.config} --lock {input.lock} --plan {input.plan} --round {wildcards.n} "
        "--summaries {input.summaries} --gates {input.gates} --out {output.state} > {log} 2>&1"
