"""Live progress of one deployment job, and the phase timeline its record keeps.

A :class:`Progress` writes plain, flushed lines to the job's stdout (Snakemake sends it to the job
log, so ``tail -f results/logs/<phase>/<arm>/<rep>.log`` shows them as they happen):

    [progress 00:02:13] cell 3/6 code c4 | measure | requests 7/12 | 41.3 out tok/s | ETA 00:01:05

- a line at every phase change (launching, ready, smoke, cell i/N warm-up/measure/drain, capacity
  step, stopping) and a heartbeat line every ``interval_s`` (default 5 s) while nothing else was
  printed, so a silent phase (a server loading weights) still shows it is alive;
- when stdout is a terminal (someone ran ``specstudy deployment run`` by hand), a ``rich`` live
  status line replaces the heartbeat lines;
- ``SPECSTUDY_PROGRESS_TTY=1`` (``make study`` sets it) also writes every line, prefixed by the
  deployment id, to the controlling terminal (``/dev/tty``) when there is one: Snakemake shows only
  its own job lines, so this is how a user watching ``make study`` sees the jobs' progress.

The phase timeline (:meth:`Progress.timeline`) is stored in ``deployment.json`` as ``phases``:
``[{"phase", "start", "end", "cell"?}, ...]`` with UTC ISO timestamps. The report's duty cycle
(:mod:`specstudy.study.duty`) is computed from it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from typing import TextIO

from specstudy.core.timestamps import utc_iso

# Phases of a deployment, in the order they happen. ``warmup``/``measure``/``drain`` repeat per cell.
PHASES = ("launch", "smoke", "sampled_capture", "warmup", "measure", "drain", "capacity", "memory_sweep", "profile", "stop")


def _hms(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "--:--:--"
    s = int(round(seconds))
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _open_tty() -> TextIO | None:
    if os.environ.get("SPECSTUDY_PROGRESS_TTY") != "1":
        return None
    try:
        return open("/dev/tty", "w", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed in close()
    except OSError:
        return None


class Progress:
    """Progress of one deployment job: phase lines, request counts, output tokens/s and ETA.

    Thread-safe: ``request_done`` is called from the load generator's event loop thread, the
    heartbeat runs in its own daemon thread. ``clock``/``stream`` are injectable for tests.
    """

    def __init__(self, label: str, *, stream: TextIO | None = None, interval_s: float = 5.0,
                 total_requests: int | None = None, live: bool | None = None, clock=time.time):
        self.label = label
        self.stream = stream if stream is not None else sys.stdout
        self.interval_s = float(interval_s)
        self.clock = clock
        self.t0 = clock()
        self.total_requests = total_requests
        self.requests_done = 0
        self.phase_name = "starting"
        self.detail = ""
        self.context = ""  # e.g. "cell 3/6 code c4", set by the deployment job
        self._events: list[dict] = []
        self._open: dict | None = None
        self._tokens: deque[tuple[float, int]] = deque()
        self._cell_done = 0
        self._cell_total: int | None = None
        self._req_time = 0.0  # seconds spent in warm-up/measure windows (for the ETA)
        self._req_in_window = 0
        self._window_t0: float | None = None
        self._lock = threading.RLock()
        self._last_line = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tty = _open_tty()
        is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._live = None
        if live if live is not None else is_tty:
            try:
                from rich.console import Console

                self._live = Console(file=self.stream).status("", spinner="dots")
                self._live.start()
            except Exception:  # rich missing or not a terminal after all: plain lines
                self._live = None

    # ---------------------------------------------------------------- lines
    def status_line(self) -> str:
        with self._lock:
            now = self.clock()
            parts = ([self.context] if self.context else []) + [self.phase_name + (f" {self.detail}" if self.detail else "")]
            if self._cell_total is not None:
                parts.append(f"requests {self._cell_done}/{self._cell_total}")
            if self.total_requests:
                parts.append(f"deployment requests {self.requests_done}/{self.total_requests}")
            tps = self.tokens_per_second(now)
            parts.append(f"{tps:.1f} out tok/s" if tps is not None else "– out tok/s")
            parts.append(f"elapsed {_hms(now - self.t0)}")
            parts.append(f"ETA {_hms(self.eta_seconds(now))}")
            return " | ".join(parts)

    def log(self, message: str) -> None:
        """A plain message line (the job's own log lines go through here too)."""
        self._emit(message, prefix="")

    def _emit(self, text: str, prefix: str = "[progress {t}] ") -> None:
        with self._lock:
            now = self.clock()
            line = prefix.format(t=_hms(now - self.t0)) + text
            if self._live is not None:
                self._live.console.print(line, highlight=False, markup=False)
                self._live.update(self.status_line())
            else:
                print(line, file=self.stream, flush=True)
            if self._tty is not None:
                try:
                    print(f"[{self.label}] {line}", file=self._tty, flush=True)
                except OSError:
                    self._tty = None
            self._last_line = now

    def tick(self) -> None:
        """A status line now (plain mode) / the live status refreshed (terminal mode)."""
        if self._live is not None:
            with self._lock:
                self._live.update(self.status_line())
                self._last_line = self.clock()
        else:
            self._emit(self.status_line())

    # ---------------------------------------------------------------- phases
    def phase(self, name: str, detail: str = "", *, cell: str | None = None) -> None:
        """Enter phase ``name`` (ends the open one) and print a line."""
        with self._lock:
            now = self.clock()
            self._close(now)
            self.phase_name, self.detail = name, detail
            if name not in ("warmup", "measure", "drain"):
                self._cell_total = None  # request counts belong to a cell's windows only
            if name in PHASES:
                self._open = {"phase": name, "start": now, "cell": cell}
            if name in ("warmup", "measure"):
                self._window_t0 = now
            self._emit(self.status_line())

    def set_context(self, text: str) -> None:
        with self._lock:
            self.context = text

    def end_phase(self) -> None:
        with self._lock:
            self._close(self.clock())

    def _close(self, now: float) -> None:
        if self._open is not None:
            ev = {"phase": self._open["phase"], "start": utc_iso(self._open["start"]), "end": utc_iso(now),
                  "seconds": round(now - self._open["start"], 3)}
            if self._open.get("cell"):
                ev["cell"] = self._open["cell"]
            self._events.append(ev)
            self._open = None
        if self._window_t0 is not None:
            self._req_time += now - self._window_t0
            self._window_t0 = None

    def timeline(self) -> list[dict]:
        """The closed phases so far, in order (what ``deployment.json`` stores as ``phases``)."""
        with self._lock:
            return [dict(e) for e in self._events]

    # ---------------------------------------------------------------- requests
    def start_requests(self, total: int) -> None:
        """A request window (warm-up or measure) of ``total`` requests begins."""
        with self._lock:
            self._cell_done, self._cell_total = 0, int(total)

    def request_done(self, row: dict | None = None) -> None:
        """One request finished (called by the load generator for every row)."""
        with self._lock:
            now = self.clock()
            self._cell_done += 1
            self.requests_done += 1
            self._req_in_window += 1
            toks = (row or {}).get("completion_tokens")
            if toks:
                self._tokens.append((now, int(toks)))
            if now - self._last_line >= self.interval_s:
                self.tick()
            elif self._live is not None:
                self._live.update(self.status_line())

    def tokens_per_second(self, now: float | None = None, window_s: float = 10.0) -> float | None:
        now = self.clock() if now is None else now
        with self._lock:
            while self._tokens and self._tokens[0][0] < now - window_s:
                self._tokens.popleft()
            if not self._tokens:
                return None
            span = max(now - self._tokens[0][0], 1.0)
            return sum(t for _, t in self._tokens) / span

    def eta_seconds(self, now: float | None = None) -> float | None:
        """Time left for this deployment's requests at the pace seen so far (None before any request)."""
        now = self.clock() if now is None else now
        with self._lock:
            if not self.total_requests or not self.requests_done:
                return None
            spent = self._req_time + (now - self._window_t0 if self._window_t0 is not None else 0.0)
            if spent <= 0:
                return None
            left = max(self.total_requests - self.requests_done, 0)
            return left * spent / self.requests_done

    # ---------------------------------------------------------------- heartbeat
    def start(self) -> Progress:
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="specstudy-progress", daemon=True)
            self._thread.start()
        return self

    def _beat(self) -> None:
        step = min(0.5, self.interval_s / 2)
        while not self._stop.wait(step):
            with self._lock:
                due = self.clock() - self._last_line >= self.interval_s
            if due:
                self.tick()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self._close(self.clock())
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self._tty is not None:
            try:
                self._tty.close()
            except OSError:
                pass
            self._tty = None

    def __enter__(self) -> Progress:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
