"""The mechanics point: a memory-bound random target, never pooled with the study (issue #14, item 7).

A tiny fixture target is not memory-bound on a GPU, so draft speculation loses everywhere and the
study's GPU runs test the pipeline only. The mechanics point serves a large random-initialised
target (``random_model``, ~7e9 parameters in bf16) in four kinds of arm, each one deployment on the
production path (:func:`specstudy.job.run.run_deployment`: launch, readiness, smoke captures,
cells through :func:`specstudy.measure.cell.run_cell`, stop, failure records):

- ``baseline``;
- ``self-draft-k<K>``: ``draft_model`` with the target itself as draft (acceptance 1: the cost of a
  draft as large as the target);
- ``small-draft-k<K>``: ``draft_model`` with a small random draft of the same vocabulary
  (acceptance ~0: pure overhead);
- ``ngram-k<K>``.

The two draft arms have the same study arm name (``draft-k<K>-tp<T>``; the study's naming is not
changed); the mechanics label is the directory (``results/mechanics/<label>/rep1/``) and the
``mechanics_label`` field of the arm, and the deployments carry phase ``mechanics``, which the
study's tables, gates and report never read.

The analysis (:func:`summarize`) reports per arm and concurrency the TPOT p50, output tokens/s,
the acceptance rate (accepted / draft tokens) and the mean acceptance length (1 + accepted /
drafts), both from the window's counter deltas, and the time per decoding step. Every row and
heading says ``mechanics (random weights; not a study result)``.
"""

from __future__ import annotations

import copy
import json
import time
import traceback
from pathlib import Path

from specstudy.core import atomic, layout
from specstudy.core.arms import arm_name

LABEL = "mechanics (random weights; not a study result)"
PHASE = "mechanics"
REP = "rep1"
ARM_KINDS = ("baseline", "self_draft", "small_draft", "ngram")
STEP_DEFINITION = ("time per decoding step = TPOT p50 x mean acceptance length (tokens per target step, "
                   "1 + accepted/drafts from the window's spec-decode counter deltas; 1 for the baseline). "
                   "TPOT p50 is the median over requests of (e2e - TTFT) / (completion tokens - 1); "
                   "acceptance rate and length are each computed from counters, never converted into each other.")


class MechanicsError(ValueError):
    """The mechanics config is unusable; the message names the file, the field and the fix."""


# ----------------------------------------------------------------------------- config

def load_mechanics(path: str | Path, study_cfg: dict | None = None) -> dict:
    """Load and check ``path`` (schema ``mechanics``); cross-check it against the study config if given."""
    import yaml

    from specstudy.core import schemas

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MechanicsError(f"{path}: file not found; copy config/gpu-h200-mechanics.yaml and adapt it") from None
    except yaml.YAMLError as exc:
        raise MechanicsError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise MechanicsError(f"{path}: must be a mapping with a top-level 'mechanics' section")
    try:
        schemas.validate(data, "mechanics", str(path))
    except schemas.ValidationError as exc:
        raise MechanicsError(str(exc)) from None
    return check_mechanics(data["mechanics"], str(path), study_cfg)


