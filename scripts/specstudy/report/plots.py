"""The report's figures: matplotlib off-screen, each PNG written atomically with reproducible bytes, the
caption under every plot (one table, :data:`PLOT_CAPTIONS`), and the figures themselves (each returns whether
it had data to draw).
"""

from __future__ import annotations

from pathlib import Path

# ---------------------------------------------------------------------------------------------
# Plots (matplotlib, Agg)
# ---------------------------------------------------------------------------------------------
# One-line caption of every plot (plots/<name>.png; capacity-<arm>.png use "capacity"). The same
# texts are the captions of `snakemake --report` (report/plot.rst; tests/test_snakemake_report.py
# checks that the two agree).
PLOT_CAPTIONS = {
    "speedup": "Speedup (arm ÷ baseline output tokens/s) per workload vs concurrency: geometric mean with "
               "its CI, dots are the repeats, the dashed line is no change.",
    "tpot": "TPOT ratio (arm ÷ baseline time per output token) per workload vs concurrency: below 1 decodes faster.",
    "acceptance_vs_speedup": "Acceptance rate vs speedup, one point per arm deployment repeat, workload and concurrency.",
    "per_position": "Acceptance rate at each draft position, mean over the valid cells of each arm.",
    "memory": "KV cache capacity per arm (median tokens over its deployments): the memory speculation costs.",
    "latency": "Per-request TTFT and TPOT distributions per arm (chosen cells, all workloads and concurrencies pooled).",
    "drift": "Baseline log throughput minus its series mean over the study, per node, with the fitted drift line.",
    "capacity": "Capacity search of one arm: achieved rate and latency vs offered Poisson rate, gates and knee marked.",
    "throughput_interactivity": "Output tokens/s per GPU against tokens/s per user (1000 / TPOT p50), one curve per "
                                "arm over concurrency: arms compared at matched interactivity.",
}


def plot_caption(name: str, detail: str = "") -> str:
    key = "capacity" if name.startswith("capacity-") else name.removesuffix(".png")
    return PLOT_CAPTIONS[key] + (f" ({detail})" if detail else "")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    import io

    from specstudy.core import atomic

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight", metadata={"Software": None})
    _plt().close(fig)
    atomic.write_bytes(path, buf.getvalue())


def plot_ratio(comps: list[dict], metric: str, path: Path, title: str) -> bool:
    if not comps:
        return False
    plt = _plt()
    workloads = sorted({c["workload"] for c in comps})
    arms = sorted({c["arm"] for c in comps})
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 3.5), squeeze=False, sharey=True)
    for ax, w in zip(axes[0], workloads, strict=True):
        for i, arm in enumerate(arms):
            cs = sorted((c for c in comps if c["workload"] == w and c["arm"] == arm and c[metric]["n"]),
                        key=lambda c: c["concurrency"])
            if not cs:
                continue
            x = [c["concurrency"] * (1 + 0.04 * (i - len(arms) / 2)) for c in cs]
            y = [c[metric]["geomean"] for c in cs]
            lo = [y_ - (c[metric]["ci_low"] or y_) for y_, c in zip(y, cs, strict=True)]
            hi = [(c[metric]["ci_high"] or y_) - y_ for y_, c in zip(y, cs, strict=True)]
            ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, label=arm)
            for xx, c in zip(x, cs, strict=True):
                ax.scatter([xx] * len(c[metric]["values"]), c[metric]["values"], s=8, color="k", alpha=0.5)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_title(w)
        ax.set_xlabel("concurrency")
    axes[0][0].set_ylabel(f"{metric} (arm / baseline)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title, y=1.04)
    _save(fig, path)
    return True


def plot_acceptance(rows: list[dict], path: Path) -> bool:
    rows = [r for r in rows if r["acceptance_rate"] is not None]
    if not rows:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4))
    for arm in sorted({r["arm"] for r in rows}):
        rr = [r for r in rows if r["arm"] == arm]
        ax.scatter([r["acceptance_rate"] for r in rr], [r["speedup"] for r in rr], label=arm, s=14)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("acceptance rate")
    ax.set_ylabel("speedup (deployment repeat)")
    ax.legend(fontsize=7)
    _save(fig, path)
    return True


def plot_per_position(cells: list[dict], path: Path) -> bool:
    import numpy as np

    by_arm: dict[str, list[list[float]]] = {}
    for c in cells:
        pp = c.get("per_position_acceptance")
        if pp and c.get("valid"):
            by_arm.setdefault(c["arm"], []).append([v for v in pp if v is not None])
    if not by_arm:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4))
    for arm, lists in sorted(by_arm.items()):
        k = max(len(x) for x in lists)
        mean = [float(np.mean([x[i] for x in lists if len(x) > i])) for i in range(k)]
        ax.plot(range(1, k + 1), mean, marker="o", label=arm)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (mean over valid cells)")
    ax.legend(fontsize=7)
    _save(fig, path)
    return True


def plot_memory(mem_rows: list[dict], path: Path) -> bool:
    rows = [r for r in mem_rows if r["kv_cache_tokens"] is not None]
    if not rows:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(4, len(rows)), 3.5))
    ax.bar([r["arm"] for r in rows], [r["kv_cache_tokens"] for r in rows])
    ax.set_ylabel("KV cache capacity (tokens, median)")
    ax.tick_params(axis="x", rotation=30)
    _save(fig, path)
    return True


def plot_latency(reqs, path: Path) -> bool:
    if reqs is None or len(reqs) == 0:
        return False
    r = reqs[reqs["chosen"].fillna(False).astype(bool) & reqs["success"].fillna(False).astype(bool)]
    if len(r) == 0:
        return False
    plt = _plt()
    arms = sorted(r["arm"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, col in zip(axes, ("ttft_ms", "tpot_ms"), strict=True):
        data = [r.loc[r["arm"] == a, col].dropna().to_numpy() for a in arms]
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(arms) + 1), arms, rotation=30, fontsize=7)
        ax.set_ylabel(col)
        ax.set_yscale("log")
    fig.suptitle("per-request latency distributions (all workloads and concurrencies pooled)")
    _save(fig, path)
    return True


def plot_drift(dr: dict, path: Path) -> bool:
    pts = dr.get("points") or []
    if not pts:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for node in sorted({str(p["node"]) for p in pts}):
        pp = [p for p in pts if str(p["node"]) == node]
        ax.scatter([p["x"] for p in pp], [p["resid"] for p in pp], s=12, label=f"node {node}")
    if dr.get("slope_per_unit") is not None:
        xs = sorted(p["x"] for p in pts)
        mean_x = sum(xs) / len(xs)
        ax.plot([xs[0], xs[-1]], [dr["slope_per_unit"] * (xs[0] - mean_x), dr["slope_per_unit"] * (xs[-1] - mean_x)],
                color="k", lw=1)
    ax.axhline(0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(dr.get("x_unit", "time"))
    ax.set_ylabel("baseline log throughput − series mean")
    ax.legend(fontsize=7)
    _save(fig, path)
    return True
