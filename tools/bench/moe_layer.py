"""The sparse MoE layer's speed, grouped by expert against the naive per-token loop
(issue 20).

    python -m ckptd.tools.bench.moe_layer [--shape qwen3.5-35b-a3b] [--json FILE]

One layer (router, experts, shared expert) of the given shape in fp32 on the CPU, at
decode (one token per sequence, batch 1 and 64) and prefill (--prefill tokens per
sequence, batch 1 and 64). `grouped` is what the engine runs (kernels/moe/naive.py:
tokens sorted by expert, one matmul pair per active expert); `per-token` loops over
each token's top-k experts (moe_per_token); `transformers` is transformers' own
Qwen3_5MoeSparseMoeBlock on the same weights, where it is installed. The per-token
loop costs the same per token at any batch, so past --loop-cap tokens it runs on the
first --loop-cap of them and its rate is reported as such.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ckptd.kernels.moe import naive
from ckptd.model.arch.moe import SparseMoE
from ckptd.model.config import ModelConfig

# hidden, experts, top-k, expert dim, shared expert dim
SHAPES = {"qwen3.5-35b-a3b": (2048, 256, 8, 512, 512),
          "qwen3-next-80b-a3b": (2048, 512, 10, 512, 512),
          "small": (256, 16, 4, 128, 128)}


@dataclass(frozen=True)
class Figure:
    case: str               # decode-b1, decode-b64, prefill-b1, prefill-b64
    impl: str
    tokens: int             # tokens in the call
    timed_tokens: int       # tokens the timed calls ran (< tokens: a capped loop)
    seconds: float          # best call
    tokens_per_s: float


def build(shape: str):

    hidden, experts, top_k, inter, shared = SHAPES[shape]
    cfg = ModelConfig.from_hf({
        "model_type": "qwen3_5_moe_text", "vocab_size": 16, "hidden_size": hidden,
        "num_hidden_layers": 1, "num_attention_heads": 1, "head_dim": 64,
        "layer_types": ["full_attention"], "num_experts": experts, "num_experts_per_tok": top_k,
        "moe_intermediate_size": inter, "shared_expert_intermediate_size": shared})
    moe = SparseMoE(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    moe.fuse()
    return cfg, moe.eval()


def _reference_block(cfg, moe):
    """transformers' Qwen3_5MoeSparseMoeBlock holding the same tensors, or None."""
    try:                                # the peer, where transformers has it (extra test)
        from transformers import Qwen3_5MoeTextConfig
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
            Qwen3_5MoeSparseMoeBlock,
        )
    except ImportError:
        return None
    hf_cfg = Qwen3_5MoeTextConfig(
        hidden_size=cfg.hidden_size, num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.num_experts_per_tok,
        moe_intermediate_size=cfg.moe_intermediate_size,
        shared_expert_intermediate_size=cfg.shared_expert_intermediate_size)
    with torch.device("meta"):
        block = Qwen3_5MoeSparseMoeBlock(hf_cfg)
    block.load_state_dict(moe.state_dict(), assign=True)
    return block.eval()


def _time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run_cases(shape: str, prefill: int, repeat: int, loop_cap: int) -> list[Figure]:

    cfg, moe = build(shape)
    ref = _reference_block(cfg, moe)
    gu, down = moe.experts.gate_up_proj, moe.experts.down_proj

    def layer(x, experts):
        ids, w = moe.route(x)
        return experts(x, ids, w, gu, down) + moe._shared(x)

    impls = {"grouped": lambda x: layer(x, naive.moe_experts),
             "per-token": lambda x: layer(x, naive.moe_per_token)}
    if ref is not None:
        impls["transformers"] = lambda x: ref(x[None])[0]
    cases = {"decode-b1": 1, "decode-b64": 64, "prefill-b1": prefill, "prefill-b64": 64 * prefill}
    g = torch.Generator().manual_seed(1)
    out = []
    with torch.inference_mode():
        x0 = torch.randn(8, cfg.hidden_size, generator=g)
        want = impls["grouped"](x0)
        for name, fn in impls.items():                # same layer: same output, and warm
            assert (fn(x0) - want).abs().max().item() < 1e-3, name
        for case, n in cases.items():
            x = torch.randn(n, cfg.hidden_size, generator=g)
            for name, fn in impls.items():
                m = min(n, loop_cap) if name == "per-token" else n
                reps = repeat if m <= 1024 else 1
                s = _time(lambda fn=fn, m=m, x=x: fn(x[:m]), reps)
                out.append(Figure(case, name, n, m, round(s, 4), round(m / s, 1)))
                print(f"{case:12} {name:12} {n:6} tokens ({m} timed): {s * 1e3:9.1f} ms "
                      f"{m / s:10.1f} tok/s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=list(SHAPES), default="qwen3.5-35b-a3b")
    p.add_argument("--prefill", type=int, default=512, help="prompt tokens per sequence")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--loop-cap", type=int, default=256)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    if min(args.prefill, args.repeat, args.loop_cap) <= 0:
        raise SystemExit("--prefill, --repeat and --loop-cap must be positive")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{args.shape}, fp32, {torch.get_num_threads()} torch thread(s)")
    figs = run_cases(args.shape, args.prefill, args.repeat, args.loop_cap)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(f) for f in figs], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