def check_mechanics(m: dict, source: str, study_cfg: dict | None = None) -> dict:
    problems = []
    methods = m["arms"]["methods"]
    if "baseline" not in methods:
        problems.append("field 'mechanics.arms.methods': must include baseline (every ratio is against it); add baseline")
    if len(set(methods)) != len(methods):
        problems.append(f"field 'mechanics.arms.methods': {methods} lists a method twice; list each once")
    ks = m["arms"].get("num_speculative_tokens") or []
    if len(set(ks)) != len(ks):
        problems.append(f"field 'mechanics.arms.num_speculative_tokens': {ks} lists a depth twice; list each once")
    ng = m["arms"].get("ngram") or {}
    if "ngram" in methods and ng.get("prompt_lookup_min", 1) > ng.get("prompt_lookup_max", 1):
        problems.append("field 'mechanics.arms.ngram.prompt_lookup_min': larger than prompt_lookup_max; make min <= max")
    conc = m["concurrency"]
    if len(set(conc)) != len(conc):
        problems.append(f"field 'mechanics.concurrency': {conc} lists a level twice; list each once")
    by = m["cells"].get("requests_by_concurrency") or {}
    for c in conc:
        n = int(by.get(str(c), m["cells"]["requests"]))
        if n < c:
            field = f"requests_by_concurrency.{c}" if str(c) in by else "requests"
            problems.append(f"field 'mechanics.cells.{field}': {n} requests at concurrency {c} never reach that "
                            f"concurrency — use at least {2 * c}")
    if study_cfg is not None:
        workloads = (study_cfg.get("corpora") or {}).get("workloads") or {}
        if m["workload"] not in workloads:
            problems.append(f"field 'mechanics.workload': {m['workload']!r} is not a workload of the study config "
                            f"(corpora.workloads: {', '.join(workloads)}); use one of those")
        mml = ((m.get("engine") or {}).get("target") or {}).get("max_model_len") \
            or study_cfg["engine"]["target"]["max_model_len"]
        if m["cells"]["max_tokens"] >= mml:
            problems.append(f"field 'mechanics.cells.max_tokens': {m['cells']['max_tokens']} leaves no room for the "
                            f"prompt in max_model_len {mml}; lower it or raise mechanics.engine.target.max_model_len")
        args = [str(a) for a in (_merge(study_cfg["engine"], m.get("engine") or {}).get("server") or {}).get("extra_args") or []]
        seqs = _flag_value(args, "--max-num-seqs")
        if seqs is not None and seqs < max(conc):
            problems.append(f"field 'mechanics.engine.server.extra_args': the study's --max-num-seqs {seqs} is below the "
                            f"largest mechanics concurrency {max(conc)}, so that level would queue instead of batching; "
                            "give mechanics.engine.server.extra_args with --max-num-seqs >= it (the list replaces the study's)")
    if problems:
        raise MechanicsError(f"{source}: invalid mechanics config:\n  - " + "\n  - ".join(problems))
    return m


def _flag_value(args: list[str], flag: str) -> int | None:
    for i, a in enumerate(args):
        try:
            if a == flag and i + 1 < len(args):
                return int(args[i + 1])
            if a.startswith(flag + "="):
                return int(a.split("=", 1)[1])
        except ValueError:
            return None
    return None


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def model_dir(role: str, results: str = layout.ROOT) -> str:
    """``results/models/mechanics/<role>`` for role target | draft."""
    return layout.models_dir(layout.MECHANICS, role, root=results)


def corpus_dir(m: dict, results: str = layout.ROOT) -> str:
    return layout.mechanics_dir("corpus", f"{m['workload']}-mt{int(m['cells']['max_tokens'])}", root=results)


def arms(m: dict, target_tp: int = 1) -> list[dict]:
    """The mechanics arms in order: ``{"label", "arm" (production arm spec + mechanics fields), "draft"}``."""
    out = []
    for method in m["arms"]["methods"]:
        if method == "baseline":
            out.append({"label": "baseline", "draft": None,
                        "arm": {"name": "baseline", "method": "baseline"}})
            continue
        for k in m["arms"]["num_speculative_tokens"]:
            if method in ("self_draft", "small_draft"):
                label = f"{method.replace('_', '-')}-k{k}"
                arm = {"method": "draft_model", "num_speculative_tokens": int(k), "draft_tensor_parallel_size": int(target_tp)}
                arm = {"name": arm_name(arm), **arm}
                draft = "target" if method == "self_draft" else "draft"
            else:
                ng = m["arms"].get("ngram") or {}
                label = f"ngram-k{k}"
                arm = {"name": arm_name({"method": "ngram", "num_speculative_tokens": k}), "method": "ngram",
                       "num_speculative_tokens": int(k),
                       "prompt_lookup_min": int(ng.get("prompt_lookup_min", 2)),
                       "prompt_lookup_max": int(ng.get("prompt_lookup_max", 4))}
                draft = None
            out.append({"label": label, "draft": draft, "arm": arm})
    for a in out:
        a["arm"].update(mechanics_label=a["label"], mechanics_draft=a["draft"])
    return out


