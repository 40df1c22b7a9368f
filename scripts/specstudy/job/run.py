"""The Snakemake job of one deployment: launch, readiness, smoke captures, cells in order, stop.

Contract (docs/DESIGN.md, "Deployment job shape"):
- raw artifacts of this attempt go to ``<out>/attempts/<deployment_id>/`` and are never deleted;
  the declared outputs (``deployment.json``, every cell's ``summary.json``) are atomic copies;
- a cell whose earlier attempt is valid and has the same fingerprint is reused (its summary keeps
  naming the deployment it ran on); missing or rejected cells are measured on this deployment;
- a server that never becomes ready is data: a failure record under
  ``results/deployment-failures/…``, every cell summarised as ``deployment_failed``, exit 0;
- SIGTERM/SIGINT (``scancel``) stop the server's process group, write a failure record with
  stage ``cancelled`` and exit 128+signal; the server never outlives the job.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specstudy.core import atomic, layout
from specstudy.core.capture_file import corpus_ref
from specstudy.core.records import Plan, read_plan
from specstudy.core.timestamps import utc_now
from specstudy.deployment import DeploymentError, launch, launchlog, provenance, readiness, records
from specstudy.job.spec import deployment_spec, engine_flat, fingerprint, fingerprint_context, load_settings
from specstudy.measure import prom, telemetry
from specstudy.phases import registry
from specstudy.phases.registry import Phase
from specstudy.study.plan import request_counts


def _request_specs(prompts: list[dict], n: int, workload: str, offset: int = 0, settings: dict | None = None,
                   seed_offset: int = 0, spec: dict | None = None):
    """``n`` requests of ``workload`` cycling through its prompts. Each carries the workload's request
    options from ``spec`` (its chat-template kwargs: template_args.request_extra_body). ``settings`` (the
    cell settings) may fix the output length (``ignore_eos`` with ``output_tokens``: the ignore_eos phase)
    and give every request its own seed (``seed_policy: per_request``: request i carries
    ``seed + seed_offset + i``, the same in every arm) and ``top_p`` (the sampling phase)."""
    from specstudy.measure.loadgen import RequestSpec
    from specstudy.study.template_args import request_extra_body

    if not prompts:
        raise ValueError(f"workload {workload}: the corpus has no prompts")
    settings = settings or {}
    fixed = int(settings["output_tokens"]) if settings.get("ignore_eos") else None
    options = request_extra_body(spec or {}, workload)
    out = []
    for i in range(n):
        p = prompts[(offset + i) % len(prompts)]
        extra: dict = dict(options)
        if fixed is not None:
            extra["ignore_eos"] = True
        if settings.get("seed_policy") == "per_request":
            extra["seed"] = int(settings.get("seed") or 0) + seed_offset + i
        if settings.get("top_p") is not None:
            extra["top_p"] = float(settings["top_p"])
        max_tokens = fixed if fixed is not None else int(p["max_tokens"])
        if settings.get("max_tokens_cap"):  # the profile phase keeps its traces small
            max_tokens = min(max_tokens, int(settings["max_tokens_cap"]))
        out.append(RequestSpec(prompt_id=p["prompt_id"], workload=workload, messages=p["messages"],
                               max_tokens=max_tokens, extra_body=extra))
    return out


#: warm-up requests of a per-request-seed cell draw their seeds from here on (never a measured request's seed)
WARMUP_SEED_OFFSET = 1_000_000
#: exit code of a deployment job whose launch failed through the configuration's fault (launchlog.config_fault)
CONFIG_FAULT_EXIT = 3


def _cell_rel(cell: dict) -> str:
    """A plan cell's folder inside the deployment's folder and inside an attempt (specstudy.core.layout)."""
    return layout.cell_rel(cell["workload"], cell["concurrency"])


def _previous_valid(out: Path, cell: dict, fingerprint: str) -> Path | None:
    """Newest earlier attempt of this cell that is valid with the same fingerprint."""
    best = None
    for path in sorted((out / layout.ATTEMPTS).glob(f"*/{_cell_rel(cell)}/{layout.CELL_SUMMARY}")):
        try:
            s = atomic.read_json(path)
        except (OSError, ValueError):
            continue
        if s.get("fingerprint") == fingerprint and (s.get("validity") or {}).get("valid"):
            if best is None or path.stat().st_mtime >= best.stat().st_mtime:
                best = path
    return best


def _previous_ok_record(out: Path) -> dict | None:
    best, best_t = None, -1.0
    for path in (out / layout.ATTEMPTS).glob(f"*/{layout.ATTEMPT_RECORD}"):
        try:
            rec = atomic.read_json(path)
        except (OSError, ValueError):
            continue
        if rec.get("status") == "ok" and rec.get("smoke", {}).get("captures") and path.stat().st_mtime > best_t:
            best, best_t = rec, path.stat().st_mtime
    return best


def _keys(spec: dict, cell: dict, deployment_id: str) -> dict:
    from specstudy.study.template_args import chat_template_kwargs

    arm = spec["arm"]
    keys = {"phase": spec["phase"], "arm": arm["name"], "method": arm["method"],
            "num_speculative_tokens": arm.get("num_speculative_tokens"),
            "draft_tensor_parallel_size": arm.get("draft_tensor_parallel_size"),
            "tensor_parallel_size": int(spec["engine"]["target"].get("tensor_parallel_size") or 1),
            "rep": layout.rep_number(spec["rep"]), "rep_label": spec["rep"], "kind": spec["kind"],
            "workload": cell["workload"], "concurrency": int(cell["concurrency"]), "deployment_id": deployment_id}
    kwargs = chat_template_kwargs(spec, cell["workload"])
    if kwargs:  # a switched workload carries its switch (docs/thinking.md)
        keys["chat_template_kwargs"] = kwargs
    return keys



# --------------------------------------------------------------------------------------------------
# The job: launch → ready → smoke captures → cells → stop
# --------------------------------------------------------------------------------------------------
@dataclass
class _Job:
    """What one deployment job knows and has done so far (shared by the steps of :func:`run_deployment`)."""

    spec: dict
    out: Path
    results_root: Path
    deployment_id: str
    attempt: Path
    eng: dict  # the launcher's flat engine settings (engine_flat)
    progress: Any
    lock: dict
    smoke_prompts: list[dict]
    smoke_corpus: dict
    cells: list[dict] = field(default_factory=list)  # {cell, declared, corpus, fingerprint, reuse[, mismatch]}
    cell_records: list[dict] = field(default_factory=list)
    times: dict = field(default_factory=lambda: {"start": utc_now(), "ready": None, "stop": None})
    # filled while the server lives
    server: Any = None
    readiness: dict | None = None
    death: Any = None  # ServerDeathWatch once the server is ready
    watchdog: Any = None
    stage: str = "start"
    status: str = "ok"
    failure: dict | None = None
    exit_code: int | None = None  # the server's exit code (DeploymentError), for the failure record
    cancelled_code: int | None = None  # 128+signal once SIGTERM/SIGINT cancelled the job
    config_fault: dict | None = None  # a launch failure that is the configuration's fault (launchlog.config_fault)
    captures: list[str] = field(default_factory=list)
    extension: dict = field(default_factory=dict)  # an extension phase's artifacts (specstudy.phases.registry)
    cache_config: dict | None = None
    telemetry: Any = None  # the telemetry sampler process of this job's cells (measure.telemetry_worker)
    stop_info: dict | None = None
    # filled after the stop
    confounds: dict | None = None
    startup: dict | None = None
    provenance: dict | None = None

    @property
    def arm(self) -> dict:
        return self.spec["arm"]

    @property
    def phase(self) -> Phase:
        """The phase's registered behaviour (its steps besides the cells; the plain one for core phases)."""
        return registry.get(self.spec["phase"])

    @property
    def settings(self) -> dict:
        return self.spec["cell_settings"]

    @property
    def served(self) -> str:
        return self.spec["engine"]["target"]["served_model_name"]

    @property
    def grace_s(self) -> float:
        return float(self.eng["stop_grace_s"])

    @property
    def to_measure(self) -> list[dict]:
        return [e for e in self.cells if e["reuse"] is None and "mismatch" not in e]

    @property
    def cancelled(self) -> bool:
        return self.cancelled_code is not None

    def log(self, message: str) -> None:
        self.progress.log(message)

    def server_lost(self) -> bool:
        """The server died, or the idle watchdog stopped it, under the job."""
        return bool((self.death is not None and self.death.died) or (self.watchdog is not None and self.watchdog.fired))

    def fail(self, stage: str, reason: str, message: str, exit_code: int | None = None) -> None:
        self.status = "failed"
        self.failure = {"stage": stage, "reason": reason, "message": message}
        self.exit_code = exit_code


