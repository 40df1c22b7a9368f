"""``specstudy gate {capture,compare,judge}``: the greedy correctness gate's command line (the capture against
a live server, :mod:`specstudy.measure.greedy_capture`; the comparison and the verdict,
:mod:`specstudy.analysis.gate`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from specstudy.analysis.gate import compare_captures, judge, load_capture, validate_margins
from specstudy.core import atomic, schemas
from specstudy.core.capture_file import read_capture_json
from specstudy.measure.greedy_capture import GateInputError, capture_greedy

#: The ``specstudy gate`` parser's description.
DESCRIPTION = "Greedy correctness gate: captures, pairwise comparisons, calibration controls and verdicts."


def _parse_margins(text: str) -> dict:
    src = "--margins"
    if text.startswith("@"):
        src = text[1:]
        try:
            text = Path(src).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise GateInputError(f"--margins {text}: file {src} not found") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GateInputError(f"{src}: not valid JSON ({exc}); e.g. --margins "
                             "'{\"min_common_prefix_fraction\": 0.05, \"max_normalized_edit_distance\": 0.05, "
                             "\"max_completion_token_difference\": 2}'") from None
    return validate_margins(data, src)


def _cmd_compare(args) -> int:
    try:
        a, b = load_capture(args.a), load_capture(args.b)
        rec = compare_captures(a, b, tokenizer=args.tokenizer, a_path=str(args.a), b_path=str(args.b))
        schemas.validate(rec, "comparison", args.out)
    except (GateInputError, schemas.ValidationError) as exc:
        print(f"specstudy gate compare: {exc}", file=sys.stderr)
        return 2
    atomic.write_json(args.out, rec)
    w = rec["worst_case"]
    print(f"{rec['kind']}: {w['exact_matches']}/{rec['counts']['prompts']} exact, "
          f"min prefix fraction {w['min_common_prefix_fraction']}, max norm. edit distance "
          f"{w['max_normalized_edit_distance']}, max token diff {w['max_completion_token_difference']}")
    return 0


def _cmd_judge(args) -> int:
    try:
        margins = _parse_margins(args.margins)
        if args.control and (args.control_a or args.control_b):
            raise GateInputError("pass either --control (all pairs of its deployments) or --control-a/--control-b, "
                                 "not both")
        rec = judge(args.baseline, args.candidate, args.control_a, args.control_b, margins, arm=args.arm,
                    phase=args.phase, tokenizer=args.tokenizer, control=args.control)
    except (GateInputError, schemas.ValidationError) as exc:
        print(f"specstudy gate judge: {exc}", file=sys.stderr)
        return 2
    atomic.write_json_if_changed(args.out, rec)  # an unchanged verdict keeps its bytes and time
    print(f"gate {rec['arm']}: {rec['verdict']}" + "".join(f"\n  - {r['code']}: {r['detail']}" for r in rec["reasons"]))
    return 0


def _cmd_capture(args) -> int:
    try:
        prompts = atomic.read_jsonl(args.prompts)
        corpus = read_capture_json(args.corpus, GateInputError) if args.corpus else {"name": Path(args.prompts).parent.parent.name,
                                                             "version": Path(args.prompts).parent.name, "digest": None}
        if args.limit:
            prompts = prompts[: args.limit]
        api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
        rec = capture_greedy(args.base_url, args.model, prompts, args.out, deployment_id=args.deployment_id,
                             arm=args.arm, capture_index=args.capture_index, corpus=corpus, seed=args.seed,
                             api_key=api_key)
    except (GateInputError, schemas.ValidationError) as exc:
        print(f"specstudy gate capture: {exc}", file=sys.stderr)
        return 2
    if not any(r["success"] for r in rec["prompts"]):
        print(f"specstudy gate capture: error: none of the {len(rec['prompts'])} prompts succeeded against "
              f"{args.base_url} (model {args.model}); first error: {rec['prompts'][0]['error']}. "
              f"The capture ({args.out}) records every error; check that a vLLM server serves this model there.",
              file=sys.stderr)
        return 1
    return 0


def add_judge_inputs(parser, *, baseline: str, candidate: str, control: str) -> None:
    """A judge's three groups of files (captures, or the deployment records naming them), the same options in
    ``specstudy gate judge`` and ``specstudy phase sampling judge``: ``--baseline`` and ``--candidate`` (one or
    more each, required), ``--control`` (any number; default none). The arguments are their help texts."""
    parser.add_argument("--baseline", nargs="+", required=True, metavar="FILE", help=baseline)
    parser.add_argument("--candidate", nargs="+", required=True, metavar="FILE", help=candidate)
    parser.add_argument("--control", nargs="*", default=[], metavar="FILE", help=control)


def register(subparsers) -> None:
    p = subparsers.add_parser("gate", help="greedy correctness gate: captures, comparisons, calibrated verdicts",
                              description=DESCRIPTION)
    sub = p.add_subparsers(dest="gate_command", required=True)

    c = sub.add_parser("compare", help="compare two greedy captures (per prompt, distribution, worst case)")
    c.add_argument("a", help="capture JSON (specstudy smoke/capture-<i>.json or an upstream capture)")
    c.add_argument("b", help="capture JSON")
    c.add_argument("--out", required=True, help="comparison JSON to write")
    c.add_argument("--tokenizer", help="local tokenizer directory for token-level metrics (optional)")
    c.set_defaults(func=_cmd_compare)

    j = sub.add_parser("judge", help="judge a speculative arm against the baseline, calibrated by a control")
    add_judge_inputs(j, baseline="captures (or deployment.json) of the baseline deployments",
                     candidate="captures (or deployment.json) of the speculative arm's deployments",
                     control="captures (or deployment.json) of independently launched deployments of one "
                             "configuration (all baseline repeats): every pair of them is a control pair")
    j.add_argument("--control-a", nargs="*", default=[], metavar="FILE",
                   help="captures (or deployment.json) of control deployment A")
    j.add_argument("--control-b", nargs="*", default=[], metavar="FILE",
                   help="captures (or deployment.json) of control deployment B (same configuration, launched "
                        "independently of A)")
    j.add_argument("--margins", required=True,
                   help="JSON object (or @file.json) with min_common_prefix_fraction, max_normalized_edit_distance, "
                        "max_completion_token_difference")
    j.add_argument("--arm", help="name of the speculative arm (default: from the candidate captures)")
    j.add_argument("--phase", help="screen | confirm (recorded)")
    j.add_argument("--out", required=True, help="gate JSON to write")
    j.add_argument("--tokenizer", help="local tokenizer directory for token-level metrics (recorded, not gated)")
    j.set_defaults(func=_cmd_judge)

    k = sub.add_parser("capture", help="greedy capture of the smoke prompts against a running server")
    k.add_argument("--base-url", required=True)
    k.add_argument("--model", required=True)
    k.add_argument("--prompts", required=True, help="prompts.jsonl (rows with prompt_id, messages, max_tokens)")
    k.add_argument("--corpus", help="corpus.json (name, version, digest)")
    k.add_argument("--limit", type=int, default=0, help="use only the first N prompts")
    k.add_argument("--out", required=True)
    k.add_argument("--deployment-id", required=True)
    k.add_argument("--arm", required=True)
    k.add_argument("--capture-index", type=int, default=1)
    k.add_argument("--seed", type=int, default=None)
    k.add_argument("--api-key-env", help="name of the environment variable holding the API key")
    k.set_defaults(func=_cmd_capture)
