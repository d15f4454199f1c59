"""Runs steps of many sequences (prefill chunks and decodes mixed) on one model.

The runner owns the state tensors (DeviceState: the KV page pool and the
recurrent slots); nothing outside writes them. `step` appends tokens to several
sequences in one model call and returns each one's last-token logits; the pages
a step writes must already be the sequence's own (the cache manager hands them
out, copying a shared page before it is written).

The methods after `step` are the state I/O the cache manager restores and
records checkpoints through (cache/manager.py: StateIO).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ckptd.model.batch import SeqChunk, StepBatch
from ckptd.model.graphs import DecodeGraphs
from ckptd.model.sequence import Sequence
from ckptd.model.state import DeviceState, SlotPool
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
    def __init__(self, model, num_pages: int, num_slots: int, block_size: int = 16,
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
        self._sizes = (num_pages, num_slots, max_seq_pages or max(num_pages, 1), graphs)
        self.vocab_size = model.config.vocab_size
        self.slots = SlotPool(num_slots)
        self.embedder = None     # model/vision/embedder.py: images' rows, when it sees images
        self.transfers = Transfers(self.device)
        self._build()

    def _build(self) -> None:
        num_pages, num_slots, max_seq_pages, graphs = self._sizes
        # graphs: one page and one slot more, which no sequence gets: padded rows' own
        spare = 1 if graphs else 0
        self.state = DeviceState(self.spec, num_pages + spare, num_slots + spare, self.device)
        self.graphs = None
        if graphs:
            self.graphs = DecodeGraphs(self.model, self.state, self.block_size, num_slots,
                                       max_seq_pages, num_pages, num_slots,
                                       capture=self.device.type == "cuda")

    def release(self) -> None:
        """Let go of the model, the state tensors and the graphs (the daemon sleeps: no
        sequence is live, the cache forgot its device pages)."""
        if self.slots.in_use():
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
        return self.step_rows(work, on_device=on_device)[0]

    def step_rows(self, work: list[tuple[Sequence, int]], wide: frozenset[int] = frozenset(),
                  on_device: bool = False) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """step(), and for each sequence whose id is in `wide` the logits of every token
        it computed ([n, vocab]: row i predicts the token after its i-th one), as a
        speculative step's verification reads them."""
        if not work:
            raise ValueError("step needs at least one (sequence, n_tokens)")
        seen = set()
        B = self.block_size
        for seq, n in work:
            if seq.slot < 0:
                raise ValueError(f"sequence {seq.id} has no state slot")
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
        ids, chunks, last, rows = [], [], [], []
        images = self._images(work)
        for seq, n in work:
            start, end = seq.num_computed, seq.num_computed + n
            table = torch.tensor(seq.pages[:-(-end // B)], dtype=torch.int32, device="cpu")
            chunk = SeqChunk(len(ids), n, start, table, seq.slot)
            if seq.images:
                chunk.shift, chunk.mrope = chunk_positions(seq.images, start, end)
                chunk.images = images.get(seq.id)
            chunks.append(chunk)
            first = len(ids) if seq.id in wide else len(ids) + n - 1
            ids += seq.tokens[start:end]
            rows.extend(range(first, len(ids)))
            last.append(len(rows) - 1)
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
        out: dict[int, torch.Tensor] = {}
        for (seq, n), end in zip(work, last):
            seq.num_computed += n
            if seq.id in wide:
                out[seq.id] = logits[end - n + 1:end + 1]
        if wide:
            logits = logits[torch.tensor(last)]
        return logits, out

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

    # ---- speculative steps: back to the last accepted token ----------------------------

    def mark(self, seq: Sequence) -> Mark:
        """Where seq is now, before a step that may be taken back in part (a speculative
        verify): its position, and for a hybrid a device copy of its recurrent state."""
        if self.state.conv is None:
            return Mark(seq.num_computed)
        return Mark(seq.num_computed, self.state.conv[seq.slot].clone(),
                    self.state.ssm[seq.slot].clone())

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
        self.state.conv[seq.slot].copy_(mark.conv)
        self.state.ssm[seq.slot].copy_(mark.ssm)
        seq.num_computed = mark.position
        if position > mark.position:
            self.step([(seq, position - mark.position)])

    # ---- state I/O for the cache manager ---------------------------------------------

    def attach(self, seq: Sequence) -> None:
        """Give a new sequence a recurrent slot with zero state (OutOfSlots when none is
        free). Its token ids were checked when it was submitted (check_token_ids)."""
        if seq.slot >= 0:
            raise ValueError(f"sequence {seq.id} is attached already")
        seq.slot = self.slots.alloc()
        self.state.reset_slot(seq.slot)

    def detach(self, seq: Sequence) -> None:
        """Give back the sequence's slot; detaching twice is harmless."""
        if seq.slot >= 0:
            self.slots.release(seq.slot)
            seq.slot = -1

    def live_slots(self) -> set[int]:
        return self.slots.in_use()

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
        """Host copy of whole pages: [n, n_attn, 2, block_size, kv_heads, head_dim]."""
        return self.transfers.to_host(self.state.kv.index_select(0, self.transfers.index(pages)))

    def load_pages(self, pages: list[int], kv: torch.Tensor) -> None:
        """Write whole pages kv [n, n_attn, 2, block_size, kv_heads, head_dim]."""
        want = (len(pages), *self.spec.kv_shape())
        if tuple(kv.shape) != want:
            raise ValueError(f"pages have shape {tuple(kv.shape)}, expected {want}")
        pool = self.state.kv
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

    def read_recurrent(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Host copies of a slot's conv state [n_rec, conv_dim, K-1] and ssm state
        [n_rec, v_heads, k_head_dim, v_head_dim] (float32)."""
        self._need_recurrent()
        return (self.transfers.to_host(self.state.conv[slot].clone()),
                self.transfers.to_host(self.state.ssm[slot].clone()))

    def load_recurrent(self, slot: int, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        self._need_recurrent()
        if tuple(conv.shape) != self.spec.conv_shape() or tuple(ssm.shape) != self.spec.ssm_shape():
            raise ValueError(f"recurrent state has shapes {tuple(conv.shape)}, {tuple(ssm.shape)}; "
                             f"expected {self.spec.conv_shape()}, {self.spec.ssm_shape()}")
        self.transfers.to_device(lambda x: self.state.conv[slot].copy_(x), conv)
        self.transfers.to_device(lambda x: self.state.ssm[slot].copy_(x), ssm)

    def deferred_reads(self):
        """Inside: read_* return before their copies to the host are done (CUDA); the
        caller calls settle_reads() before it reads them."""
        return self.transfers.deferred()

    def settle_reads(self) -> None:
        self.transfers.settle()

    def _need_recurrent(self) -> None:
        if self.state.conv is None:
            raise ValueError("this model has no recurrent layers")
