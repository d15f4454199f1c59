"""Tool calls against a real daemon (issue 23), with the openai SDK: tool_choice
required or named gives a call in the template's syntax whose arguments validate
against the schema; none gives none; a stream's deltas add up to the whole answer;
the Anthropic and Responses routes answer with their own call shapes."""

from __future__ import annotations

import json

import openai
import pytest

from tests.daemon.daemon_proc import start

# Chat templates that show the tools and the call syntax, and write a past call in it
# (as Qwen2.5's / Qwen3-Coder's do: the syntax is read from how a past call renders)
_HERMES_CALL = ("{% for c in m.tool_calls or [] %}<tool_call>\n{\"name\": "
                "{{ c.function.name | tojson }}, \"arguments\": "
                "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}")
_XML_CALL = ("{% for c in m.tool_calls or [] %}<tool_call>\n<function={{ c.function.name }}>\n"
             "{% for k, v in c.function.arguments.items() %}<parameter={{ k }}>\n{{ v }}\n"
             "</parameter>\n{% endfor %}</function>\n</tool_call>{% endfor %}")


def _turns(call: str) -> str:
    return ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}" + call +
            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% endif %}")


HERMES = ("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function | tojson }}\n"
          "{% endfor %}Call one as <tool_call>{\"name\": .., \"arguments\": ..}</tool_call>"
          "<|im_end|>\n{% endif %}" + _turns(_HERMES_CALL))
XML = ("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }}\n"
       "{% endfor %}Call one as <tool_call>\n<function=NAME>\n<parameter=P>\nV\n</parameter>"
       "\n</function>\n</tool_call><|im_end|>\n{% endif %}" + _turns(_XML_CALL))

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}}
PING = {"type": "function", "function": {"name": "ping", "description": "Ping",
                                         "parameters": {"type": "object", "properties": {
                                             "ok": {"type": "boolean"}},
                                             "required": ["ok"]}}}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


def _daemon(model, tmp, template: str | None):
    args = ["--max-context", "2048", "--parallel", "2"]
    if template is not None:
        (tmp / "t.jinja").write_text(template)
        args += ["--chat-template-file", str(tmp / "t.jinja")]
    return start(model, tmp / "cache", *args)


@pytest.fixture(scope="module", params=["hermes", "qwen_xml", "generic"])
def served(request, tiny_llama_dir, tmp_path_factory):
    """A daemon per call syntax: a template with Hermes tags, one with Qwen XML, and the
    tiny model's own ChatML, which shows no tools (the generic format)."""
    template = {"hermes": HERMES, "qwen_xml": XML, "generic": None}[request.param]
    d = _daemon(tiny_llama_dir, tmp_path_factory.mktemp(request.param), template)
    d.syntax = request.param
    yield d
    assert d.stop() == 0, d.output()


@pytest.fixture()
def hermes(served):
    """The routes' shapes do not depend on the syntax: checked on one."""
    if served.syntax != "hermes":
        pytest.skip("checked with the Hermes template")
    return served


def _client(d) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=90)


def _valid(name: str, args: dict) -> bool:
    if name == "get_weather":
        return set(args) == {"city", "days"} and args["city"] in ("Paris", "Oslo") and \
            type(args["days"]) is int and 1 <= args["days"] <= 7
    return name == "ping" and set(args) == {"ok"} and type(args["ok"]) is bool


def _ask(d, **kw):
    # one call: a random-weight model given room for more would write calls to the limit
    kw.setdefault("parallel_tool_calls", False)
    kw.setdefault("max_tokens", 160)
    return _client(d).chat.completions.create(model="any", messages=MSGS,
                                              tools=[WEATHER, PING], **kw)


def test_required_gives_calls_that_validate(served):
    c = _ask(served, tool_choice="required", temperature=1.0, seed=3)
    choice = c.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls and not choice.message.content
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert _valid(call.function.name, json.loads(call.function.arguments)), call


