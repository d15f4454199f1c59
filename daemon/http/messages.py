"""Chat messages as every chat route hands them to the template, and the checks OpenAI
and llama-server make on any conversation.

Each route reads its own shapes (OpenAI's messages, Anthropic's content blocks, the
Responses API's input items) into `Turn`s: the message the template sees, and where
in the client's body it came from. `conversation` then checks them once for every
route, naming the client's own field: content is required unless an assistant message
carries tool calls; a tool result follows an assistant message that made calls (and
names one of them, when both give ids).

Content parts are read through one table (`PART_KINDS`: each API's part type -> what
it is) and one reader per kind (`READERS`); a new kind of part is added there. An image
part becomes the marker of the request's `Media` (daemon/http/media.py), each API's
image shape read by `IMAGE_SOURCES`; where a reading takes no images, it is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from ckptd.daemon.http.errors import bad_request
from ckptd.daemon.http.fields import type_error
from ckptd.daemon.http.media import Media

ROLES = ("system", "developer", "user", "assistant", "tool")
TEXT, IMAGE, AUDIO, FILE = "text", "image", "audio", "file"

# Each API's content part types, by what they hold
PART_KINDS: dict[str, dict[str, str]] = {
    "openai": {"text": TEXT, "image_url": IMAGE, "input_audio": AUDIO, "file": FILE},
    "anthropic": {"text": TEXT, "image": IMAGE, "document": FILE},
    "responses": {"input_text": TEXT, "output_text": TEXT, "text": TEXT,
                  "input_image": IMAGE, "input_file": FILE},
}


@dataclass
class Turn:
    """One message for the template, and the client's field it was read from."""
    msg: dict
    where: str
    call_ids: frozenset[str] = field(default_factory=frozenset)   # ids the client gave


def no_media(what: str, where: str):
    # a field of the request, not a route: a 400 (llama-server's answer to media its
    # model can't take), with the code saying it is not supported
    kind = "image input" if what.startswith(("image", "input_image")) else "multimodal input"
    return bad_request(f"{kind} is not supported by this server (ckptd): {what}", where,
                       "not_supported")


def _text_part(part: dict, where: str, kind: str, media: Media | None) -> str:
    text = part.get("text")
    if not isinstance(text, str):
        raise bad_request(f"{where}.text must be a string", f"{where}.text",
                          "missing_field" if text is None else "invalid_type")
    return text


def _media_part(part: dict, where: str, kind: str, media: Media | None) -> str:
    raise no_media(f"{part.get('type')} parts", where)


def _openai_image(part: dict, where: str) -> tuple[str, object]:
    url = part.get("image_url")        # {url, detail}, or the URL itself
    return f"{where}.image_url", url.get("url") if isinstance(url, dict) else url


def _anthropic_image(part: dict, where: str) -> tuple[str, object]:
    src = part.get("source")
    if not isinstance(src, dict) or src.get("type") not in ("base64", "url"):
        raise bad_request(f"{where}.source must be {{type: base64, media_type, data}} or "
                          "{type: url, url}", f"{where}.source",
                          "missing_field" if src is None else "invalid_type")
    if src["type"] == "url":
        return f"{where}.source.url", src.get("url")
    data = src.get("data")
    if not isinstance(data, str) or not data:
        raise bad_request(f"{where}.source.data must be base64 image data",
                          f"{where}.source.data", "missing_field" if data is None else
                          "invalid_type")
    mime = src.get("media_type")
    if not isinstance(mime, str) or not mime:
        raise bad_request(f"{where}.source.media_type must be an image type (image/png...)",
                          f"{where}.source.media_type", "missing_field" if mime is None else
                          "invalid_type")
    return f"{where}.source", f"data:{mime};base64,{data}"


def _responses_image(part: dict, where: str) -> tuple[str, object]:
    if part.get("image_url") is None and part.get("file_id") is not None:
        raise bad_request(f"{where}.file_id: files are not stored by this server (ckptd); "
                          "send the image as a data URL in image_url", f"{where}.file_id",
                          "not_supported")
    return f"{where}.image_url", part.get("image_url")


# Each API's image part: (the field naming the image, its URL)
IMAGE_SOURCES: dict[str, Callable[[dict, str], tuple[str, object]]] = {
    "openai": _openai_image, "anthropic": _anthropic_image, "responses": _responses_image}


def _image_part(part: dict, where: str, kind: str, media: Media | None) -> str:
    if media is None:
        raise no_media(f"{part.get('type')} parts", where)
    api = next(a for a, kinds in PART_KINDS.items() if kinds.get(part.get("type")) == IMAGE)
    field, url = IMAGE_SOURCES[api](part, where)
    return media.add(field, url)


# What a part of each kind becomes in the text the template sees
READERS: dict[str, Callable[[dict, str, str, Media | None], str]] = {
    TEXT: _text_part, IMAGE: _image_part, AUDIO: _media_part, FILE: _media_part}


def content(c: object, where: str, api: str, sep: str = "\n",
            media: Media | None = None) -> str | None:
    """A message's content as text: a string, or its parts read and joined by `sep`
    (as llama-server gives them to a template that takes strings); None when absent.
    `media`: where image parts go (None: they are refused)."""
    if c is None or isinstance(c, str):
        return c
    if not isinstance(c, list):
        raise type_error(where, "a string or a list of content parts", c)
    return sep.join(part(p, f"{where}[{j}]", api, media) for j, p in enumerate(c))


