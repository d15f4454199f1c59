"""The remote tier's layout (cache/remote/layout.py) against a real S3 server: prefixes
share segment objects, a growing chat puts only its new blocks, a long prefill's states
name its full cells, and ranged reads are planned in few requests."""

from __future__ import annotations

import pytest

from ckptd.cache.lookup import REMOTE
from ckptd.cache.remote.ranges import Loc, plan_ranges
from tests.cache.conftest import check_restored, fake_pages, fake_snapshot, fill
from tests.cache.test_remote import GRID, aws, names, remote  # noqa: F401 (aws: a fixture)
from tests.s3 import fresh_url

B = 4


def tokens(n_blocks: int, tail: int = 2, start: int = 3) -> list[int]:
    return list(range(start, start + B * n_blocks + tail))


def test_ranges_merge_neighbours_and_cut_at_values():
    locs = [Loc("a", 100, 10, 500), Loc("a", 110, 10, 500), Loc("b", 0, 50, 50),
            Loc("a", 300, 30, 500), Loc("a", 120, 10, 500)]
    got = plan_ranges(locs, 25)
    # a: 100-130 as two requests cut between values; 300-330 cut inside its one value
    assert [(c.name, c.start, c.end, sorted(c.values)) for c in got] == [
        ("a", 100, 120, [0, 1]), ("a", 120, 130, [4]), ("a", 300, 325, [3]),
        ("a", 325, 330, [3]), ("b", 0, 25, [2]), ("b", 25, 50, [2])]
    assert [(c.start, c.end) for c in plan_ranges(locs[:2], 1 << 20)] == [(100, 120)]
    assert plan_ranges([], 10) == []


def test_a_context_sharing_a_prefix_puts_only_its_new_segments(aws, open_store, spec,  # noqa: F811
                                                               tmp_path, s3_server):
    url = fresh_url()
    first = tokens(20)
    second = first[:B * 17] + list(range(900, 900 + B * 13 + 2))     # parts in block 17
    a = open_store(spec, path=tmp_path / "a", remote=remote(spec, url))
    fill(a, spec, first)
    assert a.flush(30) and a.remote.flush(30)
    before = dict(a.stats()["remote"]["uploads"])
    fill(a, spec, second)
    assert a.flush(30) and a.remote.flush(30)
    up = a.stats()["remote"]["uploads"]
    # Cells 0-1 (blocks 0-15) are the first context's objects: named, not put again.
    # New: cell 2 (16-23, on this chain from block 17) and 24-29, where it ends.
    assert up["segments"] - before["segments"] == 2 and up["states"] - before["states"] == 1
    new_bytes = up["segment_bytes"] - before["segment_bytes"]
    per_block = before["segment_bytes"] / 20
    assert 14 * per_block * 0.9 < new_bytes < 14 * per_block * 1.2       # 14 new blocks
    # A daemon that computed the same context itself finds every object there.
    c = open_store(spec, path=tmp_path / "c", remote=remote(spec, url))
    fill(c, spec, second)
    assert c.flush(30) and c.remote.flush(30)
    up = c.stats()["remote"]["uploads"]
    assert up["uploaded_bytes"] == 0 and up["exists"] == 5           # 4 segments, a state
    for t in (first, second):
        d = open_store(spec, path=tmp_path / f"d{len(t)}", remote=remote(spec, url))
        restored = d.load(d.lookup_remote(t, len(t), d.chain(t)))
        assert restored.ok and restored.position == len(t)
        check_restored(spec, restored, t)


