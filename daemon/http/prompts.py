"""Prompts of a completion request, as llama-server and OpenAI accept them (chat
messages: messages.py).

A prompt is a string, a list of token ids, a mixed list of ids and strings (one
sequence, strings tokenized in place), or {"prompt_string": ..., "multimodal_data":
[base64 images]}. A list of those is a batch: one generation each.
"""

from __future__ import annotations

from ckptd.daemon.http.errors import bad_request
from ckptd.daemon.http.fields import check_tokens
from ckptd.daemon.http.media import MEDIA_MARKER, Media

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
        text = v.get("prompt_string")
        if not isinstance(text, str):
            raise bad_request(f"{name}.prompt_string must be a string", f"{name}.prompt_string",
                              "invalid_type")
        if "multimodal_data" in v:
            return _multimodal(text, v["multimodal_data"], name)
        v = text
    if isinstance(v, str):
        if not v:
            raise bad_request(f"{name} must not be empty", name)
        return v
    if isinstance(v, list):
        if not v:
            raise bad_request(f"{name} must not be empty", name)
        # by exact type, in C: a 64K-token prompt's check in ~1 ms (bool is not int here)
        kinds = set(map(type, v))
        if not kinds <= {int, str}:
            raise bad_request(f"{name} must be a string, a list of token ids (with strings "
                              "between them) or a list of such prompts", name, "invalid_type")
        check_tokens(v if str not in kinds else [x for x in v if type(x) is int],
                     vocab_size, name)
        return v
    raise bad_request(f"{name} must be a string, a list of token ids or a list of prompts",
                      name, "invalid_type")


class MediaText(str):
    """llama-server's {prompt_string, multimodal_data}: the text with `<__media__>` where
    each image goes, and the images (`media`: daemon/http/media.py)."""
    media = None


def _multimodal(text: str, data: object, name: str) -> MediaText:
    where = f"{name}.multimodal_data"
    if not isinstance(data, list) or not data:
        raise bad_request(f"{where} must be a non-empty list of base64 images", where,
                          "invalid_type")
    if text.count(MEDIA_MARKER) != len(data):
        raise bad_request(f"{name}.prompt_string has {text.count(MEDIA_MARKER)} "
                          f"{MEDIA_MARKER} markers for {len(data)} images", where)
    media = Media(marker=MEDIA_MARKER, raw=True)
    for i, d in enumerate(data):
        media.add(f"{where}[{i}]", d)
    out = MediaText(text)
    out.media = media
    return out

