# The pre-registered selection (reads screening outputs only) and the final candidate for capacity.


checkpoint select:
    input:
        # ancient while confirmation's plan locks the selection (rules/common.smk: unless_locked)
        summaries=unless_locked(screen_repeat_cells),
        deployments=unless_locked(screen_repeat_records),
        gates=unless_locked(gates_of_screen),
        lock=ancient(LOCK_FILE),
    output:
        # Protected: confirmation consumes it only while its digest and the plan's sha256 match.
        selection=protected(layout.selection()),
    log:
        layout.log("selection", "selection"),
    benchmark:
        layout.benchmark("selection", "selection")
    params:
        config=CONFIG_FILE,
        # selection may read screening outputs only (refused otherwise); the confirmation plan, when it
        # exists, locks the selection (named here: it is no input of the selection)
        screen_root=results_root_of("selection", "selection", lambda root: layout.phase_dir("screen", root)),
        confirm_plan=layout.plan("confirm"),
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy select --config {params.config} --lock {input.lock} --summaries {input.summaries} "
        "--deployments {input.deployments} --gates {input.gates} --screen-root {params.screen_root} "
        "--confirm-plan {params.confirm_plan} --out {output.selection} > {log} 2>&1"


checkpoint final_candidate:
    input:
        summaries=confirm_cells,
        gates=gates_of_confirm,
        selection=ancient(selection_file),
        plan=ancient(layout.plan("confirm")),
        lock=ancient(LOCK_FILE),
    output:
        decision=layout.final_candidate(),
    log:
        layout.log("selection", "final-candidate"),
    benchmark:
        layout.benchmark("selection", "final-candidate")
    params:
        config=CONFIG_FILE,
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy final-candidate --config {params.config} --summaries {input.summaries} --gates {input.gates} "
        "--selection {input.selection} --plan {input.plan} --lock {input.lock} --out {output.decision} > {log} 2>&1"


# Adaptive confirmation (pre-registered stopping rule, docs/report.md): after round confirmation.repeats and each
# later round, the rule is evaluated on rounds 1..n; round n+1 exists in the DAG only if this checkpoint asks for it.
checkpoint confirm_round:
    input:
        unpack(confirm_round_inputs),
    output:
        state=layout.confirm_round("{n}"),
    log:
        layout.log("confirm", "rounds", "round{n}"),
    benchmark:
        layout.benchmark("confirm", "rounds", "round{n}")
    params:
        config=CONFIG_FILE,
    wildcard_constraints:
        n="[0-9]+",
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy confirm-round --config {params.config} --lock {input.lock} --plan {input.plan} --round {wildcards.n} "
        "--summaries {input.summaries} --gates {input.gates} --out {output.state} > {log} 2>&1"
