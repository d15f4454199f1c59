"""Grammar engines for constrained decoding, side by side: the time to compile a grammar
and to build one token mask, xgrammar against llguidance, at a real vocabulary.

    python -m ckptd.tools.bench.grammar [--model M.gguf] [--tokens 64]

Each case compiles its grammar once, then walks `--tokens` steps: build the mask of
allowed tokens, pick the lowest allowed id that is not an end token (a fixed walk
both engines can follow), accept it. Printed per engine and case: compile ms, and the
mask build time per token (median and p90, microseconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass

import torch

from ckptd.model.default import default_model_path
from ckptd.model.text.tokenizer import load_tokenizer

CASES = {
    "gbnf a{5}": ("gbnf", 'root ::= "a"{5}'),
    "gbnf list": ("gbnf", 'root ::= "[" item ("," item)* "]"\n'
                          'item ::= [0-9]+ | "\\"" [a-z]* "\\""'),
    "json object": ("json", {"type": "object"}),
    "json schema": ("json", {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "age", "tags"]}),
}


@dataclass
class Result:
    engine: str
    case: str
    compile_ms: float
    mask_us_median: float
    mask_us_p90: float
    steps: int


def _walk(fill, accept, allowed_ids, ended, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        if ended():
            break
        t0 = time.perf_counter()
        mask = fill()
        times.append((time.perf_counter() - t0) * 1e6)
        ids = allowed_ids(mask)
        if not ids:
            break
        accept(ids[0])
    return times


def bench_xgrammar(tok, vocab_size: int, steps: int) -> list[Result]:
    import xgrammar as xgr  # each library is timed from its import on
    t0 = time.perf_counter()
    vocab = [tok.id_to_piece(i) or "" for i in range(vocab_size)]
    info = xgr.TokenizerInfo(vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=vocab_size,
                             stop_token_ids=sorted(tok.eos_ids))
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    print(f"xgrammar: tokenizer set-up {(time.perf_counter() - t0) * 1000:.0f} ms")
    stops = set(tok.eos_ids)
    out = []
    for name, (kind, g) in CASES.items():
        t0 = time.perf_counter()
        compiled = compiler.compile_grammar(g) if kind == "gbnf" else \
            compiler.compile_json_schema(json.dumps(g))
        compile_ms = (time.perf_counter() - t0) * 1000
        m = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, vocab_size)

        def fill(m=m, bitmask=bitmask):
            m.fill_next_token_bitmask(bitmask)
            return bitmask

        def allowed(mask):
            logits = torch.zeros(1, vocab_size)
            xgr.apply_token_bitmask_inplace(logits, mask)
            ok = (logits[0] == 0).nonzero().flatten().tolist()
            return [i for i in ok if i not in stops] or ok
        times = _walk(fill, m.accept_token, allowed, m.is_terminated, steps)
        out.append(_result("xgrammar", name, compile_ms, times))
    return out


def bench_llguidance(tok, vocab_size: int, steps: int) -> list[Result]:
    # optional, the peer measured where it is installed
    import llguidance
    import llguidance.torch as lt
    t0 = time.perf_counter()
    lltok = llguidance.LLTokenizer(tok.tok.to_str(), n_vocab=vocab_size,
                                   eos_token=sorted(tok.eos_ids))
    print(f"llguidance: tokenizer set-up {(time.perf_counter() - t0) * 1000:.0f} ms")
    stops = set(tok.eos_ids)
    out = []
    for name, (kind, g) in CASES.items():
        t0 = time.perf_counter()
        grammar = llguidance.grammar_from("gbnf" if kind == "gbnf" else "json_schema",
                                          g if kind == "gbnf" else json.dumps(g))
        m = llguidance.LLMatcher(lltok, grammar)
        if m.is_error():
            raise RuntimeError(m.get_error())
        compile_ms = (time.perf_counter() - t0) * 1000
        bitmask = lt.allocate_token_bitmask(1, vocab_size)

        def fill(m=m, bitmask=bitmask):
            lt.fill_next_token_bitmask(m, bitmask, 0)
            return bitmask

        def allowed(mask):
            logits = torch.zeros(1, vocab_size)
            lt.apply_token_bitmask_inplace(logits, mask)
            ok = (logits[0] == 0).nonzero().flatten().tolist()
            return [i for i in ok if i not in stops] or ok
        times = _walk(fill, m.consume_token, allowed, m.is_stopped, steps)
        out.append(_result("llguidance", name, compile_ms, times))
    return out


def _result(engine: str, case: str, compile_ms: float, times: list[float]) -> Result:
    times = sorted(times) or [0.0]
    return Result(engine, case, round(compile_ms, 2), round(statistics.median(times), 1),
                  round(times[int(0.9 * (len(times) - 1))], 1), len(times))


def main(argv: list[str] | None = None) -> int:

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a .gguf or HF folder (default: SmolLM2)")
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args(argv)
    tok = load_tokenizer(args.model or default_model_path())
    vocab_size = tok.vocab_size
    print(f"vocabulary: {vocab_size} tokens; {args.tokens} steps per case")
    rows = [r for bench in (bench_xgrammar, bench_llguidance)
            for r in bench(tok, vocab_size, args.tokens)]
    print(f"{'engine':<11} {'case':<12} {'compile ms':>10} {'mask us p50':>11} "
          f"{'p90':>8} {'steps':>5}")
    for r in rows:
        print(f"{r.engine:<11} {r.case:<12} {r.compile_ms:>10} {r.mask_us_median:>11} "
                  f"{r.mask_us_p90:>8} {r.steps:>5}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
