"""Tokenizer and chat template against transformers: SmolLM2's GGUF, each GGUF
pre-tokenizer, the tiny HF folders; streaming detokenization; template errors."""

from __future__ import annotations

import json

import gguf
import pytest
from jinja2.exceptions import TemplateError

from ckptd.model.default import default_model_path
from ckptd.model.text.chat import ChatTemplateError, render_chat
from ckptd.model.text.tokenizer import StreamDecoder, load_tokenizer

STRINGS = [
    "Hello world", "naïve café résumé Ångström", "東京タワーは高い。北京欢迎你", "🤖🎉 👨‍👩‍👧 🇫🇷",
    "e\u0301tude cafe\u0301 ﬁ \u200b zero-width", "def f(x):\n    return x**2  # ok\n\n\t\ttabs",
    "  many   spaces   ", "\n\n\n  \r\n x \n", "1234567 + 89 = 1234656?", "I'm he'll THEY'RE we'D",
    "<|im_start|>user\nhi<|im_end|>", "", " ", "a\u00a0b\u3000c",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "Capital of 日本?"},
     {"role": "assistant", "content": "Tokyo."},
     {"role": "user", "content": "And of France? 🇫🇷\n\nThanks"}],
    [{"role": "user", "content": ""}],
]


@pytest.fixture(scope="module")
def smol():
    return load_tokenizer(default_model_path())


@pytest.fixture(scope="module")
def smol_ref():
    from transformers import AutoTokenizer
    p = default_model_path()
    return AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)


def test_smollm2_ids_match_transformers(smol, smol_ref):
    rendered = [smol.apply_chat_template(c) for c in CHATS]
    for s in STRINGS + rendered:
        ids = smol.encode(s)
        assert ids == smol_ref.encode(s, add_special_tokens=False), repr(s)
        assert smol.decode(ids) == s
    # special tokens written in the text are single ids
    assert smol.encode("<|im_start|>user") == [1, *smol.encode("user")]


def test_smollm2_chat_template_matches_transformers(smol, smol_ref):
    for chat in CHATS:
        for gen in (True, False):
            assert smol.apply_chat_template(chat, gen) == smol_ref.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=gen)
    assert "You are a helpful AI assistant named SmolLM" in smol.apply_chat_template(CHATS[0])


def test_smollm2_specials(smol, smol_ref):
    assert smol.vocab_size == len(smol_ref) == 49152
    assert smol.bos_id == 1 and smol.bos_token == "<|im_start|>"
    assert smol.eos_token == "<|im_end|>" and 2 in smol.eos_ids
    assert smol.id_to_piece(2) == "<|im_end|>" and smol.id_to_piece(10_000_000) is None
    assert smol.id_to_piece(smol.encode(" the")[0]) == "Ġthe"
    # SmolLM2's GGUF says add_bos_token = false
    assert smol.encode("hi", add_special_tokens=True) == smol.encode("hi")
    assert smol.decode(smol.encode("<|im_start|>hi<|im_end|>"), skip_special_tokens=True) == "hi"


