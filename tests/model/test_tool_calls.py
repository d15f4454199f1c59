"""Tool-call parsers (model/text/tool_calls/): each format read whole, and streamed in
arbitrary splits, gives the same calls and content; markup never reaches content."""

from __future__ import annotations

import json
import random

import pytest

from ckptd.model.text.tool_calls.detect import FORMATS
from ckptd.model.text.tool_calls.reasoning import APRIEL, Marks, opens_thinking
from ckptd.model.text.tool_calls.reply import Delta, ReplyParser, ReplySpec

SCHEMAS = {"get_weather": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"}}},
    "ping": {"type": "object", "properties": {}}}

# (format, model text, content, [(name, arguments as parsed JSON)])
CASES = [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Paris", "days": 3}}\n</tool_call>',
     "Let me check.", [("get_weather", {"city": "Paris", "days": 3})]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "O\\"slo {x}"}}'
               '\n</tool_call>\n<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>',
     "", [("get_weather", {"city": 'O"slo {x}'}), ("ping", {})]),
    ("hermes", '<tool_call>{"name": "ping", "arguments": "{\\"a\\": 1}"}</tool_call>',
     "", [("ping", {"a": 1})]),
    ("hermes", "a < b, and <tool_call> is how I call tools", "a < b, and <tool_call> is how "
     "I call tools", []),
    ("qwen_xml", "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n"
                 "</parameter>\n<parameter=days>\n2\n</parameter>\n<parameter=zip>\n10001\n"
                 "</parameter>\n</function>\n</tool_call>",
     "Sure.", [("get_weather", {"city": "New York", "days": 2, "zip": "10001"})]),
    ("qwen_xml", "<tool_call>\n<function=ping>\n</function>\n</tool_call>\n<tool_call>\n"
                 "<function=get_weather>\n<parameter=city>\na <b> c\n</parameter>\n"
                 "</function>\n</tool_call>",
     "", [("ping", {}), ("get_weather", {"city": "a <b> c"})]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Rome"}}',
     "", [("get_weather", {"city": "Rome"})]),
    ("llama3", 'Calling: {"type": "function", "name": "ping", "parameters": {}}; '
               '{"name": "get_weather", "parameters": {"days": 1}}',
     "Calling:", [("ping", {}), ("get_weather", {"days": 1})]),
    ("llama3", 'Use {"x": 1} as the body.', 'Use {"x": 1} as the body.', []),
    ("generic", '{"tool_call": {"name": "get_weather", "arguments": {"city": "Lima"}}}',
     "", [("get_weather", {"city": "Lima"})]),
    ("generic", '{"tool_calls": [{"name": "ping", "arguments": {}}, {"name": "get_weather", '
                '"arguments": {"days": 4}}]}',
     "", [("ping", {}), ("get_weather", {"days": 4})]),
    ("generic", '{"response": "Hello \\"world\\"\\n"}', 'Hello "world"', []),
    ("generic", "Just text {with braces}.", "Just text {with braces}.", []),
    ("glm", "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
            "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
     "Let me check.", [("get_weather", {"city": "Paris", "days": 3})]),
    ("glm", "<tool_call>get_weather<arg_key>city</arg_key><arg_value> a <b> c</arg_value>"
            "</tool_call><tool_call>ping</tool_call>",
     "", [("get_weather", {"city": " a <b> c"}), ("ping", {})]),
    ("functionary_v3_1", 'Sure.<function=get_weather>{"city": "Paris", "days": 3}</function>',
     "Sure.", [("get_weather", {"city": "Paris", "days": 3})]),
    ("functionary_v3_1", '<function=ping>{}</function><function=get_weather>{"zip": "x>y"}'
                         '</function>', "", [("ping", {}), ("get_weather", {"zip": "x>y"})]),
    ("functionary_v3_2", 'all\nLet me check.>>>get_weather\n{"city": "Paris"}',
     "Let me check.", [("get_weather", {"city": "Paris"})]),
    ("functionary_v3_2", 'get_weather\n{"days": 2}>>>ping\n{}', "",
     [("get_weather", {"days": 2}), ("ping", {})]),
    ("functionary_v3_2", "all\nJust text, a >> b.", "Just text, a >> b.", []),
    ("firefunction_v2", 'Checking. functools[{"name": "get_weather", "arguments": {"city": '
                        '"Oslo"}}, {"name": "ping", "arguments": {}}]',
     "Checking.", [("get_weather", {"city": "Oslo"}), ("ping", {})]),
    ("firefunction_v2", "No functools here.", "No functools here.", []),
    ("apriel", 'Checking.\n<tool_calls>[{"name": "get_weather", "arguments": {"city": "Oslo"}, '
               '"id": "abc123def"}, {"name": "ping", "arguments": {}}]</tool_calls>',
     "Checking.", [("get_weather", {"city": "Oslo"}), ("ping", {})]),
    ("apriel", "A list: <tool_calls> are [1, 2]", "A list: <tool_calls> are [1, 2]", []),
    ("nemotron_v2", '<TOOLCALL>[{"name": "get_weather", "arguments": {"days": 2}}]</TOOLCALL>',
     "", [("get_weather", {"days": 2})]),
    ("mistral", 'Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris [FR]", "days": 3}'
                "[TOOL_CALLS]ping[ARGS]{}",
     "Let me check.", [("get_weather", {"city": "Paris [FR]", "days": 3}), ("ping", {})]),
    ("mistral", '[TOOL_CALLS]get_weather[CALL_ID]abc123def[ARGS]{"zip": "x"}', "",
     [("get_weather", {"zip": "x"})]),
    ("command_r7b", '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", '
                    '"parameters": {"city": "Paris"}},\n    {"tool_call_id": "1", "tool_name": '
                    '"ping", "parameters": {}}\n]<|END_ACTION|>', "",
     [("get_weather", {"city": "Paris"}), ("ping", {})]),
    ("command_r7b", 'An action: <|START_ACTION|>[{"name": "ping", "parameters": {}}]',
     'An action: <|START_ACTION|>[{"name": "ping", "parameters": {}}]', []),
    ("deepseek_v3_2", 'Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
                      '<｜DSML｜parameter name="city" string="true">a <b> "c"</｜DSML｜parameter>\n'
                      '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
                      '</｜DSML｜invoke>\n<｜DSML｜invoke name="ping">\n</｜DSML｜invoke>\n'
                      '</｜DSML｜function_calls>',
     "Checking.", [("get_weather", {"city": 'a <b> "c"', "days": 3}), ("ping", {})]),
    ("deepseek_v4", '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter '
                    'name="zip" string="true">007</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
                    '</｜DSML｜tool_calls>', "", [("get_weather", {"zip": "007"})]),
    ("deepseek_v4", "About <｜DSML｜tool_calls> tags.", "About <｜DSML｜tool_calls> tags.", []),
    ("minimax_m2", 'Checking.\n<minimax:tool_call>\n<invoke name="get_weather">\n'
                   '<parameter name="city">a <b> "c"</parameter>\n<parameter name="days">3'
                   '</parameter>\n<parameter name="zip">007</parameter>\n</invoke>\n'
                   '<invoke name="ping">\n</invoke>\n</minimax:tool_call>',
     "Checking.", [("get_weather", {"city": 'a <b> "c"', "days": 3, "zip": "007"}),
                   ("ping", {})]),
    ("kimi_k2", "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|>'
                "<|tool_call_begin|>functions.ping:1<|tool_call_argument_begin|>{}"
                "<|tool_call_end|><|tool_calls_section_end|>",
     "Checking.", [("get_weather", {"city": "Paris", "days": 3}), ("ping", {})]),
    ("kimi_k2", "The <|tool_calls_section_begin|> mark.", "The <|tool_calls_section_begin|> mark.",
     []),
    ("gpt_oss", "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>"
                'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
                "<|call|><|start|>assistant to=functions.ping<|channel|>commentary json"
                "<|message|>{}<|call|>",
     "Checking.", [("get_weather", {"city": "Paris"}), ("ping", {})]),
    ("gpt_oss", "<|channel|>final<|message|>It is {sunny}.<|return|>", "It is {sunny}.", []),
    ("gpt_oss", "No harmony at all, to=functions.ping.", "No harmony at all, to=functions.ping.",
     []),
    ("mistral_nemo", 'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, '
                     '"id": "a1b2c3d4e"}, {"name": "ping", "arguments": {}, "id": "f5g6h7i8j"}]',
     "Sure.", [("get_weather", {"city": "Oslo"}), ("ping", {})]),
    ("minimax_m1", 'Checking.\n<tool_calls>\n{"name": "get_weather", "arguments": {"city": "Rome"}}'
                   '\n{"name": "ping", "arguments": {}}\n</tool_calls>',
     "Checking.", [("get_weather", {"city": "Rome"}), ("ping", {})]),
    ("minimax_m2", "About <minimax:tool_call> and <invoke name=\"x\">.",
     "About <minimax:tool_call> and <invoke name=\"x\">.", []),
    ("gigachat_v3_1", 'Checking.<|function_call|>{"name": "get_weather", "arguments": '
                      '{"city": "Paris", "days": 3}}',
     "Checking.", [("get_weather", {"city": "Paris", "days": 3})]),
    ("gigachat_v3", 'Checking.<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "ping", '
                    '"arguments": {}}', "Checking.", [("ping", {})]),
    ("gigachat_v3_1", "No <|function_call|> here.", "No <|function_call|> here.", []),
    ("seed_oss", "Sure.\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris"
                 "</parameter>\n<parameter=days>2</parameter>\n</function>\n</seed:tool_call>",
     "Sure.", [("get_weather", {"city": "Paris", "days": 2})]),
    ("seed_oss", "<tool_call>\n<function=ping>\n</function>\n</tool_call>",
     "<tool_call>\n<function=ping>\n</function>\n</tool_call>", []),
    ("mistral", "Mistral writes [TOOL_CALLS] then [ARGS].", "Mistral writes [TOOL_CALLS] then "
     "[ARGS].", []),
]


