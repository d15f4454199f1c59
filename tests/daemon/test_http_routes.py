"""Every generation route reads its own body once (issue 31): the model name checked on
each (--strict-model-name), errors naming the client's own field (Anthropic's,
the Responses API's), chat conversations checked as OpenAI and llama-server check
them, and token logprobs encoded the same way wherever they are shown."""

from __future__ import annotations

import pytest

from tests.daemon.daemon_proc import start

USER = [{"role": "user", "content": "Say hello"}]
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
# (path, a valid body)
ROUTES = [
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 1}),
    ("/chat/completions/input_tokens", {"messages": USER}),
    ("/apply-template", {"messages": USER}),
    ("/completion", {"prompt": "Hello", "n_predict": 1}),
    ("/v1/messages", {"messages": USER, "max_tokens": 1}),
    ("/v1/messages/count_tokens", {"messages": USER}),
    ("/v1/responses", {"input": "Hello", "max_output_tokens": 1}),
    ("/v1/responses/input_tokens", {"input": "Hello"}),
]


@pytest.fixture(scope="module")
def strict(tiny_llama_dir, tmp_path_factory):
    d = start(tiny_llama_dir, tmp_path_factory.mktemp("strict") / "cache", "--max-context",
              "256", "--parallel", "2", "--alias", "tiny", "--strict-model-name")
    yield d
    assert d.stop() == 0, d.output()


@pytest.mark.parametrize("path,body", ROUTES, ids=[p for p, _ in ROUTES])
def test_strict_model_name_on_every_route(strict, path, body):
    r = strict.post(path, {**body, "model": "gpt-4o"})
    assert r.status == 404, r.text
    assert r.json["error"]["param"] == "model"
    assert r.json["error"]["code"] == "model_not_found"
    assert strict.post(path, {**body, "model": "tiny"}).status == 200
    assert strict.post(path, body).status == 200          # no name: the one model


TOOL = {"name": "f", "input_schema": {"type": "object"}}
# (path, body, the field the 400 names: the route's own name for it)
OWN_FIELDS = [
    ("/v1/messages", {"messages": USER, "stop_sequences": 5}, "stop_sequences"),
    ("/v1/messages", {"messages": USER, "max_tokens": -1}, "max_tokens"),
    ("/v1/messages", {"messages": USER, "cache_prompt": "yes"}, "cache_prompt"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages[0].content[0].text"),
    ("/v1/messages", {"messages": [{"role": "user", "content": "x"}, {
        "role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                          "input": 5}]}]}, "messages[1].content[0].input"),
    ("/v1/messages", {"messages": USER, "tools": [{"name": "f", "input_schema": 5}]},
     "tools[0].input_schema"),
    ("/v1/messages", {"messages": USER, "tools": [TOOL],
                      "tool_choice": {"type": "tool", "name": "g"}}, "tool_choice.name"),
    ("/v1/messages", {"messages": USER, "system": [{"type": "text"}]}, "system[0].text"),
    ("/v1/messages", {"messages": USER, "thinking": {"type": "maybe"}}, "thinking.type"),
    ("/v1/responses", {"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
     "input[0].content[0].text"),
    ("/v1/responses", {"input": "x", "text": {"format": {"type": "json_schema"}}},
     "text.format.schema"),
    ("/v1/responses", {"input": [{"type": "function_call", "call_id": "c", "name": "f",
                                  "arguments": "{"}]}, "input[0].arguments"),
    ("/v1/responses", {"input": [{"type": "function_call", "call_id": "c", "name": "f",
                                  "arguments": "{}"},
                                 {"type": "function_call_output", "output": "ok"}]},
     "input[1].call_id"),
    ("/v1/responses", {"input": "x", "tools": [{"type": "function", "name": ""}]},
     "tools[0].name"),
    ("/v1/responses", {"input": "x", "reasoning": {"effort": 3}}, "reasoning.effort"),
    ("/v1/chat/completions", {"messages": USER, "stream_options": {"include_usage": 1}},
     "stream_options.include_usage"),
    ("/completion", {"prompt": "a", "cache_prompt": "x"}, "cache_prompt"),
]


@pytest.mark.parametrize("path,body,param", OWN_FIELDS,
                         ids=[f"{p}:{param}" for p, _, param in OWN_FIELDS])
def test_errors_name_the_routes_own_field(strict, path, body, param):
    r = strict.post(path, body)
    assert r.status == 400, r.text
    assert r.json["error"]["param"] == param, r.text


# (path, messages/input, the field the 400 names) -- and the same shapes that are valid
BAD_CHATS = [
    ("/v1/chat/completions", [{"role": "user"}], "messages[0].content"),
    ("/v1/chat/completions", [{"role": "user", "content": None}], "messages[0].content"),
    ("/v1/chat/completions", [{"role": "function", "content": "x"}], "messages[0].role"),
    ("/v1/chat/completions", [*USER, {"role": "assistant"}], "messages[1].content"),
    ("/v1/chat/completions", [*USER, {"role": "tool", "content": "42"}], "messages[1]"),
    ("/v1/chat/completions", [*USER, {"role": "assistant", "content": "hm"},
                              {"role": "tool", "content": "42"}], "messages[2]"),
    ("/v1/chat/completions", [*USER, {"role": "assistant", "tool_calls": [CALL]},
                              {"role": "tool", "tool_call_id": "c2", "content": "42"}],
     "messages[2].tool_call_id"),
    ("/v1/messages", [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "42"}]}],
     "messages[0].content[0]"),
    ("/v1/messages", [{"role": "system", "content": "x"}], "messages[0].role"),
    ("/v1/messages", [{"role": "user"}], "messages[0].content"),
    ("/v1/responses", [{"type": "function_call_output", "call_id": "c1", "output": "42"}],
     "input[0]"),
    ("/v1/responses", [{"role": "tool", "content": "42"}], "input[0].role"),
]
GOOD_CHATS = [
    ("/v1/chat/completions", [*USER, {"role": "assistant", "tool_calls": [CALL]},
                              {"role": "tool", "tool_call_id": "c1", "content": "42"}]),
    ("/v1/chat/completions", [*USER, {"role": "assistant", "content": None,
                                      "tool_calls": [CALL]},
                              {"role": "tool", "content": "42"}]),
    ("/v1/messages", [*USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "42"}]}]),
    ("/v1/responses", [*USER, {"type": "function_call", "call_id": "c1", "name": "f",
                               "arguments": "{}"},
                       {"type": "function_call_output", "call_id": "c1", "output": "42"}]),
]


