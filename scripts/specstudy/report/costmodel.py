"""The explanatory cost model of speculative decoding (H1 made quantitative): where a decoding step's time
goes, the speedup that predicts, and the acceptance a draft of that cost would need to win.

Read from the ``cells`` and ``deployments`` tables (valid cells of one phase; medians over repeats), and,
when present, the mechanics point (``results/mechanics/mechanics.json``) and the profile phase
(``results/profile/summary.json``). Per arm with depth ``k`` at concurrency ``c``:

- **Acceptance length** ``L`` = 1 + accepted / drafts (the window's spec-decode counters: tokens per target
  step and sequence), acceptance rate ``α`` = accepted / draft tokens; never converted into each other.
- **Baseline step** ``T_b`` = the baseline's TPOT p50 (one token per target step).
- **Measured step** ``T_s`` = the arm's TPOT p50 × ``L`` (time of one speculative step: drafting k tokens
  and verifying k + 1), the mechanics point's definition.
- **Split** ``T_s = T_verify + T_draft``. ``T_verify``, the target's verification of k + 1 tokens per
  sequence, comes from the best source present, named in every row:

  1. ``profile``: the profile phase's share of the arm's engine time in the draft (``draft_forward`` +
     ``ngram_proposal``) against everything else the engine classified (``other`` excluded): GPU time when
     the traces hold it, else host time; ``T_draft = T_s × share``;
  2. ``mechanics``: for a draft-model arm of the mechanics point's depth, the step of its negligible-size
     draft (``small-draft-k<k>``: acceptance ≈ 0) relative to its baseline at the same concurrency,
     ``T_verify = T_b × step_small / step_base`` — verification plus the speculative step's fixed cost;
  3. ``memory-bound``: ``T_verify = T_b`` — verifying k + 1 tokens per sequence reads the target's weights
     once, like one decoding step (the memory-bound regime).

  ``T_draft = T_s − T_verify``; per draft token ``T_draft / k``, also in units of ``T_b``.
- **Predicted speedup** from measured acceptance and step costs: ``S = L × T_b / T_s`` with the step costs
  pooled over workloads (median at each concurrency: a step's cost does not depend on what is accepted), so
  a workload's prediction differs from another's only through its acceptance; beside it the **size model**
  ``S_size = L × T_b / (T_verify + k ρ T_b)``, where ``ρ`` = the draft's weights ÷ the target's (GiB from the
  arms' own launch logs: the draft arm's "Model loading" minus the baseline's; 0 for n-gram), i.e. what the
  step would cost if the draft forward were as memory-bound as the target's. Measured speedup = the arm's
  median output tokens/s ÷ the baseline's (the report adds the paired geometric mean and its CI).
- **Break-even** acceptance length ``L* = T_s / T_b`` (the arm wins where ``L > L*``) and the per-token
  acceptance rate that gives it, ``α*`` with ``(1 − α^{k+1}) / (1 − α) = L*`` (i.i.d. acceptance per
  position); ``L* > k + 1`` cannot be reached at depth k (``α*`` None, "unreachable").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specstudy.core.arms import baseline_of, is_arm_name, is_baseline
from specstudy.core.stat_util import median

SOURCES = ("profile", "mechanics", "memory-bound")
DRAFT_CATEGORIES = ("draft_forward", "ngram_proposal")


def expected_length(alpha: float, k: int) -> float:
    """Mean tokens per step with i.i.d. acceptance ``alpha`` per position and depth ``k``: Σ_{i=0..k} α^i."""
    return float(sum(alpha ** i for i in range(k + 1)))


def break_even_alpha(length: float, k: int, tol: float = 1e-12) -> float | None:
    """The α with ``expected_length(α, k) == length`` (bisection; L is increasing in α from 1 to k + 1).
    0 when ``length ≤ 1`` (any acceptance wins), None when ``length > k + 1`` (no acceptance does)."""
    if length <= 1.0:
        return 0.0
    if length > k + 1:
        return None
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if expected_length(mid, k) < length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _valid(c: dict, phase: str) -> bool:
    return (c.get("phase") == phase and bool(c.get("throughput_valid")) and c.get("kind", "repeat") != "drift"
            and c.get("tpot_p50_ms") is not None)


def _own(arm: str) -> str:
    """The baseline an arm is set against: its own engine build's (``baseline`` in a study of one engine)."""
    return baseline_of(arm) if is_arm_name(arm) else "baseline"


def draft_size_ratios(deployments: list[dict]) -> dict[str, float | None]:
    """Per arm: the draft's weights ÷ the target's, from the launch logs' "Model loading took X GiB" (a draft
    arm loads target + draft, the baseline the target only); 0 for methods without a draft model."""
    loading: dict[str, list[float]] = {}
    methods: dict[str, str] = {}
    for d in deployments:
        if d.get("status") == "failed":
            continue
        methods[d["arm"]] = d.get("method")
        if d.get("model_loading_gib") is not None:
            loading.setdefault(d["arm"], []).append(float(d["model_loading_gib"]))
    out: dict[str, float | None] = {}
    for arm, method in methods.items():
        if is_baseline(arm):
            continue
        if method != "draft_model":
            out[arm] = 0.0
            continue
        base = median(loading.get(_own(arm), []))  # the baseline of the arm's own engine build
        mine = median(loading.get(arm, []))
        out[arm] = (mine - base) / base if (mine is not None and base) else None
    return out


