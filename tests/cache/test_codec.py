"""The value codec: bit-exact for every dtype, compresses 16-bit KV, detects damage."""

from __future__ import annotations

import struct

import pytest
import torch
import zstandard

from ckptd.cache import codec

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]
SHAPES = [(), (1,), (3, 5, 7), (2, 0, 4), (4099,)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)          # NaN-safe, bit-exact comparison


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_is_bit_exact(dtype, shape):
    g = torch.Generator().manual_seed(len(shape))
    t = (torch.randn(shape, generator=g) * 1000).to(dtype)
    if dtype.is_floating_point and t.numel() > 2:
        t.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -0.0], dtype=dtype)
    strided = t.transpose(0, -1) if t.dim() > 1 else t          # non-contiguous input
    back = codec.decode(codec.encode({"x": t, "y": strided}, "fp"), "fp")
    assert list(back) == ["x", "y"]
    for name, want in (("x", t), ("y", strided)):
        assert back[name].dtype == dtype and back[name].shape == want.shape
        assert torch.equal(_bits(back[name]), _bits(want.contiguous()))


def test_decode_takes_a_buffer_and_returns_writable_tensors():
    t = torch.randn(8, 16).to(torch.bfloat16)
    blob = codec.encode({"kv": t, "s": torch.randn(5)}, "fp")
    out = codec.decode(memoryview(bytearray(blob)), "fp")
    out["kv"].add_(1)                                   # owns its memory
    assert torch.equal(out["kv"], t + 1)


def test_16bit_planes_compress_and_incompressible_data_stays_raw():
    kv = (torch.randn(64, 1024) * 0.05).to(torch.bfloat16)
    header = codec.verify(codec.encode({"kv": kv}, "fp"), "fp")
    assert header["tensors"][0]["codec"] == "plane16"
    assert len(codec.encode({"kv": kv}, "fp")) < 0.8 * kv.numel() * 2
    noise = torch.randint(0, 2 ** 31 - 1, (4096,), dtype=torch.int32)
    assert codec.verify(codec.encode({"n": noise}, "fp"), "fp")["tensors"][0]["codec"] == "raw"
    zeros = torch.zeros(4096, dtype=torch.int64)
    assert codec.verify(codec.encode({"z": zeros}, "fp"), "fp")["tensors"][0]["codec"] == "zstd"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_planes_of_either_zstd_setting_decode(monkeypatch, dtype):
    # Planes packed by plain zstd level 1 (matches and all) read the same.
    kv = (torch.randn(32, 1024) * 0.05).to(dtype)
    kv[:4] = 0                                          # a long repeat, for the match finder
    new = codec.encode({"kv": kv}, "fp")
    monkeypatch.setattr(codec, "_PLANE_ZSTD", zstandard.ZstdCompressionParameters.from_level(1))
    old = codec.encode({"kv": kv}, "fp")
    assert old != new
    for blob in (old, new):
        assert torch.equal(_bits(codec.decode(blob, "fp")["kv"]), _bits(kv))


def test_plane32_packs_only_the_planes_that_shrink():
    kv = torch.randn(64, 1024) * 0.05
    head = codec.verify(codec.encode({"kv": kv}, "fp"), "fp")["tensors"][0]
    count = kv.numel()
    assert head["codec"] == "plane32" and head["parts"][:3] == [count] * 3   # mantissa: raw
    assert head["parts"][3] < 0.5 * count                                  # sign, exponent
    zeros = codec.verify(codec.encode({"z": torch.zeros(4096)}, "fp"), "fp")["tensors"][0]
    assert zeros["codec"] == "plane32" and all(n < 100 for n in zeros["parts"])


