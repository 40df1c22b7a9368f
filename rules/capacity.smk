# Capacity: open-loop Poisson rate search per arm (baseline and the final candidate), kept apart
# from the fixed-concurrency cells. The arm comes from the confirmation plan, the search from the config.


rule capacity_search:
    input:
        unpack(capacity_inputs),
    output:
        knee="results/capacity/{arm}/knee.json",
    log:
        "results/logs/capacity/{arm}.log",
    benchmark:
        "results/benchmarks/capacity/{arm}.tsv"
    params:
        deployment="capacity/{arm}/rep1",
        out="results/capacity/{arm}",
        plan="results/plan/confirm.json",
        config=DEPLOYMENT_CONFIG_FILE,
    threads: 2
    resources:
        deployments=1,
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy deployment run --plan {params.plan} --deployment {params.deployment} --config {params.config} "
        "--out {params.out} > {log} 2>&1"
