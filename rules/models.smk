# Fixture models of the embedded default: a tiny target and draft sharing one tokenizer (no hub, no network).
from specstudy.fixture_models import training_files as _fixture_training_files  # noqa: E402


rule fixture_models:
    input:
        # the bundled text the models train on, and their code: an edit of either rebuilds them
        text=[str(p) for p in _fixture_training_files("corpora/data")],
        module="scripts/specstudy/fixture_models.py",
    output:
        record=FIXTURE_RECORD,
    log:
        "results/logs/models/fixture.log",
    benchmark:
        "results/benchmarks/models/fixture.tsv"
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


# The fixture draft's acceptance on held-out text (corpora/heldout/, never trained on) beside the same
# measurement on the workloads' own prompts, which come from the training text (issue #16 item 11).
rule fixture_heldout:
    input:
        models=FIXTURE_RECORD,
        heldout="corpora/heldout/prompts.jsonl",
        workloads=workload_corpus_json(),
        module="scripts/specstudy/heldout.py",
    output:
        FIXTURE_HELDOUT,
    log:
        "results/logs/models/fixture-heldout.log",
    benchmark:
        "results/benchmarks/models/fixture-heldout.tsv"
    params:
        k=",".join(str(k) for k in config["arms"]["num_speculative_tokens"]),
    threads: 2
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy fixture-heldout --models {input.models} --heldout {input.heldout} "
        "--workload-corpora {input.workloads} --k {params.k} --out {output} > {log} 2>&1"
