from __future__ import annotations

import pytest
import torch

from cache import codec
from cache.keys import block_keys, decode_tokens, encode_tokens, root_key, snapshot_key

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
          torch.uint8, torch.int8, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (3, 5, 7), (2, 0, 4), (1000,)])
def test_round_trip_bit_exact(dtype, shape):
    t = (torch.randn(shape) * 100).to(dtype)
    back = codec.decode(codec.encode({"x": t, "y": t.flatten()[:3]}, "fp"), "fp")
    assert back["x"].dtype == dtype and back["x"].shape == t.shape
    as_bytes = lambda x: x.reshape(-1).view(torch.uint8)  # noqa: E731  (NaN-safe, bit-exact)
    assert torch.equal(as_bytes(back["x"]), as_bytes(t))
    if dtype.is_floating_point:
        nan = torch.full((5,), float("nan"), dtype=dtype)
        assert torch.isnan(codec.decode(codec.encode({"n": nan}, "fp"), "fp")["n"]).all()


def test_bf16_shuffle_compresses():
    t = torch.randn(64, 1024).to(torch.bfloat16)
    assert len(codec.encode({"kv": t}, "fp")) < 0.8 * t.numel() * 2


def test_corruption_and_wrong_model_are_detected():
    blob = bytearray(codec.encode({"x": torch.randn(100)}, "model-a"))
    with pytest.raises(codec.CorruptValue, match="another model"):
        codec.decode(bytes(blob), "model-b")
    for pos in (3, 20, len(blob) // 2, len(blob) - 1):
        bad = bytearray(blob)
        bad[pos] ^= 0x40
        with pytest.raises(codec.CorruptValue):
            codec.decode(bytes(bad), "model-a")
    with pytest.raises(codec.CorruptValue):
        codec.decode(bytes(blob[:-5]), "model-a")


def test_keys_encoding_and_namespaces():
    assert encode_tokens([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    assert decode_tokens(encode_tokens([5, 2 ** 32 - 1])) == [5, 2 ** 32 - 1]
    with pytest.raises(ValueError):
        encode_tokens([-1])
    toks = list(range(40))
    r = root_key("fp", 8)
    k = block_keys(r, toks, 8)
    assert len(k) == 5 and len(set(k)) == 5
    assert block_keys(r, toks[:17], 8) == k[:2]                # a prefix's keys are a prefix
    assert block_keys(root_key("fp", 8, "tenant"), toks, 8)[0] != k[0]
    assert block_keys(root_key("fp2", 8), toks, 8)[0] != k[0]
    assert block_keys(root_key("fp", 16), toks, 8)[0] != k[0]
    assert block_keys(r, toks, 8, positions=[0] * 40)[0] != k[0]
    assert block_keys(r, toks, 8, extras=b"img")[0] != k[0]
    assert snapshot_key(k[0], [8, 9]) != snapshot_key(k[0], [8, 10])
    assert bytes.fromhex(k[0].hex()) == k[0]
