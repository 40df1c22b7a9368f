# Capacity: open-loop Poisson rate search per arm (baseline and the final candidate), kept apart
# from the fixed-concurrency cells.


rule capacity_search:
    input:
        unpack(capacity_inputs),
    output:
        knee="results/capacity/{arm}/knee.json",
    log:
        "results/logs/capacity/{arm}.log",
    params:
        spec=capacity_spec,
        out="results/capacity/{arm}",
    threads: 2
    resources:
        deployments=1,
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy deployment run --spec {params.spec:q} --out {params.out} > {log} 2>&1"
