"""Arm names: the one place that turns an arm spec into its name and a name back into its spec.

An arm is named by its method and the settings that distinguish it in the factorial:

- ``baseline``: no speculation;
- ``draft-k<k>-tp<t>``: ``draft_model`` with ``num_speculative_tokens`` k and ``draft_tensor_parallel_size`` t;
- ``ngram-k<k>``: ``ngram`` (prompt lookup) with ``num_speculative_tokens`` k;
- ``ngram_gpu-k<k>``: ``ngram_gpu`` (prompt lookup on the accelerator) with k;
- ``suffix-k<k>``: ``suffix`` (suffix decoding, the arctic-inference package) with at most k tokens;
- ``eagle-k<k>``, ``eagle3-k<k>``: an EAGLE / EAGLE-3 head (``engine.eagle_head.path``) with k.

Which of them the pinned engine serves is a recorded engine fact (:mod:`specstudy.study.engine_methods`,
docs/methods.md), not a property of the name.

``arm_name(parse_arm(name)) == name`` for every valid name. The n-gram window
(``prompt_lookup_min``/``max``) is a study-wide setting, not part of the name.

Upstream (apertus-bench) served-model names spell the depth ``n`` (``draft-n3-tp4``, ``ngram-n3``);
:func:`arm_from_upstream_model` maps them onto ours.
"""

from __future__ import annotations

import re

#: The arm-name alternatives, usable as a Snakemake wildcard constraint.
ARM_PATTERN = r"baseline|draft-k[0-9]+-tp[0-9]+|(?:ngram|ngram_gpu|suffix|eagle|eagle3)-k[0-9]+"
#: A whole arm name (groups: k and tp of a draft arm; the method prefix and k of any other arm).
ARM_RE = re.compile(r"^(?:baseline|draft-k([0-9]+)-tp([0-9]+)|(ngram|ngram_gpu|suffix|eagle|eagle3)-k([0-9]+))$")
#: Methods whose arm is named ``<method>-k<k>`` (the prefix is the vLLM method's own name).
K_METHODS = ("ngram", "ngram_gpu", "suffix", "eagle", "eagle3")
METHODS = ("baseline", "draft_model", *K_METHODS)

_UPSTREAM_RE = re.compile(r"(?:^|[-/])(baseline|draft-n(\d+)-tp(\d+)|ngram-n(\d+))(?:-|$)")


def arm_name(spec: dict) -> str:
    """The name of an arm spec (``baseline``, ``draft-k3-tp1``, ``ngram-k3``, ``suffix-k8``, ...).

    Raises :class:`ValueError` for a method not in :data:`METHODS`.
    """
    method = spec.get("method")
    if method == "baseline":
        return "baseline"
    if method == "draft_model":
        return f"draft-k{spec['num_speculative_tokens']}-tp{spec['draft_tensor_parallel_size']}"
    if method in K_METHODS:
        return f"{method}-k{spec['num_speculative_tokens']}"
    raise ValueError(f"arm {spec!r}: field 'method' must be one of {', '.join(METHODS)}")


def parse_arm(name: str) -> dict:
    """The spec fields an arm name fixes: ``name``, ``method`` and, where the method has them,
    ``num_speculative_tokens`` and ``draft_tensor_parallel_size``.

    Raises :class:`ValueError` for a string that is not an arm name.
    """
    m = ARM_RE.match(name or "")
    if not m:
        raise ValueError(f"{name!r} is not an arm name (baseline, draft-k<N>-tp<N> or "
                         f"<method>-k<N> with <method> one of {', '.join(K_METHODS)})")
    if name == "baseline":
        return {"name": name, "method": "baseline"}
    if m[1] is not None:
        return {"name": name, "method": "draft_model", "num_speculative_tokens": int(m[1]),
                "draft_tensor_parallel_size": int(m[2])}
    return {"name": name, "method": m[3], "num_speculative_tokens": int(m[4])}


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