def _profile_shares(profile: dict | None) -> dict[str, float]:
    """Per arm: the draft's share of the engine's classified time (GPU time where the traces hold it)."""
    out = {}
    for a in (profile or {}).get("arms") or []:
        total = a.get("total") or {}
        ms = total.get("device_ms") or total.get("ms") or {}
        classified = sum(v for k, v in ms.items() if k != "other" and v is not None)
        if classified > 0:
            out[a["arm"]] = sum(ms.get(k) or 0.0 for k in DRAFT_CATEGORIES) / classified
    return out


def _mechanics_verify(mechanics: dict | None) -> dict[tuple[int, int], float]:
    """(k, concurrency) → the negligible-size draft's step ÷ its baseline's step, from the mechanics point."""
    out = {}
    for r in (mechanics or {}).get("rows") or []:
        label = r.get("mechanics_label") or ""
        if label.startswith("small-draft-k") and r.get("valid") and r.get("step_time_ratio") is not None:
            out[(int(r["num_speculative_tokens"]), int(r["concurrency"]))] = float(r["step_time_ratio"])
    return out


def _cell_medians(cells: list[dict], phase: str) -> dict[tuple[str, str, int], dict]:
    groups: dict[tuple[str, str, int], list[dict]] = {}
    for c in cells:
        if _valid(c, phase):
            groups.setdefault((c["arm"], c["workload"], int(c["concurrency"])), []).append(c)
    out = {}
    for key, cs in groups.items():
        steps = [c["tpot_p50_ms"] * c["mean_acceptance_length"] for c in cs
                 if c.get("mean_acceptance_length") is not None]
        out[key] = {"n": len(cs), "tpot_ms": median(c["tpot_p50_ms"] for c in cs),
                    "otps": median(c.get("output_tokens_per_second") for c in cs),
                    "length": median(c.get("mean_acceptance_length") for c in cs),
                    "alpha": median(c.get("acceptance_rate") for c in cs),
                    "step_ms": median(steps), "method": cs[0].get("method"),
                    "k": cs[0].get("num_speculative_tokens")}
    return out


def cost_model(cells: list[dict], deployments: list[dict] | None = None, *, phase: str = "confirm",
               mechanics: dict | None = None, profile: dict | None = None) -> dict:
    """``{"phase", "steps": [per arm × concurrency], "predictions": [per arm × workload × concurrency]}``."""
    med = _cell_medians(cells, phase)
    ratios = draft_size_ratios(deployments or [])
    shares, mech = _profile_shares(profile), _mechanics_verify(mechanics)
    base_step = {}  # (baseline arm, concurrency) → T_b pooled over workloads (one baseline per engine build)
    for b, c in sorted({(arm, c) for (arm, _w, c) in med if is_baseline(arm)}):
        base_step[(b, c)] = median(m["tpot_ms"] for (arm, _w, cc), m in med.items() if arm == b and cc == c)
    steps, predictions = [], []
    arms = sorted({arm for (arm, _w, _c) in med if not is_baseline(arm)})
    for arm in arms:
        for c in sorted({cc for (a, _w, cc) in med if a == arm}):
            ms = [m for (a, _w, cc), m in med.items() if a == arm and cc == c]
            k, method = ms[0]["k"], ms[0]["method"]
            t_b, t_s = base_step.get((_own(arm), c)), median(m["step_ms"] for m in ms)
            if t_b is None or t_s is None or not k:
                continue
            k = int(k)
            if arm in shares:
                source, t_draft = "profile", t_s * shares[arm]
                t_verify = t_s - t_draft
            elif method == "draft_model" and (k, c) in mech:
                source, t_verify = "mechanics", t_b * mech[(k, c)]
                t_draft = t_s - t_verify
            else:
                source, t_verify = "memory-bound", t_b
                t_draft = t_s - t_verify
            rho = ratios.get(arm)
            size_step = (t_verify + k * rho * t_b) if rho is not None else None
            be = t_s / t_b
            lengths = [m["length"] for m in ms]
            step = {"arm": arm, "method": method, "k": k, "concurrency": c, "workloads": len(ms),
                    "base_step_ms": t_b, "step_ms": t_s, "verify_ms": t_verify, "draft_ms": t_draft,
                    "verify_source": source, "draft_ms_per_token": t_draft / k,
                    "draft_token_cost": t_draft / k / t_b, "draft_size_ratio": rho,
                    "size_model_step_ms": size_step, "break_even_length": be,
                    "break_even_alpha": break_even_alpha(be, k), "reachable": be <= k + 1,
                    "size_model_break_even_length": (size_step / t_b) if size_step is not None else None,
                    "measured_length": median(lengths)}
            steps.append(step)
            for (a, w, cc), m in sorted(med.items()):
                if a != arm or cc != c or m["length"] is None:
                    continue
                b = med.get((_own(arm), w, c)) or {}
                predictions.append({
                    "arm": arm, "workload": w, "concurrency": c, "n": m["n"], "length": m["length"],
                    "alpha": m["alpha"], "predicted_speedup": m["length"] * t_b / t_s,
                    "size_model_speedup": (m["length"] * t_b / size_step) if size_step else None,
                    "measured_speedup": (m["otps"] / b["otps"]) if (m["otps"] and b.get("otps")) else None,
                    "measured_tpot_speedup": (b["tpot_ms"] / m["tpot_ms"]) if b.get("tpot_ms") else None,
                    "wins_by_model": m["length"] > be})
    return {"phase": phase, "sources": sorted({s["verify_source"] for s in steps}), "steps": steps,
            "predictions": predictions}


