"""Engine settings, arm specs and the vLLM arguments of an arm: the study's server command and the
recommendation's patch to an operator's own launch arguments.

Every controlled setting comes from the engine config and is identical across arms; only
``--speculative-config`` differs (:func:`strip_speculative` proves it) — except for a declared variant
(``<arm>+<variant>``, :func:`with_variant`), whose extra flags and environment are its stated difference. The recommended arm becomes
flags the same way: :func:`recommended_speculative_config` (the deployment's recorded value, else the
arm spec) and :func:`vllm_args_patch` (the operator's arguments with that ``--speculative-config`` set,
and a unified diff), written by :mod:`specstudy.report.document`.
"""

from __future__ import annotations

import difflib
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from specstudy.core import arms as _arms
from specstudy.core.arms import VARIANT_SETTINGS
from specstudy.study.config import ConfigError

SERVER_MODULE = "vllm.entrypoints.openai.api_server"

ENGINE_DEFAULTS: dict[str, Any] = {
    "backend": "local",
    "python": None,  # local: interpreter with vLLM (default: the harness's own); container: "python3"
    "host": "127.0.0.1",
    "tensor_parallel_size": 1,
    "max_model_len": 512,
    "gpu_memory_utilization": 0.9,
    "max_num_seqs": None,
    "max_num_batched_tokens": None,
    "enforce_eager": False,
    "seed": 0,
    "dtype": None,
    "chat_template": None,
    "extra_args": [],
    "env": {},
    "api_key": None,
    "readiness_timeout_s": 900,
    "readiness_poll_s": 1.0,
    "stop_grace_s": 30,
    "idle_timeout_s": None,
    "server_lock": None,
    "cache_root": None,  # VLLM_CACHE_ROOT shared by all deployments of a study (torch.compile cache)
}


def arm_name(arm: dict) -> str:
    """Canonical name of an arm spec (:func:`specstudy.core.arms.arm_name`); an unknown method is a ConfigError."""
    try:
        return _arms.arm_name(arm)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


#: Optional suffix-decoding settings an arm spec may carry (``arms.suffix`` in the study config).
SUFFIX_FIELDS = {"suffix_decoding_max_tree_depth": int, "suffix_decoding_max_cached_requests": int,
                 "suffix_decoding_max_spec_factor": float, "suffix_decoding_min_token_prob": float}
_NEED = {"baseline": [], "draft_model": ["num_speculative_tokens", "draft_tensor_parallel_size"],
         "ngram": ["num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"],
         "ngram_gpu": ["num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"],
         "suffix": ["num_speculative_tokens"], "eagle": ["num_speculative_tokens"], "eagle3": ["num_speculative_tokens"]}


def validate_arm(arm: dict) -> dict:
    """Check an arm spec (DESIGN.md 'Arm spec'); raise :class:`ConfigError` naming the field and the fix."""
    if not isinstance(arm, dict):
        raise ConfigError(f"arm spec must be a mapping, got {type(arm).__name__}")
    method = arm.get("method")
    if method not in _NEED:
        raise ConfigError(f"arm {arm.get('name')!r}: field 'method' is {method!r}; use one of {', '.join(_NEED)}")
    for key in _NEED[method]:
        val = arm.get(key)
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ConfigError(f"arm {arm.get('name')!r}: field '{key}' must be a positive integer (got {val!r})")
    for key, kind in SUFFIX_FIELDS.items():
        if key in arm and (method != "suffix" or isinstance(arm[key], bool) or not isinstance(arm[key], (int, float))
                           or (kind is int and not isinstance(arm[key], int))):
            raise ConfigError(f"arm {arm.get('name')!r}: field '{key}' is for suffix arms only and must be a "
                              f"{kind.__name__} (got {arm[key]!r})")
    name = arm.get("name")
    if name is None or not _arms.ARM_RE.match(str(name)):
        raise ConfigError(f"arm {name!r}: field 'name' must match baseline|draft-k<N>-tp<N>|<method>-k<N> "
                          f"(<method>: {', '.join(_arms.K_METHODS)})")
    if name != arm_name(arm):
        raise ConfigError(f"arm {name!r}: field 'name' does not match its settings; expected {arm_name(arm)!r}")
    settings = {k: arm[k] for k in VARIANT_SETTINGS if arm.get(k)}
    if settings and not arm.get("variant"):
        raise ConfigError(f"arm {name!r}: field '{next(iter(settings))}' is set but the arm has no 'variant'; "
                          f"declare it as a variant (arms.variants in the study config, named <arm>+<variant>)")
    if arm.get("variant"):
        problems = _arms.override_problems(f"arm {name}", method, arm.get("speculative_config"),
                                           arm.get("extra_args"), arm.get("env"))
        if problems:
            raise ConfigError("; ".join(problems))
    # Note: prompt_lookup_min > prompt_lookup_max is left for vLLM to reject (a failure record is data).
    return arm


