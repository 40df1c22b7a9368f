"""Telemetry beside each cell: a sampler writing a JSONL time series (in a thread, or in a process of its
own beside the load generator: :mod:`specstudy.measure.telemetry_worker`).

Each sample (one JSON object per line) holds ``t`` (seconds since the sampler started), ``unix``
and flat series values:

- vLLM gauges from ``/metrics``: ``vllm.num_requests_running``, ``vllm.num_requests_waiting``,
  ``vllm.kv_cache_usage_perc``, ``vllm.num_preemptions_total`` (a counter; the summary gives its
  ``delta``), summed over engines;
- GPUs through NVML (``nvidia-ml-py``, import name ``pynvml``), per GPU index ``i`` as NVML numbers
  them (every GPU the job sees: TP=4 gives gpu0..gpu3): ``gpu<i>.memory_used_mib``,
  ``gpu<i>.utilization_pct``, ``gpu<i>.memory_utilization_pct``, ``gpu<i>.sm_clock_mhz``,
  ``gpu<i>.memory_clock_mhz``, ``gpu<i>.power_w``, ``gpu<i>.temperature_c`` and ``gpu<i>.energy_j``
  (NVML's total-energy counter, joules since the driver loaded; a counter: the summary gives its ``delta``
  over the window, the energy the GPU used while the cell was measured). A field the GPU does not
  support is left out (reported once in ``errors``). Without NVML (module missing, no driver, no
  device) ``nvidia-smi`` is the documented fallback (same names, fewer fields); without either the
  sampler says so once per process (stderr) and records no GPU series;
- the server's processes (always, GPU or not): ``proc.cpu_pct`` (sum over the server's process group,
  100 = one core), ``proc.rss_bytes``, ``proc.count`` and ``host.cpu_pct``.

``summary()`` returns ``{samples, interval_s, window_s, errors, series: {name: {count, mean, max[, delta][, p50]}},
gpu, gpm}``
for the cell summary's ``telemetry`` block (``window_s``: first to last sample; ``stop()`` takes one last
sample, so the counters' deltas span the whole window). The file is written to a hidden sibling while sampling
and renamed into place by ``stop()`` (readers never see a half-written file).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from specstudy.measure import prom

VLLM_SERIES = {
    "vllm:num_requests_running": "vllm.num_requests_running",
    "vllm:num_requests_waiting": "vllm.num_requests_waiting",
    "vllm:kv_cache_usage_perc": "vllm.kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc": "vllm.kv_cache_usage_perc",  # older vLLM name
    "vllm:num_preemptions_total": "vllm.num_preemptions_total",
}
COUNTER_SERIES = {"vllm.num_preemptions_total"}
#: Per-GPU counters (``gpu<i>.<name>``): the summary gives their ``delta`` too.
GPU_COUNTERS = ("energy_j",)


def is_counter(series: str) -> bool:
    return series in COUNTER_SERIES or (series.startswith("gpu") and series.rsplit(".", 1)[-1] in GPU_COUNTERS)
GPU_FIELDS = [("utilization.gpu", "utilization_pct"), ("memory.used", "memory_used_mib"),
              ("power.draw", "power_w"), ("clocks.sm", "sm_clock_mhz")]


def parse_vllm_gauges(text: str | prom.Snapshot) -> dict[str, float]:
    """Sum the tracked vLLM gauges/counters over all label sets of a /metrics scrape (parsed by
    :func:`specstudy.measure.prom.parse`); an unparsable scrape raises :class:`specstudy.measure.prom.MetricsParseError`."""
    snap = prom.parse(text) if isinstance(text, str) else text
    out: dict[str, float] = {}
    for name, key in VLLM_SERIES.items():
        value = prom.total(snap, name)
        if value is not None:
            out[key] = out.get(key, 0.0) + value
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


#: NVML GPM metrics sampled per GPU: series name -> the ``pynvml`` constant names, first one the module defines.
GPM_SERIES: dict[str, tuple[str, ...]] = {
    "sm_activity_pct": ("NVML_GPM_METRIC_SM_UTIL",),
    "tensor_activity_pct": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "NVML_GPM_METRIC_HMMA_TENSOR_UTIL"),
    "dram_bw_util_pct": ("NVML_GPM_METRIC_DRAM_BW_UTIL",),
    "nvlink_rx_mib_s": ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC",),
    "nvlink_tx_mib_s": ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC",),
}
#: NVML return codes a GPM metric may carry (``nvmlReturn`` of one metric): the names for ``unavailable: ...``.
_NVML_RETURN = {1: "NVML_ERROR_UNINITIALIZED", 2: "NVML_ERROR_INVALID_ARGUMENT", 3: "NVML_ERROR_NOT_SUPPORTED",
                4: "NVML_ERROR_NO_PERMISSION", 15: "NVML_ERROR_GPU_IS_LOST", 999: "NVML_ERROR_UNKNOWN"}


def _gpm_series(series: str) -> bool:
    return series.startswith("gpu") and series.rsplit(".", 1)[-1] in GPM_SERIES


NVML_SERIES = ("memory_used_mib", "utilization_pct", "memory_utilization_pct", "sm_clock_mhz", "memory_clock_mhz",
               "power_w", "temperature_c")
_SAID: set[str] = set()


def say_once(message: str, stream=None) -> bool:
    """Print ``message`` to stderr the first time this process sees it (the job's log)."""
    if message in _SAID:
        return False
    _SAID.add(message)
    print(message, file=stream or sys.stderr, flush=True)
    return True


def _text(v: Any) -> Any:
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v


def _visible(env: dict | None = None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list of indices/UUIDs (None: unset, all GPUs)."""
    cvd = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if cvd is None or cvd.strip() == "":
        return None if cvd is None else []
    return [x.strip() for x in cvd.split(",") if x.strip()]


class NvmlGpus:
    """The GPUs this job sees, through NVML. ``error`` says why there are none (no crash).

    ``nvml``: the ``pynvml`` module (tests pass a fake); default: ``import pynvml``.
    """

    def __init__(self, nvml: Any = None, env: dict | None = None):
        self.nvml = nvml
        self.handles: dict[int, Any] = {}
        self.error: str | None = None
        self._unsupported: set[tuple[int, str]] = set()
        self._init = False
        # GPM per GPU: the last sample (None before the first), the metric ids asked for, why not (once known)
        self._gpm: dict[int, dict] | None = None
        self.gpm_unavailable: dict[int, str] = {}
        self.gpm_reasons: dict[tuple[int, str], str] = {}
        if self.nvml is None:
            try:
                import pynvml  # nvidia-ml-py

                self.nvml = pynvml
            except ImportError as exc:
                self.error = f"NVML unavailable: nvidia-ml-py (import pynvml) is not installed ({exc})"
                return
        try:
            self.nvml.nvmlInit()
            self._init = True
            count = int(self.nvml.nvmlDeviceGetCount())
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            self.error = f"NVML unavailable: {type(exc).__name__}: {exc}"
            self.close()
            return
        visible = _visible(env)
        for i in range(count):
            try:
                h = self.nvml.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(self._call(self.nvml.nvmlDeviceGetUUID, h)) if visible is not None else None
            except Exception as exc:  # noqa: BLE001
                self.error = f"NVML device {i}: {type(exc).__name__}: {exc}"
                continue
            if visible is None or str(i) in visible or (uuid and any(uuid.startswith(v) for v in visible if not v.isdigit())):
                self.handles[i] = h
        if not self.handles:
            self.error = self.error or (f"NVML found no GPU (devices: {count}, CUDA_VISIBLE_DEVICES="
                                        f"{','.join(visible) if visible is not None else 'unset'})")
            self.close()

    @property
    def available(self) -> bool:
        return bool(self.handles)

    @staticmethod
    def _call(fn, *args):
        return fn(*args)

    def _field(self, i: int, name: str, fn, *args, errors: dict | None = None):
        if (i, name) in self._unsupported:
            return None
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported, _GpuIsLost, ...
            key = f"nvml gpu{i}.{name}: {type(exc).__name__}"
            if "NotSupported" in type(exc).__name__ or "NoPermission" in type(exc).__name__:
                self._unsupported.add((i, name))
            if errors is not None:
                errors[key] = errors.get(key, 0) + 1
            return None

    # -- GPM (GPU performance monitoring: Hopper and later) ------------------------------------
    def _gpm_setup(self) -> None:
        """Ask once per GPU whether GPM is supported; note each metric the module does not define."""
        nv = self.nvml
        self._gpm = {}
        api = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmSampleFree",
               "nvmlGpmMetricsGet", "c_nvmlGpmMetricsGet_t")
        missing = [name for name in api if getattr(nv, name, None) is None]
        for i, h in self.handles.items():
            if missing:
                self.gpm_unavailable[i] = f"this nvidia-ml-py has no GPM API ({', '.join(missing)})"
                continue
            try:
                supported = bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
            except Exception as exc:  # noqa: BLE001 - NVMLError_FunctionNotFound (old driver), ...
                self.gpm_unavailable[i] = f"nvmlGpmQueryDeviceSupport: {type(exc).__name__}: {exc}"
                continue
            if not supported:
                self.gpm_unavailable[i] = "GPM not supported on this GPU (nvmlGpmQueryDeviceSupport)"
                continue
            metrics = {}
            for series, names in GPM_SERIES.items():
                ids = [getattr(nv, n) for n in names if getattr(nv, n, None) is not None]
                if ids:
                    metrics[series] = int(ids[0])
                else:
                    self.gpm_reasons[(i, series)] = f"this nvidia-ml-py defines none of {', '.join(names)}"
            self._gpm[i] = {"prev": None, "metrics": metrics}

    def _gpm_free(self, sample) -> None:
        try:
            self.nvml.nvmlGpmSampleFree(sample)
        except Exception:  # noqa: BLE001 - nothing to keep
            pass

    def _gpm_fail(self, i: int, what: str, exc: Exception, errors: dict | None) -> None:
        name = type(exc).__name__
        reason = f"{what}: {name}: {exc}"
        if errors is not None:
            key = f"nvml gpu{i}.gpm: {what}: {name}"
            errors[key] = errors.get(key, 0) + 1
        state = self._gpm.pop(i) if "NotSupported" in name or "NoPermission" in name else self._gpm[i]
        if state["prev"] is not None:  # the next interval starts afresh
            self._gpm_free(state["prev"])
            state["prev"] = None
        if i in self._gpm:
            for series in state["metrics"]:
                self.gpm_reasons.setdefault((i, series), reason)
        else:
            self.gpm_unavailable[i] = reason

    def _gpm_sample(self, i: int, h: Any, errors: dict | None) -> dict[str, float]:
        """Take GPU i's GPM sample; the metrics over the interval since its previous one (none the first time)."""
        nv, state = self.nvml, self._gpm[i]
        cur = None
        try:
            cur = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(h, cur)
        except Exception as exc:  # noqa: BLE001
            if cur is not None:
                self._gpm_free(cur)
            self._gpm_fail(i, "nvmlGpmSampleGet", exc, errors)
            return {}
        prev, state["prev"] = state["prev"], cur
        if prev is None or not state["metrics"]:
            if prev is not None:
                self._gpm_free(prev)
            return {}
        get = nv.c_nvmlGpmMetricsGet_t()
        get.version = nv.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(state["metrics"])
        get.sample1, get.sample2 = prev, cur
        for k, metric in enumerate(state["metrics"].values()):
            get.metrics[k].metricId = metric
        try:
            nv.nvmlGpmMetricsGet(get)
        except Exception as exc:  # noqa: BLE001
            self._gpm_fail(i, "nvmlGpmMetricsGet", exc, errors)
            return {}
        finally:
            self._gpm_free(prev)
        out = {}
        for k, series in enumerate(state["metrics"]):
            m = get.metrics[k]
            ret = int(m.nvmlReturn)
            if ret != 0:
                code = _NVML_RETURN.get(ret, f"NVML return {ret}")
                self.gpm_reasons.setdefault((i, series), f"nvmlGpmMetricsGet: {code}")
                if errors is not None:
                    key = f"nvml gpu{i}.{series}: {code}"
                    errors[key] = errors.get(key, 0) + 1
                continue
            out[f"gpu{i}.{series}"] = round(float(m.value), 3)
        return out

    def gpm_summary(self, series: dict) -> dict:
        """Per GPU: each GPM figure's ``{count, mean, p50}`` (from ``series``, the summary's) or
        ``unavailable: <reason>``; a GPU without GPM at all is one ``unavailable: <reason>``."""
        if self._gpm is None:
            return {f"gpu{i}": "unavailable: no sample was taken" for i in self.handles}
        out: dict[str, Any] = {}
        for i in self.handles:
            if i in self.gpm_unavailable:
                out[f"gpu{i}"] = f"unavailable: {self.gpm_unavailable[i]}"
                continue
            per = {}
            for name in GPM_SERIES:
                s = series.get(f"gpu{i}.{name}")
                if s:
                    per[name] = {"count": s["count"], "mean": s["mean"], "p50": s["p50"]}
                else:
                    why = self.gpm_reasons.get((i, name), "fewer than two GPM samples in the window")
                    per[name] = f"unavailable: {why}"
            out[f"gpu{i}"] = per
        return out

    def sample(self, errors: dict | None = None) -> dict[str, float]:
        nv, out = self.nvml, {}
        if self._gpm is None:
            self._gpm_setup()
        sm, mem = getattr(nv, "NVML_CLOCK_SM", 1), getattr(nv, "NVML_CLOCK_MEM", 2)
        temp = getattr(nv, "NVML_TEMPERATURE_GPU", 0)
        for i, h in self.handles.items():
            m = self._field(i, "memory_used_mib", nv.nvmlDeviceGetMemoryInfo, h, errors=errors)
            if m is not None:
                out[f"gpu{i}.memory_used_mib"] = round(m.used / 2**20, 3)
            u = self._field(i, "utilization_pct", nv.nvmlDeviceGetUtilizationRates, h, errors=errors)
            if u is not None:
                out[f"gpu{i}.utilization_pct"] = float(u.gpu)
                out[f"gpu{i}.memory_utilization_pct"] = float(u.memory)
            for name, fn, args, scale in (("sm_clock_mhz", nv.nvmlDeviceGetClockInfo, (h, sm), 1.0),
                                          ("memory_clock_mhz", nv.nvmlDeviceGetClockInfo, (h, mem), 1.0),
                                          ("power_w", nv.nvmlDeviceGetPowerUsage, (h,), 1e-3),  # milliwatts
                                          ("temperature_c", nv.nvmlDeviceGetTemperature, (h, temp), 1.0)):
                v = self._field(i, name, fn, *args, errors=errors)
                if v is not None:
                    out[f"gpu{i}.{name}"] = round(float(v) * scale, 3)
            energy = getattr(nv, "nvmlDeviceGetTotalEnergyConsumption", None)  # Volta and later; millijoules
            if energy is not None:
                v = self._field(i, "energy_j", energy, h, errors=errors)
                if v is not None:
                    out[f"gpu{i}.energy_j"] = round(float(v) * 1e-3, 3)
            if i in self._gpm:
                out.update(self._gpm_sample(i, h, errors))
        return out

    def inventory(self) -> dict:
        """Provenance: driver, CUDA driver, and per GPU name, memory, power limits, clocks, modes."""
        nv = self.nvml
        out: dict[str, Any] = {"source": "nvml", "count": len(self.handles), "error": self.error,
                               "driver_version": None, "cuda_driver_version": None, "nvml_version": None,
                               "devices": []}
        if not self.handles:
            return out

        def get(fn_name, *args, scale=None, text=False):
            fn = getattr(nv, fn_name, None)
            if fn is None:
                return None
            try:
                v = fn(*args)
            except Exception:  # noqa: BLE001 - not supported on this GPU/driver: None
                return None
            if text:
                return _text(v)
            return round(float(v) * scale, 3) if scale is not None else v

        out["driver_version"] = get("nvmlSystemGetDriverVersion", text=True)
        out["nvml_version"] = get("nvmlSystemGetNVMLVersion", text=True)
        cuda = get("nvmlSystemGetCudaDriverVersion_v2") or get("nvmlSystemGetCudaDriverVersion")
        out["cuda_driver_version"] = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}" if cuda else None
        sm, mem = getattr(nv, "NVML_CLOCK_SM", 1), getattr(nv, "NVML_CLOCK_MEM", 2)
        for i, h in self.handles.items():
            meminfo = get("nvmlDeviceGetMemoryInfo", h)
            mig = get("nvmlDeviceGetMigMode", h)
            pci = get("nvmlDeviceGetPciInfo", h)
            out["devices"].append({
                "index": i, "name": get("nvmlDeviceGetName", h, text=True), "uuid": get("nvmlDeviceGetUUID", h, text=True),
                "pci_bus_id": _text(getattr(pci, "busId", None)) if pci is not None else None,
                "memory_total_mib": round(meminfo.total / 2**20, 3) if meminfo is not None else None,
                "power_limit_w": get("nvmlDeviceGetPowerManagementLimit", h, scale=1e-3),
                "power_default_limit_w": get("nvmlDeviceGetPowerManagementDefaultLimit", h, scale=1e-3),
                "power_enforced_limit_w": get("nvmlDeviceGetEnforcedPowerLimit", h, scale=1e-3),
                "clocks_mhz": {"sm_application": get("nvmlDeviceGetApplicationsClock", h, sm),
                               "memory_application": get("nvmlDeviceGetApplicationsClock", h, mem),
                               "sm_default_application": get("nvmlDeviceGetDefaultApplicationsClock", h, sm),
                               "sm_max": get("nvmlDeviceGetMaxClockInfo", h, sm),
                               "memory_max": get("nvmlDeviceGetMaxClockInfo", h, mem)},
                "persistence_mode": None if (pm := get("nvmlDeviceGetPersistenceMode", h)) is None else bool(pm),
                "compute_mode": get("nvmlDeviceGetComputeMode", h),
                "mig_mode": None if not mig else int(mig[0]),
            })
        return out

    def close(self) -> None:
        for state in (self._gpm or {}).values():
            if state["prev"] is not None:
                self._gpm_free(state["prev"])
                state["prev"] = None
        if self._init:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._init = False


def gpu_inventory(nvml: Any = None) -> dict:
    """NVML inventory of the visible GPUs; nvidia-smi's fallback; ``devices`` empty with ``error`` otherwise."""
    gpus = NvmlGpus(nvml)
    try:
        inv = gpus.inventory()
    finally:
        gpus.close()
    if inv["devices"]:
        return inv
    smi = query_nvidia_smi_inventory()
    if smi:
        return {"source": "nvidia-smi", "count": len(smi), "error": inv["error"], "driver_version":
                smi[0].get("driver_version"), "cuda_driver_version": None, "nvml_version": None, "devices": smi}
    return inv


def query_nvidia_smi_inventory(smi: str = "nvidia-smi") -> list[dict] | None:
    if shutil.which(smi) is None:
        return None
    keys = ["index", "name", "uuid", "driver_version", "memory_total_mib", "clocks_max_sm_mhz", "clocks_sm_mhz",
            "power_limit_w", "power_default_limit_w"]
    try:
        r = subprocess.run([smi, "--query-gpu=index,name,uuid,driver_version,memory.total,clocks.max.sm,clocks.sm,"
                            "power.limit,power.default_limit", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0 or not r.stdout.strip():
        return None
    return [dict(zip(keys, [x.strip() for x in line.split(",")], strict=False)) for line in r.stdout.splitlines()]


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
    ``gpu``: False turns GPU sampling off; None/True detect NVML (then nvidia-smi) on the first sample.
    ``nvml``: a ``pynvml``-like module (tests); default ``import pynvml``.
    ``worker``: a :class:`~specstudy.measure.telemetry_worker.SamplerProcess`: the same sampling runs in that
    process instead of a thread of this one (the deployment job's cells: nothing of it then holds the load
    generator's GIL); ``start``/``stop``/``summary`` behave the same. A worker that fails leaves the cell
    without telemetry, the failure named in ``errors`` — never back in this process.
    """

    def __init__(self, out_path: str | os.PathLike, *, metrics_url: str | None = None, pgid: int | None = None,
                 root_pid: int | None = None, interval_s: float = 1.0, gpu: bool | None = None,
                 api_key: str | None = None, http_timeout_s: float = 2.0, nvml: Any = None, worker: Any = None):
        if worker is not None and nvml is not None:
            raise ValueError("TelemetrySampler: a worker process samples with its own NVML (nvml= is for a thread)")
        self.worker = worker
        self._worker_summary: dict | None = None
        self.out_path = Path(out_path)
        self.metrics_url = metrics_url
        self.interval_s = float(interval_s)
        self.gpu = gpu
        self.nvml = nvml
        self.gpu_source: str | None = None  # "nvml" | "nvidia-smi" | None
        self.gpu_note: str | None = None
        self._nvml: NvmlGpus | None = None
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
        try:
            return parse_vllm_gauges(prom.fetch_metrics(self.metrics_url, timeout=self.http_timeout_s,
                                                        api_key=self.api_key))
        except (prom.MetricsUnavailable, prom.MetricsParseError) as exc:
            key = f"metrics: {type(exc.__cause__ or exc).__name__}"
            self._errors[key] = self._errors.get(key, 0) + 1
            return {}

    def _detect_gpu(self) -> None:
        self._nvml = NvmlGpus(self.nvml)
        if self._nvml.available:
            self.gpu_source = "nvml"
            return
        note = self._nvml.error
        self._nvml = None
        if query_nvidia_smi():
            self.gpu_source = "nvidia-smi"
            self.gpu_note = f"{note}; using the nvidia-smi fallback"
            say_once(f"telemetry: {self.gpu_note}")
            return
        self.gpu = False
        self.gpu_note = f"no GPU telemetry ({note}; no usable nvidia-smi): sampling the server's processes only"
        say_once(f"telemetry: {self.gpu_note}")

    def _gpu(self) -> dict[str, float]:
        if self.gpu is False:
            return {}
        if self.gpu_source is None:
            self._detect_gpu()
        if self.gpu_source == "nvml":
            return self._nvml.sample(self._errors)
        if self.gpu_source == "nvidia-smi":
            out = query_nvidia_smi()
            if not out:
                self._errors["nvidia-smi failed"] = self._errors.get("nvidia-smi failed", 0) + 1
            return out or {}
        return {}

    def _hardware(self) -> dict[str, float]:
        out = self._gpu()
        if self.pgid is None and self.root_pid is None:
            return out
        if self._cpu is None:
            self._cpu = _GroupCPU(self.pgid, self.root_pid)
        out.update(self._cpu.sample())
        return out

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
    def _worker_args(self) -> dict:
        return {"out_path": str(self.out_path), "metrics_url": self.metrics_url, "pgid": self.pgid,
                "root_pid": self.root_pid, "interval_s": self.interval_s, "gpu": self.gpu, "api_key": self.api_key,
                "http_timeout_s": self.http_timeout_s}

    def _worker_failed(self, exc: Exception) -> None:
        key = f"worker: {exc}"[:200]
        self._errors[key] = self._errors.get(key, 0) + 1

    def start(self) -> TelemetrySampler:
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        if self.worker is not None:
            self._t0 = time.monotonic()
            try:
                self.worker.begin(self._worker_args())
            except Exception as exc:  # noqa: BLE001 - telemetry must never kill a cell
                self._worker_failed(exc)
            return self
        self._fh = open(self._tmp, "w", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> dict:
        if self.worker is not None:
            if not self._errors:  # begin failed: nothing runs there
                try:
                    self._worker_summary = self.worker.end(timeout_s=self.interval_s + 30)
                except Exception as exc:  # noqa: BLE001 - telemetry must never kill a cell
                    self._worker_failed(exc)
            return self.summary()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 15)
        if self._fh is not None and not self._thread.is_alive():  # the window's end: counters' deltas cover it
            try:
                self.sample_once()
            except Exception as exc:  # noqa: BLE001 - telemetry must never kill a cell
                key = f"sample: {type(exc).__name__}: {exc}"[:200]
                self._errors[key] = self._errors.get(key, 0) + 1
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None
            os.replace(self._tmp, self.out_path)
        if self._nvml is not None:
            self._nvml.close()
        return self.summary()

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- summary --------------------------------------------------------------------------------
    def summary(self) -> dict:
        if self.worker is not None:
            out = dict(self._worker_summary) if self._worker_summary is not None else {
                **summarize([], interval_s=self.interval_s, errors=self._errors),
                "gpu": {"source": None, "note": "no telemetry: the sampler process failed", "devices": None},
                "gpm": "unavailable: the sampler process failed"}
            out["errors"] = {**(out.get("errors") or {}), **self._errors}
            out["process"] = "worker"
            return out
        source = "+".join(x for x in (self.gpu_source, "psutil" if self._cpu else None) if x) or None
        out = summarize(self._rows, interval_s=self.interval_s, errors=self._errors, source=source)
        out["gpu"] = {"source": self.gpu_source, "note": self.gpu_note,
                      "devices": sorted(self._nvml.handles) if self._nvml is not None else None}
        if self._nvml is not None:
            out["gpm"] = self._nvml.gpm_summary(out["series"])
        elif self.gpu_source == "nvidia-smi":
            out["gpm"] = "unavailable: NVML is not usable here (nvidia-smi has no GPM figures)"
        else:
            out["gpm"] = f"unavailable: {self.gpu_note or 'GPU sampling is off'}"
        return out


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
        if is_counter(k):
            entry["delta"] = round(vals[-1] - vals[0], 6)
        if _gpm_series(k):
            entry["p50"] = round(statistics.median(vals), 6)
        out[k] = entry
    stamps = [r["unix"] for r in rows if isinstance(r.get("unix"), int | float)]
    return {"samples": len(rows), "interval_s": interval_s, "hardware_source": source,
            "window_s": round(stamps[-1] - stamps[0], 3) if len(stamps) >= 2 else None,
            "errors": dict(errors or {}), "series": out}


def summarize_file(path: str | os.PathLike) -> dict:
    from specstudy.core import atomic

    return summarize(atomic.read_jsonl(path))


def _cmd_summary(args) -> int:
    path = Path(args.jsonl)
    if not path.exists():
        print(f"{path}: no such telemetry file", file=sys.stderr)
        return 2
    from specstudy.core import atomic
    from specstudy.core.errors import UserError

    what = "a cell's telemetry.jsonl (one sample a line, each with 't' and 'unix'), e.g. " \
           "results/<phase>/<arm>/<rep>/<workload>/c<concurrency>/telemetry.jsonl"
    try:
        rows = atomic.read_jsonl(path)
    except atomic.BadFile as exc:
        try:  # a whole JSON document (a summary, a record) rather than one sample a line
            json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            raise UserError(f"{exc}; telemetry-summary reads {what}") from None
        raise UserError(f"{path}: a JSON document, not JSON lines; telemetry-summary reads {what}") from None
    if not rows:
        raise UserError(f"{path}: no sample in the file (empty); telemetry-summary reads {what}")
    bad = next((n for n, r in enumerate(rows, 1) if not isinstance(r, dict) or "unix" not in r), None)
    if bad is not None:
        fields = sorted(rows[bad - 1]) if isinstance(rows[bad - 1], dict) else type(rows[bad - 1]).__name__
        raise UserError(f"{path}: line {bad} is not a telemetry sample (no field 'unix'; it has {fields}); "
                        f"telemetry-summary reads {what}")
    print(json.dumps(summarize(rows), indent=2, sort_keys=True))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("telemetry-summary", help="mean/max per series of a cell's telemetry.jsonl")
    p.add_argument("jsonl")
    p.set_defaults(func=_cmd_summary)