def arm_labels(m: dict) -> list[str]:
    return [a["label"] for a in arms(m)]


def engine_for(study_cfg: dict, m: dict, draft: str | None, results: str = "results") -> dict:
    """The study's engine section with the mechanics overrides, the random target and the arm's draft."""
    eng = _merge(study_cfg["engine"], m.get("engine") or {})
    target_dir = model_dir("target", results)
    eng["target"] = dict(eng["target"], path=target_dir, tokenizer=target_dir,
                         served_model_name=(m.get("served_model_name") or "mechanics-random-target"))
    eng["draft"] = {"path": model_dir(draft, results)} if draft else None
    return eng


def arm_spec(study_cfg: dict, m: dict, label: str, smoke_corpus_dir: str, results: str = "results") -> dict:
    """The deployment spec of one mechanics arm, in the shape rules/common.smk builds for the study."""
    tp = int(study_cfg["engine"]["target"].get("tensor_parallel_size", 1))
    tp = int(((m.get("engine") or {}).get("target") or {}).get("tensor_parallel_size", tp))
    by_label = {a["label"]: a for a in arms(m, tp)}
    if label not in by_label:
        raise MechanicsError(f"mechanics arm {label!r} is not configured (arms: {', '.join(by_label)})")
    a = by_label[label]
    # Cell sizes are the mechanics config's alone: the study's per-concurrency counts are not inherited.
    settings = dict(study_cfg["cells"], requests=int(m["cells"]["requests"]),
                    warmup_requests=int(m["cells"]["warmup_requests"]),
                    requests_by_concurrency=dict(m["cells"].get("requests_by_concurrency") or {}),
                    warmup_requests_by_concurrency=dict(m["cells"].get("warmup_requests_by_concurrency") or {}),
                    reuse_valid=bool(m["cells"].get("reuse_valid", True)))
    return {
        "phase": PHASE, "rep": REP, "kind": "repeat", "block": 1, "order": list(by_label).index(label),
        "arm": a["arm"],
        "cells": [{"workload": m["workload"], "concurrency": int(c), "corpus_dir": corpus_dir(m, results)}
                  for c in m["concurrency"]],
        "smoke_corpus_dir": smoke_corpus_dir,
        "engine": engine_for(study_cfg, m, a["draft"], results),
        "cell_settings": settings,
        "study": f"{study_cfg['study']['name']}-mechanics", "seed": study_cfg["study"]["seed"],
    }


# ----------------------------------------------------------------------------- corpus

def derive_corpus(src_dir: str | Path, out_dir: str | Path, max_tokens: int) -> dict:
    """A copy of a built corpus whose every prompt asks for exactly ``max_tokens`` (a fixed decode length)."""
    from specstudy.inputs import corpus as corpusmod

    src = corpusmod.load_corpus(src_dir)
    prompts = [dict(p, max_tokens=int(max_tokens)) for p in corpusmod.load_prompts(src_dir)]
    basis = {"derived_from": {"name": src["name"], "version": str(src["version"]), "digest": src["digest"]},
             "max_tokens": int(max_tokens), "label": LABEL}
    out_dir = Path(out_dir)
    atomic.write_jsonl(out_dir / "prompts.jsonl", prompts)
    rec = dict(src, name=f"{src['name']}-mechanics", version=f"{src['version']}-mt{int(max_tokens)}",
               digest_basis=basis, digest=corpusmod.compute_digest(basis, prompts),
               prompts_sha256=atomic.sha256_file(out_dir / "prompts.jsonl"))
    atomic.write_json(out_dir / "corpus.json", rec)
    return rec


