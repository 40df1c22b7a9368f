"""The speculative methods: each declared once, here, and every reader reads this registry.

A method is one :class:`Method` passed to :func:`register` (GuideLLM's profile kinds in spirit: a small
frozen declaration per kind, registered by name). What it declares:

- **its arm names**: ``<prefix>`` followed by one ``-<letter><n>`` per :class:`Level` (``draft_model`` ->
  ``draft-k<k>-tp<t>``, every other method ``<method>-k<k>``); :mod:`specstudy.core.arms` builds the
  wildcard pattern, the parser and the namer from these declarations, and the record schemas' arm-name
  patterns and method enums are generated from them (:func:`sync_schema_text`);
- **its ``--speculative-config``** (:meth:`Method.speculative_config`): the levels, the model directory of
  its own where it loads one (:class:`ModelPath`: the draft for ``draft_model``; the head or drafter for
  ``eagle``, ``eagle3`` and ``dspark``; ``mtp`` reads the target's own MTP layers), and the study-wide
  settings its arms carry (:class:`Settings`: the n-gram window, the suffix-decoding keys);
- **what the engine refuses with it** (:class:`Forbidden`: a server flag or a ``speculative_config`` key);
- **where its servability is recorded**: ``probe`` names the entry of the engine's recorded probe
  (:mod:`specstudy.study.engine_methods`, the one source of *whether* an engine build serves it); ``None``
  for the methods the study measures directly (``draft_model``, ``ngram``);
- **the confounds to read from its launch log** (:data:`CONFOUNDS`, :func:`read_confounds`).

``baseline`` (no speculation) is no method: it is the arm every method is compared with.

Adding a method is one :func:`register` call below and its test (docs/methods.md, "Adding a method").
vLLM facts cited here are from ``vllm/config/speculative.py`` and ``vllm/config/vllm.py`` of 0.26.0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

#: The no-speculation arm (and its ``method`` in arm specs and records).
BASELINE = "baseline"
#: A method's name (vLLM's ``speculative_config.method``) and an arm-name prefix.
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
#: A variant's own name (the part after ``+`` in ``<arm>+<variant>``).
VARIANT_PATTERN = r"[a-z0-9][a-z0-9_-]*"
#: An engine build's name (the part after ``@`` of an arm of a study of several builds; a key of ``engines``).
ENGINE_PATTERN = r"[a-z][a-z0-9_]*"


@dataclass(frozen=True)
class Level:
    """One factor of an arm's name, ``-<letter><n>``: the arm spec's ``field``, whose levels the study
    config lists as ``arms.<field>``."""

    letter: str
    field: str
    example: str = "[1, 2]"


#: The speculation depth, in every method's name.
K = Level("k", "num_speculative_tokens", "[2, 3, 5, 8]")
#: The draft model's tensor parallelism (``draft_model`` only).
TP = Level("tp", "draft_tensor_parallel_size", "[1, 4]")


@dataclass(frozen=True)
class ModelPath:
    """A model directory of its own that a method loads (``speculative_config.model``), declared in the
    study config as ``engine.<section>.path`` and carried by the launcher's flat settings as ``flat``.

    ``command_needs``: without it no launch command is built; otherwise the command goes without it and the
    engine's refusal is the recorded fact (how the probe records a head that does not exist)."""

    section: str
    flat: str
    what: str
    placeholder: str
    command_needs: bool = False

    @property
    def field(self) -> str:
        return f"engine.{self.section}.path"


@dataclass(frozen=True)
class Settings:
    """Study-wide settings every arm of the method carries (``arms.<section>`` in the study config), not
    part of its name: each ``key`` becomes the arm spec's and ``--speculative-config``'s ``prefix + key``."""

    section: str
    keys: dict[str, type]
    prefix: str = ""
    required: bool = False
    probe_defaults: dict[str, object] = field(default_factory=dict)
    check: Callable[[dict], list[str]] | None = None

    def spec_fields(self) -> dict[str, type]:
        return {self.prefix + k: t for k, t in self.keys.items()}

    def arm_fields(self, section: dict) -> dict:
        """The arm-spec fields the study's ``arms.<section>`` sets (absent keys keep vLLM's defaults)."""
        return {self.prefix + k: section[k] for k in self.keys if k in (section or {})}


