"""OpenAI's Responses API request, read once into an ApiRequest; every error names
the field as the Responses API has it (`max_output_tokens`, `input[2].call_id`,
`text.format.schema`).

What it amounts to is what llama-server reads: `instructions` as a system message,
input items as messages (function_call items as the assistant's tool calls,
function_call_output items as tool messages, reasoning items as reasoning_content),
function tools as chat tools, `text.format` as a response format, `reasoning.effort`
as the template's reasoning switch. The fields of chat completions beside them pass
on as llama-server passes them (sampling, cache, grammar).
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
from ckptd.daemon.http.sampling import schema_field
from ckptd.daemon.http.schemas import ApiRequest, generate
from ckptd.daemon.service import Service
from ckptd.model.sampling.grammar import Constraint

ROLES = ("user", "system", "developer", "assistant")
CHOICES = ("none", "auto", "required")
LOGPROBS = "message.output_text.logprobs"
# the chat fields the Responses API names otherwise or has its own shape for
NAMES = Names(renamed={"max_tokens": "max_output_tokens"}, dropped=frozenset({
    "messages", "max_completion_tokens", "n", "best_of", "echo", "logprobs",
    "response_format", "stream_options", "continue_final_message",
    "add_generation_prompt"}))


def parse(body: object, svc: Service) -> ApiRequest:
    f = Fields(body, names=NAMES)
    d = f.data
    if d.get("previous_response_id") is not None:
        raise bad_request("previous_response_id: responses are not stored by this server "
                          "(ckptd); send the conversation as input", "previous_response_id",
                          "not_supported")
    if f.str("truncation", "disabled") != "disabled":
        raise bad_request("truncation: only 'disabled' is supported (a prompt longer than the "
                          "context is an error)", "truncation", "not_supported")
    if "input" not in d:
        raise bad_request("input is required", "input", "missing_field")
    turns = [Turn({"role": "system", "content": f.str("instructions")}, "instructions")] \
        if d.get("instructions") is not None else []
    media = Media()
    msgs = messages.conversation(turns + _items(d["input"], media), "input")
    tools = [_tool(t, where) for where, t in tool_list(d.get("tools"), "tools")]
    choice, name = _tool_choice(d.get("tool_choice"), tools)
    kwargs, thinking = template_kwargs(f)
    effort = _effort(d.get("reasoning"))
    if effort == "none":
        thinking = False
    elif effort is not None:
        kwargs["reasoning_effort"] = effort
    top = f.int("top_logprobs", None, 0, 20)
    gen = generate(f, svc.parse_openai, f.int("max_tokens", None, 0),
                   (top or 0) if top or LOGPROBS in _include(d) else None, False,
                   _text_format(d.get("text")))
    chat = ChatPrompt.of(msgs, tools, choice, name, f.bool("parallel_tool_calls", True),
                         True, kwargs, thinking, media=media)
    return ApiRequest(f.str("model"), gen, chat, prompt_param="input", options=d)


def _items(v: object, media: Media) -> list[Turn]:
    """Input items as turns (input_image parts into `media`)."""
    if isinstance(v, str):
        return [Turn({"role": "user", "content": v}, "input")]
    if not isinstance(v, list):
        raise type_error("input", "a string or a list of input items", v)
    out: list[Turn] = []
    for i, item in enumerate(v):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise type_error(where, "an input item (an object)", item)
        kind = item.get("type", "message")
        last = out[-1] if out and out[-1].msg["role"] == "assistant" else None
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}, got "
                                  f"{role!r}", f"{where}.role")
            text = messages.content(item.get("content"), f"{where}.content", "responses",
                                    media=media)
            if role == "assistant" and last is not None and not last.msg["content"]:
                last.msg["content"] = text          # one turn: its calls, then its text
            else:
                out.append(Turn({"role": "system" if role == "developer" else role,
                                 "content": text}, where))
        elif kind == "function_call":
            cid = messages.string(item, "call_id", where)
            call = messages.call(item.get("name"), item.get("arguments"), cid, where, 0,
                                 ("name", "arguments", "call_id"))
            if last is None:
                last = Turn({"role": "assistant", "content": None}, where)
                out.append(last)
            last.msg.setdefault("tool_calls", []).append(call)
            last.call_ids = last.call_ids | {cid}
        elif kind == "function_call_output":
            cid = messages.string(item, "call_id", where)
            out.append(Turn({"role": "tool", "tool_call_id": cid,
                             "content": _output(item.get("output"), f"{where}.output",
                                                    media)}, where))
        elif kind == "reasoning":
            text = _reasoning(item.get("content"), f"{where}.content")
            if last is None:
                last = Turn({"role": "assistant", "content": None}, where)
                out.append(last)
            last.msg["reasoning_content"] = text
        else:
            raise bad_request(f"{where}.type: input items of type {kind!r} are not supported",
                              f"{where}.type")
    for t in out:                       # a reasoning item alone is an empty answer
        if t.msg["role"] == "assistant" and t.msg["content"] is None and \
                not t.msg.get("tool_calls"):
            t.msg["content"] = ""
    return out


def _reasoning(c: object, where: str) -> str:
    """A reasoning item's text: its reasoning_text parts (a summary is not the text)."""
    if c is None:
        return ""
    if not isinstance(c, list):
        raise type_error(where, "a list of reasoning_text parts", c)
    out = []
    for j, p in enumerate(c):
        if not isinstance(p, dict) or not isinstance(p.get("text"), str):
            raise bad_request(f"{where}[{j}] must be {{type: reasoning_text, text}}",
                              f"{where}[{j}]", "invalid_type")
        out.append(p["text"])
    return "".join(out)


