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

import json
import os
import sys
import traceback
from pathlib import Path

from . import atomic


def engine_flat(engine: dict) -> dict:
    """Map the study config's ``engine`` section onto the launcher's flat engine settings."""
    target = engine["target"]
    server = engine.get("server") or {}
    key_env = server.get("api_key_env")
    flat = {
        "backend": engine.get("backend", "local"),
        "python": engine.get("python"),
        "model": target["path"],
        "tokenizer": target.get("tokenizer") or target["path"],
        "tensor_parallel_size": target.get("tensor_parallel_size", 1),
        "max_model_len": target["max_model_len"],
        "dtype": target.get("dtype"),
        "chat_template": target.get("chat_template"),
        "draft_model": (engine.get("draft") or {}).get("path"),
        "gpu_memory_utilization": server.get("gpu_memory_utilization", 0.9),
        "extra_args": list(server.get("extra_args") or []),
        "env": dict(server.get("env") or {}),
        "host": server.get("host", "127.0.0.1"),
        "port": server.get("port"),
        "readiness_timeout_s": server.get("ready_timeout_s", 900),
        "stop_grace_s": server.get("stop_grace_s", 30),
        "idle_timeout_s": server.get("idle_timeout_s"),
        "cache_root": server.get("cache_root"),
        "api_key": os.environ.get(key_env) if key_env else None,
    }
    if engine.get("container"):
        flat["container"] = engine["container"]
    return flat


def _request_specs(prompts: list[dict], n: int, workload: str, offset: int = 0):
    from .loadgen import RequestSpec

    if not prompts:
        raise ValueError(f"workload {workload}: the corpus has no prompts")
    out = []
    for i in range(n):
        p = prompts[(offset + i) % len(prompts)]
        out.append(RequestSpec(prompt_id=p["prompt_id"], workload=workload, messages=p["messages"],
                               max_tokens=int(p["max_tokens"])))
    return out


def request_counts(settings: dict, concurrency: int) -> tuple[int, int]:
    """(measured, warm-up) request counts of a cell at ``concurrency``.

    ``cells.requests_by_concurrency`` / ``cells.warmup_requests_by_concurrency`` (keys are concurrency
    levels) override ``cells.requests`` / ``cells.warmup_requests`` for the levels they name, so a cell at
    concurrency 32 can send enough requests to keep 32 in flight for a while without making the cells at
    concurrency 1 long.
    """
    def pick(by_key: str, default_key: str) -> int:
        by = settings.get(by_key) or {}
        value = by.get(str(int(concurrency)), by.get(int(concurrency)))
        return int(settings[default_key] if value is None else value)

    return pick("requests_by_concurrency", "requests"), pick("warmup_requests_by_concurrency", "warmup_requests")


# Settings that cannot change a measurement (where and how long to wait, how to reach the server).
_OPERATIONAL_SERVER_KEYS = ("host", "port", "ready_timeout_s", "stop_grace_s", "idle_timeout_s", "api_key_env")
_OPERATIONAL_CELL_KEYS = ("reuse_valid",)
_HASH_LIMIT = 64 << 20  # files up to 64 MiB are hashed; larger ones (real weights) by name, size and mtime


def model_identity(path: str | None) -> dict | None:
    """What identifies a model directory's content: config.json's sha256 and every file's name, size
    and (up to 64 MiB) sha256 — larger files by mtime. ``None`` when the path is not readable here."""
    from .atomic import sha256_file

    if not path:
        return None
    root = Path(path)
    if not root.exists():
        return {"path": str(path), "readable": False}
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    entries = []
    for f in files:
        st = f.stat()
        entry = {"name": str(f.relative_to(root)) if f != root else f.name, "size": st.st_size}
        if st.st_size <= _HASH_LIMIT:
            entry["sha256"] = sha256_file(f)
        else:
            entry["mtime_ns"] = st.st_mtime_ns
        entries.append(entry)
    return {"path": str(path), "readable": True, "files": entries}


