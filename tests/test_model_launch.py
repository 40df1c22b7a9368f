"""The model-launch deliverable: the pinned swiss-ai/model-launch example, the patch that sets the enabled arm
(checked with a real ``git apply`` against the pinned file) and the pull request's text."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from specstudy.core.errors import ConfigError, UserError
from specstudy.inputs.model_launch import example_flags, load_manifest
from specstudy.report import model_launch
from specstudy.study import config as study_config

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "tests" / "data" / "model-launch" / "manifest.json"
DRAFT_PATH = "/capstor/store/cscs/swissai/infra01/hf_models/models/swiss-ai/Apertus-v1.5-8B"
CONFIG = {"study": {"name": "apertus-v1.5-70b-clariden"},
          "engine": {"target": {"tensor_parallel_size": 4, "max_model_len": 131072},
                     "draft": {"path": DRAFT_PATH},
                     "server": {"gpu_memory_utilization": 0.8, "extra_args": ["--no-enable-prefix-caching"]}},
          "recommendation": {"model_launch": str(MANIFEST), "draft_model": None}}
ARMS = {
    "draft-k5-tp4": {"name": "draft-k5-tp4", "method": "draft_model", "num_speculative_tokens": 5,
                     "draft_tensor_parallel_size": 4, "servable": True},
    "draft-k3-tp4": {"name": "draft-k3-tp4", "method": "draft_model", "num_speculative_tokens": 3,
                     "draft_tensor_parallel_size": 4},
    "ngram-k3": {"name": "ngram-k3", "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                 "prompt_lookup_max": 4},
}


def git_apply(tmp_path: Path, man: dict, patch: str) -> str:
    """``git apply --check`` then ``git apply`` of ``patch`` in a fresh repository holding the pinned file at its
    path (committed); the patched file's text."""
    repo = tmp_path / "model-launch"
    target = repo / man["path"]
    target.parent.mkdir(parents=True)
    shutil.copyfile(man["file"], target)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "pinned"]):
        subprocess.run(cmd, cwd=repo, check=True, env=env)
    (tmp_path / "p.patch").write_text(patch)
    check = subprocess.run(["git", "apply", "--check", str(tmp_path / "p.patch")], cwd=repo, env=env,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr + patch
    subprocess.run(["git", "apply", str(tmp_path / "p.patch")], cwd=repo, check=True, env=env)
    return target.read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------ the pinned example
def test_the_shipped_copy_is_the_pinned_file_and_the_clariden_config_names_it():
    man = load_manifest(MANIFEST)
    data = Path(man["file"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == man["sha256"] and len(data) == man["bytes"]
    assert man["repository"] == "swiss-ai/model-launch" and man["commit"] == "2fd9e2062cd4219a9e8c231282aafe51aaf7ddf0"
    assert man["path"] == "examples/clariden/cli/swiss-ai/apertus-ai-1.5-release/Apertus-v1.5-70B-spec-decode.sh"
    assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == man["git_blob_sha1"]
    assert example_flags(man["text"]) == {"method": "draft_model", "model": "swiss-ai/Apertus-v1.5-8B",
                                          "num_speculative_tokens": "3", "draft_tensor_parallel_size": "4"}
    clariden = yaml.safe_load((ROOT / "config" / "clariden-70b.yaml").read_text())
    assert clariden["recommendation"]["model_launch"] == "tests/data/model-launch/manifest.json"


def test_a_copy_that_is_not_the_pinned_file_is_refused_with_the_file_and_field(tmp_path):
    d = tmp_path / "model-launch"
    shutil.copytree(MANIFEST.parent, d)
    man = json.loads((d / "manifest.json").read_text())
    copy = d / man["local"]
    copy.write_bytes(copy.read_bytes().replace(b"tokens 3", b"tokens 4"))
    with pytest.raises(UserError, match=r"Apertus-v1\.5-70B-spec-decode\.sh: sha256 [0-9a-f]{64} \(1113 bytes\) differs "
                                        r"from the manifest's field 'sha256'"):
        load_manifest(d / "manifest.json")
    (d / "manifest.json").write_text(json.dumps({**man, "commit": "2fd9e20"}))
    with pytest.raises(UserError, match="field 'commit' is '2fd9e20'; pin a full 40-hex commit"):
        load_manifest(d / "manifest.json")
    # check-config refuses it before anything runs, naming the config field
    cfg = yaml.safe_load((ROOT / "config" / "clariden-70b.yaml").read_text())
    cfg["recommendation"]["model_launch"] = str(d / "manifest.json")
    with pytest.raises(ConfigError, match=r"field 'recommendation\.model_launch': .*field 'commit'"):
        study_config.check_config(cfg, "clariden-70b.yaml")


# ------------------------------------------------------------------------------------------ the patch
@pytest.mark.parametrize("arm, expected", [
    ("draft-k5-tp4", {"method": "draft_model", "model": "swiss-ai/Apertus-v1.5-8B", "num_speculative_tokens": "5",
                      "draft_tensor_parallel_size": "4"}),
    ("ngram-k3", {"method": "ngram", "num_speculative_tokens": "3", "prompt_lookup_min": "1",
                  "prompt_lookup_max": "4"}),
])
def test_the_patch_applies_to_the_pinned_file_and_sets_the_arm(tmp_path, arm, expected):
    man = load_manifest(MANIFEST)
    recorded = json.loads(json.dumps(ARMS[arm], sort_keys=True))  # as the deployments table holds it: keys sorted
    flags, why = model_launch.arm_flags(recorded, example_flags(man["text"]), study_draft=DRAFT_PATH)
    assert why is None
    patch = model_launch.unified_diff(man["text"], model_launch.patch_example(man["text"], flags), man["path"])
    assert patch.startswith(f"diff --git a/{man['path']} b/{man['path']}\n--- a/{man['path']}\n+++ b/{man['path']}\n")
    new = git_apply(tmp_path, man, patch)
    assert list(example_flags(new).items()) == list(expected.items())  # in this order, nothing else
    assert subprocess.run(["bash", "-n"], input=new, text=True).returncode == 0
    # every line that is no speculative flag or header comment is the example's own
    keep = [x for x in man["text"].splitlines() if "--speculative-config." not in x and not x.startswith("# ")]
    assert [x for x in new.splitlines() if "--speculative-config." not in x and not x.startswith("# ")] == keep
    assert new.splitlines()[-1].endswith('fuse_allreduce_rms false"')
    if arm.startswith("ngram"):
        assert "draft model" not in new.split("sml advanced")[0].replace("no draft model", "")
        assert "with ngram (prompt lookup" in new


def test_flags_that_cannot_be_proposed_say_why():
    cur = {"method": "draft_model", "model": "swiss-ai/Apertus-v1.5-8B"}
    flags, why = model_launch.arm_flags(ARMS["draft-k5-tp4"], cur, study_draft="/models/other-draft")
    assert flags is None and "set recommendation.draft_model" in why
    flags, _ = model_launch.arm_flags(ARMS["draft-k5-tp4"], cur, draft_model="org/Drafter",
                                      study_draft="/models/other-draft")
    assert dict(flags)["model"] == "org/Drafter"
    assert model_launch.arm_flags({"name": "eagle-k3", "method": "eagle", "num_speculative_tokens": 3}, cur)[1]
    variant = {**ARMS["ngram-k3"], "name": "ngram-k3+eager", "variant": "eager", "extra_args": ["--enforce-eager"]}
    assert "apply them by hand" in model_launch.arm_flags(variant, cur)[1]


# ------------------------------------------------------------------------------------------ the two files
def _rec(decision="enable", arm="draft-k5-tp4"):
    return {"decision": decision, "enable": arm if decision == "enable" else None, "phase": "confirm",
            "candidates": [{"arm": arm, "gate_verdict": "pass",
                            "mixture": {"c8": {"verdict": "gain", "lo": 1.08, "hi": 1.17}}}],
            "capacity_half": {"arm": arm, "evaluation": {"met": True, "missed": []}}}


def _comps(arm):
    return [{"phase": "confirm", "arm": arm, "workload": w, "concurrency": c,
             "speedup": {"n": 5, "geomean": g, "ci_low": g - 0.04, "ci_high": g + 0.04, "boot_low": g - 0.03,
                         "boot_high": g + 0.05},
             "absolute": {"acceptance_rate": 0.61, "mean_acceptance_length": 2.83},
             "repeats": [{"arm_deployment": f"{arm}-{w}", "base_deployment": f"baseline-{w}"}]}
            for w, c, g in (("open_chat", 8, 1.12), ("code", 1, 1.31))]


def _deps(arm):
    out = []
    for w in ("open_chat", "code"):
        for a in (arm, "baseline"):
            out.append({"deployment_id": f"{a}-{w}", "arm": a, "phase": "confirm", "status": "ok",
                        "arm_spec": json.dumps(ARMS.get(a, {"name": "baseline", "method": "baseline"})),
                        "provenance.software.vllm_version_from_log": "0.23.1rc1.dev1029+ga601a9d99",
                        "provenance.project.revision": "16fff42aaaaabbbbccccdddd", "provenance.project.dirty": False})
    return out


def test_an_enabled_arm_gives_an_applicable_patch_and_the_evidence(tmp_path):
    res = model_launch.write(tmp_path, _rec(), _comps("draft-k5-tp4"), _deps("draft-k5-tp4"), CONFIG)
    assert res["patch"] == "model-launch.patch" and res["arm"] == "draft-k5-tp4" and res["why"] is None
    man = load_manifest(MANIFEST)
    new = git_apply(tmp_path, man, (tmp_path / "model-launch.patch").read_text())
    assert example_flags(new)["num_speculative_tokens"] == "5"
    md = (tmp_path / "model-launch-pr.md").read_text()
    assert md.startswith("# Apertus-v1.5-70B-spec-decode: draft model swiss-ai/Apertus-v1.5-8B, 5 speculative tokens, "
                         "draft TP 4 (measured)\n")
    assert "| `--speculative-config.num_speculative_tokens` | 3 | 5 |" in md
    assert ("| draft-k5-tp4 | code | 1 | 1.310 | [1.270, 1.350] | [1.280, 1.360] | 5 | 0.610 | 2.83 | pass | met | "
            "0.23.1rc1.dev1029+ga601a9d99 | 16fff42aaaaa |") in md
    assert md.index("| draft-k5-tp4 | code | 1 |") < md.index("| draft-k5-tp4 | open_chat | 8 |")
    assert "c8: gain [1.080, 1.170]" in md
    assert "`--max-model-len`: the study measured 131072, the example sets 262144" in md
    assert "`--no-enable-prefix-caching`" in md
    assert f"Apply at swiss-ai/model-launch@{man['commit']}: `git apply model-launch.patch`" in md


@pytest.mark.parametrize("rec, config, why", [
    (_rec("do_not_enable"), CONFIG, "the decision is do_not_enable"),
    (_rec("insufficient_evidence"), CONFIG, "the decision is insufficient_evidence"),
    ({**_rec("do_not_enable"), "capacity_blocker": "capacity criteria missed: knee"}, CONFIG,
     "(capacity criteria missed: knee)"),
    (_rec("enable_per_workload"), CONFIG, "vllm-args-<workload>.patch"),
    (_rec(), {**CONFIG, "recommendation": {}}, "recommendation.model_launch is not set"),
    (_rec(arm="draft-k3-tp4"), CONFIG, "the example already sets draft-k3-tp4's settings"),
])
def test_nothing_to_propose_writes_an_empty_patch_and_says_why(tmp_path, rec, config, why):
    arm = rec["candidates"][0]["arm"]
    res = model_launch.write(tmp_path, rec, _comps(arm), _deps(arm), config)
    assert res["patch"] is None and why in res["why"]
    assert (tmp_path / "model-launch.patch").read_bytes() == b""
    md = (tmp_path / "model-launch-pr.md").read_text()
    assert md.startswith("# No model-launch change proposed\n") and why in md
