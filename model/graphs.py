"""CUDA graphs for decode steps, as vLLM, SGLang and gpt-fast run them.

A decode step of a small batch is dozens of short kernels per layer; launching them
one by one from Python costs more than running them. A graph records one decode
step per batch size (`BUCKETS` up to the runner's sequences) and replays it with one
launch. A step of n sequences runs the graph of the next bucket up: its inputs are
built padded to that many rows (model/batch.py: Padding; padded rows write to a page
and a recurrent cell no sequence holds) and with page tables as wide as the longest
context, copied into the graph's input buffers (every input tensor is a view of
them), replayed, and the first n rows of its logits read.

A graph is captured the first time its bucket is needed, on a batch of padded rows
only, so capturing never advances a real sequence. Graphs share one memory pool.
`capture=False` runs the same static buffers eagerly instead: the CPU tests check
padding, buffers and bucketing that way; the capture itself needs CUDA
(tools/gpu_check.sh runs the graph-vs-eager test there).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ckptd.model.batch import Padding, SeqChunk, StepBatch

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass
class _Graph:
    static: StepBatch                  # the graph reads these buffers
    logits: torch.Tensor               # and leaves its output here
    graph: object | None               # torch.cuda.CUDAGraph; None when run eagerly


class DecodeGraphs:
    def __init__(self, model, state, block_size: int, max_batch: int, width: int,
                 pad_page: int, pad_cell: int, capture: bool = True) -> None:
        if max_batch < 1 or width < 1:
            raise ValueError(f"need max_batch and width >= 1, got {max_batch}, {width}")
        self.model, self.state, self.block_size = model, state, block_size
        self.buckets = sorted({b for b in BUCKETS if b < max_batch} | {max_batch})
        self.width, self.pad_page, self.pad_cell = width, pad_page, pad_cell
        self.capture = capture
        self.graphs: dict[int, _Graph] = {}
        self._pool = None

    def bucket(self, n: int) -> int | None:
        """The batch size a decode of n sequences runs at; None: too many, run eagerly."""
        return next((b for b in self.buckets if b >= n), None)

    def fits(self, seqs: list[SeqChunk]) -> bool:
        return bool(seqs) and self.bucket(len(seqs)) is not None and all(
            s.q_len == 1 and len(s.page_table) <= self.width and s.mrope is None
            and not s.images for s in seqs)

    def run(self, seqs: list[SeqChunk], input_ids: list[int]) -> torch.Tensor:
        """Logits [len(seqs), vocab] of one decode step (fits(seqs) must hold)."""
        rows = self.bucket(len(seqs))
        pad = Padding(rows, self.width, self.pad_page, self.pad_cell)
        batch = StepBatch.build(seqs, input_ids, list(range(len(seqs))), self.block_size,
                                self.state.device, pad)
        g = self.graphs.get(rows) or self._record(rows)
        for static, fresh in zip(g.static.buffers, batch.buffers):
            static.copy_(fresh)
        if g.graph is not None:
            g.graph.replay()
        else:       # host ints are read only off the Triton path: give this step's
            eager = replace(g.static, seqs=batch.seqs, varlen=replace(
                g.static.varlen, ctx=batch.varlen.ctx, tables=batch.varlen.tables))
            g.logits.copy_(self.model(eager, self.state))
        return g.logits[:len(seqs)]

    def _record(self, rows: int) -> _Graph:
        pad = Padding(rows, self.width, self.pad_page, self.pad_cell)
        static = StepBatch.build([], [], [], self.block_size, self.state.device, pad)
        if not self.capture:
            g = _Graph(static, self.model(static, self.state).clone(), None)
        else:
            # a first run compiles the Triton kernels and makes its lazy allocations, off
            # the capture (only padded rows: no real sequence's state moves)
            side = torch.cuda.Stream(self.state.device)
            side.wait_stream(torch.cuda.current_stream(self.state.device))
            with torch.cuda.stream(side):
                self.model(static, self.state)
            torch.cuda.current_stream(self.state.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the store's threads may use CUDA (host copies) meanwhile
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                logits = self.model(static, self.state)
            self._pool = graph.pool()
            g = _Graph(static, logits, graph)
        self.graphs[rows] = g
        return g
