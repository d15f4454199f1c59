"""The other APIs llama-server speaks (issue 23), against a real daemon with the clients
people use: OpenAI's Responses API through the openai SDK, Vertex AI's prediction
protocol (AIP_MODE=PREDICTION)."""

from __future__ import annotations

import openai
import pytest

from tests.daemon.daemon_proc import start


@pytest.fixture(scope="module")
def served(tiny_llama_dir, tmp_path_factory):
    d = start(tiny_llama_dir, tmp_path_factory.mktemp("apis") / "cache", "--max-context", "512",
              "--parallel", "2", "--alias", "tiny",
              env={"AIP_MODE": "PREDICTION", "AIP_HEALTH_ROUTE": "/aip-health"})
    yield d
    assert d.stop() == 0, d.output()


def _client(d) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.url + "/v1", api_key="none", max_retries=0, timeout=90)


def test_responses_through_the_openai_sdk(served):
    client = _client(served)
    kw = {"model": "gpt-4.1", "max_output_tokens": 6, "temperature": 0,
          "extra_body": {"ignore_eos": True}}
    res = client.responses.create(input=[{"role": "system", "content": "Book"},
                                         {"role": "user", "content": "What is the best book"}],
                                  **kw)
    assert res.id.startswith("resp_") and res.output[0].id.startswith("msg_")
    assert res.status == "incomplete" and res.incomplete_details.reason == "max_output_tokens"
    assert res.usage.output_tokens == 6 and res.usage.input_tokens > 5
    events = list(client.responses.create(input="What is the best book", stream=True,
                                          instructions="Book", **kw))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-1] == "response.incomplete" and "response.output_text.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == res.output_text
    done = client.responses.create(input="Hi", model="x", max_output_tokens=200,
                                   temperature=0)
    assert done.status in ("completed", "incomplete")


def test_responses_items_telemetry_and_refusals(served):
    items = [{"role": "user", "content": "weather?"},
             {"type": "function_call", "call_id": "c1", "name": "get_weather",
              "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
    r = served.post("/v1/responses", {"input": items, "max_output_tokens": 2,
                                      "tools": [{"type": "function", "name": "get_weather",
                                                 "parameters": {"type": "object"}}]})
    assert r.status == 200 and r.json["object"] == "response", r.text
    events = served.post("/responses", {"input": "This is a test " * 10, "stream": True,
                                        "max_output_tokens": 3, "timings_per_token": True,
                                        "return_progress": True}).sse()
    assert any("prompt_progress" in e and e["type"] == "response.in_progress" for e in events)
    assert all("timings" in e for e in events if e["type"] == "response.output_text.delta")
    assert "timings" in events[-1] and events[-1]["response"]["usage"]["output_tokens"] == 3
    for body, param in (({"input": "x", "previous_response_id": "resp_1"},
                         "previous_response_id"),
                        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
                        ({"instructions": "x"}, "input")):
        r = served.post("/v1/responses", body)
        assert r.status == 400 and r.json["error"]["param"] == param, r.text
    n = served.post("/v1/responses/input_tokens", {"input": "Hello world"}).json
    assert n["input_tokens"] > 1


def test_vertex_predictions(served):
    r = served.post("/predict", {"instances": [
        {"@requestFormat": "chatCompletions", "max_tokens": 2, "stream": True,
         "messages": [{"role": "user", "content": "Say hello"}]},
        {"@requestFormat": "/completion", "prompt": "a", "n_predict": 1},
        {"@requestFormat": "nothing"},
        {"@requestFormat": "chatCompletions", "messages": []}]})
    assert r.status == 200, r.text
    chat, completion, unknown, bad = r.json["predictions"]
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"] == \
        "assistant"
    assert "content" in completion and completion["stop"] is True
    assert unknown["error"]["param"] == "@requestFormat"
    assert bad["error"]["param"] == "messages"
    assert served.post("/predict", {"instances": {}}).status == 400
    assert served.get("/aip-health").status == 200


def test_anthropic_messages(served):
    body = {"model": "claude-x", "max_tokens": 4, "system": [{"type": "text", "text": "Be brief"}],
            "messages": [{"role": "user", "content": "Say hello"}], "temperature": 0}
    r = served.post("/v1/messages", body, headers={"x-api-key": "any",
                                                   "anthropic-version": "2023-06-01"})
    assert r.status == 200, r.text
    m = r.json
    assert m["type"] == "message" and m["role"] == "assistant" and m["id"].startswith("msg_")
    assert m["content"][0]["type"] == "text" and "timings" not in m
    assert m["stop_reason"] in ("end_turn", "max_tokens")
    assert m["usage"]["input_tokens"] + m["usage"]["cache_read_input_tokens"] > 3
    again = served.post("/v1/messages", body).json       # the same prompt: restored
    assert again["usage"]["cache_read_input_tokens"] > 0
    events = served.post("/v1/messages", {**body, "stream": True}).sse()
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop",
            "message_delta"} <= set(kinds)
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == m["content"][0]["text"]
    stop = served.post("/v1/messages", {**body, "max_tokens": 50, "temperature": 1, "seed": 1,
                                        "stop_sequences": [" "]}).json
    assert stop["stop_reason"] in ("stop_sequence", "end_turn", "max_tokens")
    if stop["stop_reason"] == "stop_sequence":
        assert stop["stop_sequence"] == " "
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": [
                   {"type": "thinking", "thinking": "check"},
                   {"type": "tool_use", "id": "t1", "name": "get_weather",
                    "input": {"city": "Paris"}}]},
               {"role": "user", "content": [
                   {"type": "text", "text": "here:"},
                   {"type": "tool_result", "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "sunny"}]}]}]
    tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    r = served.post("/v1/messages", {"max_tokens": 2, "messages": history, "tools": tools})
    assert r.status == 200, r.text
    n = served.post("/v1/messages/count_tokens", {"messages": history, "tools": tools}).json
    assert n["input_tokens"] > 5 and set(n) == {"input_tokens"}
    assert served.post("/v1/messages", {"max_tokens": 2, "messages": []}).status == 200
    assert served.post("/v1/messages", {"max_tokens": 2}).status == 400
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    r = served.post("/v1/messages", {"max_tokens": 2, "messages": [
        {"role": "user", "content": [img, {"type": "text", "text": "what?"}]}]})
    assert r.status == 400 and r.json["error"]["code"] == "not_supported"
