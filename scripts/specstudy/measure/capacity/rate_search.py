"""The capacity search itself: bracket, bisect, classify, confirm with soaks (``docs/capacity.md``).

Pure: only the step runner it is given touches the world. :func:`search` reads as its steps, each a function
of the search's state (:class:`_Search`): :func:`_bracket`, :func:`_bisect`, :func:`_classify`,
:func:`_confirm`, then the checks over all the evidence (:func:`_one_deployment`, :func:`_monotone`) and the
knee record (:func:`_knee_record`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from specstudy.measure.capacity.settings import DEFAULT_SEARCH, SCHEMA_KNEE
from specstudy.measure.capacity.step import StepResult, finite, judge, step_row


@dataclass
class SearchOutcome:
    steps: list[dict]
    soaks: list[dict]
    knee: dict


@dataclass
class _Search:
    """What the search has run and learnt so far: the steps, the bounds, the reasons for its status."""

    step_runner: Callable[[float], StepResult]
    gates: dict
    cfg: dict
    arm: str | None
    on_step: Callable[[dict], None] | None
    steps: list[dict] = field(default_factory=list)
    soaks: list[dict] = field(default_factory=list)
    reasons: list[dict] = field(default_factory=list)
    lo: float | None = None  # highest passing rate
    hi: float | None = None  # lowest server-failing rate
    ceiling: float | None = None  # lowest client-limited rate
    top_reached: bool = False

    def run(self, rate: float, phase: str) -> dict:
        res = self.step_runner(rate)
        row = step_row(res, judge(res, self.gates), index=len(self.steps), phase=phase, arm=self.arm)
        self.steps.append(row)
        if self.on_step:
            self.on_step(row)
        return row

    def budget(self) -> bool:
        return len(self.steps) < self.cfg["max_steps"]

    def upper(self) -> float | None:
        """The nearest upper bound: the lowest failing or client-limited rate."""
        cands = [x for x in (self.hi, self.ceiling) if x is not None]
        return min(cands) if cands else None

    def reason(self, code: str, detail: str) -> None:
        self.reasons.append({"code": code, "detail": detail})


def _client_capacity(steps: list[dict], gates: dict) -> dict:
    declared = gates["client"].get("capacity_rps")
    limited = [s["offered_rate"] for s in steps if s["client_limited"]]
    ceiling = min(limited) if limited else None
    driven = [s["offered_rate"] for s in steps if not s["client_limited"] and (ceiling is None or s["offered_rate"] < ceiling)]
    measured = max(driven) if driven else None
    if declared is not None:
        return {"rps": float(declared), "source": "config", "measured_rps": measured, "ceiling_rps": ceiling}
    return {"rps": measured, "source": "measured", "measured_rps": measured, "ceiling_rps": ceiling}


def search(
    step_runner: Callable[[float], StepResult],
    gates: dict,
    search_cfg: dict,
    *,
    soak_runner: Callable[[float], StepResult] | None = None,
    on_step: Callable[[dict], None] | None = None,
    on_soak: Callable[[dict], None] | None = None,
    arm: str | None = None,
) -> SearchOutcome:
    """Bracket, bisect and confirm. ``gates``/``search_cfg`` must be resolved (defaults filled)."""
    st = _Search(step_runner, gates, search_cfg, arm, on_step)
    _bracket(st)
    _bisect(st)
    status, knee, above, capacity = _classify(st)
    confirmation = _empty_confirmation(search_cfg["soak"])
    if status == "candidate":
        status, knee, above = _confirm(st, knee, above, capacity, confirmation, soak_runner or step_runner, on_soak)
    status = _one_deployment(st, status, confirmation)
    _monotone(st)
    return SearchOutcome(st.steps, st.soaks, _knee_record(st, status, knee, above, capacity, confirmation))


def _bracket(st: _Search) -> None:
    """1. Upwards from the start rate by ``growth`` while steps pass; if the start rate fails, downwards."""
    cfg = st.cfg
    growth = float(cfg["growth"])
    rate = float(cfg["start_rate_rps"])
    while st.budget():
        row = st.run(rate, "bracket")
        if row["verdict"] == "pass":
            st.lo = rate
            if rate >= cfg["max_rate_rps"]:
                st.top_reached = True
                break
            rate = min(rate * growth, float(cfg["max_rate_rps"]))
        elif row["verdict"] == "fail":
            st.hi = rate
            break
        else:
            st.ceiling = rate
            break
    if st.lo is None and st.hi is not None:  # the start rate failed: bracket downwards
        rate = st.hi / growth
        while st.budget() and rate >= cfg["min_rate_rps"]:
            row = st.run(rate, "bracket")
            if row["verdict"] == "pass":
                st.lo = rate
                break
            if row["verdict"] == "fail":
                st.hi = rate
            else:
                st.ceiling = rate if st.ceiling is None else min(st.ceiling, rate)
                break
            rate /= growth


def _bisect(st: _Search) -> None:
    """2. Geometric midpoints between the highest pass and the nearest upper bound, to ``resolution_frac``."""
    cfg = st.cfg
    while st.lo is not None and st.upper() is not None and (st.upper() - st.lo) / st.lo > cfg["resolution_frac"]:
        if not st.budget():
            st.reason("step_budget_exhausted",
                      f"max_steps={cfg['max_steps']} reached before resolution {cfg['resolution_frac']}")
            break
        mid = math.sqrt(st.lo * st.upper())
        row = st.run(mid, "bisect")
        if row["verdict"] == "pass":
            st.lo = mid
        elif row["verdict"] == "fail":
            st.hi = mid
        else:
            st.ceiling = mid if st.ceiling is None else min(st.ceiling, mid)


def _classify(st: _Search) -> tuple[str, float | None, float | None, dict]:
    """3. The bracket's status (``candidate`` when a knee is to be confirmed), the knee, the step above, and
    the client capacity the steps proved."""
    cfg, lo, hi, ceiling = st.cfg, st.lo, st.hi, st.ceiling
    capacity = _client_capacity(st.steps, st.gates)
    status = "candidate"
    knee = lo
    above = st.upper()
    if lo is None:
        status = "no_passing_rate"
        if ceiling is not None and hi is None:
            status = "refused"
            st.reason("client_limited_at_low_rate",
                      f"the load generator was limited at {ceiling:.4g} rps before any step passed")
        else:
            st.reason("no_passing_rate", f"every step down to {cfg['min_rate_rps']} rps failed the server gates")
    elif st.top_reached or above is None:
        status = "no_knee_below_max"
        st.reason("no_failing_rate", f"every step up to {lo:.4g} rps passed (max_rate_rps={cfg['max_rate_rps']})")
    elif hi is None or (ceiling is not None and ceiling <= hi):
        status = "refused"
        st.reason("client_limited",
                  f"the first rate above the last pass ({above:.4g} rps) was client-limited; the server's "
                  f"knee is >= {lo:.4g} rps, beyond what this load generator can prove")
    if status == "candidate" and capacity["rps"] is not None and knee > capacity["rps"] * (1 + 1e-9):
        status = "refused"
        st.reason("knee_above_client_capacity",
                  f"knee {knee:.4g} rps > proven client capacity {capacity['rps']:.4g} rps ({capacity['source']})")
    if status == "candidate" and capacity["rps"] is None:
        status = "refused"
        st.reason("client_capacity_unknown", "no step proved the client could drive any rate")
    return status, knee, above, capacity


def _empty_confirmation(soak_cfg: dict) -> dict:
    return {"count": int(soak_cfg["count"]), "duration_s": soak_cfg["duration_s"], "knee_verdicts": [],
            "above_verdicts": [], "knee_all_pass": None, "above_any_fail": None, "above_fail_majority": None,
            "confirmed": False, "moves": [], "soaked": []}


def _confirm(st: _Search, knee: float, above: float, capacity: dict, confirmation: dict,
             srun: Callable[[float], StepResult], on_soak: Callable[[dict], None] | None) -> tuple[str, float, float]:
    """4. Soaks at the knee and at the step above; the knee moves by one step when they disagree, at most
    ``soak.max_moves`` times. Fills ``confirmation``; returns the status, the knee and the step above."""
    cfg = st.cfg
    soak_cfg = cfg["soak"]
    count = int(soak_cfg["count"])
    moves_left = int(soak_cfg.get("max_moves", DEFAULT_SEARCH["soak"]["max_moves"]))
    verdicts: dict[float, list[str]] = {}  # rate -> soak verdicts, reused when the knee moves
    rnd = [0]

    def soak(pairs: list[tuple[float, str]]) -> None:
        """``count`` rounds over the rates not soaked yet, alternating between them."""
        todo = [(r, w) for r, w in pairs if r not in verdicts]
        for r, _ in todo:
            verdicts[r] = []
        for i in range(count):
            for r, where in todo:
                res = srun(r)
                row = step_row(res, judge(res, st.gates), index=len(st.soaks), phase=f"soak_{where}", arm=st.arm)
                row["soak_round"] = i
                row["confirm_round"] = rnd[0]
                st.soaks.append(row)
                verdicts[r].append(row["verdict"])
                if on_soak:
                    on_soak(row)

    step = 1.0 + float(cfg["resolution_frac"])
    passed = sorted(s["offered_rate"] for s in st.steps if s["verdict"] == "pass")
    failed = sorted(s["offered_rate"] for s in st.steps if s["verdict"] == "fail")
    while True:
        soak([(knee, "knee"), (above, "above")])
        kv, av = verdicts[knee], verdicts[above]
        k_ok = bool(kv) and all(x == "pass" for x in kv)
        a_fail = any(x == "fail" for x in av)
        limited = any(x == "client_limited" for x in kv + av)
        if (k_ok and a_fail) or limited or not kv or moves_left <= 0:
            break
        if not k_ok:  # the knee is not sustained: the next lower rate, within one step
            below = [r for r in passed if r < knee * (1 - 1e-9)]
            new_knee = max(below[-1], knee / step) if below else knee / step
            move = {"from_knee_rps": knee, "to_knee_rps": new_knee, "direction": "down",
                    "why": f"a knee soak failed at {knee:.4g} rps: {kv}"}
            knee, above = new_knee, knee
        else:  # every soak above passed: the knee is higher, by one step
            if above >= cfg["max_rate_rps"] or (capacity["rps"] is not None and above > capacity["rps"] * (1 + 1e-9)):
                break  # the new knee would lie beyond what is testable: stays unconfirmed
            # (the new step above may exceed the client capacity proven so far: its soaks prove or
            # refute the client there, and a client-limited soak stops the confirmation)
            higher = [r for r in failed if r > above * (1 + 1e-9)]
            new_above = min(higher[0], above * step) if higher else above * step
            move = {"from_knee_rps": knee, "to_knee_rps": above, "direction": "up",
                    "why": f"every soak passed at the step above, {above:.4g} rps: {av}"}
            knee, above = above, min(new_above, float(cfg["max_rate_rps"]))
        confirmation["moves"].append(move)
        moves_left -= 1
        rnd[0] += 1
    kv, av = verdicts.get(knee, []), verdicts.get(above, [])
    limited = any(x == "client_limited" for x in kv + av)
    confirmation.update(knee_verdicts=kv, above_verdicts=av,
                        knee_all_pass=bool(kv) and all(x == "pass" for x in kv),
                        above_any_fail=any(x == "fail" for x in av),
                        above_fail_majority=bool(av) and sum(x == "fail" for x in av) * 2 > len(av),
                        soaked=[{"rate_rps": r, "verdicts": v} for r, v in sorted(verdicts.items())])
    confirmation["confirmed"] = confirmation["knee_all_pass"] and confirmation["above_any_fail"] and not limited
    if confirmation["confirmed"]:
        return "confirmed", knee, above
    if not kv:
        st.reason("no_soaks", "soak.count is 0: the knee was not confirmed")
    else:
        if not confirmation["knee_all_pass"]:
            st.reason("knee_soak_failed", f"soaks at {knee:.4g} rps: {kv} (all must pass)")
        if not confirmation["above_any_fail"]:
            st.reason("above_soak_passed", f"soaks at {above:.4g} rps: {av} (at least one must fail the server gates)")
    if limited:
        st.reason("soak_client_limited", "a soak was client-limited")
    if confirmation["moves"] and moves_left <= 0:
        st.reason("soak_moves_exhausted", f"the knee moved {len(confirmation['moves'])} time(s) (soak.max_moves) "
                                          "without the soaks agreeing")
    return "unconfirmed", knee, above


def _one_deployment(st: _Search, status: str, confirmation: dict) -> str:
    """Every step and soak must have run on one uninterrupted server process: a confirmed knee with a restart
    or a counter reset in its evidence is unconfirmed."""
    restarted = [f"{r['phase']}#{r['index']}" for r in st.steps + st.soaks
                 if any(str(n).startswith(("server_restarted", "counter_decreased")) for n in r.get("notes") or [])]
    if restarted:
        st.reason("server_restarted", f"restart/counter reset seen in {', '.join(restarted)}: not one deployment")
        if status == "confirmed":
            status = "unconfirmed"
            confirmation["confirmed"] = False
    return status


def _monotone(st: _Search) -> None:
    """Non-monotone evidence (a passing step above a failing one) is a reason, recorded."""
    fails = [s["offered_rate"] for s in st.steps if s["verdict"] == "fail"]
    passes = [s["offered_rate"] for s in st.steps if s["verdict"] == "pass"]
    if fails and passes and max(passes) > min(fails):
        st.reason("non_monotone", f"a step passed at {max(passes):.4g} rps above a failure at {min(fails):.4g} rps")


def _knee_record(st: _Search, status: str, knee: float | None, above: float | None, capacity: dict,
                 confirmation: dict) -> dict:
    """The ``knee.json`` record of the search (schema ``capacity-knee``, without the deployment summary)."""
    return finite({
        "schema": SCHEMA_KNEE,
        "arm": st.arm,
        "status": status,
        "knee_rps": knee if status in ("confirmed", "unconfirmed", "refused", "no_knee_below_max") else None,
        "step_above_rps": above if st.lo is not None else None,
        "bracket": {"last_pass_rps": st.lo, "first_fail_rps": st.hi, "client_limited_rps": st.ceiling},
        "resolution_frac": st.cfg["resolution_frac"],
        "n_steps": len(st.steps),
        "n_soaks": len(st.soaks),
        "client_capacity": capacity,
        "confirmation": confirmation,
        "reasons": st.reasons,
    })