# ----------------------------------------------------------------------------- running

def arm_record_path(label: str, results: str = layout.ROOT) -> Path:
    return Path(layout.mechanics_arm(label, root=results))


def _model_record(path: str | None) -> dict | None:
    p = Path(path) / "model.json" if path else None
    try:
        return atomic.read_json(p) if p is not None and p.exists() else None
    except (OSError, ValueError):
        return None


def run_arm(spec: dict, out: str | Path, results_root: str | Path = "results", log=print) -> dict:
    """Run one arm's deployment; always write ``<out>/mechanics-arm.json`` (status ok | failed, timings).

    A deployment that fails to start is a failure record written by run_deployment; an exception
    anywhere (a bad path, a bug) is caught here and recorded, so the other arms still run.
    """
    from specstudy.job.run import run_deployment

    out = Path(out)
    label = spec["arm"]["mechanics_label"]
    t0 = time.time()
    rec = {"schema": "specstudy.mechanics-arm/1", "label": LABEL, "mechanics_label": label, "arm": spec["arm"],
           "draft_model": (spec["engine"].get("draft") or {}).get("path"),
           "target_model": spec["engine"]["target"]["path"], "status": None, "error": None, "exit_code": None,
           "deployment": str(out / "deployment.json"), "started_unix": t0,
           # the models' records travel with the arm (results/models/ is not copied back from a GPU lease)
           "models": {role: _model_record(path) for role, path in
                      (("target", spec["engine"]["target"]["path"]),
                       ("draft", (spec["engine"].get("draft") or {}).get("path")))}}
    log(f"[mechanics] arm {label}: start ({spec['arm']['name']}, draft {rec['draft_model']})")
    try:
        code = run_deployment(spec, out, results_root=results_root)
        rec["exit_code"] = code
        dep = atomic.read_json(out / "deployment.json") if (out / "deployment.json").exists() else None
        if code != 0:
            rec["status"], rec["error"] = "failed", f"run_deployment exited {code} (cancelled)"
        elif dep is None or dep.get("status") != "ok":
            rec["status"] = "failed"
            rec["error"] = (dep or {}).get("failure") or "no deployment record written"
        else:
            rec["status"] = "ok"
            rec["deployment_times"] = dep.get("times")
    except Exception as exc:  # one broken arm must not stop the others: it becomes a failure record
        traceback.print_exc()
        rec["status"] = "failed"
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["seconds"] = round(time.time() - t0, 1)
    atomic.write_json(out / "mechanics-arm.json", rec)
    log(f"[mechanics] arm {label}: {rec['status']} in {rec['seconds']} s"
        + (f" — {rec['error']}" if rec["error"] else ""))
    return rec


# ----------------------------------------------------------------------------- analysis

def _num(x):
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _ratio(a, b):
    return a / b if (a is not None and b not in (None, 0)) else None


