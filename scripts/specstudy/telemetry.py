"""Telemetry beside each cell: a sampler thread writing a JSONL time series.

Each sample (one JSON object per line) holds ``t`` (seconds since the sampler started), ``unix``
and flat series values:

- vLLM gauges from ``/metrics``: ``vllm.num_requests_running``, ``vllm.num_requests_waiting``,
  ``vllm.kv_cache_usage_perc``, ``vllm.num_preemptions_total`` (a counter; the summary gives its
  ``delta``), summed over engines;
- hardware: with ``nvidia-smi``, per GPU ``gpu<i>.utilization_pct``, ``gpu<i>.memory_used_mib``,
  ``gpu<i>.power_w``, ``gpu<i>.sm_clock_mhz``; without a GPU, ``proc.cpu_pct`` (sum over the
  server's process group, 100 = one core), ``proc.rss_bytes``, ``proc.count`` and ``host.cpu_pct``.

``summary()`` returns ``{samples, interval_s, errors, series: {name: {count, mean, max[, delta]}}}``
for the cell summary's ``telemetry`` block. The file is written to a hidden sibling while sampling
and renamed into place by ``stop()`` (readers never see a half-written file).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

VLLM_SERIES = {
    "vllm:num_requests_running": "vllm.num_requests_running",
    "vllm:num_requests_waiting": "vllm.num_requests_waiting",
    "vllm:kv_cache_usage_perc": "vllm.kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc": "vllm.kv_cache_usage_perc",  # older vLLM name
    "vllm:num_preemptions_total": "vllm.num_preemptions_total",
}
COUNTER_SERIES = {"vllm.num_preemptions_total"}
_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
GPU_FIELDS = [("utilization.gpu", "utilization_pct"), ("memory.used", "memory_used_mib"),
              ("power.draw", "power_w"), ("clocks.sm", "sm_clock_mhz")]


def parse_vllm_gauges(text: str) -> dict[str, float]:
    """Sum the tracked vLLM gauges/counters over all label sets of a /metrics scrape."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m or m.group(1) not in VLLM_SERIES:
            continue
        try:
            val = float(m.group(3))
        except ValueError:
            continue
        key = VLLM_SERIES[m.group(1)]
        out[key] = out.get(key, 0.0) + val
    return out


