"""Constrained decoding: a grammar (llama.cpp's GBNF) or a JSON schema, compiled once by
xgrammar and applied as a token mask before each draw.

xgrammar was measured against llguidance on SmolLM2's 49K vocabulary (docs/
BENCHMARKS.md, tools/bench/grammar.py): both build a mask in well under a decode
step; xgrammar was faster on GBNF and sets up a tokenizer in a sixth of the time,
and reads GBNF natively. A `Grammars` is made once per tokenizer; it caches compiled
grammars (LRU), so a schema sent with every request compiles once.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

GBNF, JSON_SCHEMA, ANY_JSON = "gbnf", "json_schema", "json"
STRUCTURAL_TAG = "structural_tag"       # xgrammar's structural tag (tool calls)
KINDS = (GBNF, JSON_SCHEMA, ANY_JSON, STRUCTURAL_TAG)
CACHE_SIZE = 64


class GrammarError(ValueError):
    """The grammar or schema does not compile."""


@dataclass(frozen=True)
class Constraint:
    """What a request constrains its output to; `source` is GBNF text or a JSON schema
    (as canonical JSON text), "" for any JSON value of `ANY_JSON`."""
    kind: str
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"constraint kind must be one of {', '.join(KINDS)}, "
                             f"got {self.kind!r}")


class Matcher:
    """One sequence's position in its grammar."""

    def __init__(self, compiled, vocab_size: int) -> None:
        import xgrammar as xgr  # imported on first use (see _get_compiler)
        self._xgr = xgr
        self.m = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.vocab_size = vocab_size

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [vocab] with every token the grammar forbids at -inf (a new tensor)."""
        out = logits.clone().unsqueeze(0)
        self.m.fill_next_token_bitmask(self.bitmask)
        self._xgr.apply_token_bitmask_inplace(out, self.bitmask)
        return out[0]

    def accept(self, token: int) -> bool:
        """Advance past `token`; False when the grammar does not allow it."""
        return bool(self.m.accept_token(token))

    @property
    def done(self) -> bool:
        """The grammar is complete: only an end token may follow."""
        return bool(self.m.is_terminated())


@dataclass(frozen=True)
class Compiled:
    """A compiled constraint; `matcher()` starts a sequence at its beginning."""
    constraint: Constraint
    grammar: object
    vocab_size: int

    def matcher(self) -> Matcher:
        return Matcher(self.grammar, self.vocab_size)


class Grammars:
    """Compiles constraints against one tokenizer's vocabulary; thread-safe."""

    def __init__(self, tokenizer, vocab_size: int) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.lock = threading.Lock()
        self._compiler = None
        self._cache: OrderedDict[Constraint, Compiled] = OrderedDict()

    def _get_compiler(self):
        # imported on first use: loading xgrammar takes seconds, and most requests and
        # processes (tools, tests) have no grammar
        import xgrammar as xgr
        if self._compiler is None:
            tok = self.tokenizer.tok
            vocab = [""] * self.vocab_size
            for piece, i in tok.get_vocab(with_added_tokens=True).items():
                if i < self.vocab_size:
                    vocab[i] = piece
            # The byte-level / byte-fallback spelling of the vocabulary, read from the
            # tokenizer's own description (xgrammar's detector for HF tokenizers).
            meta = xgr.TokenizerInfo._detect_metadata_from_hf(tok.to_str())
            info = xgr.TokenizerInfo(vocab, meta["vocab_type"], vocab_size=self.vocab_size,
                                     stop_token_ids=sorted(self.tokenizer.eos_ids),
                                     add_prefix_space=meta["add_prefix_space"])
            self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        return self._compiler

    def compile(self, c: Constraint) -> Compiled:
        """The compiled constraint (cached); GrammarError when it does not compile."""
        with self.lock:
            hit = self._cache.get(c)
            if hit is not None:
                self._cache.move_to_end(c)
                return hit
            compiler = self._get_compiler()
            try:
                if c.kind == GBNF:
                    g = compiler.compile_grammar(c.source)
                elif c.kind == JSON_SCHEMA:
                    g = compiler.compile_json_schema(c.source, any_whitespace=False)
                elif c.kind == STRUCTURAL_TAG:
                    g = compiler.compile_structural_tag(c.source)
                else:
                    g = compiler.compile_builtin_json_grammar()
            except Exception as e:  # xgrammar raises RuntimeError/ValueError of its own kinds
                raise GrammarError(_first_line(str(e))) from None
            out = Compiled(c, g, self.vocab_size)
            self._cache[c] = out
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return out


def schema_constraint(schema: object) -> Constraint:
    """A JSON schema (a dict, or True for any JSON) as a Constraint, keyed canonically."""
    if schema is True or schema == {}:
        return Constraint(ANY_JSON)
    return Constraint(JSON_SCHEMA, json.dumps(modern_schema(schema), sort_keys=True,
                                              separators=(",", ":")))


def modern_schema(schema: object) -> object:
    """Draft-7 tuple `items: [...]` as draft 2020-12's `prefixItems` (what the compiler
    reads), everywhere in the schema, and an object schema naming no properties as any
    object (llama.cpp's reading; the compiler's strict mode would allow only `{}`); the
    rest as is."""
    if isinstance(schema, list):
        return [modern_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: modern_schema(v) for k, v in schema.items()}
    if isinstance(out.get("items"), list) and "prefixItems" not in out:
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
    if out.get("type") == "object" and "properties" not in out and \
            "additionalProperties" not in out:
        out["additionalProperties"] = True
    return out


_LOCATION = re.compile(r"^\[[0-9:]+\]\s+\S+:\d+:\s*")


def _first_line(msg: str) -> str:
    lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
    line = _LOCATION.sub("", lines[0]) if lines else "invalid grammar"
    return line[:300]
