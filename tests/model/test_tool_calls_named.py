"""The call formats of llama.cpp's named handlers that ckptd's first ~20 did not read
(Granite 3.3, LFM2, Apertus, Solar Open, ...): each read whole and streamed in
arbitrary splits, and its tool_choice "required" grammar taking calls only. The
round trip through each real template is in test_tool_templates.py."""

from __future__ import annotations

import random

import pytest

from ckptd.model.text.tool_calls.constrain import structural_tag
from ckptd.model.text.tool_calls.detect import FORMATS
from ckptd.model.text.tool_calls.reasoning import KIMI_K3, Marks
from ckptd.model.text.tool_calls.reasoning import MUSE as MUSE_MARKS
from ckptd.model.text.tool_calls.reply import ReplyParser, ReplySpec, call_ids
from tests.model.test_tool_calls import (
    SCHEMAS,
    TOOLS,
    _accepts,
    _calls,
    _stream,
    check_whole_and_streamed,
)

WEATHER = ("get_weather", {"city": "Paris", "days": 3})
MM3 = "]<]minimax[>["
K3_RESPONSE, K3_RESPONSE_END = "<|open|>response<|sep|>", "<|close|>response<|sep|>"
K3_TOOLS, K3_TOOLS_END = "<|open|>tools<|sep|>", "<|close|>tools<|sep|>"
K3_CALL = '<|open|>call tool="{}" index="1"<|sep|>{}<|close|>call<|sep|>'
K3_ARG = '<|open|>argument key="{}" type="{}"<|sep|>{}<|close|>argument<|sep|>'
MUSE = ('<atem:function_calls>\n<atem:invoke name="{}">\n{}</atem:invoke>\n'
        "</atem:function_calls>")
MUSE_ARG = '<atem:parameter name="{}">{}</atem:parameter>\n'
SOLAR = "<|tool_call:begin|>a1b2c3d4e5<|tool_call:name|>{}<|tool_call:args|>{}<|tool_call:end|>"

