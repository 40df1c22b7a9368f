# Fixture models of the embedded default: a tiny target and draft sharing one tokenizer (no hub, no network).
from specstudy.inputs.fixture_models import training_files as _fixture_training_files  # noqa: E402


rule fixture_models:
    input:
        # the bundled text the models train on, and their code: an edit of either rebuilds them
        text=[str(p) for p in _fixture_training_files("corpora/data")],
        module="scripts/specstudy/inputs/fixture_models.py",
    output:
        record=FIXTURE_RECORD,
    log:
        layout.log("models", "fixture"),
    benchmark:
        layout.benchmark("models", "fixture")
    params:
        seed=(config.get("fixture_models") or {}).get("seed", 0),
        quick="--quick" if (config.get("fixture_models") or {}).get("quick") else "",
        draft_preset=(config.get("fixture_models") or {}).get("draft_preset", "default"),
        # unset: today's kl_text pair (no flag); else the section as JSON (docs/gpu.md "A better pair")
        draft_training=fixture_draft_training_arg(),
    threads: 2
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy fixture-models --out $(dirname {output.record}) --seed {params.seed} {params.quick} "
        "--draft-preset {params.draft_preset} {params.draft_training} > {log} 2>&1"


# The fixture draft's acceptance on held-out text (corpora/heldout/, never trained on) beside the same
# measurement on the workloads' own prompts, which come from the training text (issue #16 item 11).
rule fixture_heldout:
    input:
        models=FIXTURE_RECORD,
        heldout="corpora/heldout/prompts.jsonl",
        workloads=workload_corpus_json(),
        module="scripts/specstudy/inputs/heldout.py",
    output:
        FIXTURE_HELDOUT,
    log:
        layout.log("models", "fixture-heldout"),
    benchmark:
        layout.benchmark("models", "fixture-heldout")
    params:
        k=",".join(str(k) for k in config["arms"]["num_speculative_tokens"]),
    threads: 2
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy fixture-heldout --models {input.models} --heldout {input.heldout} "
        "--workload-corpora {input.workloads} --k {params.k} --out {output} > {log} 2>&1"


# The scale model (issue 27, scripts/specstudy/inputs/scale_model.py): the fixture pair widened, function-
# preserving, into an 8B-shaped target and a 1B-shaped draft from a seed; the function check against the
# fixture on the smoke prompts must pass or nothing is written. Built on the GPU when present.
rule scale_models:
    input:
        fixture=FIXTURE_RECORD,
        prompts=scale_smoke_prompts() if SCALE else [],
        module="scripts/specstudy/inputs/scale_model.py",
    output:
        record=SCALE_RECORD,
    log:
        layout.log("models", "scale"),
    benchmark:
        layout.benchmark("models", "scale")
    params:
        seed=scale_param("seed", 0),
        device=scale_param("device", "auto"),
        dtype=scale_param("dtype", "bfloat16"),
        tolerance=(scale_param("check", {}) or {}).get("max_abs_logit_diff", 1e-4),
        greedy=(scale_param("check", {}) or {}).get("greedy_tokens", 32),
        shapes=" ".join(scale_shape_arg(r) for r in ("target", "draft")),
    threads: 2
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy scale-model --out $(dirname {output.record}) --fixture $(dirname {input.fixture}) "
        "--prompts {input.prompts} --seed {params.seed} --device {params.device} --dtype {params.dtype} "
        "--tolerance {params.tolerance} --greedy-tokens {params.greedy} {params.shapes} > {log} 2>&1"
