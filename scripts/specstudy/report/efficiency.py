"""Energy per output token and the throughput–interactivity curves (the report's efficiency sections).

Both read the ``cells`` table only (:mod:`specstudy.analysis.tables`), valid-throughput cells of the screening and
confirmation phases:

- **Energy per output token** (J/token) of a cell = NVML's total-energy counter over the measurement window,
  summed over the job's GPUs (``gpu_energy_j``: the telemetry sampler reads the counter at the window's start
  and once more when it stops), ÷ the cell's successful completion tokens. The GPU's whole draw counts, idle
  power included: that is what serving a token costs. Per arm × workload × concurrency the median over its
  repeats, and its ratio to the baseline's median. A CPU run (or a GPU without the counter) has no figure:
  the column is null and the report says so, never 0.
- **Throughput–interactivity** (the Pareto view of vLLM's ``vllm bench sweep plot_pareto`` and InferenceX):
  per cell, output tokens/s per GPU (the cell's output tokens/s ÷ the job's GPUs: ``gpu_count`` from NVML,
  else the target's tensor-parallel size) against tokens/s per user (1000 ÷ the cell's TPOT p50 in ms: the
  decode rate one streaming user sees); one curve per arm and workload over concurrency (medians over
  repeats), so arms are compared at matched interactivity rather than at matched concurrency.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specstudy.core.arms import baseline_of, is_arm_name, is_baseline
from specstudy.core.stat_util import median
from specstudy.study.phase_decl import CORE_PHASES

#: the core phases whose cells it reads, the confirmation's first (the curves come from the first that has cells)
PHASES = tuple(reversed(CORE_PHASES))


def _usable(c: dict) -> bool:
    return bool(c.get("throughput_valid")) and c.get("phase") in PHASES and c.get("kind", "repeat") != "drift"


def _group(cells: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for c in cells:
        if _usable(c):
            out.setdefault((c["phase"], c["workload"], int(c["concurrency"]), c["arm"]), []).append(c)
    return out


def energy_rows(cells: list[dict]) -> list[dict]:
    """Per phase × workload × concurrency × arm: median J/token over repeats, n, ratio to the baseline."""
    groups = _group(cells)
    rows = []
    for (phase, workload, conc, arm), cs in sorted(groups.items()):
        vals = [c.get("energy_j_per_output_token") for c in cs if c.get("energy_j_per_output_token") is not None]
        if not vals:
            continue
        own = baseline_of(arm) if is_arm_name(arm) else "baseline"  # the baseline of the arm's own engine build
        base = [c.get("energy_j_per_output_token") for c in groups.get((phase, workload, conc, own), [])]
        med, bmed = median(vals), median(base)
        rows.append({"phase": phase, "workload": workload, "concurrency": conc, "arm": arm, "n": len(vals),
                     "j_per_token": med, "energy_j": median([c.get("gpu_energy_j") for c in cs]),
                     "power_w": median([c["gpu_energy_j"] / c["gpu_energy_window_s"] for c in cs
                                         if c.get("gpu_energy_j") is not None and c.get("gpu_energy_window_s")]),
                     "ratio_to_baseline": (med / bmed) if (not is_baseline(arm) and bmed) else None})
    return rows


def energy_section(B: list, cells: list[dict]) -> list[dict]:
    """The report's "Energy per output token" section; returns its rows (recommendation.json)."""
    B.append(("h", 2, "Energy per output token (NVML)"))
    rows = energy_rows(cells)
    if not rows:
        B.append(("p", "No GPU energy counter in any cell (a CPU run, or NVML without "
                       "nvmlDeviceGetTotalEnergyConsumption): energy per output token is absent, not zero."))
        return rows
    B.append(("p", "J/token = NVML's total-energy counter over the measurement window, summed over the job's GPUs, "
                   "÷ the cell's successful completion tokens (the GPUs' whole draw, idle power included). Median "
                   "over the repeats of valid-throughput cells; ratio = arm ÷ baseline median at the same phase, "
                   "workload and concurrency (below 1: the arm spends less energy per token)."))
    B.append(("table", ["phase", "workload", "c", "arm", "n", "J/token", "energy J (window)", "mean power W",
                        "J/token ÷ baseline"],
              [[r["phase"], r["workload"], r["concurrency"], r["arm"], r["n"], f"{r['j_per_token']:.4f}",
                _fmt(r["energy_j"], "{:.1f}"), _fmt(r["power_w"], "{:.0f}"), _fmt(r["ratio_to_baseline"], "{:.3f}")]
               for r in rows]))
    per_arm: dict[tuple, list[float]] = {}
    for r in rows:
        per_arm.setdefault((r["phase"], r["arm"]), []).append(r["j_per_token"])
    B.append(("p", "Per arm (median over its workload × concurrency cells above, and the range):"))
    B.append(("table", ["phase", "arm", "workload × c", "J/token (median)", "min", "max"],
              [[ph, arm, len(v), f"{median(v):.4f}", f"{min(v):.4f}", f"{max(v):.4f}"]
               for (ph, arm), v in sorted(per_arm.items())]))
    return rows


