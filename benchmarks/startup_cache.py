"""Does a shared compile cache shorten vLLM start-ups? Cold vs warm cache, with eager mode as the peer.

A deployment's start-up is paid once per deployment, and a study has dozens of them. With
torch.compile + CUDA graphs (vLLM's default), a start compiles the model unless the compile cache
(``VLLM_CACHE_ROOT``; inductor and Triton caches beside it) already holds the artifacts. This
benchmark starts the baseline arm of a study config through the deployment job's own launcher
(``server_launch.start_server`` with the study's engine settings) three times in one run:

1. compiled, cold cache: a fresh cache directory (VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR,
   TRITON_CACHE_DIR all inside it);
2. compiled, warm cache: the same directory again;
3. eager (``--enforce-eager``, no compile, no graphs): the peer the study configs compare against.

For each start it prints the time to ready (``/v1/models`` + one real chat completion), the engine's
own figures from the launch log (model loading, torch.compile, graph capture, engine init), TPOT p50
of a short closed-loop run at concurrency 1 (so a reader sees what the faster start costs per token),
and the ratios warm/cold and eager/warm.

    python benchmarks/startup_cache.py --config config/gpu-h200.yaml [--requests 16] [--json out.json]

Needs the fixture models and corpora of that config (its study, or `snakemake --configfile ... \
results/models/fixture/models.json results/corpora/bundled-open_chat/1/corpus.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from autogroup import bench_requests  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from specstudy.core.stat_util import median  # noqa: E402
from specstudy.deployment import launch as server_launch  # noqa: E402
from specstudy.deployment import launchlog, readiness  # noqa: E402
from specstudy.job.spec import engine_flat  # noqa: E402
from specstudy.measure import loadgen  # noqa: E402
from specstudy.study import config as configmod  # noqa: E402

CACHE_VARS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def _engine_variant(engine: dict, *, eager: bool, cache_dir: Path) -> dict:
    eng = engine_flat(engine)
    args = [a for a in eng["extra_args"] if a != "--enforce-eager"]
    if eager:
        args.append("--enforce-eager")
    eng["extra_args"] = args
    # The compile cache through the launcher's own setting (engine.server.cache_root -> VLLM_CACHE_ROOT),
    # the inductor and Triton caches beside it, so that "cold" is cold for all three.
    eng["cache_root"] = str(cache_dir / "vllm")
    eng["env"] = dict(eng["env"], TORCHINDUCTOR_CACHE_DIR=str(cache_dir / "inductor"),
                      TRITON_CACHE_DIR=str(cache_dir / "triton"))
    eng["env"].pop("VLLM_CACHE_ROOT", None)
    return eng


def start_once(engine: dict, label: str, *, eager: bool, cache_dir: Path, requests: list, logdir: Path) -> dict:
    served = engine["target"]["served_model_name"]
    eng = _engine_variant(engine, eager=eager, cache_dir=cache_dir)
    files_before = sum(1 for p in cache_dir.rglob("*") if p.is_file()) if cache_dir.exists() else 0
    attempt = logdir / label.replace(" ", "-")
    attempt.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    server, _ = server_launch.start_server(eng, {"name": "baseline", "method": "baseline"}, attempt_dir=attempt,
                              served_model_name=served)
    try:
        ready = readiness.wait_ready(server, timeout_s=float(eng["readiness_timeout_s"]))
        ready_s = time.monotonic() - t0
        res = loadgen.run_closed_loop(server.base_url, served, requests, 1, request_timeout_s=120)
    finally:
        server.stop(grace_s=float(eng["stop_grace_s"]))
    ok = [r for r in res.rows if r.get("success") and r.get("tpot_ms") is not None]
    log_text = (attempt / "launch.log").read_text(encoding="utf-8", errors="replace")
    conf = launchlog.parse_launch_log(log_text)
    comp = conf.get("compilation") or {}
    startup = launchlog.startup_steps(log_text, ready=server.ready_at, confounds=conf,
                                    cache="cold" if files_before == 0 else "warm")
    return {"label": label, "eager": eager, "cache_files_before": files_before, "ready_s": round(ready_s, 2),
            "ready_probe_s": ready["seconds"], "model_loading_s": (conf.get("model_loading") or {}).get("seconds"),
            "engine_init_s": conf.get("engine_init_seconds"),
            "compile_s": comp.get("torch_compile_seconds"), "graph_capture_s": comp.get("graph_capture_seconds"),
            "compile_cache": comp.get("compile_cache"), "startup_phases": startup.get("phases"),
            "tpot_p50_ms": round(median(r["tpot_ms"] for r in ok), 3) if ok else None,
            "ok": len(ok), "n": len(res.rows), "launch_log": str(attempt / "launch.log")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "config/gpu-h200.yaml"), help="study config (its engine)")
    ap.add_argument("--corpus", default=None, help="a built corpus version dir (default: the open_chat one)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--logdir", default=None, help="where the launch logs go (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    cfg = configmod.load_config(args.config)
    engine = cfg["engine"]
    if not Path(engine["target"]["path"], "config.json").exists():
        print(f"{engine['target']['path']}: no model; build the study's fixture models first", file=sys.stderr)
        return 2
    reqs = bench_requests(args.corpus, args.requests)
    logdir = Path(args.logdir or tempfile.mkdtemp(prefix="startup-cache-"))
    cache = Path(tempfile.mkdtemp(prefix="startup-cache-dir-"))
    shutil.rmtree(cache)
    rows = []
    for label, eager in (("compiled cold cache", False), ("compiled warm cache", False), ("eager", True)):
        rows.append(start_once(engine, label, eager=eager, cache_dir=cache, requests=reqs, logdir=logdir))
        r = rows[-1]
        print(f"{label:<22} ready {r['ready_s']:7.1f} s  engine init {r['engine_init_s']}  compile {r['compile_s']}  "
              f"graphs {r['graph_capture_s']}  TPOT p50 {r['tpot_p50_ms']} ms  ({r['ok']}/{r['n']} ok, "
              f"{r['cache_files_before']} cache files before)", flush=True)
    cold, warm, eager = rows
    print(f"ratio warm/cold ready: {warm['ready_s'] / cold['ready_s']:.2f}   eager/warm ready: "
          f"{eager['ready_s'] / warm['ready_s']:.2f}   eager/compiled TPOT p50: "
          + (f"{eager['tpot_p50_ms'] / warm['tpot_p50_ms']:.2f}" if eager["tpot_p50_ms"] and warm["tpot_p50_ms"] else "n/a"))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
