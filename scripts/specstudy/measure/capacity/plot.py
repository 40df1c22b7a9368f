"""The capacity search's figure: achieved rate and latency percentiles vs offered rate, gates, knee and
client capacity drawn (``capacity.png``, matplotlib off-screen). Drawn by the search itself when it ends and
redrawn by ``specstudy capacity plot``; the report copies it (its caption: ``report.plots.PLOT_CAPTIONS``).
"""

from __future__ import annotations

import os
from pathlib import Path

from specstudy.core import atomic
from specstudy.core.records import CapacityKnee, CapacityStep


def plot_capacity(steps: list[CapacityStep], soaks: list[CapacityStep], knee: CapacityKnee, gates: dict,
                  path: str | os.PathLike) -> Path:
    """Achieved rate and latency percentiles vs offered rate, gates drawn (matplotlib Agg)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"pass": "tab:green", "fail": "tab:red", "client_limited": "tab:gray"}
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    pts = steps + soaks
    xs = [s.offered_rate for s in pts]
    if xs:
        lim = max(xs) * 1.1
        ax1.plot([0, lim], [0, lim], ls=":", color="k", lw=0.8, label="achieved = offered")
    for verdict, col in colors.items():
        sel = [s for s in pts if s.verdict == verdict and s.achieved_rate is not None]
        ax1.scatter([s.offered_rate for s in sel], [s.achieved_rate for s in sel], c=col, label=verdict,
                    marker="o", s=30)
    ordered = sorted(steps, key=lambda s: s.offered_rate)
    for key, style, gate in (("ttft_p95_ms", "-", gates.get("ttft_p95_ms")), ("ttft_p50_ms", "--", None),
                             ("tpot_p95_ms", "-", gates.get("tpot_p95_ms")), ("tpot_p50_ms", "--", None)):
        sel = [s for s in ordered if getattr(s, key) is not None]
        if sel:
            line = ax2.plot([s.offered_rate for s in sel], [getattr(s, key) for s in sel], style, marker=".",
                            label=key)[0]
            if gate is not None:
                ax2.axhline(gate, color=line.get_color(), lw=0.8, ls=":", label=f"gate {key} = {gate:g}")
    for ax in (ax1, ax2):
        if knee.knee_rps is not None:
            ax.axvline(knee.knee_rps, color="tab:blue", lw=1, label=f"knee {knee.knee_rps:.3g} ({knee.status})")
        cap = knee.client_capacity.rps
        if cap is not None:
            ax.axvline(cap, color="tab:gray", lw=1, ls="--", label=f"client capacity {cap:.3g}")
    ax1.set_ylabel("achieved completions/s")
    ax2.set_ylabel("latency (ms)")
    ax2.set_yscale("log")
    ax2.set_xlabel("offered rate (requests/s, Poisson)")
    ax1.set_title(f"capacity {knee.arm or ''}: {knee.status}")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return atomic.write_bytes(path, buf.getvalue())