def test_damaged_plane_layouts_are_refused():
    # Checksummed (so past verify) but inconsistent headers: never decoded into garbage.
    t32, t16 = torch.randn(300), torch.randn(300).to(torch.bfloat16)
    for t, edit in ((t32, lambda e: e.update(parts=e["parts"][:3])),       # a plane short
                    (t32, lambda e: e.update(dtype="bfloat16", shape=[600])),
                    (t16, lambda e: e.update(codec="plane32")),
                    (t32, lambda e: e["parts"].__setitem__(0, e["parts"][0] - 1))):
        blob = _rewrite_header(codec.encode({"x": t}, "fp"), edit)
        with pytest.raises(codec.CorruptValue):
            codec.decode(blob, "fp")


def _rewrite_header(blob: bytes, edit) -> bytes:
    import json

    import xxhash
    header = codec.read_header(blob)
    payload = blob[header.pop("payload"):-16]
    edit(header["tensors"][0])
    raw = json.dumps(header, separators=(",", ":")).encode()
    body = codec._PREFIX.pack(codec.MAGIC, codec.VERSION, len(raw)) + raw + payload
    return body + xxhash.xxh3_128_digest(body)


def test_every_flipped_byte_is_detected():
    blob = codec.encode({"x": torch.randn(50).half(), "y": torch.arange(9)}, "model-a")
    for pos in range(0, len(blob), 7):
        bad = bytearray(blob)
        bad[pos] ^= 0x20
        with pytest.raises(codec.CorruptValue):
            codec.decode(bytes(bad), "model-a")
    for cut in (0, 10, len(blob) - 1):
        with pytest.raises(codec.CorruptValue):
            codec.decode(blob[:cut], "model-a")


def test_other_model_and_other_format_are_refused():
    blob = codec.encode({"x": torch.randn(10)}, "model-a")
    with pytest.raises(codec.CorruptValue, match="model"):
        codec.decode(blob, "model-b")
    assert codec.decode(blob, None)["x"].shape == (10,)       # inspection: any model
    body = bytearray(blob[:-16])
    struct.pack_into("<H", body, 4, codec.VERSION + 1)        # a future format, checksummed
    import xxhash
    future = bytes(body) + xxhash.xxh3_128_digest(bytes(body))
    with pytest.raises(codec.CorruptValue, match="format version"):
        codec.decode(future, "model-a")


def test_unsupported_dtype_is_a_user_error():
    with pytest.raises(ValueError, match="dtype"):
        codec.encode({"c": torch.zeros(2, dtype=torch.complex64)}, "fp")


def test_decode_into_given_tensors():
    kv = torch.randn(2, 3, 4).to(torch.bfloat16)
    ssm = torch.randn(5)
    blob = codec.encode({"kv": kv, "ssm": ssm}, "fp")
    pages = torch.zeros(3, 2, 3, 4, dtype=torch.bfloat16)
    out = codec.decode(blob, "fp", into={"kv": pages[1]})
    assert out["kv"].data_ptr() == pages[1].data_ptr()            # filled in place
    assert torch.equal(pages[1], kv) and not pages[0].any() and not pages[2].any()
    assert torch.equal(out["ssm"], ssm)
    for wrong in (torch.zeros(2, 3, 4), torch.zeros(3, 2, 4, dtype=torch.bfloat16),
                  torch.zeros(4, 3, 2, dtype=torch.bfloat16).transpose(0, 2)):
        with pytest.raises(ValueError, match="output"):
            codec.decode(blob, "fp", into={"kv": wrong})


def test_a_cached_header_is_never_another_values():
    """Headers are parsed once per shape of header (cache): the key is still checked,
    and a caller changing what it got changes nothing for the next read."""
    t = torch.randn(2, 16, 8)
    a, b = codec.encode({"kv": t}, "fp", key=b"\x01" * 32), codec.encode({"kv": t}, "fp",
                                                                        key=b"\x02" * 32)
    assert codec.verify(a, "fp", b"\x01" * 32)["key"] == "01" * 32
    with pytest.raises(codec.CorruptValue, match="stored for key"):
        codec.verify(b, "fp", b"\x01" * 32)
    codec.read_header(b)["tensors"][0]["parts"][0] = 7
    assert codec.read_header(b)["tensors"][0]["parts"][0] == t.numel()
    assert torch.equal(codec.decode(b, "fp", key=b"\x02" * 32)["kv"], t)