# (format, model text, content, [(name, arguments)])
CASES = [
    ("granite", 'Checking.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", '
                '"days": 3}}, {"name": "ping", "arguments": {}}]',
     "Checking.", [WEATHER, ("ping", {})]),
    ("lfm2", "Sure.<|tool_call_start|>[get_weather(city='Paris', days=3), ping()]"
             "<|tool_call_end|>", "Sure.", [WEATHER, ("ping", {})]),
    ("lfm2", '<|tool_call_start|>[{"name": "get_weather", "arguments": {"city": "Paris", '
             '"days": 3}}]<|tool_call_end|>Done.', "Done.", [WEATHER]),
    ("lfm2", "<|tool_call_start|>[rm_rf(path='/')]<|tool_call_end|>",
     "<|tool_call_start|>[rm_rf(path='/')]<|tool_call_end|>", []),
    ("apertus", 'Sure.<|tools_prefix|>[{"get_weather": {"city": "Paris", "days": 3}}, '
                '{"ping": {}}]<|tools_suffix|>', "Sure.", [WEATHER, ("ping", {})]),
    ("solar_open", "<|tool_calls|>" + SOLAR.format("get_weather", '{"city": "Paris", "days": 3}')
     + SOLAR.format("ping", "{}") + "<|calls|>", "", [WEATHER, ("ping", {})]),
    ("solar_open", "Hm.<|tool_calls|>" + SOLAR.format("ping", "{}"), "Hm.", [("ping", {})]),
    ("hy3", "Ok.<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>"
            "\n<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Paris"
            "</arg_value:opensource>\n<arg_key:opensource>days</arg_key:opensource>\n"
            "<arg_value:opensource>3</arg_value:opensource>\n</tool_call:opensource>\n"
            "<tool_call:opensource>ping<tool_sep:opensource>\n</tool_call:opensource>\n"
            "</tool_calls:opensource>", "Ok.", [WEATHER, ("ping", {})]),
    ("minicpm5", 'Ok.\n<function name="get_weather"><param name="city"><![CDATA[a </param> b]]>'
                 '</param><param name="days">3</param></function><function name="ping">'
                 "</function>", "Ok.", [("get_weather", {"city": "a </param> b", "days": 3}),
                                          ("ping", {})]),
    ("minicpm5", '<function name="rm_rf"></function>', '<function name="rm_rf"></function>', []),
    ("kimi_k3", f"{K3_RESPONSE}Checking.{K3_RESPONSE_END}{K3_TOOLS}" + K3_CALL.format(
        "get_weather", K3_ARG.format("city", "string", "Paris")
        + K3_ARG.format("days", "number", "3")) + K3_CALL.format("ping", "")
     + f"{K3_TOOLS_END}<|close|>message<|sep|>", "Checking.", [WEATHER, ("ping", {})]),
    ("kimi_k3", f"{K3_RESPONSE}Hi <b>.{K3_RESPONSE_END}", "Hi <b>.", []),
    ("minimax_m3", f"Ok.{MM3}<tool_call>\n{MM3}<invoke name=\"get_weather\">{MM3}<city>Paris"
                   f"{MM3}</city>{MM3}<days>3{MM3}</days>{MM3}<opts>{MM3}<a>{MM3}<item>1"
                   f"{MM3}</item>{MM3}<item>x{MM3}</item>{MM3}</a>{MM3}</opts>{MM3}</invoke>\n"
                   f"{MM3}<invoke name=\"ping\">{MM3}</invoke>\n{MM3}</tool_call>", "Ok.",
     [("get_weather", {"city": "Paris", "days": 3, "opts": {"a": [1, "x"]}}), ("ping", {})]),
    ("gemma4", 'Sure.<|tool_call>call:get_weather{city:<|"|>a, {b}: c<|"|>,days:3,'
               'opts:{a:[1,<|"|>x<|"|>],"b":{"c":null}}}<tool_call|><|tool_call>call:ping{}'
               "<tool_call|>", "Sure.", [("get_weather", {"city": "a, {b}: c", "days": 3, "opts": {
                   "a": [1, "x"], "b": {"c": None}}}), ("ping", {})]),
    ("gemma4", "<|tool_call>call:rm_rf{}<tool_call|>", "<|tool_call>call:rm_rf{}<tool_call|>", []),
    ("muse_glimmer", " to=user<|message|>Checking.<|eom|><|start|>assistant to=self<|message|>"
                     "hm<|eom|><|start|>assistant to=get_weather<|message|>" + MUSE.format(
                         "get_weather", MUSE_ARG.format("city", "Paris")
                         + MUSE_ARG.format("days", "3")) + "<|eom|><|start|>assistant "
                     "to=ping<|message|>" + MUSE.format("ping", "") + "<|eom|>",
     # (thinking not read: a message to self stays as written)
     "Checking.<|start|>assistant to=self<|message|>hm<|eom|>", [WEATHER, ("ping", {})]),
    ("muse_glimmer", " to=user<|message|>x to=y, <b> and to=z<|eot|>", "x to=y, <b> and to=z", []),
]


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_whole_and_streamed_give_the_same_calls(fmt, text, content, calls):
    check_whole_and_streamed(fmt, text, content, calls)


PING = '{"name": "ping", "arguments": {}}'


