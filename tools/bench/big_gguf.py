"""Writes a qwen35moe GGUF with Qwen3.5-35B-A3B's layer shapes and random quantized
weights: a multi-GB file like the ones users download, to measure what ckptd's memory
does with it (tools/bench/big_rss.py). Nothing is converted or quantized: valid blocks
are written directly, one chunk at a time, so the writer holds a few MB, never the file.

    python -m ckptd.tools.bench.big_gguf OUT.gguf [--layers 8] [--mix Q4_K_M|Q8_0]
        [--pool-mb 64] [--vocab 248320] [--tokenizer SRC.gguf] [--experts 256]

Shapes: tools/bench/shapes.py's a3b_config (the defaults of transformers 5.24's
Qwen3_5MoeTextConfig, which are Qwen3.5-35B-A3B's: hidden 2048, 256 experts of 512, 8
routed, a shared expert of 512, Gated DeltaNet with 16 key / 32 value heads of 128 and
gated attention every 4th layer, 16 query / 2 KV heads of 256), with `layers` of the
real 40. The vocabulary and tokenizer are the embedded SmolLM2's (49,152 tokens, a real
tokenizer; the real model has 248,320, which would add ~0.5 GB of embedding and output).
Rope as the released model: theta 1e7, 64 rotated dims, mrope sections [11, 11, 10].

Layout: tensor names, order, shapes and metadata keys are those llama.cpp's own
converter writes for a tiny Qwen3_5MoeForCausalLM (tests/tools/test_big_gguf.py
compares them). Types follow llama-quantize's Q4_K_M choice for this architecture
(src/llama-quant.cpp, 256 experts): output Q6_K; attn_v / attn_qkv and ffn_down*
Q6_K on use_more_bits layers (the first and last eighth, every third between), else
Q4_K; other matrices Q4_K; norms, conv1d, ssm_a, dt bias and the router F32. Q8_0: every
matrix llama-quantize would quantize is Q8_0.

Block contents: random bytes for the quants and sub-block scales; the f16 super-block
scales are fixed so a weight has a standard deviation near 1/sqrt(fan_in), the scale
trained layers have, so activations stay finite through the layers. With --pool-mb,
each format's blocks are drawn once (a pool of that many MB) and every tensor is written
from it, starting at a random block and wrapping round: the file's bytes are the same
valid blocks, repeated, which no kernel's speed can tell from fresh ones, and the writer
runs at the speed of the disk (the full 40 layers in about a minute on a GPU machine, not
several: random bytes come at ~0.2-1 GB/s from one core).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from ckptd.model.default import default_model_path
from ckptd.tools.bench.shapes import a3b_config

# bytes per block / values per block (ggml-common.h)
_BLOCK = {"Q4_K": (144, 256), "Q6_K": (210, 256), "Q8_0": (34, 32), "F16": (2, 1),
          "F32": (4, 1)}
_CHUNK_BLOCKS = 1 << 16            # ~9 MB of Q4_K per write
_NP = {"F32": np.float32, "F16": np.float16}
FILE_TYPE = {"Q4_K_M": 15, "Q8_0": 7}     # llama_ftype
ARCH = "qwen35moe"


@dataclass(frozen=True)
class Spec:
    name: str
    shape: tuple[int, ...]          # row-major, the last dim is a row
    fmt: str

    @property
    def nbytes(self) -> int:
        tb, bs = _BLOCK[self.fmt]
        return int(np.prod(self.shape)) // bs * tb


def _more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's use_more_bits."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _type(name: str, shape: tuple[int, ...], n_layers: int, mix: str) -> str:
    """The type llama-quantize gives `name` for the mix (see the module docstring)."""
    quantized = len(shape) >= 2 and name.endswith("weight") and "_norm." not in name \
        and "ffn_gate_inp.weight" not in name and "ssm_conv1d" not in name
    if not quantized:
        return "F32"
    if mix == "Q8_0":   # llama.cpp's fallback for rows that are not whole blocks: F16
        return "Q8_0" if shape[-1] % 32 == 0 else "F16"
    if shape[-1] % 256:
        raise ValueError(f"{name}: rows of {shape[-1]} values are not whole Q4_K / Q6_K "
                         "blocks of 256 (llama.cpp would fall back to Q5_0 / Q8_0, which "
                         "this writer does not make): use --mix Q8_0")
    if name == "output.weight":
        return "Q6_K"
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if "attn_v." in name or "attn_qkv." in name or "ffn_down" in name:
        # attn_v's counter runs over the layers in file order, one such tensor a layer
        return "Q6_K" if _more_bits(layer, n_layers) else "Q4_K"
    return "Q4_K"


def layout(cfg: dict, vocab: int, mix: str = "Q4_K_M") -> list[Spec]:
    """Every tensor, in the converter's order."""
    H, n = cfg["hidden_size"], cfg["num_hidden_layers"]
    E, inter, Is = cfg["num_experts"], cfg["moe_intermediate_size"], \
        cfg["shared_expert_intermediate_size"]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], \
        cfg["linear_conv_kernel_dim"]
    nh, kvh, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    qkv = 2 * hk * dk + hv * dv
    shapes: list[tuple[str, tuple[int, ...]]] = [("output.weight", (vocab, H)),
                                                 ("token_embd.weight", (vocab, H))]
    moe = [("ffn_down_exps", (E, H, inter)), ("ffn_gate_exps", (E, inter, H)),
           ("ffn_up_exps", (E, inter, H)), ("ffn_gate_inp", (E, H)),
           ("ffn_down_shexp", (H, Is)), ("ffn_gate_shexp", (Is, H)),
           ("ffn_up_shexp", (Is, H)), ("ffn_gate_inp_shexp", (1, H))]
    for i, kind in enumerate(cfg["layer_types"]):
        if kind == "linear_attention":
            parts = [("attn_norm", (H,)), ("ssm_a", (hv,)), ("ssm_conv1d", (qkv, K)),
                     ("ssm_dt.bias", (hv,)), ("ssm_alpha", (hv, H)), ("ssm_beta", (hv, H)),
                     ("attn_qkv", (qkv, H)), ("attn_gate", (hv * dv, H)),
                     ("ssm_norm", (dv,)), ("ssm_out", (H, hv * dv)), *moe,
                     ("post_attention_norm", (H,))]
        else:
            parts = [("attn_norm", (H,)), *moe, ("post_attention_norm", (H,)),
                     ("attn_k_norm", (hd,)), ("attn_k", (kvh * hd, H)),
                     ("attn_output", (H, nh * hd)), ("attn_q_norm", (hd,)),
                     ("attn_q", (2 * nh * hd, H)), ("attn_v", (kvh * hd, H))]
        for part, shape in parts:
            full = f"blk.{i}.{part}" + ("" if part in ("ssm_a", "ssm_dt.bias") else ".weight")
            shapes.append((full, shape))
    shapes.append(("output_norm.weight", (H,)))
    return [Spec(name, shape, _type(name, shape, n, mix)) for name, shape in shapes]


