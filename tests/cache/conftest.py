"""Synthetic specs and states for the cache tests: the cache knows tensors, tokens and a
StateSpec only, so no model is needed. Fake state is a function of the tokens it
belongs to, so a test can tell whose state came back."""

from __future__ import annotations

import zlib

import lmdb
import pytest
import torch

from ckptd.cache.keys import encode_tokens
from ckptd.cache.snapshot import Snapshot
from ckptd.cache.store.store import CacheStore
from ckptd.model.spec import AttentionSpec, RecurrentSpec, StateSpec

B = 4
FP = "fp-test"


def hybrid_spec(dtype=torch.bfloat16) -> StateSpec:
    return StateSpec(B, AttentionSpec(2, 2, 8, dtype),
                     RecurrentSpec(3, 24, 4, 2, 8, 8, conv_dtype=dtype))


def attention_spec(dtype=torch.float16) -> StateSpec:
    return StateSpec(B, AttentionSpec(3, 2, 8, dtype), None)


def recurrent_spec(dtype=torch.bfloat16) -> StateSpec:
    """No attention at all (the pure Mamba2): blocks hold no KV, only the prefix chain."""
    return StateSpec(B, None, RecurrentSpec.ssm(2, 20, 4, 4, 8, 6, conv_dtype=dtype))


def _gen(tokens, salt: str = "") -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(encode_tokens(tokens) + salt.encode()))


def _token_kv(spec: StateSpec, tokens, start: int, stop: int) -> torch.Tensor:
    """KV of positions start..stop-1: [n_attn, 2, stop-start, kv_heads, head_dim]. Like a
    real model's, the KV at position j depends on tokens[:j+1] only (causal), so a page
    cut to a shared prefix is that prefix's KV."""
    a = spec.attention
    per = [torch.randn((a.n_layers, 2, a.kv_heads, a.head_dim), generator=_gen(tokens[:j + 1]))
           for j in range(start, stop)]
    if not per:
        return torch.zeros(spec.kv_shape(0), dtype=a.dtype)
    return torch.stack(per, 2).to(a.dtype)


def fake_pages(spec: StateSpec, tokens, first: int, n: int) -> torch.Tensor:
    """KV for blocks first .. first+n-1 of tokens: [n, *kv_shape()]."""
    B = spec.block_size
    if spec.attention is None:
        return torch.empty((n, *spec.kv_shape()), dtype=spec.kv_dtype)
    return torch.stack([_token_kv(spec, tokens, i * B, (i + 1) * B)
                        for i in range(first, first + n)])


def fake_snapshot(spec: StateSpec, tokens, logits: bool = False) -> Snapshot:
    g = _gen(tokens, "snapshot")
    out = {}
    P, B = len(tokens), spec.block_size
    if spec.attention is not None and P % B:
        out["kv"] = _token_kv(spec, tokens, P // B * B, P)
    if spec.recurrent is not None:
        out["conv"] = torch.randn(spec.conv_shape(), generator=g).to(spec.recurrent.conv_dtype)
        out["ssm"] = torch.randn(spec.ssm_shape(), generator=g)
    if logits or not out:
        out["logits"] = torch.randn(11, generator=g)
    return Snapshot(**out)


def fill(store: CacheStore, spec: StateSpec, tokens, salt=None) -> None:
    """What a prefill leaves behind: every full block, and a snapshot at the end."""
    n = len(tokens) // spec.block_size
    if n:
        store.put_blocks(tokens, 0, fake_pages(spec, tokens, 0, n), salt=salt)
    store.put_snapshot(tokens, fake_snapshot(spec, tokens), salt=salt)


def check_restored(spec: StateSpec, restored, tokens) -> None:
    """What came back is exactly the state of tokens[:position]."""
    P = restored.position
    n = P // spec.block_size
    if n:
        assert torch.equal(restored.pages, fake_pages(spec, tokens, 0, n))
    else:
        assert restored.pages is None
    if restored.snapshot is not None:
        want = fake_snapshot(spec, tokens[:P]).tensors()
        for k, v in restored.snapshot.tensors().items():
            if k != "logits":
                assert torch.equal(v, want[k]), k
    else:
        assert not spec.is_hybrid or P == 0


@pytest.fixture(params=["hybrid", "attention"])
def spec(request) -> StateSpec:
    return hybrid_spec() if request.param == "hybrid" else attention_spec()


@pytest.fixture
def open_store(tmp_path):
    """open_store(spec, **options) -> CacheStore under tmp_path, closed after the test."""
    opened = []

    def make(spec, path=None, fingerprint=FP, **options):
        s = CacheStore(path or tmp_path / "store", spec, fingerprint, **options)
        opened.append(s)
        return s
    yield make
    for s in opened:
        s.close()


def flip_value(path, sub_db: bytes, key: bytes) -> None:
    """Flip one bit in the middle of a stored value (its checksum then fails)."""
    env = lmdb.open(str(path), max_dbs=8)
    db = env.open_db(sub_db)
    with env.begin(write=True, db=db) as txn:
        bad = bytearray(txn.get(key))
        bad[len(bad) // 2] ^= 0x10
        txn.put(key, bytes(bad))
    env.close()
