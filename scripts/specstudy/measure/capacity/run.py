"""One arm's capacity search against a running server, recorded: ``gates.json`` before the first step,
every step and soak announced, judged and appended as it ends (``steps.jsonl``, ``soaks.jsonl``), then
``knee.json`` with the deployment's summary, and ``capacity.png``. The files live in the arm's capacity
folder (``results/capacity/<arm>/``, :func:`specstudy.core.layout.capacity_dir`) under the names below.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from specstudy.core import atomic
from specstudy.core.records import CapacityStep, to_record
from specstudy.core.timestamps import utc_now
from specstudy.measure.capacity.knee import as_knee, deployment_summary
from specstudy.measure.capacity.plot import plot_capacity
from specstudy.measure.capacity.rate_search import search
from specstudy.measure.capacity.runner import load_requests, make_step_runner
from specstudy.measure.capacity.settings import SCHEMA_GATES, load_json_or_file, resolve_gates, resolve_search
from specstudy.measure.capacity.step import StepResult

#: The files of one arm's capacity folder.
GATES_FILE = "gates.json"
STEPS_FILE = "steps.jsonl"
SOAKS_FILE = "soaks.jsonl"
KNEE_FILE = "knee.json"
PLOT_FILE = "capacity.png"
RAW_DIR = "raw"


def run_capacity(base_url: str, model: str, prompts, gates, search_cfg, out_dir, metrics_url: str | None,
                 deployment_record=None, *, arm: str | None = None, api_key: str | None = None,
                 step_runner: Callable[[float], StepResult] | None = None,
                 soak_runner: Callable[[float], StepResult] | None = None, progress=None) -> dict:
    """Run the whole capacity search for one arm against a running server; return ``knee.json``.

    ``gates``/``search_cfg``: dicts, inline JSON or file paths (defaults filled). ``prompts``: a
    ``prompts.jsonl`` path or rows. ``deployment_record``: dict or path of the arm's
    ``deployment.json`` (copied into knee.json: KV capacity, memory confounds). ``step_runner`` /
    ``soak_runner`` replace the real runners (tests). Every step and soak is announced before it
    runs and printed with its verdict after (``progress``: a :class:`specstudy.measure.progress.Progress`,
    else flushed lines on stdout).
    """
    from specstudy.core import schemas

    out = Path(out_dir)
    arm = arm or out.name
    g = resolve_gates(load_json_or_file(gates, "gates"), "gates")
    s = resolve_search(load_json_or_file(search_cfg, "search"), "search")
    dep = deployment_summary(deployment_record)
    for stale in (STEPS_FILE, SOAKS_FILE, KNEE_FILE, PLOT_FILE):
        (out / stale).unlink(missing_ok=True)
    prompts_info = None
    if isinstance(prompts, (str, os.PathLike)) and Path(prompts).exists():
        prompts_info = {"path": str(prompts), "sha256": atomic.sha256_file(prompts)}
    atomic.write_json(out / GATES_FILE, {
        "schema": SCHEMA_GATES, "arm": arm, "gates": g, "search": s, "base_url": base_url, "model": model,
        "metrics_url": metrics_url, "prompts": prompts_info,
        "deployment_id": (dep or {}).get("deployment_id"),
        "written_at": utc_now(),
    })
    if step_runner is None:
        requests = load_requests(prompts)
        step_runner = make_step_runner(base_url, model, requests, metrics_url, s, g, artifacts_dir=out / RAW_DIR,
                                       kind="step", api_key=api_key)
        soak_runner = soak_runner or make_step_runner(base_url, model, requests, metrics_url, s, g,
                                                      duration_s=s["soak"]["duration_s"], artifacts_dir=out / RAW_DIR,
                                                      kind="soak", api_key=api_key)
    steps: list[dict] = []
    soaks: list[dict] = []
    step_runner, soak_runner = _announced(step_runner, "step", s, progress), _announced(soak_runner, "soak", s, progress)

    def on_step(row):
        schemas.validate(row, "capacity-step", out / STEPS_FILE)
        steps.append(row)
        atomic.write_jsonl(out / STEPS_FILE, steps)
        _say(progress, _verdict_line(row, "step"))

    def on_soak(row):
        schemas.validate(row, "capacity-step", out / SOAKS_FILE)
        soaks.append(row)
        atomic.write_jsonl(out / SOAKS_FILE, soaks)
        _say(progress, _verdict_line(row, "soak"))

    outcome = search(step_runner, g, s, soak_runner=soak_runner, on_step=on_step, on_soak=on_soak, arm=arm)
    _say(progress, f"[capacity] {arm}: knee {_fmt(outcome.knee.get('knee_rps'))} req/s, status {outcome.knee.get('status')}")
    if not soaks:
        atomic.write_jsonl(out / SOAKS_FILE, [])
    knee = dict(outcome.knee)
    knee["deployment"] = dep
    knee["gates_file"] = str(out / GATES_FILE)
    schemas.validate(knee, "capacity-knee", out / KNEE_FILE)
    atomic.write_json(out / KNEE_FILE, knee)
    try:
        plot_capacity([to_record(r, CapacityStep) for r in outcome.steps],
                      [to_record(r, CapacityStep) for r in outcome.soaks], as_knee(knee), g, out / PLOT_FILE)
    except Exception as exc:  # a plot failure must not lose the measurement
        knee["reasons"].append({"code": "plot_failed", "detail": f"{type(exc).__name__}: {exc}"})
        atomic.write_json(out / KNEE_FILE, knee)
    return knee


def _say(progress, message: str) -> None:
    if progress is not None:
        progress.log(message)
    else:
        print(message, flush=True)


def _announced(runner, kind: str, search_cfg: dict, progress):
    """``runner`` that first says which step/soak starts, at what rate and for how long."""
    if runner is None:
        return None
    count = {"n": 0}
    duration = search_cfg["soak"]["duration_s"] if kind == "soak" else search_cfg["step_duration_s"]

    def wrapped(rate: float):
        count["n"] += 1
        if progress is not None:
            progress.detail = f"{kind} {count['n']} at {rate:.4g} req/s"
        _say(progress, f"[capacity] {kind} {count['n']}: offering {rate:.4g} req/s for "
                       f"{search_cfg['warmup_s']:g} s warm-up + {duration:g} s")
        return runner(rate)

    return wrapped


def _verdict_line(row: dict, kind: str) -> str:
    failed = ", ".join(row.get("failed_gates") or []) or "none"
    return (f"[capacity] {kind} {row.get('phase')} #{row.get('index')}: {_fmt(row.get('offered_rate'))} req/s offered, "
            f"{_fmt(row.get('achieved_rate'))} achieved, TTFT p95 {_fmt(row.get('ttft_p95_ms'))} ms, "
            f"TPOT p95 {_fmt(row.get('tpot_p95_ms'))} ms -> {str(row.get('verdict')).upper()}"
            f"{' (client-limited)' if row.get('client_limited') else ''}; failed gates: {failed}")


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.4g}"
