"""Formats that write all of an answer's calls as one JSON list between two marks, text
before it:

- Fireworks' FireFunction v2 (a Llama 3 model): `functools[{"name": ..., "arguments":
  {...}}, ...]`, no closing mark;
- ServiceNow's Apriel 1.5 / 1.6: `<tool_calls>[...]</tool_calls>` (the model may add an
  "id" to each call: it is not read);
- Mistral Nemo: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]` (the id,
  9 letters or digits, is not read);
- NVIDIA's Nemotron Nano v2: `<TOOLCALL>[...]</TOOLCALL>`;
- Cohere's Command R7B and Command A (Cohere2): `<|START_ACTION|>[{"tool_call_id": "0",
  "tool_name": ..., "parameters": {...}}, ...]<|END_ACTION|>`; their text is framed,
  `<|START_RESPONSE|>...<|END_RESPONSE|>` (R7B) or `<|START_TEXT|>...<|END_TEXT|>`
  (Command A), and the frame is not content (as llama.cpp reads it), tools or not;
- IBM's Granite 3.3: `<|tool_call|>[...]`, no closing mark (its system message asks
  for it; the template writes no past call);
- Swiss AI's Apertus: `<|tools_prefix|>[{"get_weather": {"city": "Paris"}}, ...]
  <|tools_suffix|>`, each call an object whose one key is the function's name.
"""

from __future__ import annotations

import json
from dataclasses import replace

from ckptd.model.text.tool_calls.base import (
    ToolCall,
    ToolFormat,
    json_call,
    scan_tagged,
    schema_content,
    unframe,
)
from ckptd.model.text.tool_calls.jsonscan import array_items, object_fields, skip_ws


class JsonList(ToolFormat):
    """`open` is the mark up to the list's `[`, `close` what follows its `]`."""
    open = ""
    close = ""
    name_key = "name"
    separator = ", "

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        def read(text: str, j: int) -> tuple[list[ToolCall], int | None]:
            items, end = array_items(text, j - 1)      # from the list's "["
            calls = [c for c, _ in (self.call(text, a, schemas) for a, _ in items)
                     if c is not None]
            if end is None or not self.close:
                return calls, end
            k = skip_ws(text, end)
            if text.startswith(self.close, k):
                return calls, k + len(self.close)
            if self.close.startswith(text[k:]):
                return calls, len(text)     # the text ends in (or before) the closing mark
            return calls, end
        return scan_tagged(text, partial, self.open + "[", read)

    def call(self, s: str, i: int, schemas: dict[str, dict]):
        return json_call(s, i, schemas, self.name_key)

    def tag(self, name: str, schema: dict) -> dict:
        return {"type": "tag", "begin": self.begin(name), "content": schema_content(schema),
                "end": "}"}

    def begin(self, name: str) -> str:
        return f'{{"name": {json.dumps(name)}, "arguments": '

    def wrap(self, calls: dict) -> dict:
        return {"type": "sequence", "elements": [
            {"type": "const_string", "value": self.open + "["}, calls,
            {"type": "const_string", "value": "]" + self.close}]}


class FireFunctionV2(JsonList):
    name = "firefunction_v2"
    open = "functools"


class Apriel(JsonList):
    name = "apriel"
    open, close = "<tool_calls>", "</tool_calls>"


class MistralNemo(JsonList):
    name = "mistral_nemo"
    open = "[TOOL_CALLS]"


class NemotronV2(JsonList):
    name = "nemotron_v2"
    open, close = "<TOOLCALL>", "</TOOLCALL>"


class CommandR7B(JsonList):
    """A call's tool_call_id, written before its name, is kept as its id (the grammar
    numbers every call "0", a tag's opening text being fixed: an id used twice in an
    answer is replaced, reply.call_ids)."""
    name = "command_r7b"
    open, close = "<|START_ACTION|>", "<|END_ACTION|>"
    name_key = "tool_name"
    frames_content = True
    frames = ("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>")

    def parse(self, text: str, partial: bool,
              schemas: dict[str, dict]) -> tuple[str, list[ToolCall]]:
        content, calls = super().parse(text, partial, schemas)
        return unframe(content, partial, self.frames), calls

    def call(self, s: str, i: int, schemas: dict[str, dict]):
        if not schemas:                 # (an answer read without tools has no calls)
            raise ValueError("no tools")
        call, end = super().call(s, i, schemas)
        fields, _ = object_fields(s, i)
        at, name_at = fields.get("tool_call_id"), fields.get(self.name_key)
        if call is None or at is None or at[1] is None or at[0] > name_at[0]:
            return call, end            # (an id after the name: a stream sent the call)
        call_id = json.loads(s[at[0]:at[1]])
        return replace(call, id=str(call_id) if call_id is not None else None), end

    def begin(self, name: str) -> str:
        return f'{{"tool_call_id": "0", "tool_name": {json.dumps(name)}, "parameters": '


class Granite(JsonList):
    name = "granite"
    open = "<|tool_call|>"


class Apertus(JsonList):
    name = "apertus"
    open, close = "<|tools_prefix|>", "<|tools_suffix|>"

    def call(self, s: str, i: int, schemas: dict[str, dict]):
        """{NAME: {arguments}} at s[i], as json_call reads its form."""
        fields, end = object_fields(s, i)
        if len(fields) > 1 or (end is not None and len(fields) != 1):
            raise ValueError("a call is an object of one member")
        if not fields:
            return None, None
        (key, (a, b)), = fields.items()
        if (schemas and key not in schemas) or not key:
            raise ValueError(f"{key!r} is not a tool")
        if s[a] != "{":
            raise ValueError("a call's arguments are an object")
        if b is None:
            return ToolCall(key, s[a:], False), None
        return ToolCall(key, s[a:b], end is not None), end

    def begin(self, name: str) -> str:
        return f"{{{json.dumps(name)}: "
