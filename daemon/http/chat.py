"""A chat request's prompt as llama-server and OpenAI take it: the messages, the tools
a template describes to the model, and the template's options (add_generation_prompt,
continue_final_message, chat_template_kwargs, reasoning). PromptBuilder.render_chat
(daemon/prompt.py) turns it into text."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ckptd.daemon.http import messages
from ckptd.daemon.http.errors import bad_request
from ckptd.daemon.http.fields import Fields, type_error
from ckptd.daemon.http.media import Media

TOOL_CHOICES = ("none", "auto", "required")
MAX_TOOLS = 128
REASONING_FORMATS = ("auto", "none", "deepseek", "deepseek-legacy")


@dataclass(frozen=True)
class ChatPrompt:
    messages: list[dict]
    tools: list[dict] = field(default_factory=list)     # OpenAI tool definitions
    tool_choice: str = "auto"           # none, auto, required
    tool_name: str | None = None        # tool_choice naming one function: a call of it
    parallel_tool_calls: bool = True
    add_generation_prompt: bool = True
    prefill: str | None = None          # a last assistant message: continued, not answered
    kwargs: dict = field(default_factory=dict)          # chat_template_kwargs
    enable_thinking: bool | None = None                 # None: the server's --reasoning
    reasoning_format: str = "auto"      # llama-server's: "none" leaves thinking in content
    media: Media | None = None          # the image parts, a marker each in the text

    @classmethod
    def parse(cls, f: Fields) -> ChatPrompt:
        """An OpenAI chat request's prompt (its messages, tools and template options)."""
        raw = f.get("messages")
        media = Media()
        msgs = messages.openai_messages(raw, media=media)
        if msgs and msgs[-1]["role"] == "assistant" and isinstance(raw[-1].get("content"), list):
            # an answer's start given in parts continues as llama-server joins them (an
            # image in it is refused: an answer's start is text)
            msgs[-1]["content"] = messages.content(raw[-1]["content"],
                                                   f"messages[{len(raw) - 1}].content",
                                                   "openai", "\n\n")
        add = f.bool("add_generation_prompt", True)
        cont = f.bool("continue_final_message")
        if cont:
            if f.has("add_generation_prompt") and add:
                raise bad_request("continue_final_message and add_generation_prompt can not "
                                  "both be true", "continue_final_message")
            if not msgs or msgs[-1]["role"] != "assistant":
                raise bad_request("continue_final_message needs an assistant message last",
                                  "continue_final_message")
        tools = parse_tools(f.get("tools"))
        kwargs, thinking = template_kwargs(f)
        choice, name = _tool_choice(f.get("tool_choice"), tools)
        fmt = f.str("reasoning_format") or "auto"
        if fmt not in REASONING_FORMATS:
            raise bad_request(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}"
                              f", got {fmt!r}", "reasoning_format")
        return cls.of(msgs, tools, choice, name, f.bool("parallel_tool_calls", True), add,
                      kwargs, thinking, fmt, media)

    @classmethod
    def of(cls, msgs: list[dict], tools: list[dict], choice: str = "auto",
           name: str | None = None, parallel: bool = True, add: bool = True,
           kwargs: dict | None = None, thinking: bool | None = None,
           reasoning_format: str = "auto", media: Media | None = None) -> ChatPrompt:
        """The prompt of checked messages (messages.conversation): a last assistant
        message without calls is an answer's start to continue, as llama-server reads it.
        `media`: the images whose markers the messages hold."""
        prefill = None
        last = msgs[-1] if msgs else {}
        if len(msgs) > 1 and last["role"] == "assistant" and not last.get("tool_calls"):
            prefill, msgs = last["content"], msgs[:-1]
        return cls(msgs, tools, choice, name, parallel, add, prefill, dict(kwargs or {}),
                   thinking, reasoning_format, media or None)

    def with_messages(self, messages: list[dict], add_generation_prompt: bool,
                      prefill: str | None = None) -> ChatPrompt:
        """The same options over other messages (a named context's, before these)."""
        return replace(self, messages=messages, add_generation_prompt=add_generation_prompt,
                       prefill=prefill)


def parse_tools(v: object, name: str = "tools") -> list[dict]:
    """OpenAI's [{type: function, function: {name, description, parameters}}], checked
    and passed to the template as given."""
    out = []
    for where, t in tool_list(v, name):
        fn = t.get("function")
        if t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise bad_request(f"{where} must be {{type: function, function: {{name, "
                              "description, parameters}}}}", where, "invalid_type")
        out.append(function_tool(fn, f"{where}.function"))
    return out


def tool_list(v: object, name: str) -> list[tuple[str, dict]]:
    """(where, tool object) of a request's tools, any API's."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise type_error(name, "a list of tools", v)
    if len(v) > MAX_TOOLS:
        raise bad_request(f"{name} holds at most {MAX_TOOLS} tools", name)
    for i, t in enumerate(v):
        if not isinstance(t, dict):
            raise type_error(f"{name}[{i}]", "a tool (an object)", t)
    return [(f"{name}[{i}]", t) for i, t in enumerate(v)]


def function_tool(fn: dict, where: str, schema_key: str = "parameters") -> dict:
    """A function tool as templates take it (OpenAI's), from an object with a name, a
    description and its arguments' JSON schema under `schema_key` (the API's own)."""
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise bad_request(f"{where}.name must be a non-empty string", f"{where}.name",
                          "missing_field" if fn.get("name") is None else "invalid_value")
    if not isinstance(fn.get("description") or "", str):
        raise type_error(f"{where}.description", "a string", fn["description"])
    params = fn.get(schema_key)
    if params is not None and not isinstance(params, dict):
        raise type_error(f"{where}.{schema_key}", "a JSON schema (an object)", params)
    out = {k: v for k, v in fn.items() if k not in ("type", schema_key)}
    return {"type": "function", "function": {**out, "parameters": params or {}}}


def _tool_choice(v: object, tools: list[dict]) -> tuple[str, str | None]:
    """(none | auto | required, the function a named choice forces or None)."""
    if v is None:
        return "auto", None
    if isinstance(v, str):
        if v not in TOOL_CHOICES:
            raise bad_request(f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or "
                              f"{{type: function, function: {{name}}}}, got {v!r}",
                              "tool_choice")
        return check_choice(v, None, tools, "tool_choice")
    fn = v.get("function") if isinstance(v, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise type_error("tool_choice", "a string or {type: function, function: {name}}", v)
    return check_choice("required", name, tools, "tool_choice.function.name")


def check_choice(choice: str, name: str | None, tools: list[dict],
                 where: str) -> tuple[str, str | None]:
    """A tool choice that can be kept: `required` with tools, a name among them."""
    if choice == "required" and not tools:
        raise bad_request(f"{where}: a tool call is required, but the request has no tools",
                          where)
    if name is not None and name not in {t["function"]["name"] for t in tools}:
        raise bad_request(f"{where} names {name!r}, which is not among the tools", where)
    return choice, name


def template_kwargs(f: Fields) -> tuple[dict, bool | None]:
    """chat_template_kwargs (extra template variables) and the thinking switch they or
    reasoning_effort set ("none": off, as llama-server reads it)."""
    v = f.get("chat_template_kwargs")
    if v is not None and not isinstance(v, dict):
        raise type_error("chat_template_kwargs", "an object", v)
    kwargs = dict(v or {})
    thinking = kwargs.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise type_error("chat_template_kwargs.enable_thinking", "a boolean", thinking)
    effort = f.str("reasoning_effort")
    if effort == "none":
        thinking = False
    elif effort:
        kwargs["reasoning_effort"] = effort
    return kwargs, thinking
