"""Each state space hybrid served by `ckptd serve`, through the OpenAI client: a three-turn
chat whose later turns restore the earlier ones, then a SIGKILL and a restart after which
the same chat is answered the same from the disk tier; every answer also equals the
uncached one of the same process."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import SSM_ARCHES
from tests.daemon.daemon_proc import start
from tests.reliability.conftest import ARGS, ENV, kill9, wait_written

QUESTIONS = ("hello there", "what does a cache keep?", "and after a restart?")


def _chat(d, cache: bool = True) -> list[tuple[str, int, int]]:
    """(answer, prompt tokens, cached prompt tokens) of each of three greedy turns."""
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="none", max_retries=0, timeout=120)
    msgs, out = [], []
    for q in QUESTIONS:
        msgs.append({"role": "user", "content": q})
        r = client.chat.completions.create(
            model="tiny", messages=msgs, max_tokens=6, temperature=0,
            extra_body={"ignore_eos": True, "cache": cache})
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6
        out.append((text, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens))
        msgs.append({"role": "assistant", "content": text})
    return out


@pytest.mark.parametrize("arch", SSM_ARCHES)
def test_a_chat_through_the_openai_client_survives_sigkill(ssm_dirs, tmp_path, arch):
    cache = tmp_path / "cache"
    d = start(ssm_dirs[arch], cache, *ARGS, "--parallel", "2", env=ENV)
    try:
        first = _chat(d)
        assert _chat(d, cache=False) == [(a, n, 0) for a, n, _ in first]
        # turn N+1 restores at least up to turn N's prompt (its end snapshot)
        for (_, n_prev, _), (_, _, cached) in zip(first, first[1:]):
            assert cached >= n_prev, first
        wait_written(d)                   # committed: the kill may take the queue only
    finally:
        kill9(d)
    d = start(ssm_dirs[arch], cache, *ARGS, "--parallel", "2", env=ENV)
    try:
        again = _chat(d)
        assert [a for a, _, _ in again] == [a for a, _, _ in first]
        # every prompt was seen before the kill: each restores all of it from disk
        assert all(cached >= n - 1 for _, n, cached in again), again
        tiers = d.get("/cache/stats").json
        assert tiers["read_bytes"]["disk"] > 0, tiers
        assert _chat(d, cache=False) == [(a, n, 0) for a, n, _ in first]
    finally:
        assert d.stop() == 0, d.output()