def run_deployment(spec: dict, out: str | os.PathLike, plan_path: str | None = None, lock_path: str | None = None,
                   results_root: str | os.PathLike = "results") -> int:
    """Run one deployment (``spec``: :func:`deployment_spec`) and write its records; return the job's exit code.

    0 also for a deployment that failed (a failure is data), 2 when the plan's selection does not
    verify (nothing started), 3 when the launch failed through the configuration's fault (image, EDF, model
    path: launchlog.config_fault; outputs left missing, the failure record kept), 128+signal when cancelled
    (outputs left missing so the study resumes).
    """
    plan = read_plan(plan_path) if plan_path else None
    if spec["kind"] != "capacity" and not _selection_verified(plan, plan_path):
        return 2
    job = _open_job(spec, out, results_root, lock_path)
    _prepare_cells(job, plan, plan_path)
    if not job.to_measure and spec["kind"] != "capacity" and not job.phase.serves_without_cells:
        return _publish_without_server(job)
    with readiness.stop_on_signals(lambda: job.server, grace_s=job.grace_s):
        try:
            if _launch_and_wait_ready(job):
                _smoke_captures(job)
                job.phase.after_smoke(job)
                _measure(job)
        except readiness.TerminatedBySignal as exc:
            job.cancelled_code = 128 + exc.signum
            job.fail("cancelled", "signal", f"job received signal {exc.signum}", job.cancelled_code)
        except Exception:
            if not job.server_lost():
                raise
            traceback.print_exc()  # the server died or was stopped as idle under it: a deployment failure
        finally:
            _stop(job)
    if job.status == "failed" and not job.cancelled and job.times.get("ready") is None:
        log = job.attempt / layout.LAUNCH_LOG
        job.config_fault = launchlog.config_fault(log.read_text(encoding="utf-8", errors="replace")) if log.exists() else None
    return _write_records(job)