def _vocab_gguf(path, folder, pre: str, add_bos: bool = False, model: str = "gpt2") -> None:
    """A vocabulary-only GGUF holding the tiny folder's BPE, with tokenizer.ggml.pre = pre."""
    tj = json.loads((folder / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in dict(block_count=1, context_length=64, embedding_length=8,
                     feed_forward_length=8, **{"attention.head_count": 2}).items():
        w.add_uint32(f"llama.{k}", v)
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _pieces(tok, text: str) -> list[str]:
    return [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)]


@pytest.mark.parametrize("pre", ["gpt-2", "qwen2", "qwen35", "llama-bpe"])
def test_gguf_pre_tokenizers_match_transformers(tmp_path, tiny_llama_dir, pre):
    """Each pre-tokenizer cuts text into the pieces transformers' GGUF tokenizer cuts for
    that name, and the ids agree."""
    from transformers import AutoTokenizer
    _vocab_gguf(tmp_path / "v.gguf", tiny_llama_dir, pre)
    ours = load_tokenizer(tmp_path / "v.gguf")
    ref = AutoTokenizer.from_pretrained(tmp_path, gguf_file="v.gguf")
    for s in STRINGS:
        assert _pieces(ours.tok, s) == _pieces(ref.backend_tokenizer, s), (pre, s)
        assert ours.encode(s) == ref.encode(s, add_special_tokens=False), (pre, s)
        assert ours.decode(ours.encode(s)) == s


def test_pre_tokenizers_differ_where_they_should(tmp_path, tiny_llama_dir):
    toks = {}
    for pre in ("gpt-2", "smollm", "qwen2", "qwen35", "llama-bpe"):
        _vocab_gguf(tmp_path / f"{pre}.gguf", tiny_llama_dir, pre)
        toks[pre] = load_tokenizer(tmp_path / f"{pre}.gguf").tok
    # Qwen3.5 keeps a combining mark with its letters; Qwen2 cuts before it
    assert _pieces(toks["qwen35"], "e\u0301tude") == ["eÌģtude"]
    assert _pieces(toks["qwen2"], "e\u0301tude") == ["e", "Ìģtude"]
    # digits: llama-3 in runs of up to 3, Qwen one by one, GPT-2 whole runs;
    # SmolLM (llama.cpp's "smollm", HF's Digits(individual_digits)) one by one, before
    # anything else, so the space before them stands alone
    assert _pieces(toks["llama-bpe"], "x 12345") == ["x", "Ġ", "123", "45"]
    assert _pieces(toks["qwen2"], "x 12345") == ["x", "Ġ", "1", "2", "3", "4", "5"]
    assert _pieces(toks["gpt-2"], "x 12345") == ["x", "Ġ12345"]
    assert _pieces(toks["smollm"], "x 12345") == ["x", "Ġ", "1", "2", "3", "4", "5"]
    # and the ids show it: this vocabulary has a "Ġ100" token
    ids = {pre: load_tokenizer(tmp_path / f"{pre}.gguf").encode("10 100") for pre in toks}
    assert ids["smollm"] == ids["qwen2"] != ids["gpt-2"]
    assert len(ids["gpt-2"]) == 3 and len(ids["smollm"]) == 6


def test_gguf_add_bos(tmp_path, tiny_llama_dir):
    _vocab_gguf(tmp_path / "bos.gguf", tiny_llama_dir, "gpt-2", add_bos=True)
    tok = load_tokenizer(tmp_path / "bos.gguf")
    assert tok.encode("hi", add_special_tokens=True) == [0, *tok.encode("hi")]


def test_gguf_tokenizer_errors(tmp_path, tiny_llama_dir):
    _vocab_gguf(tmp_path / "odd.gguf", tiny_llama_dir, "no-such-pre")
    with pytest.raises(ValueError, match="unsupported GGUF pre-tokenizer 'no-such-pre'"):
        load_tokenizer(tmp_path / "odd.gguf")
    _vocab_gguf(tmp_path / "spm.gguf", tiny_llama_dir, "default", model="llama")
    with pytest.raises(ValueError, match="unsupported GGUF tokenizer 'llama'"):
        load_tokenizer(tmp_path / "spm.gguf")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a model folder or a .gguf"):
        load_tokenizer(tmp_path / "notes.txt")
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


def test_folder_tokenizer_matches_transformers(tiny_hybrid_dir):
    from transformers import AutoTokenizer
    ours, ref = load_tokenizer(tiny_hybrid_dir), AutoTokenizer.from_pretrained(tiny_hybrid_dir)
    for s in STRINGS:
        assert ours.encode(s) == ref.encode(s, add_special_tokens=False), s
    for chat in CHATS:
        assert ours.apply_chat_template(chat) == ref.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True)
    assert ours.eos_ids >= {ref.convert_tokens_to_ids("<|im_end|>")}
    assert ours.bos_token == ref.bos_token and ours.vocab_size == len(ref)


@pytest.mark.parametrize("text", ["東京タワー 🤖🎉 naïve", "plain ascii text, nothing odd",
                                  "👨‍👩‍👧" * 3])
