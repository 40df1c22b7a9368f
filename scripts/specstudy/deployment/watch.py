"""Notice at once when a deployment's server dies on its own, and stop what is left of its group.

A vLLM API server killed mid-cell (OOM killer, SIGKILL, a crash) leaves its engine processes
orphaned in the process group and the load generator talking to a closed port. The watch polls the
server process; on an exit the job did not ask for it stops the whole group (so no engine process
outlives the API server), records the exit code and time, and flips :meth:`alive` to False so the
cell stops waiting (drain) and the deployment marks the rest ``deployment_failed``.
"""

from __future__ import annotations

import threading
import time

from specstudy.core.timestamps import utc_now


class ServerDeathWatch:
    def __init__(self, server, *, grace_s: float = 10.0, poll_s: float = 0.2, log=print):
        self.server = server
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.log = log
        self.exit_code: int | None = None
        self.died_at: str | None = None
        self.stop_report: dict | None = None
        self._died = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="vllm-death-watch")

    def start(self) -> ServerDeathWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._closed.wait(self.poll_s):
            code = self.server.exited()
            if code is None:
                continue
            if self._stopped_by_us():  # watchdog, signal handler or end of job: no crash
                return
            self.exit_code = code
            self.died_at = utc_now()
            self._died.set()
            self.log(f"server exited unexpectedly with code {code}; stopping what is left of its process group")
            self.stop_report = self.server.stop(grace_s=self.grace_s, reason=f"server exited ({code})")
            return

    def _stopped_by_us(self) -> bool:
        stopping = getattr(self.server, "stopping", None)
        return self.server.stop_report is not None or bool(stopping)

    @property
    def died(self) -> bool:
        return self._died.is_set()

    def alive(self) -> bool:
        """False once the server died on its own (also checked directly, so no poll interval is lost)."""
        if self._died.is_set():
            return False
        if self.server.exited() is not None and not self._stopped_by_us():
            self._wait_for_watch()
            return not self._died.is_set()
        return True

    def _wait_for_watch(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self._thread.is_alive() and not self._died.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self._closed.set()
        if self._thread.is_alive() and not self._died.is_set():
            self._thread.join(timeout=2)
