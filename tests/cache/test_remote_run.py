"""The remote's blocks of a plan as one run (cache/remote/run.py, lookup.Blocks): a
plan from a state's head holds them by range, not a piece a block, and prices, lists
and restores them as the pieces one by one would; local blocks come first; a bad frame
in the middle ends the restore at its first block, the blocks before it kept."""

from __future__ import annotations

from ckptd.cache.lookup import BLOCK, REMOTE, Blocks, PieceRef
from tests.cache.conftest import check_restored, fake_pages, fill
from tests.cache.test_remote import aws, remote  # noqa: F401 (aws: a fixture)
from tests.s3 import fresh_url

TOKENS = list(range(3, 3 + 4 * 20 + 2))          # 20 blocks of 4, and 2 tokens


def _stores(open_store, spec, tmp_path, **options):
    url = fresh_url()
    a = open_store(spec, path=tmp_path / "a", remote=remote(spec, url, **options))
    fill(a, spec, TOKENS)
    assert a.flush(30) and a.remote.flush(30)
    return a, open_store(spec, path=tmp_path / "b", remote=remote(spec, url, **options)), url


def test_a_fresh_stores_plan_holds_the_remote_blocks_as_one_run(aws, open_store, spec,  # noqa: F811
                                                               tmp_path):
    _, b, _ = _stores(open_store, spec, tmp_path)
    chain = b.chain(TOKENS)
    plan = b.lookup_remote(TOKENS, len(TOKENS), chain)
    blocks = plan.blocks
    assert isinstance(blocks, Blocks) and not blocks.refs and len(blocks.run) == 20
    assert blocks.tier_counts() == [(REMOTE, 20)]
    pieces = plan.pieces()                       # the run's blocks made one by one
    assert [p.key for p in pieces[:20]] == chain.keys[:20]
    assert all(p.kind == BLOCK and p.tier == REMOTE and p.position == 4 * (i + 1)
               for i, p in enumerate(pieces[:20]))
    # priced as the pieces one by one are
    found = plan.remote
    assert plan.total_bytes == sum(p.nbytes for p in pieces)
    assert plan.bytes_by_tier() == {REMOTE: sum(p.nbytes for p in pieces)}
    assert plan.remote_rounds() == found.fetcher.rounds(
        list(dict.fromkeys(found.where[p.key] for p in pieces)))
    # indexing and cutting
    assert blocks[-1] == pieces[19] and blocks[3] == pieces[3]
    head = blocks[:5]
    assert isinstance(head, Blocks) and len(head) == 5 and list(head) == pieces[:5]
    assert blocks[2:4] == pieces[2:4] and blocks == pieces[:20]
    check_restored(spec, b.load(plan), TOKENS)


def test_local_blocks_come_first_and_the_run_after_them(aws, open_store, spec,  # noqa: F811
                                                        tmp_path):
    _, b, _ = _stores(open_store, spec, tmp_path)
    chain = b.chain(TOKENS)
    b.put_blocks(TOKENS, 0, fake_pages(spec, TOKENS, 0, 7), chain=chain)
    assert b.flush(30)
    plan = b.lookup_remote(TOKENS, len(TOKENS), chain)
    local = [p.tier for p in plan.blocks.refs]
    assert len(local) == 7 and set(local) <= {"host", "disk"}
    assert plan.blocks.run.lo == 7 and len(plan.blocks) == 20
    assert plan.blocks.tier_counts() == [(t, 1) for t in local] + [(REMOTE, 13)]
    check_restored(spec, b.load(plan), TOKENS)


def test_a_bad_frame_ends_the_restore_at_its_first_block(aws, open_store, spec,  # noqa: F811
                                                         tmp_path, s3_server):
    from tests.remote_damage import flip_block
    from tests.s3 import BUCKET

    a, b, _ = _stores(open_store, spec, tmp_path, segment_bytes=8 * spec.page_bytes(),
                      frame_bytes=2 * spec.page_bytes())
    chain = a.chain(TOKENS)
    seg = a.remote.layout.segment(chain.keys[7], chain.keys[15])          # blocks 8-15
    s3 = s3_server.client()
    body = bytearray(s3.get_object(Bucket=BUCKET, Key=seg)["Body"].read())
    first = 8 + flip_block(body, 3)                  # block 11's frame
    assert first == 10
    s3.put_object(Bucket=BUCKET, Key=seg, Body=bytes(body))
    plan = b.lookup_remote(TOKENS, len(TOKENS), b.chain(TOKENS))
    assert plan.position == len(TOKENS) and len(plan.blocks.run) == 20
    restored = b.load(plan)
    assert not restored.ok and restored.position == first * 4
    assert restored.dropped == 2                     # the frame's two blocks
    assert b.reader.flush(30) and b.flush(30)
    # the blocks before the bad frame were kept in LMDB, none from it on
    keys = b.chain(TOKENS).keys
    assert all(b.has(k) for k in keys[:first]) and not any(b.has(k) for k in keys[first:20])
    if not spec.is_hybrid:                           # blocks alone restore: from LMDB
        local = b.lookup(TOKENS, max_tokens=first * 4)
        assert len(local.blocks) == first and local.tier in ("host", "disk")
        check_restored(spec, b.load(local), TOKENS)