def load_inputs(mechanics: str | Path | None, profile: str | Path | None) -> tuple[dict | None, dict | None]:
    """The mechanics point's summary (``results/mechanics/mechanics.json``) and the profile phase's
    (``results/profile/summary.json``), each None where not given or absent."""
    from specstudy.core import atomic

    def read(p):
        return atomic.read_json(p) if p is not None and Path(p).exists() else None

    return read(mechanics), read(profile)


def _f(v: Any, fmt: str = "{:.3f}") -> str:
    return "–" if v is None else fmt.format(v)


def report_section(B: list, cells: list[dict], deployments: list[dict],
                   inputs: tuple[str | Path | None, str | Path | None] = (None, None),
                   comps: list[dict] | None = None, phase: str = "confirm") -> dict:
    """The report's "Cost model" section (specstudy.report.blocks) with the mechanics point's and the profile
    phase's summaries ``inputs`` (:func:`load_inputs`); returns the model."""
    mechanics, profile = load_inputs(*inputs)
    if not any(_valid(c, phase) for c in cells):
        phase = "screen"
    model = cost_model(cells, deployments, phase=phase, mechanics=mechanics, profile=profile)
    B.append(("h", 2, "Cost model: time per decoding step, predicted speedup, break-even acceptance"))
    if not model["steps"]:
        B.append(("p", f"No {phase} cells of a speculative arm with a baseline at the same concurrency and an "
                       "acceptance length: nothing to model."))
        return model
    B.append(("p", f"H1 made quantitative ({phase} phase; medians over repeats, step costs pooled over workloads). "
                   "Step = arm TPOT p50 × acceptance length L (1 + accepted/drafts); baseline step = baseline TPOT "
                   "p50. Verification from the profile phase, else the mechanics point's negligible-size draft, "
                   "else one baseline step (memory-bound); drafting = step − verification. Predicted speedup = "
                   "L × baseline step ÷ step; size model = the same with the draft forward costing its weights' "
                   "share ρ of a target step. Break-even L* = step ÷ baseline step (α*: the per-token acceptance "
                   "giving L* at depth k; 'unreachable' when L* > k + 1). Explanatory, not the decision."))
    B.append(("table", ["arm", "c", "k", "baseline step ms", "step ms", "verify ms (source)", "draft ms",
                        "per draft token ms (× base step)", "draft size ρ", "size-model step ms",
                        "break-even L*", "α*", "measured L"],
              [[s["arm"], s["concurrency"], s["k"], _f(s["base_step_ms"], "{:.2f}"), _f(s["step_ms"], "{:.2f}"),
                f"{_f(s['verify_ms'], '{:.2f}')} ({s['verify_source']})", _f(s["draft_ms"], "{:.2f}"),
                f"{_f(s['draft_ms_per_token'], '{:.2f}')} ({_f(s['draft_token_cost'], '{:.2f}')})",
                _f(s["draft_size_ratio"], "{:.3f}"), _f(s["size_model_step_ms"], "{:.2f}"),
                _f(s["break_even_length"], "{:.2f}"),
                _f(s["break_even_alpha"]) if s["reachable"] else "unreachable", _f(s["measured_length"], "{:.2f}")]
               for s in model["steps"]]))
    cis = {(c["arm"], c["workload"], c["concurrency"]): c for c in (comps or []) if c.get("phase") == phase}
    rows = []
    for p in model["predictions"]:
        comp = cis.get((p["arm"], p["workload"], p["concurrency"]))
        sp = (comp or {}).get("speedup") or {}
        ci = (f"{sp['geomean']:.3f} [{_f(sp.get('ci_low'))}, {_f(sp.get('ci_high'))}]" if sp.get("n") else "–")
        rows.append([p["arm"], p["workload"], p["concurrency"], _f(p["length"]), _f(p["alpha"]),
                     _f(p["predicted_speedup"]), _f(p["size_model_speedup"]), _f(p["measured_speedup"]),
                     _f(p["measured_tpot_speedup"]), ci])
    B.append(("p", "Predicted against measured, per workload (measured: median output tok/s ratio; TPOT: baseline "
                   "TPOT ÷ arm TPOT; the paired geometric mean with its CI from the comparisons):"))
    B.append(("table", ["arm", "workload", "c", "L", "α", "predicted (step costs)", "predicted (size model)",
                        "measured tok/s ratio", "measured TPOT ratio⁻¹", "speedup gm [CI]"], rows))
    return model