@dataclass(frozen=True)
class Forbidden:
    """A combination the engine refuses with this method: a server ``flag`` (in the study's or a variant's
    ``extra_args``) or a ``speculative_config`` ``key`` a variant may not set; ``why`` cites the engine."""

    why: str
    flag: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class Confound:
    """One confound the launch log states: ``path`` into :func:`specstudy.deployment.launchlog.parse_launch_log`'s
    record, or None where no log line states it (``why`` says where it is read instead)."""

    name: str
    path: tuple[str, ...] | None
    why: str


#: Every confound a method may declare, by name.
CONFOUNDS: dict[str, Confound] = {c.name: c for c in (
    Confound("async_scheduling", ("async_scheduling", "enabled"),
             "vLLM turns async scheduling off for methods it does not support with it "
             "('Async scheduling not supported with <method>-based speculative decoding and will be disabled.')"),
    Confound("model_runner", ("model_runner",),
             "Model Runner V2 falls back to the V1 model runner for methods it does not support yet"),
    Confound("token_budget", ("scheduled_tokens_reduced",),
             "max_num_scheduled_tokens is lowered below max_num_batched_tokens to leave room for the draft tokens"),
    Confound("drafter_cuda_graphs", None,
             "whether the drafter runs under CUDA graphs: vLLM 0.23's launch log has no line for it (docs/profile.md); "
             "0.26's captures log 'Capturing <method> CUDA graphs' without the log prefix; read from the profile phase"),
)}
#: What every speculative method's launch log is read for; a method with a drafter network adds its graphs.
SPECULATIVE_CONFOUNDS = ("async_scheduling", "model_runner", "token_budget")
DRAFTER_CONFOUNDS = (*SPECULATIVE_CONFOUNDS, "drafter_cuda_graphs")


@dataclass(frozen=True)
class Method:
    """One speculative method (see the module docstring)."""

    name: str
    what: str
    prefix: str = ""
    levels: tuple[Level, ...] = (K,)
    model: ModelPath | None = None
    settings: Settings | None = None
    probe: str | None = None
    confounds: tuple[str, ...] = SPECULATIVE_CONFOUNDS
    forbidden: tuple[Forbidden, ...] = ()

    @property
    def arm_prefix(self) -> str:
        return self.prefix or self.name

    def arm_fields(self) -> tuple[str, ...]:
        """The arm-spec fields its name fixes."""
        return tuple(lv.field for lv in self.levels)

    def required_fields(self) -> tuple[str, ...]:
        """The arm-spec fields a launch needs: its levels and its required settings."""
        extra = tuple(self.settings.spec_fields()) if self.settings and self.settings.required else ()
        return (*self.arm_fields(), *extra)

    def speculative_config(self, arm: dict, models: dict) -> dict:
        """The ``--speculative-config`` object of an arm of this method; ``models`` holds the launcher's flat
        model paths (``draft_model``, ``eagle_head``, ...). Raises :class:`KeyError` (naming ``flat``) where
        the method's model is needed and missing."""
        spec = {"method": self.name, **{f: arm[f] for f in self.arm_fields()}}
        if self.model is not None:
            path = models.get(self.model.flat)
            if path:
                spec["model"] = str(path)
            elif self.model.command_needs:
                raise KeyError(self.model.flat)
        if self.settings is not None:
            spec.update({f: arm[f] for f in self.settings.spec_fields() if f in arm})
        return spec

    def forbidden_problems(self, where: str, speculative_config: dict | None, flags: list[str] | None) -> list[str]:
        """What of a variant's or the study's settings the engine refuses with this method, each naming
        ``where`` and the fix."""
        out = []
        flag_names = {str(a).split("=", 1)[0] for a in flags or []}
        for rule in self.forbidden:
            if rule.flag and rule.flag in flag_names:
                out.append(f"field '{where}.extra_args': {rule.flag} with method {self.name} is refused by the "
                           f"engine ({rule.why}); remove it")
            if rule.key and rule.key in (speculative_config or {}):
                out.append(f"field '{where}.speculative_config.{rule.key}': not settable for method {self.name} "
                           f"({rule.why}); remove it")
        return out