@pytest.mark.parametrize("fmt,call,twice", [
    ("granite", f"<|tool_call|>[{PING}]", f"<|tool_call|>[{PING}, {PING}]"),
    ("lfm2", f"<|tool_call_start|>[{PING}]<|tool_call_end|>",
     f"<|tool_call_start|>[{PING}, {PING}]<|tool_call_end|>"),
    ("apertus", '<|tools_prefix|>[{"ping": {}}]<|tools_suffix|>',
     '<|tools_prefix|>[{"ping": {}}, {"ping": {}}]<|tools_suffix|>'),
    ("solar_open", f"<|tool_calls|>{SOLAR.format('ping', '{}')}<|calls|>",
     f"<|tool_calls|>{SOLAR.format('ping', '{}')}{SOLAR.format('ping', '{}')}<|calls|>"),
    ("hy3", "<tool_calls:opensource>\n<tool_call:opensource>ping<tool_sep:opensource>\n"
            "</tool_call:opensource>\n</tool_calls:opensource>",
     "<tool_calls:opensource>\n<tool_call:opensource>ping<tool_sep:opensource>\n"
     "</tool_call:opensource>\n<tool_call:opensource>ping<tool_sep:opensource>\n"
     "</tool_call:opensource>\n</tool_calls:opensource>"),
    ("minicpm5", '<function name="ping"></function>',
     '<function name="ping"></function>\n<function name="ping"></function>'),
    ("kimi_k3", f"{K3_TOOLS}{K3_CALL.format('ping', '')}{K3_TOOLS_END}",
     f"{K3_RESPONSE}{K3_RESPONSE_END}{K3_TOOLS}{K3_CALL.format('ping', '')}"
     f"{K3_CALL.format('ping', '')}{K3_TOOLS_END}"),
    ("minimax_m3", f'{MM3}<tool_call>\n{MM3}<invoke name="ping">{MM3}</invoke>\n{MM3}</tool_call>',
     f'{MM3}<tool_call>\n{MM3}<invoke name="ping">{MM3}</invoke>\n{MM3}<invoke name="ping">'
     f"{MM3}</invoke>\n{MM3}</tool_call>"),
    ("gemma4", "<|tool_call>call:ping{}<tool_call|>",
     "<|tool_call>call:ping{}<tool_call|><|tool_call>call:ping{}<tool_call|>"),
    ("muse_glimmer", " to=ping<|message|>" + MUSE.format("ping", ""),
     " to=ping<|message|><atem:function_calls>\n" + '<atem:invoke name="ping">\n</atem:invoke>\n'
     * 2 + "</atem:function_calls>"),
])
def test_required_grammar_takes_calls_only(fmt, call, twice):
    f = FORMATS[fmt]
    src = structural_tag(f, TOOLS, "required", None, True, False, False)
    assert _accepts(src, call) and _accepts(src, twice)
    assert not _accepts(src, "Sure! " + call) and not _accepts(src, "")
    assert [c.name for c in ReplySpec(f, SCHEMAS).parse(twice).calls] == ["ping", "ping"]
    one = structural_tag(f, TOOLS, "required", "ping", True, False, False)
    assert _accepts(one, call) and not _accepts(one, twice)
    weather = structural_tag(f, TOOLS, "required", "get_weather", True, False, False)
    assert not _accepts(weather, call)


@pytest.mark.parametrize("fmt,good,bad", [
    ("minicpm5", '<function name="get_weather"><param name="city">a <b> c</param>'
                 '<param name="days">3</param></function>',
     '<function name="get_weather"><param name="days">three</param></function>'),
    ("minicpm5", '<function name="get_weather"><param name="days">3</param></function>',
     '<function name="get_weather"><param name="days">3</param><param name="days">3</param>'
     "</function>"),
    ("hy3", "<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n"
            "<arg_key:opensource>days</arg_key:opensource>\n<arg_value:opensource>3"
            "</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>",
     "<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n"
     "<arg_key:opensource>town</arg_key:opensource>\n<arg_value:opensource>3"
     "</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>"),
    ("gemma4", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>',
     "<|tool_call>call:get_weather{days:x}<tool_call|>"),
    ("gemma4", '<|tool_call>call:get_weather{zip:<|"|>75001<|"|>}<tool_call|>',
     '<|tool_call>call:get_weather{city:<|"|>a<|"|>,city:<|"|>a<|"|>}<tool_call|>'),
    ("kimi_k3", K3_TOOLS + K3_CALL.format("get_weather", K3_ARG.format("city", "string", "Paris")
                                          + K3_ARG.format("days", "number", "3")) + K3_TOOLS_END,
     K3_TOOLS + K3_CALL.format("get_weather", K3_ARG.format("days", "number", "x"))
     + K3_TOOLS_END),
    ("minimax_m3", f'{MM3}<tool_call>\n{MM3}<invoke name="get_weather">{MM3}<city>Paris{MM3}'
                   f"</city>{MM3}<days>3{MM3}</days>{MM3}</invoke>\n{MM3}</tool_call>",
     f'{MM3}<tool_call>\n{MM3}<invoke name="get_weather">{MM3}<days>x{MM3}</days>{MM3}'
     f"</invoke>\n{MM3}</tool_call>"),
])
def test_required_grammar_holds_arguments_to_the_schema(fmt, good, bad):
    """Known arguments only, of their schema's type, each at most once (a grammar that
    let an argument repeat let a small model write it for ever)."""
    src = structural_tag(FORMATS[fmt], TOOLS, "required", "get_weather", True, False, False)
    assert _accepts(src, good) and not _accepts(src, bad)
    assert _calls(ReplySpec(FORMATS[fmt], SCHEMAS).parse(good))[0][0] == "get_weather"


