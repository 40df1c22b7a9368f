"""The study's phases declared, once: what each phase is, how it is checked and what its plan records.

One :class:`PhaseDecl` per phase, core (``screen``, ``confirm``) and opt-in extension (``sampling``,
``ignore_eos``, ``memory``, ``profile``; issue #20, docs/extensions.md), registered with :func:`declare` in
:data:`DECLS`. A declaration holds the facts the lower layers and the workflow need before anything runs —
the Snakemake target, the deployment kind, the report label, the config section's checks, the design its
plan records, the workloads and concurrencies its cells are expanded over, what its summary joins. What a
phase *does* (the deployment step, the summary, the report section) is its behaviour in
:mod:`specstudy.phases` (``phases.registry``), registered under the same name; it reads its design from
the plan alone, as the core phases do.

Each extension phase is planned, deployed and summarised on its own, through the same path as screening
and confirmation: its plan is ``results/plan/<phase>.json`` (:func:`specstudy.study.plan.make_plan`), its
deployments run through the deployment job into ``results/<phase>/<arm>/<rep>/`` and its summary and
report section go to ``results/<phase>/``. No phase is ever pooled with the core results: the tables,
gates, selection and decision read only ``screen`` and ``confirm``. The arms of an extension phase are the
confirmation plan's (baseline, the selection's candidates, the best n-gram) unless ``extensions.arms``
lists them.

Imports ``core`` only (it is read by the rest of ``study``, by the layers above and by the workflow's parse).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specstudy.core.errors import ConfigError

__all__ = ["CORE_PHASES", "DECLS", "EXTENSION_PHASES", "PHASES", "PhaseDecl", "arm_names", "check", "declare", "declared",
           "in_report", "section"]


def _no_check(cfg: dict, section: dict, prereg: dict | None, source: str) -> None:
    return None


def _listed(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, int | str) else list(value)


@dataclass(frozen=True)
class PhaseDecl:
    """One phase's declaration. ``design(cfg, prereg)`` is what its plan records (``plan.design``); for an
    extension phase ``cell_settings`` there override the study's ``cells`` settings in its deployments."""

    name: str
    target: str                   #: the Snakemake target (and Makefile target) that runs the phase
    kind: str                     #: the plan ``kind`` of the phase's deployments
    label: str                    #: the phase's report label
    design: Callable[[dict, dict | None], dict]
    extension: bool = True        #: opt-in, declared under ``extensions.<name>``, never pooled with the core
    check: Callable[[dict, dict, dict | None, str], None] = _no_check  #: cross-field checks of its section
    #: what the summary joins besides the phase's own cells: "natural" (the confirmation cells), "knees"
    joins: Callable[[dict], tuple[str, ...]] = field(default=lambda cfg: ())
    #: the deployment record's ``extension`` field the summary reads (None: the cells)
    artifact: str | None = None
    #: whether its deployments measure cells (the memory phase's run only its sweep)
    has_cells: bool = True
    #: whether ``design`` reads the pre-registration (the plan then loads it when not given)
    needs_prereg: bool = True
    #: directories the summary writes besides summary.json and section.md (the sampling phase's judges)
    summary_dirs: tuple[str, ...] = ()

    def section(self, cfg: dict) -> dict:
        return section(cfg, self.name)

    def cell_workloads(self, cfg: dict) -> list[str]:
        """The workloads the phase's cells are expanded over (as the DAG names their outputs)."""
        if not self.extension:
            return list(cfg["corpora"]["workloads"])
        if not self.has_cells:
            return []
        s = self.section(cfg)
        return list(s.get("workloads") or _listed(s.get("workload")))

    def cell_concurrency(self, cfg: dict) -> list[int]:
        """The concurrencies of an extension phase's cells (a core phase's are its design's)."""
        return _listed(self.section(cfg).get("concurrency")) if self.extension and self.has_cells else []


#: every phase, core first, in the order declared
DECLS: dict[str, PhaseDecl] = {}


def declare(decl: PhaseDecl) -> PhaseDecl:
    if decl.name in DECLS:
        raise ValueError(f"phase {decl.name!r} is declared twice")
    DECLS[decl.name] = decl
    return decl


def section(cfg: dict, phase: str, source: str = "the study config") -> dict:
    """``extensions.<phase>`` of the config; a missing one names the field and the target."""
    if phase not in EXTENSION_PHASES:
        raise ConfigError(f"{source}: {phase!r} is not an extension phase ({', '.join(EXTENSION_PHASES)})")
    s = (cfg.get("extensions") or {}).get(phase)
    if not s:
        raise ConfigError(f"{source}: field 'extensions.{phase}' is missing: declare the phase there to run "
                          f"`snakemake {DECLS[phase].target}` (see config/config.yaml and docs/extensions.md)")
    return s


