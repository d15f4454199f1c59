"""The benchmark's scenarios, each a list of requests to one server and a row per request.

- context: per context length, a cold request (a prompt no cache has seen: it
  opens with this run's tag), then the same prompt again (warm: ckptd serves it
  from its RAM tier, a llama.cpp server from the KV still in its slot), and after
  a daemon restart once more (ckptd's disk tier; only when the benchmark started
  the daemon itself).
- chat: a multi-turn conversation; each turn sends the whole history, so the
  share of the prompt served from cache should grow turn by turn.
- memory: one long document stored once (a request with max_tokens 1), then N
  different questions about it, each prompt = document + question. On ckptd also
  `memory_context`: another document registered once as a named context, then the
  same questions each sending only its own text.

Every server gets the same texts. Token counts are the server's own (usage or
timings); a server that reports none gets them from its /tokenize.
"""

from __future__ import annotations

import hashlib
import random
import statistics
import time

from ckptd.tools.bench.client import Client, Measured, ServerError

WORDS = (
    "the cache keeps state of every prompt so that a later request with the same "
    "prefix starts where the earlier one stopped model layers attention recurrent "
    "memory disk page block snapshot token server client answer question document "
    "restart budget time first second third river mountain city market garden "
    "window paper light number system engine daemon value record table history"
).split()


def filler(n_words: int, seed: int) -> str:
    """Deterministic English-like text: sentences of 8-15 words, a paragraph break
    every 5 sentences."""
    rng = random.Random(seed)
    out, sentence, sentences = [], [], 0
    for _ in range(n_words):
        sentence.append(rng.choice(WORDS))
        if len(sentence) >= rng.randint(8, 15):
            out.append(" ".join(sentence).capitalize() + ".")
            sentence, sentences = [], sentences + 1
            if sentences % 5 == 0:
                out.append("\n")
    if sentence:
        out.append(" ".join(sentence).capitalize() + ".")
    return " ".join(out).replace(" \n ", "\n").strip()


def opening(tag: str) -> str:
    """Ten letters drawn from the tag's hash, to open a prompt with: two prompts of a
    run then differ from their first token on (a shared "Document" would let an
    attention-only model reuse those tokens and make a cold request a little warm)."""
    digest = hashlib.blake2b(tag.encode(), digest_size=10).digest()
    return "".join(chr(ord("a") + b % 26) for b in digest)


class PromptMaker:
    """Texts of about n tokens for one tokenizer (the first server's), found by
    tokenizing and rescaling the word count a few times."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.tokens_per_word = 1.5
        self.made: dict[tuple, str] = {}     # so every server gets the very same texts

    def count(self, text: str) -> int | None:
        ids = self.client.tokenize(text)
        return None if ids is None else len(ids)

    def text(self, tag: str, n_tokens: int, seed: int = 0) -> str:
        key = (tag, n_tokens, seed)
        if key not in self.made:
            self.made[key] = self._make(tag, n_tokens, seed)
        return self.made[key]

    def _make(self, tag: str, n_tokens: int, seed: int) -> str:
        head = f"{opening(tag)} document {tag}.\n"
        head_n = self.count(head) or 0
        words = max(1, round((n_tokens - head_n) / self.tokens_per_word))
        best = None                          # (miss, text)
        for _ in range(6):
            text = head + filler(words, seed)
            n = self.count(text)
            if n is None:
                return text
            if best is None or abs(n - n_tokens) < best[0]:
                best = (abs(n - n_tokens), text)
            if best[0] <= max(1, n_tokens // 100):
                break
            self.tokens_per_word = max(0.2, (n - head_n) / words)
            step = round((n_tokens - n) / self.tokens_per_word) or (1 if n < n_tokens else -1)
            words = max(1, words + step)
        return best[1]


def row(m: Measured, scenario: str, **labels) -> dict:
    return {"scenario": scenario, **labels, "ttft_ms": round(m.ttft_ms, 3),
            "total_ms": round(m.total_ms, 3),
            "server_ttft_ms": None if m.server_ttft_ms is None else round(m.server_ttft_ms, 3),
            "prompt_n": m.prompt_n, "cache_n": m.cache_n, "computed_n": m.computed_n,
            "cache_tier": m.cache_tier, "completion_n": m.completion_n,
            "timings": m.timings}


def _fill_counts(m: Measured, client: Client, maker: PromptMaker, prompt: str) -> Measured:
    """A server that does not report its prompt length: ask its tokenizer, else ours."""
    if m.prompt_n is None:
        ids = client.tokenize(prompt)
        m.prompt_n = maker.count(prompt) if ids is None else len(ids)
    return m


def warm_up(client: Client, tag: str) -> None:
    """One short request first, so one-time costs (allocations, lazy imports) land in
    no measured figure."""
    client.complete(f"{opening(tag)} warm-up. " + filler(20, 0), 2)


def context_lengths(client: Client, maker: PromptMaker, lengths: list[int], max_tokens: int,
                    repeat: int, tag: str) -> tuple[list[dict], dict[int, str]]:
    """Cold and warm TTFT per length; returns the rows and each length's prompt (the
    one the warm requests repeated), for `after_restart`."""
    rows, prompts = [], {}
    for length in lengths:
        prompt = ""
        for r in range(repeat):
            prompt = maker.text(f"{tag}-ctx{length}-r{r}", length, seed=length)
            m = _fill_counts(client.complete(prompt, max_tokens), client, maker, prompt)
            rows.append(row(m, "context", length=length, phase="cold", rep=r))
        prompts[length] = prompt
        for r in range(repeat):
            m = _fill_counts(client.complete(prompt, max_tokens), client, maker, prompt)
            rows.append(row(m, "context", length=length, phase="warm", rep=r))
    return rows, prompts


def after_restart(client: Client, maker: PromptMaker, prompts: dict[int, str],
                  max_tokens: int) -> list[dict]:
    """Each length's prompt once more, on a daemon that has just restarted."""
    rows = []
    for length, prompt in prompts.items():
        m = _fill_counts(client.complete(prompt, max_tokens), client, maker, prompt)
        rows.append(row(m, "context", length=length, phase="restart", rep=0))
    return rows


