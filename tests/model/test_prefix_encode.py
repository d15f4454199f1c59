"""A long text encoded by splicing onto a recent one gives exactly the ids of a whole
encoding: SmolLM2's GGUF tokenizer, the tiny HF one, and tokenizers the splice can't
serve (a prefix space added to every text), over random edits near the shared end."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer as _Tok

from ckptd.model.default import default_model_path
from ckptd.model.text.prefix_encode import MIN_CHARS, PrefixEncoder, _common_prefix
from ckptd.model.text.tokenizer import load_tokenizer
from ckptd.tools.bench.scenarios import filler

EDITS = ["", " ", "  ", "\n", "\n\n", "é", "e\u0301", "🤖", "👨‍👩‍👧", "<|im_end|>", "<|im_start|>",
         "'s", "123", "4567", "\r\n", "日本語", "\t", "\u00a0", "Question 1: ", "?!", "ﬁ"]


def _whole(tok: _Tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def _edits(enc: PrefixEncoder, tok: _Tok, doc: str, trials: int, seed: int) -> None:
    """Encode a base text, then a text that shares all but its last few hundred
    characters with it, and compare with a whole encoding of the second."""
    rng = random.Random(seed)
    for _ in range(trials):
        base = doc[:rng.randint(MIN_CHARS + 100, len(doc))]
        cut = rng.randint(max(0, len(base) - 300), len(base))
        text = base[:cut] + rng.choice(EDITS) * rng.randint(1, 3) \
            + doc[cut:cut + rng.randint(0, 400)]
        assert enc.encode(base) == _whole(tok, base)
        assert enc.encode(text) == _whole(tok, text), repr(text[cut - 40:cut + 40])


@pytest.fixture(scope="module")
def smol():
    return load_tokenizer(default_model_path())


def test_smollm2_questions_after_a_document_are_spliced(smol):
    doc = filler(6000, 7) + "\n"
    assert smol.encode(doc) == _whole(smol.tok, doc)
    before = smol.prefix.spliced
    for i in range(5):
        text = f"{doc}Question {i}: what does the document say about x{i}?\nAnswer:"
        assert smol.encode(text) == _whole(smol.tok, text)
    assert smol.prefix.spliced - before == 5
    # the same text again, and one shorter than the last
    assert smol.encode(text) == _whole(smol.tok, text)
    assert smol.encode(text[:-500]) == _whole(smol.tok, text[:-500])


def test_smollm2_random_edits(smol):
    doc = filler(3000, 1) + "\n日本語 🤖 naïve café 1234567 I'm he'll\n\n\t" + filler(1500, 2)
    _edits(smol.prefix, smol.tok, doc, 150, seed=3)
    assert smol.prefix.spliced > 100


def test_chat_history_is_spliced_turn_by_turn(smol):
    messages = [{"role": "system", "content": filler(2000, 4)}]
    for turn in range(4):
        messages.append({"role": "user", "content": f"Turn {turn}: summarize, please."})
        text = smol.apply_chat_template(messages)
        assert smol.encode(text) == _whole(smol.tok, text)
        messages.append({"role": "assistant", "content": filler(40, turn)})
    assert smol.prefix.spliced >= 3


def test_tiny_hf_tokenizer(tiny_hybrid_dir):
    tok = load_tokenizer(tiny_hybrid_dir)
    _edits(tok.prefix, tok.tok, filler(2500, 5) + " ünïcödé 99 " + filler(800, 6), 80, seed=4)
    assert tok.prefix.spliced > 50


def _variant(tiny_hybrid_dir, **changes) -> _Tok:
    spec = json.loads((tiny_hybrid_dir / "tokenizer.json").read_text())
    return _Tok.from_str(json.dumps({**spec, **changes}))


def test_a_tokenizer_that_prepends_to_every_text_is_never_spliced(tiny_hybrid_dir):
    """A normalizer that writes a mark before each text makes the encoding of a text's
    end differ from the same characters inside the text: the overlap check must
    refuse every splice (without it, each spliced result would carry a stray mark)."""
    tok = _variant(tiny_hybrid_dir, normalizer={"type": "Prepend", "prepend": "Z"})
    enc = PrefixEncoder(tok)
    _edits(enc, tok, filler(3000, 9), 30, seed=5)
    assert enc.spliced == 0 and enc.whole == 60


def test_a_prefix_space_tokenizer_splices_only_where_it_agrees(tiny_hybrid_dir):
    """ByteLevel(add_prefix_space=True) adds a space before a text that opens with none:
    a cut before ' word' still agrees, a cut before a word after a newline does not."""
    tok = _variant(tiny_hybrid_dir, pre_tokenizer={
        "type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
        "use_regex": True})
    enc = PrefixEncoder(tok)
    doc = "\n".join(filler(30, i).replace(" ", "\n") for i in range(120))
    _edits(enc, tok, doc, 30, seed=6)
    assert enc.spliced == 0


def test_short_texts_are_encoded_whole(smol):
    enc = PrefixEncoder(smol.tok)
    for text in ("", "Hello", "x" * (MIN_CHARS - 1)):
        assert enc.encode(text) == _whole(smol.tok, text)
    assert enc.recent == [] and enc.spliced == 0


def test_recent_texts_are_bounded(smol):
    enc = PrefixEncoder(smol.tok)
    for i in range(20):
        enc.encode(f"{i} " + filler(600, i))
    assert len(enc.recent) == 8


def test_common_prefix():
    for a, b in [("", ""), ("abc", "abd"), ("abc", "abc"), ("abc", "ab"), ("x" * 999 + "a",
                 "x" * 999 + "b"), ("日本語", "日本人"), ("a", "")]:
        want = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert _common_prefix(a, b) == want == _common_prefix(b, a)