def _output(c: object, where: str, media: Media) -> str:
    if c is None:
        raise bad_request(f"{where} is required", where, "missing_field")
    return messages.content(c, where, "responses", media=media)


def _tool(t: dict, where: str) -> dict:
    if t.get("type") != "function":
        raise bad_request(f"{where}.type: only function tools are supported by this server "
                          f"(ckptd), got {t.get('type')!r}", f"{where}.type", "not_supported")
    return function_tool(t, where)


def _tool_choice(v: object, tools: list[dict]) -> tuple[str, str | None]:
    if v is None:
        return "auto", None
    if isinstance(v, str) and v in CHOICES:
        return check_choice(v, None, tools, "tool_choice")
    if isinstance(v, dict) and v.get("type") == "function":
        name = Fields(v, "tool_choice").str("name", required=True)
        return check_choice("required", name, tools, "tool_choice.name")
    raise bad_request(f"tool_choice must be one of {', '.join(CHOICES)} or {{type: function, "
                      "name}", "tool_choice")


def _effort(v: object) -> str | None:
    if v is None:
        return None
    return Fields(v, "reasoning").str("effort")


def _include(d: dict) -> list[str]:
    v = d.get("include")
    if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
        raise type_error("include", "a list of strings", v)
    return v or []


def _text_format(v: object) -> tuple[str, Constraint] | None:
    """`text.format`: text, json_object or json_schema (name, schema, strict)."""
    if v is None:
        return None
    fmt = Fields(v, "text").get("format")
    if fmt is None:
        return None
    kind = Fields(fmt, "text.format").str("type", required=True)
    if kind == "text":
        return None
    if kind == "json_object":
        return "text.format", schema_field({"type": "object"}, "text.format")
    if kind == "json_schema":
        schema = fmt.get("schema")
        if schema is None:
            raise bad_request("text.format.schema is required", "text.format.schema",
                              "missing_field")
        return "text.format", schema_field(schema, "text.format.schema")
    raise bad_request(f"text.format.type must be text, json_object or json_schema, got "
                      f"{kind!r}", "text.format.type")
