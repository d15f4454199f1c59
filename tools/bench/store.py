"""Benchmark the cache store on real KV pages: ratio, and MB/s to compress, write and
restore, cold and warm, against reading the same logical bytes from a plain file.

    python -m ckptd.tools.bench.store [--tokens 1024] [--gb 1.0] [--block-size 16]
                                [--kv-dtype bfloat16|float32] [--synthetic]
                                [--dir DIR] [--json OUT]

Pages come from SmolLM2-135M (the embedded GGUF, run by transformers) over English
text, as the KV cache the daemon keeps: bf16 by default, fp32 (the CPU default)
with --kv-dtype float32 (the model runs in fp32 either way: bf16 matmuls are ~5x
slower on this CPU); --synthetic uses random values instead. They
are repeated along one long prompt (each repeat gets its own tokens, so its own
keys) until --gb of logical bytes. Cold figures drop the page cache first (root).
MB/s are of logical (uncompressed) bytes throughout.
"""

from __future__ import annotations

import argparse
import json
import os
import pydoc
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from ckptd.cache import codec
from ckptd.cache.store.store import CacheStore
from ckptd.model.default import FILENAME, default_model_path
from ckptd.model.spec import AttentionSpec, StateSpec


def english_text(min_chars: int) -> str:
    """Docstrings of the standard library: plain English prose, always at hand."""
    parts, n = [], 0
    for name in ("argparse", "collections", "json", "logging", "pathlib", "subprocess",
                 "threading", "unittest", "email", "http.client", "socket", "typing"):
        doc = pydoc.render_doc(__import__(name, fromlist=["_"]), renderer=pydoc.plaintext)
        parts.append(doc)
        n += len(doc)
        if n >= min_chars:
            break
    return "\n".join(parts)


