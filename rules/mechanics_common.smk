# Helpers of rules/mechanics.smk (functions only; the rules live there).
from specstudy.mechanics import point as _mech  # noqa: E402

MECHANICS_FILE = config.get("mechanics") or "config/gpu-h200-mechanics.yaml"
MECHANICS_SUMMARY = layout.mechanics_dir("mechanics.json")


def _mechanics():
    try:
        return _mech.load_mechanics(MECHANICS_FILE, config)
    except _mech.MechanicsError as exc:
        raise WorkflowError(str(exc)) from None


def mechanics_arm_records(wildcards=None):
    return [str(_mech.arm_record_path(label)) for label in _mech.arm_labels(_mechanics())]


def mechanics_model_params(wildcards):
    return _mechanics()["models"][wildcards.role]


def mechanics_tokenizer_inputs(wildcards):
    tok = _mechanics()["tokenizer"]
    # The fixture tokenizer is built by rule fixture_models, whether or not the study uses the fixtures.
    return [FIXTURE_RECORD] if tok.startswith(layout.models_dir("fixture") + "/") else []


def mechanics_run_inputs(wildcards):
    m = _mechanics()
    label = wildcards.label
    if label not in _mech.arm_labels(m):
        raise WorkflowError(f"{layout.mechanics_dir(label)}: not a configured mechanics arm "
                            f"({', '.join(_mech.arm_labels(m))}; {MECHANICS_FILE})")
    # The job builds its spec from the effective config and the mechanics config (specstudy mechanics spec).
    inputs = {"target": f"{_mech.model_dir('target')}/model.json",
              "corpus": f"{_mech.corpus_dir(m)}/corpus.json", "smoke": corpus_json("smoke"),
              "config": ancient(DEPLOYMENT_CONFIG_FILE)}
    if label.startswith("small-draft"):
        inputs["draft"] = f"{_mech.model_dir('draft')}/model.json"
    return inputs
