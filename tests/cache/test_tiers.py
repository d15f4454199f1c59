"""The tiers behind one interface: RAM LRU and LMDB, each bit-exact for every dtype."""

from __future__ import annotations

import inspect

import pytest
import torch

from ckptd.cache import codec
from ckptd.cache.entry import BLOCK, SNAPSHOT, EntryMeta
from ckptd.cache.keys import root_key
from ckptd.cache.tier import Tier
from ckptd.cache.tiers.disk import DiskFull, DiskTier
from ckptd.cache.tiers.host import HostTier, owned_rows, tensors_nbytes
from tests.cache.test_codec import DTYPES


def _meta(kind=BLOCK, parent=b"\xee" * 16, position=4, tokens=(1, 2, 3, 4)):
    return EntryMeta(kind, parent, position, list(tokens), "fp")


def _tensors(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"a": (torch.randn(3, 4, 5, generator=g) * 100).to(dtype),
            "b": (torch.randn(7, generator=g) * 100).to(dtype)}


def _same(x, y):
    return all(torch.equal(x[k].reshape(-1).view(torch.uint8), y[k].reshape(-1).view(torch.uint8))
               and x[k].dtype == y[k].dtype and x[k].shape == y[k].shape for k in x)


def test_host_round_trip_and_lru_within_budget():
    every = HostTier(1 << 20)
    for i, dt in enumerate(DTYPES):
        every.put(bytes([i]) * 16, _meta(), _tensors(dt, i))
    for i, dt in enumerate(DTYPES):
        assert _same(every.get(bytes([i]) * 16), _tensors(dt, i))
    one = tensors_nbytes(_tensors(torch.float32))
    host = HostTier(3 * one)
    keys = [bytes([i]) * 16 for i in range(6)]
    for i in range(3):
        assert host.put(keys[i], _meta(), _tensors(torch.float32, i))
    host.get(keys[0])                                   # 0 is now the most recent
    host.put(keys[3], _meta(), _tensors(torch.float32, 3))
    assert host.contains(keys[0]) and not host.contains(keys[1]) and host.bytes <= host.budget
    assert host.evictions == 1
    assert not host.put(b"x" * 16, _meta(), {"big": torch.zeros(4 * one)})   # over budget
    snap = _meta(SNAPSHOT, keys[0], 6, (5, 6))
    host.put(keys[5], snap, _tensors(torch.float32))
    assert [k for k, _ in host.children_after(keys[0])] == [keys[5]]
    host.delete(keys[5])
    assert host.children_after(keys[0]) == [] and not host.contains(keys[5])


def test_owned_rows_copies_runs_of_rows_once_each():
    t = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 2, 3)
    rows = [0, 1, 2, 5, 6, 7]
    got = owned_rows(t, rows, group_bytes=2 * 6 * 4)       # two rows a copy
    want = t[rows].clone()
    t.zero_()                                              # copies, not views of t
    assert torch.equal(torch.stack(got), want)
    bases = [g.untyped_storage().data_ptr() for g in got]
    # runs [0, 1] [2] [5, 6] [7]: a run never spans a gap or exceeds the bytes
    assert bases[0] == bases[1] != bases[2] != bases[3] == bases[4] != bases[5]
    assert len({*bases}) == 4 and all(g.is_contiguous() for g in got)
    assert owned_rows(t, []) == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_disk_round_trip_bit_exact(tmp_path, dtype):
    disk = DiskTier(tmp_path, 64 << 20)
    t = _tensors(dtype, 7)
    key = root_key("fp", 4)
    assert disk.put_many([(key, _meta(position=4), codec.encode(t, "fp"))]) == [key]
    got = disk.read_many([(key, BLOCK)], lambda k, buf: codec.decode(buf, "fp"))[0]
    assert _same(got, t)
    assert disk.contains(key) and disk.meta(key).tokens == [1, 2, 3, 4]
    disk.close()
    disk = DiskTier(tmp_path, 64 << 20, readonly=True)         # reopened: still there
    assert _same(codec.decode(disk.get(key), "fp"), t)
    disk.close()


def test_disk_batch_keeps_prefixes_closed(tmp_path):
    disk = DiskTier(tmp_path, 64 << 20)
    root, a, b, c = (bytes([i]) * 16 for i in range(4))
    blob = codec.encode({"x": torch.zeros(3)}, "fp")
    items = [(a, _meta(parent=root, position=4), blob),                  # block 0: root parent
             (b, _meta(parent=a, position=8), blob),                     # parent earlier in batch
             (c, _meta(parent=b"\x09" * 16, position=12), blob)]         # parent nowhere: skipped
    assert disk.put_many(items) == [a, b]
    assert disk.put_many(items[:2]) == []                                # already stored
    assert sorted(k for k, _ in disk.scan()) == [a, b]
    assert disk.delete_many([b, c]) == [b]
    assert disk.get(b) is None and disk.meta(b) is None
    disk.close()


def test_full_map_is_reported_and_nothing_half_written(tmp_path):
    disk = DiskTier(tmp_path, 1 << 20)      # raised to LMDB's working minimum, then full
    blob = bytes(range(256)) * 4096                                      # 1 MiB
    items = [(bytes([i]) * 16, _meta(parent=b"\xff" * 16, position=4), blob) for i in range(40)]
    with pytest.raises(DiskFull):
        disk.put_many(items)
    assert disk.scan() == []                                             # the batch is all or none
    disk.close()


def test_readonly_refuses_missing_store(tmp_path):
    with pytest.raises(FileNotFoundError):
        DiskTier(tmp_path / "nothing", 0, readonly=True)


@pytest.mark.parametrize("tier", [HostTier, DiskTier], ids=lambda t: t.name)
def test_every_tier_offers_the_one_interface(tier):
    """DESIGN's one tier interface (cache/tier.py: Tier): each tier has a name and every
    method of it, taking its parameters in the same order (more only with defaults)."""
    assert isinstance(tier.name, str)
    methods = [n for n, f in vars(Tier).items() if not n.startswith("_") and callable(f)]
    assert {"get", "put", "contains", "delete", "scan"} <= set(methods)
    for name in methods:
        want = list(inspect.signature(getattr(Tier, name)).parameters)
        got = list(inspect.signature(getattr(tier, name)).parameters.values())
        assert [p.name for p in got[:len(want)]] == want, f"{tier.__name__}.{name}"
        assert all(p.default is not p.empty for p in got[len(want):]), f"{tier.__name__}.{name}"
