"""Run whole prompts through a model without the runner: for tests and tools.

Pages are taken in order (sequence i of a batch gets its own contiguous range)
and sequence i uses recurrent cell i.
"""

from __future__ import annotations

import torch

from ckptd.model.batch import SeqChunk, StepBatch
from ckptd.model.state import DeviceState


class Scratch:
    """A DeviceState plus the bookkeeping for a few sequences fed in chunks."""

    def __init__(self, model, block_size: int = 16, max_tokens: int = 4096, n_seqs: int = 1):
        self.model = model
        self.B = block_size
        self.pages_per_seq = -(-max_tokens // block_size)
        self.state = DeviceState(model.state_spec(block_size), self.pages_per_seq * n_seqs, n_seqs,
                                 model.device)
        self.lengths = [0] * n_seqs

    def table(self, seq: int, n_tokens: int) -> torch.Tensor:
        first = seq * self.pages_per_seq
        return torch.arange(first, first + -(-n_tokens // self.B), dtype=torch.int32,
                            device="cpu")

    def feed(self, chunks: dict[int, list[int]], all_logits: bool = False,
             lora: dict[int, tuple[float, ...]] | None = None) -> torch.Tensor:
        """Append chunks[seq] tokens to each named sequence in one step. Returns logits
        [n_tokens, vocab] of every token (all_logits) or of each chunk's last token.
        lora: LoRA adapter scales of the named sequences (model/lora)."""
        ids, seqs, logit_idx = [], [], []
        for seq, toks in chunks.items():
            start = len(ids)
            ctx = self.lengths[seq]
            ids += toks
            seqs.append(SeqChunk(start, len(toks), ctx, self.table(seq, ctx + len(toks)), seq))
            logit_idx += range(start, start + len(toks)) if all_logits else [start + len(toks) - 1]
            self.lengths[seq] += len(toks)
        scales = None if lora is None else [lora.get(seq, ()) for seq in chunks]
        batch = StepBatch.build(seqs, ids, logit_idx, self.B, self.state.device, lora=scales,
                                dtype=self.model.dtype)
        return self.model(batch, self.state)


def prompt_logits(model, tokens: list[int], block_size: int = 16,
                  lora: tuple[float, ...] = ()) -> torch.Tensor:
    """Logits [T, vocab] of every position of `tokens`, prefilled in one step (with LoRA
    adapter scales `lora`)."""
    return Scratch(model, block_size, len(tokens) + block_size).feed(
        {0: tokens}, all_logits=True, lora={0: lora})
