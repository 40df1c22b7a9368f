"""``specstudy check-config <study.yaml>``: the pre-flight of a study (docs/bad-input.md).

Snakemake reads ``--configfile`` itself and reports a YAML error as "Config file is not valid JSON
or YAML" without the file or line; this command names both (and every schema or cross-field
problem, with the field), before Snakemake is involved, then runs the same machine checks as the
workflow's parse (specstudy.study.preflight: engine files, the container's image and EDF, the datasets with
their full sha256, client CPUs, extension arms) and checks the
pre-registration of the results so far (lock and recorded hashes).
"""

from __future__ import annotations

from pathlib import Path


def check(path: str | Path, profile: str | Path | None = None, results: str | Path | None = None) -> list[str]:
    from specstudy.inputs.corpus import load_spec
    from specstudy.study import phase_decl, preflight
    from specstudy.study.config import load_config
    from specstudy.study.prereg import load_prereg, prereg_path

    cfg = load_config(path)
    prereg = load_prereg(cfg)
    phase_decl.check(cfg, prereg, str(path))
    if profile:
        from specstudy.study.cost import profile_info

        profile_info(profile)  # a profile option specstudy reads (cores, jobs) that it cannot use names the file
    preflight.check_study(cfg, str(path), profile=profile, digests=True)
    if results:  # the study's results so far: the pre-registration they were measured under
        import os

        from specstudy.core import atomic, layout
        from specstudy.study.config import ConfigError
        from specstudy.study.prereg_guard import verify_lock, verify_recorded

        lock = Path(layout.prereg_lock(results))
        if lock.exists():
            locked = atomic.read_json(lock).get("preregistration")
            if locked and os.path.abspath(locked) != os.path.abspath(prereg_path(cfg)):
                raise ConfigError(f"{results}/ belongs to the study pre-registered in {locked} ({lock}), but {path} "
                                  f"pre-registers {prereg_path(cfg)}; check this study from its own working directory, "
                                  "or pass --results <its results directory> ('' to skip)")
            verify_lock(lock, prereg_path(cfg))
        verify_recorded(results, prereg_path(cfg))
    checked = [str(path), str(prereg_path(cfg))]
    specs = dict(cfg["corpora"]["workloads"], smoke=cfg["corpora"]["smoke"])
    for spec in specs.values():
        load_spec(spec)
        checked.append(str(spec))
    return checked


def template_note(path: str | Path) -> str | None:
    """What ``check-config`` says about the workloads' chat-template switches (docs/thinking.md): the
    template they were checked against, or that the check waits for the target to exist."""
    from specstudy.study.config import load_config
    from specstudy.study.template_args import (
        TemplateNotReadable,
        check_workload_options,
        resolve_template,
        workloads_with_options,
    )

    cfg = load_config(path)  # already checked against the template where it is readable
    if not workloads_with_options(cfg):
        return None
    try:
        resolve_template(cfg["engine"])
    except TemplateNotReadable as exc:
        return (f"note: workload_options not yet checked against the chat template: {exc} does not exist yet; "
                "`specstudy plan` (the plan rule) and every deployment job check it")
    return f"ok: workload_options read by the chat template {check_workload_options(cfg, str(path))}"


def _cmd(args) -> int:
    for p in check(args.config, args.profile, args.results):
        print(f"ok: {p}")
    note = template_note(args.config)
    if note:
        print(note)
    return 0


def register(sub) -> None:
    p = sub.add_parser("check-config", help="check a study config, its pre-registration and corpus specs (file, line, field)")
    p.add_argument("config", help="the study config YAML (what you pass to snakemake --configfile)")
    p.add_argument("--profile", default=None,
                   help="the Snakemake profile the study runs under: client_cpus are checked against its node "
                        "(cpus_per_task) instead of this machine, and its options are read (e.g. cores)")
    p.add_argument("--results", default="results",
                   help="the study's results directory (default: results): its pre-registration lock and the hash "
                        "every screening deployment recorded are checked against the file ('' to skip)")
    p.set_defaults(func=_cmd)