def _selection_verified(plan: Plan | None, plan_path: str | None) -> bool:
    """A confirmation deployment runs only on the selection its plan was built from."""
    if plan is None or not plan.selection:  # no plan, or a screening plan (no selection)
        return True
    from specstudy.study.selection_lock import SelectionError, verify_selection

    try:
        verify_selection(plan.selection.path, plan_path)
    except SelectionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False
    return True


def _open_job(spec: dict, out: str | os.PathLike, results_root: str | os.PathLike, lock_path: str | None) -> _Job:
    from specstudy.inputs import corpus as corpusmod
    from specstudy.measure.progress import Progress

    deployment_id = records.new_deployment_id(spec["phase"], spec["arm"]["name"], spec["rep"])
    out = Path(out)
    attempt = out / layout.ATTEMPTS / deployment_id
    attempt.mkdir(parents=True, exist_ok=True)
    job = _Job(spec=spec, out=out, results_root=Path(results_root), deployment_id=deployment_id, attempt=attempt,
               eng=engine_flat(spec["engine"]), lock=atomic.read_json(lock_path) if lock_path else {},
               smoke_prompts=corpusmod.load_prompts(spec["smoke_corpus_dir"]),
               smoke_corpus=corpus_ref(atomic.read_json(Path(spec["smoke_corpus_dir"]) / "corpus.json")),
               progress=Progress(deployment_id).start())
    job.log(f"deployment {deployment_id}: {len(spec['cells'])} cells, attempt dir {attempt}")
    return job


def _prepare_cells(job: _Job, plan: Plan | None, plan_path: str | None) -> None:
    """Every planned cell: corpus digest against the plan, fingerprint, an earlier valid result to reuse.
    Reused cells are published now; cells whose corpus changed after planning are refused."""
    planned_digests = {k: v.digest for k, v in plan.corpora.items()} if plan is not None and plan.corpora else {}
    context = fingerprint_context(job.spec)
    for c in job.spec["cells"]:
        entry = {"cell": c, "declared": job.out / _cell_rel(c) / layout.CELL_SUMMARY}
        cj = atomic.read_json(Path(c["corpus_dir"]) / "corpus.json")
        entry["corpus"] = corpus_ref(cj)
        expected = planned_digests.get(c["corpus_dir"])
        if expected and expected != cj.get("digest"):
            entry["mismatch"] = (f"{c['corpus_dir']}: corpus digest {cj.get('digest')} differs from the plan's {expected} "
                                 f"({plan_path}); the corpus changed after planning — re-run the plan rule")
        entry["fingerprint"] = fingerprint(job.spec, c, cj.get("digest"), context)
        entry["reuse"] = (_previous_valid(job.out, c, entry["fingerprint"])
                          if job.settings.get("reuse_valid", True) else None)
        job.cells.append(entry)
    job.progress.total_requests = len(job.to_measure) * (int(job.settings["requests"]) +
                                                         int(job.settings["warmup_requests"]))
    for e in job.cells:
        if e["reuse"] is not None:
            job.log(f"cell {_cell_rel(e['cell'])}: reusing valid result {e['reuse']}")
            _publish_cell(job, e, e["reuse"], "reused")
        elif "mismatch" in e:
            _write_failed_cell(job, e, "corpus_mismatch", e["mismatch"])


