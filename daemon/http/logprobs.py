"""Token probabilities as each API writes them, from one entry per token: its text,
its value and its UTF-8 bytes (`entry`).

- OpenAI chat and the Responses API: {"content": [{token, logprob, bytes, top_logprobs}]}
  (Responses puts the list itself on its text deltas);
- OpenAI completions: parallel lists (tokens, token_logprobs, top_logprobs as
  {text: logprob}, text_offset);
- llama.cpp: completion_probabilities, [{id, token, logprob | prob, bytes,
  top_logprobs | top_probs}] (prob with post_sampling_probs).
"""

from __future__ import annotations

from ckptd.model.sampling.decoding import TokenEvent


def entry(tok, token: int, value: float, key: str = "logprob", with_id: bool = False) -> dict:
    text = tok.decode([token])
    out = {"id": token} if with_id else {}
    out.update({"token": text, key: value, "bytes": list(text.encode("utf-8"))})
    return out


def chat_list(tok, evs: list[TokenEvent]) -> list[dict] | None:
    """Each token's entry with its top alternatives (None: logprobs not asked)."""
    if not evs or evs[0].sampled.logprob is None:
        return None
    return [{**entry(tok, e.sampled.token, e.sampled.logprob),
             "top_logprobs": [entry(tok, t, lp) for t, lp in e.sampled.top]} for e in evs]


def chat(tok, evs: list[TokenEvent]) -> dict | None:
    items = chat_list(tok, evs)
    return None if items is None else {"content": items}


def completion(tok, evs: list[TokenEvent], offset: int) -> tuple[dict | None, int]:
    """(logprobs, the text offset after these tokens)."""
    if not evs or evs[0].sampled.logprob is None:
        return None, offset
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for ev in evs:
        s = ev.sampled
        out["tokens"].append(tok.decode([s.token]))
        out["token_logprobs"].append(s.logprob)
        out["top_logprobs"].append({tok.decode([t]): lp for t, lp in s.top})
        out["text_offset"].append(offset)
        offset += len(ev.text)
    return out, offset


def llama(tok, ev: TokenEvent) -> list[dict] | None:
    s = ev.sampled
    if s.logprob is None and s.prob is None:
        return None
    if s.prob is not None:                    # post_sampling_probs
        return [{**entry(tok, s.token, s.prob, "prob", True),
                 "top_probs": [entry(tok, t, p, "prob", True) for t, p in s.top]}]
    return [{**entry(tok, s.token, s.logprob, "logprob", True),
             "top_logprobs": [entry(tok, t, lp, "logprob", True) for t, lp in s.top]}]