def engine_identity(engine: dict) -> dict:
    """The engine software a measurement ran on: the local interpreter's vLLM/torch versions, or the
    container image (path, size, mtime). Collected once per deployment job."""
    from . import deploy

    if engine.get("backend", "local") == "container":
        cont = engine.get("container") or {}
        image = cont.get("image")
        st = Path(image).stat() if image and Path(image).exists() else None
        return {"backend": "container", "image": image, "image_size": st.st_size if st else None,
                "image_mtime_ns": st.st_mtime_ns if st else None}
    sw = deploy.server_software(engine.get("python"))
    return {"backend": "local", **{k: sw.get(k) for k in ("python", "vllm", "vllm_distribution", "torch", "transformers")}}


def fingerprint_context(spec: dict) -> dict:
    """Everything of the deployment that can change a cell's measurement (computed once per job)."""
    engine = spec["engine"]
    server = {k: v for k, v in (engine.get("server") or {}).items() if k not in _OPERATIONAL_SERVER_KEYS}
    arm = {k: v for k, v in spec["arm"].items() if k not in ("servable", "skip_reason")}
    ctx = {
        "arm": arm,
        "engine": {"backend": engine.get("backend", "local"), "python": engine.get("python"),
                   "target": engine["target"], "server": server, "container": engine.get("container")},
        "engine_software": engine_identity(engine),
        "target_identity": model_identity(engine["target"].get("path")),
        "cell_settings": {k: v for k, v in spec["cell_settings"].items() if k not in _OPERATIONAL_CELL_KEYS},
    }
    if arm.get("method") == "draft_model":  # the draft is loaded only by draft arms
        ctx["engine"]["draft"] = engine.get("draft")
        ctx["draft_identity"] = model_identity((engine.get("draft") or {}).get("path"))
    return ctx


def _fingerprint(spec: dict, cell: dict, digest: str, context: dict | None = None) -> str:
    """The cell fingerprint: the deployment's context (arm, engine settings and software, model
    identities, every client setting) plus the cell's workload, concurrency and corpus digest."""
    from .cell import cell_fingerprint

    context = context if context is not None else fingerprint_context(spec)
    return cell_fingerprint(dict(context, workload=cell["workload"], concurrency=int(cell["concurrency"]),
                                 corpus_digest=digest))


def _cell_rel(cell: dict) -> str:
    return f"{cell['workload']}/c{int(cell['concurrency'])}"


def _previous_valid(out: Path, cell: dict, fingerprint: str) -> Path | None:
    """Newest earlier attempt of this cell that is valid with the same fingerprint."""
    best = None
    for path in sorted((out / "attempts").glob(f"*/{_cell_rel(cell)}/summary.json")):
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
    for path in (out / "attempts").glob("*/record.json"):
        try:
            rec = atomic.read_json(path)
        except (OSError, ValueError):
            continue
        if rec.get("status") == "ok" and rec.get("smoke", {}).get("captures") and path.stat().st_mtime > best_t:
            best, best_t = rec, path.stat().st_mtime
    return best


def _keys(spec: dict, cell: dict, deployment_id: str) -> dict:
    arm = spec["arm"]
    return {"phase": spec["phase"], "arm": arm["name"], "method": arm["method"],
            "num_speculative_tokens": arm.get("num_speculative_tokens"),
            "draft_tensor_parallel_size": arm.get("draft_tensor_parallel_size"),
            "tensor_parallel_size": int(spec["engine"]["target"].get("tensor_parallel_size") or 1),
            "rep": _rep_number(spec["rep"]), "rep_label": spec["rep"], "kind": spec["kind"],
            "workload": cell["workload"], "concurrency": int(cell["concurrency"]), "deployment_id": deployment_id}


def _corpus_ref(corpus_json: dict) -> dict:
    return {"name": corpus_json.get("name"), "version": str(corpus_json.get("version")), "digest": corpus_json.get("digest")}


def _rep_number(rep: str) -> int:
    digits = "".join(ch for ch in str(rep) if ch.isdigit())
    return int(digits or 0)


