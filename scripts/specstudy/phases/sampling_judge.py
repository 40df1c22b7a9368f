"""The sampling judge (temperature > 0): output *distributions*, judged offline against a control.

At temperature > 0 a speculative arm is lossless when its outputs are drawn from the same
distribution as the baseline's, not when they are the same strings: two separately launched
deployments are not bitwise reproducible, and a speculative sampler (rejection sampling) need not
consume a request's random stream the way the plain sampler does, so even a shared seed does not
make a lossless arm reproduce the baseline's sample. So, as the greedy gate (:mod:`specstudy.analysis.gate`)
does, a baseline-vs-candidate comparison is judged against a baseline-vs-baseline *control*: no
control, no verdict.

Every request (prompt, seed) is sent with the same seed and parameters in every arm (a sampled
capture, schema ``sampled-capture``). For two captures, each comparable request ("item") gives

* ``length_difference`` — |Δ completion tokens| / the larger of the two (0 when both are 0);
* ``token_tvd`` — total variation distance between the two outputs' unigram distributions of
  completion token ids (whitespace-separated words when a capture lacks the ids);
* ``text_similarity`` — 1 − character Levenshtein distance / longer output (rapidfuzz).

Treatment items pair each candidate deployment with a baseline deployment under the same seed;
control items pair every two baseline (control) deployments, under a rotated seed (independent
draws, the default) or the same seed (``control_pairing``). Values are averaged over a prompt's
seeds within one pair (the unit: requests of one prompt are not independent, and every value
averages as many requests on both sides), and per statistic the treatment values are tested
against the control values with the declared one-sided two-sample test (``mannwhitneyu`` or ``ks_2samp``, harmful direction: more divergence, less similarity).
A statistic fails when the test is significant at ``alpha`` (/3 with ``bonferroni``) AND the
treatment mean is worse than the control mean by more than its declared margin. Verdicts:
``pass`` | ``fail`` | ``no_verdict`` (with reasons); a pass is "no material distribution shift
detected; not a proof".

The offline judge only (it reads capture files; the captures against a live server are
:mod:`specstudy.phases.sampling_capture`, the phase's deployment step, summary and section
:mod:`specstudy.phases.sampling`). Functions: :func:`length_difference`, :func:`unigram_tvd`,
:func:`text_similarity`, :func:`compare_pair`, :func:`judge` (its settings checked by
:func:`specstudy.study.prereg.check_sampling`). CLI: ``specstudy phase sampling judge``. Imports ``core``,
``study.prereg`` and :mod:`specstudy.phases.sampling_capture` (docs/sampling.md).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from specstudy.core import schemas
from specstudy.core.stat_util import median
from specstudy.phases.sampling_capture import load_sampled_capture
from specstudy.study.prereg import SamplingInputError, check_sampling

__all__ = ["STATISTICS", "SamplingInputError", "compare_pair", "judge", "length_difference", "text_similarity",
           "two_sample_test", "unigram_tvd"]

GATE_SCHEMA = "specstudy.sampling-gate/1"
STATISTICS = ("length_difference", "token_tvd", "text_similarity")
#: statistics where a larger treatment value is the harmful direction (the others: smaller is harmful)
DIVERGENCES = ("length_difference", "token_tvd")
TESTS = ("mannwhitneyu", "ks_2samp")
EPS = 1e-12

CLAIM = ("sampled outputs of the speculative arm differ from the baseline's no more than two baseline deployments "
         "differ from each other (declared test and margins): no material distribution shift detected; not a proof")
CLAIM_FAIL = ("sampled outputs of the speculative arm differ from the baseline's significantly and materially more "
              "than two baseline deployments differ, or a request failed; this blocks recommendation until explained")
CLAIM_NONE = ("no verdict: the sampled comparison could not be calibrated against a baseline-vs-baseline control or "
              "evaluated (see reasons); a pass would only mean no material distribution shift was detected")

DEFINITIONS = {
    "item": "one request (prompt_id, seed) present and successful in both captures of a pair",
    "length_difference": "|completion_tokens_a - completion_tokens_b| / max(both); 0.0 when both are 0",
    "token_tvd": "total variation distance between the unigram distributions of the two outputs' completion token "
                 "ids (unit 'token_id'), or of their whitespace-separated words (unit 'word') when any capture lacks "
                 "the ids; 0.0 when both are empty, 1.0 when exactly one is",
    "text_similarity": "1 - character Levenshtein distance (rapidfuzz) / length of the longer output; 1.0 when both "
                       "are empty, 0.0 when exactly one is",
    "treatment": "each candidate deployment vs one baseline deployment (by position, cycled), same seed",
    "control": "every pair of distinct control (baseline) deployments; rotated_seed: the item of seed s_i is paired "
               "with the other deployment's item of the prompt's next seed s_(i+1 mod k) (independent draws); "
               "same_seed: with the same seed",
    "unit_value": "the mean of a statistic over a prompt's items within one pair: the tests' unit (pairs x prompts "
                  "values per side)",
    "per_prompt": "the mean of a statistic over a prompt's items over every pair of that side (descriptive)",
    "effect": "treatment mean - control mean for length_difference and token_tvd; control mean - treatment mean for "
              "text_similarity (positive = the candidate diverges more)",
    "check": "fails when the one-sided test is significant at the (corrected) alpha AND effect > margin",
}


# --------------------------------------------------------------------------- per-item statistics


def length_difference(tokens_a: int, tokens_b: int) -> float:
    """|a - b| / max(a, b); 0.0 when both are 0."""
    longer = max(tokens_a, tokens_b)
    return 0.0 if longer == 0 else abs(tokens_a - tokens_b) / longer


def unigram_tvd(a: Iterable, b: Iterable) -> float:
    """Total variation distance between the unigram (frequency) distributions of two token sequences."""
    ca, cb = Counter(a), Counter(b)
    na, nb = sum(ca.values()), sum(cb.values())
    if na == 0 and nb == 0:
        return 0.0
    if na == 0 or nb == 0:
        return 1.0
    return 0.5 * math.fsum(abs(ca[t] / na - cb[t] / nb) for t in ca.keys() | cb.keys())


def text_similarity(a: str, b: str) -> float:
    """1 - character Levenshtein distance / longer length (rapidfuzz); 1.0 when both are empty."""
    from rapidfuzz.distance import Levenshtein

    if not a and not b:
        return 1.0
    return float(Levenshtein.normalized_similarity(a, b))


def _units(row: dict, unit: str) -> list:
    if unit == "token_id":
        return list(row["completion_token_ids"])
    return (row.get("output_text") or "").split()


def _rows(capture: dict) -> dict[tuple[str, int], dict]:
    return {(r["prompt_id"], r["seed"]): r for r in capture["prompts"]}


def _seeds_by_prompt(capture: dict) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in capture["prompts"]:
        out.setdefault(r["prompt_id"], []).append(r["seed"])
    return {p: sorted(s) for p, s in out.items()}


def compare_pair(a: dict, b: dict, *, unit: str = "word", pairing: str = "same_seed") -> list[dict]:
    """Per-item statistics of capture ``a`` against capture ``b``.

    ``pairing``: ``same_seed`` pairs a's (prompt, s) with b's (prompt, s); ``rotated_seed`` pairs it with
    b's (prompt, next seed of the prompt's sorted seeds in a, cyclically). ``unit``: ``token_id`` or ``word``.
    """
    if pairing not in ("same_seed", "rotated_seed"):
        raise ValueError(f"pairing must be same_seed or rotated_seed, got {pairing!r}")
    rb = _rows(b)
    seeds = _seeds_by_prompt(a)
    out = []
    for ra in a["prompts"]:
        pid, seed = ra["prompt_id"], ra["seed"]
        partner = seed
        if pairing == "rotated_seed":
            ss = seeds[pid]
            partner = ss[(ss.index(seed) + 1) % len(ss)] if len(ss) > 1 else None
        item: dict[str, Any] = {"prompt_id": pid, "seed_a": seed, "seed_b": partner, "comparable": False,
                                "reason": None, "completion_tokens_a": ra.get("completion_tokens"),
                                "completion_tokens_b": None, **dict.fromkeys(STATISTICS)}
        row_b = rb.get((pid, partner)) if partner is not None else None
        if row_b is not None:
            item["completion_tokens_b"] = row_b.get("completion_tokens")
        if partner is None:
            item["reason"] = "one seed only (rotated_seed pairing needs >= 2 seeds per prompt)"
        elif row_b is None:
            item["reason"] = f"missing in b (seed {partner})"
        elif not ra["success"] or not row_b["success"]:
            item["reason"] = "failed in " + " and ".join(s for s, r in (("a", ra), ("b", row_b)) if not r["success"])
        if item["reason"]:
            out.append(item)
            continue
        ta, tb = ra.get("output_text") or "", row_b.get("output_text") or ""
        ca, cb = item["completion_tokens_a"], item["completion_tokens_b"]
        item.update(comparable=True, text_similarity=text_similarity(ta, tb),
                    token_tvd=unigram_tvd(_units(ra, unit), _units(row_b, unit)),
                    length_difference=None if ca is None or cb is None else length_difference(ca, cb))
        out.append(item)
    return out


# --------------------------------------------------------------------------- settings


# --------------------------------------------------------------------------- the test


def _summary(values: Sequence[float]) -> dict:
    if not values:
        return {"n": 0, "mean": None, "median": None, "min": None, "max": None}
    return {"n": len(values), "mean": math.fsum(values) / len(values), "median": median(values),
            "min": min(values), "max": max(values)}


def two_sample_test(treatment: Sequence[float], control: Sequence[float], test: str,
                    harmful: str) -> tuple[float, float, str]:
    """One-sided declared test that ``treatment`` is worse than ``control``: (statistic, p-value, scipy
    alternative). ``harmful`` is ``larger`` or ``smaller`` (the treatment's harmful direction)."""
    from scipy import stats as st

    if test == "mannwhitneyu":
        alt = "greater" if harmful == "larger" else "less"
        res = st.mannwhitneyu(treatment, control, alternative=alt)
    elif test == "ks_2samp":
        # ks_2samp's alternative is about the CDF of the first sample: a stochastically larger sample has the
        # lower CDF ("less").
        alt = "less" if harmful == "larger" else "greater"
        res = st.ks_2samp(treatment, control, alternative=alt)
    else:
        raise ValueError(f"test must be one of {TESTS}, got {test!r}")
    stat, p = float(res.statistic), float(res.pvalue)
    if math.isnan(p):  # every value tied (e.g. all identical): no evidence of a difference
        p = 1.0
    return stat, p, alt


# --------------------------------------------------------------------------- judge


def _load_all(items, role: str) -> list[tuple[dict, str]]:
    out = []
    for i, item in enumerate(items or []):
        label = f"<{role}:{i}>" if isinstance(item, dict) else str(item)
        out.append((load_sampled_capture(item, source=label), label))
    return out


def _primary(captures: list[tuple[dict, str]]) -> list[tuple[dict, str]]:
    by_dep: dict[str, tuple[dict, str]] = {}
    for cap, label in captures:
        cur = by_dep.get(cap["deployment_id"])
        if cur is None or cap["capture_index"] < cur[0]["capture_index"]:
            by_dep[cap["deployment_id"]] = (cap, label)
    return list(by_dep.values())


def _group(captures: list[tuple[dict, str]]) -> dict:
    arms = sorted({c["arm"] for c, _ in captures})
    return {"arm": arms[0] if len(arms) == 1 else (",".join(arms) if arms else None),
            "deployment_ids": sorted({c["deployment_id"] for c, _ in captures}),
            "captures": [label for _, label in captures]}


def _per_prompt(items: list[dict]) -> dict[str, dict[str, float]]:
    acc: dict[str, dict[str, list[float]]] = {}
    for it in items:
        if not it["comparable"]:
            continue
        d = acc.setdefault(it["prompt_id"], {s: [] for s in STATISTICS})
        for s in STATISTICS:
            if it[s] is not None:
                d[s].append(it[s])
    return {p: {s: math.fsum(v) / len(v) for s, v in d.items() if v} for p, d in acc.items()}


def judge(baseline, candidate, control, settings: dict, *, arm: str | None = None, phase: str | None = None,
          settings_source: str = "sampling settings") -> dict:
    """Judge a speculative arm's sampled outputs against the baseline's, calibrated by a baseline-vs-baseline control.

    ``baseline`` / ``candidate`` / ``control``: sampled captures (paths or dicts); ``control`` holds two or
    more independently launched deployments of one configuration (usually every baseline repeat).
    ``settings``: the pre-registration's ``sampling`` section. Returns the record (schema ``sampling-gate``).
    """
    settings = check_sampling(settings, settings_source)
    base = _load_all(baseline, "baseline")
    cand = _load_all(candidate, "candidate")
    ctrl = _load_all(control, "control")
    reasons: list[dict] = []

    def reason(code: str, detail: str) -> None:
        reasons.append({"code": code, "detail": detail})

    if not base:
        reason("no_captures", "no baseline capture supplied")
    if not cand:
        reason("no_captures", "no candidate capture supplied")
    base_p, cand_p, ctrl_p = _primary(base), _primary(cand), _primary(ctrl)
    ctrl_arms = sorted({c["arm"] for c, _ in ctrl_p})
    if not ctrl_p:
        reason("no_control", "no baseline-vs-baseline control supplied (sampled captures of two independently "
               "launched deployments of one configuration, e.g. baseline rep1 and rep2): no control, no verdict")
    elif len(ctrl_p) < 2:
        reason("no_control", f"the control has one deployment ({ctrl_p[0][0]['deployment_id']}); it needs two "
               "independently launched deployments of one configuration")
    if len(ctrl_arms) > 1:
        reason("control_mixed_arms", f"control deployments belong to different arms ({', '.join(ctrl_arms)}); a "
               "control must be deployments of one configuration")

    # identical requests everywhere: same (prompt, seed) keys, same parameters, the declared ones
    everything = base + cand + ctrl
    keysets = {frozenset(_rows(c)) for c, _ in everything}
    if len(keysets) > 1:
        reason("missing_items", "captures do not all contain the same (prompt_id, seed) requests; every arm must "
               "send every prompt with the same seeds")
    params: dict[tuple[str, int], tuple] = {}
    mismatched: set[str] = set()
    for cap, label in everything:
        for r in cap["prompts"]:
            p = (r["temperature"], r["top_p"], r["max_tokens"])
            prev = params.setdefault((r["prompt_id"], r["seed"]), p)
            if prev != p:
                mismatched.add(f"{label}: {r['prompt_id']} seed {r['seed']} sent {p}, elsewhere {prev}")
            if abs(r["temperature"] - settings["temperature"]) > 1e-9 or abs(r["top_p"] - settings["top_p"]) > 1e-9:
                mismatched.add(f"{label}: {r['prompt_id']} seed {r['seed']} sent temperature {r['temperature']}, "
                               f"top_p {r['top_p']}; pre-registered {settings['temperature']}, {settings['top_p']}")
    declared = list(range(settings["seeds"]["base"], settings["seeds"]["base"] + settings["seeds"]["per_prompt"]))
    for cap, label in everything:
        for pid, seeds in _seeds_by_prompt(cap).items():
            if seeds != declared:
                mismatched.add(f"{label}: {pid} sampled with seeds {seeds}; pre-registered {declared} (seeds.base + i)")
    if mismatched:
        shown = sorted(mismatched)
        reason("parameters_mismatch", "requests were not sent with identical, pre-registered parameters: "
               + "; ".join(shown[:5]) + (f" (+{len(shown) - 5} more)" if len(shown) > 5 else ""))

    has_ids = all(r.get("completion_token_ids") is not None for c, _ in everything for r in c["prompts"] if r["success"])
    unit = "token_id" if everything and has_ids else "word"

    # treatment: candidate i vs baseline i (cycled), same seed; control: every pair of distinct deployments
    t_pairs = [(base_p[i % len(base_p)], c) for i, c in enumerate(cand_p)] if base_p else []
    c_pairs = [(ctrl_p[i], ctrl_p[j]) for i in range(len(ctrl_p)) for j in range(i + 1, len(ctrl_p))]
    t_by_pair = [compare_pair(x, y, unit=unit, pairing="same_seed") for (x, _), (y, _) in t_pairs]
    c_by_pair = [compare_pair(x, y, unit=unit, pairing=settings["control_pairing"]) for (x, _), (y, _) in c_pairs]
    t_items = [it for items in t_by_pair for it in items]
    c_items = [it for items in c_by_pair for it in items]

    if any(it["reason"] and it["reason"].startswith("one seed only") for it in c_items):
        reason("control_needs_two_seeds", "rotated_seed control pairing needs >= 2 seeds per prompt in the control "
               "captures")
    failed_ctrl = sorted({f"{c['deployment_id']}:{r['prompt_id']}#{r['seed']}" for c, _ in ctrl_p for r in c["prompts"]
                          if not r["success"]})
    if failed_ctrl:
        reason("control_incomplete", f"control requests failed ({', '.join(failed_ctrl[:5])}); the control would "
               "understate the nondeterminism")
    if any(it["comparable"] and it["length_difference"] is None for it in t_items + c_items):
        reason("missing_usage", "compared requests lack a usage record (completion_tokens); length_difference "
               "cannot be evaluated")

    # test units: (pair, prompt), the mean over the prompt's seeds within one pair, so that both samples average
    # the same number of requests per value (per-prompt means over 2 treatment pairs vs 1 control pair would
    # differ in spread under the null, which a distribution test such as ks_2samp detects)
    t_units = [_per_prompt(items) for items in t_by_pair]
    c_units = [_per_prompt(items) for items in c_by_pair]
    t_prompt, c_prompt = _per_prompt(t_items), _per_prompt(c_items)
    prompts_used = [p for p in dict.fromkeys(it["prompt_id"] for it in t_items) if p in t_prompt and p in c_prompt]
    if (t_pairs and c_pairs) and len(prompts_used) < settings["min_prompts"]:
        reason("too_few_prompts", f"{len(prompts_used)} prompts comparable on both sides; the pre-registration "
               f"requires min_prompts = {settings['min_prompts']}")

    all_ok = all(r["success"] for c, _ in base + cand for r in c["prompts"])
    checks: list[dict] = []
    verdict = "no_verdict"
    if not reasons:
        n_tests = len(STATISTICS) if settings["correction"] == "bonferroni" else 1
        alpha = settings["alpha"] / n_tests
        if not all_ok:
            failed = sorted({f"{c['arm']}/{c['deployment_id']}:{r['prompt_id']}#{r['seed']}" for c, _ in base + cand
                             for r in c["prompts"] if not r["success"]})
            reason("request_failed", f"requests failed: {', '.join(failed[:10])}")
        checks.append({"name": "all_requests_succeeded", "test": None, "alternative": None, "statistic": None,
                       "p_value": None, "alpha": None, "treatment": None, "control": None, "effect": None,
                       "margin": None, "allowance": None, "significant": None, "material": None, "passed": all_ok})
        for s in STATISTICS:
            tv = [u[p][s] for u in t_units for p in prompts_used if p in u]
            cv = [u[p][s] for u in c_units for p in prompts_used if p in u]
            harmful = "larger" if s in DIVERGENCES else "smaller"
            stat, p, alt = two_sample_test(tv, cv, settings["test"], harmful)
            ts, cs = _summary(tv), _summary(cv)
            margin = float(settings["margins"][s])
            sign = 1.0 if harmful == "larger" else -1.0
            effect = sign * (ts["mean"] - cs["mean"])
            significant, material = p < alpha, effect > margin + EPS
            passed = not (significant and material)
            checks.append({"name": s, "test": settings["test"], "alternative": alt, "statistic": stat, "p_value": p,
                           "alpha": alpha, "treatment": ts, "control": cs, "effect": effect, "margin": margin,
                           "allowance": cs["mean"] + sign * margin, "significant": significant,
                           "material": material, "passed": passed})
            if not passed:
                reason("exceeds_control", f"{s}: treatment mean {ts['mean']:.4g} vs control mean {cs['mean']:.4g} "
                       f"(effect {effect:.4g} > margin {margin}; {settings['test']} one-sided p = {p:.3g} < {alpha:.3g})")
        verdict = "pass" if all(c["passed"] for c in checks) else "fail"

    def lengths(caps):
        return [float(r["completion_tokens"]) for c, _ in caps for r in c["prompts"]
                if r["success"] and r["completion_tokens"] is not None]

    def signed(pairs):
        out = []
        for (x, _), (y, _) in pairs:
            ry = _rows(y)
            for r in x["prompts"]:
                o = ry.get((r["prompt_id"], r["seed"]))
                if o and r["success"] and o["success"] and None not in (r["completion_tokens"], o["completion_tokens"]):
                    out.append(float(o["completion_tokens"] - r["completion_tokens"]))
        return _summary(out)

    record = {
        "schema": GATE_SCHEMA,
        "arm": arm or _group(cand)["arm"],
        "phase": phase,
        "verdict": verdict,
        "reasons": reasons,
        "blocks_recommendation": verdict == "fail",
        "claim": {"pass": CLAIM, "fail": CLAIM_FAIL, "no_verdict": CLAIM_NONE}[verdict],
        "settings": settings,
        "unit": unit,
        "baseline": _group(base),
        "candidate": _group(cand),
        "treatment": {"n_pairs": len(t_pairs), "pairing": "by_position", "seed_pairing": "same_seed",
                      "deployment_pairs": [[x["deployment_id"], y["deployment_id"]] for (x, _), (y, _) in t_pairs],
                      "items": sum(it["comparable"] for it in t_items)},
        "control": None if not ctrl_p else {
            **_group(ctrl_p), "n_pairs": len(c_pairs), "n_deployments": len(ctrl_p),
            "seed_pairing": settings["control_pairing"],
            "deployment_pairs": [[x["deployment_id"], y["deployment_id"]] for (x, _), (y, _) in c_pairs],
            "items": sum(it["comparable"] for it in c_items)},
        "n_prompts": len(prompts_used),
        "checks": checks,
        "lengths": {"baseline": _summary(lengths(base_p)), "candidate": _summary(lengths(cand_p)),
                    "signed_shift_treatment": signed(t_pairs), "signed_shift_control": signed(c_pairs)},
        "prompts": [{"prompt_id": p, "treatment": t_prompt[p], "control": c_prompt[p]} for p in prompts_used],
        "definitions": DEFINITIONS,
    }
    schemas.validate(record, "sampling-gate", "<sampling gate record>")
    return record
