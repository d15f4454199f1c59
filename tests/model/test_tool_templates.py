"""Which call syntax ckptd reads from each of llama.cpp's real chat templates
(models/templates in its source, extracted from the llama-cpp-python sdist at test
time): the format per family, as llama.cpp's own tests (tests/test-chat.cpp) expect
it, and None where the template writes calls in a syntax ckptd does not read (tools
are refused with it, not read wrong)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptd.model.text.chat import render_chat
from ckptd.model.text.tool_calls.detect import detect
from ckptd.model.text.tool_calls.reasoning import APRIEL, THINK, marks_of, opens_thinking
from ckptd.tools import llama_suite

# template -> format; None: its calls are in a syntax of none of ckptd's formats
EXPECTED = {
    "Apertus-8B-Instruct": "apertus",
    "Apriel-1.6-15b-Thinker-fixed": "apriel",
    "Bielik-11B-v3.0-Instruct": "hermes",
    "ByteDance-Seed-OSS": "seed_oss",
    "Cohere2MoE": "command_r7b",
    "CohereForAI-c4ai-command-r-plus-tool_use": "generic",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "command_r7b",
    "GLM-4.6": "glm",
    "GLM-4.7-Flash": "glm",
    "GigaChat3-10B-A1.8B": "gigachat_v3",
    "GigaChat3.1-10B-A1.8B": "gigachat_v3_1",
    "HuggingFaceTB-SmolLM3-3B": "generic",
    "Kimi-K2-Instruct": "kimi_k2",
    "Kimi-K2-Thinking": "kimi_k2",
    "Kimi-K3": "kimi_k3",
    "LFM2-8B-A1B": "lfm2",
    "LFM2.5-8B-A1B": "lfm2",
    "LFM2.5-Instruct": "lfm2",
    "MiMo-VL": "hermes",
    "MiniMax-M1": "minimax_m1",
    "MiniMax-M2": "minimax_m2",
    "MiniMax-M3": "minimax_m3",
    "Mistral-Small-3.2-24B-Instruct-2506": "mistral",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "qwen_xml",
    "NVIDIA-Nemotron-Nano-v2": "nemotron_v2",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "hermes",
    "Qwen-QwQ-32B": "hermes",
    "Qwen-Qwen2.5-7B-Instruct": "hermes",
    "Qwen-Qwen3-0.6B": "hermes",
    "Qwen3-Coder": "qwen_xml",
    "Qwen3.5-4B": "qwen_xml",
    "Reka-Edge": "hermes",
    "Spark2.5": "glm",
    "StepFun3.5-Flash": "qwen_xml",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": "generic",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "generic",
    "deepseek-ai-DeepSeek-V3.1": "generic",
    "deepseek-ai-DeepSeek-V3.2": "deepseek_v3_2",
    "deepseek-ai-DeepSeek-V4-Flash-0731": "deepseek_v4",
    "deepseek-ai-DeepSeek-V4": "deepseek_v4",
    "fireworks-ai-llama-3-firefunction-v2": "firefunction_v2",
    "google-gemma-2-2b-it": "generic",
    "google-gemma-4-31B-it-interleaved": "gemma4",
    "google-gemma-4-31B-it": "gemma4",
    "ibm-granite-granite-3.3-2B-Instruct": "granite",
    "ibm-granite-granite-4.0": "hermes",
    "ibm-granite-granite-4.1": "hermes",
    "inclusionai-ling-3.0-flash": "glm",
    "llama-cpp-deepseek-r1": "generic",
    "llama-cpp-rwkv-world": "generic",
    "meetkai-functionary-medium-v3.1": "functionary_v3_1",
    "meetkai-functionary-medium-v3.2": "functionary_v3_2",
    "meta-llama-Llama-3.1-8B-Instruct": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct": "llama3",
    "microsoft-Phi-3.5-mini-instruct": "generic",
    "mistralai-Ministral-3-14B-Reasoning-2512": "mistral",
    "mistralai-Mistral-Nemo-Instruct-2407": "mistral_nemo",
    "moonshotai-Kimi-K2": "kimi_k2",
    "muse-glimmer": "muse_glimmer",
    "openai-gpt-oss-120b": "gpt_oss",
    "openbmb-MiniCPM5-1B": "minicpm5",
    "poolside-Laguna-S-2.1": "glm",
    "poolside-Laguna-XS-2.1": "glm",
    "poolside-Laguna-XS.2": "glm",
    "tencent-Hy3": "hy3",
    "unsloth-Apriel-1.5": "apriel",
    "unsloth-mistral-Devstral-Small-2507": "mistral",
    "upstage-Solar-Open-100B": "solar_open",
}


# templates that write no past call: their system message names the syntax (parsed
# in test_tool_calls_named.py on the text it asks for)
NO_PAST_CALL = {"LFM2-8B-A1B", "LFM2.5-Instruct", "ibm-granite-granite-3.3-2B-Instruct"}
SHORT_IDS = {"mistralai-Mistral-Nemo-Instruct-2407", "Mistral-Small-3.2-24B-Instruct-2506"}


@pytest.fixture(scope="session")
def llama_templates() -> Path:
    """A failure, not a skip, when they can't be had: CI never passes without them."""
    try:
        return llama_suite.fetch_templates(llama_suite.ROOT / "third_party")
    except RuntimeError as e:
        pytest.fail(f"cannot fetch llama.cpp's chat templates: {e}")


