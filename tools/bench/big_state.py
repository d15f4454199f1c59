"""The store at the users' scale: a 250K-token context of Qwen3.5-35B-A3B's state shapes.

    python -m ckptd.tools.bench.big_state [--tokens 250000] [--snapshot-budget 1.0]
                                          [--max-snapshots 16] [--dir DIR] [--json OUT]

The state of one sequence of that model: 10 gated-attention layers with 2 KV heads of
256 dims (bf16: ~20 KB of KV a token) and 30 Gated DeltaNet layers with 32 heads of
128 x 128 (fp32) plus their conv state (a snapshot: ~63 MB). A prefill of --tokens
is stored as the cache manager stores it, with random values (no model runs): every
block, interval snapshots where cache/checkpoints.py plans them within
--snapshot-budget (x the context's KV bytes), the end-of-prompt snapshot, thinned to
--max-snapshots. Then, with the OS page cache dropped (root), the whole context is
restored from disk and timed against a plain read of the same number of bytes
from a file. Reported: logical and stored bytes written, snapshots planned and
kept, restore and plain-read MB/s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from ckptd.cache.checkpoints import interval_stops, snapshot_budget
from ckptd.cache.snapshot import Snapshot
from ckptd.cache.store import CacheStore
from ckptd.model.spec import AttentionSpec, RecurrentSpec, StateSpec
from ckptd.tools.bench.store import drop_caches, plain_file

B = 16
INTERVAL = 1024


def qwen35_moe_spec() -> StateSpec:
    return StateSpec(B, AttentionSpec(10, 2, 256, torch.bfloat16),
                     RecurrentSpec(30, 8192, 4, 32, 128, 128, conv_dtype=torch.bfloat16))


def _snapshot(spec: StateSpec, gen: torch.Generator) -> Snapshot:
    return Snapshot(conv=torch.randn(spec.conv_shape(), generator=gen).to(torch.bfloat16),
                    ssm=torch.randn(spec.ssm_shape(), generator=gen))


def fill(store: CacheStore, spec: StateSpec, tokens: list[int], ratio: float,
         max_snapshots: int) -> dict:
    """Blocks and snapshots as a prefill of `tokens` leaves them; what was planned."""
    gen = torch.Generator().manual_seed(0)
    chain = store.chain(tokens)
    n_blocks = len(tokens) // B
    budget = min(snapshot_budget(len(tokens), spec, ratio), max_snapshots)
    stops = interval_stops(0, len(tokens), INTERVAL, budget)
    marks = sorted({*stops, n_blocks * B})
    done = 0
    for stop in marks:                    # blocks up to each stop, then its snapshot
        upto = stop // B
        for first in range(done, upto, 256):
            n = min(256, upto - first)
            pages = torch.randn((n, *spec.kv_shape()), generator=gen).to(torch.bfloat16)
            store.put_blocks(tokens, first, pages, chain=chain)
        done = upto
        role = "interval" if stop in stops else "end"
        store.put_snapshot(tokens[:stop], _snapshot(spec, gen), keep=max_snapshots,
                           chain=chain, role=role)
    store.flush()
    return {"snapshots_planned": len(stops) + 1, "snapshot_budget": budget}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptd.tools.bench.big_state",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=250_000)
    p.add_argument("--snapshot-budget", type=float, default=1.0)
    p.add_argument("--max-snapshots", type=int, default=16)
    p.add_argument("--dir", help="where the store goes (default: a temporary folder)")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--device", default="cpu", help="restore onto this device too (cuda: "
                   "the copy up from pinned buffers is part of the restore's time)")
    args = p.parse_args(argv)
    if args.tokens < B or args.snapshot_budget <= 0 or args.max_snapshots < 2:
        print("big_state: --tokens >= 16, --snapshot-budget > 0, --max-snapshots >= 2",
              file=sys.stderr)
        return 2
    spec = qwen35_moe_spec()
    tokens = torch.randint(3, 150_000, (args.tokens // B * B,),
                           generator=torch.Generator().manual_seed(1)).tolist()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "store"
        budget = 4 * args.tokens * spec.kv_bytes_per_token() + (8 << 30)
        store = CacheStore(path, spec, "bench-35b-a3b", disk_budget=budget, host_budget=0,
                           block_when_full=True)
        t0 = time.perf_counter()
        row = fill(store, spec, tokens, args.snapshot_budget, args.max_snapshots)
        row["write_s"] = round(time.perf_counter() - t0, 1)
        stats = store.stats()
        disk = stats["disk"]
        row.update(tokens=len(tokens), logical_bytes=disk["logical_bytes"],
                   stored_bytes=disk["stored_bytes"],
                   snapshots_kept=disk["by_kind"].get("snapshot", 0),
                   snapshots_thinned=stats["snapshots_thinned"])
        store.close()
        dropped = drop_caches()
        store = CacheStore(path, spec, "bench-35b-a3b", disk_budget=budget, host_budget=0)
        plan = store.lookup(tokens)
        t0 = time.perf_counter()
        restored = store.load(plan)
        if args.device != "cpu":
            device = torch.device(args.device)
            on_device = [t.to(device, non_blocking=True) for t in
                         (restored.pages, *restored.snapshot.tensors().values())]
            torch.cuda.synchronize(device)
            row["pinned"] = restored.pages.is_pinned()
            del on_device
        seconds = time.perf_counter() - t0
        assert restored.ok and restored.position == len(tokens), restored
        logical = restored.pages.numel() * 2 + sum(
            t.numel() * t.element_size() for t in restored.snapshot.tensors().values())
        store.close()
        del restored
        # the same logical bytes, written to a plain file and read back (cold)
        plain = plain_file(Path(tmp) / "plain.bin", torch.empty(logical, dtype=torch.uint8),
                           cold=dropped)
        plain_s = plain.get("cold_read_s", plain["warm_read_s"])
        row.update(device=args.device, restore_s=round(seconds, 2),
                   restore_mb_s=round(logical / seconds / 1e6),
                   plain_read_s=round(plain_s, 2), plain_read_mb_s=round(logical / plain_s / 1e6),
                   page_cache_dropped=dropped,
                   restore_vs_plain=round(plain_s / seconds, 2))
    print(json.dumps(row, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
