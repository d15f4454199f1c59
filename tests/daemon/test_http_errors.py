"""Bad input gets the right 4xx with a JSON error naming the field; the daemon keeps serving."""

from __future__ import annotations

import pytest

from tests.daemon.conftest import MAX_BODY, MAX_CONTEXT

OK_PROMPT = {"prompt": [5, 6, 7], "max_tokens": 1}
USER = [{"role": "user", "content": "hi"}]

# (id, method, path, json body or raw bytes, status, param, code or None)
CASES = [
    ("malformed-json", "POST", "/v1/completions", b'{"prompt": ', 400, None, "invalid_json"),
    ("empty-body", "POST", "/v1/completions", b"", 400, None, "invalid_json"),
    ("not-an-object", "POST", "/v1/completions", [1, 2], 400, None, "invalid_type"),
    ("nan", "POST", "/v1/completions", b'{"prompt": "a", "temperature": NaN}', 400, None,
     "invalid_json"),
    ("invalid-utf8", "POST", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400, None,
     "invalid_utf8"),
    ("lone-surrogate", "POST", "/v1/completions", b'{"prompt": "\\ud800"}', 400, None,
     "invalid_utf8"),
    ("lone-surrogate-upper", "POST", "/v1/completions", b'{"prompt": "\\uDFFF"}', 400, None,
     "invalid_utf8"),
    ("lone-surrogate-in-key", "POST", "/v1/completions", b'{"\\udc00": 1, "prompt": [5]}',
     400, None, "invalid_utf8"),
    ("missing-prompt", "POST", "/v1/completions", {"max_tokens": 1}, 400, "prompt",
     "missing_field"),
    ("empty-prompt", "POST", "/v1/completions", {"prompt": ""}, 400, "prompt", None),
    ("prompt-wrong-type", "POST", "/v1/completions", {"prompt": 12}, 400, "prompt",
     "invalid_type"),
    ("prompt-bad-token", "POST", "/v1/completions", {"prompt": [1, 10**9]}, 400, "prompt",
     None),
    ("prompt-bool-token", "POST", "/v1/completions", {"prompt": [5, True]}, 400, "prompt",
     "invalid_type"),
    ("prompt-float-token", "POST", "/v1/completions", {"prompt": [5, 6.0]}, 400, "prompt",
     "invalid_type"),
    ("prompt-negative-token", "POST", "/v1/completions", {"prompt": [5, -1]}, 400, "prompt",
     None),
    ("prompt-mixed-bad-token", "POST", "/v1/completions", {"prompt": [5, "a", 10**9]}, 400,
     "prompt", None),
    ("prompt-too-long", "POST", "/v1/completions",
     {"prompt": [5] * (MAX_CONTEXT + 10), "max_tokens": 1}, 400, "prompt",
     "context_length_exceeded"),
    ("max-tokens-string", "POST", "/v1/completions", {**OK_PROMPT, "max_tokens": "5"}, 400,
     "max_tokens", "invalid_type"),
    ("max-tokens-negative", "POST", "/v1/completions", {**OK_PROMPT, "max_tokens": -3}, 400,
     "max_tokens", None),
    ("max-tokens-bool", "POST", "/v1/completions", {**OK_PROMPT, "max_tokens": True}, 400,
     "max_tokens", "invalid_type"),
    ("temperature-negative", "POST", "/v1/completions", {**OK_PROMPT, "temperature": -1}, 400,
     "temperature", None),
    ("top-p-zero", "POST", "/v1/completions", {**OK_PROMPT, "top_p": 0}, 400, "top_p", None),
    ("stop-wrong-type", "POST", "/v1/completions", {**OK_PROMPT, "stop": [1]}, 400, "stop",
     "invalid_type"),
    ("logprobs-too-many", "POST", "/v1/completions", {**OK_PROMPT, "logprobs": 50}, 400,
     "logprobs", None),
    ("presence-too-big", "POST", "/v1/completions", {**OK_PROMPT, "presence_penalty": 3}, 400,
     "presence_penalty", None),
    ("frequency-string", "POST", "/v1/chat/completions",
     {"messages": USER, "frequency_penalty": "1"}, 400, "frequency_penalty", "invalid_type"),
    ("repetition-zero", "POST", "/v1/completions", {**OK_PROMPT, "repetition_penalty": 0},
     400, "repetition_penalty", None),
    ("bias-not-object", "POST", "/v1/completions", {**OK_PROMPT, "logit_bias": [[5, 1]]}, 400,
     "logit_bias", "invalid_type"),
    ("bias-empty-key", "POST", "/v1/chat/completions",
     {"messages": USER, "logit_bias": {"": 1}}, 400, "logit_bias", None),
    ("bias-outside-vocab", "POST", "/v1/completions",
     {**OK_PROMPT, "logit_bias": {"99999999": 1}}, 400, "logit_bias", None),
    ("bias-too-big", "POST", "/v1/completions", {**OK_PROMPT, "logit_bias": {"5": 101}}, 400,
     "logit_bias", None),
    ("bias-false-openai", "POST", "/v1/completions", {**OK_PROMPT, "logit_bias": {"5": False}},
     400, "logit_bias", None),
    ("llama-bias-bad-pair", "POST", "/completion", {"prompt": "a", "logit_bias": [[5]]}, 400,
     "logit_bias", "invalid_type"),
    ("llama-repeat-last-n", "POST", "/completion", {"prompt": "a", "repeat_last_n": -2}, 400,
     "repeat_last_n", None),
    ("llama-repeat-penalty", "POST", "/completion", {"prompt": "a", "repeat_penalty": -1},
     400, "repeat_penalty", None),
    ("n-too-many", "POST", "/v1/completions", {**OK_PROMPT, "n": 99}, 400, "n", None),
    ("n-zero", "POST", "/v1/chat/completions", {"messages": USER, "n": 0}, 400, "n", None),
    ("stream-not-bool", "POST", "/v1/completions", {**OK_PROMPT, "stream": "yes"}, 400,
     "stream", "invalid_type"),
    ("salt-wrong-type", "POST", "/v1/completions", {**OK_PROMPT, "cache_salt": 3}, 400,
     "cache_salt", "invalid_type"),
    ("unknown-context", "POST", "/v1/completions", {**OK_PROMPT, "context": "nope"}, 404,
     "context", "context_not_found"),
    ("empty-messages", "POST", "/v1/chat/completions", {"messages": []}, 400, "messages", None),
    ("missing-messages", "POST", "/v1/chat/completions", {"max_tokens": 1}, 400, "messages",
     "missing_field"),
    ("messages-not-list", "POST", "/v1/chat/completions", {"messages": "hi"}, 400, "messages",
     "invalid_type"),
    ("bad-role", "POST", "/v1/chat/completions",
     {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role", None),
    ("bad-content", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content",
     "invalid_type"),
    ("chat-top-logprobs", "POST", "/v1/chat/completions",
     {"messages": USER, "logprobs": True, "top_logprobs": 99}, 400, "top_logprobs", None),
    ("bad-grammar", "POST", "/completion", {"prompt": "a", "grammar": "root ::= (x"}, 400,
     "grammar", "invalid_grammar"),
    ("bad-schema-type", "POST", "/v1/chat/completions",
     {"messages": USER, "response_format": {"type": "json_object", "schema": {"type": 123}}},
     400, "response_format", "invalid_grammar"),
    ("bad-response-format", "POST", "/v1/chat/completions",
     {"messages": USER, "response_format": {"type": "sound"}}, 400, "response_format.type",
     None),
    ("two-constraints", "POST", "/completion",
     {"prompt": "a", "grammar": 'root ::= "a"', "json_schema": {}}, 400, "json_schema", None),
    ("image-part", "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages[0].content[0].image_url", "not_supported"),
    # each API's own image shape, its errors naming the API's own field
    ("anthropic-image", "POST", "/v1/messages", {"max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}, 400,
     "messages[0].content[1].source", "not_supported"),
    ("anthropic-image-no-source", "POST", "/v1/messages", {"max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image"}]}]}, 400, "messages[0].content[0].source",
     "missing_field"),
    ("anthropic-result-image", "POST", "/v1/messages", {"max_tokens": 2, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]}]}, 400,
     "messages[1].content[0].content[0].source.url", "not_supported"),
    ("responses-image", "POST", "/v1/responses", {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]}, 400,
     "input[0].content[0].image_url", "not_supported"),
    ("responses-image-file-id", "POST", "/v1/responses", {"input": [{"role": "user", "content": [
        {"type": "input_image", "file_id": "file-1"}]}]}, 400, "input[0].content[0].file_id",
     "not_supported"),
    ("multimodal-data", "POST", "/completion", {"prompt": {
        "prompt_string": "<__media__>", "multimodal_data": ["iVBORw0KGgo="]}}, 400,
     "prompt.multimodal_data[0]", "not_supported"),
    ("embeddings", "POST", "/v1/embeddings", {"input": "a"}, 501, None, "not_supported"),
    ("slot-bad-id", "POST", "/slots/99?action=erase", None, 400, "id_slot", None),
    ("slot-bad-action", "POST", "/slots/0?action=burn", None, 400, "action", None),
    ("slot-no-path", "POST", "/slots/0?action=save", {"filename": "a.bin"}, 501, None,
     "not_supported"),
    ("n-predict-negative", "POST", "/completion", {"prompt": "a", "n_predict": -5}, 400,
     "n_predict", None),
    ("tokenize-missing", "POST", "/tokenize", {}, 400, "content", "missing_field"),
    ("detokenize-bad", "POST", "/detokenize", {"tokens": ["a"]}, 400, "tokens",
     "invalid_type"),
    ("detokenize-bool", "POST", "/detokenize", {"tokens": [5, True]}, 400, "tokens",
     "invalid_type"),
    ("context-bad-name", "POST", "/v1/contexts", {"name": "a b", "text": "x"}, 400, "name",
     None),
    ("context-no-source", "POST", "/v1/contexts", {"name": "a"}, 400, "text", None),
    ("context-unknown", "GET", "/v1/contexts/nope", None, 404, "name", "context_not_found"),
    ("entries-bad-limit", "GET", "/cache/entries?limit=0", None, 400, "limit", None),
    ("entries-bad-sort", "GET", "/cache/entries?sort=random", None, 400, "sort", None),
    ("delete-bad-key", "DELETE", "/cache/entries/xyz", None, 400, "key", None),
    ("delete-unknown-key", "DELETE", "/cache/entries/" + "0" * 32, None, 404, "key", None),
    ("pin-missing-key", "POST", "/cache/pin", {}, 400, "key", "missing_field"),
    ("pin-unknown-key", "POST", "/cache/pin", {"key": "ab" * 16}, 404, "key", None),
    ("unknown-route", "GET", "/v2/nothing", None, 404, None, "not_found"),
    ("wrong-method", "GET", "/v1/completions", None, 405, None, "method_not_allowed"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(daemon, case):
    _, method, path, body, status, param, code = case
    raw = body if isinstance(body, bytes) else None
    r = daemon.request(method, path, None if raw is not None else body, raw=raw)
    assert r.status == status, r.text
    err = r.json["error"]
    extra = {"n_prompt_tokens", "n_ctx"} if code == "context_length_exceeded" else set()
    assert set(err) == {"message", "type", "param", "code"} | extra and err["message"]
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code


def test_escapes_that_are_no_lone_surrogate_pass(daemon):
    """Only a lone surrogate escape is refused: a pair is one character, and an escaped
    backslash before "ud800" is text (the check before the re-encoding finds both)."""
    for raw in (b'{"prompt": "a\\ud83d\\ude00", "max_tokens": 1}',
                b'{"prompt": "a\\\\ud800", "max_tokens": 1}'):
        r = daemon.request("POST", "/v1/completions", None, raw=raw)
        assert r.status == 200, (raw, r.text)


def test_over_long_requests_are_clamped_to_the_context(daemon):
    """n_predict / max_tokens past the context: generated up to its end (llama-server)."""
    for path, body in (("/v1/completions", {**OK_PROMPT, "max_tokens": 10**12}),
                       ("/completion", {"prompt": [5, 6], "n_predict": 10**9})):
        r = daemon.post(path, {**body, "ignore_eos": True, "temperature": 0})
        assert r.status == 200, r.text
        done = r.json["timings"]["predicted_n"]
        assert done + len(body["prompt"]) == MAX_CONTEXT


def test_context_overflow_reports_its_sizes(daemon):
    r = daemon.post("/chat/completions", {"messages": [{"role": "user",
                                                        "content": "word " * MAX_CONTEXT}]})
    err = r.json["error"]
    assert r.status == 400 and err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == MAX_CONTEXT and err["n_prompt_tokens"] > MAX_CONTEXT


def test_deeply_nested_json_is_a_400_and_serving_goes_on(daemon):
    # 30,000 levels fit this daemon's --max-body; test_clients.py sends 50,000
    for raw in (b"[" * 30_000 + b"]" * 30_000, b'{"a":' * 10_000 + b"1" + b"}" * 10_000):
        r = daemon.post("/v1/completions", raw=raw)
        assert r.status == 400 and r.json["error"]["code"] == "invalid_json", r.text
    r = daemon.post("/v1/completions", OK_PROMPT)
    assert r.status == 200 and r.json["usage"]["completion_tokens"] == 1


def test_oversized_body_then_still_serving(daemon):
    big = {"prompt": "a" * (MAX_BODY + 100)}
    r = daemon.post("/v1/completions", big)
    assert r.status == 413 and r.json["error"]["code"] == "body_too_large"
    assert daemon.get("/health").status == 200
    r = daemon.post("/v1/completions", OK_PROMPT)
    assert r.status == 200 and r.json["usage"]["completion_tokens"] == 1
