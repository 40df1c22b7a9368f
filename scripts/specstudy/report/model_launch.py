"""The model-launch deliverable: a patch of swiss-ai/model-launch's speculative-decoding example that sets the
recommended arm, and the pull request's text with the evidence a reviewer of that repository wants.

The example is pinned once, in a manifest (repository, commit, path, the local verbatim copy, its sha256 and
size) that the study config names (``recommendation.model_launch``; the shipped one:
``tests/data/model-launch/manifest.json``), read by :func:`specstudy.inputs.model_launch.load_manifest`, which
refuses a copy whose bytes differ from the manifest. :func:`patch_example` rewrites the example's ``--speculative-config.<key> <value>`` lines (the form
``sml advanced --framework-args`` passes to vLLM) to the enabled arm's own settings, taken from its arm spec
(method, ``num_speculative_tokens``, the draft's tensor parallelism, n-gram's prompt-lookup window, suffix
settings, a variant's ``speculative_config`` keys), and :func:`unified_diff` makes the ``git apply`` patch.
:func:`write` always writes both files (they are outputs of the report rule): with nothing to propose, the patch
is empty and the Markdown says why.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

from specstudy.core import atomic, methods
from specstudy.core.errors import UserError
from specstudy.inputs.model_launch import LINE_RE as _LINE_RE
from specstudy.inputs.model_launch import example_flags, load_manifest, manifest_path

PATCH_FILE = "model-launch.patch"
PR_FILE = "model-launch-pr.md"

#: Arm-spec fields that are no speculative setting (bookkeeping, a variant's launch changes).
_ORDER = ("method", "model", "num_speculative_tokens", "draft_tensor_parallel_size", "prompt_lookup_min",
          "prompt_lookup_max")
_NOT_SPECULATIVE = {"name", "method", "servable", "skip_reason", "variant", "speculative_config", "extra_args", "env",
                    "model"}

def _header(method: str) -> list[str]:
    """The example's header comment for a method with no model of its own (the example's describes a draft
    model): what the method proposes, from the registry (core.methods)."""
    return [f"# Speculative decoding: Apertus-v1.5-70B with {method} ({methods.get(method).what}; no draft model).",
            "# Lossless: the 70B verifies every proposed token. The speculative flags below are set by measurement."]


# ------------------------------------------------------------------------------------------- the arm's flags
def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return "'" + json.dumps(v, separators=(",", ":")) + "'"
    return str(v)


def arm_flags(arm: dict, current: dict[str, str], *, draft_model: str | None = None,
              study_draft: str | None = None) -> tuple[list[tuple[str, str]] | None, str | None]:
    """The ``--speculative-config`` keys and values of ``arm`` (its spec: method, the drafter where it has one, every
    speculative field of the spec, a variant's ``speculative_config``; the example's keys in the example's order,
    then the others), or ``None`` and why no patch can say it. ``current``: the example's settings (its drafter is kept when the study measured the
    same model); ``draft_model``: the config's ``recommendation.draft_model`` (wins); ``study_draft``: the draft
    model directory the study measured."""
    method = arm.get("method")
    if not method or method == "baseline":
        return None, f"arm {arm.get('name')!r} runs no speculative decoding"
    if arm.get("extra_args") or arm.get("env"):
        return None, (f"arm {arm.get('name')!r} is a variant with its own launch flags or environment "
                      f"({arm.get('extra_args') or ''} {arm.get('env') or ''}); apply them by hand")
    flags: list[tuple[str, str]] = [("method", str(method))]
    if method == "draft_model":
        model = draft_model
        if not model:
            mine = current.get("model")
            if mine and study_draft and Path(str(study_draft)).parts[-len(Path(mine).parts):] == Path(mine).parts:
                model = mine
            else:
                return None, (f"the study measured the drafter {study_draft!r} and the example uses {mine!r}; set "
                              f"recommendation.draft_model to the drafter the example should name")
        flags.append(("model", str(model)))
    elif methods.find(method) is None:
        return None, f"method {method!r}: the example has no form for it"
    elif methods.get(method).model is not None:  # a head or drafter of its own: the flags would have to name it
        return None, (f"method {method}: the published name of {methods.get(method).model.what} is not known to the "
                      "study; no patch")
    spec = [(k, v) for k, v in arm.items() if k not in _NOT_SPECULATIVE and v is not None]
    flags += [(k, _value(v)) for k, v in spec]
    flags += [(k, _value(v)) for k, v in (arm.get("speculative_config") or {}).items() if k not in dict(flags)]
    # the example's keys in the example's order, then new ones (a recorded arm spec's key order is not its own)
    known, new = list(current), [*_ORDER]
    return sorted(flags, key=lambda kv: (0, known.index(kv[0])) if kv[0] in known
                  else (1, new.index(kv[0]) if kv[0] in new else len(new), kv[0])), None


def patch_example(text: str, flags: list[tuple[str, str]]) -> str:
    """``text`` with its block of ``--speculative-config.*`` lines replaced by ``flags`` (same indentation; each line
    ends as the block's lines did, the last as the block's last), and for a method other than the example's own
    the header comment replaced by that method's (:func:`_header`)."""
    lines = text.split("\n")
    idx = [i for i, line in enumerate(lines) if _LINE_RE.match(line)]
    if not idx or idx != list(range(idx[0], idx[-1] + 1)):
        raise UserError("the model-launch example has no single block of '--speculative-config.<key> <value>' lines; "
                        "re-pin an example of that form (docs/report.md)")
    first, last = _LINE_RE.match(lines[idx[0]]), _LINE_RE.match(lines[idx[-1]])
    inner_tail = first["tail"] if len(idx) > 1 else " \\"
    new = [f"{first['indent']}--speculative-config.{k} {v}{inner_tail}" for k, v in flags]
    new[-1] = new[-1][: len(new[-1]) - len(inner_tail)] + last["tail"]
    out = lines[: idx[0]] + new + lines[idx[-1] + 1:]
    method = dict(flags)["method"]
    if method != example_flags(text).get("method") and methods.find(method) and methods.get(method).model is None:
        start = 1 if out and out[0].startswith("#!") else 0
        end = start
        while end < len(out) and out[end].startswith("#"):
            end += 1
        out = out[:start] + _header(method) + out[end:]
    return "\n".join(out)


