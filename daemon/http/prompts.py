"""Prompts and chat messages of a request, as llama-server and OpenAI accept them.

A prompt is a string, a list of token ids, a mixed list of ids and strings (one
sequence, strings tokenized in place), or {"prompt_string": ..., "multimodal_data":
[base64 images]}. A list of those is a batch: one generation each.
"""

from __future__ import annotations

import json

from ckptd.daemon.http.errors import bad_request
from ckptd.daemon.http.fields import check_tokens
from ckptd.daemon.http.media import MEDIA_MARKER, Media

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
        if not all(isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool))
                   for x in v):
            raise bad_request(f"{name} must be a string, a list of token ids (with strings "
                              "between them) or a list of such prompts", name, "invalid_type")
        check_tokens([x for x in v if isinstance(x, int)], vocab_size, name)
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


def _no_media(what: str, where: str):
    # a field of the request, not a route: a 400 (llama-server's answer to media its
    # model can't take), with the code saying it is not supported
    kind = "image input" if "image" in what else "multimodal input"
    return bad_request(f"{kind} is not supported by this server (ckptd): {what}", where,
                       "not_supported")


def messages(v: object, name: str = "messages", allow_empty: bool = False,
             media=None) -> list[dict]:
    """[{role, content, ...}]: content flattened to text (text parts joined by a newline,
    as llama-server gives them to a template that takes strings; an image part becomes
    `media`'s marker, daemon/http/media.py), and an assistant's tool_calls (arguments as
    objects, what templates render), a tool result's tool_call_id and name,
    reasoning_content kept for templates that show them."""
    if not isinstance(v, list):
        raise bad_request(f"{name} must be a list of messages", name,
                          "missing_field" if v is None else "invalid_type")
    if not v and not allow_empty:
        raise bad_request(f"{name} must not be empty", name)
    out = []
    for i, m in enumerate(v):
        where = f"{name}[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object", where, "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
        msg = {"role": "system" if role == "developer" else role,
               "content": content_text(m.get("content"), f"{where}.content", media=media)}
        if role == "assistant" and m.get("tool_calls") is not None:
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
        for key in ("tool_call_id", "name", "reasoning_content"):
            if m.get(key) is not None:
                if not isinstance(m[key], str):
                    raise bad_request(f"{where}.{key} must be a string", f"{where}.{key}",
                                      "invalid_type")
                msg[key] = m[key]
        out.append(msg)
    if len(out) > 1 and out[-1]["role"] == out[-2]["role"] == "assistant":
        raise bad_request(f"{name}: only the last message may be an assistant's answer to "
                          "continue, not two in a row", name)
    return out


def _tool_calls(v: object, where: str) -> list[dict]:
    if not isinstance(v, list):
        raise bad_request(f"{where} must be a list", where, "invalid_type")
    out = []
    for i, call in enumerate(v):
        at = f"{where}[{i}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{at} must be {{type: function, function: {{name, arguments}}}}",
                              at, "invalid_type")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise bad_request(f"{at}.function.arguments is not valid JSON",
                                  f"{at}.function.arguments") from None
        out.append({"id": str(call.get("id") or f"call_{i}"), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def content_text(c: object, where: str, sep: str = "\n", media=None) -> str:
    """A message's content as text: a string, or its text parts joined by `sep`; an
    image_url part is `media`'s marker (no media: refused)."""
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for k, p in enumerate(c):
            if media is not None and isinstance(p, dict) and p.get("type") == "image_url":
                url = p.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                parts.append(media.add(f"{where}[{k}].image_url", url))
                continue
            if isinstance(p, dict) and p.get("type") in ("image_url", "input_audio", "file",
                                                         "input_image", "image"):
                raise _no_media(f"{p['type']} parts", where)
            if not isinstance(p, dict) or p.get("type") != "text" or \
                    not isinstance(p.get("text"), str):
                raise bad_request(f"{where}: only text parts are supported", where)
            parts.append(p["text"])
        return sep.join(parts)
    raise bad_request(f"{where} must be a string or a list of text parts", where, "invalid_type")
