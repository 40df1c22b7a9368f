"""Arm names: the one place that turns an arm spec into its name and a name back into its spec.

An arm is named by its method and the settings that distinguish it in the factorial, as the method's
registration declares (:mod:`specstudy.core.methods`, the registry of speculative methods):

- ``baseline``: no speculation;
- ``draft-k<k>-tp<t>``: ``draft_model`` with ``num_speculative_tokens`` k and ``draft_tensor_parallel_size`` t;
- ``<method>-k<k>``: every other registered method (``ngram``, ``ngram_gpu``, ``suffix``, ``eagle``, ...) with k.

A *variant* of an arm (``arms.variants`` in the study config) is that arm with declared extra engine
settings — ``speculative_config`` keys (:data:`SPECULATIVE_OVERRIDES`), server flags, environment — and is
named ``<arm>+<variant>`` (``draft-k3-tp1+eager-draft``). Variants are deployed only where they are named
(``extensions.arms``), never by the factorial's screening; :func:`override_problems` checks their settings.

In a study of several engine builds (``engines`` in the study config) every arm, the baseline included, is
named with its build after ``@``: ``draft-k3-tp1@v026``, ``baseline@v023`` (:func:`engine_of`,
:func:`baseline_of`); with one engine names carry no ``@``.

Which of them an engine build serves is a recorded engine fact (:mod:`specstudy.study.engine_methods`,
docs/methods.md), not a property of the name.

``arm_name(parse_arm(name)) == name`` for every valid name. The n-gram window
(``prompt_lookup_min``/``max``) is a study-wide setting, not part of the name.

``ARM_PATTERN``, ``ARM_RE``, ``K_METHODS`` and ``METHODS`` are read from the registry when asked for (a
method registered later, as a test does, is in them).

Upstream (apertus-bench) served-model names spell the depth ``n`` (``draft-n3-tp4``, ``ngram-n3``);
:func:`arm_from_upstream_model` maps them onto ours.
"""

from __future__ import annotations

import re

from specstudy.core import methods as _methods
from specstudy.core.methods import ENGINE_PATTERN, VARIANT_PATTERN  # noqa: F401  (re-exported)


def __getattr__(name: str):
    """The registry's current arm grammar: ``ARM_PATTERN`` (the arm-name alternatives, usable as a Snakemake
    wildcard constraint), ``ARM_RE`` (a whole arm name), ``K_METHODS`` (methods named ``<method>-k<k>``),
    ``METHODS`` (``baseline`` and every registered method)."""
    if name == "ARM_PATTERN":
        return _methods.arm_pattern()
    if name == "ARM_RE":
        return _methods.arm_re()
    if name == "K_METHODS":
        return tuple(m.name for m in _methods.registered() if m.levels == (_methods.K,) and m.arm_prefix == m.name)
    if name == "METHODS":
        return _methods.arm_methods()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_UPSTREAM_RE = re.compile(r"(?:^|[-/])(baseline|draft-n(\d+)-tp(\d+)|ngram-n(\d+))(?:-|$)")


def arm_name(spec: dict) -> str:
    """The name of an arm spec (``baseline``, ``draft-k3-tp1``, ``ngram-k3``, ``suffix-k8``, ...).

    A spec with ``variant`` is named ``<arm>+<variant>``, one with ``engine`` (a study of several engine
    builds) ``<arm>@<engine>`` (``draft-k3-tp1+eager-draft@v026``). Raises :class:`ValueError` for a method
    that is not registered (the message names the nearest registered one).
    """
    try:
        base = _methods.name_of(spec)
    except KeyError as exc:
        raise ValueError(f"arm {spec!r}: {exc.args[0]}") from None
    name = f"{base}+{spec['variant']}" if spec.get("variant") else base
    return f"{name}@{spec['engine']}" if spec.get("engine") else name


def parse_arm(name: str) -> dict:
    """The spec fields an arm name fixes: ``name``, ``method`` and, where the method has them,
    ``num_speculative_tokens`` and ``draft_tensor_parallel_size``; ``variant`` for a variant's name (its
    settings are the study config's, not the name's); ``engine`` for an arm of one of several engine builds.

    Raises :class:`ValueError` for a string that is not an arm name (naming the nearest registered method
    where it looks like an arm of an unregistered one).
    """
    fields = _methods.fields_of(name.split("@", 1)[0].split("+", 1)[0]) if _methods.arm_re().match(name or "") else None
    if fields is None:
        unknown = _methods.method_of_unknown_arm(name)
        near = _methods.nearest(unknown) if unknown else None
        hint = f"; {unknown!r} is not a registered method" + (f" (did you mean {near!r}?)" if near else "") if unknown else ""
        raise ValueError(f"{name!r} is not an arm name (baseline, draft-k<N>-tp<N> or <method>-k<N> with <method> "
                         f"one of {', '.join(m.name for m in _methods.registered() if m.levels == (_methods.K,))}){hint}")
    arm, _, engine = name.partition("@")
    variant = arm.split("+", 1)[1] if "+" in arm else None
    return {"name": name, **fields, **({"variant": variant} if variant else {}), **({"engine": engine} if engine else {})}


def is_arm_name(name: object) -> bool:
    return isinstance(name, str) and _methods.arm_re().match(name) is not None


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
    method_decl = _methods.find(method)
    if method_decl is not None:  # what the engine refuses with this method (core.methods: Forbidden)
        out.extend(method_decl.forbidden_problems(where, spec, args))
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
