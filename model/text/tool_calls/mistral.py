"""Mistral's tokenizer v11+ format (Devstral, Magistral, Ministral 3, Mistral Small
3.2): each call opens with `[TOOL_CALLS]`, its function's name, the arguments after
`[ARGS]`,

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}

Mistral Small 3.2 writes the call's id between them (`[CALL_ID]abc123def`): kept as
the call's id, so a client that sends it back gives the template the 9-character id
it asks for. Text before the first call is content."""

from __future__ import annotations

from ckptd.model.text.tool_calls.base import (
    ToolCall,
    ToolFormat,
    scan_tagged,
    schema_content,
    single_call,
)
from ckptd.model.text.tool_calls.functionary import json_args
from ckptd.model.text.tool_calls.jsonscan import skip_ws

START, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_NAME_MAX = 128


class Mistral(ToolFormat):
    name = "mistral"
    separator = ""

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int):
            k = text.find("[", j)
            if k < 0:                       # the name is still being written
                if len(text) - j > _NAME_MAX or any(c.isspace() for c in text[j:]):
                    raise ValueError("no function name")
                return None, None
            name = text[j:k]
            if not name or any(c.isspace() for c in name) or (schemas and name not in schemas):
                raise ValueError(f"{name!r} is not a tool")
            call_id = None
            if text.startswith(CALL_ID, k):
                at = k + len(CALL_ID)
                k = text.find(ARGS, at)
                if k < 0:
                    return None, None
                call_id = text[at:k].strip() or None
            elif not text.startswith(ARGS, k):
                if ARGS.startswith(text[k:]) or CALL_ID.startswith(text[k:]):
                    return None, None       # a mark still being written
                raise ValueError(f"no {ARGS} after {name!r}")
            arguments, end = json_args(text, skip_ws(text, k + len(ARGS)))
            return ToolCall(name, arguments, end is not None, call_id), end
        return scan_tagged(text, partial, START, single_call(read))

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": f"{START}{name}{ARGS}",
                "content": schema_content(schema), "end": ""}