def _cells(s: dict) -> dict:
    return {k: s[k] for k in ("requests", "warmup_requests") if k in s}


def _head(decl_name: str) -> dict:
    d = DECLS[decl_name]
    return {"kind": d.kind, "label": d.label, "target": d.target}


# ----------------------------------------------------------------------------------- the core phases
def _screen_design(cfg: dict, prereg: dict | None) -> dict:
    return {"concurrency": list(cfg["screen"]["concurrency"]), "repeats": int(cfg["screen"]["repeats"])}


def _confirm_design(cfg: dict, prereg: dict | None) -> dict:
    conf = prereg["confirmation"]
    initial = int(conf["repeats"])
    cap = int((conf.get("stopping") or {}).get("max_repeats", initial))
    # The plan holds every round up to the pre-registered cap; rounds after `repeats` run only when
    # the checkpoint of the round before asks for them (docs/report.md: adaptive confirmation).
    return {"concurrency": list(conf["concurrency"]), "repeats": initial, "max_repeats": max(cap, initial)}


declare(PhaseDecl("screen", target="screen", kind="repeat", extension=False, design=_screen_design, needs_prereg=False,
                  label="Screening: every servable arm, greedy, natural EOS"))
declare(PhaseDecl("confirm", target="confirm", kind="repeat", extension=False, design=_confirm_design,
                  label="Confirmation: the selection's candidates against the baseline, pre-registered rule"))


# ----------------------------------------------------------------------------------- sampling
def _sampling_check(cfg: dict, s: dict, prereg: dict | None, source: str) -> None:
    if not (prereg or {}).get("sampling"):
        raise ConfigError(f"{source}: field 'extensions.sampling' needs the pre-registration's 'sampling' section "
                          "(temperature, seeds, test, margins; docs/sampling.md): add it to the pre-registration "
                          "before the study's screening starts")
    if int(s.get("baseline_repeats", 2)) < 2:
        raise ConfigError(f"{source}: field 'extensions.sampling.baseline_repeats' must be 2 or more: the "
                          "baseline-vs-baseline control needs two independently launched baselines")


def _sampling_design(cfg: dict, prereg: dict | None) -> dict:
    """One sampled capture (every capture prompt x every pre-registered seed), then the cells at the
    pre-registered temperature with per-request seeds."""
    s = section(cfg, "sampling")
    cells = _cells(s)
    sp = dict((prereg or {}).get("sampling") or {})
    seeds = sp["seeds"]
    cells.update(temperature=float(sp["temperature"]), top_p=float(sp.get("top_p", 1.0)),
                 seed_policy="per_request", seed=int(seeds["base"]))
    cap = s["capture"]
    out = _head("sampling")
    out["capture"] = {"workload": cap["workload"], "prompts": int(cap["prompts"]),
                      "concurrency": int(cap.get("concurrency", 1)),
                      "seeds": [int(seeds["base"]) + i for i in range(int(seeds["per_prompt"]))],
                      "temperature": float(sp["temperature"]), "top_p": float(sp.get("top_p", 1.0))}
    out.update(workloads=list(s["workloads"]), concurrency=list(s["concurrency"]),
               repeats=int(s.get("repeats", 1)), baseline_repeats=int(s.get("baseline_repeats", 2)))
    out["cell_settings"] = cells
    return out


declare(PhaseDecl("sampling", target="sampling", kind="repeat", design=_sampling_design, check=_sampling_check,
                  label="Sampling (temperature > 0): kept apart from the greedy results, never pooled",
                  joins=lambda cfg: ("natural",), artifact="sampled_capture", summary_dirs=("gates",)))


# ----------------------------------------------------------------------------------- ignore_eos
def _ignore_eos_design(cfg: dict, prereg: dict | None) -> dict:
    """The cells with a fixed output length per request (``ignore_eos``)."""
    s = section(cfg, "ignore_eos")
    cells = _cells(s)
    cells.update(ignore_eos=True, output_tokens=int(s["output_tokens"]))
    out = _head("ignore_eos")
    out.update(workloads=list(s["workloads"]), concurrency=list(s["concurrency"]),
               repeats=int(s.get("repeats", 1)), baseline_repeats=int(s.get("baseline_repeats", s.get("repeats", 1))))
    out["cell_settings"] = cells
    return out


declare(PhaseDecl("ignore_eos", target="ignore_eos", kind="repeat", design=_ignore_eos_design,
                  label="Fixed output lengths (ignore_eos): isolates serving mechanics; not a study result, "
                        "never pooled with natural-EOS results",
                  joins=lambda cfg: ("natural",)))


