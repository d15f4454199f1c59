"""Tokenizer + chat template, from an HF folder (tokenizer.json) or a GGUF's metadata.

Built on the `tokenizers` library. Special tokens written in the text (the chat
template's `<|im_start|>`, ...) always encode to their ids, as in llama.cpp's
server and transformers. `encode(add_special_tokens=True)` adds what the model's
own post-processor adds (a BOS for llama-3, nothing for ChatML models). A long text
that starts like a recent one re-encodes only its end (`model/text/prefix_encode.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as _Tok

from ckptd.model.gguf.reader import open_gguf
from ckptd.model.gguf.vocab import build_vocab
from ckptd.model.text.chat import render_chat
from ckptd.model.text.prefix_encode import PrefixEncoder

# Fill-in-the-middle tokens (prefix, suffix, middle), as code models spell them, and the
# separator put before each other file given as context.
_FIM = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
        ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
        ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>",
         "<\uff5cfim\u2581end\uff5c>"))
_FILE_SEP = ("<|file_sep|>", "<file_sep>")
_FIM_REPO = ("<|repo_name|>", "<reponame>")
# End-of-turn tokens of chat models whose config names only the base eos.
_TURN_ENDS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


class Tokenizer:
    """A model's tokenizer: `tok` (tokenizers.Tokenizer), `chat_template` (jinja source or
    None for ChatML), `bos_id`, `eos_id` (the configured one), `eos_ids` (every id that
    ends a turn: the configured ones plus <|im_end|>-style end tokens in the vocabulary)."""

    def __init__(self, tok: _Tok, chat_template: str | None = None, bos_id: int | None = None,
                 eos_ids: tuple[int, ...] = (), add_bos: bool = False) -> None:
        self.tok = tok
        self.prefix = PrefixEncoder(tok)   # long texts re-encode only what is new
        self.chat_template = chat_template
        self.bos_id = bos_id
        self.add_bos = add_bos
        ends = {tok.token_to_id(t) for t in _TURN_ENDS}
        self.eos_ids = frozenset(i for i in (*eos_ids, *ends) if i is not None)
        self.eos_id = eos_ids[0] if eos_ids else (min(self.eos_ids) if self.eos_ids else None)

    @classmethod
    def from_dir(cls, folder: str | Path) -> Tokenizer:
        """tokenizer.json, plus tokenizer_config.json (specials, chat_template),
        chat_template.jinja and generation_config.json (eos ids) when present."""
        folder = Path(folder)
        f = folder / "tokenizer.json"
        if not f.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {folder}")
        try:
            tok = _Tok.from_file(str(f))
        except Exception as e:  # the Rust side raises a bare Exception on bad JSON
            raise ValueError(f"cannot read {f}: {e}") from None
        cfg = _read_json(folder / "tokenizer_config.json")
        template = _pick_template(cfg.get("chat_template"))
        if template is None and (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        bos = _token(tok, cfg.get("bos_token"))
        eos = [_token(tok, cfg.get("eos_token"))]
        gen_eos = _read_json(folder / "generation_config.json").get("eos_token_id")
        eos += gen_eos if isinstance(gen_eos, list) else [gen_eos]
        eos_ids = tuple(dict.fromkeys(int(i) for i in eos if i is not None))
        add_bos = bos is not None and bos in tok.encode("", add_special_tokens=True).ids
        return cls(tok, template, bos, eos_ids, add_bos)

    @classmethod
    def from_gguf(cls, reader_or_path) -> Tokenizer:
        """From a GGUF's tokenizer.ggml.* metadata: a GGUFReader or a path."""
        reader = open_gguf(reader_or_path) if isinstance(reader_or_path, (str, Path)) \
            else reader_or_path
        v = build_vocab(reader)
        return cls(v.tok, v.chat_template, v.bos_id, () if v.eos_id is None else (v.eos_id,),
                   v.add_bos)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    @property
    def fim(self) -> tuple[int, int, int] | None:
        """(prefix, suffix, middle) ids of the vocabulary's fill-in-the-middle tokens."""
        for names in _FIM:
            ids = tuple(self.tok.token_to_id(n) for n in names)
            if None not in ids:
                return ids
        return None

    @property
    def file_sep(self) -> int | None:
        return next((i for i in map(self.tok.token_to_id, _FILE_SEP) if i is not None), None)

    @property
    def fim_repo(self) -> int | None:
        """The repository-name token of repo-level fill-in-the-middle, when there is one."""
        return next((i for i in map(self.tok.token_to_id, _FIM_REPO) if i is not None), None)

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_id is None else self.tok.id_to_token(self.bos_id)

    @property
    def eos_token(self) -> str | None:
        return None if self.eos_id is None else self.tok.id_to_token(self.eos_id)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"encode needs a str, got {type(text).__name__}")
        if add_special_tokens:
            return self.tok.encode(text, add_special_tokens=True).ids
        return self.prefix.encode(text)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_piece(self, i: int) -> str | None:
        """The vocabulary entry of token i as stored (byte-level spelling, 'Ġthe'), or None."""
        return self.tok.id_to_token(i)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **variables) -> str:
        """The prompt text for `messages`; the template sees bos_token, eos_token and
        `variables` (tools, enable_thinking, ...). Raises ChatTemplateError (a ValueError)."""
        specials = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or ""}
        return render_chat(self.chat_template, messages, add_generation_prompt,
                           **{**specials, **variables})


class StreamDecoder:
    """Turns a stream of token ids into text deltas that never split a UTF-8 character.

    Each push decodes only a window: the last emitted chunk (as context, which
    decoders such as sentencepiece's leading-space rule need) plus the tokens not
    yet emitted, so a push costs O(1) in the length of the stream.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # window start: the first token of the last emitted chunk
        self.read = 0    # tokens before this have been emitted

    def push(self, token_id: int) -> str:
        """Add one token; returns the text it completes ('' while a character is partial)."""
        self.ids.append(int(token_id))
        return self._emit(final=False)

    def flush(self) -> str:
        """What is still pending at the end of the stream (a cut character as U+FFFD)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        before = self.tokenizer.decode(self.ids[self.prefix:self.read], self.skip)
        text = self.tokenizer.decode(self.ids[self.prefix:], self.skip)
        if len(text) <= len(before) or (text.endswith("\ufffd") and not final):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(before):]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """From a model folder or a .gguf file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer path does not exist: {path}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"not a model folder or a .gguf file: {path}")
        return Tokenizer.from_gguf(path)
    return Tokenizer.from_dir(path)


def _read_json(f: Path) -> dict:
    if not f.is_file():
        return {}
    try:
        d = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{f} is not valid JSON: {e}") from None
    return d if isinstance(d, dict) else {}


def _pick_template(v) -> str | None:
    """tokenizer_config's chat_template: a string, or a list of {name, template}."""
    if isinstance(v, list):
        named = {t.get("name"): t.get("template") for t in v if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return v if isinstance(v, str) else None


def _token(tok: _Tok, v) -> int | None:
    """The id of a special token given as a string or as {"content": ...}."""
    if isinstance(v, dict):
        v = v.get("content")
    return tok.token_to_id(v) if isinstance(v, str) else None