# --------------------------------------------------------------------------------------------- the registry
_REGISTRY: dict[str, Method] = {}
_DERIVED: dict[str, object] = {}


def register(method: Method) -> Method:
    """Add a method; its name and arm prefix must be new (an arm name must say which method it is)."""
    for what, value in (("name", method.name), ("arm prefix", method.arm_prefix)):
        if not NAME_RE.match(value) or value == BASELINE:
            raise ValueError(f"method {method.name!r}: {what} {value!r} must match {NAME_RE.pattern} and not be "
                             f"{BASELINE!r}")
    if method.name in _REGISTRY:
        raise ValueError(f"method {method.name!r} is registered already")
    if any(m.arm_prefix == method.arm_prefix for m in _REGISTRY.values()):
        raise ValueError(f"method {method.name!r}: arm prefix {method.arm_prefix!r} is taken")
    if not method.levels or method.levels[0] != K:
        raise ValueError(f"method {method.name!r}: its first level must be k (num_speculative_tokens)")
    unknown = set(method.confounds) - set(CONFOUNDS)
    if unknown:
        raise ValueError(f"method {method.name!r}: confounds {sorted(unknown)} are not in CONFOUNDS")
    _REGISTRY[method.name] = method
    _DERIVED.clear()
    return method


def unregister(name: str) -> None:
    """Remove a method (a test's throwaway registration)."""
    del _REGISTRY[name]
    _DERIVED.clear()


def registered() -> tuple[Method, ...]:
    """Every method, in registration order."""
    return tuple(_REGISTRY.values())


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def arm_methods() -> tuple[str, ...]:
    """Every ``method`` an arm spec may have: the baseline and the registered methods."""
    return (BASELINE, *_REGISTRY)


def find(name: object) -> Method | None:
    return _REGISTRY.get(name) if isinstance(name, str) else None


def nearest(name: object) -> str | None:
    """The registered method (or ``baseline``) closest to ``name`` (rapidfuzz), None when nothing is close."""
    from rapidfuzz import process

    hit = process.extractOne(str(name), arm_methods(), score_cutoff=60)
    return hit[0] if hit else None


def unknown_method(name: object, field_name: str) -> str:
    """The message for a method that is not registered: the field, the nearest name, the fix."""
    near = nearest(name)
    hint = f"did you mean {near!r}? " if near else ""
    return (f"field '{field_name}': {name!r} is not a registered speculative method; {hint}use one of "
            f"{', '.join(arm_methods())} (methods are registered in specstudy.core.methods, docs/methods.md)")


def get(name: object, field_name: str = "method") -> Method:
    """The registered method ``name``; :class:`KeyError` with :func:`unknown_method`'s message otherwise."""
    m = find(name)
    if m is None:
        raise KeyError(unknown_method(name, field_name))
    return m


def model_paths() -> tuple[ModelPath, ...]:
    """Every distinct model directory a registered method loads (the engine config's sections)."""
    return tuple({m.model.section: m.model for m in _REGISTRY.values() if m.model}.values())


def settings_sections() -> dict[str, Settings]:
    """``arms.<section>`` -> its declaration (methods may share one: ngram and ngram_gpu share the window)."""
    return {m.settings.section: m.settings for m in _REGISTRY.values() if m.settings}


def methods_with_settings(section: str) -> tuple[str, ...]:
    return tuple(m.name for m in _REGISTRY.values() if m.settings and m.settings.section == section)


def probe_methods() -> tuple[str, ...]:
    """The methods whose servability the engine's recorded probe says (``probe`` set)."""
    return tuple(m.name for m in _REGISTRY.values() if m.probe)


