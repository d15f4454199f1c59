"""A remote restore's transfer against a real S3 server: the ranges start when the
finder reads the state's head, the load takes them over (no GET asked twice), a
transfer no load takes is cancelled, a guessed head that is usable does not wait for
the LISTs; frames are decompressed straight into pages that lie end to end, and
packed from several threads at once."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch

from ckptd.cache.remote import frames
from ckptd.cache.remote.client import _read_into
from ckptd.cache.remote.ranges import Loc
from tests.cache.conftest import check_restored, fill
from tests.cache.test_remote import aws, remote  # noqa: F401 (aws: a fixture)
from tests.s3 import fresh_url

TOKENS = list(range(3, 3 + 4 * 20 + 2))          # 20 blocks of 4, and 2 tokens


def _reader(open_store, spec, tmp_path, **options):
    """A store with nothing local whose remote holds TOKENS (another store uploaded
    them)."""
    url = fresh_url()
    a = open_store(spec, path=tmp_path / "a", remote=remote(spec, url))
    fill(a, spec, TOKENS)
    assert a.flush(30) and a.remote.flush(30)
    return open_store(spec, path=tmp_path / "b", remote=remote(spec, url, **options))


def _plan(store, tokens=TOKENS):
    return store.lookup_remote(tokens, len(tokens), store.chain(tokens))


def _gets(store) -> int:
    return store.remote.client.stats()["requests"]["get"]


def test_the_ranges_start_at_the_head_and_the_load_takes_them_over(
        aws, open_store, spec, tmp_path):  # noqa: F811
    b = _reader(open_store, spec, tmp_path)
    plan = _plan(b)
    run = plan.remote.transfer
    assert run is not None and len(run.chunks) >= 2
    deadline = time.monotonic() + 30
    while run.last_byte == 0.0 or any(not f.done() for f in run.gets):
        assert time.monotonic() < deadline, "the transfer never finished"
        time.sleep(0.01)
    before = _gets(b)
    check_restored(spec, b.load(plan), TOKENS)
    assert _gets(b) == before                    # every byte came with the early ranges
    st = b.remote.fetcher.stats()
    assert st["early"] == 1 and st["unused"] == 0 and st["missing"] == 0
    assert not b.remote.fetcher.waiting


def test_a_transfer_no_load_takes_is_cancelled(aws, open_store, spec, tmp_path):  # noqa: F811
    b = _reader(open_store, spec, tmp_path)
    plan = _plan(b)
    run = plan.remote.transfer
    assert run in b.remote.fetcher.waiting
    b.remote.fetcher.cancel_waiting()
    assert run.cancelled and not b.remote.fetcher.waiting
    assert b.remote.fetcher.stats()["unused"] == 1
    # A later load of the same plan reads the values anew, exactly.
    check_restored(spec, b.load(plan), TOKENS)
    st = b.remote.fetcher.stats()
    assert st["early"] == 0 and st["missing"] == 0 and st["restores"] == 1


def test_a_usable_guessed_head_does_not_wait_for_the_lists(aws, open_store, spec,  # noqa: F811
                                                           tmp_path):
    """The state at the prompt's end is there: its head (asked for beside the LISTs)
    is the whole plan. With every LIST held up, the lookup still finds it (it would
    otherwise run out of its 3 s and find nothing)."""
    b = _reader(open_store, spec, tmp_path, lookup_timeout=3.0)   # a loaded CI box's GET
    release = threading.Event()
    real = b.remote.client.list

    def held(*args, **kw):
        release.wait(30)
        return real(*args, **kw)
    b.remote.client.list = held
    try:
        plan = _plan(b)
        assert plan.position == len(TOKENS) and not plan.remote.failed
        check_restored(spec, b.load(plan), TOKENS)
        # A prompt whose own end is not there needs the LISTs: held, the lookup gives up.
        assert _plan(b, TOKENS + [7, 7, 7]).remote.failed
    finally:
        release.set()


def test_a_started_transfer_that_lacks_a_location_is_replaced(aws, spec):  # noqa: F811
    tier = remote(spec, fresh_url(), range_bytes=1024)
    body = bytes(range(256)) * 16
    name = f"{tier.layout.root}test-started"
    assert tier.client.put(name, body)
    locs = [Loc(name, at, 512, len(body)) for at in range(0, len(body), 512)]
    early = tier.fetcher.start(locs[:3])
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as pool:
        got = tier.fetcher.fetch(locs, 30.0, lambda ready: [bytes(v) for _, v in ready],
                                 pool, started=early)
    assert got == [body[loc.offset:loc.offset + loc.length] for loc in locs]
    assert early.cancelled
    st = tier.fetcher.stats()
    assert st["early"] == 0 and st["unused"] == 1
    tier.close()


def _frame_of(pages: torch.Tensor) -> tuple[bytes, frames.Frame]:
    body, header = frames.pack(0, b"\0" * 16, [bytes([k]) * 16 for k in range(len(pages))],
                               [frames.page_bytes(p) for p in pages], "x",
                               pages[0].nbytes, pages.nbytes)
    return frames.frame_bodies(body, header)[0], header.frames[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_frame_goes_straight_into_pages_end_to_end_as_page_by_page(dtype):
    pages = torch.randn(6, 2, 3, 8).to(dtype)
    stored, frame = _frame_of(pages)
    pool = torch.zeros(10, 2, 3, 8, dtype=dtype)
    assert frames.addresses(list(pool[2:8])) == [pool[k].data_ptr() for k in range(2, 8)]
    frames.into_pages(stored, frame, pages[0].nbytes,
                      frames.run_view(pool[2], pages.nbytes))
    assert torch.equal(pool[2:8], pages) and not pool[:2].any() and not pool[8:].any()
    head_major = torch.zeros(2, 3, 6, 8, dtype=dtype)          # pages not end to end
    views = [head_major[:, :, k] for k in range(6)]
    assert frames.addresses(views) == [-1] * 6
    frames.into_pages(stored, frame, pages[0].nbytes, dict(enumerate(views)))
    assert all(torch.equal(v, p) for v, p in zip(views, pages))
    with pytest.raises(ValueError):
        frames.into_pages(stored, frame, pages[0].nbytes,
                          frames.run_view(pool[2], pages.nbytes - pages[0].nbytes))


_PACK_FROM_THREADS = """
import os, threading
from ckptd.cache.remote import frames
raw = [os.urandom(64 << 10) for _ in range(8)]              # incompressible: raw frames
def work():
    for _ in range(100):
        frames.pack(0, bytes(16), [bytes(16)] * 8, raw, "uint8 65536", 64 << 10, 512 << 10)
ts = [threading.Thread(target=work) for _ in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
print("packed")
"""


def test_segments_are_packed_from_several_threads_at_once():
    """The uploader packs segments on several threads: a zstd compressor shared between
    them crashed the process (a compressor is not safe to share)."""
    r = subprocess.run([sys.executable, "-c", _PACK_FROM_THREADS], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "packed" in r.stdout, (r.returncode, r.stderr[-2000:])


def test_a_body_without_readinto_is_read_into_the_buffer():
    class Body:                    # botocore's before 1.38 had only read()
        def __init__(self, data: bytes) -> None:
            self.data = data

        def read(self, n: int) -> bytes:
            out, self.data = self.data[:n], self.data[n:]
            return out
    buf = bytearray(10)
    into = _read_into(Body(b"ranged GET"))
    assert into(memoryview(buf)[:4]) == 4 and into(memoryview(buf)[4:]) == 6
    assert bytes(buf) == b"ranged GET" and into(memoryview(buf)) == 0
