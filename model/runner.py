"""Runs steps of many sequences (prefill chunks and decodes mixed) on one model.

A Sequence owns a recurrent slot and a list of pages; its first `num_computed`
tokens are in its state. `step` appends tokens to several sequences in one
model call and returns each one's last-token logits.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from model.batch import SeqChunk, StepBatch
from model.pages import PagePool, SlotPool
from model.state import DeviceState

_ids = itertools.count()


@dataclass
class Sequence:
    tokens: list[int]
    slot: int
    pages: list[int] = field(default_factory=list)
    num_computed: int = 0
    id: int = field(default_factory=lambda: next(_ids))


class Runner:
    def __init__(self, model, num_pages: int, num_slots: int, block_size: int = 16) -> None:
        self.model = model
        self.block_size = block_size
        self.spec = model.state_spec(block_size)
        self.state = DeviceState(self.spec, num_pages, num_slots, model.device)
        self.pages = PagePool(num_pages)
        self.slots = SlotPool(num_slots)

    def add(self, tokens: list[int]) -> Sequence:
        slot = self.slots.alloc()
        self.state.reset_slot(slot)
        return Sequence(list(tokens), slot)

    def release(self, seq: Sequence) -> None:
        self.pages.decref(seq.pages)
        seq.pages = []
        self.slots.release(seq.slot)
        seq.slot = -1

    def _ensure_pages(self, seq: Sequence, n_tokens: int) -> None:
        need = -(-n_tokens // self.block_size) - len(seq.pages)
        if need > 0:
            seq.pages += self.pages.alloc(need)

    def step(self, work: list[tuple[Sequence, int]]) -> torch.Tensor:
        """Compute the next n tokens of each (sequence, n); returns logits [len(work), vocab]
        of each sequence's last computed token."""
        ids, pos, chunks, last = [], [], [], []
        for seq, n in work:
            start, end = seq.num_computed, seq.num_computed + n
            if n <= 0 or end > len(seq.tokens):
                raise ValueError(f"sequence {seq.id}: cannot compute tokens {start}..{end} "
                                 f"of {len(seq.tokens)}")
            self._ensure_pages(seq, end)
            chunks.append(SeqChunk(len(ids), n, start,
                                   torch.tensor(seq.pages, dtype=torch.int32), seq.slot))
            ids += seq.tokens[start:end]
            pos += range(start, end)
            last.append(len(ids) - 1)
        batch = StepBatch(torch.tensor(ids), torch.tensor(pos), chunks, torch.tensor(last))
        logits = self.model(batch, self.state)
        for seq, n in work:
            seq.num_computed += n
        return logits
