"""Where a prompt's structure says the next one parts (daemon/prompt.py): chat anchors
from the template's own renderings, as token positions of the rendered text."""

from __future__ import annotations

from ckptd.daemon.http.chat import ChatPrompt
from ckptd.daemon.prompt import anchors_at, chat_heads
from ckptd.model.text.tokenizer import Tokenizer


def test_anchors_are_the_tokens_ending_at_or_before_each_offset():
    ends = [3, 5, 9, 12]                              # four tokens over 12 characters
    assert anchors_at(ends, [5, 9], 4) == (2, 3)
    assert anchors_at(ends, [7], 4) == (2,)           # inside a token: the ones before it
    assert anchors_at(ends, [0, 2, 12, 99], 4) == ()  # none before, or the whole prompt
    assert anchors_at(ends, [9, 9, 5], 4) == (2, 3)


def test_chat_heads_are_the_turns_before_the_last_question_and_before_the_answer():
    sys, u1, a1, u2 = ({"role": r, "content": c} for r, c in
                       (("system", "s"), ("user", "q1"), ("assistant", "a1"), ("user", "q2")))
    heads = chat_heads(ChatPrompt([sys, u1, a1, u2]))
    assert [(h.messages, h.add_generation_prompt) for h in heads] == \
        [([sys, u1, a1], False), ([sys, u1, a1, u2], False)]
    assert [h.messages for h in chat_heads(ChatPrompt([u1]))] == [[u1]]   # nothing before
    assert chat_heads(ChatPrompt([sys, u1], add_generation_prompt=False)) == \
        [ChatPrompt([sys], add_generation_prompt=False)]
    continued = chat_heads(ChatPrompt([sys, u1], prefill="The answer"))
    assert [(h.messages, h.prefill) for h in continued] == [([sys], None), ([sys, u1], None)]


def test_a_chat_anchor_is_where_a_new_question_parts(tiny_hybrid_dir):
    """With the model's template and tokenizer: the anchor at the last user message is
    the length of the tokens the next conversation with that system message shares."""
    tok = Tokenizer.from_dir(tiny_hybrid_dir)
    sys = {"role": "system", "content": "You answer questions about the memory store. " * 80}
    ask = [{"role": "user", "content": q} for q in ("What is a tier?", "Why a snapshot?")]
    one = tok.apply_chat_template([sys, ask[0]])
    two = tok.apply_chat_template([sys, ask[1]])
    ids, ends = tok.encode_ends(one)
    assert ids == tok.encode(one)
    heads = [tok.apply_chat_template(h.messages, h.add_generation_prompt)
             for h in chat_heads(ChatPrompt([sys, ask[0]]))]
    got = anchors_at(ends, [len(h) for h in heads], len(ids))
    shared = next(i for i, (a, b) in enumerate(zip(ids, tok.encode(two))) if a != b)
    before_turn = len(tok.encode(tok.apply_chat_template([sys], False)))
    assert got[0] == before_turn <= shared
    assert ids[:got[1]] == tok.encode(tok.apply_chat_template([sys, ask[0]], False))