def with_variant(engine_cfg: dict, arm: dict) -> dict:
    """The engine settings of ``arm``'s deployment: a variant's ``extra_args`` after the study's, its ``env``
    over the study's; the engine settings unchanged for any other arm."""
    if not (arm.get("extra_args") or arm.get("env")):
        return engine_cfg
    cfg = dict(engine_cfg)
    cfg["extra_args"] = list(cfg.get("extra_args") or []) + [str(a) for a in arm.get("extra_args") or []]
    cfg["env"] = {**(cfg.get("env") or {}), **{str(k): str(v) for k, v in (arm.get("env") or {}).items()}}
    return cfg


def speculative_config(engine_cfg: dict, arm: dict) -> dict | None:
    """The ``--speculative-config`` JSON object of an arm's deployment (None for the baseline)."""
    method = arm["method"]
    if method == "baseline":
        return None
    k = arm["num_speculative_tokens"]
    if method == "draft_model":
        draft = engine_cfg.get("draft_model")
        if not draft:
            raise ConfigError(f"engine config: field 'draft_model' (path of the draft model) is required for arm {arm['name']!r}")
        spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k,
                "draft_tensor_parallel_size": arm["draft_tensor_parallel_size"]}
    elif method in ("ngram", "ngram_gpu"):
        spec = {"method": method, "num_speculative_tokens": k,
                "prompt_lookup_min": arm["prompt_lookup_min"], "prompt_lookup_max": arm["prompt_lookup_max"]}
    elif method == "suffix":
        # k is the upper limit: suffix decoding picks the length of each draft itself (docs/methods.md).
        spec = {"method": "suffix", "num_speculative_tokens": k, **{f: arm[f] for f in SUFFIX_FIELDS if f in arm}}
    else:  # eagle, eagle3: the head is a model of its own, like a draft
        head = engine_cfg.get("eagle_head")
        spec = {"method": method, "num_speculative_tokens": k}
        if head:  # without one vLLM refuses the config itself; that refusal is the recorded engine fact
            spec["model"] = str(head)
    spec.update(engine_cfg.get("speculative_extra") or {})  # same for every speculative arm
    spec.update(arm.get("speculative_config") or {})         # a variant's own keys (checked by validate_arm)
    return spec


def engine_settings(engine_cfg: dict) -> dict:
    cfg = dict(ENGINE_DEFAULTS)
    cfg.update({k: v for k, v in (engine_cfg or {}).items()})
    if not cfg.get("model"):
        raise ConfigError("engine config: field 'model' (path of the target model) is required")
    if cfg["backend"] not in ("local", "container"):
        raise ConfigError(f"engine config: field 'backend' is {cfg['backend']!r}; use 'local' or 'container'")
    if not isinstance(cfg.get("extra_args") or [], list):
        raise ConfigError("engine config: field 'extra_args' must be a list of strings (one argument per item)")
    env_root = (cfg.get("env") or {}).get("VLLM_CACHE_ROOT")
    if cfg.get("cache_root") and env_root and str(Path(env_root)) != str(Path(cfg["cache_root"])):
        raise ConfigError(f"engine config: 'server.cache_root' ({cfg['cache_root']}) and 'server.env.VLLM_CACHE_ROOT' "
                          f"({env_root}) disagree; set only one of them")
    for forbidden in ("--speculative-config", "--speculative_config", "--port", "--served-model-name"):
        for arg in cfg.get("extra_args") or []:
            if str(arg).split("=", 1)[0] == forbidden or str(arg).startswith(forbidden + "."):
                raise ConfigError(f"engine config: field 'extra_args' must not contain {forbidden}; it is set per arm/deployment")
    return cfg