def _f16(x: float) -> np.ndarray:
    return np.array([x], dtype=np.float16).view(np.uint8)


def random_blocks(fmt: str, n: int, rng: np.random.Generator, std: float) -> np.ndarray:
    """n valid blocks of `fmt` ([n, block bytes] uint8) whose weights have about `std`."""
    tb, _ = _BLOCK[fmt]
    b = np.frombuffer(rng.bytes(n * tb), dtype=np.uint8).reshape(n, tb).copy()
    if fmt == "Q4_K":        # d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
        # w = d*sc*q - dmin*m, sc, m in [0, 63], q in [0, 15]: E|d*sc*q| ~ d*236
        d = std / 236
        b[:, 0:2] = _f16(d)
        b[:, 2:4] = _f16(d * 7.5)           # centres w near 0 on average
    elif fmt == "Q6_K":      # 128 ql, 64 qh, 16 int8 scales, d: w = d*sc*(q - 32)
        sc = rng.integers(-32, 32, size=(n, 16), dtype=np.int8)
        b[:, 192:208] = sc.view(np.uint8)
        b[:, 208:210] = _f16(std / (18.5 * 18.5))
    elif fmt == "Q8_0":      # d, 32 int8: w = d*q
        b[:, 0:2] = _f16(std / 74)
    else:
        raise ValueError(f"no random blocks for {fmt}")
    return b


