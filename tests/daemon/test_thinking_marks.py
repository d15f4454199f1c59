"""Thinking blocks in the marks of their chat template, not only <think> (issue 31):
SmolLM2 served with llama.cpp's real Cohere2 (Command A), Ministral 3 Reasoning and
Apriel 1.6 templates, its answer forced by a grammar to a block of reasoning and a
plain answer; in auto mode (no tools) the block comes back as `reasoning_content`,
whole and streamed, and `reasoning_format: "none"` keeps it in the content."""

from __future__ import annotations

import pytest

from ckptd.tools import llama_suite
from tests.daemon.daemon_proc import start

# template -> the answer the grammar forces (the Cohere2 and Apriel 1.6 prompts open
# the block; Ministral's answer opens it with [THINK])
ANSWERS = {
    "Cohere2MoE": "two and two<|END_THINKING|>four",
    "mistralai-Ministral-3-14B-Reasoning-2512": "[THINK]two and two[/THINK]four",
    "Apriel-1.6-15b-Thinker-fixed": "two and two\n[BEGIN FINAL RESPONSE]\nfour",
}


@pytest.fixture(scope="module", params=sorted(ANSWERS))
def served(request, tmp_path_factory):
    templates = llama_suite.fetch_templates(llama_suite.ROOT / "third_party")
    d = start(None, tmp_path_factory.mktemp("think") / "cache", "--max-context", "2048",
              "--parallel", "1", "--chat-template-file",
              str(templates / f"{request.param}.jinja"), env={"OMP_NUM_THREADS": "1"})
    d.answer = ANSWERS[request.param]
    yield d
    assert d.stop() == 0, d.output()


def _body(d, **kw) -> dict:
    return {"messages": [{"role": "user", "content": "What is two and two?"}],
            "grammar": "root ::= " + _gbnf_literal(d.answer), "temperature": 0,
            "max_tokens": 64, **kw}


def _gbnf_literal(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def test_block_is_reasoning(served):
    r = served.post("/v1/chat/completions", _body(served), timeout=300)
    assert r.status == 200, r.text
    msg = r.json["choices"][0]["message"]
    assert (msg.get("reasoning_content"), msg["content"]) == ("two and two", "four"), msg


def test_streamed_block_is_reasoning(served):
    r = served.post("/v1/chat/completions", _body(served, stream=True), timeout=300)
    assert r.status == 200, r.text
    reasoning = content = ""
    for chunk in r.sse():
        if chunk == "[DONE]" or not chunk.get("choices"):
            continue
        delta = chunk["choices"][0]["delta"]
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
    assert (reasoning, content) == ("two and two", "four")


def test_reasoning_format_none_keeps_it_in_the_content(served):
    r = served.post("/v1/chat/completions", _body(served, reasoning_format="none"), timeout=300)
    assert r.status == 200, r.text
    msg = r.json["choices"][0]["message"]
    assert not msg.get("reasoning_content") and msg["content"] == served.answer, msg