def is_part(p: object, api: str) -> bool:
    """Whether `p` is a content part of the API (not a block of another kind)."""
    return isinstance(p, dict) and p.get("type") in PART_KINDS[api]


def part(p: object, where: str, api: str, media: Media | None = None) -> str:
    """One content part, read by the reader of its kind."""
    kinds = PART_KINDS[api]
    if not isinstance(p, dict):
        raise type_error(where, "a content part (an object with a type)", p)
    kind = kinds.get(p.get("type"))
    if kind is None:
        raise bad_request(f"{where}.type must be one of {', '.join(kinds)}, got "
                          f"{p.get('type')!r}", f"{where}.type",
                          "missing_field" if p.get("type") is None else "invalid_value")
    return READERS[kind](p, where, kind, media)


def string(obj: dict, key: str, where: str) -> str:
    """obj[key], a non-empty string the client must give (an id, a name)."""
    v = obj.get(key)
    if not isinstance(v, str) or not v:
        raise bad_request(f"{where}.{key} must be a non-empty string", f"{where}.{key}",
                          "missing_field" if v is None else "invalid_type")
    return v


def call(name: object, arguments: object, cid: object, where: str, i: int,
         names: tuple[str, str, str] = ("function.name", "function.arguments", "id")) -> dict:
    """A tool call as templates render it: arguments as an object (a JSON text is read).
    `names`: the client's fields for the name, the arguments and the id."""
    if not isinstance(name, str) or not name:
        raise bad_request(f"{where}.{names[0]} must be a non-empty string",
                          f"{where}.{names[0]}", "invalid_type")
    if cid is not None and not isinstance(cid, str):
        raise type_error(f"{where}.{names[2]}", "a string", cid)
    args = {} if arguments is None else arguments
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise bad_request(f"{where}.{names[1]} is not valid JSON",
                              f"{where}.{names[1]}") from None
    if not isinstance(args, dict):
        raise type_error(f"{where}.{names[1]}", "a JSON object", args)
    return {"id": cid or f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": args}}


def conversation(turns: list[Turn], name: str, allow_empty: bool = False) -> list[dict]:
    """The messages, checked as a conversation (module docstring)."""
    if not turns and not allow_empty:
        raise bad_request(f"{name} must not be empty", name)
    calls: Turn | None = None           # the assistant turn tool results answer
    for t in turns:
        m = t.msg
        if m.get("content") is None:
            if not m.get("tool_calls"):
                raise bad_request(f"{t.where}.content is required (only an assistant "
                                  "message with tool_calls may leave it out)",
                                  f"{t.where}.content", "missing_field")
            m["content"] = ""
        if m["role"] == "tool":
            if calls is None:
                raise bad_request(f"{t.where}: a tool result must follow an assistant "
                                  "message with tool calls", t.where)
            cid = m.get("tool_call_id")
            if cid is not None and calls.call_ids and cid not in calls.call_ids:
                raise bad_request(f"{t.where}: tool_call_id {cid!r} answers no call of the "
                                  f"assistant message before it ({calls.where})",
                                  f"{t.where}.tool_call_id")
        elif m["role"] == "assistant" and m.get("tool_calls"):
            calls = t
        else:
            calls = None
    if len(turns) > 1 and turns[-1].msg["role"] == turns[-2].msg["role"] == "assistant":
        raise bad_request(f"{name}: only the last message may be an assistant's answer to "
                          "continue, not two in a row", name)
    return [t.msg for t in turns]


def openai_messages(v: object, name: str = "messages", allow_empty: bool = False,
                    media: Media | None = None) -> list[dict]:
    """OpenAI's [{role, content, ...}]: an assistant's tool_calls, a tool result's
    tool_call_id and name, and reasoning_content kept for templates that show them;
    image parts into `media` (None: refused)."""
    if not isinstance(v, list):
        raise bad_request(f"{name} must be a list of messages", name,
                          "missing_field" if v is None else "invalid_type")
    turns = []
    for i, m in enumerate(v):
        where = f"{name}[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object", where, "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}",
                              f"{where}.role", "missing_field" if role is None else
                              "invalid_value")
        msg = {"role": "system" if role == "developer" else role,
               "content": content(m.get("content"), f"{where}.content", "openai",
                                  media=media)}
        ids: set[str] = set()
        raw_calls = m.get("tool_calls")
        if role == "assistant" and raw_calls is not None:
            if not isinstance(raw_calls, list):
                raise type_error(f"{where}.tool_calls", "a list of tool calls", raw_calls)
            msg["tool_calls"] = [_openai_call(c, f"{where}.tool_calls[{j}]", j)
                                 for j, c in enumerate(raw_calls)]
            ids = {c["id"] for c in raw_calls if isinstance(c.get("id"), str)}
        for key in ("tool_call_id", "name", "reasoning_content"):
            if m.get(key) is not None:
                if not isinstance(m[key], str):
                    raise type_error(f"{where}.{key}", "a string", m[key])
                msg[key] = m[key]
        turns.append(Turn(msg, where, frozenset(ids)))
    return conversation(turns, name, allow_empty)


def _openai_call(c: object, where: str, i: int) -> dict:
    if not isinstance(c, dict) or not isinstance(c.get("function"), dict):
        raise bad_request(f"{where} must be {{type: function, function: {{name, arguments}}}}",
                          where, "invalid_type")
    if c.get("type", "function") != "function":
        raise bad_request(f"{where}.type must be function", f"{where}.type")
    fn = c["function"]
    return call(fn.get("name"), fn.get("arguments"), c.get("id"), where, i)
