"""Tokenizer + chat template, from an HF folder (tokenizer.json) or a GGUF's metadata.

Built on the `tokenizers` library; the chat template is rendered by jinja2 in a
sandbox, with the helpers Hugging Face templates expect.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, pre_tokenizers
from tokenizers import Tokenizer as _Tok
from tokenizers.models import BPE

# Pre-tokenizer splits of byte-level vocabularies, by GGUF `tokenizer.ggml.pre`.
# Others (gpt2, smollm, ...) use the GPT-2 split built into ByteLevel.
_QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLITS = {"qwen2": _QWEN_SPLIT, "llama3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT}
_CONTROL = 3  # GGUF token_type of special (control) tokens


class Tokenizer:
    def __init__(self, tok: _Tok, chat_template: str | None, bos: str | None, eos: str | None,
                 extra_eos: tuple[str, ...] = ()) -> None:
        self.tok = tok
        self.chat_template = chat_template
        self.bos_token, self.eos_token = bos, eos
        self.bos_id = tok.token_to_id(bos) if bos else None
        ids = {tok.token_to_id(t) for t in (eos, *extra_eos) if t}
        self.eos_ids = frozenset(i for i in ids if i is not None)
        self._template = None

    @classmethod
    def from_dir(cls, folder: str | Path) -> Tokenizer:
        folder = Path(folder)
        f = folder / "tokenizer.json"
        if not f.exists():
            raise FileNotFoundError(f"no tokenizer.json in {folder}")
        cfg_file = folder / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
        template = cfg.get("chat_template")
        tmpl_file = folder / "chat_template.jinja"
        if template is None and tmpl_file.exists():
            template = tmpl_file.read_text()
        return cls(_Tok.from_file(str(f)), template, _tok_str(cfg.get("bos_token")),
                   _tok_str(cfg.get("eos_token")), ("<|im_end|>", "<|endoftext|>"))

    @classmethod
    def from_gguf(cls, reader) -> Tokenizer:
        from model.gguf import field

        kind = field(reader, "tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"unsupported GGUF tokenizer {kind!r} "
                             "(supported: gpt2 byte-level BPE)")
        tokens = field(reader, "tokenizer.ggml.tokens")
        merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
        tok = _Tok(BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                       continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
        split = _SPLITS.get(field(reader, "tokenizer.ggml.pre"))
        if split:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        types = field(reader, "tokenizer.ggml.token_type") or []
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t, ty in zip(tokens, types) if ty == _CONTROL])
        bos = field(reader, "tokenizer.ggml.bos_token_id")
        eos = field(reader, "tokenizer.ggml.eos_token_id")
        return cls(tok, field(reader, "tokenizer.chat_template"),
                   None if bos is None else tokens[bos], None if eos is None else tokens[eos],
                   tuple(t for t in ("<|im_end|>", "<|endoftext|>") if t in tokens))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_piece(self, i: int) -> str | None:
        return self.tok.id_to_token(i)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self._template is None:
            from model.chat import compile_template
            self._template = compile_template(self.chat_template)
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token or "", eos_token=self.eos_token or "")


class StreamDecoder:
    """Turns a stream of token ids into text deltas that never split a UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, self.skip)
        if text.endswith("\ufffd"):        # an incomplete multi-byte character: wait
            return ""
        delta, self.text = text[len(self.text):], text
        return delta


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        from model.gguf import open_gguf
        return Tokenizer.from_gguf(open_gguf(path))
    return Tokenizer.from_dir(path)


def _tok_str(v) -> str | None:
    return v.get("content") if isinstance(v, dict) else v


