"""A stand-in for ``python -m vllm.entrypoints.openai.api_server`` for deployment-job tests without vLLM.

Accepts vLLM's command line (``--port``, ``--served-model-name``; everything else is ignored), waits
``FAKE_STARTUP_S`` seconds before listening (a server loading weights), then serves ``/v1/models``,
``/metrics`` (running/waiting gauges, so the drain check works) and ``/v1/chat/completions``: streamed
(one token every ``FAKE_TOKEN_DELAY_MS`` ms up to ``max_tokens``, usage on every chunk) or, without
``stream``, one JSON answer (the readiness probe). Greedy and deterministic: the text depends only on
``max_tokens``. Used through a ``python`` stand-in script that drops ``-m <module>``.

Like vLLM, it binds to ``--host`` and, given ``VLLM_API_KEY`` in its environment, answers 401 to a ``/v1`` request
without that bearer token; ``/metrics`` counts the HTTP requests it served per handler (``http_requests_total``,
as vLLM's instrumentator does). For the redaction tests it prints the key it was given to its log and writes it to
``FAKE_SEEN_KEY_FILE`` (a file outside the results); a key on the command line (``--api-key``) is refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time


def main(argv: list[str]) -> None:
    from aiohttp import web

    port = int(argv[argv.index("--port") + 1])
    name = argv[argv.index("--served-model-name") + 1]
    host = argv[argv.index("--host") + 1] if "--host" in argv else "127.0.0.1"
    delay = float(os.environ.get("FAKE_TOKEN_DELAY_MS", "20")) / 1000.0
    state = {"running": 0, "success": 0, "tokens": 0}
    http: dict[tuple[str, str, str], int] = {}
    print(f"(APIServer pid={os.getpid()}) INFO fake vLLM starting: {' '.join(argv)}", flush=True)
    if "--api-key" in argv:
        print("fake vLLM: the API key is on the command line (ps shows it to every user)", flush=True)
        sys.exit(2)
    key = os.environ.get("VLLM_API_KEY")
    print(f"(APIServer pid={os.getpid()}) INFO fake vLLM environment: VLLM_API_KEY={key} (token {key})", flush=True)
    if os.environ.get("FAKE_SEEN_KEY_FILE"):
        with open(os.environ["FAKE_SEEN_KEY_FILE"], "w") as fh:
            fh.write(key or "")
    time.sleep(float(os.environ.get("FAKE_STARTUP_S", "0")))

    def usage(k: int) -> dict:
        return {"prompt_tokens": 8, "completion_tokens": k, "total_tokens": 8 + k}

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body.get("max_tokens") or 16)
        if not body.get("stream"):
            state["success"] += 1
            state["tokens"] += n
            return web.json_response({"id": "x", "object": "chat.completion", "model": name, "usage": usage(n),
                                      "choices": [{"index": 0, "finish_reason": "length",
                                                   "message": {"role": "assistant",
                                                               "content": " ".join(f"t{k}" for k in range(n))}}]})
        state["running"] += 1
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)

            def chunk(delta, finish=None, u=None, choices=True):
                obj = {"id": "x", "object": "chat.completion.chunk", "created": int(time.time()), "model": name,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else []}
                if u is not None:
                    obj["usage"] = u
                return f"data: {json.dumps(obj)}\n\n".encode()

            await resp.write(chunk({"role": "assistant", "content": ""}, u=usage(0)))
            for k in range(1, n + 1):
                await asyncio.sleep(delay)
                await resp.write(chunk({"content": f"t{k} "}, finish="length" if k == n else None, u=usage(k)))
            await resp.write(chunk(None, u=usage(n), choices=False))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            state["success"] += 1
            state["tokens"] += n
            return resp
        finally:
            state["running"] -= 1

    async def metrics(request: web.Request) -> web.Response:
        lab = f'{{model_name="{name}"}}'
        served = "".join(f'http_requests_total{{handler="{h}",method="{m}",status="{c}"}} {n}\n'
                         for (h, m, c), n in sorted(http.items()))
        return web.Response(content_type="text/plain", text=(
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{lab} {state['running']}\n"
            f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{lab} 0\n"
            f"# TYPE vllm:request_success counter\nvllm:request_success_total{lab} {state['success']}\n"
            f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total{lab} {state['tokens']}\n"
            f"# TYPE http_requests_total counter\n{served}"))

    @web.middleware
    async def auth_and_count(request: web.Request, handler):
        if key and request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)  # vLLM: before the instrumentator
        resp = await handler(request)
        if request.path not in ("/metrics", "/health"):
            k = (request.path, request.method, f"{resp.status // 100}xx")
            http[k] = http.get(k, 0) + 1
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": name, "object": "model"}]})

    app = web.Application(middlewares=[auth_and_count])
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", lambda r: web.Response(text="ok"))
    print("INFO: Application startup complete.", flush=True)
    web.run_app(app, host=host, port=port, print=None, access_log=None)


if __name__ == "__main__":
    main(sys.argv[1:])