def smollm2_pages(n_tokens: int, B: int,
                  dtype: torch.dtype = torch.bfloat16) -> tuple[StateSpec, torch.Tensor]:
    """[n_pages, n_layers, 2, B, kv_heads, head_dim] KV of SmolLM2 over real text."""
    os.environ.setdefault("TQDM_DISABLE", "1")          # the GGUF loader's progress bars
    from transformers import AutoModelForCausalLM, AutoTokenizer  # the peer: extra test

    folder = default_model_path().parent
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=FILENAME)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=FILENAME,
                                                 torch_dtype=torch.float32)
    ids = tok(english_text(6 * n_tokens), return_tensors="pt").input_ids[:, :n_tokens]
    n = ids.shape[1] // B * B
    with torch.no_grad():
        cache = model(ids[:, :n], use_cache=True).past_key_values
    k = torch.stack([layer.keys[0] for layer in cache.layers]).to(dtype)   # [L, Hkv, T, D]
    v = torch.stack([layer.values[0] for layer in cache.layers]).to(dtype)
    kv = torch.stack([k, v], 1).permute(0, 1, 3, 2, 4)               # [L, 2, T, Hkv, D]
    L, _, T, H, D = kv.shape
    pages = kv.reshape(L, 2, T // B, B, H, D).permute(2, 0, 1, 3, 4, 5).contiguous()
    return StateSpec(B, AttentionSpec(L, H, D, dtype), None), pages


def synthetic_pages(n_tokens: int, B: int,
                    dtype: torch.dtype = torch.bfloat16) -> tuple[StateSpec, torch.Tensor]:
    spec = StateSpec(B, AttentionSpec(30, 3, 64, dtype), None)
    g = torch.Generator().manual_seed(0)
    pages = torch.randn((n_tokens // B, *spec.kv_shape()), generator=g) * 2
    return spec, pages.to(dtype)


def drop_caches() -> bool:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def plain_file(path: Path, data: torch.Tensor, cold: bool) -> dict:
    """The limit: the same logical bytes written to and read back from one plain file."""
    raw = data.view(torch.uint8).reshape(-1).numpy()

    def write():
        with open(path, "wb") as f:
            f.write(memoryview(raw))
            f.flush()
            os.fsync(f.fileno())
    out = {"write_s": timed(write)}
    buf = bytearray(8 << 20)

    def read():
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    if cold and drop_caches():
        out["cold_read_s"] = timed(read)
    out["warm_read_s"] = min(timed(read) for _ in range(2))
    return out


def restore(path: Path, spec: StateSpec, tokens: list[int], threads: int) -> dict:
    """Seconds to restore the whole prompt from disk: cold (page cache dropped), warm."""
    s = CacheStore(path, spec, "bench", host_budget=0, read_threads=threads)
    try:
        plan = s.lookup(tokens)
        if plan.position != len(tokens):
            raise RuntimeError(f"the store restores {plan.position} of {len(tokens)} tokens")
        out = {}
        if drop_caches():
            out["cold_s"] = timed(lambda: s.load(plan))
        out["warm_s"] = min(timed(lambda: s.load(plan)) for _ in range(2))
        return out
    finally:
        s.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1024, help="tokens run through the model")
    ap.add_argument("--gb", type=float, default=1.0, help="logical GB to store and restore")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--kv-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--synthetic", action="store_true", help="random values, no model")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    B = args.block_size
    t0 = time.perf_counter()
    dtype = getattr(torch, args.kv_dtype)
    spec, real = (synthetic_pages if args.synthetic else smollm2_pages)(args.tokens, B, dtype)
    model_s = time.perf_counter() - t0
    page_bytes = spec.page_bytes()
    n_pages = max(1, int(args.gb * 1e9 // page_bytes))
    pages = real.repeat((n_pages + len(real) - 1) // len(real), 1, 1, 1, 1, 1)[:n_pages]
    tokens = [i % 49152 for i in range(n_pages * B)]
    logical = n_pages * page_bytes
    MB = lambda s: round(logical / 1e6 / s, 1)  # noqa: E731
    res: dict = {"source": f"{'synthetic' if args.synthetic else 'smollm2-135m'} {args.kv_dtype}",
                 "pages": n_pages, "page_bytes": page_bytes, "logical_bytes": logical,
                 "cpus": os.cpu_count(), "model_s": round(model_s, 1)}

    one = [{"kv": p} for p in real[:64]]
    enc_s = timed(lambda: [codec.encode(t, "bench") for t in one])
    blobs = [codec.encode(t, "bench") for t in one]
    dec_s = timed(lambda: [codec.decode(b, "bench") for b in blobs])
    sample = len(one) * page_bytes
    res["ratio"] = round(sample / sum(map(len, blobs)), 3)
    res["compress_1t_MBps"] = round(sample / 1e6 / enc_s, 1)
    res["decompress_1t_MBps"] = round(sample / 1e6 / dec_s, 1)

    root = Path(tempfile.mkdtemp(prefix="ckptd-bench-", dir=args.dir))
    try:
        plain = plain_file(root / "plain.bin", pages, True)
        res["plain"] = {k.replace("_s", "_MBps"): MB(v) for k, v in plain.items()}
        (root / "plain.bin").unlink()
        store_dir = root / "store"
        s = CacheStore(store_dir, spec, "bench", disk_budget=4 * logical, host_budget=0,
                       queue_bytes=1 << 30, block_when_full=True, write_threads=args.threads)

        def write():
            for i in range(0, n_pages, 256):
                s.put_blocks(tokens, i, pages[i:i + 256])
            s.flush()
        res["write_MBps"] = MB(timed(write))
        st = s.stats()["disk"]
        res["stored_bytes"], res["store_ratio"] = st["stored_bytes"], st["compression_ratio"]
        res["file_bytes"] = st["file_bytes"]
        s.close()
        for threads in sorted({1, args.threads}):
            secs = restore(store_dir, spec, tokens, threads)
            res[f"restore_{threads}t"] = {k.replace("_s", "_MBps"): MB(v) for k, v in secs.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    best = res[f"restore_{args.threads}t"]
    if "cold_MBps" in best and "cold_read_MBps" in res["plain"]:
        res["cold_restore_vs_plain"] = round(best["cold_MBps"] / res["plain"]["cold_read_MBps"], 3)
    res["warm_restore_vs_plain"] = round(best["warm_MBps"] / res["plain"]["warm_read_MBps"], 3)
    print(json.dumps(res, indent=2))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