def build_command(engine_cfg: dict, arm: dict, *, port: int, served_model_name: str) -> list[str]:
    """The vLLM OpenAI-server command as an argument list.

    Controlled settings (model, tokenizer, TP, max_model_len, memory, seqs, seed, chat template,
    extra args) come only from ``engine_cfg``; the arm adds ``--speculative-config`` (nothing for
    the baseline) and, for a variant (``<arm>+<variant>``), its declared ``extra_args`` after the study's. The API key is
    never an argument (the launcher passes it as ``VLLM_API_KEY``: :func:`specstudy.deployment.launch.key_env`);
    record the command with :func:`redact_argv` all the same.
    """
    validate_arm(arm)
    cfg = engine_settings(with_variant(engine_cfg, arm))
    python = cfg.get("python") or ("python3" if cfg["backend"] == "container" else sys.executable)
    argv = [str(python), "-m", SERVER_MODULE,
            "--model", str(cfg["model"]),
            "--tokenizer", str(cfg.get("tokenizer") or cfg["model"]),
            "--served-model-name", served_model_name,
            "--host", str(cfg["host"]),
            "--port", str(int(port)),
            "--tensor-parallel-size", str(int(cfg["tensor_parallel_size"])),
            "--max-model-len", str(int(cfg["max_model_len"])),
            "--gpu-memory-utilization", str(cfg["gpu_memory_utilization"]),
            "--seed", str(int(cfg["seed"]))]
    if cfg.get("max_num_seqs"):
        argv += ["--max-num-seqs", str(int(cfg["max_num_seqs"]))]
    if cfg.get("max_num_batched_tokens"):
        argv += ["--max-num-batched-tokens", str(int(cfg["max_num_batched_tokens"]))]
    if cfg.get("dtype"):
        argv += ["--dtype", str(cfg["dtype"])]
    if cfg.get("enforce_eager"):
        argv.append("--enforce-eager")
    if cfg.get("chat_template"):
        argv += ["--chat-template", str(cfg["chat_template"])]
    argv += [str(a) for a in cfg.get("extra_args") or []]
    spec = speculative_config(cfg, arm)
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    return argv


def strip_speculative(argv: list[str]) -> list[str]:
    """The command without its speculative settings (used to prove arms differ only there)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--speculative-config":
            skip = True
            continue
        if a.startswith("--speculative-config"):
            continue
        out.append(a)
    return out


# ---------------------------------------------------------------------------------------------
# The recommendation's flags for an operator's own launch arguments (specstudy.report.document)
# ---------------------------------------------------------------------------------------------
def recommended_speculative_config(arm_spec: dict | None, recorded: str | None = None,
                                   draft_model: str | None = None) -> dict:
    """The ``--speculative-config`` object to recommend for an arm: the deployment's recorded value wins,
    else one built from the arm spec; ``draft_model`` (the production draft path) replaces the model's path."""
    if recorded:
        try:
            cfg = json.loads(recorded)
        except (TypeError, ValueError):
            cfg = None
        if isinstance(cfg, dict):
            if draft_model and "model" in cfg:
                cfg["model"] = draft_model
            return cfg
    spec = arm_spec or {}
    cfg = {"method": spec.get("method"), "num_speculative_tokens": spec.get("num_speculative_tokens")}
    if spec.get("method") == "draft_model":
        cfg["model"] = draft_model or spec.get("model") or "<draft model path>"
        cfg["draft_tensor_parallel_size"] = spec.get("draft_tensor_parallel_size")
    elif spec.get("method") in ("ngram", "ngram_gpu"):
        for k in ("prompt_lookup_min", "prompt_lookup_max"):
            if spec.get(k) is not None:
                cfg[k] = spec[k]
    elif spec.get("method") == "suffix":
        cfg.update({k: spec[k] for k in SUFFIX_FIELDS if spec.get(k) is not None})
    elif spec.get("method") in ("eagle", "eagle3"):
        cfg["model"] = spec.get("model") or "<EAGLE head path>"
    return cfg


def vllm_args_patch(launch_args: list[str], spec_cfg: dict, label: str = "vllm-args") -> tuple[list[str], str]:
    """New argument list with ``--speculative-config '<json>'`` set, and a unified diff (one arg per line)."""
    value = json.dumps(spec_cfg, sort_keys=True, separators=(",", ":"))
    new, skip = [], False
    for i, arg in enumerate(launch_args):
        if skip:
            skip = False
            continue
        if arg.startswith("--speculative-config=") or arg.startswith("--speculative_config="):
            continue
        if arg in ("--speculative-config", "--speculative_config"):
            skip = i + 1 < len(launch_args)
            continue
        new.append(arg)
    new += ["--speculative-config", value]

    def lines(args):
        out, i = [], 0
        while i < len(args):
            if args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
                out.append(f"{args[i]} {shlex.quote(args[i + 1])}\n")
                i += 2
            else:
                out.append(shlex.quote(args[i]) + "\n")
                i += 1
        return out

    diff = "".join(difflib.unified_diff(lines(launch_args), lines(new), f"a/{label}", f"b/{label}"))
    return new, diff
