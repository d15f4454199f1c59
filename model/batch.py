"""What the runner hands the model for one step.

One step runs any mix of prefill chunks and single-token decodes. Tokens of all
sequences are packed into one flat dimension N; each sequence's slice of it is a
`SeqChunk`. Before the step, a sequence already holds `ctx_len` tokens of state
(KV in its pages, recurrent state in its slot); the step appends `q_len` more.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SeqChunk:
    q_start: int              # offset of this sequence's tokens in the flat batch
    q_len: int                # tokens computed this step (1 for a decode)
    ctx_len: int              # tokens already in this sequence's state
    page_table: torch.Tensor  # int32 [ceil((ctx_len + q_len) / block_size)] page ids
    slot: int                 # this sequence's recurrent state slot


@dataclass
class StepBatch:
    input_ids: torch.Tensor     # int64 [N]
    positions: torch.Tensor     # int64 [N]
    seqs: list[SeqChunk]
    logits_index: torch.Tensor  # int64 [M]: flat token indices whose logits are returned

    @property
    def is_decode_only(self) -> bool:
        return all(s.q_len == 1 for s in self.seqs)