def read_confounds(method: str, parsed: dict) -> dict:
    """The confounds ``method`` declares, read from a parsed launch log
    (:func:`specstudy.deployment.launchlog.parse_launch_log`): ``{name: value}``, None where the log
    states nothing (or no log line exists for it: :data:`CONFOUNDS`)."""
    m = find(method)
    out = {}
    for name in (m.confounds if m else ()):
        value = parsed if CONFOUNDS[name].path else None
        for key in CONFOUNDS[name].path or ():
            value = value.get(key) if isinstance(value, dict) else None
        out[name] = value
    return out


# --------------------------------------------------------------------------------------------- arm names
def arm_pattern() -> str:
    """The arm-name alternatives (variants and engine builds included), usable as a Snakemake wildcard constraint: methods
    with the same levels share one alternative, ``(?:a|b)-k[0-9]+``."""
    if "pattern" not in _DERIVED:
        groups: dict[tuple[str, ...], list[str]] = {}
        for m in _REGISTRY.values():
            groups.setdefault(tuple(lv.letter for lv in m.levels), []).append(m.arm_prefix)
        alts = [BASELINE]
        for letters, prefixes in groups.items():
            tail = "".join(f"-{letter}[0-9]+" for letter in letters)
            alts.append((prefixes[0] if len(prefixes) == 1 else f"(?:{'|'.join(prefixes)})") + tail)
        _DERIVED["pattern"] = ("(?:" + "|".join(alts) + r")(?:\+" + VARIANT_PATTERN + r")?(?:@" + ENGINE_PATTERN
                               + r")?")
    return _DERIVED["pattern"]  # type: ignore[return-value]


def arm_re() -> re.Pattern:
    """A whole arm name."""
    if "re" not in _DERIVED:
        _DERIVED["re"] = re.compile("^" + arm_pattern() + "$")
    return _DERIVED["re"]  # type: ignore[return-value]


def _name_res() -> list[tuple[Method, re.Pattern]]:
    if "names" not in _DERIVED:
        _DERIVED["names"] = [(m, re.compile("^" + re.escape(m.arm_prefix)
                                            + "".join(f"-{lv.letter}([0-9]+)" for lv in m.levels) + "$"))
                             for m in _REGISTRY.values()]
    return _DERIVED["names"]  # type: ignore[return-value]


def name_of(spec: dict) -> str:
    """The name of a non-variant arm spec; :class:`KeyError` for a method that is not registered."""
    if spec.get("method") == BASELINE:
        return BASELINE
    m = get(spec.get("method"))
    return m.arm_prefix + "".join(f"-{lv.letter}{spec[lv.field]}" for lv in m.levels)


def fields_of(base: str) -> dict | None:
    """The spec fields a non-variant arm name fixes (``method`` and its levels), None for a non-name."""
    if base == BASELINE:
        return {"method": BASELINE}
    for m, rx in _name_res():
        hit = rx.match(base)
        if hit:
            return {"method": m.name, **{lv.field: int(v) for lv, v in zip(m.levels, hit.groups(), strict=True)}}
    return None


def method_of_unknown_arm(name: str) -> str | None:
    """For a string shaped like an arm of a method that is not registered (``dsprak-k7``), that method's
    name; None otherwise."""
    hit = re.match(r"^([a-z][a-z0-9_]*)-k[0-9]+(?:-tp[0-9]+)?(?:\+[^@]*)?(?:@.*)?$", name or "")
    if hit and hit[1] not in _REGISTRY and not any(m.arm_prefix == hit[1] for m in _REGISTRY.values()):
        return hit[1]
    return None


# --------------------------------------------------------------------------------------------- schemas
def _is_arm_pattern(value: str) -> bool:
    return "draft-k" in value and BASELINE in value


def _is_method_enum(values: list) -> bool:
    return BASELINE in values and "draft_model" in values