def run_deployment(spec: dict, out: str | os.PathLike, plan_path: str | None = None, lock_path: str | None = None,
                   results_root: str | os.PathLike = "results") -> int:
    from . import cell as cellmod
    from . import corpus as corpusmod
    from . import deploy, gate, telemetry
    from .progress import Progress

    out = Path(out)
    results_root = Path(results_root)
    arm = spec["arm"]
    phase, rep = spec["phase"], spec["rep"]
    eng = engine_flat(spec["engine"])
    settings = spec["cell_settings"]
    deployment_id = deploy.new_deployment_id(phase, arm["name"], rep)
    attempt = out / "attempts" / deployment_id
    attempt.mkdir(parents=True, exist_ok=True)
    progress = Progress(deployment_id).start()
    log = progress.log
    log(f"deployment {deployment_id}: {len(spec['cells'])} cells, attempt dir {attempt}")

    plan = atomic.read_json(plan_path) if plan_path else {}
    lock = atomic.read_json(lock_path) if lock_path else {}
    if plan.get("selection"):  # a confirmation deployment: only the selection the plan was built from
        from .select import SelectionError, verify_selection

        try:
            verify_selection(plan["selection"]["path"], plan_path)
        except SelectionError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    planned_digests = {k: v.get("digest") for k, v in (plan.get("corpora") or {}).items()}

    # Cells: corpus check, fingerprint, reuse.
    fp_context = fingerprint_context(spec)
    cells = []
    for c in spec["cells"]:
        entry = {"cell": c, "declared": out / _cell_rel(c) / "summary.json"}
        cj = atomic.read_json(Path(c["corpus_dir"]) / "corpus.json")
        entry["corpus"] = _corpus_ref(cj)
        expected = planned_digests.get(c["corpus_dir"])
        if expected and expected != cj.get("digest"):
            entry["mismatch"] = (f"{c['corpus_dir']}: corpus digest {cj.get('digest')} differs from the plan's {expected} "
                                 f"({plan_path}); the corpus changed after planning — re-run the plan rule")
        entry["fingerprint"] = _fingerprint(spec, c, cj.get("digest"), fp_context)
        prev = _previous_valid(out, c, entry["fingerprint"]) if settings.get("reuse_valid", True) else None
        entry["reuse"] = prev
        cells.append(entry)
    to_measure = [e for e in cells if e["reuse"] is None and "mismatch" not in e]
    progress.total_requests = len(to_measure) * (int(settings["requests"]) + int(settings["warmup_requests"]))
    previous = _previous_ok_record(out)
    need_server = bool(to_measure) or spec["kind"] == "capacity"
    cell_records = []

    def publish(entry: dict, summary_path: Path, status: str) -> None:
        atomic.write_bytes(entry["declared"], summary_path.read_bytes())
        if status == "reused":  # unchanged content keeps its time: nothing downstream of it looks out of date
            st = summary_path.stat()
            os.utime(entry["declared"], ns=(st.st_atime_ns, st.st_mtime_ns))
        s = atomic.read_json(summary_path)
        cell_records.append({"workload": entry["cell"]["workload"], "concurrency": int(entry["cell"]["concurrency"]),
                             "summary": str(summary_path), "status": status,
                             "deployment_id": (s.get("keys") or {}).get("deployment_id")})

    def write_failed(entry: dict, code: str, detail: str) -> None:
        s = cellmod.failed_summary(_keys(spec, entry["cell"], deployment_id), entry["corpus"], code, detail,
                                   fingerprint=entry["fingerprint"])
        path = attempt / _cell_rel(entry["cell"]) / "summary.json"
        atomic.write_json(path, s)
        publish(entry, path, code)

    for e in cells:
        if e["reuse"] is not None:
            log(f"cell {_cell_rel(e['cell'])}: reusing valid result {e['reuse']}")
            publish(e, e["reuse"], "reused")
        elif "mismatch" in e:
            write_failed(e, "corpus_mismatch", e["mismatch"])

    smoke_prompts = corpusmod.load_prompts(spec["smoke_corpus_dir"])
    smoke_corpus = _corpus_ref(atomic.read_json(Path(spec["smoke_corpus_dir"]) / "corpus.json"))
    times = {"start": deploy.utcnow(), "ready": None, "stop": None}
    record_base = {"deployment_id": deployment_id, "phase": phase, "arm": arm, "rep": _rep_number(rep), "rep_label": rep,
                   "tensor_parallel_size": {"target": int(eng.get("tensor_parallel_size") or 1),
                                            "draft": arm.get("draft_tensor_parallel_size") if arm["method"] == "draft_model"
                                            else None}}

    if not need_server:
        log("no cell to measure (all reused or refused); no server started")
        rec = dict(previous or dict(record_base, schema="specstudy.deployment/1", status="ok", failure=None,
                                    command=None, provenance=None, confounds=None, cache_config=None,
                                    smoke={"captures": []}, times=times, kind=spec["kind"]))
        rec["cells"] = cell_records
        rec["reused_by"] = deployment_id
        progress.close()
        _write_record(out, attempt, rec)
        return 0

    server = None
    watchdog = None
    death = None  # ServerDeathWatch once the server is ready
    stage_now = "start"
    status, failure, command, provenance, confounds, cache_config, captures = "ok", None, None, None, None, None, []
    startup = None
    exit_code = 0
    served = spec["engine"]["target"]["served_model_name"]
    with deploy.stop_on_signals(lambda: server, grace_s=float(eng["stop_grace_s"])):
        try:
            try:
                progress.phase("launch")
                server, backend = deploy.launch(eng, arm, attempt_dir=attempt, served_model_name=served)
                command = server.record_command
                log(f"server starting: pid {server.pid} {server.base_url}")
                deploy.wait_ready(server, timeout_s=float(eng["readiness_timeout_s"]))
                times["ready"] = deploy.utcnow()
                progress.end_phase()
                log("server ready")
                from .server_watch import ServerDeathWatch

                death = ServerDeathWatch(server, grace_s=float(eng["stop_grace_s"]), log=log).start()
                if eng.get("idle_timeout_s"):
                    watchdog = deploy.IdleWatchdog(server, float(eng["idle_timeout_s"]), grace_s=float(eng["stop_grace_s"]),
                                                   metrics_url=server.base_url + "/metrics",
                                                   api_key=eng.get("api_key")).start()
            except deploy.DeploymentError as exc:
                status = "failed"
                failure = {"stage": exc.stage, "reason": exc.reason, "message": str(exc)}
                log(f"deployment failed at {exc.stage}: {exc}")
            if status == "ok":
                stage_now = "smoke"
                for i in (1, 2):
                    progress.phase("smoke", f"capture {i}/2 ({len(smoke_prompts)} prompts)")
                    cap = attempt / "smoke" / f"capture-{i}.json"
                    gate.capture_greedy(server.base_url, served, smoke_prompts, cap, deployment_id=deployment_id,
                                        arm=arm["name"], capture_index=i, corpus=smoke_corpus,
                                        seed=settings.get("seed"), api_key=eng.get("api_key"))
                    captures.append(str(cap))
                progress.end_phase()
                cache_config, _ = deploy.fetch_cache_config(server.base_url, api_key=eng.get("api_key"))
                _pin_client(settings.get("client_cpus"), log)
                stage_now = "cells"
                if spec["kind"] == "capacity":
                    log_text = (attempt / "launch.log").read_text(encoding="utf-8", errors="replace")
                    progress.phase("capacity")
                    _run_capacity(spec, server, served, eng, {"arm": arm, "cache_config": cache_config,
                                                              "confounds": deploy.parse_launch_log(log_text)}, out,
                                  attempt, progress=progress, alive=death.alive)
                    progress.end_phase()
                for n_cell, e in enumerate(to_measure, 1):
                    if watchdog is not None:
                        watchdog.touch()
                    c = e["cell"]
                    cdir = attempt / _cell_rel(c)
                    prompts = corpusmod.load_prompts(c["corpus_dir"])
                    n_requests, n_warmup = request_counts(settings, int(c["concurrency"]))
                    reqs = _request_specs(prompts, n_requests, c["workload"])
                    warm = _request_specs(prompts, n_warmup, c["workload"])
                    if not death.alive():
                        break  # the rest are marked deployment_failed below
                    sampler = telemetry.TelemetrySampler(cdir / "telemetry.jsonl", metrics_url=server.base_url + "/metrics",
                                                         pgid=server.pgid, api_key=eng.get("api_key"))
                    log(f"cell {_cell_rel(c)}: {len(reqs)} requests at concurrency {c['concurrency']}")
                    progress.set_context(f"cell {n_cell}/{len(to_measure)} {c['workload']} c{c['concurrency']}")
                    try:
                        summary = cellmod.run_cell(
                            server.base_url, served, reqs, warm, int(c["concurrency"]), cdir,
                            keys=_keys(spec, c, deployment_id), corpus=e["corpus"],
                            metrics_url=server.base_url + "/metrics", fingerprint=e["fingerprint"],
                            api_key=eng.get("api_key"), sampler=sampler,
                            drain_timeout_s=float(settings.get("drain_timeout_s", 120)),
                            temperature=float(settings.get("temperature", 0.0)), seed=settings.get("seed"),
                            request_timeout_s=float(settings.get("request_timeout_s", 600)),
                            limits=settings.get("client_limits"), progress=progress, alive=death.alive)
                    except Exception as exc:  # a broken cell is data; the deployment goes on
                        progress.end_phase()
                        traceback.print_exc()
                        if not death.alive():
                            write_failed(e, "deployment_failed", _died_message(death, deployment_id, cdir))
                            break
                        write_failed(e, "cell_error", f"{type(exc).__name__}: {exc}")
                        continue
                    if not death.alive():  # the server died during this cell: its numbers are not a measurement
                        write_failed(e, "deployment_failed", _died_message(death, deployment_id, cdir))
                        break
                    v = summary.get("validity") or {}
                    log(f"cell {_cell_rel(c)}: valid={v.get('valid')} reasons={[r.get('code') for r in v.get('reasons', [])]}")
                    publish(e, cdir / "summary.json", "valid" if v.get("valid") else "rejected")
        except deploy.TerminatedBySignal as exc:
            status = "failed"
            failure = {"stage": "cancelled", "reason": "signal", "message": f"job received signal {exc.signum}"}
            exit_code = 128 + exc.signum
        except Exception:
            if not ((death is not None and death.died) or (watchdog is not None and watchdog.fired)):
                raise
            traceback.print_exc()  # the server died or was stopped as idle under it: a deployment failure, below
        finally:
            if death is not None:
                death.close()
                if death.died and status == "ok":
                    status = "failed"
                    failure = {"stage": stage_now, "reason": "exited",
                               "message": f"server exited with code {death.exit_code} at {death.died_at} during "
                                          f"{stage_now}; its process group was stopped at once"}
            if watchdog is not None:
                watchdog.close()
                if watchdog.fired:
                    status = "failed"
                    failure = {"stage": "idle_watchdog", "reason": "idle_timeout",
                               "message": f"server idle for more than {eng['idle_timeout_s']} s; stopped by the watchdog"}
            progress.set_context("")
            progress.phase("stop")
            stop_info = server.stop(grace_s=float(eng["stop_grace_s"])) if server is not None else None
            times["stop"] = deploy.utcnow()
            progress.end_phase()
            log_path = attempt / "launch.log"
            log_text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
            confounds = deploy.parse_launch_log(log_text) if log_text else None
            startup = None
            if log_text:
                info = getattr(server, "launch_info", None) or {}
                startup = deploy.startup_phases(log_text, ready=times["ready"], confounds=confounds,
                                                cache=(info.get("compile_cache") or {}).get("state"))
            try:
                provenance = deploy.collect_provenance(eng, arm, deployment_id=deployment_id, server=server, command=command,
                                                       corpus={"smoke": smoke_corpus,
                                                               **{e["cell"]["workload"]: e["corpus"] for e in cells}},
                                                       launch_log=log_path if log_path.exists() else None, times=times)
            except Exception:  # provenance must never lose the measurements
                traceback.print_exc()
                provenance = None
            if stop_info:
                log(f"server stopped: {stop_info}")
            progress.close()

    if status == "failed":
        fpath = deploy.write_failure_record(results_root, phase=phase, arm=arm, rep=rep,
                                            deployment_id=deployment_id, stage=failure["stage"],
                                            reason=failure["reason"], log_path=attempt / "launch.log",
                                            command=command, message=failure.get("message"), provenance=provenance,
                                            confounds=confounds, times=times, secrets=getattr(server, "secrets", ()))
        failure = dict(atomic.read_json(fpath)["failure"], record=str(fpath))
        for e in to_measure if not exit_code else []:  # cancelled: leave the cells missing so the study resumes
            if not any(r["workload"] == e["cell"]["workload"] and r["concurrency"] == int(e["cell"]["concurrency"])
                       for r in cell_records):
                write_failed(e, "deployment_failed", f"deployment {deployment_id} failed at {failure['stage']}: "
                             f"{failure.get('reason')} (see {fpath})")
    rec = dict(record_base, schema="specstudy.deployment/1", status=status, failure=failure, command=command, provenance=provenance,
               confounds=confounds, startup=startup, cache_config=cache_config, smoke={"captures": captures}, cells=cell_records,
               times=times, prereg_sha256=lock.get("sha256"), kind=spec["kind"], block=spec.get("block"),
               order=spec.get("order"), phases=progress.timeline())
    if status != "ok" and previous is not None and not captures:
        rec["smoke"] = previous.get("smoke", {"captures": []})
    _write_record(out, attempt, rec, publish=not exit_code)
    if exit_code:
        log(f"deployment {deployment_id} cancelled; exiting {exit_code}")
    return exit_code


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
    from . import schemas

    schemas.validate(rec, "deployment", f"{attempt}/record.json")
    atomic.write_json(attempt / "record.json", rec)
    if publish:
        atomic.write_json(out / "deployment.json", rec)