def chat(client: Client, maker: PromptMaker, turns: int, turn_tokens: int, max_tokens: int,
         tag: str) -> list[dict]:
    """A conversation of `turns` user messages, each answer kept in the history."""
    messages = [{"role": "system",
                 "content": f"{opening(tag + '-chat')}. You are a concise assistant."}]
    rows = []
    for turn in range(1, turns + 1):
        note = maker.text(f"{tag}-turn{turn}", turn_tokens, seed=1000 + turn)
        user = {"role": "user", "content": f"{note}\nSummarize this note in one sentence."}
        m = client.chat(messages + [user], max_tokens)
        rows.append(row(m, "chat", turn=turn))
        messages += [user, {"role": "assistant", "content": m.text}]
    return rows


def memory(client: Client, maker: PromptMaker, context_tokens: int, questions: int,
           max_tokens: int, tag: str) -> list[dict]:
    """One document stored once, then `questions` different questions about it. The
    document ends with a newline and each question starts with a letter, so the
    document's tokens stay a prefix of every question's prompt."""
    doc = maker.text(f"{tag}-memory", context_tokens, seed=7) + "\n"
    m = _fill_counts(client.complete(doc, 1), client, maker, doc)
    rows = [row(m, "memory", request="store", index=0)]
    rng = random.Random(11)
    for i in range(1, questions + 1):
        prompt = f"{doc}Question {i}: what does the document say about {rng.choice(WORDS)}?" \
                 "\nAnswer:"
        m = _fill_counts(client.complete(prompt, max_tokens), client, maker, prompt)
        rows.append(row(m, "memory", request=f"question {i}", index=i))
    return rows


def memory_context(client: Client, maker: PromptMaker, context_tokens: int, questions: int,
                   max_tokens: int, tag: str) -> list[dict]:
    """ckptd's own way to serve a memory store: the document registered once as a named
    context (POST /v1/contexts), then each question sends only its own text and names
    the context, so the document is neither sent nor tokenized again. Another document
    than memory()'s, so that its store is cold too; the context is deleted at the end."""
    doc = maker.text(f"{tag}-memory-context", context_tokens, seed=8) + "\n"
    name = f"bench-{tag}"
    t0 = time.perf_counter()
    status, out = client.request("POST", "/v1/contexts", {"name": name, "text": doc})
    ms = (time.perf_counter() - t0) * 1000
    if status not in (200, 201) or not isinstance(out, dict):
        raise ServerError(f"POST /v1/contexts answered {status}: {out}")
    stored = Measured(ms, ms, "", out.get("tokens"), out.get("cached_tokens"),
                      timings=out.get("timings"))
    rows = [row(stored, "memory", request="store", index=0)]
    rng = random.Random(11)
    try:
        for i in range(1, questions + 1):
            question = f"Question {i}: what does the document say about " \
                       f"{rng.choice(WORDS)}?\nAnswer:"
            m = client.complete(question, max_tokens, context=name)
            rows.append(row(m, "memory", request=f"question {i}", index=i))
    finally:
        client.request("DELETE", f"/v1/contexts/{name}")
    return rows


def median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None