def cell_row(label: str, arm: dict, summary: dict | None, concurrency: int, status: str) -> dict:
    row = {"label": LABEL, "mechanics_label": label, "method": arm.get("method"),
           "num_speculative_tokens": arm.get("num_speculative_tokens"), "draft": arm.get("mechanics_draft"),
           "concurrency": int(concurrency), "arm_status": status, "valid": False, "invalid_reasons": None,
           "requests_successful": None, "completion_tokens": None, "tpot_p50_ms": None, "output_tokens_per_s": None,
           "drafts": None, "draft_tokens": None, "accepted_tokens": None, "acceptance_rate": None,
           "mean_acceptance_length": None, "step_time_ms": None}
    if summary is None:
        row["invalid_reasons"] = ("no cell summary: the arm has not run (no mechanics-arm.json)" if status == "missing"
                                  else f"no cell summary (arm status {status}: it stopped before this cell)")
        return row
    v = summary.get("validity") or {}
    row["valid"] = bool(v.get("valid"))
    row["invalid_reasons"] = "; ".join(f"{r.get('code')}: {r.get('detail')}" for r in v.get("reasons") or []) or None
    row["requests_successful"] = (summary.get("requests") or {}).get("successful")
    row["completion_tokens"] = (summary.get("tokens") or {}).get("completion")
    tpot_ok = v.get("tpot_valid", row["valid"])
    row["tpot_p50_ms"] = _num(((summary.get("latency_ms") or {}).get("tpot") or {}).get("p50")) if tpot_ok else None
    row["output_tokens_per_s"] = (_num((summary.get("tokens") or {}).get("output_tokens_per_second"))
                                  if v.get("throughput_valid", row["valid"]) else None)
    spec = summary.get("speculative") or {}
    if arm.get("method") == "baseline":
        length = 1.0  # one token per target step by definition
    elif spec.get("enabled"):
        drafts, dtoks, acc = _num(spec.get("drafts")), _num(spec.get("draft_tokens")), _num(spec.get("accepted_tokens"))
        row.update(drafts=drafts, draft_tokens=dtoks, accepted_tokens=acc)
        row["acceptance_rate"] = _ratio(acc, dtoks)
        length = (1.0 + acc / drafts) if (drafts and acc is not None) else None
    else:
        length = None
    row["mean_acceptance_length"] = length
    if row["tpot_p50_ms"] is not None and length is not None:
        row["step_time_ms"] = row["tpot_p50_ms"] * length
    return row


def summarize(mech: dict, results: str | Path = "results") -> dict:
    """Rows per arm x concurrency from the arms' records and cell summaries; ratios to the baseline."""
    results = Path(results)
    rows, arm_recs = [], []
    for a in arms(mech):
        label = a["label"]
        rec_path = arm_record_path(label, str(results))
        rec = atomic.read_json(rec_path) if rec_path.exists() else None
        status = (rec or {}).get("status") or "missing"
        arm_recs.append({"mechanics_label": label, "status": status, "error": (rec or {}).get("error"),
                         "seconds": (rec or {}).get("seconds"), "draft_model": (rec or {}).get("draft_model"),
                         "record": str(rec_path)})
        for c in mech["concurrency"]:
            p = Path(layout.cell_summary(layout.MECHANICS, label, REP, mech["workload"], int(c), root=str(results)))
            summary = atomic.read_json(p) if p.exists() else None
            rows.append(cell_row(label, a["arm"], summary, int(c), status))
    base = {r["concurrency"]: r for r in rows if r["mechanics_label"] == "baseline"}
    for r in rows:
        b = base.get(r["concurrency"]) or {}
        r["tpot_p50_ratio"] = _ratio(r["tpot_p50_ms"], b.get("tpot_p50_ms"))
        r["output_tokens_per_s_ratio"] = _ratio(r["output_tokens_per_s"], b.get("output_tokens_per_s"))
        r["step_time_ratio"] = _ratio(r["step_time_ms"], b.get("step_time_ms"))
    return {"schema": "specstudy.mechanics/1", "label": LABEL, "not_a_study_result": True,
            "workload": mech["workload"], "max_tokens": mech["cells"]["max_tokens"],
            "step_time_definition": STEP_DEFINITION, "arms": arm_recs, "rows": rows}