def _render(source: str):
    def render(messages: list[dict], tools: list[dict]) -> str:
        # what PromptBuilder.render_chat (daemon/prompt.py) gives a template
        return render_chat(source, messages, True, tools=tools, functions=json.dumps(tools),
                           datetime="Nov 26 2026", date_string="26 Nov 2026",
                           bos_token="<s>", eos_token="</s>", enable_thinking=True)
    return render


def test_every_template_has_its_expectation(llama_templates):
    assert {p.stem for p in llama_templates.glob("*.jinja")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_format_per_template_family(llama_templates, name):
    syntax = detect(_render((llama_templates / f"{name}.jinja").read_text()))
    got = syntax.fmt.name if syntax.fmt is not None else None
    assert got == EXPECTED[name]
    # Mistral's templates that refuse ids other than 9 letters or digits get such ids
    assert syntax.short_ids == (name in SHORT_IDS)
    if got is None:                  # refused with what the template writes, as a hint
        assert syntax.shows_tools


_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "opts": {"type": "object"}, "ok": {"type": "boolean"}}}}}
# (templates write other values than strings as JSON, or as Python's `string` does)
_CALL_ARGS = {"city": "Paris", "days": 3, "opts": {"a": [1, "x"]}, "ok": True}


def _past_call(arguments: object) -> list[dict]:
    return [{"role": "user", "content": "what's the weather"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": "call00000", "type": "function",
                "function": {"name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call00000", "content": "sunny"}]


@pytest.mark.parametrize("name", sorted(n for n, f in EXPECTED.items()
                                        if f not in (None, "generic") and n not in NO_PAST_CALL))
def test_a_past_call_parses_back(llama_templates, name):
    """The round trip: what the template writes for a past call is what the model was
    taught to write, and the format reads it back as the same call."""
    render = _render((llama_templates / f"{name}.jinja").read_text())
    syntax = detect(render)
    arguments = json.dumps(_CALL_ARGS) if syntax.string_arguments else _CALL_ARGS
    text = render(_past_call(arguments), [_WEATHER])
    asked = render(_past_call(arguments)[:1], [_WEATHER])
    # the model's answer: what follows the prompt it was given (templates that drop
    # past thinking write it otherwise: from the question on)
    answer = text[len(asked):] if text.startswith(asked) else \
        text[text.rfind("what's the weather"):]
    _, calls = syntax.fmt.parse(answer, False,
                                {"get_weather": _WEATHER["function"]["parameters"]})
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", _CALL_ARGS)]


# Thinking marks other than <think>, as llama.cpp's parsers read them (common/chat.cpp,
# common/parsers/): template -> (opening, closing mark), whether its prompt opens it
OTHER_THINKING = {
    "Cohere2MoE": (("<|START_THINKING|>", "<|END_THINKING|>"), True),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": (
        ("<|START_THINKING|>", "<|END_THINKING|>"), False),
    "mistralai-Ministral-3-14B-Reasoning-2512": (("[THINK]", "[/THINK]"), False),
    "Apriel-1.6-15b-Thinker-fixed": (("", "[BEGIN FINAL RESPONSE]"), True),
    "openai-gpt-oss-120b": (("<|channel|>analysis<|message|>", "<|end|>"), False),
    "muse-glimmer": (("to=self<|message|>", "<|eom|>"), False),
    "Kimi-K3": (("<|open|>think<|sep|>", "<|close|>think<|sep|>"), True),
    "MiniMax-M3": (("<mm:think>", "</mm:think>"), False),
    "google-gemma-4-31B-it": (("<|channel>thought", "<channel|>"), False),
    "google-gemma-4-31B-it-interleaved": (("<|channel>thought", "<channel|>"), False),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_thinking_marks_per_template(llama_templates, name):
    source = (llama_templates / f"{name}.jinja").read_text()
    marks = marks_of(source)
    if name in OTHER_THINKING:
        (open_mark, close_mark), opened = OTHER_THINKING[name]
        assert (marks.open, marks.close) == (open_mark, close_mark)
        prompt = _render(source)([{"role": "user", "content": "hi"}], [])
        assert opens_thinking(prompt, marks) == opened
    elif "</think>" in source:
        assert marks == THINK
    else:                   # Apriel 1.5 only asks for the final response's mark
        assert marks is None and (APRIEL.close not in source or name == "unsloth-Apriel-1.5")


def test_mistral_small_call_id_round_trip(llama_templates):
    """Mistral Small 3.2 writes a 9-character id with its call, and its template takes
    no other: the id ckptd answers with is the model's, so a client sending the call
    and its result back gets them rendered (ckptd's own ids are refused there)."""
    from ckptd.model.text.tool_calls.reply import ReplySpec, call_ids
    render = _render((llama_templates / "Mistral-Small-3.2-24B-Instruct-2506.jinja").read_text())
    syntax = detect(render)
    answer = '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris", "days": 3}'
    parsed = ReplySpec(syntax.fmt, {"get_weather": _WEATHER["function"]["parameters"]}) \
        .parse(answer)
    (cid,) = call_ids(parsed.calls)
    assert cid == "a1B2c3D4e"
    arguments = parsed.calls[0].arguments
    arguments = arguments if syntax.string_arguments else json.loads(arguments)
    messages = [{"role": "user", "content": "what's the weather"},
                {"role": "assistant", "content": "", "tool_calls": [{
                    "id": cid, "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": cid, "content": "sunny"}]
    prompt = render(messages, [_WEATHER])
    assert answer in prompt and "a1B2c3D4e" in prompt.split(answer, 1)[1]
