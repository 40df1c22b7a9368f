"""``specstudy check-config <study.yaml>``: check a study config, its pre-registration and corpus specs.

Snakemake reads ``--configfile`` itself and reports a YAML error as "Config file is not valid JSON
or YAML" without the file or line; this command names both (and every schema or cross-field
problem, with the field), before Snakemake is involved.
"""

from __future__ import annotations

from pathlib import Path


def check(path: str | Path) -> list[str]:
    from .config import load_config, load_prereg, prereg_path
    from .corpus import load_spec

    cfg = load_config(path)
    load_prereg(cfg)
    checked = [str(path), str(prereg_path(cfg))]
    specs = dict(cfg["corpora"]["workloads"], smoke=cfg["corpora"]["smoke"])
    for spec in specs.values():
        load_spec(spec)
        checked.append(str(spec))
    return checked


def _cmd(args) -> int:
    for p in check(args.config):
        print(f"ok: {p}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("check-config", help="check a study config, its pre-registration and corpus specs (file, line, field)")
    p.add_argument("config", help="the study config YAML (what you pass to snakemake --configfile)")
    p.set_defaults(func=_cmd)