def _fmt(x, nd=2):
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def markdown(result: dict, models: dict | None = None) -> str:
    lines = [f"# Decode mechanics: {LABEL}", "",
             f"**{LABEL}.** A random-initialised target served on the production deployment path; these rows are "
             "never pooled with the study's arms, tables or decision. Workload "
             f"`{result['workload']}`, max_tokens {result['max_tokens']}, greedy.", "",
             f"Definition: {result['step_time_definition']}", ""]
    for role, rec in (models or {}).items():
        if rec:
            p = rec.get("parameters") or {}
            lines.append(f"- {role}: preset `{rec.get('preset')}`, seed {rec.get('seed')}, {rec.get('dtype')}, "
                         f"{p.get('total', 0):,} parameters ({p.get('non_embedding', 0):,} outside the embeddings), "
                         f"config sha256 {str(rec.get('config_sha256'))[:12]}")
    lines += ["", f"## Arms ({LABEL})", "", "| label | arm | status | seconds | draft model | error |", "|---|---|---|---|---|---|"]
    for a in result["arms"]:
        err = str(a["error"])[:160].replace("|", "/") if a["error"] else ""
        lines.append(f"| {LABEL} | {a['mechanics_label']} | {a['status']} | {_fmt(a['seconds'], 0)} | "
                     f"{a['draft_model'] or '—'} | {err} |")
    lines += ["", f"## Per arm and concurrency ({LABEL})", "",
              "| label | arm | c | valid | TPOT p50 ms | out tok/s | acceptance rate | mean acceptance length | "
              "step time ms | TPOT / baseline | tok/s / baseline | step time / baseline |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {LABEL} | {r['mechanics_label']} | {r['concurrency']} | {r['valid']} | {_fmt(r['tpot_p50_ms'])} | "
                     f"{_fmt(r['output_tokens_per_s'], 1)} | {_fmt(r['acceptance_rate'], 3)} | "
                     f"{_fmt(r['mean_acceptance_length'], 3)} | {_fmt(r['step_time_ms'])} | {_fmt(r['tpot_p50_ratio'], 3)} | "
                     f"{_fmt(r['output_tokens_per_s_ratio'], 3)} | {_fmt(r['step_time_ratio'], 3)} |")
    bad = [r for r in result["rows"] if not r["valid"]]
    if bad:
        lines += ["", "Invalid or missing cells (their figures are not shown where the cell's validity forbids them):", ""]
        lines += [f"- {r['mechanics_label']} c={r['concurrency']}: {r['invalid_reasons']}" for r in bad]
    return "\n".join(lines) + "\n"


def write_summary(mech: dict, results: str | Path, out_dir: str | Path) -> dict:
    results, out_dir = Path(results), Path(out_dir)
    result = summarize(mech, results)
    models = {role: _model_record(model_dir(role, str(results))) for role in ("target", "draft")}
    for a in result["arms"]:  # fall back on the copies in the arms' records
        rec_path = Path(a["record"])
        saved = (atomic.read_json(rec_path).get("models") or {}) if rec_path.exists() else {}
        for role in models:
            models[role] = models[role] or saved.get(role)
    result["models"] = models
    atomic.write_json(out_dir / "mechanics.json", result)
    atomic.write_text(out_dir / "mechanics.md", markdown(result, models))
    try:
        import pandas as pd

        df = pd.DataFrame(result["rows"])
        tmp = out_dir / "mechanics.parquet.tmp"
        df.to_parquet(tmp, index=False)
        tmp.replace(out_dir / "mechanics.parquet")
    except ImportError as exc:  # pragma: no cover - pandas is a dependency of the package
        print(f"mechanics.parquet not written: {exc}")
    return result


# ----------------------------------------------------------------------------- command line

def _study_config(path: str) -> dict:
    from specstudy.study.config import load_config

    if path.endswith(".json"):  # the workflow's effective config (results/.config/<hash>.json)
        from specstudy.study.config import check_config

        return check_config(atomic.read_json(path), path)
    return load_config(path)


def _cmd_spec(args) -> int:
    study = _study_config(args.config)
    m = load_mechanics(args.mechanics, study)
    print(json.dumps(arm_spec(study, m, args.arm, args.smoke_corpus_dir), sort_keys=True, indent=1))
    return 0


def _cmd_run(args) -> int:
    from specstudy.job.spec import corpus_dirs, load_settings

    study = load_settings(args.config)
    m = load_mechanics(args.mechanics, study)
    spec = arm_spec(study, m, args.arm, args.smoke_corpus_dir or corpus_dirs(study)["smoke"])
    rec = run_arm(spec, args.out)
    code = rec.get("exit_code") or 0
    return code if code >= 128 else 0   # cancelled (signal): fail the job so that a re-run resumes it


