"""Load time and peak RSS of a MoE checkpoint (issue 20).

    python -m ckptd.tools.bench.moe_load [--size small|medium] [--dtype float32] [--json F]

Writes a random Qwen3.5-MoE checkpoint in the Hub's layout (bf16, one tensor per
expert, sharded with an index, as released checkpoints are), with --gguf TYPE also its
GGUF by llama.cpp's converter, and, in a fresh process for each, loads it with
ckptd's loader: the seconds load_model takes, the
resident set before the load, its peak during the load (VmHWM) and after, against
the bytes the loaded model holds (parameters, fused and packed weights). The peak
is what a machine must have free to start the daemon.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from ckptd.model.arch.decoder import CausalLM
from ckptd.model.arch.layers import Matmul
from ckptd.model.config import ModelConfig
from ckptd.model.loader import load_model
from ckptd.tools.make_tiny import _to_hub_layout, _tokenizer, make_tiny, to_gguf

# (hidden, layers, experts, top-k, expert dim, vocab): "medium" is a scaled-down
# Qwen3.5-35B-A3B (hidden 2048, 40 layers, 256 experts of 512, top-8, vocab 248K)
SIZES = {"small": (256, 4, 16, 4, 128, 4096), "test": (512, 4, 32, 4, 256, 8192),
         "medium": (1024, 8, 64, 8, 256, 32768)}


def moe_config(size: str) -> dict:
    hidden, layers, experts, top_k, inter, vocab = SIZES[size]
    heads = hidden // 128 if hidden >= 1024 else 4
    return {
        "model_type": "qwen3_5_moe_text", "architectures": ["Qwen3_5MoeForCausalLM"],
        "vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 4),
        "head_dim": hidden // heads, "linear_key_head_dim": hidden // heads,
        "linear_value_head_dim": hidden // heads, "linear_num_key_heads": heads,
        "linear_num_value_heads": 2 * heads, "linear_conv_kernel_dim": 4,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
        "num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": inter,
        "shared_expert_intermediate_size": inter, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                            "partial_rotary_factor": 0.25},
        "tie_word_embeddings": False, "max_position_embeddings": 32768, "dtype": "bfloat16",
    }


def write_checkpoint(out: Path, cfg: dict, shard_bytes: int = 256 << 20) -> Path:
    """Random bf16 weights in the Hub's layout, in shards of about shard_bytes."""


    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    model_cfg = ModelConfig.from_hf(cfg)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in CausalLM(model_cfg).state_dict().items()}
    g = torch.Generator().manual_seed(0)
    index, shard, size, n = {}, {}, 0, 0

    def flush():
        nonlocal shard, size, n
        if shard:
            name = f"model-{n:05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            index.update({k: name for k in shard})
            shard, size, n = {}, 0, n + 1

    for name, shape in shapes.items():
        t = (torch.randn(shape, generator=g) / shape[-1] ** 0.5).to(torch.bfloat16)
        for k, v in _to_hub_layout(model_cfg, {name: t}).items():
            shard[k] = v
            size += v.numel() * 2
        if size >= shard_bytes:
            flush()
    flush()
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    return out


def model_bytes(model) -> int:
    """Bytes the loaded model holds: parameters, buffers and the fused / packed
    matmul weights (layers.py: Matmul), each storage once."""

    seen, total = set(), 0
    tensors = []
    for m in model.modules():
        tensors += list(m.parameters(recurse=False)) + list(m.buffers(recurse=False))
        for v in vars(m).values():
            if isinstance(v, Matmul):
                tensors += [v.weight, v.bias, v.packed]
    for t in tensors:
        if t is None:
            continue
        if t.is_mkldnn:
            key, n = ("mkldnn", id(t)), t.numel() * t.element_size()
        else:
            s = t.untyped_storage()
            key, n = s.data_ptr(), s.nbytes()
        if key not in seen:
            seen.add(key)
            total += n
    return total


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def child(path: str, dtype: str, warm: bool = False) -> dict:
    """Run in a fresh process: load, measure, print JSON. `warm`: load a make-tiny model
    first and reset the peak, so what once-per-process set-up costs (oneDNN, lazy
    imports) is not counted against a small checkpoint."""

    if warm:
        with tempfile.TemporaryDirectory() as d:
            load_model(make_tiny("qwen3_5_moe_text", d), getattr(torch, dtype))
        Path("/proc/self/clear_refs").write_text("5")      # VmHWM := VmRSS
    before = _status_kib("VmRSS") * 1024
    t0 = time.perf_counter()
    model = load_model(path, getattr(torch, dtype))
    seconds = time.perf_counter() - t0
    return {"path": path, "dtype": dtype, "load_s": round(seconds, 2), "rss_before": before,
            "peak_rss": _status_kib("VmHWM") * 1024, "rss_after": _status_kib("VmRSS") * 1024,
            "model_bytes": model_bytes(model)}


def measure(path: Path, dtype: str = "float32", warm: bool = False) -> dict:
    """child() in a fresh interpreter (so the peak is this load's alone)."""
    res = subprocess.run([sys.executable, "-m", "ckptd.tools.bench.moe_load", "--child",
                          str(path), "--dtype", dtype] + (["--warm"] if warm else []),
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"load failed: {res.stderr[-2000:]}")
    r = json.loads(res.stdout.strip().splitlines()[-1])
    r["growth_over_model"] = round((r["peak_rss"] - r["rss_before"]) / r["model_bytes"], 3)
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=list(SIZES), default="medium")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--dir", help="write (or reuse) the checkpoint here")
    p.add_argument("--gguf", choices=["f32", "bf16", "q8_0"],
                   help="also convert it to a GGUF of this type and load that")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--warm", action="store_true",
                   help="load a tiny model first and reset the peak (small checkpoints)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.dtype, args.warm)))
        return 0
    folder = Path(args.dir or tempfile.mkdtemp(prefix="ckptd-moe-load-")) / args.size
    if not (folder / "config.json").exists():
        t0 = time.perf_counter()
        write_checkpoint(folder, moe_config(args.size))
        print(f"wrote {folder} in {time.perf_counter() - t0:.0f} s")
    runs = [(folder, sum(f.stat().st_size for f in folder.glob("*.safetensors")))]
    if args.gguf:
        gguf = folder.with_name(f"{args.size}-{args.gguf}.gguf")
        if not gguf.exists():
            _tokenizer(folder)
            t0 = time.perf_counter()
            to_gguf(folder, gguf, args.gguf)
            print(f"converted to {gguf} in {time.perf_counter() - t0:.0f} s")
        runs.append((gguf, gguf.stat().st_size))
    results = []
    gib = 1 << 30
    for path, on_disk in runs:
        r = measure(path, args.dtype, args.warm)
        r["file_bytes"] = on_disk
        results.append(r)
        print(f"{path.name}: {on_disk / gib:.2f} GiB on disk -> {args.dtype}: "
              f"load {r['load_s']} s, model {r['model_bytes'] / gib:.2f} GiB, RSS before "
              f"{r['rss_before'] / gib:.2f}, peak {r['peak_rss'] / gib:.2f}, after "
              f"{r['rss_after'] / gib:.2f} GiB; (peak - before) / model = "
              f"{r['growth_over_model']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
