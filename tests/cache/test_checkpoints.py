"""Where prefills leave snapshots (a pure plan), and the write queue shedding the least
useful ones first when the disk writer falls behind."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ckptd.cache.checkpoints import (
    TailCosts,
    interval_stops,
    snapshot_budget,
    step_ends,
    tail_budget,
    tail_stops,
)
from ckptd.cache.store.writer import HIGH_SLACK, Writer
from ckptd.model.spec import AttentionSpec, RecurrentSpec, StateSpec


@given(start=st.integers(0, 5000), length=st.integers(1, 300_000),
       interval=st.sampled_from([16, 64, 1024]), max_count=st.integers(0, 40))
def test_interval_stops_are_few_and_dense_near_the_end(start, length, interval, max_count):
    end = start + length
    got = interval_stops(start, end, interval, max_count)
    every = [p for p in range(interval, end, interval) if p > start]
    assert got == sorted(set(got)) and set(got) <= set(every)
    assert len(got) == min(len(every), max_count)
    if got and len(every) > max_count:
        assert got[-1] == every[-1]                       # the nearest to the end
        gaps = [b - a for a, b in zip(got, got[1:])]
        assert gaps == sorted(gaps, reverse=True)         # sparser going back


def test_snapshot_budget_keeps_interval_bytes_within_the_contexts_kv():
    # Qwen3.5-35B-A3B's shapes: 10 attention layers x 2 KV heads x 256 (bf16), 30 Gated
    # DeltaNet layers x 32 heads x 128 x 128 fp32 state
    spec = StateSpec(16, AttentionSpec(10, 2, 256, torch.bfloat16),
                     RecurrentSpec(30, 8192, 4, 32, 128, 128, conv_dtype=torch.bfloat16))
    assert 60e6 < spec.snapshot_bytes() < 70e6 and spec.kv_bytes_per_token() == 20480
    n = snapshot_budget(250_000, spec)
    assert 70 <= n <= 85
    assert n * spec.snapshot_bytes() <= 250_000 * spec.kv_bytes_per_token()
    assert snapshot_budget(100, spec) == 1                # at least one
    assert snapshot_budget(250_000, spec, ratio=0.5) == n // 2


def test_tail_stops_sit_just_before_the_end_above_what_replaces_them():
    assert tail_stops(0, 10_000, 0, 3) == [9_936, 9_744, 8_976]     # 64, 256, 1,024 back
    assert tail_stops(0, 10_000, 0, 1) == [9_936]                   # nearest the end first
    assert tail_stops(9_800, 10_000, 0, 3) == [9_936]               # only what is computed
    assert tail_stops(0, 10_000, 9_900, 3) == [9_936]               # a branch point below
    assert tail_stops(0, 200, 0, 3) == [136] and tail_stops(0, 60, 0, 3) == []
    assert tail_stops(0, 10_000, 0, 0) == [] and tail_stops(0, 10_000, 0, -1) == []


def test_step_ends_are_every_step_counted_again_from_each_stop():
    assert step_ends(0, 3_020, {1_024, 2_048}, 512) == {512, 1_024, 1_536, 2_048, 2_560}
    assert step_ends(0, 1_040, {1_024}, 2_048) == {1_024}
    assert step_ends(100, 1_000, {50, 700, 1_000}, 256) == {356, 612, 700, 956}
    assert step_ends(0, 100, (), 256) == set()


def test_a_tail_where_a_step_ends_anyway_costs_no_step_of_its_own():
    # 3,020 tokens in steps of 512 with interval stops at 1,024 and 2,048: the 1,024
    # rung (1,996..2,764) is served by the step ending at 2,560, the others cost a step
    free = step_ends(0, 3_020, {1_024, 2_048}, 512)
    assert tail_stops(0, 3_020, 0, 3, free) == [2_956, 2_764, 2_560]
    # the bench's 1,040-token prompt: the interval stop at 1,024 serves the 64 rung
    assert tail_stops(0, 1_040, 0, 3, {1_024}) == [1_024, 784, 16]
    assert tail_stops(0, 10_000, 0, 3, {9_990, 9_700}) == [9_990, 9_744, 9_700]


def test_tails_cost_at_most_their_share_of_the_prefill():
    free = {1_024}
    # a step's fixed part is 7 ms, a snapshot's copy 0.1 ms
    def costs(prefill_s):
        return TailCosts(step=0.007, snapshot=0.0001, allowed=0.03 * prefill_s)
    assert tail_stops(0, 1_040, 0, 3, free, costs(0.09)) == [1_024]     # 1K: none more
    assert tail_stops(0, 1_040, 0, 3, free, costs(0.3)) == [1_024, 784]
    assert tail_stops(0, 3_020, 0, 3, {2_560}, costs(0.2)) == [2_560]  # 64 rung: 7.1 > 6 ms
    assert tail_stops(0, 3_020, 0, 3, {2_560}, costs(0.4)) == [2_956, 2_560]
    assert tail_stops(0, 3_020, 0, 3, {2_560}, costs(1.0)) == [2_956, 2_764, 2_560]
    assert tail_stops(0, 3_020, 0, 3, (), TailCosts(0.0, 0.0, 0.0)) == [2_956, 2_764, 1_996]


def test_tail_budget_bounds_tail_bytes_by_the_kv_a_prefill_computes():
    spec = StateSpec(16, AttentionSpec(10, 2, 256, torch.bfloat16),
                     RecurrentSpec(30, 8192, 4, 32, 128, 128, conv_dtype=torch.bfloat16))
    for tokens in (100, 3_000, 5_000, 10_000, 64_000):
        n = tail_budget(tokens, spec)
        assert n * spec.snapshot_bytes() <= tokens * spec.kv_bytes_per_token()
        assert (n + 1) * spec.snapshot_bytes() > tokens * spec.kv_bytes_per_token()
    assert tail_budget(100, spec) == 0                    # a short prompt: none
    assert tail_budget(64_000, spec) >= 3


class GatedCommits:
    """A commit that waits for the test to open it: the disk writer held back."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.items: list = []

    def __call__(self, batch: list) -> int:
        self.open.wait(30)
        self.items += batch
        return 0


