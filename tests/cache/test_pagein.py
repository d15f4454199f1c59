"""Paging in ahead of use: a hint that never changes data, and restores that use it
(pages of several 4 KiB memory pages, read back cold from disk) stay bit-exact."""

from __future__ import annotations

import mmap
import threading

import pytest
import torch

from ckptd.cache.store import reader
from ckptd.cache.store.store import CacheStore
from ckptd.cache.tiers import pagein
from ckptd.model.spec import AttentionSpec, StateSpec


def test_write_ready_keeps_contents_on_any_alignment():
    base = torch.randn(5 * mmap.PAGESIZE + 3)
    want = base.clone()
    for t in (base, base[1:], base[7:9000], base[:0], base[3:4]):
        pagein.write_ready(t)
    assert torch.equal(base, want)


def _resident_bytes() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * mmap.PAGESIZE


def test_pages_end_to_end_or_apart_are_faulted_in_and_keep_their_contents():
    """write_ready_pages over a restore's pool pages (addresses, -1 for a page it can't
    touch): fresh memory becomes resident, written memory keeps its bytes."""
    page = 64 << 10
    # memory of its own, never touched (torch.empty may reuse what the allocator has
    # already faulted in)
    fresh = mmap.mmap(-1, 256 * page)
    pool = torch.frombuffer(fresh, dtype=torch.uint8)
    pool[:page].fill_(7)
    at = [pool[k * page].data_ptr() for k in range(256)]
    before = _resident_bytes()
    pagein.write_ready_pages([at[k] for k in (*range(0, 128), *range(130, 256), 129)] + [-1],
                             page)
    assert _resident_bytes() - before > 200 * page               # 255 of 256 pages asked
    assert bool((pool[:page] == 7).all())
    pagein.write_ready_pages([-1, -1], page)
    pagein.write_ready_pages([], page)
    del pool, at
    fresh.close()


def test_read_hints_on_a_mapped_file_and_on_bytes(tmp_path):
    data = bytes(range(256)) * 100
    (tmp_path / "f").write_bytes(data)
    with open(tmp_path / "f", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        with memoryview(m) as whole:
            for buf in (whole, whole[5:7000], whole[:0]):
                pagein.willneed(buf)
                pagein.read_now(buf)
            del buf
        assert m[:] == data
    pagein.read_now(memoryview(data)[1:])
    pagein.willneed(memoryview(b""))


def _big_spec() -> StateSpec:
    # A page of 4 * 2 * 16 * 2 * 64 bf16 = 32 KiB: eight memory pages per value.
    return StateSpec(16, AttentionSpec(4, 2, 64, torch.bfloat16), None)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_cold_restore_of_large_pages_is_bit_exact(tmp_path, threads):
    spec = _big_spec()
    g = torch.Generator().manual_seed(threads)
    pages = (torch.randn((37, *spec.kv_shape()), generator=g) * 0.1).to(torch.bfloat16)
    tokens = list(range(1000, 1000 + 37 * 16))
    with CacheStore(tmp_path / "s", spec, "fp", host_budget=0) as s:
        s.put_blocks(tokens, 0, pages)
        s.flush()
    with CacheStore(tmp_path / "s", spec, "fp", host_budget=0, read_threads=threads) as s:
        plan = s.lookup(tokens)
        assert plan.position == len(tokens) and plan.tier == "disk"
        out = s.load(plan)
        assert out.ok
        assert torch.equal(out.pages.view(torch.uint16), pages.view(torch.uint16))


def test_read_ahead_stops_once_the_readers_are_done():
    asked = []
    done = threading.Event()
    reader._ahead(list(range(20)), asked.append, done)
    assert sum(asked, []) == list(range(20))
    asked.clear()
    done.set()
    reader._ahead(list(range(20)), asked.append, done)
    assert asked == []
