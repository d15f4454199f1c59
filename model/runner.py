"""Runs steps of many sequences (prefill chunks and decodes mixed) on one model.

The runner owns the state tensors (DeviceState: the KV page pool and the
recurrent cells); nothing outside writes them. `run` appends tokens to several
sequences in one model call and returns their logits with the rows each one owns
(StepLogits, model/spec.py: one row a sequence, its last token's, or every computed token's where
asked); `step` is the same call for callers that want just the tensor. The pages a
step writes must already be the sequence's own (the cache manager hands them out,
copying a shared page before it is written).

The methods after `step` are the state I/O the cache manager restores and
records checkpoints through (model/spec.py: StateIO).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ckptd.model.batch import SeqChunk, StepBatch
from ckptd.model.graphs import DecodeGraphs
from ckptd.model.sequence import Sequence
from ckptd.model.spec import StepLogits
from ckptd.model.state import CellPool, DeviceState
from ckptd.model.transfers import Transfers
from ckptd.model.vision.positions import chunk_positions


@dataclass(frozen=True)
class Mark:
    """A sequence's position before a speculative step, and for a hybrid its recurrent
    state there (device copies: conv [n_rec, conv_dim, K-1], ssm [n_rec, v_heads, dk, dv])."""
    position: int
    conv: torch.Tensor | None = None
    ssm: torch.Tensor | None = None


class Runner:
    def __init__(self, model, num_pages: int, num_cells: int, block_size: int = 16,
                 device: str | torch.device | None = None, max_batch_tokens: int = 2048,
                 graphs: bool | None = None, max_seq_pages: int | None = None,
                 window_pages: int | None = None) -> None:
        """device: where the state lives (default: the model's device). graphs: decode
        steps replay CUDA graphs (model/graphs.py; default: on CUDA; True on the CPU runs
        their static buffers eagerly, for tests). max_seq_pages: pages of the longest
        sequence (default num_pages), the width of a graph's page tables. window_pages:
        the window layers' pool, in pages (default num_pages; model/window_pages.py)."""
        if max_batch_tokens <= 0:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.model = model
        self.block_size = block_size
        self.max_batch_tokens = max_batch_tokens
        self.spec = model.state_spec(block_size)
        self.device = torch.device(device) if device is not None else model.device
        if graphs is None:
            graphs = self.device.type == "cuda"
        if self.spec.attention is not None and self.spec.attention.windows:
            graphs = False        # a graph's page tables have no rooms (a known gap)
        self._sizes = (num_pages, num_cells, max_seq_pages or max(num_pages, 1), graphs)
        self.window_pages = window_pages
        self.vocab_size = model.config.vocab_size
        self.cells = CellPool(num_cells)
        self.embedder = None     # model/vision/embedder.py: images' rows, when it sees images
        self.transfers = Transfers(self.device)
        self._build()

    def _build(self) -> None:
        num_pages, num_cells, max_seq_pages, graphs = self._sizes
        # graphs: one page and one cell more, which no sequence gets: padded rows' own
        spare = 1 if graphs else 0
        self.state = DeviceState(self.spec, num_pages + spare, num_cells + spare, self.device,
                                 self.window_pages)
        self.graphs = None
        if graphs:
            self.graphs = DecodeGraphs(self.model, self.state, self.block_size, num_cells,
                                       max_seq_pages, num_pages, num_cells,
                                       capture=self.device.type == "cuda")

    def release(self) -> None:
        """Let go of the model, the state tensors and the graphs (the daemon sleeps: no
        sequence is live, the cache forgot its device pages)."""
        if self.cells.in_use():
            raise RuntimeError("release() with live sequences")
        self.model = self.state = self.graphs = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def reload(self, model) -> None:
        """Take the model again after release(): the same state layout, fresh tensors."""
        spec = model.state_spec(self.block_size)
        if spec != self.spec or model.config.vocab_size != self.vocab_size:
            raise ValueError("the reloaded model's state layout differs from the one released")
        self.model = model
        self._build()

    def step(self, work: list[tuple[Sequence, int]], on_device: bool = False) -> torch.Tensor:
        """Compute the next n tokens of each (sequence, n) in one model call.

        Returns float32 logits [len(work), vocab] of each sequence's last computed token,
        on the CPU, or where the model ran with on_device (backend sampling).
        """
        if not work:
            raise ValueError("step needs at least one (sequence, n_tokens)")
        return self.run(work, on_device=on_device).rows

    def run(self, work: list[tuple[Sequence, int]], every: frozenset[int] = frozenset(),
            on_device: bool = False) -> StepLogits:
        """step() for the engine's loop: the logits with the rows of each sequence, every
        computed token's for the ids in `every` (a speculative step's verification reads
        them); no work is no model call (an empty StepLogits)."""
        if not work:
            return StepLogits()
        self._check(work)
        B = self.block_size
        ids, chunks, rows, spans = [], [], [], {}
        images = self._images(work)
        rooms = None if self.state.rooms is None else []
        for seq, n in work:
            start, end = seq.num_computed, seq.num_computed + n
            table = torch.tensor(seq.pages[:-(-end // B)], dtype=torch.int32, device="cpu")
            if rooms is not None:
                rooms.append(self._rooms(seq, end))
            chunk = SeqChunk(len(ids), n, start, table, seq.cell)
            if seq.images:
                chunk.shift, chunk.mrope = chunk_positions(seq.images, start, end)
                chunk.images = images.get(seq.id)
            chunks.append(chunk)
            first = len(ids) if seq.id in every else len(ids) + n - 1
            ids += seq.tokens[start:end]
            spans[seq.id] = slice(len(rows), len(rows) + len(ids) - first)
            rows.extend(range(first, len(ids)))
        lora = [seq.lora for seq, _ in work]
        # a captured graph computes the base model: steps using an adapter run eagerly
        if self.graphs is not None and not any(any(s) for s in lora) \
                and self.graphs.fits(chunks):
            logits = self.graphs.run(chunks, ids)
        else:
            batch = StepBatch.build(chunks, ids, rows, B, self.device, lora=lora,
                                    dtype=self.model.dtype, rooms=rooms)
            logits = self.model(batch, self.state)
        # the step's one wait for the device: its logits, for sampling on the host (a
        # copy: a graph's output buffer is overwritten by its next replay)
        where = self.device if on_device else "cpu"
        logits = logits.to(where, copy=self.graphs is not None)
        for seq, n in work:
            seq.num_computed += n
        return StepLogits(logits, spans)

    def _check(self, work: list[tuple[Sequence, int]]) -> None:
        """ValueError for a step that can't run: a detached or repeated sequence, tokens
        it lacks or has no pages for, more than max_batch_tokens in all."""
        seen = set()
        B = self.block_size
        for seq, n in work:
            if seq.cell < 0:
                raise ValueError(f"sequence {seq.id} has no state cell")
            if seq.id in seen:
                raise ValueError(f"sequence {seq.id} appears twice in one step")
            seen.add(seq.id)
            if n <= 0 or seq.num_computed + n > len(seq.tokens):
                raise ValueError(f"sequence {seq.id}: cannot compute tokens {seq.num_computed}.."
                                 f"{seq.num_computed + n} of {len(seq.tokens)}")
            if len(seq.pages) * B < seq.num_computed + n:
                raise ValueError(f"sequence {seq.id}: {len(seq.pages)} pages can't hold "
                                 f"{seq.num_computed + n} tokens")
        total = sum(n for _, n in work)
        if total > self.max_batch_tokens:
            raise ValueError(f"step of {total} tokens exceeds max_batch_tokens "
                             f"({self.max_batch_tokens})")

    def _rooms(self, seq: Sequence, end: int) -> torch.Tensor:
        """seq's table of window rooms up to `end` tokens: a room for each page its
        window layers read or write in the step (given here to a page written the first
        time: the cache gives rooms to the pages it restores), 0 for blocks no query of
        the step sees (model/window_pages.py)."""
        B, W = self.block_size, self.spec.attention.max_window
        pages = seq.pages[:-(-end // B)]
        low, computed = max(0, seq.num_computed - W) // B, -(-seq.num_computed // B)
        self.state.rooms.rooms(pages[low:computed])    # its window's keys are all there
        if not self.state.rooms.keep(pages[computed:]):
            raise ValueError(f"sequence {seq.id}: no window room left for its step "
                             f"({self.state.rooms.num_rooms} rooms)")
        return torch.tensor(self.state.rooms.rooms(pages, missing=0), dtype=torch.int32,
                            device="cpu")

    def _images(self, work: list[tuple[Sequence, int]]
                ) -> dict[int, list[tuple[int, torch.Tensor]]]:
        """{sequence id: [(offset in its chunk, embeddings of those placeholder rows)]}
        for the images this step's chunks hold, encoded together when not cached."""
        want: list[tuple[int, int, int, object]] = []
        for seq, n in work:
            start, end = seq.num_computed, seq.num_computed + n
            for im in seq.images:
                if im.start < end and im.end > start:
                    want.append((seq.id, start, end, im))
        if not want:
            return {}
        if self.embedder is None:
            raise ValueError("this model has no vision encoder: it can't take images")
        out: dict[int, list[tuple[int, torch.Tensor]]] = {}
        for (sid, start, end, im), emb in zip(want, self.embedder.embeds([w[3] for w in want])):
            lo, hi = max(start, im.start), min(end, im.end)
            out.setdefault(sid, []).append((lo - start, emb[lo - im.start:hi - im.start]))
        return out

    def mark(self, seq: Sequence) -> Mark:
        """Where seq is now, before a step that may be taken back in part (a speculative
        verify): its position, and for a hybrid a device copy of its recurrent state."""
        if self.state.conv is None:
            return Mark(seq.num_computed)
        return Mark(seq.num_computed, self.state.conv[seq.cell].clone(),
                    self.state.ssm[seq.cell].clone())

    def rewind(self, seq: Sequence, mark: Mark, position: int) -> None:
        """Make seq's state that of its first `position` tokens, where mark.position <=
        position <= seq.num_computed. KV past a position is never read (attention is
        causal by the context length) and is overwritten when those positions are
        computed again. A recurrent state can't be cut back: the marked one is put back
        and the tokens from the mark to `position` computed again (its pages were
        made writable for the step being taken back)."""
        if not mark.position <= position <= seq.num_computed:
            raise ValueError(f"sequence {seq.id}: cannot rewind to {position} (marked at "
                             f"{mark.position}, computed {seq.num_computed})")
        if position == seq.num_computed:
            return
        if mark.conv is None:
            seq.num_computed = position
            return
        self.state.conv[seq.cell].copy_(mark.conv)
        self.state.ssm[seq.cell].copy_(mark.ssm)
        seq.num_computed = mark.position
        if position > mark.position:
            self.step([(seq, position - mark.position)])

    def attach(self, seq: Sequence) -> None:
        """Give a new sequence a recurrent cell with zero state (OutOfCells when none is
        free). Its token ids were checked when it was submitted (check_token_ids)."""
        if seq.cell >= 0:
            raise ValueError(f"sequence {seq.id} is attached already")
        seq.cell = self.cells.alloc()
        self.state.reset_cell(seq.cell)

    def detach(self, seq: Sequence) -> None:
        """Give back the sequence's cell; detaching twice is harmless."""
        if seq.cell >= 0:
            self.cells.release(seq.cell)
            seq.cell = -1

    def live_cells(self) -> set[int]:
        return self.cells.in_use()

    def copy_page(self, src: int, dst: int) -> None:
        """Copy-on-write: page dst gets src's contents before a step writes into it (its
        window part too, in a room of its own, where src has one)."""
        st = self.state
        if st.kv is None:
            return
        st.kv[dst] = st.kv[src]
        if st.rooms is not None and st.rooms.has([src])[0]:
            if not st.rooms.keep([dst]):
                raise ValueError(f"no window room left to copy page {src}")
            r_src, r_dst = st.rooms.rooms([src, dst])
            st.kv_win[r_dst] = st.kv_win[r_src]

    def keep_window(self, pages: list[int]) -> bool:
        """Rooms for these pages' window-layer KV (model/window_pages.py), before a
        restore loads it; all or nothing, False when too few are free. True for a model
        without window layers."""
        return self.state.rooms is None or self.state.rooms.keep(pages)

    def drop_window(self, pages: list[int]) -> None:
        """The window layers' KV of these pages is read no more: their rooms go back."""
        if self.state.rooms is not None:
            self.state.rooms.drop(pages)

    def has_window(self, pages: list[int]) -> list[bool]:
        """Whether each page holds its window layers' KV on the device (all do where the
        model has no window layer)."""
        rooms = self.state.rooms
        return [True] * len(pages) if rooms is None else rooms.has(pages)

    def page_views(self, pages: list[int]) -> list[torch.Tensor] | None:
        """Writable views [*kv_shape()] of pages held by the caller alone, for a restore
        to decode values straight into; None where that is not the fast way (no KV, a
        pool off the CPU: load_pages copies in one go there, or a page in two pools)."""
        kv = self.state.kv
        if kv is None or kv.device.type != "cpu" or self.state.rooms is not None:
            return None
        if 4 * len(pages) < kv.shape[0]:
            return [kv[p] for p in pages]
        # Many pages (a long restore): the whole pool's views in one call, ~1/4 of the
        # cost of a view each (15,625 pages for a 250K-token restore: ~120 ms -> ~30)
        every = kv.unbind(0)
        return [every[p] for p in pages]

    def page_run(self, first: int, n: int) -> torch.Tensor | None:
        """A writable view [n, *kv_shape()] of pages first .. first + n - 1 (any strides:
        one copy writes them all), where page_views would give their views; else None."""
        kv = self.state.kv
        if kv is None or kv.device.type != "cpu" or self.state.rooms is not None:
            return None
        return kv[first:first + n]

    def page_addresses(self, pages: list[int]) -> list[int] | None:
        """Where each page's bytes start, for the pages page_views would give (one pool,
        on the CPU, each page contiguous); None otherwise."""
        kv = self.state.kv
        if kv is None or kv.device.type != "cpu" or self.state.rooms is not None \
                or not kv[0].is_contiguous():
            return None
        base, step = kv.data_ptr(), kv.stride(0) * kv.element_size()
        return [base + p * step for p in pages]

    def read_pages(self, pages: list[int]) -> torch.Tensor:
        """Host copy of whole pages: [n, n_attn, 2, block_size, kv_heads, head_dim] ([n, 0]
        for a model without attention: its blocks hold no KV). ValueError for a page
        whose window part left the device."""
        st, index = self.state, self.transfers.index
        if st.kv is None:
            return torch.empty((len(pages), *self.spec.kv_shape()), dtype=self.spec.kv_dtype)
        full = st.kv.index_select(0, index(pages))
        if st.rooms is None:
            return self.transfers.to_host(full)
        win = st.kv_win.index_select(0, index(st.rooms.rooms(pages)))
        return self.transfers.to_host(self._join(full, win))

    def load_pages(self, pages: list[int], kv: torch.Tensor) -> None:
        """Write whole pages kv [n, n_attn, 2, block_size, kv_heads, head_dim]; the window
        layers' part only into the pages with a room (keep_window)."""
        want = (len(pages), *self.spec.kv_shape())
        if tuple(kv.shape) != want:
            raise ValueError(f"pages have shape {tuple(kv.shape)}, expected {want}")
        st, index = self.state, self.transfers.index
        if st.kv is None:
            return
        if st.rooms is None:
            self.transfers.to_device(
                lambda x: st.kv.index_copy_(0, index(pages), x.to(st.kv.dtype)), kv)
            return
        self.transfers.to_device(lambda x: st.kv.index_copy_(0, index(pages), x.to(
            st.kv.dtype)), kv[:, st.full_layers])
        held = [i for i, h in enumerate(st.rooms.has(pages)) if h]
        if held:
            rooms = st.rooms.rooms([pages[i] for i in held])
            self.transfers.to_device(lambda x: st.kv_win.index_copy_(0, index(rooms), x.to(
                st.kv_win.dtype)), kv[held][:, st.window_layers])

    def read_partial(self, page: int, n: int) -> torch.Tensor:
        """KV of the first n tokens of a page: [n_attn, 2, n, kv_heads, head_dim]."""
        st = self.state
        full = st.kv[page, :, :, :n].clone(memory_format=torch.contiguous_format)
        if st.rooms is None:
            return self.transfers.to_host(full)
        win = st.kv_win[st.rooms.rooms([page])[0], :, :, :n]
        return self.transfers.to_host(self._join(full[None], win[None])[0])

    def load_partial(self, page: int, kv: torch.Tensor) -> None:
        """Write kv [n_attn, 2, r, kv_heads, head_dim] as the first r tokens of a page
        (a window model's page needs its room: keep_window)."""
        r = kv.shape[2] if kv.dim() == 5 else -1
        if tuple(kv.shape) != self.spec.kv_shape(r):
            raise ValueError(f"partial page KV has shape {tuple(kv.shape)}, "
                             f"expected {self.spec.kv_shape(max(r, 0))}")
        st = self.state
        if st.rooms is None:
            self.transfers.to_device(lambda x: st.kv[page, :, :, :r].copy_(x), kv)
            return
        room = st.rooms.rooms([page])[0]
        self.transfers.to_device(lambda x: st.kv[page, :, :, :r].copy_(x), kv[st.full_layers])
        self.transfers.to_device(lambda x: st.kv_win[room, :, :, :r].copy_(x),
                                 kv[st.window_layers])

    def _join(self, full: torch.Tensor, win: torch.Tensor) -> torch.Tensor:
        """[n, n_attn, ...] in the model's layer order from the full and window pools'
        parts [n, n_full, ...] and [n, n_win, ...] (on the device)."""
        st = self.state
        out = torch.empty((full.shape[0], len(st.where), *full.shape[2:]), dtype=full.dtype,
                          device=full.device)
        out[:, st.full_layers] = full
        out[:, st.window_layers] = win
        return out

    def read_recurrent(self, cell: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Host copies of a cell's conv state [n_rec, conv_dim, K-1] and ssm state
        [n_rec, v_heads, k_head_dim, v_head_dim] (float32)."""
        self._need_recurrent()
        return (self.transfers.to_host(self.state.conv[cell].clone()),
                self.transfers.to_host(self.state.ssm[cell].clone()))

    def load_recurrent(self, cell: int, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        self._need_recurrent()
        if tuple(conv.shape) != self.spec.conv_shape() or tuple(ssm.shape) != self.spec.ssm_shape():
            raise ValueError(f"recurrent state has shapes {tuple(conv.shape)}, {tuple(ssm.shape)}; "
                             f"expected {self.spec.conv_shape()}, {self.spec.ssm_shape()}")
        self.transfers.to_device(lambda x: self.state.conv[cell].copy_(x), conv)
        self.transfers.to_device(lambda x: self.state.ssm[cell].copy_(x), ssm)

    def deferred_reads(self):
        """Inside: read_* return before their copies to the host are done (CUDA); the
        caller calls wait_reads() before it reads them."""
        return self.transfers.deferred()

    def wait_reads(self) -> None:
        self.transfers.wait()

    def _need_recurrent(self) -> None:
        if self.state.conv is None:
            raise ValueError("this model has no recurrent layers")
