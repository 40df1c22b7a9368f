"""Arm names: the one place that turns an arm spec into its name and a name back into its spec.

An arm is named by its method and the settings that distinguish it in the factorial:

- ``baseline``: no speculation;
- ``draft-k<k>-tp<t>``: ``draft_model`` with ``num_speculative_tokens`` k and ``draft_tensor_parallel_size`` t;
- ``ngram-k<k>``: ``ngram`` (prompt lookup) with ``num_speculative_tokens`` k;
- ``ngram_gpu-k<k>``: ``ngram_gpu`` (prompt lookup on the accelerator) with k;
- ``suffix-k<k>``: ``suffix`` (suffix decoding, the arctic-inference package) with at most k tokens;
- ``eagle-k<k>``, ``eagle3-k<k>``: an EAGLE / EAGLE-3 head (``engine.eagle_head.path``) with k.

A *variant* of an arm (``arms.variants`` in the study config) is that arm with declared extra engine
settings — ``speculative_config`` keys (:data:`SPECULATIVE_OVERRIDES`), server flags, environment — and is
named ``<arm>+<variant>`` (``draft-k3-tp1+eager-draft``). Variants are deployed only where they are named
(``extensions.arms``), never by the factorial's screening; :func:`override_problems` checks their settings.

In a study of several engine builds (``engines`` in the study config) every arm, the baseline included, is
named with its build after ``@``: ``draft-k3-tp1@v026``, ``baseline@v023`` (:func:`engine_of`,
:func:`baseline_of`); with one engine names carry no ``@``.

Which of them the pinned engine serves is a recorded engine fact (:mod:`specstudy.study.engine_methods`,
docs/methods.md), not a property of the name.

``arm_name(parse_arm(name)) == name`` for every valid name. The n-gram window
(``prompt_lookup_min``/``max``) is a study-wide setting, not part of the name.

Upstream (apertus-bench) served-model names spell the depth ``n`` (``draft-n3-tp4``, ``ngram-n3``);
:func:`arm_from_upstream_model` maps them onto ours.
"""

from __future__ import annotations

import re

#: A variant's own name (the part after ``+``).
VARIANT_PATTERN = r"[a-z0-9][a-z0-9_-]*"
#: An engine build's name (the part after ``@``; a key of the study config's ``engines``).
ENGINE_PATTERN = r"[a-z][a-z0-9_]*"
#: The arm-name alternatives, usable as a Snakemake wildcard constraint.
ARM_PATTERN = (r"(?:baseline|draft-k[0-9]+-tp[0-9]+|(?:ngram|ngram_gpu|suffix|eagle|eagle3)-k[0-9]+)"
               r"(?:\+" + VARIANT_PATTERN + r")?(?:@" + ENGINE_PATTERN + r")?")
#: A whole arm name (groups: k and tp of a draft arm; the method prefix and k of any other arm; the variant;
#: the engine build).
ARM_RE = re.compile(r"^(?:baseline|draft-k([0-9]+)-tp([0-9]+)|(ngram|ngram_gpu|suffix|eagle|eagle3)-k([0-9]+))"
                    r"(?:\+(" + VARIANT_PATTERN + r"))?(?:@(" + ENGINE_PATTERN + r"))?$")
#: Methods whose arm is named ``<method>-k<k>`` (the prefix is the vLLM method's own name).
K_METHODS = ("ngram", "ngram_gpu", "suffix", "eagle", "eagle3")
METHODS = ("baseline", "draft_model", *K_METHODS)

_UPSTREAM_RE = re.compile(r"(?:^|[-/])(baseline|draft-n(\d+)-tp(\d+)|ngram-n(\d+))(?:-|$)")


def arm_name(spec: dict) -> str:
    """The name of an arm spec (``baseline``, ``draft-k3-tp1``, ``ngram-k3``, ``suffix-k8``, ...).

    A spec with ``variant`` is named ``<arm>+<variant>``, one with ``engine`` (a study of several engine
    builds) ``<arm>@<engine>`` (``draft-k3-tp1+eager-draft@v026``). Raises :class:`ValueError` for a method not in
    :data:`METHODS`.
    """
    method = spec.get("method")
    if method == "baseline":
        base = "baseline"
    elif method == "draft_model":
        base = f"draft-k{spec['num_speculative_tokens']}-tp{spec['draft_tensor_parallel_size']}"
    elif method in K_METHODS:
        base = f"{method}-k{spec['num_speculative_tokens']}"
    else:
        raise ValueError(f"arm {spec!r}: field 'method' must be one of {', '.join(METHODS)}")
    name = f"{base}+{spec['variant']}" if spec.get("variant") else base
    return f"{name}@{spec['engine']}" if spec.get("engine") else name


def parse_arm(name: str) -> dict:
    """The spec fields an arm name fixes: ``name``, ``method`` and, where the method has them,
    ``num_speculative_tokens`` and ``draft_tensor_parallel_size``; ``variant`` for a variant's name (its
    settings are the study config's, not the name's); ``engine`` for an arm of one of several engine builds.

    Raises :class:`ValueError` for a string that is not an arm name.
    """
    m = ARM_RE.match(name or "")
    if not m:
        raise ValueError(f"{name!r} is not an arm name (baseline, draft-k<N>-tp<N> or "
                         f"<method>-k<N> with <method> one of {', '.join(K_METHODS)})")
    variant = {"variant": m[5]} if m[5] else {}
    if m[6]:
        variant["engine"] = m[6]
    if m[1] is not None:
        return {"name": name, "method": "draft_model", "num_speculative_tokens": int(m[1]),
                "draft_tensor_parallel_size": int(m[2]), **variant}
    if m[3] is not None:
        return {"name": name, "method": m[3], "num_speculative_tokens": int(m[4]), **variant}
    return {"name": name, "method": "baseline", **variant}