def _calls(parsed) -> list:
    return [(c.name, json.loads(c.arguments)) for c in parsed.calls]


def _stream(spec: ReplySpec, text: str, rng: random.Random) -> dict:
    """The text fed in random pieces; the deltas put back together."""
    parser, deltas, i = ReplyParser(spec), [], 0
    while i < len(text):
        n = rng.choice([1, 1, 2, 3, 5, 8])
        deltas.append(parser.feed(text[i:i + n]))
        i += n
    deltas.append(parser.finish())
    return _assemble(deltas)


def _assemble(deltas: list[Delta]) -> dict:
    out = {"content": "", "reasoning": "", "calls": []}
    for d in deltas:
        out["content"] += d.content
        out["reasoning"] += d.reasoning
        for c in d.calls:
            if c.index == len(out["calls"]):
                assert c.id and c.name, "a call's first delta carries its id and name"
                out["calls"].append([c.name, ""])
            else:
                assert c.id is None and c.name is None
            out["calls"][c.index][1] += c.arguments
    return out


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_whole_and_streamed_give_the_same_calls(fmt, text, content, calls):
    check_whole_and_streamed(fmt, text, content, calls)


def check_whole_and_streamed(fmt: str, text: str, content: str, calls: list) -> None:
    spec = ReplySpec(FORMATS[fmt], SCHEMAS)
    whole = spec.parse(text)
    assert whole.content == content
    assert _calls(whole) == calls
    for seed in range(20):
        got = _stream(spec, text, random.Random(seed))
        assert got["content"] == content, seed
        assert [(n, json.loads(a)) for n, a in got["calls"]] == calls, seed
        assert [a for _, a in got["calls"]] == [c.arguments for c in whole.calls]


