"""Prompts and chat messages of a request, as llama-server and OpenAI accept them.

A prompt is a string, a list of token ids, a mixed list of ids and strings (one
sequence, strings tokenized in place), or {"prompt_string": ...}. A list of those
is a batch: one generation each. Multimodal data is refused with a 501.
"""

from __future__ import annotations

from ckptd.daemon.http.errors import bad_request
from ckptd.daemon.http.fields import check_tokens

Prompt = str | list          # text, or ids with text pieces in between
ROLES = ("system", "developer", "user", "assistant", "tool")
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
            raise _no_media("multimodal_data", name)
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


def _no_media(what: str, where: str):
    # a field of the request, not a route: a 400 (llama-server's answer to media its
    # model can't take), with the code saying it is not supported
    return bad_request(f"multimodal input ({what}) is not supported by this server (ckptd)",
                       where, "not_supported")


def messages(v: object, name: str = "messages") -> list[dict]:
    """[{role, content}] with content flattened to text (text parts of a list joined)."""
    if not isinstance(v, list):
        raise bad_request(f"{name} must be a list of messages", name,
                          "missing_field" if v is None else "invalid_type")
    if not v:
        raise bad_request(f"{name} must not be empty", name)
    out = []
    for i, m in enumerate(v):
        where = f"{name}[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object", where, "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
        out.append({"role": role, "content": _content(m.get("content"), f"{where}.content")})
    if len(out) > 1 and out[-1]["role"] == out[-2]["role"] == "assistant":
        raise bad_request(f"{name}: only the last message may be an assistant's answer to "
                          "continue, not two in a row", name)
    return out


def _content(c: object, where: str) -> str:
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for p in c:
            if isinstance(p, dict) and p.get("type") in ("image_url", "input_audio", "file",
                                                         "input_image", "image"):
                raise _no_media(f"{p.get('type')} parts", where)
            if not isinstance(p, dict) or p.get("type") != "text" or \
                    not isinstance(p.get("text"), str):
                raise bad_request(f"{where}: only text parts are supported", where)
            parts.append(p["text"])
        return "".join(parts)
    raise bad_request(f"{where} must be a string or a list of text parts", where, "invalid_type")