def unified_diff(old: str, new: str, path: str) -> str:
    """A ``git apply`` patch of ``path`` (``a/``/``b/`` prefixes); empty when nothing changes."""
    if old == new:
        return ""
    body = list(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                     f"a/{path}", f"b/{path}", n=3))
    fixed = []
    for line in body:
        if not line.endswith("\n"):  # a last line without a newline: git's marker after it
            line += "\n\\ No newline at end of file\n"
        fixed.append(line)
    return f"diff --git a/{path} b/{path}\n" + "".join(fixed)


# ------------------------------------------------------------------------------------------- the evidence
def _f(v: Any, spec: str = "{:.3f}") -> str:
    return "–" if v is None else spec.format(v)


def _interval(d: dict, lo: str, hi: str) -> str:
    return "–" if d.get(lo) is None or d.get(hi) is None else f"[{d[lo]:.3f}, {d[hi]:.3f}]"


def _deps_of(deps: list[dict], arm: str, phase: str) -> list[dict]:
    return [d for d in deps if d.get("arm") == arm and d.get("phase") == phase and d.get("status") != "failed"]


def engine_versions(deps: list[dict]) -> str:
    """The vLLM versions (and commits, where the provenance names one) the deployments ran, distinct, sorted."""
    seen = set()
    for d in deps:
        ver = d.get("provenance.software.vllm") or d.get("provenance.software.vllm_version_from_log")
        commit = next((d[k] for k in sorted(d) if k.startswith("provenance.software.") and "vllm" in k
                       and ("commit" in k or "revision" in k) and d[k]), None)
        if ver or commit:
            seen.add(" ".join(str(x) for x in (ver, f"(commit {commit})" if commit else None) if x))
    return ", ".join(sorted(seen)) or "not recorded"


def study_commits(deps: list[dict]) -> str:
    seen = {f"{str(d['provenance.project.revision'])[:12]}{' (dirty)' if d.get('provenance.project.dirty') else ''}"
            for d in deps if d.get("provenance.project.revision")}
    return ", ".join(sorted(seen)) or "not recorded"


def capacity_verdict(rec: dict) -> str:
    half = rec.get("capacity_half") or {}
    ev = half.get("evaluation")
    if ev:
        return "met" if ev.get("met") else "missed: " + ", ".join(ev.get("missed") or [])
    return half.get("note") or "not evaluated"


