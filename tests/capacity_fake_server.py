"""A fake OpenAI-compatible streaming server with a known service capacity (for tests/test_capacity.py).

The server admits at most ``--max-concurrency`` streams at a time; further requests wait in a FIFO
queue (exposed as ``vllm:num_requests_waiting``). An admitted stream sleeps ``--prefill-ms``, then
emits one token every ``--token-delay-ms`` on an absolute per-stream timeline, so a request of
``max_tokens`` tokens occupies a slot for ``prefill + max_tokens * delay`` seconds and the
sustainable request rate is ``max_concurrency / (prefill + max_tokens * delay)``.

Run ``python tests/capacity_fake_server.py --port 0``; the first stdout line is ``PORT <n>``.
:func:`start` launches it as a subprocess and returns ``(base_url, metrics_url, process)``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time


def build_app(max_concurrency: int, token_delay_ms: float, prefill_ms: float, preempt_every: int = 0,
              kv_full: float = 0.8):
    from aiohttp import web

    state = {"waiting": 0, "running": 0, "preemptions": 0, "success": 0, "admitted": 0}
    sem = asyncio.Semaphore(max_concurrency)

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n_tokens = int(body.get("max_tokens") or 16)
        model = body.get("model", "fake")
        state["waiting"] += 1
        try:
            await sem.acquire()
        finally:
            state["waiting"] -= 1
        state["running"] += 1
        state["admitted"] += 1
        if preempt_every and state["admitted"] % preempt_every == 0:
            state["preemptions"] += 1
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            rid = f"chatcmpl-{state['admitted']}"

            def chunk(delta, finish=None, usage=None, choices=True):
                obj = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else []}
                if usage is not None:
                    obj["usage"] = usage
                return f"data: {json.dumps(obj)}\n\n".encode()

            def usage(k):
                return {"prompt_tokens": 8, "completion_tokens": k, "total_tokens": 8 + k}

            await resp.write(chunk({"role": "assistant", "content": ""}, usage=usage(0)))
            t0 = time.monotonic() + prefill_ms / 1000.0
            for k in range(1, n_tokens + 1):
                delay = t0 + k * token_delay_ms / 1000.0 - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                finish = "length" if k == n_tokens else None
                await resp.write(chunk({"content": f"t{k} "}, finish=finish, usage=usage(k)))
            await resp.write(chunk(None, usage=usage(n_tokens), choices=False))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            state["success"] += 1
            return resp
        finally:
            state["running"] -= 1
            sem.release()

    async def metrics(request: web.Request) -> web.Response:
        lab = '{model_name="fake"}'
        text = (
            "# HELP vllm:num_requests_running Running requests.\n# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{lab} {state['running']}\n"
            "# HELP vllm:num_requests_waiting Waiting requests.\n# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{lab} {state['waiting']}\n"
            "# HELP vllm:kv_cache_usage_perc KV usage.\n# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{lab} {kv_full * state['running'] / max_concurrency}\n"
            "# HELP vllm:num_preemptions Preemptions.\n# TYPE vllm:num_preemptions counter\n"
            f"vllm:num_preemptions_total{lab} {state['preemptions']}\n"
            "# HELP vllm:request_success Finished requests.\n# TYPE vllm:request_success counter\n"
            f"vllm:request_success_total{lab} {state['success']}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    return app


async def _serve(args) -> None:
    from aiohttp import web

    app = build_app(args.max_concurrency, args.token_delay_ms, args.prefill_ms, args.preempt_every, args.kv_full)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=1024)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    await asyncio.Event().wait()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument("--token-delay-ms", type=float, default=25.0)
    p.add_argument("--prefill-ms", type=float, default=0.0)
    p.add_argument("--kv-full", type=float, default=0.8, help="KV usage reported when every slot is busy")
    p.add_argument("--preempt-every", type=int, default=0, help="count a preemption every N admissions (0: never)")
    asyncio.run(_serve(p.parse_args(argv)))


def start(max_concurrency=4, token_delay_ms=25.0, prefill_ms=0.0, preempt_every=0):
    """Start the server in a subprocess; return ``(base_url, metrics_url, proc)``. Caller terminates proc."""
    cmd = [sys.executable, os.path.abspath(__file__), "--port", "0", "--max-concurrency", str(max_concurrency),
           "--token-delay-ms", str(token_delay_ms), "--prefill-ms", str(prefill_ms),
           "--preempt-every", str(preempt_every)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"fake server did not start: {line!r}")
    port = int(line.split()[1])
    base = f"http://127.0.0.1:{port}"
    return base, base + "/metrics", proc


if __name__ == "__main__":
    main()
