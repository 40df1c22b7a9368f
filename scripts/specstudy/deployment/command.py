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
from specstudy.core import methods as _methods
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


def _method(arm: dict) -> _methods.Method | None:
    """The registered method of an arm spec (None for the baseline); a ConfigError naming the nearest otherwise."""
    method = arm.get("method")
    if method == _methods.BASELINE:
        return None
    try:
        return _methods.get(method)
    except KeyError as exc:
        raise ConfigError(f"arm {arm.get('name')!r}: {exc.args[0]}") from None


def validate_arm(arm: dict) -> dict:
    """Check an arm spec (DESIGN.md 'Arm spec') against its method's registration; raise :class:`ConfigError`
    naming the field and the fix."""
    if not isinstance(arm, dict):
        raise ConfigError(f"arm spec must be a mapping, got {type(arm).__name__}")
    decl = _method(arm)
    for key in decl.required_fields() if decl else ():
        val = arm.get(key)
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ConfigError(f"arm {arm.get('name')!r}: field '{key}' must be a positive integer (got {val!r})")
    for section, settings in _methods.settings_sections().items():
        if settings.required:  # the n-gram window: checked as required fields of its own methods
            continue
        owners = _methods.methods_with_settings(section)
        for key, kind in settings.spec_fields().items():
            if key in arm and (arm.get("method") not in owners or isinstance(arm[key], bool)
                               or not isinstance(arm[key], (int, float)) or (kind is int and not isinstance(arm[key], int))):
                raise ConfigError(f"arm {arm.get('name')!r}: field '{key}' is for {'/'.join(owners)} arms only and must "
                                  f"be a {kind.__name__} (got {arm[key]!r})")
    name = arm.get("name")
    if name is None or not _arms.is_arm_name(str(name)):
        raise ConfigError(f"arm {name!r}: field 'name' must match baseline|<prefix>-k<N>[-tp<N>] as its method declares "
                          f"({_methods.arm_pattern()})")
    if name != arm_name(arm):
        raise ConfigError(f"arm {name!r}: field 'name' does not match its settings; expected {arm_name(arm)!r}")
    settings = {k: arm[k] for k in VARIANT_SETTINGS if arm.get(k)}
    if settings and not arm.get("variant"):
        raise ConfigError(f"arm {name!r}: field '{next(iter(settings))}' is set but the arm has no 'variant'; "
                          f"declare it as a variant (arms.variants in the study config, named <arm>+<variant>)")
    if arm.get("variant"):
        problems = _arms.override_problems(f"arm {name}", arm.get("method"), arm.get("speculative_config"),
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
    """The ``--speculative-config`` JSON object of an arm's deployment (None for the baseline), as its method's
    registration builds it (:meth:`specstudy.core.methods.Method.speculative_config`)."""
    decl = _method(arm)
    if decl is None:
        return None
    try:
        spec = decl.speculative_config(arm, engine_cfg)
    except KeyError as exc:
        if decl.model is not None and exc.args[0] == decl.model.flat:
            raise ConfigError(f"engine config: field '{decl.model.field}' ({decl.model.what}) is required for arm "
                              f"{arm['name']!r}") from None
        raise ConfigError(f"arm {arm.get('name')!r}: field '{exc.args[0]}' is required for method {decl.name}") from None
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
            decl = _methods.find(cfg.get("method"))
            if draft_model and "model" in cfg and decl is not None and decl.model is _methods.DRAFT:
                cfg["model"] = draft_model  # the production draft replaces the measured one; a head's path stays
            return cfg
    spec = arm_spec or {}
    cfg = {"method": spec.get("method"), "num_speculative_tokens": spec.get("num_speculative_tokens")}
    decl = _methods.find(spec.get("method"))
    if decl is None:
        return cfg
    for f in decl.arm_fields()[1:]:  # the levels after k (draft_tensor_parallel_size)
        cfg[f] = spec.get(f)
    if decl.model is not None:  # the production draft path replaces a draft's recorded path
        cfg["model"] = (draft_model if decl.model is _methods.DRAFT else None) or spec.get("model") or decl.model.placeholder
    if decl.settings is not None:
        cfg.update({k: spec[k] for k in decl.settings.spec_fields() if spec.get(k) is not None})
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