def evidence_rows(rec: dict, comps: list[dict], deps: list[dict], arm: str) -> list[list[str]]:
    """One row per workload × concurrency of ``arm`` in the decision's phase: speedup (geometric mean of the
    per-round ratios) with its t and bootstrap intervals, acceptance, the gate, the capacity verdict, the engine
    and the study commit of the deployments measured."""
    phase = rec.get("phase")
    cand = next((c for c in rec.get("candidates") or [] if c.get("arm") == arm), {})
    gate = cand.get("gate_verdict") or "–"
    cap = capacity_verdict(rec)
    rows = []
    for c in sorted((c for c in comps if c.get("arm") == arm and c.get("phase") == phase),
                    key=lambda c: (str(c["workload"]), int(c["concurrency"]))):
        sp, ab = c.get("speedup") or {}, c.get("absolute") or {}
        ids = {r.get("arm_deployment") for r in c.get("repeats") or []} | {r.get("base_deployment")
                                                                          for r in c.get("repeats") or []}
        these = [d for d in deps if d.get("deployment_id") in ids]
        rows.append([arm, str(c["workload"]), str(c["concurrency"]), _f(sp.get("geomean")),
                     _interval(sp, "ci_low", "ci_high"), _interval(sp, "boot_low", "boot_high"), str(sp.get("n") or 0),
                     _f(ab.get("acceptance_rate")), _f(ab.get("mean_acceptance_length"), "{:.2f}"), gate, cap,
                     engine_versions(these), study_commits(these)])
    return rows


EVIDENCE_HEADER = ["arm", "workload", "concurrency", "speedup (geomean)", "95 % interval (t)",
                   "95 % interval (bootstrap)", "rounds", "acceptance rate", "mean acceptance length",
                   "correctness gate", "capacity", "engine (vLLM)", "study commit"]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |" for r in rows]
    return out


def _describe(flags: list[tuple[str, str]]) -> str:
    f = dict(flags)
    if f["method"] == "draft_model":
        return (f"draft model {f.get('model')}, {f.get('num_speculative_tokens')} speculative tokens, draft TP "
                f"{f.get('draft_tensor_parallel_size')}")
    if "prompt_lookup_min" in f:
        return (f"{f['method']} prompt lookup, {f.get('num_speculative_tokens')} speculative tokens, window "
                f"{f.get('prompt_lookup_min')}–{f.get('prompt_lookup_max')}")
    return f"{f['method']}, {f.get('num_speculative_tokens')} speculative tokens"


def _measured_under(config: dict, text: str) -> list[str]:
    """The study's server settings beside the example's, where they differ (a reviewer's first question)."""
    eng = config.get("engine") or {}
    tgt, srv = eng.get("target") or {}, eng.get("server") or {}
    ex = dict(re.findall(r"(--(?:tensor-parallel-size|max-model-len|gpu-memory-utilization))[ =](\S+)", text))
    mine = {"--tensor-parallel-size": tgt.get("tensor_parallel_size"), "--max-model-len": tgt.get("max_model_len"),
            "--gpu-memory-utilization": srv.get("gpu_memory_utilization")}
    out = []
    for flag, value in mine.items():
        if value is not None and flag in ex and str(ex[flag]) != str(value):
            out.append(f"`{flag}`: the study measured {value}, the example sets {ex[flag]}")
    if srv.get("extra_args"):
        out.append("the study's servers also ran with " + " ".join(f"`{a}`" for a in srv["extra_args"]))
    return out


