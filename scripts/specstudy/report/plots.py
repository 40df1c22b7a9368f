"""The report's figures: matplotlib off-screen, each PNG written atomically with reproducible bytes, and
the caption under every plot (one table, :data:`PLOT_CAPTIONS`).
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
