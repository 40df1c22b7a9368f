"""``specstudy deploy-command`` (the redacted launch command of an arm) and ``specstudy deploy-confounds``
(a launch log's confounds)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from specstudy.deployment.command import arm_name, build_command
from specstudy.deployment.launch import make_backend
from specstudy.deployment.launchlog import error_excerpt, parse_launch_log
from specstudy.deployment.redaction import redact_argv, secret_values
from specstudy.measure import prom
from specstudy.study.config import ConfigError


def _check_launch_log(path: Path, text: str) -> None:
    """A launch log is the server's text output; an empty file or a JSON document (a record, a summary) is the
    wrong input, refused rather than summarised as a launch without confounds."""
    from specstudy.core.errors import UserError

    what = "deploy-confounds reads a vLLM server's launch log (results/<phase>/<arm>/<rep>/launch.log)"
    if not text.strip():
        raise UserError(f"{path}: empty file, no server output to read; {what}")
    if text.lstrip()[:1] in "{[":
        try:
            json.loads(text)
        except ValueError:
            return
        raise UserError(f"{path}: a JSON document, not a launch log; {what}")


def _cmd_confounds(args) -> int:
    path = Path(args.log)
    if not path.exists():
        print(f"{path}: no such launch log", file=sys.stderr)
        return 2
    text = path.read_text(encoding="utf-8", errors="replace")
    _check_launch_log(path, text)
    out = parse_launch_log(text)
    if args.metrics:
        out = {"confounds": out, "cache_config": prom.kv_cache_config(Path(args.metrics).read_text())}
    if args.failure:
        out = {"result": out, "error": error_excerpt(text)}
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


def _cmd_command(args) -> int:

    from specstudy.core.errors import UserError, load_json_arg
    from specstudy.study.config import _load_yaml

    cfg = _load_yaml(Path(args.engine))  # names the file (and the line of a YAML error)
    cfg = cfg.get("engine", cfg) if isinstance(cfg, dict) else cfg
    if not isinstance(cfg, dict):
        raise UserError(f"{args.engine}: expected engine settings (a mapping, or a study config with 'engine:')")
    if "target" in cfg:  # a study config's engine section: the launcher's flat settings, as the deployment job uses
        from specstudy.job.spec import engine_flat

        cfg = {k: v for k, v in engine_flat(cfg).items() if v is not None}
    arm = load_json_arg(args.arm, "--arm")
    if not isinstance(arm, dict):
        raise UserError(f"--arm {args.arm!r}: must be a JSON object, e.g. '{{\"method\": \"baseline\"}}'")
    arm.setdefault("name", arm_name(arm))
    try:
        argv = build_command(cfg, arm, port=args.port, served_model_name=args.served_model_name)
        backend = make_backend(cfg)
        full = backend.wrap(argv, None) if backend.kind == "container" else argv
    except ConfigError as exc:
        print(f"{args.engine}: {exc}", file=sys.stderr)
        return 2
    print(shlex.join(redact_argv(full, secret_values(cfg))))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("deploy-confounds", help="parse a vLLM launch log into the deployment's confounds")
    p.add_argument("log", help="launch.log of a deployment attempt")
    p.add_argument("--metrics", help="a /metrics scrape (adds vllm:cache_config_info)")
    p.add_argument("--failure", action="store_true", help="also print the traceback's exception lines")
    p.set_defaults(func=_cmd_confounds)
    p = subparsers.add_parser("deploy-command", help="print the (redacted) vLLM launch command of an arm")
    p.add_argument("--engine", required=True, help="YAML file with the engine settings (or a study config with 'engine:')")
    p.add_argument("--arm", required=True, help='arm spec as JSON, e.g. \'{"method":"ngram","num_speculative_tokens":3,'
                   '"prompt_lookup_min":2,"prompt_lookup_max":4}\'')
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default="specstudy-target")
    p.set_defaults(func=_cmd_command)
