"""A ckptd daemon the benchmark starts, stops and restarts itself.

It runs `python -m ckptd.tools.cli serve` as a child process on a free loopback port,
its output in a log file beside the results. Stopping sends SIGTERM, which makes
the daemon flush its cache writer before it exits, so a restart on the same
--cache-dir finds every entry on disk and nothing in RAM: the disk tier.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from ckptd.tools.bench.client import Client

ROOT = Path(__file__).resolve().parents[2]          # the checkout: tools/bench/../..


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(log_path: Path, line: str, cmd, **popen) -> subprocess.Popen:
    """Start a server process in ROOT, its output appended to log_path after `$ line`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"$ {line}\n".encode())
        log.flush()
        # The child keeps its own copy of the descriptor; ours can close now.
        return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, **popen)


class ManagedDaemon:
    def __init__(self, model: str | None, cache_dir: Path, log_path: Path,
                 serve_args: list[str] | None = None, ready_timeout: float = 300.0) -> None:
        self.model, self.cache_dir, self.log_path = model, cache_dir, log_path
        self.serve_args = list(serve_args or [])
        self.ready_timeout = ready_timeout
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.client = Client(f"http://127.0.0.1:{self.port}")
        self.starts = 0

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "ckptd.tools.cli", "serve", "--port", str(self.port),
               "--cache-dir", str(self.cache_dir), *self.serve_args]
        if self.model is not None:
            cmd += ["--model", str(self.model)]
        return cmd

    def start(self) -> Client:
        assert self.proc is None, "already running"
        self.proc = spawn(self.log_path, " ".join(self.command()), self.command(),
                          env=dict(os.environ))
        self.starts += 1
        try:
            self.client.wait_ready(self.ready_timeout, alive=lambda: self.proc.poll() is None)
        except BaseException as e:
            self.stop()
            raise RuntimeError(f"the daemon did not start ({e}); its log:\n{self.tail()}") from e
        return self.client

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait (the daemon flushes its cache writer before it exits)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL: no drain, no flush; only what LMDB committed survives."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self) -> Client:
        code = self.stop()
        if code != 0:
            raise RuntimeError(f"the daemon exited with {code} on SIGTERM; its log:\n"
                               f"{self.tail()}")
        return self.start()

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> ManagedDaemon:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class ManagedPeer:
    """A peer server (llama.cpp's, llama-cpp-python's) the benchmark starts and restarts
    itself, from a shell command whose `{port}` is filled with a free loopback port.
    Its output goes to a log file; stopping sends SIGTERM to its process group."""

    def __init__(self, command: str, log_path: Path, ready_timeout: float = 300.0) -> None:
        if "{port}" not in command:
            raise ValueError("--peer-command must contain {port}, where the peer listens")
        self.template = command
        self.log_path, self.ready_timeout = log_path, ready_timeout
        self.proc: subprocess.Popen | None = None
        self._new_port()

    def _new_port(self) -> None:
        self.port = free_port()
        self.cmd = self.template.replace("{port}", str(self.port))
        self.client = Client(f"http://127.0.0.1:{self.port}")

    def start(self) -> Client:
        self.proc = spawn(self.log_path, self.cmd, self.cmd, shell=True,
                          start_new_session=True)
        try:
            self.client.wait_ready(self.ready_timeout, alive=lambda: self.proc.poll() is None)
        except BaseException as e:
            self.stop()
            raise RuntimeError(f"the peer did not start ({e}); see {self.log_path}") from e
        return self.client

    def stop(self, timeout: float = 60.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def kill(self) -> None:
        """SIGKILL to its process group; the next start takes a new port (the old one
        may still be held a while)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._new_port()

    def restart(self) -> Client:
        """Stop, then start on a new port: llama-cpp-python's server restarted on the
        port it had fails every streamed request (seen with 0.3.36)."""
        self.stop()
        self._new_port()
        return self.start()

    def __enter__(self) -> ManagedPeer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
