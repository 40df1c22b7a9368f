"""Readiness, idleness and signals: when a started server may be used, and when it must go.

:func:`wait_ready` — the served model is listed on ``GET /v1/models`` *and* one real short chat
completion succeeded, within ``readiness_timeout_s``; an early exit of the server stops the wait.
:class:`IdleWatchdog` and :func:`stop_on_signals` make sure a server never outlives its job.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from contextlib import contextmanager

from specstudy.core.timestamps import utc_now
from specstudy.deployment import DeploymentError
from specstudy.deployment.launch import Server
from specstudy.deployment.redaction import redact_text
from specstudy.measure import prom


def _http(method: str, url: str, body: dict | None = None, timeout: float = 10.0, api_key: str | None = None):
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", errors="replace")


def wait_ready(server: Server, *, timeout_s: float = 900.0, poll_s: float = 1.0,
               probe_messages: list[dict] | None = None, probe_max_tokens: int = 4) -> dict:
    """Block until the model is listed on ``/v1/models`` and one chat completion succeeded.

    Raises :class:`DeploymentError` with ``reason`` ``exited`` (the server died: stops waiting at once),
    ``timeout`` or ``probe_failed``. Returns {seconds, models_seconds, probe: {status, completion_tokens}}.
    """
    t0 = server.started_monotonic
    deadline = time.monotonic() + timeout_s
    listed_at = None
    last_err = None
    messages = probe_messages or [{"role": "user", "content": "Say hello."}]
    probe_failures = 0
    while True:
        rc = server.exited()
        if rc is not None:
            raise DeploymentError(f"server exited with code {rc} before it became ready (see {server.log_path})",
                                  stage="readiness", reason="exited", exit_code=rc)
        if time.monotonic() > deadline:
            raise DeploymentError(f"server not ready after {timeout_s:.0f} s (last error: {last_err})",
                                  stage="readiness", reason="timeout")
        try:
            if listed_at is None:
                status, text = _http("GET", server.base_url + "/v1/models", timeout=5, api_key=server.api_key)
                ids = [m.get("id") for m in json.loads(text).get("data", [])] if status == 200 else []
                if server.served_model_name in ids:
                    listed_at = time.monotonic()
                else:
                    last_err = f"/v1/models status {status}, models {ids}"
            if listed_at is not None:
                body = {"model": server.served_model_name, "messages": messages, "max_tokens": probe_max_tokens,
                        "temperature": 0.0}
                status, text = _http("POST", server.base_url + "/v1/chat/completions", body,
                                     timeout=max(5.0, min(120.0, deadline - time.monotonic())), api_key=server.api_key)
                if status == 200:
                    resp = json.loads(text)
                    if resp.get("choices"):
                        server.ready_at = utc_now()
                        return {"seconds": round(time.monotonic() - t0, 3),
                                "models_seconds": round(listed_at - t0, 3),
                                "probe": {"status": status, "completion_tokens": (resp.get("usage") or {}).get(
                                    "completion_tokens"), "finish_reason": resp["choices"][0].get("finish_reason")}}
                last_err = f"probe chat completion status {status}: {redact_text(text[:300], server.secrets)}"
                probe_failures += 1
                if status in (400, 401, 403, 404) and probe_failures >= 3:
                    raise DeploymentError(f"readiness probe failed: {last_err}", stage="readiness", reason="probe_failed")
        except (OSError, ValueError) as exc:  # connection refused, reset, bad JSON while starting
            last_err = f"{type(exc).__name__}: {exc}"
        time.sleep(poll_s)


# --------------------------------------------------------------------------------------------------
# Idle watchdog and signal handling
# --------------------------------------------------------------------------------------------------
class IdleWatchdog:
    """Stop the server after it sat idle longer than ``idle_s`` seconds (no GPU job idles for hours).

    Activity is a :meth:`touch` by the job or, with ``metrics_url``, any request running or waiting
    on the server: a long cell keeps the server busy, a hung job leaves it idle and gets it stopped.
    """

    def __init__(self, server: Server, idle_s: float, *, grace_s: float = 30.0, check_s: float | None = None,
                 metrics_url: str | None = None, api_key: str | None = None):
        self.server = server
        self.metrics_url = metrics_url
        self.api_key = api_key
        self.idle_s = float(idle_s)
        self.grace_s = grace_s
        self.check_s = check_s if check_s is not None else max(0.05, min(5.0, self.idle_s / 10))
        self._last = time.monotonic()
        self._stop = threading.Event()
        self.fired = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="vllm-idle-watchdog")

    def touch(self) -> None:
        self._last = time.monotonic()

    def _busy(self) -> bool:
        if not self.metrics_url:
            return False
        try:
            g = prom.gauges(prom.fetch_metrics(self.metrics_url, timeout=5, api_key=self.api_key))
        except (prom.MetricsUnavailable, prom.MetricsParseError):
            return False
        return (g["num_requests_running"] or 0) + (g["num_requests_waiting"] or 0) > 0

    def _run(self) -> None:
        while not self._stop.wait(self.check_s):
            if time.monotonic() - self._last > self.idle_s and self._busy():
                self.touch()
            if time.monotonic() - self._last > self.idle_s:
                self.fired = True
                self.server.stop(grace_s=self.grace_s, reason="idle_timeout")
                return

    def __enter__(self) -> IdleWatchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> IdleWatchdog:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.grace_s + 15)


class TerminatedBySignal(SystemExit):
    """Raised in the main thread after SIGTERM/SIGINT stopped the server; exit code 128+signal."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


@contextmanager
def stop_on_signals(server_getter, *, grace_s: float = 30.0, signals=(signal.SIGTERM, signal.SIGINT)):
    """While active, SIGTERM/SIGINT (``scancel``, Ctrl-C) stop the server group, then raise
    :class:`TerminatedBySignal` so the job's ``finally`` blocks write a failure record and exit non-zero.

    ``server_getter`` is a callable returning the current :class:`Server` (or None) — the server may
    be started after the handlers are installed. Must be used from the main thread.
    """
    previous = {}

    def handler(signum, frame):
        srv = server_getter() if callable(server_getter) else server_getter
        if srv is None:
            raise TerminatedBySignal(signum)
        # may interrupt this thread's own Server.stop: that stop finishes, then raises (Server.stop_from_signal)
        srv.stop_from_signal(TerminatedBySignal(signum), grace_s=grace_s, reason=f"signal {signal.Signals(signum).name}")

    for sig in signals:
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, prev in previous.items():
            signal.signal(sig, prev)

