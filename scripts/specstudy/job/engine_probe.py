"""``specstudy engine probe-methods``: start one real server per speculative method and record which the
engine serves (the record and its reader: :mod:`specstudy.study.engine_methods`); ``specstudy engine
build-suffix`` (:mod:`specstudy.inputs.arctic_build`).
"""

from __future__ import annotations

import shlex
import sys
import tempfile
import time
from pathlib import Path

from specstudy.core import atomic
from specstudy.core.errors import UserError
from specstudy.core.timestamps import utc_now
from specstudy.study.engine_methods import PROBE_METHODS, SCHEMA, engine_label


def _probe_arm(method: str, k: int, arms_cfg: dict) -> dict:
    """The arm a probe starts: depth ``k``, 1 for any further level, the method's required settings from the
    study's ``arms.<section>`` (else the registration's probe defaults)."""
    from specstudy.core import methods
    from specstudy.core.arms import arm_name

    decl = methods.get(method, "--methods")
    arm = {"method": method, **{lv.field: (k if lv == methods.K else 1) for lv in decl.levels}}
    s = decl.settings
    if s is not None and s.required:
        section = arms_cfg.get(s.section) or {}
        arm.update({s.prefix + key: section.get(key, s.probe_defaults.get(key)) for key in s.keys})
    arm["name"] = arm_name(arm)
    return arm


def probe_method(engine_cfg: dict, arm: dict, work_dir: str | Path, *, timeout_s: float = 600) -> dict:
    """Start one real server of ``engine_cfg`` for ``arm``; servable iff it became ready and answered.

    ``engine_cfg`` is the flat launcher settings (:func:`specstudy.job.spec.engine_flat`). The
    server is stopped (its whole process group) before this returns.
    """
    from specstudy.deployment.command import speculative_config
    from specstudy.deployment.launch import start_server
    from specstudy.deployment.launchlog import error_excerpt
    from specstudy.deployment.readiness import DeploymentError, wait_ready

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    out = {"speculative_config": speculative_config(engine_cfg, arm)}
    try:
        server, _backend = start_server(engine_cfg, arm, attempt_dir=work_dir, served_model_name="probe")
    except Exception as exc:  # the harness refused before any engine ran (e.g. a missing path)
        return {**out, "servable": False, "stage": "command", "message": f"{type(exc).__name__}: {exc}",
                "seconds": round(time.monotonic() - t0, 1)}
    failure = None
    try:
        ready = wait_ready(server, timeout_s=timeout_s)
        out.update(servable=True, stage="ready", ready_seconds=ready["seconds"])
    except DeploymentError as exc:
        failure = exc
    finally:
        server.stop(grace_s=float(engine_cfg.get("stop_grace_s", 15)), reason="probe finished")
    if failure is not None:  # read the log after the stop: the launcher's log pump has written all of it
        log = Path(server.log_path).read_text(errors="replace") if Path(server.log_path).exists() else ""
        exc_lines = error_excerpt(log)["exceptions"]
        # the root cause is the first distinct exception; the engine's own wrapper lines come after it
        out.update(servable=False, stage="readiness",
                   message=exc_lines[0] if exc_lines else f"{failure} (no exception in the launch log)",
                   exit_reason=getattr(failure, "reason", None))
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


def probe_methods(cfg: dict, methods: list[str], *, work_dir: str | Path, config_path: str, out_path: str,
                  timeout_s: float = 600, log=print) -> dict:
    """Probe each method on the study's engine (its target, server settings and environment) and
    return the record (not yet written)."""
    from specstudy.deployment.provenance import server_software
    from specstudy.job.spec import engine_flat

    engine = engine_flat(cfg["engine"])
    arms_cfg = cfg.get("arms") or {}
    k = int((arms_cfg.get("num_speculative_tokens") or [3])[0])
    sw = server_software(engine.get("python"))
    rec = {"schema": SCHEMA,
           "engine": {key: sw.get(key) for key in ("vllm", "vllm_distribution", "torch", "python")},
           "probed_at": utc_now(),
           "probe_command": shlex.join(["specstudy", "engine", "probe-methods", "--config", str(config_path),
                                        "--methods", *methods, "--out", str(out_path)]),
           "target": engine["model"], "methods": {}}
    for method in methods:
        arm = _probe_arm(method, k, arms_cfg)
        log(f"probe {arm['name']}: starting a {engine_label(rec)} server ...")
        res = probe_method(engine, arm, Path(work_dir) / arm["name"], timeout_s=timeout_s)
        log(f"probe {arm['name']}: {'servable' if res['servable'] else 'refused: ' + res['message']} ({res['seconds']} s)")
        rec["methods"][method] = res
    return rec


def write_record(path: str | Path, rec: dict) -> None:
    import yaml

    text = "# Written by `specstudy engine probe-methods` (specstudy.study.engine_methods); probe again, never edit.\n"
    text += yaml.safe_dump(rec, sort_keys=False, width=100, allow_unicode=True)
    atomic.write_bytes(path, text.encode())


def _cmd_probe(args) -> int:
    from specstudy.study.config import load_config

    cfg = load_config(args.config)
    methods = args.methods or list(PROBE_METHODS)
    bad = [m for m in methods if m not in PROBE_METHODS]
    if bad:
        raise UserError(f"--methods: {bad} cannot be probed; choose from {', '.join(PROBE_METHODS)}")
    with tempfile.TemporaryDirectory(prefix="probe-methods-") as tmp:
        rec = probe_methods(cfg, methods, work_dir=args.work_dir or tmp, config_path=args.config, out_path=args.out,
                            timeout_s=args.timeout_s, log=lambda m: print(m, file=sys.stderr, flush=True))
    write_record(args.out, rec)
    print(f"engine methods record -> {args.out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("engine", help="facts about the pinned engine")
    esub = p.add_subparsers(dest="engine_command", required=True)
    q = esub.add_parser("probe-methods", help="start one real server per method and record which the engine serves")
    q.add_argument("--config", required=True, help="study config: its engine, target and server settings are probed")
    q.add_argument("--methods", nargs="*", help=f"methods to probe (default: {' '.join(PROBE_METHODS)})")
    q.add_argument("--out", required=True, help="the record to write (engine.methods_record)")
    q.add_argument("--work-dir", help="keep the probes' launch logs here (default: a temporary directory)")
    q.add_argument("--timeout-s", type=float, default=600, help="readiness timeout per probe")
    q.set_defaults(func=_cmd_probe)
    from specstudy.inputs.arctic_build import DEFAULT_DEST, cmd_build  # standard library only: --help stays fast

    b = esub.add_parser("build-suffix", help="build arctic-inference 0.1.1 (suffix decoding) into a directory of its "
                        "own and print the engine.server.env.PYTHONPATH that serves it (docs/methods.md)")
    b.add_argument("--dest", default=str(DEFAULT_DEST),
                   help="build directory; the package lands in <dest>/site (default: %(default)s)")
    b.set_defaults(func=cmd_build)
