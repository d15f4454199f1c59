"""One load-test request: what to send (Job), how it went (Outcome), and the HTTP exchange.

Every answer is greedy with ignore_eos, so the tokens are a function of the prompt
alone and a cached answer can be compared with an uncached one.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field, replace

import aiohttp

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/completion")


@dataclass(frozen=True)
class Job:
    endpoint: str
    prompt: str
    max_tokens: int
    stream: bool = False
    use_cache: bool = True
    cancel_after: float | None = None   # streams: chunks read; others: seconds waited

    def ref_key(self) -> str:
        return f"{self.endpoint}\0{self.max_tokens}\0{self.prompt}"

    def uncached(self) -> Job:
        return replace(self, stream=False, use_cache=False, cancel_after=None)

    def body(self) -> dict:
        common = {"temperature": 0, "ignore_eos": True, "stream": self.stream}
        if self.endpoint == "/completion":
            # llama-server's /completion sends token ids only when asked to
            return {**common, "prompt": self.prompt, "n_predict": self.max_tokens,
                    "cache_prompt": self.use_cache, "return_tokens": True}
        out = {**common, "max_tokens": self.max_tokens, "cache": self.use_cache}
        if self.stream:
            out["stream_options"] = {"include_usage": True}
        if self.endpoint == "/v1/chat/completions":
            return {**out, "messages": [{"role": "user", "content": self.prompt}]}
        return {**out, "prompt": self.prompt}


@dataclass
class Outcome:
    endpoint: str
    status: int = 0                   # 0: no HTTP answer (reset, timeout)
    code: str | None = None           # the error body's code
    error: str | None = None
    cancelled: bool = False
    tokens: list = field(default_factory=list)   # ids from /completion, else text pieces
    cached_tokens: int = 0
    ttft_s: float | None = None
    latency_s: float = 0.0
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and not self.cancelled

    @property
    def answer(self) -> tuple | str:
        """What must match an uncached run: token ids, or the text where none are given."""
        if self.endpoint == "/completion":
            return tuple(self.tokens)
        return "".join(self.tokens)


def make_job(rng: random.Random, docs: list[str], words: list[str], args, tag: str) -> Job:
    question = " ".join(rng.choice(words) for _ in range(rng.randint(2, 8)))
    if rng.random() < args.cached:
        prompt = f"{rng.choice(docs)}\nQ: {question}"
    else:                             # unique: the tag makes it a miss
        prompt = f"{tag} " + " ".join(rng.choice(words) for _ in range(rng.randint(10, 30)))
    stream = rng.random() < args.stream
    cancel = None
    if rng.random() < args.cancel:
        cancel = float(rng.randint(1, 3)) if stream else rng.uniform(0.05, 1.0)
    return Job(rng.choice(ENDPOINTS), prompt, args.max_tokens, stream, True, cancel)


async def run_job(session: aiohttp.ClientSession, url: str, job: Job,
                  timeout: float) -> Outcome:
    out = Outcome(job.endpoint)
    t0 = time.monotonic()
    try:
        coro = _exchange(session, url + job.endpoint, job, out, t0)
        if job.cancel_after is not None and not job.stream:
            try:
                await asyncio.wait_for(coro, min(job.cancel_after, timeout))
            except asyncio.TimeoutError:
                out.cancelled = True             # we hung up: the daemon cancels it
        else:
            await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError:
        out.error = f"no answer within {timeout} s"
    except (aiohttp.ClientError, ConnectionError, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"
    out.latency_s = time.monotonic() - t0
    return out


async def _exchange(session: aiohttp.ClientSession, url: str, job: Job, out: Outcome,
                    t0: float) -> None:
    async with session.post(url, json=job.body()) as resp:
        out.status = resp.status
        if resp.status != 200:
            _error(out, await resp.read(), resp.headers.get("Retry-After"))
            return
        if not job.stream:
            _whole(out, job, json.loads(await resp.read()))
            return
        chunks = 0
        done = False
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                out.error = f"stream error: {ev['error'].get('message')}"
                out.code = ev["error"].get("code")
                return
            if _chunk(out, job, ev) and out.ttft_s is None:
                out.ttft_s = time.monotonic() - t0
            chunks += 1
            if job.cancel_after is not None and chunks >= job.cancel_after:
                out.cancelled = True
                resp.close()                     # hang up mid-stream
                return
            if job.endpoint == "/completion" and ev.get("stop"):
                done = True
                break
        if not done:
            out.error = "the stream ended without its final event"
        elif job.endpoint != "/v1/chat/completions" and len(out.tokens) != job.max_tokens:
            # (chat streams leave out tokens that add no text)
            out.error = f"{len(out.tokens)} tokens streamed, asked for {job.max_tokens}"


def _error(out: Outcome, body: bytes, retry_after: str | None) -> None:
    try:
        err = json.loads(body)["error"]
        out.code, out.error = err.get("code"), err.get("message") or "error"
    except (ValueError, KeyError, TypeError):
        out.error = f"a {out.status} without a JSON error body"
    if out.code == "queue_full" and retry_after is None:
        out.code, out.error = "no_retry_after", "a full queue answered without Retry-After"
    if retry_after is not None:
        try:
            out.retry_after = float(retry_after)
        except ValueError:
            out.error = f"bad Retry-After {retry_after!r}"


def _whole(out: Outcome, job: Job, body: dict) -> None:
    if job.endpoint == "/completion":
        out.tokens, out.cached_tokens = list(body["tokens"]), body["tokens_cached"]
        n = body["tokens_predicted"]
    else:
        choice = body["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        out.tokens = [text]
        out.cached_tokens = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        n = body["usage"]["completion_tokens"]
    if n != job.max_tokens:
        out.error = f"{n} tokens generated, asked for {job.max_tokens}"


def _chunk(out: Outcome, job: Job, ev: dict) -> bool:
    """Take one stream event; True when it carried a generated token."""
    if job.endpoint == "/completion":
        if ev.get("stop"):
            out.cached_tokens = ev.get("tokens_cached", 0)
            return False
        out.tokens += ev.get("tokens", [])
        return bool(ev.get("tokens"))
    if ev.get("usage"):
        out.cached_tokens = ev["usage"]["prompt_tokens_details"]["cached_tokens"]
    if not ev.get("choices"):
        return False
    choice = ev["choices"][0]
    piece = choice.get("text") if "text" in choice else choice.get("delta", {}).get("content")
    if choice.get("finish_reason") is None and piece is not None and "role" not in \
            choice.get("delta", {}):
        out.tokens.append(piece)
        return True
    return False