def _publish_cell(job: _Job, entry: dict, summary_path: Path, status: str) -> None:
    # Only what changed is written: a declared summary already holding these bytes keeps them and its time.
    written = atomic.replace_if_changed(entry["declared"], summary_path.read_bytes())
    if written and status == "reused":  # unchanged content keeps its time: nothing downstream looks out of date
        st = summary_path.stat()
        os.utime(entry["declared"], ns=(st.st_atime_ns, st.st_mtime_ns))
    s = atomic.read_json(summary_path)
    job.cell_records.append({"workload": entry["cell"]["workload"], "concurrency": int(entry["cell"]["concurrency"]),
                             "summary": str(summary_path), "status": status,
                             "deployment_id": (s.get("keys") or {}).get("deployment_id")})


def _write_failed_cell(job: _Job, entry: dict, code: str, detail: str) -> None:
    from specstudy.measure import cell as cellmod

    s = cellmod.failed_summary(_keys(job.spec, entry["cell"], job.deployment_id), entry["corpus"], code, detail,
                               fingerprint=entry["fingerprint"])
    from specstudy.core.integrity import seal

    seal(s)
    path = job.attempt / _cell_rel(entry["cell"]) / layout.CELL_SUMMARY
    atomic.write_json(path, s)
    _publish_cell(job, entry, path, code)


def _record_base(job: _Job) -> dict:
    arm = job.arm
    return {"schema": records.DEPLOYMENT_SCHEMA, "deployment_id": job.deployment_id, "phase": job.spec["phase"],
            "arm": arm, "rep": layout.rep_number(job.spec["rep"]), "rep_label": job.spec["rep"], "kind": job.spec["kind"],
            "tensor_parallel_size": {"target": int(job.eng.get("tensor_parallel_size") or 1),
                                     "draft": arm.get("draft_tensor_parallel_size") if arm["method"] == "draft_model"
                                     else None},
            # a study of several engine builds: which build, its label and its overlay of the engine section
            **({"engine": job.spec["engine_build"]} if job.spec.get("engine_build") else {})}


def _publish_without_server(job: _Job) -> int:
    """Every cell reused or refused: no server; the previous ok record (its smoke captures) is republished."""
    job.log("no cell to measure (all reused or refused); no server started")
    rec = dict(_previous_ok_record(job.out) or dict(_record_base(job), status="ok", failure=None, command=None,
                                                    provenance=None, confounds=None, cache_config=None,
                                                    smoke={"captures": []}, times=job.times))
    rec["cells"] = job.cell_records
    rec["reused_by"] = job.deployment_id
    job.progress.close()
    same = _equivalent_record(job.out, rec)
    if same is None:
        _write_record(job.out, job.attempt, rec)
        return 0
    # Nothing changed: the attempt keeps this job's record (who republished, when), and the declared record
    # gets the bytes of the record it republishes, so that nothing downstream sees new content.
    from specstudy.core import schemas

    schemas.validate(rec, "deployment", f"{job.attempt}/{layout.ATTEMPT_RECORD}")
    atomic.write_json(job.attempt / layout.ATTEMPT_RECORD, rec)
    atomic.replace_if_changed(job.out / layout.DEPLOYMENT_RECORD, same.read_bytes())
    job.log(f"deployment record unchanged: republished {same}")
    return 0


def _equivalent_record(out: Path, rec: dict) -> Path | None:
    """An earlier attempt's record describing the same deployment as ``rec`` (content.same_deployment): the
    measured one (no ``reused_by``) if there is one, else the oldest republication."""
    from specstudy.core.content import same_deployment

    found = []
    for path in (out / layout.ATTEMPTS).glob(f"*/{layout.ATTEMPT_RECORD}"):
        try:
            old = atomic.read_json(path)
        except (OSError, ValueError):
            continue
        if isinstance(old, dict) and same_deployment(old, rec):
            found.append(("reused_by" in old, path.stat().st_mtime_ns, str(path), path))
    return min(found)[3] if found else None


def _launch_and_wait_ready(job: _Job) -> bool:
    """Start the server and wait until it serves; then watch it (death watch, idle watchdog).
    A server that never becomes ready is a failed deployment (False), not an error of the job."""
    from specstudy.deployment.watch import ServerDeathWatch

    try:
        job.progress.phase("launch")
        eng = job.phase.engine(job, job.eng)
        job.server, _backend = launch.start_server(eng, job.arm, attempt_dir=job.attempt, served_model_name=job.served)
        job.log(f"server starting: pid {job.server.pid} {job.server.base_url}")
        job.readiness = readiness.wait_ready(job.server, timeout_s=float(job.eng["readiness_timeout_s"]))
        job.times["ready"] = utc_now()
        job.progress.end_phase()
        job.log("server ready")
    except DeploymentError as exc:
        job.fail(exc.stage, exc.reason, str(exc), exc.exit_code)
        job.log(f"deployment failed at {exc.stage}: {exc}")
        return False
    job.death = ServerDeathWatch(job.server, grace_s=job.grace_s, log=job.log).start()
    if job.eng.get("idle_timeout_s"):
        job.watchdog = readiness.IdleWatchdog(job.server, float(job.eng["idle_timeout_s"]), grace_s=job.grace_s,
                                              metrics_url=job.server.base_url + "/metrics",
                                              api_key=job.eng.get("api_key")).start()
    return True