# The new formats' thinking blocks, each before a call: (format, marks, opened, answer)
THINKING = [
    ("kimi_k3", KIMI_K3, True, f"first, the city.{KIMI_K3.close}{K3_RESPONSE}{K3_RESPONSE_END}"
     f"{K3_TOOLS}{K3_CALL.format('ping', '')}{K3_TOOLS_END}"),
    ("minimax_m3", Marks("<mm:think>", "</mm:think>"), False,
     f'<mm:think>first, the city.</mm:think>{MM3}<tool_call>\n{MM3}<invoke name="ping">'
     f"{MM3}</invoke>\n{MM3}</tool_call>"),
    ("gemma4", Marks("<|channel>thought", "<channel|>"), False,
     "<|channel>thought\nfirst, the city.<channel|><|tool_call>call:ping{}<tool_call|>"),
    ("muse_glimmer", MUSE_MARKS, False, " to=self<|message|>first, the city.<|eom|>"
     "<|start|>assistant to=ping<|message|>" + MUSE.format("ping", "") + "<|eom|>"),
]


@pytest.mark.parametrize("fmt,marks,opened,text", THINKING)
def test_thinking_goes_to_reasoning(fmt, marks, opened, text):
    spec = ReplySpec(FORMATS[fmt], SCHEMAS, thinking=True, open_thinking=opened, marks=marks)
    whole = spec.parse(text)
    assert whole.reasoning == "first, the city." and whole.content == ""
    assert _calls(whole) == [("ping", {})]
    for seed in range(10):
        got = _stream(spec, text, random.Random(seed))
        assert got["reasoning"] == "first, the city." and got["content"] == "", seed


@pytest.mark.parametrize("text", ["<|START_RESPONSE|>It is <b>sunny</b>.<|END_RESPONSE|>",
                                  "<|START_TEXT|>It is <b>sunny</b>.<|END_TEXT|>"])
def test_cohere_frames_are_not_content(text):
    """Command R7B's and Command A's (Cohere2) answers are framed; tools or not (a
    format that frames content reads answers without tools: no calls then)."""
    for schemas in (SCHEMAS, {}):
        spec = ReplySpec(FORMATS["command_r7b"], schemas)
        assert spec.parse(text).content == "It is <b>sunny</b>."
        for seed in range(10):
            assert _stream(spec, text, random.Random(seed))["content"] == "It is <b>sunny</b>."
    action = '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "ping", "parameters": {}}]' \
        "<|END_ACTION|>"
    assert ReplySpec(FORMATS["command_r7b"], {}).parse(action).calls == ()
    assert _calls(ReplySpec(FORMATS["command_r7b"], SCHEMAS).parse(action)) == [("ping", {})]


HARMONY_MARKS = Marks("<|channel|>analysis<|message|>", "<|end|>")
TWO_ANALYSES = ("<|channel|>analysis<|message|>first, the city.<|end|><|start|>assistant"
                "<|channel|>commentary to=functions.ping <|constrain|>json<|message|>{}<|call|>"
                "<|start|>assistant<|channel|>analysis<|message|>then the days.<|end|>"
                "<|start|>assistant<|channel|>final<|message|>Done.<|return|>")


def test_gpt_oss_every_analysis_is_reasoning():
    """A second analysis message (after a call) is reasoning too, not dropped."""
    spec = ReplySpec(FORMATS["gpt_oss"], SCHEMAS, thinking=True, marks=HARMONY_MARKS)
    whole = spec.parse(TWO_ANALYSES)
    assert whole.reasoning == "first, the city.\n\nthen the days."
    assert whole.content == "Done." and _calls(whole) == [("ping", {})]
    for seed in range(10):
        got = _stream(spec, TWO_ANALYSES, random.Random(seed))
        assert got["reasoning"] == whole.reasoning and got["content"] == "Done.", seed


def test_gpt_oss_analysis_stays_in_content_with_reasoning_format_none():
    """reasoning_format "none" (no thinking read): the analysis is kept in content, as
    written, as llama-server leaves it."""
    text = ("<|channel|>analysis<|message|>first, the city.<|end|><|start|>assistant"
            "<|channel|>final<|message|>Paris.<|return|>")
    spec = ReplySpec(FORMATS["gpt_oss"], SCHEMAS, thinking=False)
    want = "<|channel|>analysis<|message|>first, the city.<|end|>Paris."
    assert spec.parse(text).content == want
    for seed in range(10):
        assert _stream(spec, text, random.Random(seed))["content"] == want, seed