def test_stream_decoder_never_splits_a_character(tiny_hybrid_dir, text):
    tok = load_tokenizer(tiny_hybrid_dir)
    ids = tok.encode(text)
    dec = StreamDecoder(tok)
    deltas = [dec.push(i) for i in ids]
    assert "".join(deltas) + dec.flush() == text
    assert not any("\ufffd" in d for d in deltas)
    if not text.isascii():  # the tiny vocabulary spells these characters byte by byte
        assert "" in deltas


def test_stream_decoder_flushes_a_cut_character(tiny_hybrid_dir):
    tok = load_tokenizer(tiny_hybrid_dir)
    ids = tok.encode("ok 東")
    dec = StreamDecoder(tok)
    text = "".join(dec.push(i) for i in ids[:-1])
    assert text == "ok " and dec.flush() == "\ufffd"


def test_stream_decoder_skips_special_tokens(smol):
    dec = StreamDecoder(smol)
    out = "".join(dec.push(i) for i in smol.encode("Hi<|im_end|> there")) + dec.flush()
    assert out == "Hi there"


def test_chat_template_helpers_and_errors():
    t = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
         "{{ bos_token }}{% for m in messages %}{{ m | tojson }}{% endfor %}"
         "{{ strftime_now('%Y') | length }}{% for i in range(5) %}{% if i == 2 %}{% break %}"
         "{% endif %}{{ i }}{% endfor %}")
    out = render_chat(t, [{"role": "user", "content": "東京"}], bos_token="<s>")
    assert out == '<s>{"role": "user", "content": "東京"}401'
    with pytest.raises(ChatTemplateError, match="user first") as e:
        render_chat(t, [{"role": "system", "content": "x"}])
    assert isinstance(e.value, ValueError) and isinstance(e.value, TemplateError)
    with pytest.raises(ValueError, match="role"):
        render_chat(None, [{"content": "no role"}])
    with pytest.raises(ValueError, match="failed on these messages"):
        render_chat(None, [{"role": "user", "content": ["a", "list"]}])
    with pytest.raises(ValueError, match="does not compile"):
        render_chat("{% for %}", [])
    with pytest.raises(TemplateError):  # the sandbox refuses internals
        render_chat("{{ messages.__class__.__mro__ }}", [])
    # no template: ChatML
    assert render_chat(None, CHATS[0]).startswith("<|im_start|>user\nWhat is")


def test_chat_template_changes_its_own_lists_not_python_internals():
    # Kimi K2's templates queue call ids with list.append/pop (jinja2's sandbox and
    # llama.cpp's minja allow it); each render starts from fresh lists
    t = ("{% set q = namespace(ids=[]) %}{% for m in messages %}"
         "{% set _ = q.ids.append(m['role']) %}{% endfor %}{% set d = {} %}"
         "{% set _ = d.update({'n': q.ids | length}) %}{{ q.ids.pop(0) }}{{ d['n'] }}"
         "{% set _ = messages.append({'role': 'x'}) %}")
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert render_chat(t, msgs) == "user2" and render_chat(t, msgs) == "user2"
    assert len(msgs) == 2                       # the template changed its own copy
    for reach in ("messages.__class__", "raise_exception.__globals__",
                  "strftime_now.__code__", "cycler.__init__.__globals__",
                  "''.__class__.__mro__[1].__subclasses__()", "namespace.__init__",
                  "messages.append.__self__.__class__", "range.__call__.__self__"):
        try:        # an unsafe attribute is undefined: empty, and refused once used
            assert render_chat("{{ " + reach + " }}", msgs) == ""
        except TemplateError:
            pass
        with pytest.raises(TemplateError, match="unsafe"):
            render_chat("{{ " + reach + ".__name__ }}", msgs)


def test_chat_template_generation_blocks_render_their_body():
    # transformers' assistant-mask tag (LFM2.5, Laguna): these did not compile at all
    t = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}"
         "[{{ m['content'] }}]{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}"
         "{% endfor %}")
    assert render_chat(t, [{"role": "user", "content": "a"},
                           {"role": "assistant", "content": "b"}]) == "a[b]"