def _smoke_captures(job: _Job) -> None:
    """Two greedy captures of the smoke corpus (the correctness gate compares them across arms)."""
    from specstudy.measure import greedy_capture

    job.stage = "smoke"
    prompts = job.smoke_prompts
    for i in (1, 2):
        job.progress.phase("smoke", f"capture {i}/2 ({len(prompts)} prompts)")
        cap = job.attempt / "smoke" / f"capture-{i}.json"
        greedy_capture.capture_greedy(job.server.base_url, job.served, prompts, cap, deployment_id=job.deployment_id,
                                      arm=job.arm["name"], capture_index=i, corpus=job.smoke_corpus,
                                      seed=job.settings.get("seed"), api_key=job.eng.get("api_key"))
        job.captures.append(str(cap))
    job.progress.end_phase()


def _measure(job: _Job) -> None:
    """The capacity search (capacity jobs) or the phase's step before its cells (the memory sweep), then the
    cells strictly in planned order, inside the phase's context (a profile job runs them under the profiler)."""
    job.cache_config, _ = prom.fetch_kv_cache_config(job.server.base_url, api_key=job.eng.get("api_key"))
    if job.to_measure:  # before the client is pinned: the sampler process keeps the job's own CPUs
        job.telemetry = _start_telemetry(job.log)
    _pin_client(job.settings.get("client_cpus"), job.log)
    job.stage = "cells"
    if job.spec["kind"] == "capacity":
        log_text = (job.attempt / layout.LAUNCH_LOG).read_text(encoding="utf-8", errors="replace")
        job.progress.phase("capacity")
        _run_capacity(job.spec, job.server, job.served, job.eng,
                      {"arm": job.arm, "cache_config": job.cache_config,
                       "confounds": launchlog.parse_launch_log(log_text)},
                      job.out, job.attempt, progress=job.progress, alive=job.death.alive)
        job.progress.end_phase()
    job.phase.before_cells(job)
    to_measure = job.to_measure
    with job.phase.around_cells(job) if to_measure else contextlib.nullcontext():
        for n, entry in enumerate(to_measure, 1):
            if not _measure_cell(job, entry, n, len(to_measure)):
                break  # the server died: the rest are marked deployment_failed when the records are written


def _start_telemetry(log) -> Any:
    """The cells' telemetry sampler process (nothing of the sampling then holds the load generator's GIL),
    or a stand-in whose every ``begin`` fails when it cannot start: the cells then go without telemetry, said
    in the job log and in each cell's
    ``telemetry.errors`` — the sampling never moves back into the load generator's process."""
    from specstudy.measure import telemetry_worker

    try:
        worker = telemetry_worker.SamplerProcess()
    except (OSError, telemetry_worker.WorkerError) as exc:
        log(f"telemetry: the sampler process did not start ({exc}); cells are measured without telemetry")
        return _NoTelemetry(str(exc))
    log(f"telemetry: sampler process {worker.pid} beside the load generator")
    return worker


class _NoTelemetry:
    """Stands in for a sampler process that did not start: every ``begin`` fails, naming why."""

    def __init__(self, why: str):
        self.why = why

    def begin(self, args: dict) -> None:
        raise RuntimeError(f"no sampler process: {self.why}")

    def end(self, timeout_s: float) -> dict:
        raise RuntimeError(f"no sampler process: {self.why}")

    def close(self) -> None:
        pass


