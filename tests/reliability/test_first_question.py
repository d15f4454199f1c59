"""The first question after a document computes only itself (issue 35), on a real
daemon over HTTP, after a SIGKILL and a restart: the first request's prefill left a
snapshot where the next one parts (a chat's last user message, a raw prompt's tail).
Every answer is compared with the uncached one."""

from __future__ import annotations

import random

from tests.daemon.daemon_proc import Daemon, start
from tests.reliability.conftest import ENV, greedy, kill9, wait_written

ARGS = ("--max-context", "8192", "--step-tokens", "512", "--request-timeout", "300")
WORDS = ("memory store daemon prefix snapshot restore question answer document model "
         "token layer state cache tier disk host device page block hybrid recurrent").split()


def _text(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _chat(d: Daemon, messages: list[dict], cache: bool = True) -> tuple[list, int, int]:
    """(the answer's tokens as logprobs report them, prompt tokens, cached tokens)."""
    r = d.post("/v1/chat/completions", {"messages": messages, "max_tokens": 4,
                                        "temperature": 0, "logprobs": True, "cache": cache},
               timeout=300)
    assert r.status == 200, r.text
    body = r.json
    tokens = [(t["token"], t["bytes"]) for t in body["choices"][0]["logprobs"]["content"]]
    usage = body["usage"]
    return tokens, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def _own_tokens(d: Daemon, system: dict, question: dict) -> int:
    """Tokens of the question's turn and the generation prompt: what follows the
    rendered system turn."""
    head = d.post("/apply-template", {"messages": [system], "add_generation_prompt": False})
    full = d.post("/apply-template", {"messages": [system, question]})
    head, full = head.json["prompt"], full.json["prompt"]
    assert full.startswith(head)
    return len(d.post("/tokenize", {"content": full[len(head):]}).json["tokens"])


def test_a_new_conversation_after_a_long_system_message_computes_only_its_own_turn(
        tiny_hybrid_dir, tmp_path):
    system = {"role": "system", "content": _text(1500, 1)}
    asks = [{"role": "user", "content": _text(12 + 3 * i, 10 + i)} for i in range(4)]
    cache = tmp_path / "cache"
    d = start(tiny_hybrid_dir, cache, *ARGS, env=ENV)
    try:
        want = [_chat(d, [system, q], cache=False)[0] for q in asks]
        own = [_own_tokens(d, system, q) for q in asks]
        got, prompt_n, _ = _chat(d, [system, asks[0]])
        assert got == want[0] and prompt_n > 1000
        got, prompt_n, cached = _chat(d, [system, asks[1]])
        assert got == want[1]
        assert prompt_n - cached <= own[1], (prompt_n, cached, own[1])
        wait_written(d)
    finally:
        kill9(d)
    d = start(tiny_hybrid_dir, cache, *ARGS, env=ENV)             # after SIGKILL
    try:
        for q, w, n in zip(asks[2:], want[2:], own[2:]):
            got, prompt_n, cached = _chat(d, [system, q])
            assert got == w
            assert prompt_n - cached <= n, (prompt_n, cached, n)
    finally:
        assert d.stop() == 0, d.output()


def test_the_first_question_after_a_document_computes_at_most_64_tokens_more(
        tiny_hybrid_dir, tmp_path):
    # Long enough that the tail 64 tokens back is worth its step: tails cost at most 3%
    # of a cold prefill, and one more step of the tiny model is ~70-130 tokens' worth
    rng = random.Random(7)
    doc = [rng.randrange(3, 500) for _ in range(6000)]
    questions = [[rng.randrange(3, 500) for _ in range(20 + i)] for i in range(3)]
    cache = tmp_path / "cache"
    d = start(tiny_hybrid_dir, cache, *ARGS, env=ENV)
    try:
        want = [greedy(d, doc + q, cache=False)[0] for q in questions]
        got, _ = greedy(d, doc + questions[0])
        assert got == want[0]
        wait_written(d)
    finally:
        kill9(d)
    d = start(tiny_hybrid_dir, cache, *ARGS, env=ENV)             # after SIGKILL
    try:
        for i, q in enumerate(questions[1:], 1):
            got, cached = greedy(d, doc + q)
            assert got == want[i], f"question {i}"
            limit = 64 + len(q) if i == 1 else len(q)           # then from the branch point
            assert len(doc) + len(q) - cached <= limit, (i, cached)
    finally:
        assert d.stop() == 0, d.output()