def query_nvidia_smi(smi: str = "nvidia-smi", timeout: float = 10.0) -> dict[str, float] | None:
    """One ``nvidia-smi --query-gpu`` sample as flat series, or None without a usable GPU."""
    if shutil.which(smi) is None:
        return None
    q = ",".join(["index"] + [f for f, _ in GPU_FIELDS])
    try:
        r = subprocess.run([smi, f"--query-gpu={q}", "--format=csv,noheader,nounits"], capture_output=True,
                           text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0 or not r.stdout.strip():
        return None
    return parse_nvidia_smi_csv(r.stdout)


def parse_nvidia_smi_csv(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 1 + len(GPU_FIELDS):
            continue
        idx = parts[0]
        for (_, name), raw in zip(GPU_FIELDS, parts[1:], strict=True):
            try:
                out[f"gpu{idx}.{name}"] = float(raw)
            except ValueError:  # "[N/A]", "[Not Supported]"
                continue
    return out


class _GroupCPU:
    """CPU% and RSS summed over the processes of one process group (and a root's descendants)."""

    def __init__(self, pgid: int | None = None, root_pid: int | None = None):
        import psutil

        self.psutil = psutil
        self.pgid = pgid
        self.root_pid = root_pid
        self._procs: dict[int, Any] = {}
        psutil.cpu_percent(None)

    def _members(self) -> list[int]:
        ps = self.psutil
        pids = set()
        if self.root_pid is not None:
            try:
                root = ps.Process(self.root_pid)
                pids.add(root.pid)
                pids.update(c.pid for c in root.children(recursive=True))
            except ps.NoSuchProcess:
                pass
        if self.pgid is not None:
            for p in ps.process_iter(["pid"]):
                try:
                    if os.getpgid(p.pid) == self.pgid:
                        pids.add(p.pid)
                except (ProcessLookupError, PermissionError, ps.NoSuchProcess):
                    continue
        return sorted(pids)

    def sample(self) -> dict[str, float]:
        ps = self.psutil
        cpu = rss = 0.0
        count = 0
        live = {}
        for pid in self._members():
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = ps.Process(pid)
                    proc.cpu_percent(None)  # prime: the first call always returns 0
                else:
                    cpu += proc.cpu_percent(None)
                rss += proc.memory_info().rss
                count += 1
                live[pid] = proc
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
                continue
        self._procs = live
        return {"proc.cpu_pct": round(cpu, 3), "proc.rss_bytes": rss, "proc.count": float(count),
                "host.cpu_pct": ps.cpu_percent(None)}


class TelemetrySampler:
    """Sample vLLM gauges and hardware every ``interval_s`` seconds into ``out_path`` (JSONL).

    Use as a context manager around one cell, or ``start()`` / ``stop()``; ``summary()`` afterwards.
    ``gpu``: True/False forces nvidia-smi on/off; None detects it on the first sample.
    """

    def __init__(self, out_path: str | os.PathLike, *, metrics_url: str | None = None, pgid: int | None = None,
                 root_pid: int | None = None, interval_s: float = 1.0, gpu: bool | None = None,
                 api_key: str | None = None, http_timeout_s: float = 2.0):
        self.out_path = Path(out_path)
        self.metrics_url = metrics_url
        self.interval_s = float(interval_s)
        self.gpu = gpu
        self.api_key = api_key
        self.http_timeout_s = http_timeout_s
        self.pgid, self.root_pid = pgid, root_pid
        self._cpu: _GroupCPU | None = None
        self._rows: list[dict] = []
        self._errors: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="telemetry-sampler")
        self._tmp = self.out_path.with_name(f".{self.out_path.name}.partial")
        self._fh = None
        self._t0 = None

    # -- sampling -------------------------------------------------------------------------------
    def _scrape(self) -> dict[str, float]:
        if not self.metrics_url:
            return {}
        import urllib.request

        req = urllib.request.Request(self.metrics_url)
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.http_timeout_s) as resp:
                return parse_vllm_gauges(resp.read().decode("utf-8", errors="replace"))
        except (OSError, ValueError) as exc:
            key = f"metrics: {type(exc).__name__}"
            self._errors[key] = self._errors.get(key, 0) + 1
            return {}

    def _hardware(self) -> dict[str, float]:
        if self.gpu is not False:
            gpu = query_nvidia_smi()
            if gpu:
                self.gpu = True
                return gpu
            if self.gpu:
                self._errors["nvidia-smi failed"] = self._errors.get("nvidia-smi failed", 0) + 1
                return {}
            self.gpu = False
        if self.pgid is None and self.root_pid is None:
            return {}
        if self._cpu is None:
            self._cpu = _GroupCPU(self.pgid, self.root_pid)
        return self._cpu.sample()

    def sample_once(self) -> dict:
        now = time.monotonic()
        row: dict[str, Any] = {"t": round(now - (self._t0 or now), 3), "unix": round(time.time(), 3)}
        row.update(self._scrape())
        row.update(self._hardware())
        self._rows.append(row)
        if self._fh is not None:
            self._fh.write(json.dumps(row, sort_keys=True) + "\n")
            self._fh.flush()
        return row

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # noqa: BLE001 - telemetry must never kill a cell
                key = f"sample: {type(exc).__name__}: {exc}"[:200]
                self._errors[key] = self._errors.get(key, 0) + 1
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> TelemetrySampler:
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self._tmp, "w", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 15)
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None
            os.replace(self._tmp, self.out_path)
        return self.summary()

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- summary --------------------------------------------------------------------------------
    def summary(self) -> dict:
        return summarize(self._rows, interval_s=self.interval_s, errors=self._errors,
                         source="nvidia-smi" if self.gpu else ("psutil" if self._cpu else None))


def summarize(rows: list[dict], *, interval_s: float | None = None, errors: dict | None = None,
              source: str | None = None) -> dict:
    """mean/max (and ``delta`` for counters) of every numeric series in ``rows``."""
    series: dict[str, list[float]] = {}
    for row in rows:
        for k, v in row.items():
            if k in ("t", "unix") or isinstance(v, bool) or not isinstance(v, int | float):
                continue
            series.setdefault(k, []).append(float(v))
    out = {}
    for k, vals in sorted(series.items()):
        entry = {"count": len(vals), "mean": round(sum(vals) / len(vals), 6), "max": max(vals)}
        if k in COUNTER_SERIES:
            entry["delta"] = vals[-1] - vals[0]
        out[k] = entry
    return {"samples": len(rows), "interval_s": interval_s, "hardware_source": source,
            "errors": dict(errors or {}), "series": out}


def summarize_file(path: str | os.PathLike) -> dict:
    from specstudy import atomic

    return summarize(atomic.read_jsonl(path))


def _cmd_summary(args) -> int:
    path = Path(args.jsonl)
    if not path.exists():
        print(f"{path}: no such telemetry file", file=sys.stderr)
        return 2
    print(json.dumps(summarize_file(path), indent=2, sort_keys=True))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("telemetry-summary", help="mean/max per series of a cell's telemetry.jsonl")
    p.add_argument("jsonl")
    p.set_defaults(func=_cmd_summary)
