# Workload corpora: versioned, digested prompt sets built from the specs under corpora/.


rule corpus:
    input:
        unpack(corpus_build_inputs),
    output:
        corpus=layout.corpus_json("{corpus}", "{version}"),
    log:
        layout.log("corpora", "{corpus}-{version}"),
    benchmark:
        layout.benchmark("corpora", "{corpus}-{version}")
    params:
        tokenizer=tokenizer_dir(),
        # the corpora folder of the output: the corpus lands in <corpora>/<name>/<version>/
        corpora=results_root_of("corpus", "corpus", layout.corpora_dir),
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy corpus build --spec {input.spec} --out {params.corpora} --tokenizer {params.tokenizer} > {log} 2>&1"