def test_a_growing_chat_puts_only_its_new_blocks(aws, open_store, spec, tmp_path,  # noqa: F811
                                                 s3_server):
    url = fresh_url()
    turn1 = tokens(17, tail=1)                  # ends in cell 2 (blocks 16-23)
    turn2 = turn1 + list(range(700, 700 + B * 5 + 1))                # to block 22 and 2
    a = open_store(spec, path=tmp_path / "a", remote=remote(spec, url))
    fill(a, spec, turn1)
    assert a.flush(30) and a.remote.flush(30)
    fill(a, spec, turn2)
    assert a.flush(30) and a.remote.flush(30)
    chain = a.chain(turn2)
    k = chain.keys
    segs = [n for n in names(s3_server, url) if "/seg/" in n]
    assert all(n.endswith(".f") for n in segs)  # framed (cache/remote/frames.py)
    got = {tuple(n.removesuffix(".f").rsplit("/", 2)[-2:]) for n in segs}
    want = {(chain.root, k[7]), (k[7], k[15]),      # cells 0 and 1
            (k[15], k[16]), (k[16], k[21])}         # turn 1's block 16, turn 2's 17-21
    assert got == {(p.hex(), last.hex()) for p, last in want}
    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url))
    restored = b.load(b.lookup_remote(turn2, len(turn2), b.chain(turn2)))
    assert restored.ok and restored.position == len(turn2)
    check_restored(spec, restored, turn2)


def test_a_state_in_a_filling_cell_waits_for_the_cell(aws, open_store, spec, tmp_path,  # noqa: F811
                                                      s3_server):
    """An interval snapshot of a long prefill goes up with the cell it is in (naming
    that cell's segment), not as a segment of its own."""
    url = fresh_url()
    t = tokens(16, tail=0)
    a = open_store(spec, path=tmp_path / "a", remote=remote(spec, url, linger=5.0))
    chain = a.chain(t)
    a.put_blocks(t, 0, fake_pages(spec, t, 0, 6), chain=chain)
    a.put_snapshot(t[:B * 6 + 1], fake_snapshot(spec, t[:B * 6 + 1]), chain=chain,
                   role="interval")
    assert a.flush(30)
    a.put_blocks(t, 6, fake_pages(spec, t, 6, 10), chain=chain)
    a.put_snapshot(t, fake_snapshot(spec, t), chain=chain)
    assert a.flush(30) and a.remote.flush(30)
    up = a.stats()["remote"]["uploads"]
    assert (up["segments"], up["states"]) == (2, 2)      # the two cells, the two states
    for p in (B * 6 + 1, len(t)):
        b = open_store(spec, path=tmp_path / f"b{p}", remote=remote(spec, url))
        restored = b.load(b.lookup_remote(t[:p], p, b.chain(t[:p])))
        assert restored.ok and restored.position == p


@pytest.mark.parametrize("grid", [1, 3])
def test_any_grid_restores_exactly(aws, open_store, spec, tmp_path, grid):  # noqa: F811
    url = fresh_url()
    t = tokens(11, tail=3)
    a = open_store(spec, path=tmp_path / "a",
                   remote=remote(spec, url, segment_bytes=grid * spec.page_bytes()))
    fill(a, spec, t)
    assert a.flush(30) and a.remote.flush(30)
    assert a.stats()["remote"]["uploads"]["segments"] == -(-11 // grid)
    b = open_store(spec, path=tmp_path / "b",
                   remote=remote(spec, url, segment_bytes=grid * spec.page_bytes()))
    check_restored(spec, b.load(b.lookup_remote(t, len(t), b.chain(t))), t)


@pytest.mark.parametrize("part", [97, 1000])
def test_ranges_read_in_parts_restore_exactly(aws, open_store, spec, tmp_path,  # noqa: F811
                                              monkeypatch, part):
    """A range's body handed to the decoders in parts that cut values anywhere (97
    bytes: every value spans several parts): each is decoded only once all of it is in."""
    from ckptd.cache.remote import fetch

    monkeypatch.setattr(fetch, "_PART_BYTES", part)
    url = fresh_url()
    t = tokens(11, tail=3)
    a = open_store(spec, path=tmp_path / "a", remote=remote(spec, url))
    fill(a, spec, t)
    assert a.flush(30) and a.remote.flush(30)
    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url))
    check_restored(spec, b.load(b.lookup_remote(t, len(t), b.chain(t))), t)
    st = b.remote.fetcher.stats()
    assert st["missing"] == st["corrupt"] == 0 and st["objects"] > 0


