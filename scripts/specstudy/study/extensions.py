"""The opt-in extension phases after the greedy core (issue #20; docs/extensions.md).

Each phase is planned, deployed and summarised on its own, through the same path as screening and
confirmation: its plan is ``results/plan/<phase>.json`` (:func:`specstudy.study.plan.make_plan`, schema
``plan``), its deployments run through :func:`specstudy.job.run.run_deployment` into
``results/<phase>/<arm>/<rep>/`` and its summary and report section go to ``results/<phase>/``. No
phase is ever pooled with the core results: the tables, gates, selection and decision read only
``screen`` and ``confirm``.

=============  =================  ========================================================================
phase          target             what a deployment does after its smoke captures
=============  =================  ========================================================================
``sampling``   ``sampling``       one sampled capture (every capture prompt x every pre-registered seed),
                                  then the cells at the pre-registered temperature with per-request seeds
``ignore_eos`` ``mechanics``      the cells with a fixed output length per request (``ignore_eos``)
``memory``     ``memory``         the KV-cache sweep: largest concurrency without preemption per context
``profile``    ``profile``        one cell under vLLM's torch profiler; traces kept, time classified
=============  =================  ========================================================================

The arms are the confirmation plan's (baseline, the selection's candidates, the best n-gram) unless
``extensions.arms`` lists them; the design of each phase is written into its plan (``design``), so a
deployment job reads *what* to run from the plan alone, as in the core phases.
"""

from __future__ import annotations

from specstudy.core.errors import ConfigError

PHASES = ("sampling", "ignore_eos", "memory", "profile")
#: the Snakemake target of each phase
TARGETS = {"sampling": "sampling", "ignore_eos": "mechanics", "memory": "memory", "profile": "profile"}
#: the deployment kind of each phase's deployments (plan ``kind``)
KINDS = {"sampling": "repeat", "ignore_eos": "repeat", "memory": "memory", "profile": "profile"}
LABELS = {
    "sampling": "Sampling (temperature > 0): kept apart from the greedy results, never pooled",
    "ignore_eos": "Mechanics (ignore_eos, fixed output lengths): isolates serving mechanics; not a study result, "
                  "never pooled with natural-EOS results",
    "memory": "Memory capacity: advertised KV cache and the largest concurrency served without preemption",
    "profile": "Kernel profile: one profiled cell per arm; timings inflated by the profiler, not performance results",
}


def _section(cfg: dict, phase: str, source: str = "the study config") -> dict:
    ext = cfg.get("extensions") or {}
    if phase not in PHASES:
        raise ConfigError(f"{source}: {phase!r} is not an extension phase ({', '.join(PHASES)})")
    section = ext.get(phase)
    if not section:
        raise ConfigError(f"{source}: field 'extensions.{phase}' is missing: declare the phase there to run "
                          f"`snakemake {TARGETS[phase]}` (see config/config.yaml and docs/extensions.md)")
    return section


def declared(cfg: dict) -> list[str]:
    """The extension phases the config declares (in :data:`PHASES` order)."""
    ext = cfg.get("extensions") or {}
    return [p for p in PHASES if ext.get(p)]


def in_report(cfg: dict) -> list[str]:
    """The phases whose sections the main report includes (``extensions.report``)."""
    return list((cfg.get("extensions") or {}).get("report") or [])


def check(cfg: dict, prereg: dict | None, source: str = "the study config") -> None:
    """Cross-field checks of ``extensions`` (the schema checks the shapes): workloads exist, the sampling
    phase has its pre-registration, every phase named in ``report`` is declared."""
    workloads = set(cfg["corpora"]["workloads"])
    for phase in declared(cfg):
        s = _section(cfg, phase, source)
        names = list(s.get("workloads") or []) + [x for x in (s.get("workload"), (s.get("capture") or {}).get("workload"))
                                                   if x]
        for w in names:
            if w not in workloads:
                raise ConfigError(f"{source}: field 'extensions.{phase}': workload {w!r} is not under corpora.workloads "
                                  f"({', '.join(sorted(workloads))}); name one of those")
    if "sampling" in declared(cfg):
        if not (prereg or {}).get("sampling"):
            raise ConfigError(f"{source}: field 'extensions.sampling' needs the pre-registration's 'sampling' section "
                              "(temperature, seeds, test, margins; docs/sampling.md): add it to the pre-registration "
                              "before the study's screening starts")
        if int(cfg["extensions"]["sampling"].get("baseline_repeats", 2)) < 2:
            raise ConfigError(f"{source}: field 'extensions.sampling.baseline_repeats' must be 2 or more: the "
                              "baseline-vs-baseline control needs two independently launched baselines")
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
    return ["baseline"] + [a for a in dict.fromkeys(names) if a != "baseline"]