@pytest.mark.parametrize("fmt,text,ids", [
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
                "<|tool_call_begin|>functions.ping:1<|tool_call_argument_begin|>{}"
                "<|tool_call_end|><|tool_calls_section_end|>",
     ["functions.get_weather:0", "functions.ping:1"]),
    ("mistral", '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}'
                "[TOOL_CALLS]ping[CALL_ID]Z9y8X7w6v[ARGS]{}", ["a1B2c3D4e", "Z9y8X7w6v"]),
    ("command_r7b", '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", '
                    '"parameters": {"city": "Paris"}}, {"tool_call_id": "1", "tool_name": '
                    '"ping", "parameters": {}}]<|END_ACTION|>', ["0", "1"]),
    ("solar_open", "<|tool_calls|>" + SOLAR.format("get_weather", '{"city": "Paris"}')
     + SOLAR.format("ping", "{}").replace("a1b2c3d4e5", "f6g7h8i9j0") + "<|calls|>",
     ["a1b2c3d4e5", "f6g7h8i9j0"]),
    # the grammar numbers every call "0": an id used twice gets one of ckptd's
    ("command_r7b", '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", '
                    '"parameters": {"city": "Paris"}}, {"tool_call_id": "0", "tool_name": '
                    '"ping", "parameters": {}}]<|END_ACTION|>', ["0", None]),
])
def test_the_models_own_call_ids_are_kept(fmt, text, ids):
    spec = ReplySpec(FORMATS[fmt], SCHEMAS)
    got = call_ids(spec.parse(text).calls)
    assert [g if i is not None else None for g, i in zip(got, ids)] == ids
    assert len(set(got)) == len(got) and all(g.startswith("call_") for g, i in zip(got, ids)
                                              if i is None)
    for seed in range(5):
        parser = ReplyParser(spec)
        rng, i = random.Random(seed), 0
        while i < len(text):
            n = rng.choice([1, 2, 3, 5, 8])
            parser.feed(text[i:i + n])
            i += n
        parser.finish()
        streamed = [cid for cid, _ in parser.calls]
        assert [s if i is not None else None for s, i in zip(streamed, ids)] == ids, seed


def test_required_arguments_come_first_and_always():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["b"]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    src = structural_tag(FORMATS["gemma4"], tools, "required", "f", True, False, False)
    call = "<|tool_call>call:f{{{}}}<tool_call|>".format
    assert _accepts(src, call('b:<|"|>x<|"|>,a:1')) and _accepts(src, call('b:<|"|>x<|"|>'))
    assert not _accepts(src, call("a:1")) and not _accepts(src, call(""))


def test_anthropic_ids_stay_in_its_alphabet():
    from ckptd.daemon.http.anthropic import _tool_id
    assert _tool_id("a1B2c3D4e") == "toolu_a1B2c3D4e" and _tool_id("call_x") == "toolu_x"
    kimi = _tool_id("functions.get_weather:0")
    assert kimi.startswith("toolu_") and kimi[6:].isalnum()


MUSE_TWO_SELF = (" to=self<|message|>first, the city.<|eom|><|start|>assistant to=ping<|message|>"
                 + MUSE.format("ping", "") + "<|eom|><|start|>assistant to=self<|message|>"
                 "then the days.<|eom|><|start|>assistant to=user<|message|>Done.<|eot|>")


def test_muse_every_message_to_self_is_reasoning():
    spec = ReplySpec(FORMATS["muse_glimmer"], SCHEMAS, thinking=True, marks=MUSE_MARKS)
    whole = spec.parse(MUSE_TWO_SELF)
    assert whole.reasoning == "first, the city.\n\nthen the days."
    assert whole.content == "Done." and _calls(whole) == [("ping", {})]
    for seed in range(10):
        got = _stream(spec, MUSE_TWO_SELF, random.Random(seed))
        assert got["reasoning"] == whole.reasoning and got["content"] == "Done.", seed
    kept = ReplySpec(FORMATS["muse_glimmer"], SCHEMAS).parse(MUSE_TWO_SELF)
    assert kept.content == ("to=self<|message|>first, the city.<|eom|><|start|>assistant "
                            "to=self<|message|>then the days.<|eom|>Done.")
