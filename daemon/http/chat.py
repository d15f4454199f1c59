"""A chat request's prompt as llama-server and OpenAI take it: the messages, the tools
a template describes to the model, and the template's options (add_generation_prompt,
continue_final_message, chat_template_kwargs, reasoning). Service.render_chat turns it
into text."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ckptd.daemon.http import prompts
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
    def parse(cls, f: Fields, allow_empty: bool = False) -> ChatPrompt:
        raw = f.data.get("messages")
        media = Media()
        msgs = prompts.messages(raw, allow_empty=allow_empty, media=media)
        add = f.bool("add_generation_prompt", True)
        cont = f.bool("continue_final_message")
        if cont:
            if "add_generation_prompt" in f.data and add:
                raise bad_request("continue_final_message and add_generation_prompt can not "
                                  "both be true", "continue_final_message")
            if not msgs or msgs[-1]["role"] != "assistant":
                raise bad_request("continue_final_message needs an assistant message last",
                                  "continue_final_message")
        prefill = None
        last = msgs[-1] if msgs else {}
        # llama-server continues a last assistant message (an answer's start) unasked
        if len(msgs) > 1 and last["role"] == "assistant" and not last.get("tool_calls"):
            prefill = prompts.content_text(raw[-1].get("content"),
                                           f"messages[{len(msgs) - 1}].content", "\n\n")
            msgs = msgs[:-1]
        tools = parse_tools(f.data.get("tools"))
        kwargs, thinking = _template_kwargs(f)
        choice, name = _tool_choice(f.data.get("tool_choice"), tools)
        fmt = f.str("reasoning_format") or "auto"
        if fmt not in REASONING_FORMATS:
            raise bad_request(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}"
                              f", got {fmt!r}", "reasoning_format")
        return cls(msgs, tools, choice, name, f.bool("parallel_tool_calls", True), add,
                   prefill, kwargs, thinking, fmt, media or None)

    def with_messages(self, messages: list[dict], add_generation_prompt: bool,
                      prefill: str | None = None) -> ChatPrompt:
        """The same options over other messages (a named context's, before these)."""
        return replace(self, messages=messages, add_generation_prompt=add_generation_prompt,
                       prefill=prefill)


def parse_tools(v: object, name: str = "tools") -> list[dict]:
    """OpenAI's [{type: function, function: {name, description, parameters}}], checked
    and passed to the template as given."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise type_error(name, "a list of tools", v)
    if len(v) > MAX_TOOLS:
        raise bad_request(f"{name} holds at most {MAX_TOOLS} tools", name)
    out = []
    for i, t in enumerate(v):
        where = f"{name}[{i}]"
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or \
                not isinstance(fn, dict):
            raise bad_request(f"{where} must be {{type: function, function: {{name, "
                              "description, parameters}}}}", where, "invalid_type")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"{where}.function.name must be a non-empty string",
                              f"{where}.function.name")
        if not isinstance(fn.get("description", ""), str):
            raise type_error(f"{where}.function.description", "a string",
                             fn["description"])
        if not isinstance(fn.get("parameters", {}), dict):
            raise type_error(f"{where}.function.parameters", "a JSON schema (an object)",
                             fn["parameters"])
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(v: object, tools: list[dict]) -> tuple[str, str | None]:
    """(none | auto | required, the function a named choice forces or None)."""
    if v is None:
        return "auto", None
    if isinstance(v, str):
        if v not in TOOL_CHOICES:
            raise bad_request(f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or "
                              f"{{type: function, function: {{name}}}}, got {v!r}",
                              "tool_choice")
        if v == "required" and not tools:
            raise bad_request("tool_choice 'required' needs tools", "tool_choice")
        return v, None
    fn = v.get("function") if isinstance(v, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise type_error("tool_choice", "a string or {type: function, function: {name}}", v)
    if name not in {t["function"]["name"] for t in tools}:
        raise bad_request(f"tool_choice names {name!r}, which is not among the tools",
                          "tool_choice.function.name")
    return "required", name


def _template_kwargs(f: Fields) -> tuple[dict, bool | None]:
    """chat_template_kwargs (extra template variables) and the thinking switch they or
    reasoning_effort set ("none": off, as llama-server reads it)."""
    v = f.data.get("chat_template_kwargs")
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
