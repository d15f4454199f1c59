"""Tool calls end to end in every format ckptd reads (issue 31): SmolLM2 served with a
real chat template of each family (llama.cpp's models/templates) and tool_choice
required, so the grammar makes it write a call in the template's syntax; the call
comes back parsed in `tool_calls` through the openai SDK, whole and streamed. The
Anthropic (tool_use) and Responses (function_call) round trips feed the call and its
result back; the prompt the model then reads (`__verbose`) holds both, written as the
template writes them."""

from __future__ import annotations

import json

import openai
import pytest

from ckptd.tools import llama_suite
from tests.daemon.daemon_proc import start

# format -> (llama.cpp template, how it writes the call back into a prompt)
FORMATS = {
    "hermes": ("Qwen-Qwen2.5-7B-Instruct",
               '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
               "</tool_call>"),
    "qwen_xml": ("Qwen3-Coder",
                 "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                 "</function>\n</tool_call>"),
    "glm": ("GLM-4.6", "<tool_call>get_weather\n<arg_key>city</arg_key>\n"
                       "<arg_value>Paris</arg_value>\n</tool_call>"),
    "llama3": ("meta-llama-Llama-3.3-70B-Instruct",
               '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "functionary_v3_1": ("meetkai-functionary-medium-v3.1",
                         '<function=get_weather>{"city": "Paris"}</function>'),
    "functionary_v3_2": ("meetkai-functionary-medium-v3.2",
                         '>>>get_weather\n{"city": "Paris"}'),
    "firefunction_v2": ("fireworks-ai-llama-3-firefunction-v2",
                        'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    "apriel": ("unsloth-Apriel-1.5",
               '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "'),
    "nemotron_v2": ("NVIDIA-Nemotron-Nano-v2",
                    '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
                    "</TOOLCALL>"),
    "mistral": ("unsloth-mistral-Devstral-Small-2507",
                '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'),
    # its template takes only 9-character ids: the round trips' call_/toolu_ ids get them
    "mistral_nemo": ("mistralai-Mistral-Nemo-Instruct-2407",
                     '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, '
                     '"id": "'),
    "command_r7b": ("CohereForAI-c4ai-command-r7b-12-2024-tool_use",
                    '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", '
                    '"parameters": {"city": "Paris"}}\n]<|END_ACTION|>'),
    "deepseek_v3_2": ("deepseek-ai-DeepSeek-V3.2",
                      '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
                      '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
                      '</｜DSML｜invoke>\n</｜DSML｜function_calls>'),
    "gigachat_v3_1": ("GigaChat3.1-10B-A1.8B",
                      '<|function_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    "seed_oss": ("ByteDance-Seed-OSS",
                 "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
                 "</function>\n</seed:tool_call>"),
    "gpt_oss": ("openai-gpt-oss-120b",
                "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
                '{"city": "Paris"}<|call|>'),
    "kimi_k2": ("moonshotai-Kimi-K2",
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
                "<|tool_calls_section_end|>"),
    "minimax_m1": ("MiniMax-M1",
                   '<tool_calls>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                   "</tool_calls>"),
    "minimax_m2": ("MiniMax-M2",
                   '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">'
                   "Paris</parameter>\n</invoke>\n</minimax:tool_call>"),
    "gemma4": ("google-gemma-4-31B-it",
               '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'),
    "kimi_k3": ("Kimi-K3",
                '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
                '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
                "<|close|>call<|sep|><|close|>tools<|sep|>"),
    "generic": (None, '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'),
}
# Formats that write an id with a call: it is the call's id
KEPT_IDS = {"kimi_k2": "functions.get_weather:", "command_r7b": "0"}
# One argument with one value: the call the grammar forces is known in advance
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris"]}},
          "required": ["city"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "get_weather",
                                         "description": "The weather in a city",
                                         "parameters": SCHEMA}}
QUESTION = "What is the weather in Paris?"
# Templates that turn thinking off by a word in the messages, not enable_thinking
NO_THINKING_WORD = {"nemotron_v2": " /no_think"}
RESULT = "sunny, 25 C"
NO_THINKING = {"enable_thinking": False}
# Enough for the longest forced call (DSML's full-width bars are several tokens each in
# SmolLM2's vocabulary); the grammar ends every answer at its call's end
MAX_TOKENS = 160


@pytest.fixture(scope="module", params=sorted(FORMATS))
def served(request, tmp_path_factory):
    template, _ = FORMATS[request.param]
    args = ["--max-context", "2048", "--parallel", "1"]
    if template is not None:
        templates = llama_suite.fetch_templates(llama_suite.ROOT / "third_party")
        args += ["--chat-template-file", str(templates / f"{template}.jinja")]
    d = start(None, tmp_path_factory.mktemp(request.param) / "cache", *args,
              env={"OMP_NUM_THREADS": "1"})
    d.fmt = request.param
    yield d
    assert d.stop() == 0, d.output()


def _asked(d) -> list[dict]:
    return [{"role": "user", "content": QUESTION + NO_THINKING_WORD.get(d.fmt, "")}]


def _ask(d, **kw):
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=300)
    return client.chat.completions.create(
        model="smollm2", messages=_asked(d), tools=[TOOL], tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=MAX_TOKENS,
        extra_body={"chat_template_kwargs": NO_THINKING}, **kw)


