# The mechanics point (issue #14 item 7): a large random-initialised target, self-draft, small random
# draft and n-gram. mechanics (random weights; not a study result): not part of `all`, never read by
# the study's tables or report. Target: `snakemake decode_mechanics` (docs/gpu.md).
include: "mechanics_common.smk"


rule decode_mechanics:
    input:
        MECHANICS_SUMMARY,


rule random_model:
    input:
        mechanics_tokenizer_inputs,
    output:
        record=layout.mechanics_model("{role}"),
    log:
        layout.log("mechanics", "model-{role}"),
    params:
        preset=lambda wildcards: mechanics_model_params(wildcards)["preset"],
        seed=lambda wildcards: mechanics_model_params(wildcards)["seed"],
        device=lambda wildcards: mechanics_model_params(wildcards).get("device", "cpu"),
        dtype=lambda wildcards: mechanics_model_params(wildcards).get("dtype", "bfloat16"),
        tokenizer=lambda wildcards: _mechanics()["tokenizer"],
    wildcard_constraints:
        role="target|draft",
    threads: 2
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy random-model --out $(dirname {output.record}) --preset {params.preset} "
        "--seed {params.seed} --tokenizer {params.tokenizer} --device {params.device} "
        "--dtype {params.dtype} > {log} 2>&1"


rule mechanics_corpus:
    input:
        source=lambda wildcards: corpus_json(wildcards.workload),
    output:
        corpus=layout.mechanics_dir("corpus", "{workload}-mt{max_tokens}", "corpus.json"),
    log:
        layout.log("mechanics", "corpus-{workload}-mt{max_tokens}"),
    wildcard_constraints:
        max_tokens="[0-9]+",
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy mechanics corpus --source $(dirname {input.source}) --out $(dirname {output.corpus}) "
        "--max-tokens {wildcards.max_tokens} > {log} 2>&1"


rule mechanics_run:
    input:
        unpack(mechanics_run_inputs),
    output:
        record=layout.mechanics_arm("{label}"),
    log:
        layout.log("mechanics", "{label}"),
    benchmark:
        layout.benchmark("mechanics", "{label}")
    params:
        mechanics=MECHANICS_FILE,
        out=layout.deployment_dir(layout.MECHANICS, "{label}", 1),
    wildcard_constraints:
        label="baseline|self-draft-k[0-9]+|small-draft-k[0-9]+|ngram-k[0-9]+",
    # One GPU: arms run one after another through the deployments resource (--resources deployments=1,
    # as for the study's deployments); a fixed thread count keeps the workflow parseable without --cores
    # (the Slurm profiles give none).
    threads: 2
    resources:
        deployments=1,
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy mechanics run --config {input.config} --mechanics {params.mechanics} --arm {wildcards.label} "
        "--smoke-corpus-dir $(dirname {input.smoke}) --out {params.out} > {log} 2>&1"


rule mechanics_summary:
    input:
        records=mechanics_arm_records,
        config=ancient(CONFIG_FILE),
    output:
        json=MECHANICS_SUMMARY,
        markdown=layout.mechanics_dir("mechanics.md"),
        parquet=layout.mechanics_dir("mechanics.parquet"),
    log:
        layout.log("mechanics", "summary"),
    params:
        mechanics=MECHANICS_FILE,
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy mechanics summary --config {input.config} --mechanics {params.mechanics} "
        "--records {input.records} --out $(dirname {output.json}) > {log} 2>&1"