# ----------------------------------------------------------------------------------- memory
def _memory_design(cfg: dict, prereg: dict | None) -> dict:
    """The KV-cache sweep: the largest concurrency without preemption per context length."""
    s = section(cfg, "memory")
    workload = s.get("workload") or list(cfg["corpora"]["workloads"])[0]
    out = _head("memory")
    out["sweep"] = {"context_tokens": [int(x) for x in s["context_tokens"]], "output_tokens": int(s["output_tokens"]),
                    "concurrency": sorted(int(x) for x in s["concurrency"]), "workload": workload}
    out["extra_args"] = list(s.get("extra_args") or [])
    out["env"] = dict(s.get("env") or {})
    out.update(workloads=[], concurrency=[], repeats=1, baseline_repeats=1)
    out["cell_settings"] = _cells(s)
    return out


def _memory_joins(cfg: dict) -> tuple[str, ...]:
    """The capacity knees, when the study searches them and ``extensions.memory.join_capacity`` (default on)."""
    join = (cfg.get("capacity") or {}).get("enabled") and section(cfg, "memory").get("join_capacity", True)
    return ("knees",) if join else ()


declare(PhaseDecl("memory", target="memory", kind="memory", design=_memory_design, joins=_memory_joins, has_cells=False,
                  label="Memory capacity: advertised KV cache and the largest concurrency served without preemption",
                  artifact="memory"))


# ----------------------------------------------------------------------------------- profile
def _profile_design(cfg: dict, prereg: dict | None) -> dict:
    """One cell under vLLM's torch profiler; traces kept, time classified."""
    s = section(cfg, "profile")
    cells = _cells(s)
    out = _head("profile")
    out["profile"] = {"vllm_version": s.get("vllm_version")}
    if s.get("max_tokens"):
        cells["max_tokens_cap"] = int(s["max_tokens"])
    out.update(workloads=[s["workload"]], concurrency=[int(s["concurrency"])], repeats=1, baseline_repeats=1)
    out["cell_settings"] = cells
    return out


declare(PhaseDecl("profile", target="profile", kind="profile", design=_profile_design,
                  label="Kernel profile: one profiled cell per arm; timings inflated by the profiler, not "
                        "performance results",
                  artifact="profile"))


#: every phase's name, core first; and the opt-in ones (the config's ``extensions.<phase>``)
PHASES = tuple(DECLS)
CORE_PHASES = tuple(p for p, d in DECLS.items() if not d.extension)
EXTENSION_PHASES = tuple(p for p, d in DECLS.items() if d.extension)


# ----------------------------------------------------------------------------------- across phases
def declared(cfg: dict) -> list[str]:
    """The extension phases the config declares (in :data:`EXTENSION_PHASES` order)."""
    ext = cfg.get("extensions") or {}
    return [p for p in EXTENSION_PHASES if ext.get(p)]


def in_report(cfg: dict) -> list[str]:
    """The phases whose sections the main report includes (``extensions.report``)."""
    return list((cfg.get("extensions") or {}).get("report") or [])


def check(cfg: dict, prereg: dict | None, source: str = "the study config") -> None:
    """Cross-field checks of ``extensions`` (the schema checks the shapes): workloads exist, each phase's own
    checks (the sampling phase has its pre-registration), every phase named in ``report`` is declared."""
    workloads = set(cfg["corpora"]["workloads"])
    for phase in declared(cfg):
        s = section(cfg, phase, source)
        names = list(s.get("workloads") or []) + [x for x in (s.get("workload"), (s.get("capture") or {}).get("workload"))
                                                   if x]
        for w in names:
            if w not in workloads:
                raise ConfigError(f"{source}: field 'extensions.{phase}': workload {w!r} is not under corpora.workloads "
                                  f"({', '.join(sorted(workloads))}); name one of those")
        DECLS[phase].check(cfg, s, prereg, source)
    for phase in in_report(cfg):
        if phase not in declared(cfg):
            raise ConfigError(f"{source}: field 'extensions.report' names {phase!r}, but 'extensions.{phase}' is not "
                              "declared; declare it or remove it from the list")


def arm_names(cfg: dict, confirm_arms: list[str] | None = None) -> list[str]:
    """The arms of every extension phase: ``extensions.arms``, or the confirmation plan's arms."""
    declared_arms = (cfg.get("extensions") or {}).get("arms", "confirmation")
    if declared_arms == "confirmation":
        if confirm_arms is None:
            raise ConfigError("extensions.arms is 'confirmation': the extension plan needs the confirmation plan "
                              "(results/plan/confirm.json; --arms-from)")
        names = list(confirm_arms)
    else:
        names = list(declared_arms)
    from specstudy.core.arms import arm_name
    from specstudy.study.engines import engine_names

    baselines = [arm_name({"method": "baseline", "engine": e}) for e in engine_names(cfg)]  # one per engine build
    return baselines + [a for a in dict.fromkeys(names) if a not in baselines]
