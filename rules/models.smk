# Fixture models of the embedded default: a tiny target and draft sharing one tokenizer (no hub, no network).


rule fixture_models:
    output:
        record=FIXTURE_RECORD,
    log:
        "results/logs/models/fixture.log",
    params:
        seed=(config.get("fixture_models") or {}).get("seed", 0),
        quick="--quick" if (config.get("fixture_models") or {}).get("quick") else "",
        draft_preset=(config.get("fixture_models") or {}).get("draft_preset", "default"),
    threads: 2
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy fixture-models --out $(dirname {output.record}) --seed {params.seed} {params.quick} "
        "--draft-preset {params.draft_preset} > {log} 2>&1"
