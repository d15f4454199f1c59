"""MeetKai's Functionary v3.1 and v3.2 (Llama 3 models with formats of their own).

v3.1: a call is its function's name in a tag, then the arguments as JSON,

    <function=get_weather>{"city": "Paris"}</function>

v3.2: the answer is a run of messages, each opened by `>>>` and its recipient on a line
of its own: `all` for text to the user, a function's name for a call (the prompt ends
with the first `>>>`),

    all
    Let me check.>>>get_weather
    {"city": "Paris"}
"""

from __future__ import annotations

from ckptd.model.text.tool_calls.base import (
    ToolCall,
    ToolFormat,
    held,
    scan_tagged,
    schema_content,
    single_call,
)
from ckptd.model.text.tool_calls.jsonscan import skip_ws, value_end

START, END = "<function=", "</function>"
SEP = ">>>"
_NAME_MAX = 128


def json_args(s: str, a: int) -> tuple[str, int | None]:
    """The arguments object at s[a] as far as written, and its end (None: unfinished);
    ValueError when s[a] starts something else."""
    if a < len(s) and s[a] != "{":
        raise ValueError(f"expected arguments at {a}")
    end = value_end(s, a) if a < len(s) else None
    return (s[a:] if end is None else s[a:end]), end


class FunctionaryV31(ToolFormat):
    name = "functionary_v3_1"
    separator = ""

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int):
            close = text.find(">", j)
            if close < 0:
                if "\n" in text[j:] or len(text) - j > _NAME_MAX:
                    raise ValueError("no function name")
                return None, None
            name = text[j:close]
            if not name or any(c.isspace() for c in name) or (schemas and name not in schemas):
                raise ValueError(f"{name!r} is not a tool")
            arguments, end = json_args(text, skip_ws(text, close + 1))
            if end is None:
                return ToolCall(name, arguments, False), None
            k = skip_ws(text, end)
            if text.startswith(END, k):
                return ToolCall(name, arguments), k + len(END)
            if END.startswith(text[k:]):
                return ToolCall(name, arguments), len(text)   # ends in its closing tag
            return ToolCall(name, arguments), k
        return scan_tagged(text, partial, START, single_call(read))

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f"{START}{name}>", "content": schema_content(schema),
                "end": END}


class FunctionaryV32(ToolFormat):
    """Its text is framed too (`all` + a newline): the format reads every answer."""
    name = "functionary_v3_2"
    separator = SEP
    frames_content = True

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        content: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while True:
            nl = text.find("\n", pos)
            if nl < 0:                      # the recipient's line is not finished
                if not partial:
                    content.append(text[pos:])
                break
            who = text[pos:nl].strip()
            if who != "all" and who in schemas:
                try:
                    arguments, end = json_args(text, skip_ws(text, nl + 1))
                except ValueError:
                    end = -1                # not a call after all: the message is text
                if end is None:
                    if partial:
                        calls.append(ToolCall(who, arguments, False))
                    else:
                        content.append(text[pos:])  # cut off: its text stays text
                    break
                if end >= 0:
                    calls.append(ToolCall(who, arguments))
                    k = skip_ws(text, end)
                    if text.startswith(SEP, k):
                        pos = k + len(SEP)
                        continue
                    tail = text[k:]
                    content.append(tail[:len(tail) - held(tail, SEP)] if partial else tail)
                    break
            start = nl + 1 if who == "all" else pos
            nxt = text.find(SEP, nl + 1)
            if nxt < 0:
                tail = text[start:]
                content.append(tail[:len(tail) - held(tail, SEP)] if partial else tail)
                break
            content.append(text[start:nxt])
            pos = nxt + len(SEP)
        return "".join(content), calls

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f"{name}\n", "content": schema_content(schema),
                "end": ""}