def _measure_cell(job: _Job, entry: dict, n: int, total: int) -> bool:
    """One cell on the live server; a broken cell is data. False when the server died (stop measuring)."""
    from specstudy.inputs import corpus as corpusmod
    from specstudy.measure import cell as cellmod

    if job.watchdog is not None:
        job.watchdog.touch()
    c, settings, server = entry["cell"], job.settings, job.server
    cdir = job.attempt / _cell_rel(c)
    prompts = corpusmod.load_prompts(c["corpus_dir"])
    n_requests, n_warmup = request_counts(settings, int(c["concurrency"]))
    reqs = _request_specs(prompts, n_requests, c["workload"], settings=settings, spec=job.spec)
    warm = _request_specs(prompts, n_warmup, c["workload"], settings=settings, seed_offset=WARMUP_SEED_OFFSET,
                          spec=job.spec)
    if not job.death.alive():
        return False
    sampler = telemetry.TelemetrySampler(cdir / "telemetry.jsonl", metrics_url=server.base_url + "/metrics",
                                         pgid=server.pgid, api_key=job.eng.get("api_key"), worker=job.telemetry)
    job.log(f"cell {_cell_rel(c)}: {len(reqs)} requests at concurrency {c['concurrency']}")
    job.progress.set_context(f"cell {n}/{total} {c['workload']} c{c['concurrency']}")
    try:
        summary = cellmod.run_cell(
            server.base_url, job.served, reqs, warm, int(c["concurrency"]), cdir,
            keys=_keys(job.spec, c, job.deployment_id), corpus=entry["corpus"],
            metrics_url=server.base_url + "/metrics", fingerprint=entry["fingerprint"],
            api_key=job.eng.get("api_key"), sampler=sampler,
            drain_timeout_s=float(settings.get("drain_timeout_s", 120)),
            temperature=float(settings.get("temperature", 0.0)), seed=settings.get("seed"),
            request_timeout_s=float(settings.get("request_timeout_s", 600)),
            limits=settings.get("client_limits"), progress=job.progress, alive=job.death.alive)
    except Exception as exc:  # a broken cell is data; the deployment goes on
        job.progress.end_phase()
        traceback.print_exc()
        if not job.death.alive():
            _write_failed_cell(job, entry, "deployment_failed", _died_message(job.death, job.deployment_id, cdir))
            return False
        _write_failed_cell(job, entry, "cell_error", f"{type(exc).__name__}: {exc}")
        return True
    if not job.death.alive():  # the server died during this cell: its numbers are not a measurement
        _write_failed_cell(job, entry, "deployment_failed", _died_message(job.death, job.deployment_id, cdir))
        return False
    _mark_jit(job, summary, cdir / layout.CELL_SUMMARY)
    v = summary.get("validity") or {}
    job.log(f"cell {_cell_rel(c)}: valid={v.get('valid')} reasons={[r.get('code') for r in v.get('reasons', [])]}")
    _publish_cell(job, entry, cdir / layout.CELL_SUMMARY, "valid" if v.get("valid") else "rejected")
    return True


def _mark_jit(job: _Job, summary: dict, path: Path) -> None:
    """A Triton JIT compilation the arm's own launch log shows inside this cell's window marks the cell with
    the pre-registered consequence (specstudy.analysis.jit: ``flag`` a note, ``reject`` a rejecting reason)."""
    from specstudy.analysis import jit
    from specstudy.measure import cell as cellmod

    log_path = job.attempt / layout.LAUNCH_LOG
    if not log_path.exists():
        return
    consequence = jit.consequence_of(job.lock.get("content"))
    try:
        log_text = jit.read_log(log_path)
        clock = launchlog.startup_steps(log_text, ready=job.times.get("ready"))["log_clock"]
        found = jit.apply(summary, log_text, clock, consequence)
    except Exception:  # the check must never lose a measured cell
        traceback.print_exc()
        job.log("cell: the JIT-in-window check failed (traceback above); the cell is left as measured")
        return
    if not found["checked"] and jit.jit_events(log_text):
        job.log(f"cell: the launch log holds JIT compilations but the window could not be checked: {found['why']}")
    if found["events"]:
        job.log(f"cell: {len(found['events'])} JIT compilation(s) inside the window: "
                f"{', '.join(e['kernel'] for e in found['events'])}")
        cellmod.validate_summary(summary, path)
        atomic.write_json(path, summary)