def is_arm_name(name: object) -> bool:
    return isinstance(name, str) and ARM_RE.match(name) is not None


def arm_from_upstream_model(model: str) -> str:
    """Our arm name for an upstream served-model name (``.../draft-n3-tp4-<stamp>`` -> ``draft-k3-tp4``);
    ``unknown`` when the name carries no arm."""
    m = _UPSTREAM_RE.search(model or "")
    if not m:
        return "unknown"
    if m[1] == "baseline":
        return arm_name({"method": "baseline"})
    if m[2]:
        return arm_name({"method": "draft_model", "num_speculative_tokens": m[2], "draft_tensor_parallel_size": m[3]})
    return arm_name({"method": "ngram", "num_speculative_tokens": m[4]})


# --------------------------------------------------------------------------------------------- variants
#: ``speculative_config`` keys a variant may add, with their JSON types: fields of vLLM's
#: ``SpeculativeConfig`` (vllm/config/speculative.py, 0.23.0) that do not name the arm. The arm's own
#: fields (method, model, num_speculative_tokens, draft_tensor_parallel_size, prompt_lookup_*,
#: suffix_decoding_*) are refused: they would silently make the variant a different arm.
SPECULATIVE_OVERRIDES: dict[str, tuple[type, ...]] = {
    "enforce_eager": (bool,),                 # the drafter without CUDA graphs (overrides the target's)
    "disable_padded_drafter_batch": (bool,),  # EAGLE only in 0.23; draft_model refuses it (a failure record is data)
    "parallel_drafting": (bool,),
    "attention_backend": (str,),
    "max_model_len": (int,),
    "quantization": (str,),
    "draft_sample_method": (str,),
    "rejection_sample_method": (str,),
}
#: The settings a variant adds to its arm's spec (and to the arm's deployment).
VARIANT_SETTINGS = ("speculative_config", "extra_args", "env")
#: Server flags a variant may not carry: the deployment sets them (the same list as the engine's extra_args).
FORBIDDEN_FLAGS = ("--speculative-config", "--speculative_config", "--port", "--served-model-name")


def override_problems(where: str, method: str | None, speculative_config, extra_args, env) -> list[str]:
    """What is wrong with a variant's settings, each problem naming ``where`` (e.g. ``arms.variants[0]``),
    the field and the fix; empty when they are fine."""
    out: list[str] = []
    spec = speculative_config if speculative_config is not None else {}
    if not isinstance(spec, dict):
        out.append(f"field '{where}.speculative_config': must be a mapping of SpeculativeConfig keys, "
                   f"got {type(spec).__name__}")
        spec = {}
    if spec and method == "baseline":
        out.append(f"field '{where}.speculative_config': the baseline has no speculative config; "
                   f"use extra_args or env for a baseline variant")
    for key, value in spec.items():
        kinds = SPECULATIVE_OVERRIDES.get(key)
        if kinds is None:
            out.append(f"field '{where}.speculative_config.{key}': unknown or arm-defining key; use one of "
                       f"{', '.join(SPECULATIVE_OVERRIDES)} (the arm's name fixes method, model and k)")
        elif (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            out.append(f"field '{where}.speculative_config.{key}': must be a {kinds[0].__name__}, got {value!r}")
    args = extra_args if extra_args is not None else []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        out.append(f"field '{where}.extra_args': must be a list of strings, one argument per item")
        args = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in FORBIDDEN_FLAGS:
            out.append(f"field '{where}.extra_args': must not contain {flag}; the deployment sets it "
                       f"(speculative settings go under speculative_config)")
    environ = env if env is not None else {}
    if not isinstance(environ, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in environ.items()):
        out.append(f"field '{where}.env': must map variable names to strings")
    if not spec and not args and not environ:
        out.append(f"field '{where}': declares no setting; give speculative_config, extra_args or env")
    return out


# ------------------------------------------------------------------------------------------ engine builds
#: A baseline arm of any engine build (the drift deployments' wildcard constraint).
BASELINE_PATTERN = r"baseline(?:@" + ENGINE_PATTERN + r")?"


def engine_of(name: str) -> str | None:
    """The engine build an arm name names (``draft-k3-tp1@v026`` -> ``v026``); None for a study of one engine."""
    return parse_arm(name).get("engine")


def baseline_of(name: str) -> str:
    """The baseline an arm is compared with: the baseline of its own engine build (``draft-k3-tp1@v026`` ->
    ``baseline@v026``; ``draft-k3-tp1`` -> ``baseline``)."""
    return arm_name({"method": "baseline", "engine": engine_of(name)})


def is_baseline(name: object) -> bool:
    """Whether ``name`` is a baseline arm (of any engine build; a baseline variant is not)."""
    if not is_arm_name(name):
        return False
    spec = parse_arm(name)
    return spec["method"] == "baseline" and "variant" not in spec
