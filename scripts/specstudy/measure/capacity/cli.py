"""``specstudy capacity {search,compare,plot}``: the capacity search's command line."""

from __future__ import annotations

import os
from pathlib import Path

from specstudy.core import atomic
from specstudy.core.records import read_capacity_steps, read_knee
from specstudy.measure.capacity.knee import compare_knees
from specstudy.measure.capacity.plot import plot_capacity
from specstudy.measure.capacity.run import GATES_FILE, KNEE_FILE, PLOT_FILE, SOAKS_FILE, STEPS_FILE, run_capacity


def _cmd_search(args) -> int:
    try:
        knee = run_capacity(args.base_url, args.model, args.prompts, args.gates, args.search, args.out,
                            args.metrics_url or args.base_url.rstrip("/") + "/metrics",
                            deployment_record=args.deployment_record, arm=args.arm,
                            api_key=os.environ.get(args.api_key_env) if args.api_key_env else None)
    except ValueError as exc:  # bad input (schemas.ValidationError is a ValueError)
        print(f"specstudy capacity search: {exc}")
        return 2
    print(f"{args.out}: knee {knee['knee_rps']} rps, status {knee['status']}")
    return 0


def _cmd_compare(args) -> int:
    print(compare_knees(args.baseline, args.candidate))
    return 0


def _cmd_plot(args) -> int:
    out = Path(args.dir)
    g = atomic.read_json(out / GATES_FILE)["gates"]
    plot_capacity(read_capacity_steps(out / STEPS_FILE), read_capacity_steps(out / SOAKS_FILE),
                  read_knee(out / KNEE_FILE), g, out / PLOT_FILE)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("capacity", help="open-loop arrival-rate search (sustainable rate under gates)")
    sub = p.add_subparsers(dest="capacity_command", required=True)
    s = sub.add_parser("search", help="bracket + bisect the Poisson rate of one arm's running server, confirm with soaks")
    s.add_argument("--base-url", required=True, help="OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    s.add_argument("--model", required=True, help="served model name")
    s.add_argument("--prompts", required=True, help="prompts.jsonl of a built corpus")
    s.add_argument("--gates", required=True, help="gates as inline JSON or a JSON/YAML file")
    s.add_argument("--search", default="{}", help="search settings as inline JSON or a JSON/YAML file")
    s.add_argument("--out", required=True, help="output directory, results/capacity/<arm>")
    s.add_argument("--metrics-url", default=None, help="default: <base-url>/metrics")
    s.add_argument("--deployment-record", default=None, help="the arm's deployment.json (KV capacity, memory)")
    s.add_argument("--arm", default=None, help="arm name (default: the --out directory name)")
    s.add_argument("--api-key-env", default=None, help="environment variable holding the API key")
    s.set_defaults(func=_cmd_search)
    c = sub.add_parser("compare", help="'the draft costs X%% of the KV pool and moves the knee by Y'")
    c.add_argument("baseline", help="baseline knee.json")
    c.add_argument("candidate", help="candidate knee.json")
    c.set_defaults(func=_cmd_compare)
    pl = sub.add_parser("plot", help="redraw capacity.png from a capacity output directory")
    pl.add_argument("dir")
    pl.set_defaults(func=_cmd_plot)
