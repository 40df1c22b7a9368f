"""The report's "GPU, start-up and memory" section: NVML telemetry per arm, start-up phases per deployment,
memory and KV cost per arm.
"""

from __future__ import annotations

from specstudy.core.stat_util import median
from specstudy.deployment.launchlog import STARTUP_STEPS
from specstudy.report.blocks import fmt


def gpu_section(B, cells: list[dict], deps: list[dict]) -> None:
    """GPU telemetry per arm, start-up phases per deployment, memory/KV cost per arm (docs/report.md)."""
    B.append(("h", 2, "GPU, start-up and memory"))
    B.append(("h", 3, "GPU telemetry (NVML, measurement windows)"))
    gpu_cells = [c for c in cells if c.get("gpu_count")]
    if not gpu_cells:
        B.append(("p", "No GPU telemetry (CPU run): no cell recorded NVML or nvidia-smi series."))
    else:
        B.append(("p", "Per GPU: mean = mean over the deployment's GPUs of each GPU's mean over the measurement "
                       "window, then the median over the arm's cells; max = the largest value any GPU reached in "
                       "any of the arm's cells."))
        rows = []
        for (phase, arm), cs in sorted(_group(gpu_cells, ("phase", "arm")).items()):
            rows.append([phase, arm, len(cs), "/".join(sorted({str(c.get("gpu_telemetry_source")) for c in cs})),
                         fmt(max(c["gpu_count"] for c in cs), "{:.0f}"),
                         fmt(median([c.get("gpu_memory_used_mib_mean") for c in cs]), "{:,.0f}"),
                         fmt(max((c.get("gpu_memory_used_mib_max") or 0) for c in cs) or None, "{:,.0f}"),
                         fmt(median([c.get("gpu_utilization_pct_mean") for c in cs]), "{:.1f}"),
                         fmt(median([c.get("gpu_power_w_mean") for c in cs]), "{:.0f}"),
                         fmt(max((c.get("gpu_power_w_max") or 0) for c in cs) or None, "{:.0f}"),
                         fmt(median([c.get("gpu_sm_clock_mhz_mean") for c in cs]), "{:.0f}"),
                         fmt(max((c.get("gpu_temperature_c_max") or 0) for c in cs) or None, "{:.0f}")])
        B.append(("table", ["phase", "arm", "cells", "source", "GPUs", "memory used MiB (mean)", "memory used MiB (max)",
                            "util % (mean)", "power W (mean)", "power W (max)", "SM clock MHz (mean)",
                            "temperature °C (max)"], rows))
        _gpm_table(B, gpu_cells)

    B.append(("h", 3, "Start-up per deployment"))
    with_startup = [d for d in deps if d.get("startup_total_s") is not None
                    or any(d.get(f"startup_{p}_s") is not None for p in STARTUP_STEPS)]
    if not with_startup:
        B.append(("p", "No start-up phases recorded (no deployment record carries `startup`)."))
    else:
        B.append(("p", "Seconds from our launch to our readiness check, split at the engine's log lines "
                       "(1 s resolution; compile and graph capture are the engine's own figures; docs/deployments.md). "
                       "Cache: the vLLM cache root at launch (cold = empty). Start share / measure share: start-up and "
                       "measured cells as fractions of the deployment's whole time (start to stop)."))
        rows = []
        for d in sorted(with_startup, key=lambda d: (d.get("start_unix") or 0, d.get("deployment_id") or "")):
            rows.append([d.get("deployment_id"), d.get("arm"), d.get("rep"), d.get("startup_cache") or "–",
                         d.get("compile_cache") or "–", fmt(d.get("startup_total_s"), "{:.1f}")]
                        + [fmt(d.get(f"startup_{p}_s"), "{:.1f}") for p in STARTUP_STEPS]
                        + [fmt(d.get("startup_share"), "{:.0%}"), fmt(d.get("measuring_share"), "{:.0%}")])
        B.append(("table", ["deployment", "arm", "rep", "cache", "compile cache", "total s"] + list(STARTUP_STEPS)
                  + ["start share", "measure share"], rows))

    B.append(("h", 3, "Memory and KV cost per arm"))
    ok = [d for d in deps if d.get("status") != "failed"]
    if not ok:
        B.append(("p", "No successful deployment."))
        return
    gpu_by_arm = _group(gpu_cells, ("arm",))
    rows = []
    for (arm,), ds in sorted(_group(ok, ("arm",)).items()):
        gc = gpu_by_arm.get((arm,), [])
        rows.append([arm, fmt(median([d.get("tensor_parallel_size") for d in ds]), "{:.0f}"),
                     fmt(median([d.get("model_loading_gib") for d in ds]), "{:.2f}"),
                     fmt(median([d.get("kv_available_gib") for d in ds]), "{:.2f}"),
                     fmt(median([d.get("kv_log_tokens") for d in ds]), "{:,.0f}"),
                     fmt(median([d.get("kv_cache_tokens") for d in ds]), "{:,.0f}"),
                     fmt(max((c.get("gpu_memory_used_mib_max") or 0) for c in gc) or None, "{:,.0f}") if gc
                     else "no GPU telemetry"])
    B.append(("p", "Medians over the arm's deployments: weights loaded (target and, for draft arms, the draft), the "
                   "memory left for the KV cache and its token capacity (engine log; and from /metrics "
                   "cache_config where scraped); NVML: the most memory any GPU used in any of the arm's cells."))
    B.append(("table", ["arm", "TP", "model loading GiB", "available KV GiB", "KV tokens (log)", "KV tokens (metrics)",
                        "GPU memory used MiB (max)"], rows))


#: The GPM figures the report shows: (column of the cells table without ``gpu_`` and the stat, heading, format).
GPM_SHOWN = (("sm_activity_pct", "SM activity %", "{:.1f}"), ("tensor_activity_pct", "tensor activity %", "{:.1f}"),
             ("dram_bw_util_pct", "DRAM bandwidth %", "{:.1f}"), ("nvlink_rx_mib_s", "NVLink RX MiB/s", "{:,.0f}"),
             ("nvlink_tx_mib_s", "NVLink TX MiB/s", "{:,.0f}"))


def _gpm_table(B, gpu_cells: list[dict]) -> None:
    """GPM activity per arm (NVML GPM; docs/metrics.md), and where a figure was unavailable, why."""
    B.append(("h", 3, "GPU activity (NVML GPM, measurement windows)"))
    B.append(("p", "Per GPU: each figure's mean (p50) over the window, averaged over the deployment's GPUs, then "
                   "the median over the arm's cells; – where the GPU does not expose it (reasons below)."))
    rows = []
    for (phase, arm), cs in sorted(_group(gpu_cells, ("phase", "arm")).items()):
        rows.append([phase, arm, len(cs)] + [
            f"{fmt(median([c.get(f'gpu_{name}_mean') for c in cs]), spec)} "
            f"({fmt(median([c.get(f'gpu_{name}_p50') for c in cs]), spec)})" for name, _, spec in GPM_SHOWN])
    B.append(("table", ["phase", "arm", "cells"] + [f"{head} mean (p50)" for _, head, _ in GPM_SHOWN], rows))
    reasons = sorted({str(c["gpu_gpm_unavailable"]) for c in gpu_cells if c.get("gpu_gpm_unavailable")})
    if reasons:
        B.append(("p", "Unavailable: " + "; ".join(reasons[:10]) + (f" … ({len(reasons) - 10} more)"
                                                                     if len(reasons) > 10 else "") + "."))


def _group(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return out