def test_a_run_prices_its_blocks_as_the_frames_share_them():
    """Span.stored: a block's share of its frame; nbytes counts only the run's blocks
    (a frame may start before the run and end after it)."""
    from ckptd.cache.keys import prompt_chain
    from ckptd.cache.remote.ranges import Loc
    from ckptd.cache.remote.run import Run, Span

    t = list(range(3, 3 + 4 * 10))
    chain = prompt_chain("fp", 4, t)
    spans = [Span(0, 4, Loc("s", 0, 400, 1000), None), Span(4, 4, Loc("s", 400, 200, 1000),
                                                            None),
             Span(8, 2, Loc("s", 600, 100, 1000), None)]
    run = Run(chain, t, spans, 2, 9, "fp", 64, lambda b, B: True, 0.0)
    assert len(run) == 7 and run.nbytes == 2 * 100 + 4 * 50 + 1 * 50
    assert run.locs() == [s.loc for s in spans]
    assert run.cut(4, 8).locs() == [spans[1].loc] and run.cut(4, 8).nbytes == 200
    assert run.ref(0) == PieceRef(chain.keys[2], BLOCK, REMOTE, 100, 12)
    assert [r.key for r in run.refs()] == chain.keys[2:9]
    m = run.meta(5)
    assert (m.parent, m.position, m.tokens, m.stored_bytes) == (chain.keys[4], 24,
                                                                t[20:24], 50)
    assert run.head(0).locs() == [] and not Blocks([], run.head(0)).run


def test_the_write_through_waits_for_an_idle_engine(aws, open_store, spec,  # noqa: F811
                                                    tmp_path):
    """What a remote restore read goes into LMDB once the engine has nothing to run
    (the manager's store_pending -> WriteThrough.idle_now), not beside the request's first
    steps; at the latest IDLE_WAIT after the restore."""
    import time

    from ckptd.cache.store import remote_read

    _, b, _ = _stores(open_store, spec, tmp_path)
    keys = b.chain(TOKENS).keys
    check_restored(spec, b.load(b.lookup_remote(TOKENS, len(TOKENS), b.chain(TOKENS))), TOKENS)
    time.sleep(0.5)
    assert not any(b.has(k) for k in keys[:20])           # the request's steps run
    b.reader.writes.idle_now()                              # the engine went idle
    assert b.reader.flush(30) and b.flush(30)
    assert all(b.has(k) for k in keys[:20])
    # without an idle engine: after IDLE_WAIT
    _, c, _ = _stores(open_store, spec, tmp_path / "c")
    t0 = time.monotonic()
    c.load(c.lookup_remote(TOKENS, len(TOKENS), c.chain(TOKENS)))
    c.reader.promoter.submit(lambda: None).result(30)      # waits as a job, not a flush
    assert time.monotonic() - t0 >= remote_read.IDLE_WAIT - 0.1
    assert c.flush(30) and all(c.has(k) for k in c.chain(TOKENS).keys[:20])


def test_blocks_a_checkpoint_put_meanwhile_are_not_cut_again(aws, open_store, spec,  # noqa: F811
                                                             tmp_path, monkeypatch):
    from ckptd.cache.remote import frames

    cut = []
    real = frames.cut_values

    def counted(items, *args):
        cut.extend(key for key, *_ in items)
        return real(items, *args)
    monkeypatch.setattr(frames, "cut_values", counted)
    _, b, _ = _stores(open_store, spec, tmp_path)
    chain = b.chain(TOKENS)
    check_restored(spec, b.load(b.lookup_remote(TOKENS, len(TOKENS), chain)), TOKENS)
    b.put_blocks(TOKENS, 0, fake_pages(spec, TOKENS, 0, 12), chain=chain)  # a checkpoint
    assert b.reader.flush(30) and b.flush(30)
    assert cut == chain.keys[12:20]
    assert all(b.has(k) for k in chain.keys[:20])