def test_markup_never_reaches_streamed_content():
    text = CASES[0][1]
    parser = ReplyParser(ReplySpec(FORMATS["hermes"], SCHEMAS))
    sent = "".join(parser.feed(ch).content for ch in text) + parser.finish().content
    assert sent == "Let me check."


def test_single_call_kept_without_parallel_calls():
    spec = ReplySpec(FORMATS["hermes"], SCHEMAS, parallel=False)
    assert [c.name for c in spec.parse(CASES[1][1]).calls] == ["get_weather"]


def test_cut_off_call_stays_text():
    text = '<tool_call>\n{"name": "ping", "arguments": {"a": '
    parsed = ReplySpec(FORMATS["hermes"], SCHEMAS).parse(text)
    assert parsed.calls == () and parsed.content == text.strip()


@pytest.mark.parametrize("open_at_start", [False, True])
def test_thinking_goes_to_reasoning(open_at_start):
    text = ("" if open_at_start else "<think>") + "\nfirst, the city.\n</think>\n\n" \
        '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    spec = ReplySpec(FORMATS["hermes"], SCHEMAS, thinking=True, open_thinking=open_at_start)
    whole = spec.parse(text)
    assert whole.reasoning == "first, the city." and whole.content == ""
    assert _calls(whole) == [("ping", {})]
    got = _stream(spec, text, random.Random(1))
    assert got["reasoning"] == "first, the city." and got["content"] == ""