def sync_schema_text(text: str) -> str:
    """A schema file's text with every arm-name ``pattern`` set to :func:`arm_pattern` and every method
    ``enum`` set to :func:`arm_methods`, in the file's own layout; the rest of the text unchanged."""
    pattern = json.dumps(f"^{arm_pattern()}$")

    def fix_pattern(m: re.Match) -> str:
        return m[1] + pattern if _is_arm_pattern(json.loads(m[2])) else m[0]

    def fix_enum(m: re.Match) -> str:
        if not _is_method_enum(json.loads(m[2])):
            return m[0]
        items = list(arm_methods())
        if "\n" not in m[2]:
            return m[1] + json.dumps(items)
        inner = re.search(r"\n([ \t]*)\S", m[2])[1]
        close = re.search(r"\n([ \t]*)\]$", m[2])
        return m[1] + "[\n" + ",\n".join(inner + json.dumps(x) for x in items) + "\n" + (close[1] if close else "") + "]"

    text = re.sub(r'("pattern":\s*)("(?:[^"\\]|\\.)*")', fix_pattern, text)
    return re.sub(r'("enum":\s*)(\[[^\]]*\])', fix_enum, text)


# --------------------------------------------------------------------------------------------- the methods
def _ngram_window_check(section: dict) -> list[str]:
    lo, hi = section.get("prompt_lookup_min"), section.get("prompt_lookup_max")
    if lo is not None and hi is not None and lo > hi:
        return [f"field 'arms.ngram.prompt_lookup_min': {lo} > prompt_lookup_max {hi}; make min <= max"]
    return []


NGRAM_WINDOW = Settings("ngram", {"prompt_lookup_min": int, "prompt_lookup_max": int}, required=True,
                        probe_defaults={"prompt_lookup_min": 2, "prompt_lookup_max": 4}, check=_ngram_window_check)
SUFFIX_SETTINGS = Settings("suffix", {"max_tree_depth": int, "max_cached_requests": int, "max_spec_factor": float,
                                      "min_token_prob": float}, prefix="suffix_decoding_")
DRAFT = ModelPath("draft", "draft_model", "the draft model directory", "<draft model path>", command_needs=True)
EAGLE_HEAD = ModelPath("eagle_head", "eagle_head", "the EAGLE head directory", "<EAGLE head path>")
DSPARK_DRAFTER = ModelPath("dspark_drafter", "dspark_drafter", "the DSpark drafter directory", "<DSpark drafter path>")
#: vLLM 0.26 config/vllm.py: an explicit --async-scheduling is a ValueError unless the method is EAGLE/MTP,
#: draft_model, ngram_gpu or dspark ("Currently, async scheduling is only supported with ...").
NO_ASYNC = Forbidden("vLLM >= 0.26 accepts an explicit --async-scheduling only with EAGLE/MTP, draft_model, "
                     "ngram_gpu and dspark", flag="--async-scheduling")

register(Method("draft_model", "a smaller model of the target's vocabulary drafts k tokens", prefix="draft",
                levels=(K, TP), model=DRAFT, confounds=DRAFTER_CONFOUNDS))
register(Method("ngram", "prompt lookup: the next k tokens after an earlier match of the last n-gram",
                settings=NGRAM_WINDOW, forbidden=(NO_ASYNC,)))
register(Method("ngram_gpu", "prompt lookup (the same window, arms.ngram) computed on the accelerator",
                settings=NGRAM_WINDOW, probe="ngram_gpu"))
register(Method("suffix", "suffix decoding (Arctic Inference): a suffix tree over prompt and past responses "
                "proposes up to k tokens", settings=SUFFIX_SETTINGS, probe="suffix", forbidden=(NO_ASYNC,)))
register(Method("eagle", "an EAGLE head on the target's hidden states", model=EAGLE_HEAD, probe="eagle",
                confounds=DRAFTER_CONFOUNDS))
register(Method("eagle3", "an EAGLE-3 head on the target's hidden states (several layers)", model=EAGLE_HEAD,
                probe="eagle3", confounds=DRAFTER_CONFOUNDS))
register(Method("mtp", "the target's own multi-token-prediction layers (no separate model)", probe="mtp",
                confounds=DRAFTER_CONFOUNDS))
register(Method("dspark", "a DSpark block drafter (a parallel backbone and a sequential head) on the target's "
                "hidden states", model=DSPARK_DRAFTER, probe="dspark", confounds=DRAFTER_CONFOUNDS,
                forbidden=(Forbidden("vLLM sets parallel_drafting itself for dspark", key="parallel_drafting"),)))
