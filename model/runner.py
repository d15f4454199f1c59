"""Runs steps of many sequences (prefill chunks and decodes mixed) on one model.

A Sequence owns a recurrent slot and a list of pages; its first `num_computed`
tokens are in its state. `step` appends tokens to several sequences in one
model call and returns each one's last-token logits.

Pages a sequence writes are its own: before a step writes into a page someone
else also holds (a shared partial page after `fork` or `adopt`), the page is
copied (copy-on-write). Full pages are never written again, so they can be
shared freely and registered in the prefix table (`publish`).

The hooks at the end (`adopt`, `reserve`, `read_*` / `load_*`) are what the
cache engine builds restores and snapshots on.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from ckptd.model.batch import SeqChunk, StepBatch
from ckptd.model.pages import PagePool, SlotPool
from ckptd.model.state import DeviceState

_ids = itertools.count()


@dataclass(eq=False)             # a sequence is itself, not its contents: compare by identity
class Sequence:
    tokens: list[int]          # prompt, then generated tokens as they are appended
    slot: int                  # recurrent state slot; -1 once released
    pages: list[int] = field(default_factory=list)
    num_computed: int = 0      # tokens whose state (KV, recurrent) is computed
    id: int = field(default_factory=lambda: next(_ids))


class Runner:
    def __init__(self, model, num_pages: int, num_slots: int, block_size: int = 16,
                 device: str | torch.device | None = None, max_batch_tokens: int = 2048) -> None:
        """device: where the state lives (default: the model's device)."""
        if max_batch_tokens <= 0:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.model = model
        self.block_size = block_size
        self.max_batch_tokens = max_batch_tokens
        self.spec = model.state_spec(block_size)
        self.device = torch.device(device) if device is not None else model.device
        self.state = DeviceState(self.spec, num_pages, num_slots, self.device)
        self.pages = PagePool(num_pages)
        self.slots = SlotPool(num_slots)

    def add(self, tokens: list[int]) -> Sequence:
        """A new sequence with zero state; raises OutOfSlots when all slots are in use."""
        vocab = self.model.config.vocab_size
        if tokens and (min(tokens) < 0 or max(tokens) >= vocab):   # C loops, not Python's
            bad = next(t for t in tokens if not 0 <= t < vocab)
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab})")
        slot = self.slots.alloc()
        self.state.reset_slot(slot)
        return Sequence(list(tokens), slot)

    def release(self, seq: Sequence) -> None:
        """Give back the sequence's pages and slot; releasing twice is harmless."""
        if seq.slot < 0:
            return
        self.pages.decref(seq.pages)
        seq.pages = []
        self.slots.release(seq.slot)
        seq.slot = -1

    def step(self, work: list[tuple[Sequence, int]]) -> torch.Tensor:
        """Compute the next n tokens of each (sequence, n) in one model call.

        Returns float32 logits [len(work), vocab] of each sequence's last computed token.
        Raises OutOfPages (changing nothing) when the pages it needs are not available.
        """
        if not work:
            raise ValueError("step needs at least one (sequence, n_tokens)")
        seen = set()
        for seq, n in work:
            if seq.slot < 0:
                raise ValueError(f"sequence {seq.id} was released")
            if seq.id in seen:
                raise ValueError(f"sequence {seq.id} appears twice in one step")
            seen.add(seq.id)
            if n <= 0 or seq.num_computed + n > len(seq.tokens):
                raise ValueError(f"sequence {seq.id}: cannot compute tokens {seq.num_computed}.."
                                 f"{seq.num_computed + n} of {len(seq.tokens)}")
        total = sum(n for _, n in work)
        if total > self.max_batch_tokens:
            raise ValueError(f"step of {total} tokens exceeds max_batch_tokens "
                             f"({self.max_batch_tokens})")
        self._make_writable([(seq, seq.num_computed + n) for seq, n in work])
        ids, pos, chunks, last = [], [], [], []
        for seq, n in work:
            start, end = seq.num_computed, seq.num_computed + n
            table = torch.tensor(seq.pages[:self._n_pages(end)], dtype=torch.int32)
            chunks.append(SeqChunk(len(ids), n, start, table, seq.slot))
            ids += seq.tokens[start:end]
            pos += range(start, end)
            last.append(len(ids) - 1)
        batch = StepBatch(torch.tensor(ids, dtype=torch.long), torch.tensor(pos, dtype=torch.long),
                          chunks, torch.tensor(last, dtype=torch.long))
        logits = self.model(batch, self.state)
        for seq, n in work:
            seq.num_computed += n
        return logits

    def pages_needed(self, seq: Sequence, n_tokens: int) -> int:
        """Pages a step computing the next n_tokens of seq would allocate (copies included)."""
        return self._plan(seq, seq.num_computed + n_tokens)[1]

    def fork(self, seq: Sequence) -> Sequence:
        """A new sequence with seq's tokens and state, sharing all its pages."""
        child = self.add(seq.tokens)
        if seq.num_computed:
            self.adopt(child, seq.pages[:self._n_pages(seq.num_computed)], seq.num_computed)
            if self.spec.is_hybrid:
                self.load_recurrent(child.slot, *self.read_recurrent(seq.slot))
        return child

    # ---- hooks for the cache engine ---------------------------------------------------

    def adopt(self, seq: Sequence, pages: list[int], n_tokens: int) -> None:
        """Start a fresh sequence from existing pages holding its first n_tokens tokens
        (a device prefix hit). The sequence takes its own reference to each page. A
        hybrid model also needs the recurrent state at n_tokens: see load_recurrent."""
        if seq.num_computed or seq.pages:
            raise ValueError(f"sequence {seq.id} already has state; adopt starts a fresh one")
        if not 0 < n_tokens <= len(seq.tokens):
            raise ValueError(f"cannot adopt {n_tokens} tokens for a sequence of "
                             f"{len(seq.tokens)}")
        if len(pages) != self._n_pages(n_tokens):
            raise ValueError(f"{n_tokens} tokens need {self._n_pages(n_tokens)} pages, "
                             f"got {len(pages)}")
        for p in pages:
            if not 0 <= p < self.pages.num_pages or self.pages.refs[p] == 0:
                raise ValueError(f"page {p} is not allocated")
        self.pages.incref(list(pages))
        seq.pages = list(pages)
        seq.num_computed = n_tokens

    def publish(self, seq: Sequence, keys: list[bytes], first: int = 0) -> int:
        """Register seq's computed full pages in the prefix table, keys[i] for block i,
        from block `first` on (the ones before were published already). Where a key is
        already held by an equal page, seq switches to that page and lets its own copy
        go. Returns the number of blocks registered."""
        n = min(len(keys), seq.num_computed // self.block_size)
        for i in range(first, n):
            held = self.pages.register(keys[i], seq.pages[i])
            if held != seq.pages[i]:
                self.pages.incref([held])
                self.pages.decref([seq.pages[i]])
                seq.pages[i] = held
        return n

    def reserve(self, seq: Sequence, n_tokens: int) -> None:
        """Make seq's pages cover n_tokens tokens, all writable from num_computed on
        (before load_pages / load_partial). Raises OutOfPages, changing nothing."""
        self._make_writable([(seq, n_tokens)])

    def _ensure_pages(self, seq: Sequence, n_tokens: int) -> None:
        # daemon/engine.py's restore was written against this name before `reserve`
        # existed; it stays until the engine calls `reserve`.
        self.reserve(seq, n_tokens)

    def read_pages(self, page_ids: list[int]) -> torch.Tensor:
        """Copy of whole pages: [n, n_attn, 2, block_size, kv_heads, head_dim]."""
        idx = torch.as_tensor(page_ids, dtype=torch.long, device=self.device)
        return self.state.kv.index_select(0, idx)

    def load_pages(self, page_ids: list[int], kv: torch.Tensor) -> None:
        """Write whole pages kv [n, n_attn, 2, block_size, kv_heads, head_dim] into the pool.
        The pages must be held by exactly one owner: shared pages are never written."""
        want = (len(page_ids), *self.spec.kv_shape())
        if tuple(kv.shape) != want:
            raise ValueError(f"pages have shape {tuple(kv.shape)}, expected {want}")
        for p in page_ids:
            if self.pages.refs[p] != 1:
                raise ValueError(f"page {p} has {self.pages.refs[p]} holders; only a page "
                                 "held by one sequence may be written")
        idx = torch.as_tensor(page_ids, dtype=torch.long, device=self.device)
        self.state.kv.index_copy_(0, idx, kv.to(self.device, self.state.kv.dtype))

    def read_partial(self, seq: Sequence) -> torch.Tensor:
        """KV of the tokens in seq's last, partial page: [n_attn, 2, r, kv_heads, head_dim]
        with r = num_computed % block_size (r may be 0)."""
        full, r = divmod(seq.num_computed, self.block_size)
        if r == 0:
            return self.state.kv.new_empty(self.spec.kv_shape(0))
        return self.state.kv[seq.pages[full], :, :, :r].clone(memory_format=torch.contiguous_format)

    def load_partial(self, seq: Sequence, position: int, kv: torch.Tensor) -> None:
        """Write the KV of tokens [position - r, position) (r = position % block_size),
        kv [n_attn, 2, r, kv_heads, head_dim], into the page that holds them. Call after
        reserve(seq, position)."""
        full, r = divmod(position, self.block_size)
        if tuple(kv.shape) != self.spec.kv_shape(r):
            raise ValueError(f"partial page KV has shape {tuple(kv.shape)}, "
                             f"expected {self.spec.kv_shape(r)} for position {position}")
        if r == 0:
            return
        if len(seq.pages) <= full or self.pages.is_shared(seq.pages[full]):
            raise ValueError(f"sequence {seq.id} has no writable page for position {position}: "
                             "reserve it first")
        self.state.kv[seq.pages[full], :, :, :r] = kv.to(self.device, self.state.kv.dtype)

    def read_recurrent(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of a slot's conv state [n_rec, conv_dim, K-1] and ssm state
        [n_rec, v_heads, k_head_dim, v_head_dim] (float32)."""
        self._need_recurrent()
        return self.state.conv[slot].clone(), self.state.ssm[slot].clone()

    def load_recurrent(self, slot: int, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        self._need_recurrent()
        if tuple(conv.shape) != self.spec.conv_shape() or tuple(ssm.shape) != self.spec.ssm_shape():
            raise ValueError(f"recurrent state has shapes {tuple(conv.shape)}, {tuple(ssm.shape)}; "
                             f"expected {self.spec.conv_shape()}, {self.spec.ssm_shape()}")
        self.state.conv[slot] = conv.to(self.device, self.state.conv.dtype)
        self.state.ssm[slot] = ssm.to(self.device, self.state.ssm.dtype)

    # ---- internals -------------------------------------------------------------------

    def _n_pages(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def _plan(self, seq: Sequence, end: int) -> tuple[list[int], int]:
        """(indices of seq's pages to copy before writing tokens num_computed..end,
        number of pages to allocate: those copies plus new pages)."""
        first = seq.num_computed // self.block_size
        have = len(seq.pages)
        copies = [i for i in range(first, min(have, self._n_pages(end)))
                  if self.pages.is_shared(seq.pages[i])]
        return copies, len(copies) + max(0, self._n_pages(end) - have)

    def _make_writable(self, targets: list[tuple[Sequence, int]]) -> None:
        """Give each sequence private pages up to its target length; all or nothing."""
        plans = [self._plan(seq, end) for seq, end in targets]
        fresh = iter(self.pages.alloc(sum(n for _, n in plans)))
        for (seq, end), (copies, _) in zip(targets, plans):
            for i in copies:
                new = next(fresh)
                if self.state.kv is not None:
                    self.state.kv[new] = self.state.kv[seq.pages[i]]
                self.pages.decref([seq.pages[i]])
                seq.pages[i] = new
            grow = self._n_pages(end) - len(seq.pages)
            if grow > 0:
                seq.pages += [next(fresh) for _ in range(grow)]
        assert next(fresh, None) is None

    def _need_recurrent(self) -> None:
        if self.state.conv is None:
            raise ValueError("this model has no recurrent layers")
