"""How much the fixture draft's acceptance drops on text the fixture models never trained on.

The embedded workloads are built from ``corpora/data/``, the same text the fixture target and draft
trained on (``specstudy.inputs.fixture_models``), so the acceptance the embedded study measures is acceptance
on training text. ``corpora/heldout/prompts.jsonl`` holds prompts written for the project in the same
three strata but with none of that text. This module measures the draft's acceptance on both sets with
one procedure and reports the drop (issue #16 item 11).

Procedure, per prompt (both models in float32 on CPU, fixed threads: deterministic):

1. The target's greedy continuation of ``max_new_tokens`` tokens with end-of-sequence suppressed
   (``min_new_tokens``; on text it never saw, the tiny target would otherwise stop at once, and a
   one-token answer has no speculative step to measure).
2. One teacher-forced pass of the draft along that path. With greedy target and greedy draft, a draft
   proposal of k tokens starting after position t matches the target's next tokens exactly as long as
   the draft's argmax along the target's own path matches it (each matched token leaves the draft on the
   target's path), so this single pass decides every proposal.
3. The natural length: the first step at which the target's own argmax is end-of-sequence. Up to it
   the path is the answer vLLM would serve; acceptance over that prefix ("natural EOS") is the figure
   comparable with vLLM's own counters.
4. Speculative rounds as vLLM's draft-model method runs them: the first token comes from prefill; each
   round proposes ``k`` tokens (fewer at the end), accepts the longest matching prefix and adds the
   target's own next token.

Acceptance rate = accepted / draft tokens; mean acceptance length = 1 + accepted / drafts;
per-position = accepted at position i / drafts (docs/metrics.md: never converted into one another).
The drop is training-text rate − held-out rate, with a 95% bootstrap interval over prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

from specstudy.core import atomic
from specstudy.core.errors import UserError

SCHEMA = "specstudy.fixture-heldout/1"


def read_prompts(path: str | Path) -> list[dict]:
    """``[{"id", "stratum", "messages"}]`` of a JSONL file of ready chat requests, read and checked by the
    corpus importer of that format (:func:`specstudy.inputs.corpus.import_chat_jsonl`); a bad line is an error
    naming the file, the line and what is wrong."""
    from specstudy.inputs.corpus import import_chat_jsonl

    items, malformed = import_chat_jsonl(Path(path), {})
    if malformed:
        raise UserError("; ".join(f"{m['where']}: {m['reason']}" for m in malformed) + "; fix or remove the line")
    if not items:
        raise UserError(f"{path}: no prompts; add at least one JSON line with 'messages'")
    return [{"id": i["source_id"], "stratum": i["stratum"], "messages": i["messages"]} for i in items]


def workload_prompts(corpus: str | Path) -> list[dict]:
    """The prompts of a built workload corpus (its ``corpus.json`` or folder), as :func:`read_prompts` gives them."""
    from specstudy.inputs.corpus import load_prompts

    return [{"id": r["prompt_id"], "stratum": r["stratum"], "messages": r["messages"]} for r in load_prompts(corpus)]


def rounds(matches: list[bool], k: int) -> dict:
    """Speculative rounds of depth ``k`` along a greedy path whose draft matches are ``matches``.

    ``matches[j]``: the draft's greedy proposal for continuation token j equals the target's. Token 0
    comes from prefill; a round at position t proposes ``min(k, n - t)`` tokens, accepts the longest
    matching prefix ``a`` and moves to ``t + a + 1`` (the target's own token follows the accepted ones)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n = len(matches)
    t, drafts, draft_tokens, accepted = 1, 0, 0, 0
    at = [0] * k
    while t < n:
        kk = min(k, n - t)
        a = 0
        while a < kk and matches[t + a]:
            at[a] += 1
            a += 1
        drafts += 1
        draft_tokens += kk
        accepted += a
        t += a + 1
    return {"drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted, "accepted_at": at}


def summarize(parts: list[dict]) -> dict:
    """Pooled acceptance figures from per-prompt :func:`rounds` results (ratios of sums)."""
    drafts = sum(p["drafts"] for p in parts)
    dt = sum(p["draft_tokens"] for p in parts)
    acc = sum(p["accepted"] for p in parts)
    k = max((len(p["accepted_at"]) for p in parts), default=0)
    at = [sum(p["accepted_at"][i] for p in parts if i < len(p["accepted_at"])) for i in range(k)]
    return {"prompts": len(parts), "drafts": drafts, "draft_tokens": dt, "accepted": acc,
            "acceptance_rate": acc / dt if dt else None,
            "mean_acceptance_length": 1 + acc / drafts if drafts else None,
            "per_position": [a / drafts for a in at] if drafts else []}


def drop_interval(train: list[dict], held: list[dict], resamples: int = 2000, seed: int = 0,
                  confidence: float = 0.95) -> dict:
    """Training − held-out acceptance rate with a percentile bootstrap interval (scipy.stats.bootstrap,
    prompts resampled within each set; the statistic is the difference of the two ratios of sums)."""
    import numpy as np
    from scipy import stats

    def arrays(parts):  # prompts without a draft token (a 0/0 share) change no ratio of sums
        parts = [p for p in parts if p["draft_tokens"]]
        return (np.array([p["accepted"] for p in parts], float), np.array([p["draft_tokens"] for p in parts], float))

    (ta, td), (ha, hd) = arrays(train), arrays(held)
    if not td.size or not hd.size:
        return {"drop": None, "ci": None, "resamples": 0}

    def drop(i, j, axis=-1):
        return ta[i].sum(axis) / td[i].sum(axis) - ha[j].sum(axis) / hd[j].sum(axis)

    point = drop(np.arange(ta.size), np.arange(ha.size))
    res = stats.bootstrap((np.arange(ta.size), np.arange(ha.size)), drop, vectorized=True, paired=False,
                          n_resamples=resamples, confidence_level=confidence, method="percentile",
                          rng=np.random.default_rng(seed))
    ci = res.confidence_interval
    return {"drop": float(point), "ci": [float(ci.low), float(ci.high)], "resamples": resamples,
            "confidence": confidence}


def _greedy_matches(target, draft, prompt_ids: list[int], n: int) -> tuple[list[bool], list[int], int]:
    """Draft matches along the target's greedy path of ``n`` tokens (end-of-sequence suppressed), the
    path, and its natural length: the first step at which the target's own argmax is end-of-sequence
    (before that step the suppressed and the natural greedy paths are the same tokens)."""
    import torch

    inp = torch.tensor([prompt_ids], dtype=torch.long, device=target.device)
    with torch.no_grad():
        gen = target.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=target.config.pad_token_id,
                              output_logits=True, return_dict_in_generate=True)
        out = gen.sequences
        cont = out[0, len(prompt_ids):]
        logits = draft(input_ids=out[:, :-1]).logits[0]
    eos = target.config.eos_token_id
    natural = next((i for i, step in enumerate(gen.logits) if int(step[0].argmax()) == eos), n)
    pred = logits[len(prompt_ids) - 1:].argmax(-1)
    return (pred == cont).tolist(), cont.tolist(), natural


#: The dtypes the offline acceptance can be computed in (those vLLM serves the fixture pair in).
DTYPES = ("float32", "bfloat16", "float16")


def measure(models_dir: str | Path, sets: dict[str, list[dict]], ks: list[int], max_new_tokens: int = 64,
            max_model_len: int = 1024, threads: int = 2, log=print, dtype: str = "float32", device: str = "cpu") -> dict:
    """Acceptance per set × stratum × k on the fixture models under ``models_dir/{target,draft}``, computed
    in ``dtype`` on ``device`` (the study's figure: float32 on CPU; benchmarks/acceptance_gap.py compares
    others against a served engine)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.set_num_threads(threads)
    models_dir = Path(models_dir)
    tok = AutoTokenizer.from_pretrained(str(models_dir / "target"))
    if dtype not in DTYPES:
        raise UserError(f"heldout.measure: dtype {dtype!r} is not one of {', '.join(DTYPES)}; pass one of them")
    dt = getattr(torch, dtype)
    target = LlamaForCausalLM.from_pretrained(str(models_dir / "target"), dtype=dt).eval().to(device)
    draft = LlamaForCausalLM.from_pretrained(str(models_dir / "draft"), dtype=dt).eval().to(device)
    per_prompt: dict[str, list[dict]] = {}
    for name, prompts in sets.items():
        rows = []
        for p in prompts:
            ids = list(tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"])
            n = min(max_new_tokens, max_model_len - len(ids))
            if n < 2:
                log(f"{name}/{p['id']}: {len(ids)} prompt tokens leave no room to generate; skipped (listed)")
                rows.append({"id": p["id"], "stratum": p["stratum"], "skipped": "prompt fills max_model_len"})
                continue
            matches, _, natural = _greedy_matches(target, draft, ids, n)
            rows.append({"id": p["id"], "stratum": p["stratum"], "prompt_tokens": len(ids), "tokens": n,
                         "natural_tokens": natural, "first_token_match_rate": sum(matches) / len(matches),
                         "by_k": {str(k): rounds(matches, k) for k in ks},
                         # the target's own answer (up to its end-of-sequence), as vLLM serves it
                         "by_k_natural": {str(k): rounds(matches[:natural], k) for k in ks}})
        per_prompt[name] = rows
        log(f"{name}: {len(rows)} prompts measured")
    return per_prompt


def analyse(per_prompt: dict[str, list[dict]], ks: list[int], training: str = "workloads",
            heldout: str = "heldout") -> dict:
    """Pooled and per-stratum figures, and the drop training − held-out per k."""
    out: dict = {"sets": {}, "drop": {}}
    for name, rows in per_prompt.items():
        ok = [r for r in rows if "by_k" in r]
        strata = sorted({r["stratum"] or "-" for r in ok})
        nat = [r.get("natural_tokens") for r in ok if r.get("natural_tokens") is not None]
        out["sets"][name] = {
            "prompts": len(ok), "skipped": [r["id"] for r in rows if "by_k" not in r],
            "tokens": sum(r["tokens"] for r in ok),
            "natural": {"prompts": len(nat), "mean_tokens": sum(nat) / len(nat) if nat else None,
                        "answered_fewer_than_2": sum(1 for t in nat if t < 2),
                        "by_k": {str(k): dict(summarize([r["by_k_natural"][str(k)] for r in ok if "by_k_natural" in r]),
                                              strata={s: summarize([r["by_k_natural"][str(k)] for r in ok
                                                                    if "by_k_natural" in r and (r["stratum"] or "-") == s])
                                                      for s in strata})
                                 for k in ks}},
            "by_k": {str(k): dict(summarize([r["by_k"][str(k)] for r in ok]),
                                  strata={s: summarize([r["by_k"][str(k)] for r in ok if (r["stratum"] or "-") == s])
                                          for s in strata}) for k in ks}}
    if training in per_prompt and heldout in per_prompt:
        tr = [r for r in per_prompt[training] if "by_k" in r]
        he = [r for r in per_prompt[heldout] if "by_k" in r]
        for k in ks:
            strata = sorted({r["stratum"] or "-" for r in tr} & {r["stratum"] or "-" for r in he})
            out["drop"][str(k)] = dict(
                drop_interval([r["by_k"][str(k)] for r in tr], [r["by_k"][str(k)] for r in he]),
                strata={s: drop_interval([r["by_k"][str(k)] for r in tr if (r["stratum"] or "-") == s],
                                         [r["by_k"][str(k)] for r in he if (r["stratum"] or "-") == s])
                        for s in strata})
            # the same over each prompt's natural answer (where both sets have one to measure)
            trn = [r["by_k_natural"][str(k)] for r in tr if "by_k_natural" in r]
            hen = [r["by_k_natural"][str(k)] for r in he if "by_k_natural" in r]
            if sum(x["draft_tokens"] for x in trn) and sum(x["draft_tokens"] for x in hen):
                out.setdefault("drop_natural", {})[str(k)] = drop_interval(trn, hen)
    return out


def run(models_record: str | Path, heldout_prompts: str | Path, workload_corpora: list[str | Path],
        ks: list[int], out: str | Path, max_new_tokens: int = 64, log=print) -> dict:
    """Measure both sets and write the ``fixture-heldout`` record to ``out``."""
    models_record = Path(models_record)
    record = json.loads(models_record.read_text())
    trained = {t["path"] for t in record.get("training_text", [])}
    workloads = [r for c in workload_corpora for r in workload_prompts(c)]
    held = read_prompts(heldout_prompts)
    per_prompt = measure(models_record.parent, {"workloads": workloads, "heldout": held}, ks,
                         max_new_tokens=max_new_tokens, log=log)
    result = {"schema": SCHEMA, "models": str(models_record), "models_target_sha256": record["target"]["weights_sha256"],
              "models_draft_sha256": record["draft"]["weights_sha256"], "training_text": sorted(trained),
              "heldout_prompts": str(heldout_prompts), "heldout_sha256": atomic.sha256_file(heldout_prompts),
              "workload_corpora": [str(c) for c in workload_corpora], "max_new_tokens": max_new_tokens, "k": ks,
              "eos": "suppressed (min_new_tokens = max_new_tokens)", "per_prompt": per_prompt,
              **analyse(per_prompt, ks)}
    atomic.write_json(out, result)
    for k in ks:
        d = result["drop"].get(str(k)) or {}
        tr, he = result["sets"]["workloads"]["by_k"][str(k)], result["sets"]["heldout"]["by_k"][str(k)]
        log(f"k={k}: acceptance rate on training text {tr['acceptance_rate']:.3f}, held-out {he['acceptance_rate']:.3f}, "
            f"drop {d.get('drop', float('nan')):.3f} {d.get('ci')}")
    return result


def _cmd(args) -> int:
    run(args.models, args.heldout, args.workload_corpora, [int(k) for k in args.k.split(",")], args.out,
        max_new_tokens=args.max_new_tokens)
    return 0


def register(sub) -> None:
    p = sub.add_parser("fixture-heldout", help="the fixture draft's acceptance on held-out vs training text (#16.11)")
    p.add_argument("--models", required=True, help="results/models/fixture/models.json")
    p.add_argument("--heldout", required=True, help="corpora/heldout/prompts.jsonl")
    p.add_argument("--workload-corpora", nargs="+", required=True, help="the workloads' built corpus.json files")
    p.add_argument("--k", required=True, help="speculative depths, comma-separated (the study's levels)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd)