def _cmd_corpus(args) -> int:
    rec = derive_corpus(args.source, args.out, args.max_tokens)
    print(f"mechanics corpus {rec['name']}/{rec['version']}: {rec['count']} prompts, digest {rec['digest'][:12]}")
    return 0


def _summary_root(m: dict, args) -> str:
    """The results root of the arms' records given (``--records``: what rule mechanics_summary passes), else
    ``--results``; the records must be those of the configured arms."""
    if not args.records:
        return args.results
    roots = {layout.parse("mechanics_arm", r)["root"] for r in args.records}
    labels = {layout.parse("mechanics_arm", r)["arm"] for r in args.records}
    if len(roots) != 1 or labels != set(arm_labels(m)):
        raise MechanicsError(f"--records {' '.join(args.records)}: not the records of the configured arms "
                             f"({', '.join(arm_labels(m))}) under one results root")
    return roots.pop()


def _cmd_summary(args) -> int:
    study = _study_config(args.config)
    m = load_mechanics(args.mechanics, study)
    result = write_summary(m, _summary_root(m, args), args.out)
    ok = sum(1 for a in result["arms"] if a["status"] == "ok")
    for a in result["arms"]:
        print(f"{LABEL}: arm {a['mechanics_label']}: {a['status']}, {a['seconds']} s" + (f" — {a['error']}" if a["error"] else ""))
    print(f"{LABEL}: {ok}/{len(result['arms'])} arms ok; {args.out}/mechanics.md")
    return 0


def register(sub) -> None:
    p = sub.add_parser("mechanics", help=f"the memory-bound mechanics point ({LABEL})")
    msub = p.add_subparsers(dest="mechanics_command", required=True)
    s = msub.add_parser("spec", help="print the deployment spec of one mechanics arm")
    s.add_argument("--config", required=True, help="the study config (YAML, or the workflow's effective JSON)")
    s.add_argument("--mechanics", required=True, help="the mechanics config (config/gpu-h200-mechanics.yaml)")
    s.add_argument("--arm", required=True, help="mechanics label, e.g. self-draft-k3")
    s.add_argument("--smoke-corpus-dir", required=True)
    s.set_defaults(func=_cmd_spec)
    r = msub.add_parser("run", help="run one mechanics arm (one deployment); a failure is recorded, exit 0")
    r.add_argument("--config", required=True, help="the study config (YAML, or the workflow's effective JSON)")
    r.add_argument("--mechanics", required=True, help="the mechanics config (config/gpu-h200-mechanics.yaml)")
    r.add_argument("--arm", required=True, help="mechanics label, e.g. self-draft-k3 (its spec: `specstudy mechanics spec`)")
    r.add_argument("--smoke-corpus-dir", help="default: the study's smoke corpus under results/corpora/")
    r.add_argument("--out", required=True, help="results/mechanics/<label>/rep1")
    r.set_defaults(func=_cmd_run)
    c = msub.add_parser("corpus", help="derive the fixed-max_tokens corpus of the mechanics point")
    c.add_argument("--source", required=True, help="a built corpus directory (results/corpora/<name>/<version>)")
    c.add_argument("--out", required=True)
    c.add_argument("--max-tokens", type=int, required=True)
    c.set_defaults(func=_cmd_corpus)
    m = msub.add_parser("summary", help="mechanics.json / mechanics.md / mechanics.parquet from the arms' cells")
    m.add_argument("--config", required=True)
    m.add_argument("--mechanics", required=True)
    m.add_argument("--records", nargs="*", default=None, metavar="RECORD",
                   help="the arms' records (results/mechanics/<label>/rep1/mechanics-arm.json): what the rule passes; "
                   "their cells are read beside them")
    m.add_argument("--results", default=layout.ROOT, help="without --records: the results root to read the arms from")
    m.add_argument("--out", default=layout.mechanics_dir())
    m.set_defaults(func=_cmd_summary)
