"""Greedy correctness gate, judged offline: captures loaded, pairwise comparisons, calibration controls and
verdicts.

Independently launched vLLM deployments do not reproduce each other's greedy tokens, so a
baseline-vs-speculative comparison is judged against a *control*: the divergence between two
independently launched deployments of one configuration (cross-deployment control). The gate passes
when the treatment's worst case stays within the control's worst case plus declared margins and every
prompt succeeded on both arms. A pass is "consistent with losslessness; not a proof".

Character-level metrics describe what the client observes; token-level metrics (optional, needs a
tokenizer directory) re-tokenize the output texts.

Functions: :func:`load_capture`, :func:`from_upstream_capture`, :func:`compare_captures`, :func:`judge`. The
captures are taken against a live server by :mod:`specstudy.measure.greedy_capture`; the CLI
(``specstudy gate {capture,compare,judge}``) is :mod:`specstudy.analysis.gate_cli`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from specstudy.core import schemas
from specstudy.core.arms import arm_from_upstream_model
from specstudy.core.capture_file import capture_data, is_deployment_record, output_fields, read_capture_json
from specstudy.core.stat_util import median
from specstudy.measure.greedy_capture import CAPTURE_SCHEMA, GateInputError

COMPARISON_SCHEMA = "specstudy.comparison/1"
GATE_SCHEMA = "specstudy.gate/1"
CLAIM = (
    "greedy divergence between baseline and speculative deployments stays within the divergence measured "
    "between independently launched deployments of one configuration (plus declared margins): "
    "consistent with losslessness; not a proof"
)
CLAIM_FAIL = (
    "greedy divergence between baseline and speculative deployments exceeds the calibration control plus "
    "margins, or a prompt failed; this blocks recommendation until explained (a pass would only be "
    "consistent with losslessness; not a proof)"
)
CLAIM_NONE = (
    "no verdict: the comparison could not be calibrated against a cross-deployment control (a pass would only "
    "be consistent with losslessness; not a proof)"
)
MARGIN_KEYS = ("min_common_prefix_fraction", "max_normalized_edit_distance", "max_completion_token_difference")
EPS = 1e-9

DEFINITIONS = {
    "exact_match": "output texts are identical strings (recorded, never gated)",
    "common_prefix_chars": "length in Unicode code points of the longest common prefix of the two output texts",
    "common_prefix_fraction": "common_prefix_chars / length of the shorter output; 1.0 when both outputs are "
    "empty, 0.0 when exactly one is empty",
    "normalized_edit_distance": "character Levenshtein distance (rapidfuzz) / length of the longer output; 0.0 when "
    "both are empty, 1.0 when exactly one is empty",
    "completion_token_difference": "|completion_tokens_a - completion_tokens_b| from the servers' usage records; "
    "null when either side reported no usage",
    "token_level": "optional: both texts re-tokenized with the given tokenizer (add_special_tokens=False); "
    "common-prefix tokens (fraction of the shorter, same empty rules) and token Levenshtein distance / longer",
    "comparable": "the prompt is present in both captures and succeeded on both sides; only comparable prompts "
    "enter distributions and worst cases",
}


# --------------------------------------------------------------------------- loading

def from_upstream_capture(data: dict, path: str | os.PathLike = "<upstream>", *, workload_file: str | None = None) -> dict:
    """Convert an upstream (apertus-bench, ``schema_version`` 1) capture into a ``specstudy.capture/1`` record.

    deployment_id = last component of the served model name (it carries the launch timestamp); arm is
    parsed from the model name (``draft-n3-tp4`` -> ``draft-k3-tp4``, ``ngram-n3`` -> ``ngram-k3``).
    """
    if "cases" not in data:
        raise GateInputError(f"{path}: field 'cases' missing; not an upstream capture")
    model = str(data.get("model") or "")
    max_tokens = {}
    digest = None
    if workload_file:
        raw = Path(workload_file).read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        for line in raw.decode("utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                max_tokens[row.get("id") or row.get("prompt_id")] = row.get("max_tokens")
    prompts = []
    for i, case in enumerate(data["cases"]):
        m = case.get("measurement") or {}
        pid = case.get("prompt_id") or m.get("prompt_id")
        if pid is None:
            raise GateInputError(f"{path}: field 'cases.{i}.prompt_id' missing")
        text = m.get("output")
        success = bool(m.get("success"))
        prompts.append({
            "prompt_id": str(pid),
            "output_text": text if text is not None or not success else "",
            "completion_tokens": m.get("completion_tokens"),
            "prompt_tokens": m.get("prompt_tokens"),
            "finish_reason": m.get("finish_reason"),
            "success": success,
            "error": m.get("error") if not success else None,
            "max_tokens": max_tokens.get(pid),
            **output_fields(text, m.get("output_sha256")),
        })
    sampling = data.get("sampling") or {}
    mt = [v for v in max_tokens.values() if v is not None]
    return {
        "schema": CAPTURE_SCHEMA,
        "deployment_id": model.split("/")[-1] or Path(path).stem,
        "arm": arm_from_upstream_model(model),
        "capture_index": 1,
        "model": model or None,
        "corpus": {"name": "upstream-smoke", "version": "1", "digest": digest},
        "sampling": {"temperature": float(sampling.get("temperature", 0.0)), "seed": sampling.get("seed"),
                     "max_tokens": max(mt) if mt else None, "top_p": sampling.get("top_p")},
        "source": {"format": f"apertus-bench capture schema_version {data.get('schema_version')}", "path": str(path),
                   "base_url": data.get("base_url")},
        "prompts": prompts,
    }


def load_capture(path_or_record: str | os.PathLike | dict, *, source: str | None = None) -> dict:
    """Load and validate a capture; upstream captures are converted (see :func:`from_upstream_capture`)."""
    data, src = capture_data(path_or_record, GateInputError, "greedy capture", source or "<capture>")
    if data.get("schema") != CAPTURE_SCHEMA and "cases" in data and "schema_version" in data:
        data = from_upstream_capture(data, src)
    elif data.get("schema") != CAPTURE_SCHEMA:
        raise GateInputError(f"{src}: field 'schema' is {data.get('schema')!r}; expected {CAPTURE_SCHEMA!r} "
                             "(a smoke/capture-<i>.json file) or an upstream capture with 'cases'")
    try:
        schemas.validate(data, "greedy-capture", src)
    except schemas.ValidationError as exc:
        raise GateInputError(str(exc)) from None
    ids = [p["prompt_id"] for p in data["prompts"]]
    if len(set(ids)) != len(ids):
        raise GateInputError(f"{src}: field 'prompts' repeats a prompt_id; each prompt must appear once")
    return data


# --------------------------------------------------------------------------- metrics


def common_prefix_len(a, b) -> int:
    """Length of the longest common prefix of two sequences (str or list)."""
    n = min(len(a), len(b))
    i = 0
    # compare in blocks first (fast for long identical prefixes)
    step = 256
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def sequence_metrics(a, b) -> tuple[int, float, int, float]:
    """(common prefix, prefix fraction of the shorter, Levenshtein distance, distance / longer) with the
    empty-output rules: both empty -> (0, 1.0, 0, 0.0); exactly one empty -> (0, 0.0, len(longer), 1.0)."""
    from rapidfuzz.distance import Levenshtein

    la, lb = len(a), len(b)
    shorter, longer = min(la, lb), max(la, lb)
    if longer == 0:
        return 0, 1.0, 0, 0.0
    if shorter == 0:
        return 0, 0.0, longer, 1.0
    p = common_prefix_len(a, b)
    dist = 0 if a == b else int(Levenshtein.distance(a, b))
    return p, p / shorter, dist, dist / longer


def _load_tokenizer(tokenizer):
    if tokenizer is None or not isinstance(tokenizer, str | os.PathLike):
        return tokenizer, (None if tokenizer is None else getattr(tokenizer, "name_or_path", "<tokenizer>"))
    path = Path(tokenizer)
    if not path.is_dir():
        raise GateInputError(f"--tokenizer {tokenizer}: not a directory; pass a local tokenizer directory "
                             "(with tokenizer.json / tokenizer_config.json)")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - report any loader failure as bad input
        raise GateInputError(f"--tokenizer {tokenizer}: cannot load a tokenizer from it ({exc})") from None
    return tok, str(path)


def _stat(values: list[float]) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"count": 0, "min": None, "median": None, "mean": None, "max": None}
    return {"count": len(vals), "min": min(vals), "median": median(vals),
            "mean": math.fsum(vals) / len(vals), "max": max(vals)}


def _side(capture: dict, path: str | None) -> dict:
    return {"path": path, "deployment_id": capture["deployment_id"], "arm": capture["arm"],
            "capture_index": capture["capture_index"], "corpus": capture.get("corpus")}


def compare_captures(a: dict, b: dict, *, tokenizer=None, a_path: str | None = None, b_path: str | None = None) -> dict:
    """Per-prompt and aggregate comparison of two captures (schema ``comparison``).

    ``tokenizer`` is None, a local tokenizer directory, or an already-loaded tokenizer object.
    """
    tok, tok_name = _load_tokenizer(tokenizer)
    pa = {p["prompt_id"]: p for p in a["prompts"]}
    pb = {p["prompt_id"]: p for p in b["prompts"]}
    order = [p["prompt_id"] for p in a["prompts"]] + [p["prompt_id"] for p in b["prompts"] if p["prompt_id"] not in pa]
    counts = {"prompts": len(order), "comparable": 0, "exact_matches": 0, "failed_a": 0, "failed_b": 0,
              "missing_a": 0, "missing_b": 0, "missing_usage": 0}
    rows = []
    for pid in order:
        ra, rb = pa.get(pid), pb.get(pid)
        row = {"prompt_id": pid, "comparable": False, "reason": None, "exact_match": None, "chars_a": None,
               "chars_b": None, "common_prefix_chars": None, "common_prefix_fraction": None, "edit_distance": None,
               "normalized_edit_distance": None, "completion_tokens_a": None, "completion_tokens_b": None,
               "completion_token_difference": None, "token_level": None}
        reasons = []
        for side, r in (("a", ra), ("b", rb)):
            if r is None:
                counts[f"missing_{side}"] += 1
                reasons.append(f"missing in {side}")
                continue
            if not r["success"]:
                counts[f"failed_{side}"] += 1
                reasons.append(f"failed in {side}: {r.get('error')}")
            row[f"completion_tokens_{side}"] = r.get("completion_tokens")
        if reasons:
            row["reason"] = "; ".join(reasons)
            rows.append(row)
            continue
        ta, tb = ra.get("output_text") or "", rb.get("output_text") or ""
        p, frac, dist, ned = sequence_metrics(ta, tb)
        counts["comparable"] += 1
        exact = ta == tb
        counts["exact_matches"] += int(exact)
        ca, cb = ra.get("completion_tokens"), rb.get("completion_tokens")
        if ca is None or cb is None:
            counts["missing_usage"] += 1
        row.update({"comparable": True, "exact_match": exact, "chars_a": len(ta), "chars_b": len(tb),
                    "common_prefix_chars": p, "common_prefix_fraction": frac, "edit_distance": dist,
                    "normalized_edit_distance": ned,
                    "completion_token_difference": None if ca is None or cb is None else abs(int(ca) - int(cb))})
        if tok is not None:
            ia = list(tok.encode(ta, add_special_tokens=False))
            ib = list(tok.encode(tb, add_special_tokens=False))
            tp, tfrac, tdist, tned = sequence_metrics(ia, ib)
            row["token_level"] = {"tokens_a": len(ia), "tokens_b": len(ib), "common_prefix_tokens": tp,
                                  "common_prefix_token_fraction": tfrac, "token_edit_distance": tdist,
                                  "normalized_token_edit_distance": tned}
        rows.append(row)
    comp = [r for r in rows if r["comparable"]]
    dist_block = {
        "common_prefix_chars": _stat([r["common_prefix_chars"] for r in comp]),
        "common_prefix_fraction": _stat([r["common_prefix_fraction"] for r in comp]),
        "normalized_edit_distance": _stat([r["normalized_edit_distance"] for r in comp]),
        "completion_token_difference": _stat([r["completion_token_difference"] for r in comp]),
    }
    worst = _worst_from_rows(comp)
    if tok is not None:
        tl = [r["token_level"] for r in comp]
        dist_block["common_prefix_tokens"] = _stat([t["common_prefix_tokens"] for t in tl])
        dist_block["common_prefix_token_fraction"] = _stat([t["common_prefix_token_fraction"] for t in tl])
        dist_block["normalized_token_edit_distance"] = _stat([t["normalized_token_edit_distance"] for t in tl])
        worst["min_common_prefix_tokens"] = dist_block["common_prefix_tokens"]["min"]
        worst["min_common_prefix_token_fraction"] = dist_block["common_prefix_token_fraction"]["min"]
        worst["max_normalized_token_edit_distance"] = dist_block["normalized_token_edit_distance"]["max"]
    same_dep = a["deployment_id"] == b["deployment_id"]
    same_arm = a["arm"] == b["arm"]
    record = {
        "schema": COMPARISON_SCHEMA,
        "kind": "within_deployment" if same_dep else ("cross_deployment" if same_arm else "cross_arm"),
        "a": _side(a, a_path),
        "b": _side(b, b_path),
        "same_deployment": same_dep,
        "same_arm": same_arm,
        "corpus_match": _corpus_key(a) == _corpus_key(b),
        "tokenizer": tok_name,
        "counts": counts,
        "prompts": rows,
        "distribution": dist_block,
        "worst_case": worst,
        "definitions": DEFINITIONS,
    }
    return record


def _worst_from_rows(comp: list[dict]) -> dict:
    def mn(key):
        vals = [r[key] for r in comp if r[key] is not None]
        return min(vals) if vals else None

    def mx(key):
        vals = [r[key] for r in comp if r[key] is not None]
        return max(vals) if vals else None

    return {"exact_matches": sum(1 for r in comp if r["exact_match"]), "comparable": len(comp),
            "min_common_prefix_chars": mn("common_prefix_chars"),
            "min_common_prefix_fraction": mn("common_prefix_fraction"),
            "max_normalized_edit_distance": mx("normalized_edit_distance"),
            "max_completion_token_difference": mx("completion_token_difference")}


def pooled_worst_case(comparisons: list[dict]) -> dict | None:
    """Worst case over several comparisons (min of minima, max of maxima, summed counts)."""
    if not comparisons:
        return None
    out: dict[str, Any] = {"exact_matches": sum(c["worst_case"]["exact_matches"] for c in comparisons),
                           "comparable": sum(c["worst_case"]["comparable"] for c in comparisons)}
    keys = set().union(*(c["worst_case"].keys() for c in comparisons)) - {"exact_matches", "comparable"}
    for key in sorted(keys):
        vals = [c["worst_case"].get(key) for c in comparisons]
        vals = [v for v in vals if v is not None]
        out[key] = (min(vals) if key.startswith("min_") else max(vals)) if vals else None
    return out


def _corpus_key(capture: dict):
    c = capture.get("corpus") or {}
    return c.get("digest") or (c.get("name"), str(c.get("version")))


# --------------------------------------------------------------------------- gate inputs


def _resolve_capture_path(p: str, dep_path: Path) -> Path:
    cand = Path(p)
    if cand.is_absolute() or cand.exists():
        return cand
    rel = dep_path.parent / p
    if rel.exists():
        return rel
    rel2 = dep_path.parent / "attempts" / p
    return rel2 if rel2.exists() else cand


def _expand(items, role: str) -> tuple[list[tuple[dict, str]], list[dict]]:
    """Expand capture / deployment.json inputs into ([(capture, label)], [failed deployment])."""
    captures, failed = [], []
    for item in items or []:
        if isinstance(item, dict):
            data, label, path = item, f"<{role}:{item.get('deployment_id', '?')}>", None
        else:
            path = Path(item)
            data, label = read_capture_json(path, GateInputError), str(path)
        if not isinstance(data, dict):
            raise GateInputError(f"{label}: top level must be a JSON object (capture or deployment.json)")
        if data.get("schema") == CAPTURE_SCHEMA or "cases" in data:
            captures.append((load_capture(data, source=label), label))
            continue
        if is_deployment_record(data):
            status = data.get("status")
            if status != "ok":
                failure = data.get("failure") or {}
                reason = failure.get("reason") or failure.get("stage") or f"status {status!r}"
                failed.append({"deployment_id": data.get("deployment_id"), "path": label, "reason": str(reason),
                               "stage": failure.get("stage")})
                continue
            caps = ((data.get("smoke") or {}).get("captures")) or []
            if not caps:
                raise GateInputError(f"{label}: field 'smoke.captures' is empty for an ok deployment; pass the "
                                     "capture files directly or re-run the deployment job")
            rep = data.get("rep_label") or (f"rep{data['rep']}" if data.get("rep") is not None else None)
            for cp in caps:
                cpath = _resolve_capture_path(str(cp), path if path else Path("."))
                capture = load_capture(cpath)
                if rep:
                    _REP_LABELS[capture["deployment_id"]] = str(rep)
                captures.append((capture, str(cpath)))
            continue
        raise GateInputError(f"{label}: neither a greedy capture (field 'schema' = {CAPTURE_SCHEMA!r}) nor a "
                             "deployment record (fields 'deployment_id', 'status'); pass smoke/capture-<i>.json or "
                             "deployment.json")
    return captures, failed


# deployment_id -> rep label (rep<n>/drift<n>) of the deployment records expanded by _expand
_REP_LABELS: dict[str, str] = {}


def _treatment_pairs(base_primary: list, cand_primary: list) -> tuple[list[tuple], str]:
    """Each candidate deployment against one baseline deployment: the baseline of the same repeat
    (``by_rep``, from the deployment records), else the baselines in input order, cycled
    (``by_position``). One pair per candidate deployment, never every baseline x every candidate: the
    treatment's worst case is then over as many pairs as the control's (all baseline pairs) when
    there are three repeats, and close to it otherwise (both sizes are recorded)."""
    if not base_primary or not cand_primary:
        return [], "none"
    base_rep = {_REP_LABELS.get(b[0]["deployment_id"]): b for b in base_primary}
    cand_reps = [_REP_LABELS.get(c[0]["deployment_id"]) for c in cand_primary]
    if None not in base_rep and all(r is not None and r in base_rep for r in cand_reps):
        return [(base_rep[r], c) for r, c in zip(cand_reps, cand_primary, strict=True)], "by_rep"
    return [(base_primary[i % len(base_primary)], c) for i, c in enumerate(cand_primary)], "by_position"


def _by_deployment(captures: list[tuple[dict, str]]) -> dict[str, list[tuple[dict, str]]]:
    groups: dict[str, list[tuple[dict, str]]] = {}
    for cap, label in captures:
        groups.setdefault(cap["deployment_id"], []).append((cap, label))
    for v in groups.values():
        v.sort(key=lambda t: t[0]["capture_index"])
    return groups


def _group(captures, failed) -> dict:
    arms = sorted({c["arm"] for c, _ in captures})
    return {"arm": arms[0] if len(arms) == 1 else (",".join(arms) if arms else None),
            "deployment_ids": sorted({c["deployment_id"] for c, _ in captures}),
            "captures": [label for _, label in captures], "failed_deployments": failed}


def _pair_summary(comp: dict) -> dict:
    keep = ("path", "deployment_id", "arm", "capture_index")
    return {"a": {k: comp["a"][k] for k in keep}, "b": {k: comp["b"][k] for k in keep},
            "counts": comp["counts"], "worst_case": comp["worst_case"]}


def validate_margins(margins: Any, source: str = "margins") -> dict:
    if not isinstance(margins, dict):
        raise GateInputError(f"{source}: must be a JSON object with {', '.join(MARGIN_KEYS)}")
    out = {}
    for key in MARGIN_KEYS:
        if key not in margins:
            raise GateInputError(f"{source}: field '{key}' missing; declare it in the study config's gate margins "
                                 f"(e.g. {{\"{key}\": {0.05 if 'fraction' in key or 'distance' in key else 2}}})")
        v = margins[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or (key != MARGIN_KEYS[2] and v > 1):
            raise GateInputError(f"{source}: field '{key}' = {v!r}; must be a number >= 0"
                                 + (" and <= 1" if key != MARGIN_KEYS[2] else ""))
        out[key] = float(v) if key != MARGIN_KEYS[2] else v
    extra = set(margins) - set(MARGIN_KEYS)
    if extra:
        raise GateInputError(f"{source}: unknown field(s) {sorted(extra)}; allowed: {', '.join(MARGIN_KEYS)}")
    return out


# --------------------------------------------------------------------------- judge


def judge(
    baseline,
    candidate,
    control_a=None,
    control_b=None,
    margins: dict | None = None,
    *,
    arm: str | None = None,
    phase: str | None = None,
    tokenizer=None,
    control=None,
) -> dict:
    """Judge a speculative arm against the baseline, calibrated by a cross-deployment control.

    ``baseline`` / ``candidate``: captures (paths or dicts) or deployment.json records of the baseline
    and speculative deployments. ``control_a`` / ``control_b``: captures (or deployment.json) of two
    independently launched deployments of one configuration; ``control``: the deployments of one
    configuration (all baseline repeats) whose every pair is a control pair. Each deployment
    contributes its first capture (lowest capture_index) to cross-deployment pairs; further captures
    of a deployment form within-deployment controls (recorded, not gated). Treatment = each candidate
    deployment against the baseline deployment of the same repeat; it passes when its pooled worst
    case stays within the control's worst case plus ``margins`` and every prompt succeeded in every
    baseline and candidate capture. Both sizes (treatment pairs, control pairs) are recorded.
    Returns the gate record (schema ``gate``); verdicts are ``pass`` | ``fail`` | ``no_verdict``.
    """
    margins = validate_margins(margins if margins is not None else {}, "margins")
    tok, tok_name = _load_tokenizer(tokenizer)
    _REP_LABELS.clear()
    base_caps, base_failed = _expand(baseline, "baseline")
    cand_caps, cand_failed = _expand(candidate, "candidate")
    ca_caps, ca_failed = _expand(control_a, "control-a")
    cb_caps, cb_failed = _expand(control_b, "control-b")
    all_pairs_control = bool(control)
    if all_pairs_control:  # every pair of distinct deployments among ``control``
        cc_caps, cc_failed = _expand(control, "control")
        ca_caps, cb_caps, ca_failed, cb_failed = cc_caps, cc_caps, cc_failed, []
    reasons: list[dict] = []

    def reason(code, detail):
        reasons.append({"code": code, "detail": detail})

    seen_failed = set()
    for group_name, failed in (("baseline", base_failed), ("candidate", cand_failed),
                               ("control", ca_failed + cb_failed)):
        for f in failed:
            if (f["deployment_id"], f["path"]) in seen_failed:  # the control often is the baseline's repeats
                continue
            seen_failed.add((f["deployment_id"], f["path"]))
            reason("deployment_failed", f"{group_name} deployment {f['deployment_id']} failed ({f['reason']}); "
                   f"record {f['path']}")
    if not base_caps:
        reason("no_captures", "no baseline capture available")
    if not cand_caps:
        reason("no_captures", "no candidate capture available")

    # within-deployment controls (every deployment with >= 2 captures)
    within = []
    for caps in (base_caps, cand_caps, ca_caps, cb_caps):
        for dep, lst in _by_deployment(caps).items():
            if len(lst) < 2 or any(w["deployment_ids"] == [dep] for w in within):
                continue
            comps = [compare_captures(lst[0][0], c, tokenizer=tok, a_path=lst[0][1], b_path=lbl)
                     for c, lbl in lst[1:]]
            within.append({"kind": "within_deployment", "arm": lst[0][0]["arm"], "deployment_ids": [dep],
                           "captures": [lbl for _, lbl in lst], "pairs": [_pair_summary(c) for c in comps],
                           "worst_case": pooled_worst_case(comps)})

    # treatment pairs: primary capture of every baseline deployment x every candidate deployment
    base_primary = [lst[0] for lst in _by_deployment(base_caps).values()]
    cand_primary = [lst[0] for lst in _by_deployment(cand_caps).values()]
    t_pairs, pairing = _treatment_pairs(base_primary, cand_primary)
    t_comps = [compare_captures(b, c, tokenizer=tok, a_path=bl, b_path=cl) for (b, bl), (c, cl) in t_pairs]
    all_ok = all(p["success"] for cap, _ in base_caps + cand_caps for p in cap["prompts"])
    treatment = None
    if t_comps:
        treatment = {"pairs": [_pair_summary(c) for c in t_comps], "worst_case": pooled_worst_case(t_comps),
                     "all_prompts_succeeded": all_ok, "n_pairs": len(t_comps), "pairing": pairing}

    # cross-deployment control
    control = None
    c_comps: list[dict] = []
    if not ca_caps and not cb_caps:
        if not (ca_failed or cb_failed):
            reason("no_control", "no cross-deployment control supplied (captures of two independently launched "
                   "deployments of one configuration, e.g. baseline rep1 vs rep2); a within-deployment control "
                   "cannot calibrate a comparison between deployments")
    elif not ca_caps or not cb_caps:
        if not (ca_failed or cb_failed):
            reason("no_control", "only one side of the cross-deployment control was supplied; pass both "
                   "--control-a and --control-b")
    else:
        a_primary = [lst[0] for lst in _by_deployment(ca_caps).values()]
        b_primary = [lst[0] for lst in _by_deployment(cb_caps).values()]
        arms = sorted({c["arm"] for c, _ in a_primary + b_primary})
        seen_pairs: set[frozenset] = set()
        c_comps = []
        for x, xl in a_primary:
            for y, yl in b_primary:
                key = frozenset((x["deployment_id"], y["deployment_id"]))
                if x["deployment_id"] == y["deployment_id"] or key in seen_pairs:
                    continue
                seen_pairs.add(key)
                c_comps.append(compare_captures(x, y, tokenizer=tok, a_path=xl, b_path=yl))
        dep_ids = sorted({c["deployment_id"] for c, _ in a_primary + b_primary})
        control = {"kind": "cross_deployment", "arm": arms[0] if len(arms) == 1 else ",".join(arms),
                   "deployment_ids": dep_ids,
                   "captures": list(dict.fromkeys(lbl for _, lbl in a_primary + b_primary)),
                   "pairs": [_pair_summary(c) for c in c_comps], "worst_case": pooled_worst_case(c_comps),
                   "n_pairs": len(c_comps), "n_deployments": len(dep_ids),
                   "pairing": "all_pairs" if all_pairs_control else "a_by_b"}
        if not c_comps:
            reason("control_not_cross_deployment", "the control has a single deployment "
                   f"({', '.join(control['deployment_ids'])}); comparing it with itself is a within-deployment "
                   "control and cannot calibrate a comparison between independently launched deployments")
        if len(arms) > 1:
            reason("control_mixed_arms", f"control deployments belong to different arms ({', '.join(arms)}); a "
                   "control must be two deployments of one configuration")
        for c in c_comps:
            n = c["counts"]
            if n["comparable"] < n["prompts"]:
                reason("control_incomplete", f"control pair {c['a']['deployment_id']} vs {c['b']['deployment_id']}: "
                       f"{n['comparable']} of {n['prompts']} prompts comparable (failed/missing prompts); its "
                       "worst case would understate the nondeterminism")
            if n["missing_usage"]:
                reason("control_incomplete", f"control pair {c['a']['deployment_id']} vs "
                       f"{c['b']['deployment_id']}: {n['missing_usage']} prompt(s) without usage records")

    all_caps = base_caps + cand_caps + ca_caps + cb_caps
    corpora = {_corpus_key(c) for c, _ in all_caps}
    if len(corpora) > 1:
        reason("corpus_mismatch", f"captures come from different corpora {sorted(map(str, corpora))}; re-capture "
               "all deployments with the same smoke prompts")
    elif all_caps:
        ids = {frozenset(p["prompt_id"] for p in c["prompts"]) for c, _ in all_caps}
        if len(ids) > 1:
            reason("missing_prompts", "captures do not all contain the same prompt ids")

    if treatment is not None:
        missing = sum(p["counts"]["missing_usage"] for p in treatment["pairs"])
        if missing:
            reason("missing_usage", f"{missing} compared prompt(s) lack a usage record (completion_tokens) on the "
                   "baseline or candidate side; the completion-token check cannot be evaluated")

    checks: list[dict] = []
    allowances = None
    no_verdict = bool(reasons)
    verdict = "no_verdict"
    if not no_verdict and treatment is not None and control is not None:
        cw, tw = control["worst_case"], treatment["worst_case"]
        if not all_ok:
            failed_prompts = sorted({f"{cap['arm']}/{cap['deployment_id']}#{cap['capture_index']}:{p['prompt_id']}"
                                     for cap, _ in base_caps + cand_caps for p in cap["prompts"] if not p["success"]})
            reason("prompt_failed", f"prompts failed: {', '.join(failed_prompts)}")
        checks.append({"name": "all_prompts_succeeded", "observed": all_ok, "control": None, "margin": None,
                       "allowance": True, "passed": all_ok})
        allowances = {
            "min_common_prefix_fraction": max(0.0, cw["min_common_prefix_fraction"] - margins["min_common_prefix_fraction"]),
            "max_normalized_edit_distance": cw["max_normalized_edit_distance"] + margins["max_normalized_edit_distance"],
            "max_completion_token_difference": cw["max_completion_token_difference"]
            + margins["max_completion_token_difference"],
        }
        for key in MARGIN_KEYS:
            obs = tw.get(key)
            if obs is None:
                passed = False
            elif key.startswith("min_"):
                passed = obs >= allowances[key] - EPS
            else:
                passed = obs <= allowances[key] + EPS
            checks.append({"name": key, "observed": obs, "control": cw[key], "margin": margins[key],
                           "allowance": allowances[key], "passed": passed})
            if not passed:
                reason("exceeds_control", f"{key}: treatment {obs} vs allowance {allowances[key]} (control "
                       f"{cw[key]} {'-' if key.startswith('min_') else '+'} margin {margins[key]})")
        verdict = "pass" if all(c["passed"] for c in checks) else "fail"
    claim = {"pass": CLAIM, "fail": CLAIM_FAIL, "no_verdict": CLAIM_NONE}[verdict]
    record = {
        "schema": GATE_SCHEMA,
        "arm": arm or _group(cand_caps, cand_failed)["arm"],
        "phase": phase,
        "verdict": verdict,
        "reasons": reasons,
        "blocks_recommendation": verdict == "fail",
        "claim": claim,
        "margins": margins,
        "baseline": _group(base_caps, base_failed),
        "candidate": _group(cand_caps, cand_failed),
        "treatment": treatment,
        "control": control,
        "within_deployment_controls": within,
        "allowances": allowances,
        "checks": checks,
        "tokenizer": tok_name,
    }
    schemas.validate(record, "gate", "<gate record>")
    return record
