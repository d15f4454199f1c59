"""Chat prompts as llama-server builds them (issue 23), against a real daemon: the
template's variables (enable_thinking, today's date, tools, chat_template_kwargs), an
answer's start continued, typed content, tool-call history, __verbose; fill-in-the-
middle on a model with FIM tokens; several names, tags and addresses."""

from __future__ import annotations

import datetime
import json
import socket

import pytest

from ckptd.tools.make_tiny import make_tiny
from tests.daemon.daemon_proc import start

# A template that writes out what it was given, so the tests read the variables.
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}[call {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}]{% endfor %}{% endif %}</{{ m['role'] }}>"
    "{% endfor %}"
    "{% if tools %}<tools>{{ tools | map(attribute='function') | map(attribute='name') "
    "| join(',') }}</tools>{% endif %}"
    "<date>{{ date_string }}|{{ datetime }}</date>"
    "{% if flavour is defined %}<flavour>{{ flavour }}</flavour>{% endif %}"
    "<functions>{{ functions }}</functions>"
    "{% if add_generation_prompt %}<assistant>"
    "{% if not enable_thinking %}<think></think>{% endif %}{% endif %}")
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "weather",
                                         "parameters": {"type": "object", "properties": {
                                             "city": {"type": "string"}}}}}
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def chat(tiny_llama_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chat")
    (tmp / "t.jinja").write_text(TEMPLATE)
    d = start(tiny_llama_dir, tmp / "cache", "--max-context", "256", "--parallel", "2",
              "--chat-template-file", str(tmp / "t.jinja"))
    yield d
    assert d.stop() == 0, d.output()


def _prompt(d, **body) -> str:
    r = d.post("/apply-template", {"messages": USER, **body})
    assert r.status == 200, r.text
    return r.json["prompt"]


def test_template_variables_as_llama_server_gives_them(chat):
    today = datetime.date.today()
    p = _prompt(chat)
    assert p.endswith("<assistant>")                     # enable_thinking: true by default
    assert f"<date>{today.strftime('%d %b %Y')}|{today.strftime('%b %d %Y')}</date>" in p
    assert "<tools>" not in _prompt(chat, tools=[])
    assert "<tools>get_weather</tools>" in _prompt(chat, tools=[TOOL])
    # FireFunction's templates read the tools as JSON text, "" without them
    assert "<functions></functions>" in _prompt(chat)
    listed = _prompt(chat, tools=[TOOL]).split("<functions>")[1].split("</functions>")[0]
    assert json.loads(listed) == [TOOL]
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    assert _prompt(chat, **off).endswith("<assistant><think></think>")
    assert _prompt(chat, reasoning_effort="none").endswith("<think></think>")
    assert "<flavour>salt</flavour>" in _prompt(chat, chat_template_kwargs={"flavour": "salt"})
    assert not _prompt(chat, add_generation_prompt=False).endswith("<assistant>")
    bad = chat.post("/apply-template", {"messages": USER,
                                        "chat_template_kwargs": {"enable_thinking": "no"}})
    assert bad.status == 400 and bad.json["error"]["param"] == \
        "chat_template_kwargs.enable_thinking"


def test_messages_parts_prefill_and_tool_history(chat):
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "the best book"}]
    p = _prompt(chat, messages=[{"role": "developer", "content": "Be brief"},
                                {"role": "user", "content": parts}])
    assert p.startswith("<system>Be brief</system><user>What is\nthe best book</user>")
    msgs = USER + [{"role": "assistant", "content": [{"type": "text", "text": "Wh"},
                                                     {"type": "text", "text": "ill"}]}]
    assert _prompt(chat, messages=msgs).endswith("<assistant>Wh\n\nill")
    cont = chat.post("/apply-template", {"messages": msgs, "continue_final_message": True,
                                         "add_generation_prompt": True})
    assert cont.status == 400 and cont.json["error"]["param"] == "continue_final_message"
    calls = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    p = _prompt(chat, messages=calls, tools=[TOOL])
    assert '[call get_weather {"city": "Paris"}]' in p and "<tool>sunny</tool>" in p
    for bad in ({"tools": [{"type": "function"}]}, {"tools": [TOOL], "tool_choice": "some"},
                {"tools": [TOOL], "tool_choice": {"type": "function",
                                                  "function": {"name": "other"}}}):
        r = chat.post("/v1/chat/completions", {"messages": USER, "max_tokens": 1, **bad})
        assert r.status == 400 and r.json["error"]["param"].startswith("tool"), bad


