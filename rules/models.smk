# Fixture models of the embedded default: a tiny target and draft sharing one tokenizer (no hub, no network).


rule fixture_models:
    output:
        record=FIXTURE_RECORD,
    log:
        "results/logs/models/fixture.log",
    params:
        seed=(config.get("fixture_models") or {}).get("seed", 0),
        quick="--quick" if (config.get("fixture_models") or {}).get("quick") else "",
    threads: 2
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy fixture-models --out $(dirname {output.record}) --seed {params.seed} {params.quick} > {log} 2>&1"