# ------------------------------------------------------------------------------------------- the two files
def proposal(rec: dict, deps: list[dict], config: dict) -> dict:
    """What to propose: ``{"arm", "flags", "manifest", "why"}``; ``flags`` None with ``why`` when nothing is."""
    ref = ((config.get("recommendation") or {}).get("model_launch"))
    out: dict[str, Any] = {"arm": rec.get("enable"), "flags": None, "manifest": None, "why": None}
    if rec.get("decision") != "enable" or not rec.get("enable"):
        why = {"do_not_enable": "the decision is do_not_enable: no setting met the pre-registered rule",
               "insufficient_evidence": "the decision is insufficient_evidence: the rule could not be applied",
               "enable_per_workload": "the decision routes traffic by workload (enable_per_workload); the example "
                                      "is one deployment for all traffic, so the per-workload vLLM argument patches "
                                      "(vllm-args-<workload>.patch) are the proposal"}
        out["why"] = why.get(rec.get("decision"), f"the decision is {rec.get('decision')!r}")
        if rec.get("capacity_blocker"):
            out["why"] += f" ({rec['capacity_blocker']})"
        return out
    if not ref:
        out["why"] = ("recommendation.model_launch is not set in the study config: no model-launch example is pinned "
                      "(config/clariden-70b.yaml names tests/data/model-launch/manifest.json)")
        return out
    from specstudy.study.config import REPO_ROOT

    man = out["manifest"] = load_manifest(manifest_path(ref, REPO_ROOT))
    dep = next(iter(_deps_of(deps, rec["enable"], rec.get("phase"))), None) or next(
        (d for d in deps if d.get("arm") == rec["enable"]), {})
    arm = json.loads(dep["arm_spec"]) if dep.get("arm_spec") else None
    if not arm:
        out["why"] = f"no deployment record of {rec['enable']} carries its arm spec"
        return out
    flags, why = arm_flags(arm, example_flags(man["text"]),
                           draft_model=(config.get("recommendation") or {}).get("draft_model"),
                           study_draft=((config.get("engine") or {}).get("draft") or {}).get("path"))
    out["flags"], out["why"] = flags, why
    return out


def write(out: str | Path, rec: dict, comps: list[dict], deps: list[dict], config: dict) -> dict:
    """Write ``model-launch.patch`` and ``model-launch-pr.md`` under ``out``; return what was proposed
    (``patch``: the file name when it holds a change, else None; ``why``: the reason when it does not)."""
    out = Path(out)
    p = proposal(rec, deps, config)
    man, flags, arm = p["manifest"], p["flags"], p["arm"]
    diff = ""
    if flags is not None:
        diff = unified_diff(man["text"], patch_example(man["text"], flags), man["path"])
        if not diff:
            p["why"] = f"the example already sets {arm}'s settings ({_describe(flags)}): nothing to change"
    md: list[str] = []
    if diff:
        md += [f"# {Path(man['path']).stem}: {_describe(flags)} (measured)", "",
               f"Sets the speculative-decoding flags of `{man['path']}` to the arm `{arm}`, which the study "
               f"`{(config.get('study') or {}).get('name', '?')}` enables under its pre-registered rule "
               f"(decision `{rec.get('decision')}`, {rec.get('phase')} phase).", "",
               f"Apply at {man['repository']}@{man['commit']}: `git apply {PATCH_FILE}`.", "",
               "| flag | example | proposed |", "|---|---|---|"]
        cur = example_flags(man["text"])
        for k in dict.fromkeys([*cur, *dict(flags)]):
            new = dict(flags).get(k)
            if cur.get(k) != new:
                md.append(f"| `--speculative-config.{k}` | {cur.get(k) or '–'} | {new or '(removed)'} |")
    else:
        md += ["# No model-launch change proposed", "", f"Why: {p['why']}.", "",
               f"`{PATCH_FILE}` is empty (an output of the report rule either way)."]
    if arm:
        md += ["", "## Evidence", "",
               "Speedup = arm ÷ baseline output tokens/s, paired by round (geometric mean of the rounds' ratios); "
               "acceptance: median over the rounds; gate: the correctness gate of the decision's phase; capacity: "
               "the pre-registered capacity criteria of the arm.", ""]
        rows = evidence_rows(rec, comps, deps, arm)
        md += _table(EVIDENCE_HEADER, rows) if rows else [f"No comparisons of {arm} in the {rec.get('phase')} phase."]
        cand = next((c for c in rec.get("candidates") or [] if c.get("arm") == arm), {})
        if cand.get("mixture"):
            md += ["", "Declared traffic mixture: " + "; ".join(
                f"{k}: {m.get('verdict')} {_interval(m, 'lo', 'hi')}" for k, m in cand["mixture"].items()) + "."]
        if man:
            under = _measured_under(config, man["text"])
            if under:
                md += ["", "Measured under the study's settings; where they differ from the example:", ""]
                md += [f"- {u}" for u in under]
    md += ["", "Full report: `report.md` beside this file; the decision and its intervals: `recommendation.json`."]
    atomic.write_text(out / PATCH_FILE, diff)
    atomic.write_text(out / PR_FILE, "\n".join(md) + "\n")
    return {"patch": PATCH_FILE if diff else None, "arm": arm if diff else None, "why": None if diff else p["why"],
            "example": ({k: man[k] for k in ("repository", "commit", "path", "sha256")} if man else None)}
