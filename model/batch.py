"""What the runner hands the model for one step.

One step runs any mix of prefill chunks and single-token decodes. Tokens of all
sequences are packed into one flat dimension N; each sequence's slice of it is a
`SeqChunk`. Before the step, a sequence already holds `ctx_len` tokens of state
(KV in its pages, recurrent state in its cell); the step appends `q_len` more.

`StepBatch.build` makes every tensor the step needs from host ints in one go: the
values are packed into two host buffers (int64 and int32), copied to the model's
device (pinned, asynchronous on CUDA) and sliced there. So every tensor of a step is on the
model's device by construction, and a layer never copies from the host or waits for
the device (the step's one sync is its logits coming back, model/runner.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ckptd.kernels.varlen import CHUNK, Varlen, chunk_bounds
from ckptd.model.lora.apply import Rows

_HOST = torch.device("cpu")


@dataclass
class SeqChunk:
    q_start: int              # offset of this sequence's tokens in the flat batch
    q_len: int                # tokens computed this step (1 for a decode)
    ctx_len: int              # tokens already in this sequence's state
    page_table: torch.Tensor  # host int32 [ceil((ctx_len + q_len) / block_size)] page ids
    cell: int                 # this sequence's recurrent state cell
    shift: int = 0            # rotary position - token index (text after images)
    mrope: torch.Tensor | None = None   # host int64 [3, q_len]: M-RoPE positions of a
    #                                     chunk with image tokens (model/vision/positions.py)
    images: list[tuple[int, torch.Tensor]] | None = None   # (offset in the chunk,
    #                                     embeddings [n, hidden]) replacing token rows


@dataclass
class ImageRows:
    """Rows of the step's input embeddings that images replace: x[index] = values."""
    index: torch.Tensor       # int64 [M] flat token indices, on the model's device
    values: torch.Tensor      # [M, hidden]


@dataclass
class WindowRows:
    """Where the window layers' KV of a step is (model/window_pages.py): each new
    token's flat index in the window pool and the sequences' tables of rooms."""
    kv_index: torch.Tensor      # int64 [N], on the model's device
    varlen: Varlen