CAPACITY_FILES = ("gates.json", "steps.jsonl", "soaks.jsonl", "capacity.png", "knee.json")  # knee.json last


def _run_capacity(spec: dict, server, served: str, eng: dict, record: dict, out: Path, attempt: Path,
                  progress=None, alive=None) -> None:
    """The search runs in ``<attempt>/capacity/`` (its raw steps too); only a complete search replaces the
    published result in ``out`` — an interrupted one leaves the previous attempt's files untouched."""
    from . import capacity
    from . import corpus as corpusmod

    cap = spec["capacity"]
    prompts = corpusmod.load_prompts(spec["capacity_corpus_dir"])
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
            atomic.write_bytes(out / name, src.read_bytes())
        else:
            (out / name).unlink(missing_ok=True)


def _cmd_run(args) -> int:
    spec = json.loads(args.spec)
    # Line-buffered: Snakemake sends stdout to the job log, and `tail -f` must show lines as they come.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    try:
        return run_deployment(spec, args.out, args.plan, args.lock)
    finally:
        sys.stdout.flush()


def register(sub) -> None:
    p = sub.add_parser("deployment", help="deployment jobs")
    dsub = p.add_subparsers(dest="deployment_command", required=True)
    r = dsub.add_parser("run", help="run one deployment: launch, readiness, smoke captures, cells, stop")
    r.add_argument("--spec", required=True, help="deployment spec JSON (built by rules/common.smk)")
    r.add_argument("--out", required=True, help="results/<phase>/<arm>/<rep>")
    r.add_argument("--plan", help="plan JSON (corpus digests the cells must match)")
    r.add_argument("--lock", help="pre-registration lock JSON")
    r.set_defaults(func=_cmd_run)

