# Greedy correctness gate per speculative arm, judged against a cross-deployment control.


rule gate:
    input:
        unpack(gate_inputs),
    output:
        gate=layout.gate("{phase}", "{arm}"),
    log:
        layout.log("gates", "{phase}", "{arm}"),
    benchmark:
        layout.benchmark("gates", "{phase}", "{arm}")
    params:
        margins=GATE_MARGINS,
        tokenizer=tokenizer_dir(),
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy gate judge --baseline {input.baseline} --candidate {input.candidate} "
        "--control {input.baseline} --margins {params.margins:q} "
        "--arm {wildcards.arm} --phase {wildcards.phase} --tokenizer {params.tokenizer} --out {output.gate} > {log} 2>&1"
