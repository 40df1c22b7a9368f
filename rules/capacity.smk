# Capacity: open-loop Poisson rate search per arm (baseline and the final candidate), kept apart
# from the fixed-concurrency cells. The arm comes from the confirmation plan, the search from the config.


rule capacity_search:
    input:
        unpack(capacity_inputs),
    output:
        knee=layout.capacity_knee("{arm}"),
    log:
        layout.log("capacity", "{arm}"),
    benchmark:
        layout.benchmark("capacity", "{arm}")
    params:
        deployment=layout.deployment_dir("capacity", "{arm}", 1, root=""),
        out=layout.capacity_dir("{arm}"),
        plan=layout.plan("confirm"),
        config=DEPLOYMENT_CONFIG_FILE,
    threads: 2
    resources:
        deployments=1,
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy deployment run --plan {params.plan} --deployment {params.deployment} --config {params.config} "
        "--out {params.out} > {log} 2>&1"