def _plain(spec: Spec, rng: np.random.Generator) -> np.ndarray:
    """F32 tensors: norms stored as llama.cpp stores them (weight + 1 -> 1), A = -exp(A_log)
    between -1 and -16, the rest small random."""
    shape = spec.shape
    if spec.name.endswith("norm.weight"):
        return np.ones(shape, np.float32)
    if spec.name.endswith("ssm_a"):
        return -np.exp(rng.uniform(0, np.log(16), shape)).astype(np.float32)
    if spec.name.endswith("ssm_dt.bias"):
        return rng.uniform(-1, 1, shape).astype(np.float32)
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def _tokenizer_fields(writer, source: Path, vocab: int = 0) -> int:
    """Copy the tokenizer.* metadata of `source` (a GGUF); returns its vocabulary size.
    `vocab` larger than the source's: the list is padded with unused tokens (type 5,
    as llama.cpp marks them) up to it, so the embedding and output have that many rows."""

    reader = gguf.GGUFReader(source)
    fields = {k: f for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    have = len(fields["tokenizer.ggml.tokens"].data) if "tokenizer.ggml.tokens" in fields else 0
    pad = max(0, vocab - have)
    for key, f in fields.items():
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = f.contents()
        if pad and key == "tokenizer.ggml.tokens":
            value = [*value, *(f"<|unused_{i}|>" for i in range(pad))]
        elif pad and key == "tokenizer.ggml.token_type":
            value = [*value, *([5] * pad)]
        elif pad and key == "tokenizer.ggml.scores":
            value = [*value, *([0.0] * pad)]
        writer.add_key_value(key, value, vtype, sub)
    return have + pad


def _metadata(w, cfg: dict, mix: str) -> None:
    a = ARCH
    rot = int(cfg["head_dim"] * cfg["rope_parameters"]["partial_rotary_factor"])
    w.add_string("general.type", "model")
    w.add_string("general.name", f"A3B-shaped random {cfg['num_hidden_layers']}L {mix}")
    for key, v in {"block_count": cfg["num_hidden_layers"],
                   "context_length": cfg["max_position_embeddings"],
                   "embedding_length": cfg["hidden_size"],
                   "attention.head_count": cfg["num_attention_heads"],
                   "attention.head_count_kv": cfg["num_key_value_heads"],
                   "expert_count": cfg["num_experts"],
                   "expert_used_count": cfg["num_experts_per_tok"],
                   "attention.key_length": cfg["head_dim"],
                   "attention.value_length": cfg["head_dim"],
                   "expert_feed_forward_length": cfg["moe_intermediate_size"],
                   "expert_shared_feed_forward_length":
                       cfg["shared_expert_intermediate_size"],
                   "ssm.conv_kernel": cfg["linear_conv_kernel_dim"],
                   "ssm.state_size": cfg["linear_key_head_dim"],
                   "ssm.group_count": cfg["linear_num_key_heads"],
                   "ssm.time_step_rank": cfg["linear_num_value_heads"],
                   "ssm.inner_size": cfg["linear_num_value_heads"]
                   * cfg["linear_value_head_dim"],
                   "full_attention_interval": cfg["layer_types"].index("full_attention") + 1
                   if "full_attention" in cfg["layer_types"] else 4,
                   "rope.dimension_count": rot}.items():
        w.add_uint32(f"{a}.{key}", v)
    w.add_array(f"{a}.rope.dimension_sections",
                [*cfg["rope_parameters"].get("mrope_section", [rot // 2, 0, 0]), 0])
    w.add_float32(f"{a}.rope.freq_base", cfg["rope_parameters"]["rope_theta"])
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_array(f"{a}.attention.recurrent_layers",
                [k == "linear_attention" for k in cfg["layer_types"]])
    w.add_uint32("general.file_type", FILE_TYPE[mix])
    w.add_uint32("general.quantization_version", 2)


def a3b_shaped(layers: int) -> dict:
    cfg = a3b_config(layers)
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "mrope_section": [11, 11, 10]}
    return cfg


class _Pool:
    """Blocks drawn once per format and weight scale (`nbytes` of each), handed out as
    contiguous runs from a random start, wrapping round."""

    def __init__(self, nbytes: int, rng: np.random.Generator) -> None:
        self.nbytes, self.rng = nbytes, rng
        self.pools: dict[tuple[str, float], np.ndarray] = {}

    def blocks(self, fmt: str, n: int, std: float) -> list[np.ndarray]:
        key = (fmt, std)
        if key not in self.pools:
            self.pools[key] = random_blocks(fmt, max(1, self.nbytes // _BLOCK[fmt][0]),
                                            self.rng, std)
        pool = self.pools[key]
        out, start = [], int(self.rng.integers(len(pool)))
        while n > 0:
            out.append(pool[start:start + n])
            n -= len(out[-1])
            start = 0
        return out


def write(out: Path, cfg: dict, mix: str = "Q4_K_M", seed: int = 0,
          tokenizer: Path | None = None, pool_bytes: int = 0, vocab: int = 0) -> list[Spec]:
    """Write the GGUF; returns its tensors. `tokenizer`: the GGUF whose tokenizer.* is
    copied (default: the embedded SmolLM2), padded with unused tokens up to `vocab`.
    `pool_bytes`: draw each format's blocks once (that many bytes) and write every
    tensor from them (0: every block fresh)."""


    if mix not in FILE_TYPE:
        raise ValueError(f"--mix must be one of {', '.join(FILE_TYPE)}, got {mix!r}")
    w = gguf.GGUFWriter(out, ARCH)
    _metadata(w, cfg, mix)
    vocab = _tokenizer_fields(w, tokenizer or default_model_path(), vocab)
    specs = layout(cfg, vocab, mix)
    for s in specs:
        raw = gguf.GGMLQuantizationType[s.fmt]
        w.add_tensor_info(s.name, s.shape, np.dtype(np.float32), s.nbytes, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    pool = _Pool(pool_bytes, rng) if pool_bytes else None
    fout = w.fout[0]
    for s in specs:
        w.write_padding(fout, fout.tell())
        if s.fmt in ("F32", "F16"):
            fout.write(_plain(s, rng).astype(_NP[s.fmt]).tobytes())
            continue
        tb, bs = _BLOCK[s.fmt]
        blocks = s.nbytes // tb
        std = 1 / np.sqrt(s.shape[-1])
        for start in range(0, blocks, _CHUNK_BLOCKS):
            n = min(_CHUNK_BLOCKS, blocks - start)
            runs = pool.blocks(s.fmt, n, std) if pool else [random_blocks(s.fmt, n, rng, std)]
            for run in runs:
                fout.write(memoryview(run).cast("B"))
    w.write_padding(fout, fout.tell())
    w.close()
    return specs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--mix", default="Q4_K_M", choices=list(FILE_TYPE))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--experts", type=int, default=256, help="experts per layer (the "
                   "A3B's 256; fewer for a quick check on a CPU), 8 of them routed at most")
    p.add_argument("--vocab", type=int, default=0, help="pad the tokenizer with unused "
                   "tokens to this many (the released model's: 248320)")
    p.add_argument("--tokenizer", type=Path, help="the GGUF whose tokenizer is copied "
                   "(default: the embedded SmolLM2's)")
    p.add_argument("--pool-mb", type=int, default=0, help="draw each format's blocks once, "
                   "this many MB, and write every tensor from them (0: all fresh)")
    args = p.parse_args(argv)
    if args.pool_mb < 0 or args.vocab < 0 or args.experts < 1:
        raise SystemExit("big_gguf: --pool-mb and --vocab must be >= 0, --experts >= 1")
    if args.tokenizer is not None and not args.tokenizer.is_file():
        raise SystemExit(f"big_gguf: --tokenizer: no file {args.tokenizer}")
    t0 = time.perf_counter()
    try:
        cfg = a3b_shaped(args.layers)
        cfg.update(num_experts=args.experts, num_experts_per_tok=min(8, args.experts))
        specs = write(args.out, cfg, args.mix, args.seed, args.tokenizer,
                      pool_bytes=args.pool_mb << 20, vocab=args.vocab)
    except ValueError as e:
        raise SystemExit(f"big_gguf: {e}") from None
    quant = sum(s.nbytes for s in specs if s.fmt not in ("F32", "F16"))
    print(f"wrote {args.out}: {args.out.stat().st_size / 2**30:.2f} GiB, {len(specs)} "
          f"tensors ({quant / 2**30:.2f} GiB quantized) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
