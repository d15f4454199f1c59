"""What existing llama.cpp and OpenAI clients need (issue 23), against a real daemon: any
model name, constrained output, n > 1 and batches, slots saved across a restart, CORS
and x-api-key, llama-server's metrics, hostile nesting."""

from __future__ import annotations

import json

import openai
import pytest

from tests.daemon.daemon_proc import start

PROMPT = list(range(40, 40 + 37))
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
KEY = "sk-clients-test"


@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def served(tiny_hybrid_dir, tmp_path_factory, slot_dir):
    d = start(tiny_hybrid_dir, tmp_path_factory.mktemp("clients") / "cache",
              "--max-context", "256", "--parallel", "2", "--step-tokens", "64",
              "--snapshot-interval", "64", "--slot-save-path", str(slot_dir),
              "--cors-origins", "localhost", "--api-key", KEY, "--alias", "tiny-alias")
    d.headers = {"Authorization": f"Bearer {KEY}"}
    yield d
    assert d.stop() == 0, d.output()


def _client(d) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.url + "/v1", api_key=KEY, max_retries=0, timeout=90)


def _valid(obj) -> bool:
    return isinstance(obj, dict) and set(obj) == {"name", "age"} and \
        isinstance(obj["name"], str) and isinstance(obj["age"], int) and \
        not isinstance(obj["age"], bool)


def test_openai_sdk_with_a_made_up_model_name(served):
    client = _client(served)
    kw = {"model": "gpt-3.5-turbo", "temperature": 0, "max_tokens": 5,
          "extra_body": {"ignore_eos": True}}
    c = client.completions.create(prompt=PROMPT, logprobs=2, **kw)
    assert c.model == "tiny-alias" and c.system_fingerprint.startswith("b")
    assert len(c.choices[0].logprobs.tokens) == 5
    msgs = [{"role": "user", "content": "hello"}]
    chat = client.chat.completions.create(messages=msgs, logprobs=True, top_logprobs=2, **kw)
    assert chat.choices[0].finish_reason == "length"
    assert len(chat.choices[0].logprobs.content) == 5
    parts = list(client.chat.completions.create(messages=msgs, stream=True, **kw))
    assert parts[0].choices[0].delta.role == "assistant"
    assert parts[0].choices[0].delta.content is None          # llama-server sends null
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text == chat.choices[0].message.content
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    out = client.chat.completions.create(model="made-up", messages=msgs, max_tokens=60,
                                         response_format=fmt, temperature=1, seed=3)
    assert _valid(json.loads(out.choices[0].message.content))
    assert [m.id for m in client.models.list().data] == ["tiny-alias"]


def test_grammar_gives_exactly_what_it_allows(served):
    r = served.post("/completion", {"prompt": "Say something", "grammar": 'root ::= "a"{5}',
                                    "n_predict": 20, "temperature": 1})
    assert r.status == 200 and r.json["content"] == "aaaaa", r.text
    r = served.post("/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                          "grammar": 'root ::= "a"{5,5}', "max_tokens": 6})
    assert r.json["choices"][0]["message"]["content"] == "aaaaa"


def test_json_schema_holds_over_20_sampled_requests(served):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    for seed in range(20):
        r = served.post("/completion", {"prompt": "JSON:", "json_schema": schema,
                                        "temperature": 1, "seed": seed, "n_predict": 100})
        assert r.status == 200, r.text
        out = json.loads(r.json["content"])
        assert set(out) == {"n"} and type(out["n"]) is int, r.json["content"]
    for seed in range(5):           # JSON mode is an object (OpenAI), never an array
        r = served.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "JSON"}], "max_tokens": 4, "seed": seed,
            "temperature": 1, "response_format": {"type": "json_object"}})
        assert r.json["choices"][0]["message"]["content"].startswith("{"), r.text


def test_n_choices_and_batch_prompts(served):
    r = served.post("/v1/completions", {"prompt": PROMPT, "n": 3, "max_tokens": 4,
                                        "temperature": 1, "seed": 1, "ignore_eos": True})
    choices = r.json["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert r.json["usage"]["prompt_tokens"] == len(PROMPT)
    assert r.json["usage"]["completion_tokens"] == 12
    greedy = {"n_predict": 3, "temperature": 0, "ignore_eos": True}
    one = served.post("/completion", {"prompt": "Paris", **greedy}).json
    batch = served.post("/completion", {"prompt": ["Paris", {"prompt_string": "Paris"}],
                                        **greedy}).json
    assert isinstance(batch, list) and [b["content"] for b in batch] == [one["content"]] * 2
    stream = served.post("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 2,
                                             "stream": True, "ignore_eos": True}).sse()
    assert {c["choices"][0]["index"] for c in stream if c != "[DONE]"} == {0, 1}


def test_llama_fields_and_props(served):
    body = {"prompt": "Paris is", "n_predict": 4, "temperature": 0, "ignore_eos": True}
    out = served.post("/completion", {**body, "response_fields": [
        "content", "generation_settings/n_predict"]}).json
    assert set(out) == {"content", "generation_settings/n_predict"}
    assert out["generation_settings/n_predict"] == 4
    full = served.post("/completion", {**body, "n_probs": 3, "post_sampling_probs": True,
                                       "temperature": 1, "seed": 5}).json
    for p in full["completion_probabilities"]:
        assert 0 < p["prob"] <= 1 and all(0 < t["prob"] <= 1 for t in p["top_probs"])
    gs = full["generation_settings"]
    assert gs["seed"] == 5 and {"token": 2, "bias": None} in gs["logit_bias"] or \
        gs["logit_bias"]                                  # ignore_eos bans the end tokens
    assert full["timings"]["predicted_per_second"] > 0
    one = served.post("/completion", {**body, "n_predict": 1}).json["timings"]
    assert one["predicted_per_second"] == 0.0            # no decode step after the first
    props = served.get("/props").json
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 256
    tpl = served.post("/apply-template", {"messages": [{"role": "user", "content": "hi"}]})
    assert "hi" in tpl.json["prompt"]
    n = served.post("/v1/chat/completions/input_tokens",
                    {"messages": [{"role": "user", "content": "hi"}]}).json["input_tokens"]
    assert n > 1