def _body(path: str, msgs: list) -> dict:
    key = "input" if "responses" in path else "messages"
    return {key: msgs, "max_tokens" if "responses" not in path else "max_output_tokens": 1}


@pytest.mark.parametrize("path,msgs,param", BAD_CHATS,
                         ids=[f"{p}:{param}" for p, _, param in BAD_CHATS])
def test_conversations_are_checked(strict, path, msgs, param):
    r = strict.post(path, _body(path, msgs))
    assert r.status == 400, r.text
    assert r.json["error"]["param"] == param, r.text


@pytest.mark.parametrize("path,msgs", GOOD_CHATS, ids=[p for p, _ in GOOD_CHATS])
def test_tool_results_after_their_calls_are_served(strict, path, msgs):
    r = strict.post(path, _body(path, msgs))
    assert r.status == 200, r.text


def test_logprobs_are_the_same_on_every_route(strict):
    """One prompt, greedy, through chat completions and the Responses API: the same
    tokens with the same logprobs and alternatives, in one encoding."""
    chat = strict.post("/v1/chat/completions", {
        "messages": USER, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
        "logprobs": True, "top_logprobs": 3}).json["choices"][0]["logprobs"]["content"]
    resp = strict.post("/v1/responses", {
        "input": USER, "max_output_tokens": 4, "temperature": 0, "ignore_eos": True,
        "top_logprobs": 3, "include": ["message.output_text.logprobs"]}).json
    got = resp["output"][0]["content"][0]["logprobs"]
    assert len(chat) == 4 and got == chat
    events = strict.post("/v1/responses", {
        "input": USER, "max_output_tokens": 4, "temperature": 0, "ignore_eos": True,
        "stream": True, "top_logprobs": 3}).sse()
    streamed = [lp for e in events if e["type"] == "response.output_text.delta"
                for lp in e["logprobs"]]
    assert streamed == chat


# A template that shows the tools and writes calls in a syntax no format of ckptd reads
# (each of llama.cpp's 70 has a format: tests/model/test_tool_templates.py)
UNREAD_CALLS = (
    "{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}{% for m in messages %}"
    "{{ m['role'] }}: {% for c in m.get('tool_calls') or [] %}<<CALL {{ c['function']['name'] }}"
    " {{ c['function']['arguments'] | tojson }}>>{% endfor %}{{ m['content'] or '' }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")


def test_tools_are_refused_with_a_template_whose_calls_are_not_read(tiny_llama_dir, tmp_path):
    """No format of ckptd reads the calls this template writes, so tools are refused
    (a 400 naming them) rather than read wrong; tool_choice none still serves."""
    template = tmp_path / "unread.jinja"
    template.write_text(UNREAD_CALLS)
    d = start(tiny_llama_dir, tmp_path / "cache", "--max-context", "1024",
              "--chat-template-file", str(template))
    try:
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        for path, body in (("/v1/chat/completions", {"messages": USER, "tools": tools}),
                           ("/v1/messages", {"messages": USER, "tools": [TOOL]})):
            r = d.post(path, {**body, "max_tokens": 1})
            assert r.status == 400 and r.json["error"]["param"] == "tools", r.text
            assert r.json["error"]["code"] == "not_supported" and "does not read" in r.text
        r = d.post("/v1/chat/completions", {"messages": USER, "tools": tools,
                                            "tool_choice": "none", "max_tokens": 1})
        assert r.status == 200, r.text
    finally:
        assert d.stop() == 0, d.output()