def _fmt(v: Any, fmt: str) -> str:
    return "–" if v is None else fmt.format(v)


def _gpus(c: dict, tp_of: dict | None = None) -> int | None:
    """GPUs of the cell's job: NVML's count, else the target's TP (the cell's keys, else its deployment's)."""
    for v in (c.get("gpu_count"), c.get("tensor_parallel_size"), (tp_of or {}).get(c.get("deployment_id"))):
        if v is not None and v == v and int(v) >= 1:  # not NaN
            return int(v)
    return None


def interactivity_points(cells: list[dict], deployments: list[dict] | None = None) -> list[dict]:
    """Per phase × workload × arm × concurrency: median output tok/s per GPU and tok/s per user over repeats."""
    tp_of = {d.get("deployment_id"): d.get("tensor_parallel_size") for d in deployments or []}
    out = []
    for (phase, workload, conc, arm), cs in sorted(_group(cells).items()):
        per_gpu = [c["output_tokens_per_second"] / g for c in cs
                   if c.get("output_tokens_per_second") is not None and (g := _gpus(c, tp_of))]
        per_user = [1000.0 / c["tpot_p50_ms"] for c in cs if c.get("tpot_p50_ms")]
        if not per_gpu or not per_user:
            continue
        out.append({"phase": phase, "workload": workload, "arm": arm, "concurrency": conc, "n": len(cs),
                    "gpus": _gpus(cs[0], tp_of), "gpu_source": "nvml" if cs[0].get("gpu_count") else "tensor_parallel_size",
                    "tok_s_per_gpu": median(per_gpu), "tok_s_per_user": median(per_user)})
    return out


def plot_throughput_interactivity(points: list[dict], path: Path) -> bool:
    """Output tok/s per GPU against tok/s per user, one curve per arm over concurrency, one panel per workload."""
    if not points:
        return False
    from specstudy.report.plots import _plt, _save

    plt = _plt()
    workloads = sorted({p["workload"] for p in points})
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 3.8), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        for arm in sorted({p["arm"] for p in points if p["workload"] == w}):
            pts = sorted((p for p in points if p["workload"] == w and p["arm"] == arm), key=lambda p: p["concurrency"])
            ax.plot([p["tok_s_per_user"] for p in pts], [p["tok_s_per_gpu"] for p in pts], marker="o", label=arm)
            for p in pts:
                ax.annotate(f"c{p['concurrency']}", (p["tok_s_per_user"], p["tok_s_per_gpu"]), fontsize=6,
                            textcoords="offset points", xytext=(3, 3))
        ax.set_title(w)
        ax.set_xlabel("tok/s per user (1000 / TPOT p50)")
        ax.set_yscale("log")
    axes[0][0].set_ylabel("output tok/s per GPU")
    axes[0][-1].legend(fontsize=7)
    _save(fig, path)
    return True


def interactivity_section(B: list, cells: list[dict], plots: Path, deployments: list[dict] | None = None) -> list[dict]:
    """The report's "Throughput against interactivity" section: the plot and its points."""
    from specstudy.report.plots import plot_caption

    B.append(("h", 2, "Throughput against interactivity"))
    phase = next((ph for ph in PHASES if any(_usable(c) and c["phase"] == ph for c in cells)), None)
    points = [p for p in interactivity_points(cells, deployments) if p["phase"] == phase]
    name = "throughput_interactivity.png"
    caption = plot_caption("throughput_interactivity", f"{phase} phase" if phase else "")
    if not plot_throughput_interactivity(points, plots / name):
        B.append(("p", f"(plots/{name}: no data) {caption}"))
        return points
    B.append(("img", f"plots/{name}", caption))
    src = {p["gpu_source"] for p in points}
    B.append(("p", "Medians over the repeats of valid-throughput cells. GPUs per deployment: "
                   + ("NVML's count" if src == {"nvml"} else "the target's tensor-parallel size where NVML saw no GPU "
                      "(a CPU run: 'per GPU' is then per engine)") + ". A curve above and to the right of another "
                   "serves more tokens per GPU at the same per-user speed."))
    B.append(("table", ["workload", "arm", "c", "n", "GPUs", "tok/s per user", "output tok/s per GPU"],
              [[p["workload"], p["arm"], p["concurrency"], p["n"], p["gpus"], f"{p['tok_s_per_user']:.1f}",
                f"{p['tok_s_per_gpu']:.1f}"] for p in sorted(points, key=lambda p: (p["workload"], p["arm"],
                                                                                    p["concurrency"]))]))
    return points
