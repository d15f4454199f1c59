"""A real daemon process on loopback for the HTTP tests, and a small blocking client."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Response:
    def __init__(self, status: int, headers: dict, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @property
    def json(self):
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()

    def sse(self) -> list:
        """The `data:` payloads of an event stream, JSON-decoded except [DONE]."""
        out = []
        for frame in self.text.split("\n\n"):
            # a frame may name its event first ("event: ...\ndata: ...")
            data = next((line[len("data: "):] for line in frame.split("\n")
                         if line.startswith("data: ")), None)
            if data is not None:
                out.append(data if data == "[DONE]" else json.loads(data))
        return out


class Daemon:
    def __init__(self, model: Path | None, cache_dir: Path, *args: str,
                 env: dict | None = None, wrap: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.cache_dir = cache_dir
        self.log_path = cache_dir.parent / f"daemon-{self.port}.log"
        # `wrap` runs the daemon inside another command (a private mount namespace with
        # a tiny or read-only filesystem): it must exec the daemon, keeping the pid.
        cmd = [*wrap, sys.executable, "-m", "ckptd.tools.cli", "serve", "--port", str(self.port),
               "--cache-dir", str(cache_dir), *args]
        if model is not None:
            cmd += ["--model", str(model)]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        self.headers: dict[str, str] = {}

    def output(self) -> str:
        """What the daemon printed (also after stop(), for a failure message)."""
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 90.0) -> list[int]:
        """Poll /health until 200; returns every status seen (503 while loading)."""
        seen: list[int] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.output()}")
            try:
                status = self.request("GET", "/health", timeout=5).status
            except OSError:
                time.sleep(0.05)
                continue
            seen.append(status)
            if status == 200:
                return seen
            time.sleep(0.05)
        raise TimeoutError(f"daemon not ready after {timeout} s:\n{self.output()}")

    def request(self, method: str, path: str, body=None, raw: bytes | None = None,
                headers: dict | None = None, timeout: float = 90.0) -> Response:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = raw if raw is not None else (None if body is None else json.dumps(body))
            hdrs = {**self.headers, **(headers or {})}
            if data is not None:
                hdrs.setdefault("Content-Type", "application/json")
            conn.request(method, path, data, hdrs)
            r = conn.getresponse()
            return Response(r.status, dict(r.getheaders()), r.read())
        finally:
            conn.close()

    def post(self, path: str, body=None, **kw) -> Response:
        return self.request("POST", path, body, **kw)

    def get(self, path: str, **kw) -> Response:
        return self.request("GET", path, **kw)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def start(model: Path | None, cache_dir: Path, *args: str, **kw) -> Daemon:
    d = Daemon(model, cache_dir, *args, **kw)
    try:
        d.wait_ready()
    except BaseException:
        d.stop()
        raise
    return d
