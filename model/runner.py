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
                 graphs: bool | None = None, max_seq_pages: int | None = None) -> None:
        """device: where the state lives (default: the model's device). graphs: decode
        steps replay CUDA graphs (model/graphs.py; default: on CUDA; True on the CPU runs
        their static buffers eagerly, for tests). max_seq_pages: pages of the longest
        sequence (default num_pages), the width of a graph's page tables."""
        if max_batch_tokens <= 0:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.model = model
        self.block_size = block_size
        self.max_batch_tokens = max_batch_tokens
        self.spec = model.state_spec(block_size)
        self.device = torch.device(device) if device is not None else model.device
        if graphs is None:
            graphs = self.device.type == "cuda"
        self._sizes = (num_pages, num_cells, max_seq_pages or max(num_pages, 1), graphs)
        self.vocab_size = model.config.vocab_size
        self.cells = CellPool(num_cells)
        self.embedder = None     # model/vision/embedder.py: images' rows, when it sees images
        self.transfers = Transfers(self.device)
        self._build()

    def _build(self) -> None:
        num_pages, num_cells, max_seq_pages, graphs = self._sizes
        # graphs: one page and one cell more, which no sequence gets: padded rows' own
        spare = 1 if graphs else 0
        self.state = DeviceState(self.spec, num_pages + spare, num_cells + spare, self.device)
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
        for seq, n in work:
            start, end = seq.num_computed, seq.num_computed + n
            table = torch.tensor(seq.pages[:-(-end // B)], dtype=torch.int32, device="cpu")
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
                                    dtype=self.model.dtype)
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
        """Copy-on-write: page dst gets src's contents before a step writes into it."""
        if self.state.kv is not None:
            self.state.kv[dst] = self.state.kv[src]

    def page_views(self, pages: list[int]) -> list[torch.Tensor] | None:
        """Writable views [*kv_shape()] of pages held by the caller alone, for a restore
        to decode values straight into; None where that is not the fast way (no KV, or
        a pool off the CPU: load_pages copies in one go there)."""
        kv = self.state.kv
        if kv is None or kv.device.type != "cpu":
            return None
        return [kv[p] for p in pages]

    def read_pages(self, pages: list[int]) -> torch.Tensor:
        """Host copy of whole pages: [n, n_attn, 2, block_size, kv_heads, head_dim] ([n, 0]
        for a model without attention: its blocks hold no KV)."""
        if self.state.kv is None:
            return torch.empty((len(pages), *self.spec.kv_shape()), dtype=self.spec.kv_dtype)
        return self.transfers.to_host(self.state.kv.index_select(0, self.transfers.index(pages)))

    def load_pages(self, pages: list[int], kv: torch.Tensor) -> None:
        """Write whole pages kv [n, n_attn, 2, block_size, kv_heads, head_dim]."""
        want = (len(pages), *self.spec.kv_shape())
        if tuple(kv.shape) != want:
            raise ValueError(f"pages have shape {tuple(kv.shape)}, expected {want}")
        pool = self.state.kv
        if pool is None:
            return
        self.transfers.to_device(
            lambda x: pool.index_copy_(0, self.transfers.index(pages), x.to(pool.dtype)), kv)

    def read_partial(self, page: int, n: int) -> torch.Tensor:
        """KV of the first n tokens of a page: [n_attn, 2, n, kv_heads, head_dim]."""
        return self.transfers.to_host(
            self.state.kv[page, :, :, :n].clone(memory_format=torch.contiguous_format))

    def load_partial(self, page: int, kv: torch.Tensor) -> None:
        """Write kv [n_attn, 2, r, kv_heads, head_dim] as the first r tokens of a page."""
        r = kv.shape[2] if kv.dim() == 5 else -1
        if tuple(kv.shape) != self.spec.kv_shape(r):
            raise ValueError(f"partial page KV has shape {tuple(kv.shape)}, "
                             f"expected {self.spec.kv_shape(max(r, 0))}")
        pool = self.state.kv
        self.transfers.to_device(lambda x: pool[page, :, :, :r].copy_(x), kv)

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
