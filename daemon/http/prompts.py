"""Prompts of a completion request, as llama-server and OpenAI accept them (chat
messages: messages.py).

A prompt is a string, a list of token ids, a mixed list of ids and strings (one
sequence, strings tokenized in place), or {"prompt_string": ...}. A list of those
is a batch: one generation each. Multimodal data is refused with a 501.
"""

from __future__ import annotations

from ckptd.daemon.http.errors import bad_request
from ckptd.daemon.http.fields import check_tokens
from ckptd.daemon.http.messages import no_media

Prompt = str | list          # text, or ids with text pieces in between
MAX_BATCH = 64


def prompts(v: object, vocab_size: int, name: str = "prompt") -> list[Prompt]:
    """The request's prompts: one, or a batch."""
    if v is None:
        raise bad_request(f"{name} is required", name, "missing_field")
    if isinstance(v, list) and v and not any(isinstance(x, int) and not isinstance(x, bool)
                                             for x in v):
        if len(v) > MAX_BATCH:
            raise bad_request(f"{name} holds at most {MAX_BATCH} prompts", name)
        return [_one(x, vocab_size, f"{name}[{i}]") for i, x in enumerate(v)]
    return [_one(v, vocab_size, name)]


def _one(v: object, vocab_size: int, name: str) -> Prompt:
    if isinstance(v, dict):
        if v.get("multimodal_data"):
            raise no_media("multimodal_data", name)
        text = v.get("prompt_string")
        if not isinstance(text, str):
            raise bad_request(f"{name}.prompt_string must be a string", f"{name}.prompt_string",
                              "invalid_type")
        v = text
    if isinstance(v, str):
        if not v:
            raise bad_request(f"{name} must not be empty", name)
        return v
    if isinstance(v, list):
        if not v:
            raise bad_request(f"{name} must not be empty", name)
        if not all(isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool))
                   for x in v):
            raise bad_request(f"{name} must be a string, a list of token ids (with strings "
                              "between them) or a list of such prompts", name, "invalid_type")
        check_tokens([x for x in v if isinstance(x, int)], vocab_size, name)
        return v
    raise bad_request(f"{name} must be a string, a list of token ids or a list of prompts",
                      name, "invalid_type")
