"""Anthropic's Messages API request, read once into an ApiRequest; every error names
the field as Anthropic's API has it (`stop_sequences`, `messages[1].content[0].input`,
`tools[0].input_schema`).

What it amounts to is what llama-server reads: `system` as a system message, tool_use
blocks as the assistant's tool calls, tool_result blocks as tool messages (put before
the rest of their user turn: they answer the calls before them), thinking blocks as
reasoning_content, tools' input_schema as parameters, a last assistant message as the
start of the answer (Anthropic's prefill).
"""

from __future__ import annotations

from ckptd.daemon.http import messages
from ckptd.daemon.http.chat import (
    ChatPrompt,
    check_choice,
    function_tool,
    template_kwargs,
    tool_list,
)
from ckptd.daemon.http.errors import bad_request
from ckptd.daemon.http.fields import Fields, Names, type_error
from ckptd.daemon.http.media import Media
from ckptd.daemon.http.messages import Turn
from ckptd.daemon.http.schemas import ApiRequest, generate
from ckptd.daemon.service import Service

DEFAULT_MAX_TOKENS = 4096          # required by Anthropic; llama-server's default without it
# Anthropic's own fields, and the llama-server and ckptd extensions it passes on
NAMES = Names(renamed={"stop": "stop_sequences", "cache": "cache_prompt"}, only=frozenset({
    "model", "max_tokens", "temperature", "top_p", "top_k", "stream", "seed",
    "chat_template_kwargs", "cache_salt", "context", "id_slot", "return_progress",
    "timings_per_token", "verbose"}))
CHOICES = {"auto": "auto", "any": "required", "none": "none", "tool": "required"}


def parse(body: object, svc: Service) -> ApiRequest:
    f = Fields(body, names=NAMES)
    if "messages" not in f.data:
        raise bad_request("messages is required", "messages", "missing_field")
    media = Media()
    msgs = _conversation(f.data, media)
    tools = [_tool(t, where) for where, t in tool_list(f.data.get("tools"), "tools")]
    choice, name, parallel = _tool_choice(f.data.get("tool_choice"), tools)
    kwargs, thinking = template_kwargs(f)
    switch = _thinking(f.data.get("thinking"))
    if switch is not None and "enable_thinking" not in kwargs:
        thinking = switch
    gen = generate(f, svc.parse_openai, f.int("max_tokens", DEFAULT_MAX_TOKENS, 0), None,
                   False)
    chat = ChatPrompt.of(msgs, tools, choice, name, parallel, True, kwargs, thinking,
                         media=media)
    return ApiRequest(f.str("model"), gen, chat, prompt_param="messages")


def _conversation(body: dict, media: Media) -> list[dict]:
    turns = []
    system = body.get("system")
    if system is not None:
        text = messages.content(system, "system", "anthropic", "")
        turns.append(Turn({"role": "system", "content": text}, "system"))
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise type_error("messages", "a list of messages", raw)
    for i, m in enumerate(raw):
        turns += _message(m, f"messages[{i}]", media)
    # llama-server answers an empty list (a template's defaults) rather than refusing it
    return messages.conversation(turns, "messages", allow_empty=True)


def _message(m: object, where: str, media: Media) -> list[Turn]:
    """One Anthropic message as turns: a user turn's tool results first, then the rest
    (image blocks into `media`)."""
    if not isinstance(m, dict):
        raise type_error(where, "an object", m)
    role, c = m.get("role"), m.get("content")
    if role not in ("user", "assistant"):
        raise bad_request(f"{where}.role must be user or assistant, got {role!r}",
                          f"{where}.role", "missing_field" if role is None else
                          "invalid_value")
    if c is None:
        raise bad_request(f"{where}.content is required", f"{where}.content", "missing_field")
    if isinstance(c, str):
        return [Turn({"role": role, "content": c}, where)]
    if not isinstance(c, list):
        raise type_error(f"{where}.content", "a string or a list of content blocks", c)
    text, calls, results, thinking = [], [], [], ""
    for j, b in enumerate(c):
        at = f"{where}.content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if messages.is_part(b, "anthropic"):
            text.append(messages.part(b, at, "anthropic", media))
        elif kind == "thinking":
            thinking += messages.string(b, "thinking", at)
        elif kind == "redacted_thinking":
            continue                   # encrypted: nothing a template could show
        elif kind == "tool_use" and role == "assistant":
            calls.append(messages.call(b.get("name"), b.get("input"), messages.string(b, "id", at),
                                       at, len(calls), ("name", "input", "id")))
        elif kind == "tool_result" and role == "user":
            cid = messages.string(b, "tool_use_id", at)
            results.append(Turn({"role": "tool", "tool_call_id": cid,
                                 "content": _result(b.get("content"), f"{at}.content",
                                                    media)}, at))
        else:
            raise bad_request(f"{at}: a {role} message holds no blocks of type {kind!r}",
                              f"{at}.type")
    out = list(results)
    if text or calls or thinking:
        msg = {"role": role, "content": "\n".join(text)}
        if calls:
            msg["tool_calls"] = calls
        if thinking:
            msg["reasoning_content"] = thinking
        out.append(Turn(msg, where, frozenset(c["id"] for c in calls)))
    return out


def _result(c: object, where: str, media: Media) -> str:
    """A tool result's content: text, or text (and image) blocks."""
    if c is None:
        return ""
    return messages.content(c, where, "anthropic", media=media)


def _tool(t: dict, where: str) -> dict:
    if t.get("type", "custom") != "custom":
        raise bad_request(f"{where}.type: Anthropic's server tools ({t['type']!r}) are not "
                          "supported by this server (ckptd); give custom tools",
                          f"{where}.type", "not_supported")
    return function_tool(t, where, "input_schema")


def _tool_choice(v: object, tools: list[dict]) -> tuple[str, str | None, bool]:
    """(none | auto | required, the tool a {type: tool} choice names, parallel calls)."""
    if v is None:
        return "auto", None, True
    if not isinstance(v, dict) or v.get("type") not in CHOICES:
        raise bad_request(f"tool_choice must be {{type: {' | '.join(CHOICES)}}}",
                          "tool_choice.type" if isinstance(v, dict) else "tool_choice")
    parallel = Fields(v, "tool_choice").bool("disable_parallel_tool_use") is False
    name = None
    if v["type"] == "tool":
        name = Fields(v, "tool_choice").str("name", required=True)
    choice, name = check_choice(CHOICES[v["type"]], name, tools,
                                "tool_choice.name" if name else "tool_choice.type")
    return choice, name, parallel


def _thinking(v: object) -> bool | None:
    """Anthropic's extended thinking switch, as the template's enable_thinking."""
    if v is None:
        return None
    kind = Fields(v, "thinking").str("type", required=True)
    if kind not in ("enabled", "disabled", "adaptive"):
        raise bad_request(f"thinking.type must be enabled, disabled or adaptive, got {kind!r}",
                          "thinking.type")
    return kind != "disabled"