# Thinking blocks in other marks than <think>, each before a call of its template's
# format: (format, marks, whether the prompt opened the block, the answer)
OTHER_THINKING = [
    ("command_r7b", Marks("<|START_THINKING|>", "<|END_THINKING|>"), True,
     'first, the city.<|END_THINKING|><|START_ACTION|>[{"tool_call_id": "0", '
     '"tool_name": "ping", "parameters": {}}]<|END_ACTION|>'),
    ("command_r7b", Marks("<|START_THINKING|>", "<|END_THINKING|>"), False,
     '<|START_THINKING|>first, the city.<|END_THINKING|><|START_ACTION|>[{"tool_call_id": '
     '"0", "tool_name": "ping", "parameters": {}}]<|END_ACTION|>'),
    ("mistral", Marks("[THINK]", "[/THINK]"), False,
     "[THINK]first, the city.[/THINK][TOOL_CALLS]ping[ARGS]{}"),
    ("gpt_oss", Marks("<|channel|>analysis<|message|>", "<|end|>"), False,
     "<|channel|>analysis<|message|>first, the city.<|end|><|start|>assistant<|channel|>"
     "commentary to=functions.ping <|constrain|>json<|message|>{}<|call|>"),
    ("apriel", APRIEL, False,
     'first, the city.\n[BEGIN FINAL RESPONSE]\n<tool_calls>[{"name": "ping", '
     '"arguments": {}}]</tool_calls>'),
]


@pytest.mark.parametrize("fmt,marks,opened,text", OTHER_THINKING)
def test_other_thinking_marks_go_to_reasoning(fmt, marks, opened, text):
    spec = ReplySpec(FORMATS[fmt], SCHEMAS, thinking=True,
                     open_thinking=opened or opens_thinking("", marks), marks=marks)
    whole = spec.parse(text)
    assert whole.reasoning == "first, the city." and whole.content == ""
    assert _calls(whole) == [("ping", {})]
    for seed in range(10):
        got = _stream(spec, text, random.Random(seed))
        assert got["reasoning"] == "first, the city." and got["content"] == "", seed


def test_apriel_answer_without_calls_after_its_reasoning():
    spec = ReplySpec(None, thinking=True, open_thinking=True, marks=APRIEL)
    got = spec.parse("Two and two.\n[BEGIN FINAL RESPONSE]\nFour.")
    assert (got.reasoning, got.content) == ("Two and two.", "Four.")