@dataclass
class StepBatch:
    seqs: list[SeqChunk]
    input_ids: torch.Tensor     # int64 [N], on the model's device (as all below)
    positions: torch.Tensor     # int64 [N]: rotary positions (token index + shift)
    kv_index: torch.Tensor      # int64 [N]: each token's KV in the pool (page * B + offset)
    logits_index: torch.Tensor  # int64 [M]: flat token indices whose logits are returned
    varlen: Varlen
    buffers: tuple              # (int64, int32) device buffers every tensor above views
    lora: Rows | None = None    # LoRA scales per token (model/lora); None: none is used
    mrope: torch.Tensor | None = None   # int64 [3, N] when a chunk has image tokens
    images: ImageRows | None = None
    window: WindowRows | None = None    # the window layers' (a model with windows)

    @classmethod
    def build(cls, seqs: list[SeqChunk], input_ids: list[int], logits_index: list[int],
              block_size: int, device: torch.device, pad: Padding | None = None,
              lora: list[tuple[float, ...]] | None = None,
              dtype: torch.dtype = torch.float32,
              rooms: list[torch.Tensor] | None = None) -> StepBatch:
        """seqs in flat order (q_start rising, packed without gaps). `pad` appends
        one-token rows up to a fixed batch size and widens the page tables to a fixed
        width, so the layout is the one a captured CUDA graph reads (model/graphs.py).
        `lora`: each sequence's adapter scales (none: ()), made per-token rows of the
        model's `dtype`. `rooms`: each sequence's table of window rooms (host int32, as
        long as its page table), for a model with window layers."""
        B = block_size
        if pad is not None:
            seqs, input_ids, logits_index = pad.apply(seqs, input_ids, logits_index)
        n = len(seqs)
        cu = [0]
        for s in seqs:
            if s.q_start != cu[-1]:
                raise ValueError(f"sequence chunks must be packed in order: chunk at "
                                 f"{s.q_start}, expected {cu[-1]}")
            cu.append(cu[-1] + s.q_len)
        if cu[-1] != len(input_ids):
            raise ValueError(f"{len(input_ids)} token ids for chunks of {cu[-1]} tokens")
        width = max((len(s.page_table) for s in seqs), default=0)
        if pad is not None:
            if width > pad.width:
                raise ValueError(f"a page table of {width} pages is wider than {pad.width}")
            width = pad.width
        if rooms is not None and pad is not None:
            raise ValueError("a step with window rooms is not padded for a graph")
        tables = torch.zeros(n, max(width, 1), dtype=torch.int64, device=_HOST)
        room_tables = None if rooms is None else torch.zeros_like(tables)
        pos, kv_index, room_index = [], [], []
        for i, s in enumerate(seqs):
            table = s.page_table.to(_HOST, torch.int64)
            tables[i, :len(table)] = table
            p = torch.arange(s.ctx_len, s.ctx_len + s.q_len, device=_HOST)
            pos.append(p + s.shift if s.shift else p)
            kv_index.append(table[p // B] * B + p % B)
            if rooms is not None:
                room = rooms[i].to(_HOST, torch.int64)
                room_tables[i, :len(room)] = room
                room_index.append(room[p // B] * B + p % B)
        bos, eos = chunk_bounds(cu, CHUNK)
        empty = torch.zeros(0, dtype=torch.int64, device=_HOST)
        wide = [torch.tensor(input_ids, dtype=torch.int64, device=_HOST),
                torch.cat(pos) if pos else empty, torch.cat(kv_index) if kv_index else empty,
                torch.tensor(logits_index, dtype=torch.int64, device=_HOST),
                torch.tensor([s.cell for s in seqs], dtype=torch.int64, device=_HOST)]
        if rooms is not None:
            wide.append(torch.cat(room_index) if room_index else empty)
        if any(s.mrope is not None for s in seqs):
            wide.append(torch.cat([s.mrope if s.mrope is not None else p.expand(3, -1)
                                   for s, p in zip(seqs, pos)], dim=1).flatten())
        narrow = [torch.tensor(x, dtype=torch.int64, device=_HOST)
                  for x in (cu, [s.ctx_len for s in seqs], bos, eos)] + [tables.flatten()]
        if rooms is not None:
            narrow.append(room_tables.flatten())
        # int64 where torch indexes with it, int32 what the kernels read: two buffers, of
        # which every tensor of the step is a view (a graph's inputs are refilled in place)
        buffers = (torch.cat(wide), torch.cat(narrow).to(torch.int32))
        if device.type == "cuda":
            buffers = tuple(b.pin_memory().to(device, non_blocking=True) for b in buffers)
        elif device != _HOST:
            buffers = tuple(b.to(device) for b in buffers)
        ids, positions, kv_index, logits, state, *rest = \
            buffers[0].split([p.numel() for p in wide])
        cu_t, ctx, bos_t, eos_t, tab, *room_tab = buffers[1].split([p.numel() for p in narrow])
        varlen = Varlen(tuple(cu), tuple(s.ctx_len for s in seqs),
                        tuple(s.page_table for s in seqs), cu_t, ctx, state, tab.view(n, -1),
                        bos_t, eos_t)
        window = None
        if rooms is not None:
            window = WindowRows(rest.pop(0), Varlen(
                varlen.cu, varlen.ctx, tuple(rooms), cu_t, ctx, state,
                room_tab[0].view(n, -1), bos_t, eos_t))
        rows = None if lora is None or pad is not None else \
            Rows.build(lora, [s.q_len for s in seqs], device, dtype)
        return cls(seqs, ids, positions, kv_index, logits, varlen, buffers, rows,
                   rest[0].view(3, -1) if rest else None, _image_rows(seqs, device), window)


def _image_rows(seqs: list[SeqChunk], device: torch.device) -> ImageRows | None:
    index, values = [], []
    for s in seqs:
        for offset, emb in s.images or ():
            index.append(torch.arange(s.q_start + offset, s.q_start + offset + emb.shape[0]))
            values.append(emb)
    if not index:
        return None
    return ImageRows(torch.cat(index).to(device), torch.cat(values).to(device))


@dataclass(frozen=True)
class Padding:
    """Rows up to `rows` sequences, each one token of a sequence of nothing before it
    whose KV and recurrent state go to a page and a cell no sequence is given: a
    padded row computes garbage no real row reads. Tables `width` pages wide."""
    rows: int
    width: int
    page: int
    cell: int

    def apply(self, seqs, input_ids, logits_index):
        if len(seqs) > self.rows or any(s.q_len != 1 for s in seqs):
            raise ValueError(f"padding takes up to {self.rows} one-token sequences")
        n = len(seqs)
        table = torch.tensor([self.page], dtype=torch.int32, device=_HOST)
        extra = [SeqChunk(n + i, 1, 0, table, self.cell) for i in range(self.rows - n)]
        rows = range(n, self.rows)
        return [*seqs, *extra], [*input_ids, *[0] * len(extra)], [*logits_index, *rows]
