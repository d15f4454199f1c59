"""A `tokenizers` byte-level BPE built from a GGUF's tokenizer metadata.

GGUF stores the vocabulary (`tokenizer.ggml.tokens`, already in the byte-level
alphabet), the merges, each token's type, and the name of the pre-tokenizer
(`tokenizer.ggml.pre`). The name selects the splitting regexes; they are
llama.cpp's (src/llama-vocab.cpp), written here in the form the models' own
tokenizer.json files use. Each regex of a list splits the pieces the previous
one left, which is what llama.cpp does with its list and what a sequence of
isolated `Split`s does.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors
from tokenizers import Tokenizer as _Tok
from tokenizers.models import BPE

from ckptd.model.gguf.reader import field

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3.5 adds combining marks (\p{M}) to letters
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizer:
    splits: tuple[str, ...]   # regexes applied in order, each isolating its matches
    ignore_merges: bool = False  # a piece that is a whole vocabulary entry is taken as is


_DEFAULT = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
_GPT2_PRE = PreTokenizer((_GPT2,))
_DIGITS_PRE = PreTokenizer((r"\p{N}", _GPT2))
_LLAMA3_PRE = PreTokenizer((_LLAMA3,), ignore_merges=True)
_QWEN2_PRE = PreTokenizer((_QWEN2,))

# `tokenizer.ggml.pre` -> splitting, for the names llama.cpp gives these regexes.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _DEFAULT,
    **dict.fromkeys(("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "exaone4", "mellum",
                     "a.x-4.0"), _GPT2_PRE),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva-7b"), _DIGITS_PRE),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "lfm2"), _LLAMA3_PRE),
    **dict.fromkeys(("dbrx", "smaug-bpe"), PreTokenizer((_LLAMA3,))),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"), _QWEN2_PRE),
    "qwen35": PreTokenizer((_QWEN35,)),
}

# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class GGUFVocab:
    """What a Tokenizer needs from a GGUF, read once."""
    tok: _Tok
    tokens: list[str]
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    chat_template: str | None


def build_vocab(reader) -> GGUFVocab:
    """Byte-level BPE from a GGUFReader's metadata; ValueError for what it cannot build."""

    kind = field(reader, "tokenizer.ggml.model")
    if kind is None:
        raise ValueError("the GGUF holds no tokenizer (no tokenizer.ggml.model)")
    if kind != "gpt2":
        raise ValueError(f"unsupported GGUF tokenizer {kind!r} (supported: 'gpt2', "
                         "byte-level BPE)")
    tokens = field(reader, "tokenizer.ggml.tokens")
    merges = field(reader, "tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise ValueError("the GGUF tokenizer lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
    pre_name = field(reader, "tokenizer.ggml.pre") or "default"
    pre = PRE_TOKENIZERS.get(pre_name)
    if pre is None:
        raise ValueError(f"unsupported GGUF pre-tokenizer {pre_name!r} "
                         f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    types = field(reader, "tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(f"GGUF tokenizer: {len(types)} token types for {len(tokens)} tokens")

    tok = _Tok(BPE(vocab={t: i for i, t in enumerate(tokens)},
                   merges=[tuple(m.split(" ", 1)) for m in merges],
                   fuse_unk=False, ignore_merges=pre.ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>, ...) and user-defined ones (<think>, ...) are matched
    # whole in the text before any splitting, as llama.cpp does with parse_special.
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, ty in zip(tokens, types) if ty == CONTROL])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, ty in zip(tokens, types) if ty == USER_DEFINED])

    bos = _token_id(reader, "tokenizer.ggml.bos_token_id", len(tokens))
    eos = _token_id(reader, "tokenizer.ggml.eos_token_id", len(tokens))
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(field(reader, "tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        specials = [(tokens[i], i) for i, on in ((bos, add_bos), (eos, add_eos)) if on]
        head = f"{tokens[bos]}:0 " if add_bos else ""
        tail = f" {tokens[eos]}:0" if add_eos else ""
        tok.post_processor = processors.TemplateProcessing(
            single=f"{head}$A:0{tail}", pair=f"{head}$A:0{tail} $B:1", special_tokens=specials)
    return GGUFVocab(tok, tokens, bos, eos, add_bos, field(reader, "tokenizer.chat_template"))


def _token_id(reader, key: str, n_tokens: int) -> int | None:

    v = field(reader, key)
    if v is None:
        return None
    if not 0 <= int(v) < n_tokens:
        raise ValueError(f"GGUF {key} = {v} is outside the vocabulary (0..{n_tokens - 1})")
    return int(v)
