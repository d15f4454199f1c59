"""A headless Chromium driven over the DevTools protocol, for testing the daemon's page
and taking its picture: aiohttp's websocket client, no browser download (Debian's
`chromium` package; tools/setup.sh --test installs it).

    async with Chromium() as page:
        await page.goto("http://127.0.0.1:8080/")
        n = await page.eval("document.querySelectorAll('[data-node]').length")
        await page.screenshot("page.png")

Errors the page throws and what it logs to the console are collected (`errors`,
`console`), so a test can assert that none came.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-breakpad", "--disable-crash-reporter",
         "--hide-scrollbars", "--mute-audio")
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    env = os.environ.get("CKPTD_CHROMIUM")
    if env:
        return env
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


class BrowserError(RuntimeError):
    pass


def _die_with_parent() -> None:
    """In the child before exec: Linux kills the browser when the process that started
    it dies, however it dies (a test run killed by a timeout leaves no browser)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)    # PR_SET_PDEATHSIG


class Chromium:
    def __init__(self, binary: str | None = None, width: int = 1440, height: int = 900,
                 scale: float = 1.0, timeout: float = 30.0) -> None:
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise BrowserError("no Chromium found: install Debian's `chromium` package "
                               "(tools/setup.sh --test does), or set CKPTD_CHROMIUM")
        self.width, self.height, self.scale, self.timeout = width, height, scale, timeout
        self.errors: list[str] = []
        self.console: list[str] = []
        self._next = 0
        self._waiting: dict[int, asyncio.Future] = {}
        self._events: dict[str, list[asyncio.Future]] = {}

    async def __aenter__(self) -> Chromium:
        self.dir = tempfile.mkdtemp(prefix="ckptd-chromium-")
        self.log = open(Path(self.dir) / "stderr.log", "wb")
        self.proc = subprocess.Popen([self.binary, *FLAGS, f"--user-data-dir={self.dir}/profile",
                                      "--remote-debugging-port=0",
                                      f"--window-size={self.width},{self.height}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=self.log,
                                     preexec_fn=_die_with_parent)
        try:
            port = await self._port()
            self.http = aiohttp.ClientSession()
            async with self.http.get(f"http://127.0.0.1:{port}/json/list") as r:
                target = next(t for t in await r.json() if t["type"] == "page")
            self.ws = await self.http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
            self.reader = asyncio.ensure_future(self._read())
            for domain in ("Page", "Runtime"):
                await self.send(f"{domain}.enable")
            await self.send("Emulation.setDeviceMetricsOverride", width=self.width,
                            height=self.height, deviceScaleFactor=self.scale, mobile=False)
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _port(self) -> int:
        """Chromium writes the port it chose to DevToolsActivePort in its profile."""
        path = Path(self.dir) / "profile" / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrowserError(f"chromium exited with {self.proc.returncode}: "
                                   f"{self.stderr()[-2000:]}")
            with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
                return int(path.read_text().split()[0])
            await asyncio.sleep(0.05)
        raise BrowserError(f"chromium did not open its DevTools port: {self.stderr()[-2000:]}")

    def stderr(self) -> str:
        self.log.flush()
        return (Path(self.dir) / "stderr.log").read_text(errors="replace")

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data:
                fut = self._waiting.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
                continue
            method, params = data.get("method"), data.get("params", {})
            if method == "Runtime.exceptionThrown":
                d = params["exceptionDetails"]
                self.errors.append(d.get("exception", {}).get("description") or d.get("text"))
            elif method == "Runtime.consoleAPICalled":
                self.console.append(f"{params['type']}: " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in params["args"]))
            for fut in self._events.pop(method, []):
                if not fut.done():
                    fut.set_result(params)

    async def send(self, method: str, **params) -> dict:
        self._next += 1
        fut = asyncio.get_running_loop().create_future()
        self._waiting[self._next] = fut
        await self.ws.send_str(json.dumps({"id": self._next, "method": method,
                                           "params": params}))
        reply = await asyncio.wait_for(fut, self.timeout)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply["result"]

    def event(self, method: str) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._events.setdefault(method, []).append(fut)
        return fut

    async def goto(self, url: str) -> None:
        loaded = self.event("Page.loadEventFired")
        out = await self.send("Page.navigate", url=url)
        if out.get("errorText"):
            raise BrowserError(f"{url}: {out['errorText']}")
        await asyncio.wait_for(loaded, self.timeout)

    async def eval(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited)."""
        out = await self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                              awaitPromise=True)
        if "exceptionDetails" in out:
            d = out["exceptionDetails"]
            raise BrowserError(d.get("exception", {}).get("description") or d.get("text"))
        return out["result"].get("value")

    async def wait_for(self, expression: str, timeout: float | None = None, every: float = 0.1):
        """Poll until the expression is truthy; returns its value."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            value = await self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for: {expression}")
            await asyncio.sleep(every)

    async def screenshot(self, path: str | Path, full_page: bool = True) -> None:
        params: dict = {"format": "png"}
        if full_page:
            size = (await self.send("Page.getLayoutMetrics"))["cssContentSize"]
            params.update(captureBeyondViewport=True, clip={
                "x": 0, "y": 0, "width": self.width, "height": size["height"], "scale": 1})
        shot = await self.send("Page.captureScreenshot", **params)
        Path(path).write_bytes(base64.b64decode(shot["data"]))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.send("Browser.close"), 5)
        for name in ("ws", "http"):
            obj = getattr(self, name, None)
            if obj is not None:
                await obj.close()
        if getattr(self, "reader", None) is not None:
            self.reader.cancel()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
