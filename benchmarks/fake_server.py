"""A fast fake OpenAI-compatible streaming server for testing and benchmarking the load generator.

    python benchmarks/fake_server.py [--port 0] [--events 64] [--tokens-per-event 1] [--events-per-write 4] ...

Prints ``READY <port>`` on stdout once listening (``--port 0`` lets the OS pick a free port).

``POST /v1/chat/completions`` streams, like vLLM with ``stream_options: {include_usage, continuous_usage_stats}``:
an optional role-only chunk, ``--events`` content events (each ``tokens_per_event`` tokens, cumulative usage on
every chunk when continuous usage is on), a finish chunk with empty content and ``finish_reason``, the usage-only
chunk (``choices: []``) and ``data: [DONE]``. Responses are pre-encoded per configuration and several events go
out per write, so the server costs little CPU and is never the bottleneck (no delay unless asked).

Every server option can be overridden per request by a ``"fake"`` object in the request body (the load
generator's ``RequestSpec.extra_body``), e.g. ``{"fake": {"events": 5, "fault": "malformed"}}``. Keys:
``events``, ``tokens_per_event`` (int or list, cycled), ``events_per_write``, ``role_chunk``, ``continuous_usage``,
``include_usage``, ``finish_reason``, ``delay_s`` (before each content event), ``usage_delay_s`` (before the usage
chunk), ``fault``: one of ``none``, ``missing_usage``, ``malformed``, ``bad_shape`` (valid JSON, wrong types),
``http500``, ``error_event``, ``truncate`` (abort the connection mid-stream), ``no_done`` (complete HTTP response
without ``data: [DONE]``), ``split`` (every event written in two halves a moment apart), ``reasoning`` (deltas in
``reasoning_content``), ``echo_auth`` (HTTP 401 whose message repeats the bearer token).

Test endpoints: ``GET /fake/stats`` -> ``{"requests", "active", "max_active", "authorized"}``; ``POST /fake/reset``; ``GET /health``;
``GET /v1/models``; ``GET /metrics`` -> the file given by ``--metrics-page`` verbatim (e.g. a real vLLM page,
``../shared/gpu/metrics-vllm-0.23.0-h200.prom``), 404 without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

FAULTS = (
    "none",
    "missing_usage",
    "malformed",
    "bad_shape",
    "http500",
    "error_event",
    "truncate",
    "no_done",
    "split",
    "reasoning",
    "echo_auth",
)
MODEL = "fake-model"

_STATS = {"requests": 0, "active": 0, "max_active": 0, "authorized": 0}
_CACHE: dict[tuple, tuple[bytes, ...]] = {}


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _chunk(choices: list, usage: dict | None) -> dict:
    obj = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": MODEL, "choices": choices}
    if usage is not None:
        obj["usage"] = usage
    return obj


def _frame(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def build_events(cfg: dict) -> tuple[bytes, ...]:
    """The SSE events (un-framed) of one response for ``cfg``; cached per configuration."""
    tpe = cfg["tokens_per_event"]
    tpe_list = tpe if isinstance(tpe, list) else [tpe]
    key = (cfg["events"], tuple(tpe_list), cfg["role_chunk"], cfg["continuous_usage"], cfg["include_usage"],
           cfg["fault"], cfg["finish_reason"])  # fmt: skip
    if key in _CACHE:
        return _CACHE[key]
    fault = cfg["fault"]
    usage_on = fault != "missing_usage"
    cont = usage_on and cfg["continuous_usage"]
    prompt = 7
    field = "reasoning_content" if fault == "reasoning" else "content"

    def usage(done: int) -> dict:
        return {"prompt_tokens": prompt, "total_tokens": prompt + done, "completion_tokens": done}

    events = []
    if cfg["role_chunk"]:
        events.append(_event(_chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                      "finish_reason": None}], usage(0) if cont else None)))  # fmt: skip
    done = 0
    for i in range(cfg["events"]):
        k = tpe_list[i % len(tpe_list)]
        done += k
        text = "".join(f" w{i}.{j}" for j in range(k))
        if fault == "malformed" and i == cfg["events"] // 2:
            events.append(b'data: {"id":"chatcmpl-fake","choices":[{"delta":{"content":"tru\n\n')
            continue
        if fault == "bad_shape" and i == cfg["events"] // 2:
            events.append(b'data: {"id":"chatcmpl-fake","choices":"not-a-list"}\n\n')
            continue
        if fault == "error_event" and i == cfg["events"] // 2:
            events.append(_event({"error": {"message": "injected error", "type": "InternalServerError", "code": 500}}))
            break
        events.append(_event(_chunk([{"index": 0, "delta": {field: text}, "logprobs": None, "finish_reason": None}],
                                    usage(done) if cont else None)))  # fmt: skip
    if fault != "error_event":
        events.append(_event(_chunk([{"index": 0, "delta": {"content": ""}, "logprobs": None,
                                      "finish_reason": cfg["finish_reason"], "stop_reason": None}],
                                    usage(done) if cont else None)))  # fmt: skip
        if usage_on and cfg["include_usage"]:
            events.append(_event(_chunk([], usage(done))))
    if fault != "no_done":
        events.append(b"data: [DONE]\n\n")
    out = tuple(events)
    _CACHE[key] = out
    return out


def _writes(events: tuple[bytes, ...], per_write: int) -> list[bytes]:
    return [_frame(b"".join(events[i : i + per_write])) for i in range(0, len(events), per_write)]


_CACHE_W: dict[tuple, list[bytes]] = {}

HEAD_SSE = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n")  # fmt: skip


def _json_response(status: int, obj, reason: str = "OK") -> bytes:
    body = json.dumps(obj).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, reason.encode(), len(body), body))  # fmt: skip


class Server:
    def __init__(self, defaults: dict, metrics_page: bytes | None = None):
        self.defaults = defaults
        self.metrics = None
        if metrics_page is not None:
            self.metrics = (b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n"
                            b"content-length: %d\r\n\r\n%s" % (len(metrics_page), metrics_page))

    def config(self, body: bytes) -> dict:
        cfg = self.defaults
        if b'"fake"' in body:
            try:
                override = json.loads(body).get("fake") or {}
            except (ValueError, AttributeError):
                override = {}
            cfg = {**cfg, **override}
        return cfg

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.split(b"\r\n")
                method, path, _ = lines[0].split(b" ", 2)
                length = 0
                auth = b""
                for line in lines[1:]:
                    name = line[:15].lower()
                    if name == b"content-length:":
                        length = int(line[15:])
                    elif name == b"authorization: " and line[15:22].lower() == b"bearer ":
                        _STATS["authorized"] += 1
                        auth = line[22:]
                body = await reader.readexactly(length) if length else b""
                if path == b"/v1/chat/completions" and method == b"POST":
                    if not await self.stream(body, writer, auth):
                        return
                elif path == b"/fake/stats":
                    writer.write(_json_response(200, _STATS))
                elif path == b"/fake/reset":
                    _STATS.update(requests=0, active=0, max_active=0, authorized=0)
                    writer.write(_json_response(200, _STATS))
                elif path == b"/metrics" and self.metrics is not None:
                    writer.write(self.metrics)
                elif path == b"/health":
                    writer.write(_json_response(200, {}))
                elif path == b"/v1/models":
                    writer.write(_json_response(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]}))
                else:
                    writer.write(_json_response(404, {"error": "not found"}, "Not Found"))
        except ConnectionError:
            return
        finally:
            writer.close()

    async def stream(self, body: bytes, writer: asyncio.StreamWriter, auth: bytes = b"") -> bool:
        """Write one streamed response; False when the connection must be closed."""
        cfg = self.config(body)
        _STATS["requests"] += 1
        _STATS["active"] += 1
        _STATS["max_active"] = max(_STATS["max_active"], _STATS["active"])
        try:
            fault = cfg["fault"]
            if fault == "http500":
                writer.write(_json_response(500, {"error": {"message": "injected failure", "code": 500}},
                                            "Internal Server Error"))  # fmt: skip
                return True
            if fault == "echo_auth":  # a server that leaks the key into its error message
                msg = {"error": {"message": f"invalid API key {auth.decode()!r}", "code": 401}}
                writer.write(_json_response(401, msg, "Unauthorized"))
                return True
            events = build_events(cfg)
            delay = float(cfg["delay_s"] or 0)
            usage_delay = float(cfg["usage_delay_s"] or 0)
            writer.write(HEAD_SSE)
            if delay or usage_delay or fault in ("split", "truncate"):
                n_role = 1 if cfg["role_chunk"] else 0
                for i, ev in enumerate(events):
                    if fault == "truncate" and i == len(events) // 2:
                        await writer.drain()
                        writer.transport.abort()
                        return False
                    if delay and n_role <= i < n_role + cfg["events"]:
                        await asyncio.sleep(delay)
                    if usage_delay and ev.startswith(
                        b'data: {"id":"chatcmpl-fake","object":"chat.completion.chunk",'
                        b'"created":0,"model":"fake-model","choices":[]'
                    ):
                        await asyncio.sleep(usage_delay)
                    if fault == "split":
                        half = len(ev) // 2
                        writer.write(_frame(ev[:half]))
                        await writer.drain()
                        await asyncio.sleep(0.002)
                        writer.write(_frame(ev[half:]))
                    else:
                        writer.write(_frame(ev))
                    await writer.drain()
            else:
                key = (id(events), int(cfg["events_per_write"]))
                writes = _CACHE_W.get(key)
                if writes is None:
                    writes = _CACHE_W[key] = _writes(events, max(1, int(cfg["events_per_write"])))
                last = len(writes) - 1
                for i, w in enumerate(writes):
                    writer.write(w)
                    if i != last:
                        await writer.drain()
                        await asyncio.sleep(0)  # let other streams interleave, like engine steps
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        finally:
            _STATS["active"] -= 1


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = pick a free port (printed as READY <port>)")
    p.add_argument("--events", type=int, default=64, help="content events per request")
    p.add_argument("--tokens-per-event", type=int, default=1)
    p.add_argument("--events-per-write", type=int, default=4)
    p.add_argument("--no-role-chunk", action="store_true")
    p.add_argument("--no-continuous-usage", action="store_true")
    p.add_argument("--no-usage", action="store_true", help="no final usage chunk")
    p.add_argument("--finish-reason", default="length")
    p.add_argument("--delay-s", type=float, default=0.0, help="delay before each content event")
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--metrics-page", help="serve this file at GET /metrics")
    p.add_argument("--cpu", type=int, default=None, help="pin the server to this CPU")
    p.add_argument("--no-uvloop", action="store_true")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    defaults = {
        "events": args.events, "tokens_per_event": args.tokens_per_event, "events_per_write": args.events_per_write,
        "role_chunk": not args.no_role_chunk, "continuous_usage": not args.no_continuous_usage,
        "include_usage": not args.no_usage, "finish_reason": args.finish_reason, "delay_s": args.delay_s,
        "usage_delay_s": 0.0, "fault": args.fault,
    }  # fmt: skip
    page = None
    if args.metrics_page:
        with open(args.metrics_page, "rb") as fh:
            page = fh.read()
    server = Server(defaults, page)
    srv = await asyncio.start_server(server.handle, args.host, args.port, backlog=4096, limit=1 << 20)
    port = srv.sockets[0].getsockname()[1]
    print(f"READY {port}", flush=True)
    async with srv:
        await srv.serve_forever()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    try:
        if args.no_uvloop:
            raise ImportError
        import uvloop

        uvloop.run(serve(args))
    except ImportError:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
