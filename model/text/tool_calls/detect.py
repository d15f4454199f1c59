"""Which call syntax a chat template teaches, read from what it renders: a conversation
with one past call of a probe tool is rendered, and the shape the template writes that
call in names the format (as llama.cpp's template analysis compares renders). A
template that writes no tools at all gets the generic format, described in the system
message; one that writes calls in a syntax of none of these formats (Gemma 4's,
Kimi K3's...) has no format here: tools are refused with it rather than read wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from ckptd.model.text.tool_calls.base import ToolFormat
from ckptd.model.text.tool_calls.dsml import DeepSeekV4, DeepSeekV32, MiniCpm5, MiniMaxM2
from ckptd.model.text.tool_calls.functionary import FunctionaryV31, FunctionaryV32
from ckptd.model.text.tool_calls.gemma4 import Gemma4
from ckptd.model.text.tool_calls.generic import Generic
from ckptd.model.text.tool_calls.gigachat import GigaChat3, GigaChat31
from ckptd.model.text.tool_calls.glm import Glm, Hy3
from ckptd.model.text.tool_calls.harmony import Harmony
from ckptd.model.text.tool_calls.hermes import Hermes
from ckptd.model.text.tool_calls.json_list import (
    Apertus,
    Apriel,
    CommandR7B,
    FireFunctionV2,
    Granite,
    MistralNemo,
    NemotronV2,
)
from ckptd.model.text.tool_calls.kimi import KimiK2
from ckptd.model.text.tool_calls.kimi_k3 import KimiK3
from ckptd.model.text.tool_calls.lfm2 import Lfm2
from ckptd.model.text.tool_calls.llama3 import Llama3
from ckptd.model.text.tool_calls.minimax_m1 import MiniMaxM1
from ckptd.model.text.tool_calls.minimax_m3 import MiniMaxM3
from ckptd.model.text.tool_calls.mistral import Mistral
from ckptd.model.text.tool_calls.muse import MuseGlimmer
from ckptd.model.text.tool_calls.qwen_xml import QwenXml, SeedOss
from ckptd.model.text.tool_calls.reasoning import THINK, Marks
from ckptd.model.text.tool_calls.solar import SolarOpen

FORMATS = {f.name: f for f in (Hermes(), QwenXml(), Glm(), Llama3(), FunctionaryV31(),
                               FunctionaryV32(), FireFunctionV2(), Apriel(), NemotronV2(),
                               Mistral(), CommandR7B(), DeepSeekV32(),
                               DeepSeekV4(), GigaChat3(), GigaChat31(), SeedOss(),
                               MiniMaxM1(), MiniMaxM2(), KimiK2(), Harmony(),
                               MistralNemo(), Granite(), Lfm2(), Apertus(), SolarOpen(),
                               Hy3(), MiniCpm5(), KimiK3(), MiniMaxM3(), Gemma4(),
                               MuseGlimmer(), Generic())}
PROBE = "ckptd_probe_tool"          # a tool name no template writes by itself
_ARGS = {"probe_arg": "probe_value"}
_ID = "call00000"                   # Mistral's templates take ids of 9 letters or digits
_LONG_ID = "call_0123456789abcdef01234567"  # as ckptd gives calls
_TOOL = {"type": "function", "function": {
    "name": PROBE, "description": "a probe", "parameters": {
        "type": "object", "properties": {"probe_arg": {"type": "string"}}}}}
# How each format writes the probe call, most specific first
_SHAPES = [
    ("qwen_xml", r"<tool_call>\s*<function=ckptd_probe_tool>\s*<parameter=probe_arg>"),
    ("seed_oss", r"<seed:tool_call>\s*<function=ckptd_probe_tool>\s*<parameter=probe_arg>"),
    ("glm", r"<tool_call>\s*ckptd_probe_tool\s*<arg_key>probe_arg</arg_key>"),
    ("hermes", r'<tool_call>\s*\{"name":\s*"ckptd_probe_tool",\s*"arguments":'),
    ("functionary_v3_1", r'<function=ckptd_probe_tool>\s*\{"probe_arg"'),
    ("functionary_v3_2", r'>>>\s*ckptd_probe_tool\n\{"probe_arg"'),
    ("firefunction_v2", r'functools\[\{"name":\s*"ckptd_probe_tool",\s*"arguments":'),
    ("apriel", r'<tool_calls>\[\{"name":\s*"ckptd_probe_tool",\s*"arguments":'),
    ("nemotron_v2", r'<TOOLCALL>\[\{"name":\s*"ckptd_probe_tool",\s*"arguments":'),
    ("command_r7b", r'<\|START_ACTION\|>\[\s*\{"tool_call_id":\s*"0",\s*"tool_name":\s*'
                    r'"ckptd_probe_tool",\s*"parameters":'),
    ("deepseek_v3_2", r'<｜DSML｜function_calls>\s*<｜DSML｜invoke name="ckptd_probe_tool">'),
    ("deepseek_v4", r'<｜DSML｜tool_calls>\s*<｜DSML｜invoke name="ckptd_probe_tool">'),
    ("kimi_k2", r"<\|tool_calls_section_begin\|>\s*<\|tool_call_begin\|>\s*"
                r"functions\.ckptd_probe_tool:\d+\s*<\|tool_call_argument_begin\|>"),
    ("gpt_oss", r"to=functions\.ckptd_probe_tool\s*<\|channel\|>commentary[^<]*<\|message\|>"
                r'\{"probe_arg"'),
    ("minimax_m1", r'<tool_calls>\s*\{"name":\s*"ckptd_probe_tool",\s*"arguments":'),
    ("minimax_m2", r'<minimax:tool_call>\s*<invoke name="ckptd_probe_tool">\s*'
                   r'<parameter name="probe_arg">'),
    ("gigachat_v3", r'<\|message_sep\|>\n\nfunction call<\|role_sep\|>\n\{"name":\s*'
                    r'"ckptd_probe_tool",\s*"arguments":'),
    ("gigachat_v3_1", r'<\|function_call\|>\{"name":\s*"ckptd_probe_tool",\s*"arguments":'),
    ("mistral_nemo", r'\[TOOL_CALLS\]\s*\[\{"name":\s*"ckptd_probe_tool",\s*"arguments":'),
    ("mistral", r'\[TOOL_CALLS\]ckptd_probe_tool(\[CALL_ID\]\w+)?\[ARGS\]\{"probe_arg"'),
    ("llama3", r'\{"name":\s*"ckptd_probe_tool",\s*"parameters":\s*\{"probe_arg"'),
    ("solar_open", r"<\|tool_calls\|>\s*<\|tool_call:begin\|>[^<]*<\|tool_call:name\|>"
                   r"ckptd_probe_tool<\|tool_call:args\|>"),
    ("lfm2", r"<\|tool_call_start\|>\[ckptd_probe_tool\(probe_arg="),
    ("hy3", r"<tool_calls:opensource>\s*<tool_call:opensource>ckptd_probe_tool"
            r"<tool_sep:opensource>\s*<arg_key:opensource>probe_arg</arg_key:opensource>"),
    ("minicpm5", r'<function name="ckptd_probe_tool">\s*<param name="probe_arg">'),
    ("kimi_k3", r'<\|open\|>tools<\|sep\|><\|open\|>call tool="ckptd_probe_tool" index="\d+"'
                r'<\|sep\|><\|open\|>argument key="probe_arg"'),
    ("minimax_m3", r'\]<\]minimax\[>\[<tool_call>\s*\]<\]minimax\[>\['
                   r'<invoke name="ckptd_probe_tool">\]<\]minimax\[>\[<probe_arg>'),
    ("gemma4", r'<\|tool_call>call:ckptd_probe_tool\{probe_arg:<\|"\|>probe_value<\|"\|>\}'),
    ("muse_glimmer", r'to=ckptd_probe_tool<\|message\|><atem:function_calls>\s*'
                     r'<atem:invoke name="ckptd_probe_tool">\s*<atem:parameter name="probe_arg">'),
    ("apertus", r'<\|tools_prefix\|>\[\{"ckptd_probe_tool":\s*\{"probe_arg"'),
]
# Templates that write no past call but name their syntax with the tools (as llama.cpp
# tells them by their source): the mark in the prompt -> the format
_HINTS = [
    ("granite", r"<\|tool_call\|> followed by a JSON list"),
    ("lfm2", r"List of tools: (<\|tool_list_start\|>)?\["),
]

# render(messages, tools) -> the prompt; ValueError when the template refuses them
Render = Callable[[list[dict], list[dict]], str]


@dataclass(frozen=True)
class ToolSyntax:
    """What a chat template teaches: its call format (None: one not read here), whether
    it writes the tools it is given into the prompt, whether it takes a call's
    arguments as JSON text rather than an object, and how it writes a call."""
    fmt: ToolFormat | None
    shows_tools: bool
    string_arguments: bool = False
    sample: str = ""
    short_ids: bool = False     # it takes only 9-character call ids (Mistral's)
    thinking: bool = False      # answers may open with a thinking block
    marks: Marks = THINK        # ... written in these marks


def _conversation(arguments: object, call_id: str = _ID) -> list[dict]:
    return [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": PROBE, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id, "name": PROBE, "content": "probe_result"}]


def _try(render: Render, messages: list[dict], tools: list[dict]) -> str | None:
    try:
        return render(messages, tools)
    except ValueError:
        return None


def detect(render: Render) -> ToolSyntax:
    shown = _try(render, [{"role": "user", "content": "hi"}], [_TOOL]) or ""
    if PROBE not in shown:
        return ToolSyntax(FORMATS["generic"], False)       # it teaches no syntax
    text, as_string = _try(render, _conversation(_ARGS), [_TOOL]), False
    if text is None:            # some templates concatenate the arguments as text
        text, as_string = _try(render, _conversation(json.dumps(_ARGS)), [_TOOL]), True
    args = json.dumps(_ARGS) if as_string else _ARGS
    short_ids = text is not None and _try(render, _conversation(args, _LONG_ID), [_TOOL]) is None
    for name, shape in _SHAPES:
        if text is not None and re.search(shape, text):
            return ToolSyntax(FORMATS[name], True, as_string, short_ids=short_ids)
    for name, hint in _HINTS:
        if "probe_value" not in (text or "") and re.search(hint, shown):
            return ToolSyntax(FORMATS[name], True, as_string, short_ids=short_ids)
    at = (text or "").rfind(PROBE)
    sample = text[max(0, at - 40):at + 60] if at >= 0 else ""
    return ToolSyntax(None, True, as_string, sample, short_ids=short_ids)