def _stop(job: _Job) -> None:
    """Stop the server group (always), note why it may have gone early, read the launch log, collect provenance."""
    if job.telemetry is not None:
        job.telemetry.close()
        job.telemetry = None
    if job.death is not None:
        job.death.close()
        if job.death.died and job.status == "ok":
            job.fail(job.stage, "exited", f"server exited with code {job.death.exit_code} at {job.death.died_at} "
                                          f"during {job.stage}; its process group was stopped at once",
                     job.death.exit_code)
    if job.watchdog is not None:
        job.watchdog.close()
        if job.watchdog.fired:
            job.fail("idle_watchdog", "idle_timeout",
                     f"server idle for more than {job.eng['idle_timeout_s']} s; stopped by the watchdog")
    job.progress.set_context("")
    job.progress.phase("stop")
    try:
        job.stop_info = job.server.stop(grace_s=job.grace_s) if job.server is not None else None
    except readiness.TerminatedBySignal as exc:  # SIGTERM/SIGINT while stopping: the stop completed first
        job.stop_info = job.server.stop_report
        job.cancelled_code = 128 + exc.signum
        job.fail("cancelled", "signal", f"job received signal {exc.signum} while stopping the server",
                 job.cancelled_code)
    job.times["stop"] = utc_now()
    job.progress.end_phase()
    log_path = job.attempt / layout.LAUNCH_LOG
    log_text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
    if log_text:
        job.confounds = launchlog.parse_launch_log(log_text)
        info = getattr(job.server, "launch_info", None) or {}
        job.startup = launchlog.startup_steps(log_text, ready=job.times["ready"], confounds=job.confounds,
                                               cache=(info.get("compile_cache") or {}).get("state"))
    try:
        job.provenance = provenance.collect_provenance(
            job.eng, job.arm, deployment_id=job.deployment_id, server=job.server,
            command=job.server.record_command if job.server is not None else None,
            corpus={"smoke": job.smoke_corpus, **{e["cell"]["workload"]: e["corpus"] for e in job.cells}},
            launch_log=log_path if log_path.exists() else None, times=job.times,
            hash_cache=layout.hash_cache(job.results_root))
    except Exception:  # provenance must never lose the measurements
        traceback.print_exc()
        job.provenance = None
    if job.provenance is not None:  # how the server became ready and how it was stopped
        job.provenance.update({k: v for k, v in (("readiness", job.readiness), ("stop", job.stop_info)) if v})
    if job.stop_info:
        job.log(f"server stopped: {job.stop_info}")
    job.progress.close()


def _write_records(job: _Job) -> int:
    """The failure record (a failed deployment), the cells it could not measure, the deployment record."""
    if job.status == "failed":
        fpath = records.write_failure_record(
            job.results_root, phase=job.spec["phase"], arm=job.arm, rep=job.spec["rep"],
            deployment_id=job.deployment_id, stage=job.failure["stage"], reason=job.failure["reason"],
            log_path=job.attempt / layout.LAUNCH_LOG, command=job.server.record_command if job.server is not None else None,
            exit_code=job.exit_code, message=job.failure.get("message"), provenance=job.provenance,
            confounds=job.confounds, times=job.times, secrets=getattr(job.server, "secrets", ()))
        job.failure = dict(atomic.read_json(fpath)["failure"], record=str(fpath))
        if not job.cancelled and not job.config_fault:  # leave the cells missing so the study resumes
            done = {(r["workload"], r["concurrency"]) for r in job.cell_records}
            for e in job.to_measure:
                if (e["cell"]["workload"], int(e["cell"]["concurrency"])) not in done:
                    _write_failed_cell(job, e, "deployment_failed",
                                       f"deployment {job.deployment_id} failed at {job.failure['stage']}: "
                                       f"{job.failure.get('reason')} (see {fpath})")
    rec = dict(_record_base(job), status=job.status, failure=job.failure,
               command=job.server.record_command if job.server is not None else None, provenance=job.provenance,
               confounds=job.confounds, startup=job.startup, cache_config=job.cache_config,
               smoke={"captures": job.captures}, cells=job.cell_records, times=job.times,
               extension=dict(job.extension, attempt=str(job.attempt)) if job.extension else None,
               prereg_sha256=job.lock.get("sha256"), block=job.spec.get("block"), order=job.spec.get("order"),
               phases=job.progress.timeline())
    previous = _previous_ok_record(job.out)
    if job.status != "ok" and previous is not None and not job.captures:
        rec["smoke"] = previous.get("smoke", {"captures": []})
    _write_record(job.out, job.attempt, rec, publish=not job.cancelled and not job.config_fault)
    if job.cancelled:
        job.log(f"deployment {job.deployment_id} cancelled; exiting {job.cancelled_code}")
        return job.cancelled_code
    if job.config_fault:
        # every deployment would fail the same way: the job fails (no record published), so the deployments
        # that wait for the phase's first one never start; the failure record keeps the log
        print(f"specstudy: deployment {job.deployment_id} could not start because of the study's configuration, "
              f"not the node: {job.config_fault['detail']}\nFix: {job.config_fault['fix']}\n"
              f"(failure record: {job.failure.get('record')})", file=sys.stderr, flush=True)
        return CONFIG_FAULT_EXIT
    return 0


def _died_message(death, deployment_id: str, cdir: Path) -> str:
    return (f"server of deployment {deployment_id} exited with code {death.exit_code} at {death.died_at} during this "
            f"cell; partial raw artifacts in {cdir}. Re-run the cell: the next deployment reuses the valid cells")