@pytest.mark.parametrize("fmt,marks,opened,text", OTHER_THINKING)
def test_required_grammar_after_other_thinking_marks(fmt, marks, opened, text):
    from ckptd.model.text.tool_calls.constrain import structural_tag
    open_at_start = opened or opens_thinking("", marks)
    src = structural_tag(FORMATS[fmt], TOOLS, "required", None, False, open_at_start, True,
                         marks=marks)
    assert _accepts(src, text)
    assert not _accepts(src, text.replace(marks.close, "</think>"))


@pytest.mark.parametrize("fmt,text", [
    ("llama3", '{\n  "type": "function",\n  "name": "test123", "parameters": {"a": 1}}'),
    ("hermes", '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'),
    ("qwen_xml", "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>"),
    ("generic", '{"tool_call": {"name": "rm_rf", "arguments": {}}}'),
    ("glm", "<tool_call>rm_rf\n</tool_call>"),
    ("functionary_v3_1", "<function=rm_rf>{}</function>"),
    ("functionary_v3_2", "rm_rf\n{}"),
    ("firefunction_v2", 'functools[{"name": "rm_rf", "arguments": {}}]'),
    ("apriel", '<tool_calls>[{"name": "rm_rf", "arguments": {}}]</tool_calls>'),
    ("nemotron_v2", '<TOOLCALL>[{"name": "rm_rf", "arguments": {}}]</TOOLCALL>'),
    ("mistral", "[TOOL_CALLS]rm_rf[ARGS]{}"),
    ("command_r7b", '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "rm_rf", '
                    '"parameters": {}}]<|END_ACTION|>'),
    ("deepseek_v4", '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="rm_rf">\n</｜DSML｜invoke>\n'
                    '</｜DSML｜tool_calls>'),
    ("gigachat_v3_1", '<|function_call|>{"name": "rm_rf", "arguments": {}}'),
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.rm_rf:0"
                "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"),
    ("gpt_oss", "<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{}<|call|>"),
    ("mistral_nemo", '[TOOL_CALLS][{"name": "rm_rf", "arguments": {}}]'),
    ("minimax_m1", '<tool_calls>\n{"name": "rm_rf", "arguments": {}}\n</tool_calls>'),
    ("minimax_m2", '<minimax:tool_call>\n<invoke name="rm_rf">\n</invoke>\n</minimax:tool_call>'),
    ("seed_oss", "<seed:tool_call>\n<function=rm_rf>\n</function>\n</seed:tool_call>")])
def test_a_call_of_no_tool_is_content(fmt, text):
    spec = ReplySpec(FORMATS[fmt], SCHEMAS)
    assert spec.parse(text).calls == () and spec.parse(text).content == text.strip()
    got = _stream(spec, text, random.Random(0))
    assert got["calls"] == [] and got["content"] == text.strip()


def _accepts(src: str, text: str) -> bool:
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string
    return _is_grammar_accept_string(xgr.Grammar.from_structural_tag(src), text)


TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}}
         for n, s in SCHEMAS.items()]


PING = '{"name": "ping", "arguments": {}}'
DS_PING = '<｜DSML｜invoke name="ping">\n</｜DSML｜invoke>\n'
KIMI, KIMI_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KIMI_PING = "<|tool_call_begin|>functions.ping:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
GPT_PING = "<|channel|>commentary to=functions.ping <|constrain|>json<|message|>{}<|call|>"
MM_PING = '<invoke name="ping">\n</invoke>\n'
R7B_PING = '{"tool_call_id": "0", "tool_name": "ping", "parameters": {}}'


