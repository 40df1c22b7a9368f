"""``specstudy methods``: the registered speculative methods (:mod:`specstudy.core.methods`), what each needs,
and — with ``--config`` — what the study's engine build says of each (its recorded probe); ``--schemas
check|write`` compares or rewrites the record schemas' arm-name patterns and method enums, which are
generated from the registry (no schema spells the method list by hand).
"""

from __future__ import annotations

import sys

from specstudy.core import methods, schemas


def schema_drift(write: bool = False) -> list[str]:
    """The schema files whose arm-name patterns or method enums differ from the registry's (rewritten when
    ``write``)."""
    from specstudy.core import atomic

    out = []
    for path in sorted(schemas.SCHEMA_DIR.glob("*.schema.json")):
        text = path.read_text(encoding="utf-8")
        new = methods.sync_schema_text(text)
        if new != text:
            out.append(str(path))
            if write:
                atomic.write_bytes(path, new.encode("utf-8"))
    return out


def rows(cfg: dict | None = None) -> list[dict]:
    """One row per registered method; ``engine`` is the recorded probe's word where a config is given."""
    from specstudy.study.engine_methods import engine_refusal, methods_record_path, unprobed

    out = []
    for m in methods.registered():
        row = {"method": m.name, "arm": m.arm_prefix + "".join(f"-{lv.letter}<{lv.letter}>" for lv in m.levels),
               "model": m.model.field if m.model else "-", "settings": f"arms.{m.settings.section}" if m.settings else "-",
               "probe": m.probe or "- (measured, not probed)", "confounds": ", ".join(m.confounds)}
        if cfg is not None:
            if m.probe is None:
                row["engine"] = "measured"
            elif methods_record_path(cfg) is None:
                row["engine"] = "no record (engine.methods_record)"
            elif unprobed(cfg, [m.name]):
                row["engine"] = "not in the record: probe it"
            else:
                row["engine"] = "refused" if engine_refusal(cfg, m.name) else "servable"
        out.append(row)
    return out


def _main(args) -> int:
    if args.schemas:
        drift = schema_drift(write=args.schemas == "write")
        verb = "rewrote" if args.schemas == "write" else "differs from the registry (run `specstudy methods --schemas write`)"
        for path in drift:
            print(f"{path}: {verb}", file=sys.stderr if args.schemas == "check" else sys.stdout)
        return 1 if drift and args.schemas == "check" else 0
    cfg = None
    if args.config:
        from specstudy.study.config import load_config

        cfg = load_config(args.config)
    table = rows(cfg)
    keys = list(table[0])
    widths = {k: max(len(k), *(len(r[k]) for r in table)) for k in keys}
    print("  ".join(k.ljust(widths[k]) for k in keys))
    for r in table:
        print("  ".join(r[k].ljust(widths[k]) for k in keys))
    return 0


def register(sub) -> None:
    p = sub.add_parser("methods", help="the registered speculative methods (core.methods); --schemas check|write "
                                       "keeps the record schemas' method lists generated from them")
    p.add_argument("--config", help="a study config: add what its engine's recorded probe says of each method")
    p.add_argument("--schemas", choices=("check", "write"),
                   help="check: exit 1 naming each schema whose arm-name pattern or method enum differs from the "
                        "registry; write: rewrite them")
    p.set_defaults(func=_main)