def test_verbose_returns_the_prompt_read(chat):
    msgs = USER + [{"role": "assistant", "content": "Whill"}]
    r = chat.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 2,
                                           "verbose": True, "temperature": 0,
                                           "ignore_eos": True})
    assert r.status == 200, r.text
    v = r.json["__verbose"]
    assert v["prompt"].endswith("<assistant>Whill") and v["tokens_predicted"] == 2
    assert "generation_settings" in v and v["content"] == \
        r.json["choices"][0]["message"]["content"]
    assert "__verbose" not in chat.post("/v1/chat/completions", {
        "messages": USER, "max_tokens": 1}).json


def test_infill_on_a_model_with_fim_tokens(tmp_path):
    model = make_tiny("llama", tmp_path / "fim", fim=True)
    d = start(model, tmp_path / "cache", "--max-context", "512")
    try:
        def ids(text: str) -> list[int]:
            return d.post("/tokenize", {"content": text}).json["tokens"]

        special = {name: ids(name)[0] for name in ("<|fim_prefix|>", "<|fim_suffix|>",
                                                   "<|fim_middle|>", "<|repo_name|>",
                                                   "<|file_sep|>")}
        body = {"input_extra": [{"filename": "a.py", "text": "def add(a, b):\n"}],
                "input_prefix": "x = add(", "input_suffix": ")\n", "prompt": "1, ",
                "n_predict": 4, "temperature": 0, "ignore_eos": True, "return_tokens": True}
        got = d.post("/infill", body)
        assert got.status == 200, got.text
        # llama-server's repo-level layout, built here from its parts
        want = ([special["<|repo_name|>"]] + ids("myproject\n") +
                [special["<|file_sep|>"]] + ids("a.py\n") + ids("def add(a, b):\n") +
                [special["<|file_sep|>"]] + ids("filename\n") +
                [special["<|fim_prefix|>"]] + ids("x = add(") + ids("1, ") +
                [special["<|fim_suffix|>"]] + ids(")\n") + [special["<|fim_middle|>"]])
        assert got.json["tokens_evaluated"] == len(want)
        same = d.post("/completion", {**body, "prompt": want}).json
        assert got.json["tokens"] == same["tokens"] and len(same["tokens"]) == 4
        for bad in ([{"filename": "ok"}], [{"filename": 1, "text": "x"}], "x"):
            r = d.post("/infill", {**body, "input_extra": bad})
            assert r.status == 400 and r.json["error"]["param"].startswith("input_extra"), bad
        r = d.post("/infill", {"input_suffix": "x"})
        assert r.status == 400 and r.json["error"]["param"] == "input_prefix"
    finally:
        assert d.stop() == 0, d.output()


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_names_tags_and_two_addresses(tiny_llama_dir, tmp_path):
    hosts = "127.0.0.1,::1" if _ipv6() else "127.0.0.1,localhost"
    d = start(tiny_llama_dir, tmp_path / "cache", "--max-context", "64", "--host", hosts,
              "--alias", "tiny,code,fim", "--tags", "chat,small", "--strict-model-name")
    try:
        m = d.get("/v1/models").json["data"][0]
        assert m["id"] == "code" and m["aliases"] == ["code", "fim", "tiny"]
        assert m["tags"] == ["chat", "small"]
        for name in ("tiny", "fim"):             # every name is the model's
            r = d.post("/v1/completions", {"model": name, "prompt": "a", "max_tokens": 1})
            assert r.status == 200, r.text
        if _ipv6():
            import http.client
            conn = http.client.HTTPConnection("::1", d.port, timeout=30)
            conn.request("GET", "/health")
            assert conn.getresponse().status == 200
            conn.close()
    finally:
        assert d.stop() == 0, d.output()