def test_a_value_goes_to_its_decoder_only_once_all_its_bytes_are_in(aws, spec,  # noqa: F811
                                                                      monkeypatch):
    """The bytes each value has when the fetcher hands it over (copied right then: the
    decode itself may run later, when more has come in) are the whole value, with parts
    of 97 bytes cutting values anywhere and ranges cutting one value in two."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    from ckptd.cache.remote import fetch

    class AsHandedOver(ThreadPoolExecutor):
        def submit(self, fn, run, ready, *args):
            return super().submit(fn, run, [(i, bytes(v)) for i, v in ready], *args)

    monkeypatch.setattr(fetch, "_PART_BYTES", 97)
    rng = random.Random(5)
    lengths = [rng.randrange(20, 400) for _ in range(60)] + [3000]
    body = rng.randbytes(sum(lengths))
    tier = remote(spec, fresh_url(), range_bytes=1024)
    name = f"{tier.layout.root}test-parts"
    assert tier.client.put(name, body)
    locs, at = [], 0
    for n in lengths:
        locs.append(Loc(name, at, n, len(body)))
        at += n
    with AsHandedOver(2) as pool:
        got = tier.fetcher.fetch(locs, 30.0, lambda ready: [v for _, v in ready], pool)
    assert got == [body[loc.offset:loc.offset + loc.length] for loc in locs]
    tier.close()


def test_a_segment_put_again_with_other_bytes_is_not_misread(aws, open_store, spec,  # noqa: F811
                                                             tmp_path, s3_server):
    """A segment taken (gc) and put again by a daemon that frames it otherwise: same
    name, other offsets. A state written against the first is stale for it: its blocks
    there count as missing (the object stays: it is good), never misread."""
    from ckptd.cache.remote import frames
    from tests.s3 import BUCKET

    url = fresh_url()
    t = tokens(20)
    a = open_store(spec, path=tmp_path / "a", remote=remote(spec, url))
    fill(a, spec, t)
    assert a.flush(30) and a.remote.flush(30)
    chain = a.chain(t)
    name = a.remote.layout.segment(chain.keys[7], chain.keys[15])       # blocks 8-15
    s3 = s3_server.client()
    old = s3.get_object(Bucket=BUCKET, Key=name)["Body"].read()
    h = frames.read_header(old)
    bb = h.block_bytes
    raw = b"".join(frames.unpack(body, f, bb) for body, f in
                   zip(frames.frame_bodies(old, h), h.frames))
    # The same blocks in one frame: every frame's offset and size another.
    body, again = frames.pack(h.start, h.parent, list(h.keys),
                              frames.blocks_of(raw, len(h.keys), bb), h.tensor, bb, 8 * bb)
    assert again.frames != h.frames
    body += bytes(max(0, h.size - len(body)) + 100)      # longer: every range is in it
    s3.put_object(Bucket=BUCKET, Key=name, Body=body)
    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url))
    restored = b.load(b.lookup_remote(t, len(t), b.chain(t)))
    assert not restored.ok and restored.position == 8 * B and restored.dropped == 0
    fetch = b.stats()["remote"]["fetch"]
    assert fetch["corrupt"] == 0 and fetch["missing"] >= 8 // 2
    assert s3.head_object(Bucket=BUCKET, Key=name)["ContentLength"] == len(body)


def test_an_interval_state_goes_up_with_the_end_of_its_chain(aws, open_store, spec,  # noqa: F811
                                                             tmp_path):
    """A prefill's interval snapshot waits (its chain goes on); the end of the prompt
    takes it along: both name one segment, put once."""
    import time

    url = fresh_url()
    t = tokens(7, tail=0)
    a = open_store(spec, path=tmp_path / "a",
                   remote=remote(spec, url, linger=0.2, interval_linger=10.0))
    chain = a.chain(t)
    a.put_blocks(t, 0, fake_pages(spec, t, 0, 3), chain=chain)
    a.put_snapshot(t[:B * 3 + 1], fake_snapshot(spec, t[:B * 3 + 1]), chain=chain,
                   role="interval")
    a.put_blocks(t, 3, fake_pages(spec, t, 3, 4), chain=chain)
    a.put_snapshot(t, fake_snapshot(spec, t), chain=chain)
    assert a.flush(30)
    deadline = time.monotonic() + 5          # the interval one alone would wait 10 s
    while a.stats()["remote"]["uploads"]["states"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    up = a.stats()["remote"]["uploads"]
    assert (up["states"], up["segments"]) == (2, 1), up
    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url))
    p = B * 3 + 1
    check_restored(spec, b.load(b.lookup_remote(t[:p], p, b.chain(t[:p]))), t[:p])


def test_a_corrupt_segment_takes_every_state_of_its_cell_that_names_it(
        aws, open_store, spec, tmp_path, s3_server):  # noqa: F811
    """A reader deletes a corrupt segment and the state it read; another state of the
    same cell naming that segment (an interval snapshot below) goes too, rather than
    dangle until verify --drop (a recomputing daemon may cut its chain otherwise). A
    state of a lower cell, naming only good segments, stays and restores."""
    import time

    from tests.remote_damage import flip_block
    from tests.s3 import BUCKET

    url = fresh_url()
    t = tokens(20, tail=2)                       # cells 0, 1 and blocks 16-19 of 2
    a = open_store(spec, path=tmp_path / "a",
                   remote=remote(spec, url, linger=0.2, interval_linger=10.0))
    chain = a.chain(t)
    low, mid = B * 12 + 1, B * 18 + 1            # interval states in cells 1 and 2
    a.put_blocks(t, 0, fake_pages(spec, t, 0, 12), chain=chain)
    a.put_snapshot(t[:low], fake_snapshot(spec, t[:low]), chain=chain, role="interval")
    a.put_blocks(t, 12, fake_pages(spec, t, 12, 6), chain=chain)
    a.put_snapshot(t[:mid], fake_snapshot(spec, t[:mid]), chain=chain, role="interval")
    a.put_blocks(t, 18, fake_pages(spec, t, 18, 2), chain=chain)
    a.put_snapshot(t, fake_snapshot(spec, t), chain=chain)
    assert a.flush(30)
    deadline = time.monotonic() + 10
    while a.stats()["remote"]["uploads"]["states"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert a.remote.flush(30)
    k = chain.keys
    cell2 = f"/state/{k[15].hex()}/"
    assert len([n for n in names(s3_server, url) if cell2 in n]) == 2
    bad = a.remote.layout.segment(k[15], k[19])                          # blocks 16-19
    s3 = s3_server.client()
    body = bytearray(s3.get_object(Bucket=BUCKET, Key=bad)["Body"].read())
    assert flip_block(body, 1) == 0                  # block 17's frame: blocks 16-17
    s3.put_object(Bucket=BUCKET, Key=bad, Body=bytes(body))
    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url))
    restored = b.load(b.lookup_remote(t, len(t), b.chain(t)))
    assert not restored.ok and restored.dropped == 2
    left = [n for n in names(s3_server, url) if "/state/" in n]
    assert not [n for n in left if cell2 in n]
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=bad).get("KeyCount") == 0
    assert len(left) == 1 and f"/{low}-" in left[0]
    c = open_store(spec, path=tmp_path / "c", remote=remote(spec, url))
    check_restored(spec, c.load(c.lookup_remote(t[:low], low, c.chain(t[:low]))), t[:low])


@pytest.mark.parametrize("range_bytes", [300, 1 << 20])
def test_what_a_restore_writes_through_is_the_remote_s_bytes(aws, open_store, spec,  # noqa: F811
                                                             tmp_path, monkeypatch,
                                                             range_bytes):
    """A restore keeps what it read in LMDB: blocks cut from their frames (each an LMDB
    value of exactly the frame's page bytes, under its key), the snapshot as the
    remote's own bytes (views of the fetch's buffers), with parts of 97 bytes, and
    ranges of 300 (frames spanning ranges: joined in buffers of their own) or 1 MiB."""
    from ckptd.cache import codec
    from ckptd.cache.remote import fetch, frames

    monkeypatch.setattr(fetch, "_PART_BYTES", 97)
    url = fresh_url()
    t = tokens(11, tail=3)
    a = open_store(spec, path=tmp_path / "a", remote=remote(spec, url))
    fill(a, spec, t)
    assert a.flush(30) and a.remote.flush(30)
    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url,
                                                            range_bytes=range_bytes))
    plan = b.lookup_remote(t, len(t), b.chain(t))
    check_restored(spec, b.load(plan), t)
    assert b.reader.flush(30) and b.flush(30)
    found, pieces = plan.remote, plan.pieces()
    assert len(pieces) == 12 and {p.tier for p in pieces} == {REMOTE}
    objects: dict[str, bytes] = {}
    for p in pieces:
        loc = found.where[p.key]
        body = objects.setdefault(loc.name, b.remote.client.get(loc.name))
        stored = body[loc.offset:loc.offset + loc.length]
        if p.key not in found.framed:                    # the snapshot
            assert b.disk.get(p.key) == stored, p
            continue
        frame, j = found.framed[p.key]
        page = frames.unpack(stored, frame, found.block_bytes)[
            j * found.block_bytes:(j + 1) * found.block_bytes]
        value = b.disk.get(p.key)
        codec.verify(value, b.fp, p.key)
        assert bytes(frames.page_bytes(codec.decode(value, b.fp)["kv"])) == page, p
    assert sum(p.key in found.framed for p in pieces) == 11
    check_restored(spec, b.load(b.lookup(t)), t)


def test_a_state_of_the_old_layout_restores_by_its_values(aws, open_store, spec,  # noqa: F811
                                                          tmp_path, s3_server):
    """Objects of the layout before frames (segments of LMDB values, names without
    ".f"), put as its code put them, restore exactly, value by value, and a restore
    that finds both kinds at one position takes the framed one."""
    from ckptd.cache.entry import SNAPSHOT
    from ckptd.cache.remote import segment, state
    from ckptd.cache.remote.layout import framed
    from ckptd.cache.remote.state import SegmentRef, StateHead

    url = fresh_url()
    t = tokens(20)
    a = open_store(spec, path=tmp_path / "a")            # no remote: LMDB only
    fill(a, spec, t)
    assert a.flush(30)
    chain = a.chain(t)
    k = chain.keys
    tier = remote(spec, url)
    layout, client = tier.layout, tier.client
    refs = []
    for lo, hi in [(0, 8), (8, 16), (16, 20)]:
        parent = k[lo - 1] if lo else chain.root
        items = [(key, a.disk.get(key)) for key in k[lo:hi]]
        body = segment.pack(lo, parent, items)
        name = layout.segment(parent, k[hi - 1], framed=False)
        assert client.put(name, body)
        refs.append(SegmentRef(name, lo, hi - lo, len(body), tuple(len(v) for _, v in items)))
    snap = a.lookup(t).snapshot
    m = a.catalog.index.get(snap.key)
    assert m.kind == SNAPSHOT
    head = StateHead(snap.key, m.parent, m.position, m.tokens, m.role, m.plain, a.fp,
                     m.logical_bytes, spec.page_bytes(), refs)
    old = layout.state(k[15], m.position, snap.key, framed=False)
    assert client.put(old, state.pack(head, a.disk.get(snap.key), layout.relative))
    tier.close()

    b = open_store(spec, path=tmp_path / "b", remote=remote(spec, url))
    plan = b.lookup_remote(t, len(t), b.chain(t))
    assert plan.position == len(t) and plan.remote.state == old and not plan.remote.framed
    restored = b.load(plan)
    assert restored.ok and restored.tier == REMOTE
    check_restored(spec, restored, t)
    assert b.stats()["remote"]["fetch"]["objects"] == 21           # a value a block
    assert b.reader.flush(30) and b.flush(30)
    check_restored(spec, b.load(b.lookup(t)), t)                  # kept in LMDB as read
    assert not b.stats()["remote"]["uploads"]["segments"]         # and not put back

    # The same context uploaded framed by another daemon: that state is the one read.
    c = open_store(spec, path=tmp_path / "c", remote=remote(spec, url))
    fill(c, spec, t)
    assert c.flush(30) and c.remote.flush(30)
    d = open_store(spec, path=tmp_path / "d", remote=remote(spec, url))
    plan = d.lookup_remote(t, len(t), d.chain(t))
    assert framed(plan.remote.state) and plan.remote.framed
    check_restored(spec, d.load(plan), t)
