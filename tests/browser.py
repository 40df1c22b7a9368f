"""Open an HTML file in headless Chromium through the DevTools protocol; report what a reader would see.

:func:`inspect_page` starts ``chromium --headless --remote-debugging-port=0`` with a throwaway
profile, opens the page, waits for its load event (and for every image to settle), then returns:

- ``console_errors``: console.error calls, uncaught exceptions and browser log entries of level
  error (a missing image shows up here as "Failed to load resource: net::ERR_FILE_NOT_FOUND");
- ``broken_images``: ``<img>`` elements not complete or with naturalWidth 0 (src of each);
- ``images``, ``tables``, ``figcaptions``, ``headings`` (h1/h2 texts in page order);
- ``screenshot``: path of a full-page PNG.

Only the standard library and aiohttp (a dependency of the load generator) are used.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

PAGE_CHECK = """(() => {
  const imgs = [...document.images];
  return JSON.stringify({
    images: imgs.length,
    broken_images: imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.getAttribute('src')),
    tables: document.querySelectorAll('table').length,
    figcaptions: [...document.querySelectorAll('figcaption')].map(f => f.textContent),
    headings: [...document.querySelectorAll('h1,h2')].map(h => h.textContent),
    width: Math.ceil(document.documentElement.scrollWidth),
    height: Math.ceil(document.documentElement.scrollHeight),
  });
})()"""


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _start(binary: str, profile_dir: str) -> tuple[subprocess.Popen, str]:
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           "--no-default-browser-check", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
           f"--user-data-dir={profile_dir}", "--allow-file-access-from-files", "about:blank"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        m = re.search(r"DevTools listening on (ws://\S+)", line)
        if m:
            # keep draining stderr so a chatty browser never blocks on a full pipe
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(1)
    proc.kill()
    raise RuntimeError(f"chromium did not start a DevTools endpoint within 60 s: {''.join(seen)[-2000:]}")


async def _inspect(browser_ws: str, url: str, screenshot: Path, timeout_s: float) -> dict:
    import aiohttp

    port = re.search(r":(\d+)/", browser_ws).group(1)
    async with aiohttp.ClientSession() as http:
        async with http.put(f"http://127.0.0.1:{port}/json/new?about:blank") as r:
            target = await r.json(content_type=None)
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 1_000_000))
            pending: dict[int, asyncio.Future] = {}
            events: list[dict] = []
            loaded = asyncio.Event()

            async def reader():
                async for msg in ws:
                    data = json.loads(msg.data)
                    if "id" in data and data["id"] in pending:
                        pending.pop(data["id"]).set_result(data)
                    else:
                        events.append(data)
                        if data.get("method") == "Page.loadEventFired":
                            loaded.set()

            task = asyncio.create_task(reader())

            async def call(method: str, **params) -> dict:
                i = next(ids)
                fut = asyncio.get_running_loop().create_future()
                pending[i] = fut
                await ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
                res = await asyncio.wait_for(fut, timeout_s)
                if "error" in res:
                    raise RuntimeError(f"{method}: {res['error']}")
                return res.get("result", {})

            for domain in ("Page", "Runtime", "Log"):
                await call(f"{domain}.enable")
            await call("Page.navigate", url=url)
            await asyncio.wait_for(loaded.wait(), timeout_s)
            # every image settled (load or error event fired) before the page is judged
            await call("Runtime.evaluate", awaitPromise=True, expression=(
                "Promise.all([...document.images].map(i => i.complete ? 0 : "
                "new Promise(r => { i.onload = i.onerror = r; })))"))
            res = await call("Runtime.evaluate", expression=PAGE_CHECK, returnByValue=True)
            page = json.loads(res["result"]["value"])
            await call("Emulation.setDeviceMetricsOverride", width=1200, height=min(page["height"], 16000),
                       deviceScaleFactor=1, mobile=False)
            shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            # No fixed wait for late events: a round trip is a barrier (the browser sends a session's messages
            # in order, so every event emitted before its answer has been read into ``events``), repeated until
            # each broken image's load failure has been logged too (those entries may come after the page
            # settled), for at most ``timeout_s``.
            deadline = asyncio.get_running_loop().time() + timeout_s
            while True:
                await call("Runtime.evaluate", expression="0")
                failures = [ev for ev in events if ev.get("method") == "Log.entryAdded"
                            and (ev.get("params") or {}).get("entry", {}).get("source") == "network"]
                if len(failures) >= len(page["broken_images"]) or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
            task.cancel()
    errors = []
    for ev in events:
        m, p = ev.get("method"), ev.get("params") or {}
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description")))
                                                                 for a in p.get("args") or []))
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails") or {}
            errors.append("exception: " + str((d.get("exception") or {}).get("description") or d.get("text")))
        elif m == "Log.entryAdded" and (p.get("entry") or {}).get("level") == "error":
            e = p["entry"]
            errors.append(f"log: {e.get('text')} {e.get('url') or ''}".strip())
    return {**page, "console_errors": errors, "screenshot": str(screenshot)}


def inspect_page(html: str | os.PathLike, screenshot: str | os.PathLike, *, binary: str | None = None,
                 timeout_s: float = 60.0) -> dict:
    binary = binary or find_chromium()
    if not binary:
        raise FileNotFoundError(f"no Chromium found (looked for {', '.join(CANDIDATES)})")
    url = Path(html).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="specstudy-chromium-") as profile_dir:
        proc, ws = _start(binary, profile_dir)
        try:
            return asyncio.run(_inspect(ws, url, Path(screenshot), timeout_s))
        finally:
            try:
                os.killpg(proc.pid, 15)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