def test_progress_events_in_the_stream(served):
    events = served.post("/completion", {"prompt": list(range(30, 230)), "n_predict": 2,
                                         "stream": True, "return_progress": True}).sse()
    prog = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    assert len(prog) >= 3 and prog[0]["processed"] == prog[0]["cache"]
    assert [p["processed"] for p in prog] == sorted(p["processed"] for p in prog)
    assert prog[-1]["processed"] == prog[-1]["total"] == 200


def test_cors_x_api_key_and_metrics(served):
    pre = served.request("OPTIONS", "/v1/chat/completions", headers={
        "Authorization": "", "Origin": "http://localhost:3000",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status == 200
    assert pre.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
    assert "authorization" in pre.headers["Access-Control-Allow-Headers"]
    evil = served.request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "http://localhost.evil.com", "Access-Control-Request-Method": "POST"})
    assert "Access-Control-Allow-Origin" not in evil.headers
    r = served.request("GET", "/v1/models", headers={"Authorization": "",
                                                     "X-Api-Key": KEY})
    assert r.status == 200
    assert served.request("GET", "/v1/models", headers={"Authorization": ""}).status == 401
    m = served.get("/metrics")
    assert "Process-Start-Time-Unix" in m.headers
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:n_decode_total",
                 "llamacpp:requests_processing"):
        assert f"# TYPE {name} " in m.text and f"\n{name} " in m.text


def test_deep_nesting_of_50000_levels_is_a_400(served):
    for raw in (b"[" * 50_000 + b"]" * 50_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000):
        r = served.post("/completion", raw=raw)
        assert r.status == 400 and r.json["error"]["code"] == "invalid_json", r.text
    assert served.post("/completion", {"prompt": "a", "n_predict": 1}).status == 200


def test_slot_names_are_checked(served, slot_dir):
    for name in ("../x.bin", "/etc/passwd", ".hidden", "a/b", ""):
        r = served.post("/slots/0?action=save", {"filename": name})
        assert r.status == 400 and r.json["error"]["param"] == "filename", name
    r = served.post("/slots/1?action=restore", {"filename": "missing.bin"})
    assert r.status == 404
    (slot_dir / "junk.bin").write_bytes(b"not a state")
    r = served.post("/slots/1?action=restore", {"filename": "junk.bin"})
    assert r.status == 400 and r.json["error"]["code"] == "invalid_slot_file"


def test_slot_save_restart_restore_continues_exactly(tiny_hybrid_dir, tmp_path):
    """Saved, restored into a daemon with an empty cache: the continuation is the same
    as an uncached run's, and the prompt comes from the file, not from a computation."""
    slots = tmp_path / "slots"
    slots.mkdir()
    args = ("--max-context", "256", "--parallel", "2", "--slot-save-path", str(slots))
    prompt = list(range(50, 50 + 70))
    greedy = {"n_predict": 8, "temperature": 0, "ignore_eos": True, "return_tokens": True}
    a = start(tiny_hybrid_dir, tmp_path / "cache-a", *args)
    try:
        first = a.post("/completion", {"prompt": prompt, "id_slot": 1, **greedy}).json
        saved = a.post("/slots/1?action=save", {"filename": "s1.bin"})
        assert saved.status == 200, saved.text
        assert saved.json["n_saved"] == len(prompt) + len(first["tokens"]) - 1
        state = prompt + first["tokens"][:-1]          # the last token was never computed
        uncached = a.post("/completion", {"prompt": state + [7, 8, 9], "cache_prompt": False,
                                          **greedy}).json
    finally:
        assert a.stop() == 0
    b = start(tiny_hybrid_dir, tmp_path / "cache-b", *args)     # nothing cached there
    try:
        assert b.get("/slots").json[0]["n_cached"] == 0
        restored = b.post("/slots/0?action=restore", {"filename": "s1.bin"})
        assert restored.status == 200 and restored.json["n_restored"] == len(state)
        got = b.post("/completion", {"prompt": state + [7, 8, 9], **greedy}).json
        assert got["timings"]["cache_n"] == len(state)
        assert got["tokens"] == uncached["tokens"]
        # the slot now holds that last sequence (the request ran in the first free slot)
        assert b.post("/slots/0?action=erase").json["n_erased"] == len(state) + 3 + 7
        assert b.post("/slots/0?action=erase").json["n_erased"] == 0
    finally:
        assert b.stop() == 0


def test_off_switches_and_strict_names(tiny_hybrid_dir, tmp_path):
    d = start(tiny_hybrid_dir, tmp_path / "cache", "--max-context", "128", "--no-metrics",
              "--no-slots", "--strict-model-name")
    try:
        assert d.get("/metrics").status == 501 and d.get("/slots").status == 501
        r = d.post("/v1/completions", {"prompt": "a", "max_tokens": 1, "model": "gpt-9"})
        assert r.status == 404 and r.json["error"]["code"] == "model_not_found"
        assert d.request("OPTIONS", "/completion", headers={
            "Origin": "http://localhost", "Access-Control-Request-Method": "POST"}
        ).headers.get("Access-Control-Allow-Origin") is None       # no CORS by default
        assert d.post("/infill", {"input_prefix": "a", "input_suffix": "b"}).status == 400
    finally:
        assert d.stop() == 0
