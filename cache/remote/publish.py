"""Putting states on the remote: the segments they need, then the state object last.

A state at P needs blocks 0 .. d-1 (d = P // B) in segments. Every cell they fill is
the cell's own segment (its name follows from the chain: the same for every daemon,
so shared prefixes share it); the part of the last cell is covered by segments known
to be there already (put earlier, or named by a state a restore read: `Known`), and a
new segment for what they leave. A segment not known is asked for (HEAD) before it is
put: another daemon may have put it; then its header gives its offsets.

The order is what keeps the remote consistent: every segment a state names is on the
remote before its state object is put (conditionally, If-None-Match: *). A daemon
killed in between leaves segments no state names, which gc takes after a grace
period; never a state naming what is not there.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from ckptd.cache import codec
from ckptd.cache.entry import BLOCK, SNAPSHOT, EntryMeta
from ckptd.cache.remote import frames, state
from ckptd.cache.remote.client import RemoteClient, RemoteError
from ckptd.cache.remote.known import Known
from ckptd.cache.remote.layout import Layout
from ckptd.cache.remote.state import SegmentRef, StateHead

log = logging.getLogger(__name__)
# read([(key, kind)]) -> each committed value's bytes, None where it is gone
ReadValues = Callable[[list[tuple[bytes, str]]], list["bytes | None"]]
Chain = Callable[[bytes], "tuple[bytes, list[bytes]] | None"]


@dataclass
class SegmentJob:
    name: str
    start: int
    parent: bytes
    keys: list[bytes]
    ref: SegmentRef | None = None       # once it is known to be on the remote
    failed: str | None = None           # why it is not: "evicted" or "failed"


@dataclass
class StateJob:
    key: bytes
    meta: EntryMeta
    cell_parent: bytes                           # the key its cell is listed under
    parts: list = field(default_factory=list)    # (SegmentRef or SegmentJob, blocks used)


@dataclass
class Counts:
    segments: int = 0          # segment objects put
    segment_bytes: int = 0
    states: int = 0            # state objects put
    state_bytes: int = 0
    exists: int = 0            # objects another daemon had put already
    reused: int = 0            # segments named without a request (known)
    retries: int = 0
    failed: int = 0            # states given up (a put failed for good)
    evicted: int = 0           # states whose blocks were gone from LMDB first


class Publisher:
    def __init__(self, client: RemoteClient, layout: Layout, known: Known, chain: Chain,
                 read: ReadValues, block_size: int, block_bytes: int, pool: Executor,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        """chain(block key) -> (root key, keys of blocks 0 .. that block), None when a
        link is gone; read: committed values (cache/store/remote_link.py)."""
        self.client, self.layout, self.known, self.cfg = client, layout, known, client.config
        self.chain, self.read, self.pool, self.stopping = chain, read, pool, stopping
        self.B, self.G, self.block_bytes = block_size, layout.grid, block_bytes
        self.counts = Counts()
        self.lock = threading.Lock()
        self.batch: dict[bytes, tuple[SegmentJob, int]] = {}   # keys of cells going up now

    def cells(self, ends: list[bytes]) -> list:
        """What puts the full cells whose last blocks these are (committed just now).
        Starts a batch: the states planned next name these cells' segments."""
        parts = []
        self.batch = {}
        for last in ends:
            got = self.chain(last)
            if got is not None:
                root, chain = got
                parts.append(self._segment(root, chain, len(chain) - self.G, len(chain)))
        return parts

    def state_job(self, key: bytes, meta: EntryMeta) -> StateJob | None:
        """What a state needs (after `cells` for the batch; the deepest states of a
        batch first, so that those below name a part of their segments); None when its
        blocks are gone from LMDB."""
        d = meta.position // self.B
        if d:
            got = self.chain(meta.parent)
            if got is None or len(got[1]) != d:
                return None
            root, keys = got
        else:
            root, keys = meta.parent, []
        start = d // self.G * self.G
        job = StateJob(key, meta, keys[start - 1] if start else root)
        for lo in range(0, d, self.G):
            hi = min(lo + self.G, d)
            if hi - lo == self.G:
                job.parts.append(self._segment(root, keys, lo, hi))
            else:
                job.parts += self._cover(root, keys, lo, hi)
        return job

    def _at(self, key: bytes) -> tuple[SegmentRef | SegmentJob, int] | None:
        """The segment known, or put in this batch, that holds this block."""
        return self.batch.get(key) or self.known.at(key)

    def _segment(self, root: bytes, keys: list[bytes], lo: int, hi: int) -> tuple:
        """(SegmentRef or SegmentJob, blocks used) for blocks lo .. hi-1 as one segment."""
        hit = self._at(keys[hi - 1])
        if hit is not None and hit[0].start == lo:
            return hit[0], hi - lo
        parent = keys[lo - 1] if lo else root
        job = SegmentJob(self.layout.segment(parent, keys[hi - 1]), lo, parent, keys[lo:hi])
        for j, k in enumerate(job.keys):           # going up in this batch: name it
            self.batch[k] = (job, j)
        return job, hi - lo

    def _cover(self, root: bytes, keys: list[bytes], lo: int, hi: int) -> list:
        """Blocks lo .. hi-1 (the end of a cell): the segments known or going up that hold
        the most of them, from the end down, and new ones for what they leave."""
        parts, end, pos = [], hi, hi
        while pos > lo:
            hit = self._at(keys[pos - 1])
            if hit is None or pos - 1 - hit[1] < lo:
                pos -= 1
                continue
            seg, j = hit
            if pos < end:
                parts.append(self._segment(root, keys, pos, end))
            parts.append((seg, j + 1))
            end = pos = seg.start
        if lo < end:
            parts.append(self._segment(root, keys, lo, end))
        return parts[::-1]

    def run(self, cells: list, states: list[StateJob], again: bool = True) -> None:
        """Put what the jobs need: segments (in parallel, one job per name), then each
        state whose segments are all there. A segment named from what is known is asked
        for first (HEAD: another daemon may have found it corrupt and deleted it, or gc
        taken it): a state never names what is not there. One that is gone is forgotten,
        and the states that named it are planned again (once)."""
        jobs: dict[str, SegmentJob] = {}
        reused: dict[str, SegmentRef] = {}
        for seg, _ in cells + [p for s in states for p in s.parts]:
            if isinstance(seg, SegmentJob):
                jobs.setdefault(seg.name, seg)
            else:
                reused[seg.name] = seg
        puts = [self.pool.submit(self._put_segment, j) for j in jobs.values()]
        heads = {n: self.pool.submit(self._there, r) for n, r in reused.items()}
        for f in puts:
            f.result()
        gone = {n for n, f in heads.items() if not f.result()}
        with self.lock:
            self.counts.reused += len(reused) - len(gone)
        for n in gone:
            self.known.forget(n)
        self.batch = {}
        ready, replan = [], []
        for s in states:
            segs = [jobs[seg.name] if isinstance(seg, SegmentJob) else seg for seg, _ in s.parts]
            if any(isinstance(seg, SegmentRef) and seg.name in gone for seg in segs):
                replan.append(s)
                continue
            refs = [seg.ref if isinstance(seg, SegmentJob) else seg for seg in segs]
            if any(r is None for r in refs):
                why = next((seg.failed for seg in segs if isinstance(seg, SegmentJob)
                            and seg.failed), "failed")
                with self.lock:
                    setattr(self.counts, why, getattr(self.counts, why) + 1)
                continue
            refs = [_used(r, used) for r, (_, used) in zip(refs, s.parts)]
            ready.append(self.pool.submit(self._put_state, s, refs))
        for f in ready:
            f.result()
        if replan:
            jobs2 = [self.state_job(s.key, s.meta) for s in replan] if again else []
            with self.lock:
                self.counts.failed += len(replan) - sum(1 for j in jobs2 if j is not None)
            self.run([], [j for j in jobs2 if j is not None], again=False)

    def _there(self, ref: SegmentRef) -> bool:
        try:
            return self.client.head(ref.name) == ref.size
        except RemoteError:
            return False

    def _put_segment(self, job: SegmentJob) -> None:
        try:
            ref = self._existing(job)
            if ref is None:
                values = self.read([(k, BLOCK) for k in job.keys])
                if any(v is None for v in values):
                    job.failed = "evicted"
                    return
                # decoding checks each value: disk damage stays off the remote
                pages = [codec.decode(v, self.layout.fp, key=k)["kv"]
                         for k, v in zip(job.keys, values)]
                tensor = frames.tensor_of(pages[0].dtype, pages[0].shape)
                if any(frames.tensor_of(p.dtype, p.shape) != tensor for p in pages):
                    raise codec.CorruptValue("blocks of another shape")
                body, h = frames.pack(job.start, job.parent, job.keys,
                                      [frames.page_bytes(p) for p in pages], tensor,
                                      self.block_bytes, self.cfg.frame_bytes)
                self._count("segment", self._put(job.name, body), len(body))
                ref = _ref(job.name, h)
        except (codec.CorruptValue, KeyError, ValueError):
            job.failed = "evicted"            # bad on disk: the same as gone
            return
        except RemoteError:
            job.failed = "failed"
            return
        self.known.add(ref, job.keys)
        job.ref = ref

    def _existing(self, job: SegmentJob) -> SegmentRef | None:
        """The segment when another daemon put it already (its header read)."""
        size = self.client.head(job.name)
        if size is None:
            return None
        got = self.client.get_range(job.name, 0,
                                    min(size, frames.max_header_bytes(len(job.keys))))
        try:
            if got is None:
                return None
            h = frames.read_header(got[0])
            if (h.start, h.parent, h.keys) != (job.start, job.parent, tuple(job.keys)) \
                    or h.size != got[1] or h.block_bytes != self.block_bytes:
                raise codec.CorruptValue("a segment of other blocks under this name")
        except codec.CorruptValue as e:
            log.warning("remote: %s is damaged (%s); putting it again", job.name, e)
            self.client.delete([job.name])
            return None
        with self.lock:
            self.counts.exists += 1
        return _ref(job.name, h)

    def _put_state(self, job: StateJob, refs: list[SegmentRef]) -> None:
        m = job.meta
        value = self.read([(job.key, SNAPSHOT)])[0]
        try:
            if value is None:
                raise codec.CorruptValue("gone")
            codec.verify(value, self.layout.fp, job.key)
        except codec.CorruptValue:
            with self.lock:
                self.counts.evicted += 1
            return
        tensor = next((r.tensor for r in refs if r.tensor), "")
        head = StateHead(job.key, m.parent, m.position, m.tokens, m.role, m.plain,
                         self.layout.fp, m.logical_bytes, self.block_bytes, refs,
                         tensor=tensor)
        body = state.pack(head, value, self.layout.relative)
        name = self.layout.state(job.cell_parent, m.position, job.key)
        try:
            written = self._put(name, body) or self._replace_dangling(name, body, refs)
        except RemoteError:
            with self.lock:
                self.counts.failed += 1
            return
        self._count("state", written, len(body))

    def _count(self, kind: str, written: bool, nbytes: int) -> None:
        """An object put (written) or found there already (another daemon's)."""
        c = self.counts
        with self.lock:
            if written:
                setattr(c, f"{kind}s", getattr(c, f"{kind}s") + 1)
                setattr(c, f"{kind}_bytes", getattr(c, f"{kind}_bytes") + nbytes)
            else:
                c.exists += 1

    def _replace_dangling(self, name: str, body: bytes, refs: list[SegmentRef]) -> bool:
        """Another daemon's state object is under this name: put this one in its place
        when that one names a segment that is not there (deleted as corrupt), so the
        state restores again. True when it was replaced."""
        ours = {r.name: r.size for r in refs}
        try:
            head = state.fetch_head(self.client.get_range, name, None, self.layout.fp,
                                    self.layout.absolute)
            if head is None:
                raise codec.CorruptValue("gone")
            if all(ours.get(r.name) == r.size or self.client.head(r.name) == r.size
                   for r in head.segments):
                return False
        except codec.CorruptValue:
            pass
        log.warning("remote: state %s names a segment that is not there; put again", name)
        self.client.delete([name])
        return self._put(name, body)

    def _put(self, name: str, body: bytes) -> bool:
        """A conditional put with retries: True when written, False when it was there.
        RemoteError when it failed for good (refused, or out of attempts)."""
        delay, attempt = self.cfg.backoff, 0
        while True:
            attempt += 1
            while not self.client.available() and not self.stopping():
                time.sleep(0.05)
            try:
                return self.client.put(name, body)
            except RemoteError as e:
                # Refused (403, a bad request) is not going to change by retrying.
                if self.stopping() or attempt >= self.cfg.upload_attempts \
                        or e.kind in ("denied", "client"):
                    raise
                with self.lock:
                    self.counts.retries += 1
                time.sleep(delay)
                delay *= 2


def _used(ref: SegmentRef, n: int) -> SegmentRef:
    return ref if ref.used == n else dataclasses.replace(ref, lengths=ref.lengths[:n])


def _ref(name: str, h: frames.FramedHeader) -> SegmentRef:
    return SegmentRef(name, h.start, len(h.keys), h.size, (h.block_bytes,) * len(h.keys),
                   h.frames, h.header_bytes, h.tensor)

