"""Why the vLLM server is started in the job's session (``process_group=0``), not a new one (``setsid``).

vLLM's engine and worker processes wait for each other in ``sched_yield()`` spin loops. With the
kernel's autogroup scheduling on (``/proc/sys/kernel/sched_autogroup_enabled``), every session is its
own scheduling group; spinners in *another* session on every core were seen here to keep a sleeping
task of this session off the CPU for hundreds of milliseconds. A load generator sharing the machine
then sends late, reads streams in bursts and measures the server wrongly.

This benchmark reproduces it without vLLM: one ``sched_yield`` spinner pinned to each core, started
either in a new session (as ``start_new_session=True`` did) or in this session with its own process
group (as the deployment does now), while a probe thread per core sleeps 1 ms at a time and records
how late each wake-up is. It prints the figures for both placements and their ratio.

    python benchmarks/autogroup.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

SPINNER = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    os.sched_yield()
"""


def _probe(cpu: int, seconds: float, out: dict) -> None:
    os.sched_setaffinity(0, {cpu})  # this thread only
    late: list[float] = []
    end = time.perf_counter() + seconds
    while True:
        t = time.perf_counter()
        if t >= end:
            break
        time.sleep(0.001)
        late.append((time.perf_counter() - t - 0.001) * 1e3)
    out[cpu] = late


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] if xs else float("nan")


def run(placement: str, seconds: float) -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    kw = {"start_new_session": True} if placement == "new session" else {"process_group": 0}
    spinners = [subprocess.Popen([sys.executable, "-c", SPINNER, str(c), str(seconds + 1.0)], **kw) for c in cpus]
    try:
        time.sleep(0.3)
        out: dict[int, list[float]] = {}
        threads = [threading.Thread(target=_probe, args=(c, seconds, out)) for c in cpus]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    late = [x for c in cpus for x in out.get(c, [])]
    return {"placement": placement, "wakeups": len(late), "p50_ms": _pct(late, 50), "p99_ms": _pct(late, 99),
            "max_ms": max(late, default=float("nan")), "over_50ms": sum(x > 50 for x in late)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args(argv)
    try:
        autogroup = open("/proc/sys/kernel/sched_autogroup_enabled").read().strip()
    except OSError:
        autogroup = "unknown"
    print(f"cores: {sorted(os.sched_getaffinity(0))}  sched_autogroup_enabled: {autogroup}  kernel: {os.uname().release}")
    rows = [run("new session", args.seconds), run("same session", args.seconds)]
    print(f"{'spinners started in':<20} {'wake-ups':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'>50 ms':>7}")
    for r in rows:
        print(f"{r['placement']:<20} {r['wakeups']:>9} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['max_ms']:>8.1f} "
              f"{r['over_50ms']:>7}")
    new, same = rows
    if same["max_ms"] > 0:
        print(f"worst wake-up delay, new session / same session: {new['max_ms'] / same['max_ms']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