def _pin_client(cpus, log) -> None:
    """Pin this process (the load generator) to ``cpus``; the server started earlier keeps its affinity."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    usable = set(cpus) & os.sched_getaffinity(0)
    if not usable:
        log(f"client_cpus {cpus} not available here (CPUs {sorted(os.sched_getaffinity(0))}); load generator not pinned")
        return
    os.sched_setaffinity(0, usable)
    log(f"load generator pinned to CPUs {sorted(usable)}")


def _write_record(out: Path, attempt: Path, rec: dict, publish: bool = True) -> None:
    """The record goes to the attempt; ``publish`` also makes it the declared ``deployment.json``
    (not for a cancelled job: its outputs stay missing, so re-running the target resumes the study)."""
    from specstudy.core import schemas
    from specstudy.core.content import same_deployment

    schemas.validate(rec, "deployment", f"{attempt}/{layout.ATTEMPT_RECORD}")
    atomic.write_json(attempt / layout.ATTEMPT_RECORD, rec)
    if publish:  # a republication of the same deployment (cells reused, no server) leaves the file as it is
        atomic.write_json_if_changed(out / layout.DEPLOYMENT_RECORD, rec, same=same_deployment)


CAPACITY_FILES = ("gates.json", "steps.jsonl", "soaks.jsonl", "capacity.png", "knee.json")  # knee.json last


def _run_capacity(spec: dict, server, served: str, eng: dict, record: dict, out: Path, attempt: Path,
                  progress=None, alive=None) -> None:
    """The search runs in ``<attempt>/capacity/`` (its raw steps too); only a complete search replaces the
    published result in ``out`` — an interrupted one leaves the previous attempt's files untouched."""
    from specstudy.inputs import corpus as corpusmod
    from specstudy.measure import capacity
    from specstudy.study.template_args import request_extra_body

    cap = spec["capacity"]
    extra = request_extra_body(spec, cap["workload"]) if cap.get("workload") else {}  # the capacity workload's switch, if it declares one
    prompts = [dict(p, extra_body=dict(p.get("extra_body") or {}, **extra))
               for p in corpusmod.load_prompts(spec["capacity_corpus_dir"])]
    work = attempt / "capacity"
    capacity.run_capacity(server.base_url, served, prompts, cap["gates"], cap.get("search") or {}, work,
                          server.base_url + "/metrics", deployment_record=record, arm=spec["arm"]["name"],
                          api_key=eng.get("api_key"), progress=progress)
    if alive is not None and not alive():  # the server died during the search: its steps measured a dead server
        raise RuntimeError(f"{work}: the server died during the capacity search; the published result stays as it was")
    publish_capacity(work, out)


def publish_capacity(work: Path, out: Path) -> None:
    """Copy a complete search's files from its attempt into ``out`` atomically, ``knee.json`` last."""
    if not (work / "knee.json").exists():
        raise RuntimeError(f"{work}: capacity search wrote no knee.json; the published result stays as it was")
    for name in CAPACITY_FILES:
        src = work / name
        if src.exists():
            atomic.replace_if_changed(out / name, src.read_bytes())
        else:
            (out / name).unlink(missing_ok=True)


def _cmd_run(args) -> int:
    spec = deployment_spec(read_plan(args.plan), args.deployment, load_settings(args.config))
    # Line-buffered: Snakemake sends stdout to the job log, and `tail -f` must show lines as they come.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    print(f"deployment {args.deployment} of {args.plan}", flush=True)
    try:
        return run_deployment(spec, args.out, None if spec["kind"] == "capacity" else args.plan, args.lock)
    finally:
        sys.stdout.flush()


def register(sub) -> None:
    p = sub.add_parser("deployment", help="deployment jobs")
    dsub = p.add_subparsers(dest="deployment_command", required=True)
    r = dsub.add_parser("run", help="run one deployment of a plan: launch, readiness, smoke captures, cells, stop")
    r.add_argument("--plan", required=True, help="the plan JSON (results/plan/<phase>.json): what to run, and the "
                   "corpus digests the cells must match; for capacity/<arm>/rep1 the confirmation plan")
    r.add_argument("--deployment", required=True, help="the plan's deployment <phase>/<arm>/<rep>, e.g. "
                   "screen/draft-k3-tp4/rep1 (or capacity/<arm>/rep1 for an arm's capacity search)")
    r.add_argument("--config", required=True, help="the effective study config (results/.config/<hash>.json): "
                   "engine, cell settings, corpora")
    r.add_argument("--out", required=True, help="results/<phase>/<arm>/<rep>")
    r.add_argument("--lock", help="pre-registration lock JSON")
    r.set_defaults(func=_cmd_run)