def design(cfg: dict, phase: str, prereg: dict | None = None) -> dict:
    """The design a phase's plan records: cells, repeats, and what its deployments run besides the cells.

    ``cell_settings`` are the overrides of the study's ``cells`` settings for this phase's cells (the
    deployment spec merges them): the sampling temperature with per-request seeds, the fixed length of
    the mechanics phase, the request counts of a phase.
    """
    s = _section(cfg, phase)
    cells: dict = {k: s[k] for k in ("requests", "warmup_requests") if k in s}
    out: dict = {"kind": KINDS[phase], "label": LABELS[phase], "target": TARGETS[phase]}
    if phase == "sampling":
        sp = dict((prereg or {}).get("sampling") or {})
        seeds = sp["seeds"]
        cells.update(temperature=float(sp["temperature"]), top_p=float(sp.get("top_p", 1.0)),
                     seed_policy="per_request", seed=int(seeds["base"]))
        cap = s["capture"]
        out["capture"] = {"workload": cap["workload"], "prompts": int(cap["prompts"]),
                          "concurrency": int(cap.get("concurrency", 1)),
                          "seeds": [int(seeds["base"]) + i for i in range(int(seeds["per_prompt"]))],
                          "temperature": float(sp["temperature"]), "top_p": float(sp.get("top_p", 1.0))}
        out.update(workloads=list(s["workloads"]), concurrency=list(s["concurrency"]),
                   repeats=int(s.get("repeats", 1)), baseline_repeats=int(s.get("baseline_repeats", 2)))
    elif phase == "ignore_eos":
        cells.update(ignore_eos=True, output_tokens=int(s["output_tokens"]))
        out.update(workloads=list(s["workloads"]), concurrency=list(s["concurrency"]),
                   repeats=int(s.get("repeats", 1)), baseline_repeats=int(s.get("baseline_repeats", s.get("repeats", 1))))
    elif phase == "memory":
        workload = s.get("workload") or list(cfg["corpora"]["workloads"])[0]
        out["sweep"] = {"context_tokens": [int(x) for x in s["context_tokens"]], "output_tokens": int(s["output_tokens"]),
                        "concurrency": sorted(int(x) for x in s["concurrency"]), "workload": workload}
        out["extra_args"] = list(s.get("extra_args") or [])
        out["env"] = dict(s.get("env") or {})
        out.update(workloads=[], concurrency=[], repeats=1, baseline_repeats=1)
    else:  # profile
        out["profile"] = {"vllm_version": s.get("vllm_version")}
        if s.get("max_tokens"):
            cells["max_tokens_cap"] = int(s["max_tokens"])
        out.update(workloads=[s["workload"]], concurrency=[int(s["concurrency"])], repeats=1, baseline_repeats=1)
    out["cell_settings"] = cells
    return out


def deployment_extras(design_: dict, dirs: dict[str, str]) -> dict:
    """What a deployment spec carries for its phase besides the cells (read by deployment_run)."""
    extras: dict = {}
    if design_.get("capture"):
        extras["sampled_capture"] = dict(design_["capture"], corpus_dir=dirs[design_["capture"]["workload"]])
    if design_.get("sweep"):
        extras["memory"] = dict(design_["sweep"], corpus_dir=dirs[design_["sweep"]["workload"]])
    if "profile" in design_:
        extras["profile"] = dict(design_["profile"])
    return extras
