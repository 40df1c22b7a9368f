# Workload corpora: versioned, digested prompt sets built from the specs under corpora/.


rule corpus:
    input:
        unpack(corpus_build_inputs),
    output:
        corpus="results/corpora/{corpus}/{version}/corpus.json",
    log:
        "results/logs/corpora/{corpus}-{version}.log",
    benchmark:
        "results/benchmarks/corpora/{corpus}-{version}.tsv"
    params:
        tokenizer=tokenizer_dir(),
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy corpus build --spec {input.spec} --out results/corpora --tokenizer {params.tokenizer} > {log} 2>&1"