def _pool_pages(n: int, dtype) -> list[torch.Tensor]:
    """Pages of a head-major CPU pool: strided views, as a restore decodes into."""
    from ckptd.kernels.paged_attention import layout
    pool = layout.new_pool(n + 1, (1, 2, 16, 2, 16), dtype, torch.device("cpu"), head_major=True)
    return [pool[i + 1] for i in range(n)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decoding_many_is_decoding_each(dtype):
    """codec_batch: small blocks decoded in groups into strided pool pages, bit-exact;
    what a group can't take (several tensors, all planes packed, a large tensor, no
    output) decoded alone; a bad value is None and its output is left alone."""
    from ckptd.cache import codec_batch
    g = torch.Generator().manual_seed(3)
    blocks = [(torch.randn((1, 2, 16, 2, 16), generator=g) * 10).to(dtype) for _ in range(40)]
    blocks[3].view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -0.0], dtype=dtype)
    blocks[4].zero_()                                    # every plane packs
    keys = [bytes([i]) * 32 for i in range(40)]
    blobs = [codec.encode({"kv": t}, "fp", key=k) for t, k in zip(blocks, keys)]
    pages = _pool_pages(40, dtype)
    for p in pages:
        p.fill_(5)
    bad = bytearray(blobs[7])
    bad[len(bad) // 2] ^= 1
    snap = {"conv": torch.randn(3, 4, generator=g), "ssm": torch.randn(70000, generator=g)}
    items = [(memoryview(b), k, {"kv": p}) for b, k, p in zip(blobs, keys, pages)]
    items[7] = (bytes(bad), keys[7], {"kv": pages[7]})
    items[9] = (blobs[9], keys[8], {"kv": pages[9]})        # read for another key
    items[11] = (None, keys[11], {"kv": pages[11]})         # not there
    items += [(codec.encode(snap, "fp"), None, None), (blobs[12], None, None)]
    got = codec_batch.decode_many(items, "fp")
    assert got[7] is None and got[9] is None and got[11] is None
    for i in (7, 9, 11):
        assert bool((pages[i] == 5).all())                  # never written
    for i, t in enumerate(blocks):
        if i not in (7, 9, 11):
            assert got[i]["kv"] is pages[i]
            assert torch.equal(_bits(pages[i].contiguous()), _bits(t))
    assert all(torch.equal(got[-2][n], snap[n]) for n in snap)
    assert torch.equal(_bits(got[-1]["kv"]), _bits(blocks[12]))
    assert codec_batch.decode_many(items[:2], "other-model") == [None, None]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_pages_encoded_together_are_the_bytes_encoded_alone(dtype):
    """codec_batch.encode_pages (a remote restore's write-through) writes what
    codec.encode writes, page by page: planes packed or not, any model name."""
    from ckptd.cache import codec_batch

    pages = (torch.randn(9, 2, 4, 3, 8) * 0.1).to(dtype)
    pages[3] = 0                                       # planes that pack to nothing
    pages[4] = torch.rand(2, 4, 3, 8).to(dtype) * 1e4  # and some that do not
    keys = [bytes([i]) * 16 for i in range(9)]
    want = [codec.encode({"kv": p}, 'fp-"q', key=k) for p, k in zip(pages, keys)]
    assert codec_batch.encode_pages(pages, 'fp-"q', keys) == want
    assert codec_batch.encode_pages(pages[[1, 5]], 'fp-"q', keys[:2]) == [
        codec.encode({"kv": pages[1]}, 'fp-"q', key=keys[0]),
        codec.encode({"kv": pages[5]}, 'fp-"q', key=keys[1])]
