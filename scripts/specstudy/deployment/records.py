"""Deployment ids and failure records (``results/deployment-failures/<phase>/<arm>/rep<r>/<id>/``)."""

from __future__ import annotations

import os
from pathlib import Path

from specstudy.core import atomic, layout
from specstudy.core.timestamps import compact, utc_now
from specstudy.deployment.launchlog import classify_failure, error_excerpt, parse_launch_log
from specstudy.deployment.redaction import redact_argv, redact_text

DEPLOYMENT_SCHEMA = "specstudy.deployment/1"
FAILURE_SCHEMA = "specstudy.deployment-failure/1"


def new_deployment_id(phase: str, arm_name_: str, rep: int) -> str:
    stamp = compact()
    job = os.environ.get("SLURM_JOB_ID")
    suffix = f"j{job}" if job else f"p{os.getpid()}"
    return f"{phase}-{arm_name_}-{layout.rep_label(rep)}-{stamp}-{suffix}"


def write_failure_record(results_dir: str | os.PathLike, *, phase: str, arm: dict | str, rep: int,
                         deployment_id: str, stage: str, reason: str, log_path: str | os.PathLike | None,
                         command: list[str] | None = None, exit_code: int | None = None,
                         message: str | None = None, provenance: dict | None = None,
                         confounds: dict | None = None, times: dict | None = None,
                         secrets: list[str] | tuple[str, ...] = ()) -> Path:
    """Write ``results/deployment-failures/<phase>/<arm>/rep<r>/<deployment_id>/{failure.json, launch.log}``.

    ``reason`` is refined from the log (``oom``, ``invalid_config``) when it is generic. The full log
    is copied (redacted); ``error_excerpt`` holds the last exception lines of its tracebacks.
    Returns the path of ``failure.json``.
    """
    arm_spec = arm if isinstance(arm, dict) else {"name": arm}
    out = Path(layout.failure_dir(phase, arm_spec["name"], rep, deployment_id, root=results_dir))
    log_text = ""
    if log_path and Path(log_path).exists():
        log_text = Path(log_path).read_text(encoding="utf-8", errors="replace")
    log_text = redact_text(log_text, secrets)
    atomic.write_text(out / "launch.log", log_text)
    info = error_excerpt(log_text)
    if reason in ("exited", "error", "probe_failed", "timeout") and log_text:
        refined = classify_failure(reason, log_text)
        if reason != "timeout" or refined == "oom":
            reason = refined
    record = {
        "schema": FAILURE_SCHEMA,
        "deployment_id": deployment_id,
        "phase": phase,
        "arm": arm_spec,
        "rep": layout.rep_number(rep),
        "rep_label": layout.rep_label(rep),
        "status": "failed",
        "failure": {"stage": stage, "reason": reason,
                    "error_excerpt": info["excerpt"] or (redact_text(message, secrets) if message else None),
                    "exceptions": info["exceptions"][-6:], "message": redact_text(message, secrets) if message else None,
                    "exit_code": exit_code, "log": str(out / "launch.log")},
        "command": redact_argv(command, secrets) if command else None,
        "provenance": provenance,
        "confounds": confounds if confounds is not None else (parse_launch_log(log_text) if log_text else None),
        "times": times or {"start": None, "ready": None, "stop": None},
        "written_at": utc_now(),
    }
    path = out / "failure.json"
    from specstudy.core import schemas

    schemas.validate(record, "deployment-failure", str(path))
    atomic.write_json(path, record)
    return path