def test_a_full_queue_sheds_interval_snapshots_first_and_counts_what_it_shed():
    commits = GatedCommits()
    shed: list = []
    w = Writer(lambda item: item, commits, max_queue_bytes=100, batch=1, on_shed=shed.append)
    try:
        assert w.put("first", 10, label="block")          # taken by the writer, held there
        while not w.pending:
            threading.Event().wait(0.01)
        assert w.put("i1", 40, priority=0, label="interval")
        assert w.put("i2", 40, priority=0, label="interval")
        assert not w.put("i3", 40, priority=0, label="interval")  # over, nothing lower
        assert w.put("end", 60, label="end")              # within the slack: no shedding
        assert w.put("block", 100, label="block")         # sheds i1 and i2, oldest first
        assert shed == ["i1", "i2"]
        assert not w.put("big", HIGH_SLACK * 100, label="block")   # beyond even the slack
        assert dict(w.shed) == {"interval": 3, "block": 1}
    finally:
        commits.open.set()
        w.close()
    assert commits.items == ["first", "end", "block"]


@pytest.mark.parametrize("label", ["end", "branch"])
def test_end_and_branch_snapshots_are_never_shed_for_intervals(label):
    commits = GatedCommits()
    w = Writer(lambda item: item, commits, max_queue_bytes=100, batch=1)
    try:
        assert w.put("first", 10)
        assert w.put(label, 90, label=label)
        assert not w.put("i", 50, priority=0, label="interval")
        assert dict(w.shed) == {"interval": 1}
    finally:
        commits.open.set()
        w.close()