def test_named_function_and_no_parallel_calls(served):
    c = _ask(served, tool_choice={"type": "function", "function": {"name": "ping"}},
             temperature=1.0, seed=4, parallel_tool_calls=False)
    calls = c.choices[0].message.tool_calls
    assert [x.function.name for x in calls] == ["ping"]
    assert _valid("ping", json.loads(calls[0].function.arguments))


def test_none_gives_no_calls(hermes):
    served = hermes
    c = _ask(served, tool_choice="none", temperature=0.0, max_tokens=16)
    assert c.choices[0].message.tool_calls is None
    assert c.choices[0].finish_reason in ("stop", "length")


def test_streamed_deltas_add_up_to_the_answer(served):
    kw = {"tool_choice": "required", "temperature": 1.0, "seed": 7}
    whole = _ask(served, **kw).choices[0]
    calls: list[dict] = []
    content, finish = "", None
    for chunk in _ask(served, stream=True, **kw):
        ch = chunk.choices[0] if chunk.choices else None
        if ch is None:
            continue
        content += ch.delta.content or ""
        finish = ch.finish_reason or finish
        for tc in ch.delta.tool_calls or []:
            if tc.index == len(calls):
                assert tc.id and tc.function.name          # the first piece of a call
                calls.append({"name": tc.function.name, "arguments": ""})
            else:
                assert tc.id is None and not tc.function.name
            calls[tc.index]["arguments"] += tc.function.arguments or ""
    assert "<tool_call>" not in content and "{" not in content
    assert finish == "tool_calls" == whole.finish_reason
    assert calls == [{"name": c.function.name, "arguments": c.function.arguments}
                     for c in whole.message.tool_calls]


def test_bad_tool_choice_and_tools_name_the_field(hermes):
    served = hermes
    for body, param in [
            ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                                  "function": {"name": "nope"}}},
             "tool_choice.function.name"),
            ({"tools": [{"type": "function", "function": {"name": ""}}]},
             "tools[0].function.name"),
            ({"tools": [WEATHER], "tool_choice": "required",
              "response_format": {"type": "json_object"}}, "response_format")]:
        r = served.post("/v1/chat/completions", {"messages": MSGS, **body})
        assert r.status == 400, r.text
        assert r.json["error"]["param"] == param


def test_anthropic_tool_use(hermes):
    served = hermes
    body = {"model": "m", "max_tokens": 160, "messages": MSGS, "temperature": 1.0,
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "tools": [{"name": f["function"]["name"], "description": "",
                       "input_schema": f["function"]["parameters"]} for f in (WEATHER, PING)]}
    r = served.post("/v1/messages", body)
    assert r.status == 200, r.text
    uses = [b for b in r.json["content"] if b["type"] == "tool_use"]
    assert r.json["stop_reason"] == "tool_use" and uses
    assert all(_valid(b["name"], b["input"]) and b["id"] for b in uses)
    events = served.post("/v1/messages", {**body, "stream": True}).sse()
    starts = [e for e in events if e.get("type") == "content_block_start"]
    assert [e["index"] for e in starts] == list(range(len(starts)))
    block = next(e for e in starts if e["content_block"]["type"] == "tool_use")
    pieces = "".join(e["delta"]["partial_json"] for e in events
                     if e.get("type") == "content_block_delta" and
                     e["index"] == block["index"])
    assert _valid(block["content_block"]["name"], json.loads(pieces))
    assert next(e for e in events if e.get("type") == "message_delta")["delta"][
        "stop_reason"] == "tool_use"


def test_responses_function_call(hermes):
    served = hermes
    r = served.post("/v1/responses", {
        "input": "weather?", "max_output_tokens": 160, "tool_choice": "required",
        "parallel_tool_calls": False,
        "tools": [{"type": "function", **f["function"]} for f in (WEATHER, PING)]})
    assert r.status == 200, r.text
    items = [o for o in r.json["output"] if o["type"] == "function_call"]
    assert items and all(_valid(o["name"], json.loads(o["arguments"])) and o["call_id"]
                         for o in items)
