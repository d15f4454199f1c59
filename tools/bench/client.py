"""The benchmark's HTTP side: a blocking client that times the first streamed token.

Time to first token (TTFT) is measured here, on the client, from just before the
request is sent to the arrival of the first event that carries a token: what a
user of the server waits, queueing and HTTP included. What the server says about
itself (`usage.prompt_tokens_details.cached_tokens`, `timings`) is recorded
beside it when the server sends it; a server that sends neither (llama-cpp-python)
leaves those fields None rather than guessed.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit


class ServerError(RuntimeError):
    """The server answered with an error status or an error event."""


@dataclass
class Measured:
    """One request as the benchmark saw it."""

    ttft_ms: float                        # client-side: send -> first token event
    total_ms: float                       # client-side: send -> end of stream
    text: str                             # the generated text
    prompt_n: int | None = None           # prompt tokens, as the server counted them
    cache_n: int | None = None            # of those, served from its cache
    cache_tier: str | None = None         # ckptd: "host" or "disk" when cache_n > 0
    completion_n: int | None = None
    timings: dict | None = field(default=None, repr=False)   # the server's own figures

    @property
    def computed_n(self) -> int | None:
        if self.prompt_n is None or self.cache_n is None:
            return None
        return self.prompt_n - self.cache_n

    @property
    def server_ttft_ms(self) -> float | None:
        """The server's own account of the same wait: queue + restore + prefill."""
        t = self.timings
        if not t or "prompt_ms" not in t:
            return None
        return sum(float(t.get(k) or 0.0) for k in ("queued_ms", "restore_ms", "prompt_ms"))


class Client:
    """One server (ckptd, llama.cpp's server, llama-cpp-python's server) at a base URL."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0,
                 extra: dict | None = None) -> None:
        parts = urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected an http://HOST:PORT URL, got {url!r}")
        self.url = f"http://{parts.hostname}:{parts.port or 80}"
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.extra = dict(extra or {})      # fields added to every generation request

    def _conn(self, timeout: float | None = None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def request(self, method: str, path: str, body: dict | None = None,
                timeout: float | None = None) -> tuple[int, object]:
        """A plain request; returns (status, decoded JSON or text)."""
        conn = self._conn(timeout)
        try:
            data = None if body is None else json.dumps(body)
            conn.request(method, self.prefix + path, data, self.headers)
            r = conn.getresponse()
            raw = r.read().decode("utf-8", "replace")
            try:
                return r.status, json.loads(raw)
            except ValueError:
                return r.status, raw
        finally:
            conn.close()

    def ready(self) -> bool:
        """True when the server answers /health (llama.cpp, ckptd) or /v1/models
        (llama-cpp-python, which has no /health) with 200."""
        for path in ("/health", "/v1/models"):
            try:
                status, _ = self.request("GET", path, timeout=5.0)
            except OSError:
                return False
            if status == 200:
                return True
            if status != 404:
                return False
        return False

    def wait_ready(self, timeout: float = 120.0, alive=lambda: True) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not alive():
                raise ServerError(f"{self.url} went away before it was ready")
            if self.ready():
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.url} not ready after {timeout:.0f} s")

    def tokenize(self, text: str) -> list[int] | None:
        """Token ids of `text` (no special tokens), or None if the server cannot say.
        ckptd and llama.cpp serve /tokenize; llama-cpp-python serves /extras/tokenize."""
        for path, body in (("/tokenize", {"content": text}), ("/extras/tokenize",
                                                               {"input": text})):
            try:
                status, out = self.request("POST", path, body)
            except OSError:
                return None
            if status == 200 and isinstance(out, dict) and isinstance(out.get("tokens"), list):
                toks = out["tokens"]
                return [t["id"] if isinstance(t, dict) else t for t in toks]
        return None

    def complete(self, prompt: str, max_tokens: int, **fields) -> Measured:
        """POST /v1/completions, streamed, greedy."""
        body = {"prompt": prompt, "max_tokens": max_tokens, **fields}
        return self._stream("/v1/completions", body, chat=False)

    def chat(self, messages: list[dict], max_tokens: int, **fields) -> Measured:
        """POST /v1/chat/completions, streamed, greedy."""
        body = {"messages": messages, "max_tokens": max_tokens, **fields}
        return self._stream("/v1/chat/completions", body, chat=True)

    def _stream(self, path: str, body: dict, chat: bool) -> Measured:
        body = {"temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
                **self.extra, **body}
        conn = self._conn()
        try:
            t0 = time.perf_counter()
            conn.request("POST", self.prefix + path, json.dumps(body), self.headers)
            r = conn.getresponse()
            if r.status != 200:
                raise ServerError(f"POST {path}: HTTP {r.status}: "
                                  f"{r.read().decode('utf-8', 'replace')[:500]}")
            return _read_stream(r, t0, chat)
        finally:
            conn.close()


def _events(resp):
    """The JSON payloads of an SSE stream, up to `data: [DONE]` or the end."""
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _carries_token(ev: dict, chat: bool) -> bool:
    """A token arrived. A chat stream opens with a role-only delta before any token, so
    there a token is non-empty content (or the end, for an answer of zero tokens); a
    text completion sends one event per token, even one whose text is still empty."""
    choices = ev.get("choices") or []
    if not choices:
        return False
    c = choices[0]
    if c.get("finish_reason"):
        return True
    if chat:
        return bool((c.get("delta") or {}).get("content"))
    return "text" in c


def _read_stream(resp, t0: float, chat: bool) -> Measured:
    ttft = None
    text: list[str] = []
    usage = timings = None
    for ev in _events(resp):
        if "error" in ev:
            raise ServerError(f"error event: {ev['error']}")
        if ttft is None and _carries_token(ev, chat):
            ttft = (time.perf_counter() - t0) * 1000
        for c in ev.get("choices") or []:
            piece = (c.get("delta") or {}).get("content") if chat else c.get("text")
            text.append(piece or "")
        usage = ev.get("usage") or usage
        timings = ev.get("timings") or timings
    total = (time.perf_counter() - t0) * 1000
    if ttft is None:
        raise ServerError("the stream ended without a token")
    m = Measured(ttft, total, "".join(text), timings=timings)
    if usage:
        m.prompt_n = usage.get("prompt_tokens")
        m.completion_n = usage.get("completion_tokens")
        m.cache_n = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if timings:
        _apply_timings(m, timings)
    return m


def _apply_timings(m: Measured, t: dict) -> None:
    """Fill what usage left out. `prompt_n` counts only the tokens the server evaluated
    (ckptd and llama.cpp alike), so the prompt is prompt_n + cache_n."""
    cache_n = t.get("cache_n")
    if m.cache_n is None:
        m.cache_n = cache_n
    if m.prompt_n is None and t.get("prompt_n") is not None:
        m.prompt_n = t["prompt_n"] + (cache_n or 0)
    m.cache_tier = t.get("cache_tier")
    if m.completion_n is None:
        m.completion_n = t.get("predicted_n")
