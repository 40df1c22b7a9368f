"""The telemetry sampler in a process of its own, beside the load generator (issue 28 item 6).

A cell's :class:`~specstudy.measure.telemetry.TelemetrySampler` parses the whole ``/metrics`` page (~13 ms of
CPU on a real vLLM 0.23 page), walks the server's process group with psutil (1–5 ms) and reads NVML once a
second. In the load generator's process that work holds the GIL while the client's event loop is timing
streamed tokens: on the H200 (2026-12-03) it put 22–61 ms stalls into the loop during measured windows and
four cells were rejected as client-limited by the tool's own telemetry. :class:`SamplerProcess` runs the same
sampler, unchanged, in a child process (one per deployment job, started before the first cell), so nothing
of it runs under the load generator's GIL.

Protocol: one JSON object per line on the child's stdin, one reply line on its stdout —
``{"op": "ping"}``, ``{"op": "begin", "args": {...TelemetrySampler keyword arguments...}}``,
``{"op": "end"}`` (reply ``{"ok": true, "summary": {...}}``); a reply ``{"ok": false, "error": ...}`` on
failure. End of stdin stops a running sampler and ends the child. ``python -m
specstudy.measure.telemetry_worker`` is the child.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

#: What :meth:`SamplerProcess.begin` passes on (the JSON-serialisable keyword arguments of the sampler).
SAMPLER_ARGS = ("out_path", "metrics_url", "pgid", "root_pid", "interval_s", "gpu", "api_key", "http_timeout_s")


class WorkerError(RuntimeError):
    """The sampler process did not answer, answered with an error, or is gone."""


class SamplerProcess:
    """A telemetry child process serving one sampler at a time (``begin`` … ``end``)."""

    def __init__(self, *, python: str = sys.executable, start_timeout_s: float = 60.0, reply_timeout_s: float = 30.0):
        scripts = str(Path(__file__).resolve().parents[2])  # the directory holding the specstudy package
        env = dict(os.environ)
        env["PYTHONPATH"] = scripts + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        self.reply_timeout_s = reply_timeout_s
        self._p = subprocess.Popen([python, "-m", "specstudy.measure.telemetry_worker"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
        self.pid = self._call({"op": "ping"}, start_timeout_s)["pid"]

    def _call(self, msg: dict, timeout_s: float) -> dict:
        if self._p.poll() is not None:
            raise WorkerError(f"telemetry worker exited with code {self._p.returncode}")
        try:
            self._p.stdin.write(json.dumps(msg) + "\n")
            self._p.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerError(f"telemetry worker: cannot send {msg['op']!r}: {exc}") from exc
        ready, _, _ = select.select([self._p.stdout], [], [], timeout_s)
        line = self._p.stdout.readline() if ready else ""
        if not line:
            raise WorkerError(f"telemetry worker: no reply to {msg['op']!r} within {timeout_s:.0f} s"
                              if not ready else f"telemetry worker ended (code {self._p.poll()}) during {msg['op']!r}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise WorkerError(f"telemetry worker: {msg['op']!r} failed: {reply.get('error')}")
        return reply

    def begin(self, args: dict[str, Any]) -> None:
        unknown = set(args) - set(SAMPLER_ARGS)
        if unknown:
            raise ValueError(f"telemetry worker: not a sampler argument: {sorted(unknown)}")
        self._call({"op": "begin", "args": args}, self.reply_timeout_s)

    def end(self, timeout_s: float) -> dict:
        return self._call({"op": "end"}, timeout_s)["summary"]

    def alive(self) -> bool:
        return self._p.poll() is None

    def close(self) -> None:
        if self._p.poll() is None:
            try:
                self._p.stdin.close()  # end of input: the child stops a running sampler and exits
                self._p.wait(timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                self._p.kill()
                self._p.wait()
        for f in (self._p.stdin, self._p.stdout):
            try:
                f.close()
            except OSError:
                pass

    def __enter__(self) -> SamplerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve(stdin=sys.stdin, stdout=sys.stdout) -> int:
    """The child's loop: one request line in, one reply line out."""
    from specstudy.measure.telemetry import TelemetrySampler

    sampler = None

    def reply(obj: dict) -> None:
        stdout.write(json.dumps(obj, sort_keys=True) + "\n")
        stdout.flush()

    for line in stdin:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
            op = msg.get("op")
            if op == "ping":
                reply({"ok": True, "pid": os.getpid()})
            elif op == "begin":
                if sampler is not None:
                    raise RuntimeError("a sampler is already running (end it first)")
                sampler = TelemetrySampler(**msg["args"]).start()
                reply({"ok": True})
            elif op == "end":
                if sampler is None:
                    raise RuntimeError("no sampler is running")
                summary, sampler = sampler.stop(), None
                reply({"ok": True, "summary": summary})
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:  # noqa: BLE001 - every failure is a reply, the child stays
            reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    if sampler is not None:
        sampler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
