"""Speculative decoding: decode tokens/s and accept rate with and without a draft.

    python -m ckptd.tools.bench.speculative [--max-tokens 64] [--n-max 4] \
        [--skip-layers 8] [--threads 2] [--json OUT]

The model is the embedded SmolLM2-135M (Q4_1, kept weights), greedy, the same chat
prompts each run. Drafts: none (the baseline); the model itself (every drafted token
kept: what verifying n_max + 1 tokens in one step costs against n_max + 1 decodes,
when the draft costs as much as the model); and its first --skip-layers layers under
its own head (a layer-skip draft: no extra weights, cheaper, kept less often). Every
run's tokens are compared with the baseline's.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import replace

import torch

from ckptd.cache.manager import CacheManager
from ckptd.daemon.engine import Engine
from ckptd.daemon.request import Finished, Request
from ckptd.daemon.speculation import SpecConfig, Speculation
from ckptd.model.default import default_model_path
from ckptd.model.loader import load
from ckptd.model.runner import Runner
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.speculative.drafter import Drafter
from ckptd.model.speculative.params import DraftLimits

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "Explain what a hash function is in two sentences.",
           "List three prime numbers and say why they are prime."]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--n-max", type=int, default=4, help="tokens drafted per step")
    p.add_argument("--skip-layers", type=int, default=8,
                   help="layers of the layer-skip draft (of SmolLM2's 30)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--json", help="write the rows here")


def first_layers(model, n: int):
    """A draft made of the model's first n layers, its final norm and head (shared
    tensors: no memory of its own but its state)."""
    draft = copy.copy(model)
    draft._modules = dict(model._modules)
    inner = copy.copy(model.model)
    inner._modules = dict(model.model._modules)
    inner.layers = torch.nn.ModuleList(list(model.model.layers)[:n])
    draft.model = inner
    cfg = model.config
    draft.config = replace(cfg, num_layers=n, layer_types=cfg.layer_types[:n],
                           mlp_types=cfg.mlp_types[:n])
    return draft


def run_one(model, tok, draft, n_max: int, max_tokens: int) -> dict:

    B, pages = 16, 256
    runner = Runner(model, pages, 1, B, max_batch_tokens=256 + n_max)
    cache = CacheManager(runner, runner.spec, pages, model.fingerprint)
    spec = None
    if draft is not None:
        spec = Speculation(Drafter(draft, pages, 1, B, 256), runner,
                           SpecConfig(DraftLimits(n_max, 0, 0.0)), frozenset(tok.eos_ids))
    eng = Engine(runner, cache, tok, max_running=1, step_tokens=256, spec=spec)
    tokens, decode_ms, predicted, drafted, kept = [], 0.0, 0, 0, 0
    for text in PROMPTS:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
        out, end = [], []
        eng.submit(Request(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                           lambda ev, out=out, end=end: (end if isinstance(ev, Finished)
                                                         else out).append(ev)))
        while not end:
            eng.step()
        st = end[0].stats
        tokens.append([ev.token for ev in out])
        decode_ms += st.predicted_ms
        predicted += st.predicted_n - 1           # the first came with the prompt
        drafted, kept = drafted + st.draft_n, kept + st.draft_n_accepted
    return {"tokens": tokens, "decode_tok_s": predicted / decode_ms * 1000,
            "draft_n": drafted, "accepted": kept,
            "accept_rate": kept / drafted if drafted else None}


def run(args: argparse.Namespace) -> int:

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load(default_model_path(), torch.float32, "cpu")
    drafts = {"none": None, "itself": model,
              f"first {args.skip_layers} layers": first_layers(model, args.skip_layers)}
    run_one(model, tok, None, args.n_max, 8)                 # warm-up
    rows, base = [], None
    for name, draft in drafts.items():
        t0 = time.perf_counter()
        r = run_one(model, tok, draft, args.n_max, args.max_tokens)
        r["wall_s"] = time.perf_counter() - t0
        base = base or r["tokens"]
        r.update(draft=name, same_tokens=r.pop("tokens") == base)
        rows.append(r)
        rate = "-" if r["accept_rate"] is None else f"{r['accept_rate']:.2f}"
        print(f"{name:>18}: decode {r['decode_tok_s']:6.1f} tok/s, drafted {r['draft_n']:4d}, "
              f"kept {r['accepted']:4d} ({rate}), same tokens: {r['same_tokens']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["same_tokens"] for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