def _whole(d):
    """The non-streamed answer, asked once per daemon (greedy: it does not change)."""
    if getattr(d, "whole", None) is None:
        d.whole = _ask(d).choices[0]
    return d.whole


def test_required_call_comes_back_parsed(served):
    choice = _whole(served)
    assert choice.finish_reason == "tool_calls", choice
    assert not choice.message.content, choice
    [call] = choice.message.tool_calls
    assert call.type == "function"
    kept = KEPT_IDS.get(served.fmt)
    assert call.id.startswith(kept) if kept else call.id.startswith("call_"), call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_streamed_call_adds_up_to_the_whole_one(served):
    whole = _whole(served).message.tool_calls
    calls, content, finish = [], "", None
    for chunk in _ask(served, stream=True):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        finish = ch.finish_reason or finish
        for tc in ch.delta.tool_calls or []:
            if tc.index == len(calls):
                assert tc.id and tc.function.name          # a call's first piece
                calls.append([tc.function.name, ""])
            calls[tc.index][1] += tc.function.arguments or ""
    assert finish == "tool_calls" and not content.strip()
    assert calls == [[c.function.name, c.function.arguments] for c in whole]


def _prompt_holds_the_round_trip(d, prompt: str) -> None:
    written = FORMATS[d.fmt][1]
    assert written in prompt, prompt
    assert RESULT in prompt[prompt.index(written):], prompt


def test_anthropic_tool_use_round_trip(served):
    tools = [{"name": "get_weather", "description": "The weather in a city",
              "input_schema": SCHEMA}]
    body = {"model": "m", "max_tokens": MAX_TOKENS, "temperature": 0, "tools": tools,
            "thinking": {"type": "disabled"}}
    r = served.post("/v1/messages", {**body, "messages": _asked(served),
                                     "tool_choice": {"type": "tool", "name": "get_weather"}},
                    timeout=300)
    assert r.status == 200, r.text
    assert r.json["stop_reason"] == "tool_use", r.json
    [use] = [b for b in r.json["content"] if b["type"] == "tool_use"]
    assert use["name"] == "get_weather" and use["input"] == {"city": "Paris"}
    history = [*_asked(served), {"role": "assistant", "content": r.json["content"]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                             "content": RESULT}]}]
    r = served.post("/v1/messages", {**body, "max_tokens": 1, "messages": history,
                                     "verbose": True}, timeout=300)
    assert r.status == 200, r.text
    _prompt_holds_the_round_trip(served, r.json["__verbose"]["prompt"])


def test_responses_function_call_round_trip(served):
    tools = [{"type": "function", "name": "get_weather", "description": "The weather",
              "parameters": SCHEMA}]
    body = {"model": "m", "max_output_tokens": MAX_TOKENS, "temperature": 0, "tools": tools,
            "reasoning": {"effort": "none"}}
    r = served.post("/v1/responses", {**body, "input": _asked(served), "tool_choice": "required",
                                      "parallel_tool_calls": False}, timeout=300)
    assert r.status == 200, r.text
    [call] = [o for o in r.json["output"] if o["type"] == "function_call"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    items = [*_asked(served), call, {"type": "function_call_output", "call_id": call["call_id"],
                          "output": RESULT}]
    r = served.post("/v1/responses", {**body, "max_output_tokens": 1, "input": items,
                                      "verbose": True}, timeout=300)
    assert r.status == 200, r.text
    _prompt_holds_the_round_trip(served, r.json["__verbose"]["prompt"])