@pytest.mark.parametrize("fmt,call,twice", [
    ("hermes", f"<tool_call>\n{PING}\n</tool_call>", None),
    ("qwen_xml", "<tool_call>\n<function=ping>\n\n</function>\n</tool_call>", None),
    ("llama3", '{"name": "ping", "parameters": {}}', None),
    ("generic", '{"tool_call": {"name": "ping", "arguments": {}}}', None),
    ("glm", "<tool_call>ping\n</tool_call>", None),
    ("functionary_v3_1", "<function=ping>{}</function>", None),
    ("functionary_v3_2", "ping\n{}", None),
    ("firefunction_v2", f"functools[{PING}]", f"functools[{PING}, {PING}]"),
    ("apriel", f"<tool_calls>[{PING}]</tool_calls>", f"<tool_calls>[{PING}, {PING}]</tool_calls>"),
    ("nemotron_v2", f"<TOOLCALL>[{PING}]</TOOLCALL>", f"<TOOLCALL>[{PING}, {PING}]</TOOLCALL>"),
    ("mistral", "[TOOL_CALLS]ping[ARGS]{}", None),
    ("command_r7b", f"<|START_ACTION|>[{R7B_PING}]<|END_ACTION|>",
     f"<|START_ACTION|>[{R7B_PING}, {R7B_PING}]<|END_ACTION|>"),
    ("deepseek_v3_2", f"<｜DSML｜function_calls>\n{DS_PING}</｜DSML｜function_calls>",
     f"<｜DSML｜function_calls>\n{DS_PING}{DS_PING}</｜DSML｜function_calls>"),
    ("gigachat_v3_1", f"<|function_call|>{PING}", None),
    ("gigachat_v3", f"<|message_sep|>\n\nfunction call<|role_sep|>\n{PING}", None),
    ("kimi_k2", f"{KIMI}{KIMI_PING}{KIMI_END}", f"{KIMI}{KIMI_PING}{KIMI_PING}{KIMI_END}"),
    ("gpt_oss", GPT_PING, f"{GPT_PING}<|start|>assistant{GPT_PING}"),
    ("mistral_nemo", f"[TOOL_CALLS][{PING}]", f"[TOOL_CALLS][{PING}, {PING}]"),
    ("minimax_m1", f"<tool_calls>\n{PING}\n</tool_calls>",
     f"<tool_calls>\n{PING}\n{PING}\n</tool_calls>"),
    ("minimax_m2", f"<minimax:tool_call>\n{MM_PING}</minimax:tool_call>",
     f"<minimax:tool_call>\n{MM_PING}{MM_PING}</minimax:tool_call>"),
    ("seed_oss", "<seed:tool_call>\n<function=ping>\n\n</function>\n</seed:tool_call>", None)])
def test_required_grammar_takes_calls_only(fmt, call, twice):
    from ckptd.model.text.tool_calls.constrain import structural_tag
    f = FORMATS[fmt]
    twice = twice or call + f.separator + call
    src = structural_tag(f, TOOLS, "required", None, True, False, False)
    assert _accepts(src, call) and _accepts(src, twice)
    assert not _accepts(src, "Sure! " + call) and not _accepts(src, "")
    assert ReplySpec(f, SCHEMAS).parse(call).calls[0].name == "ping"
    assert [c.name for c in ReplySpec(f, SCHEMAS).parse(twice).calls] == ["ping", "ping"]
    one = structural_tag(f, TOOLS, "required", "ping", True, False, False)
    assert _accepts(one, call) and not _accepts(one, twice)
    thinking = structural_tag(f, TOOLS, "required", None, False, True, True)
    assert _accepts(thinking, "let me see</think>\n\n" + call)
    closed = structural_tag(f, TOOLS, "required", None, False, True, False)   # thinking off
    assert _accepts(closed, "</think>\n\n" + call)
    assert not _accepts(closed, "let me see</think>\n\n" + call)
    assert structural_tag(f, TOOLS, "auto", None, True, False, False) is None


def test_gpt_oss_reads_answers_without_tools_but_no_calls():
    """GPT-OSS's format reads every answer (its text is in channels): without tools, a
    message to a function is no call."""
    spec = ReplySpec(FORMATS["gpt_oss"], {})
    assert spec.parse("<|channel|>final<|message|>Hi.<|return|>").content == "Hi."
    assert spec.parse(GPT_PING).calls == ()
