"""A restore's decoding alone: stored values back into KV pool pages, in CPU seconds.

    python -m ckptd.tools.bench.restore_decode [--blocks 6000] [--repeat 5]

The tiny hybrid's blocks (make_tiny qwen3_5_text: one attention layer, 2 KV heads of
16, 16-token blocks, fp32: 4 KiB a block), random KV, encoded as the store does, and
decoded into the pages of a head-major CPU pool (what a daemon's restore writes into):

    one by one   codec.decode of each value into a scratch tensor, copied into its page
                 (the restore path before cache/codec_batch.py)
    grouped      codec_batch.decode_many over all of them (the restore path now)

Times are this thread's CPU seconds (the best of --repeat), so that a loaded machine
changes them less than wall time; the pages are compared bit for bit.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from ckptd.cache import codec, codec_batch
from ckptd.kernels.paged_attention import layout

SHAPE = (1, 2, 16, 2, 16)


def _cpu(fn) -> float:
    """This thread's CPU seconds in fn()."""
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


def run(blocks: int, repeat: int) -> dict:
    g = torch.Generator().manual_seed(0)
    values = [torch.randn(SHAPE, generator=g) for _ in range(blocks)]
    keys = [i.to_bytes(32, "little") for i in range(blocks)]
    blobs = [codec.encode({"kv": t}, "fp", key=k) for t, k in zip(values, keys)]
    pool = layout.new_pool(blocks, SHAPE, torch.float32, torch.device("cpu"), head_major=True)
    pages = [pool[i] for i in range(blocks)]
    scratch = torch.empty(SHAPE)

    def one_by_one():
        for b, k, p in zip(blobs, keys, pages):
            p.copy_(codec.decode(b, "fp", {"kv": scratch}, k)["kv"])

    def grouped():
        codec_batch.decode_many([(b, k, {"kv": p}) for b, k, p in zip(blobs, keys, pages)],
                                "fp")
    nbytes = sum(len(b) for b in blobs)
    out = {"blocks": blocks, "stored_mb": round(nbytes / 1e6, 2)}
    for name, fn in (("one_by_one", one_by_one), ("grouped", grouped)):
        pool.zero_()
        s = min(_cpu(fn) for _ in range(repeat))
        assert all(torch.equal(p, t) for p, t in zip(pages, values)), name
        out[name] = {"cpu_s": round(s, 3), "us_per_value": round(s / blocks * 1e6, 1),
                     "mb_per_cpu_s": round(nbytes / 1e6 / s, 1)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptd.tools.bench.restore_decode")
    p.add_argument("--blocks", type=int, default=6000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    r = run(args.blocks, args.repeat)
    print(f"{r['blocks']} blocks, {r['stored_mb']} MB stored, load "
          f"{os.getloadavg()[0]:.1f}")
    for name in ("one_by_one", "grouped"):
        x = r[name]
        print(f"{name:11s} {x['cpu_s']:.3f} CPU s  {x['us_per_value']:6.1f} us/value  "
              f"{x['mb_per_cpu_s']:6.1f} MB per CPU s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
