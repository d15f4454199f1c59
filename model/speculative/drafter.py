"""The draft model: a small model with the target's vocabulary that proposes the next
few tokens greedily, for the target to verify in one step (llama.cpp's draft-simple).

The drafter keeps one sequence of its own per target sequence (its own runner, pages
and recurrent cells; nothing of it is cached) and follows the target's tokens: each
`propose` first computes what the target accepted since the last one, then drafts.
`keep` takes back what the target did not accept."""

from __future__ import annotations

from dataclasses import dataclass

from ckptd.model.runner import Mark, Runner
from ckptd.model.sequence import Sequence
from ckptd.model.spec import OutOfCells
from ckptd.model.speculative.params import DraftLimits

TOP_K = 10      # the draft's probability of a token is over its top 10 (llama.cpp's)
VOCAB_SLACK = 128   # vocabularies may differ in size by this much (llama.cpp's limit)


@dataclass(eq=False)
class _Track:
    seq: Sequence
    mark: Mark | None = None      # where the last draft started
    drafted: int = 0              # tokens proposed by the last draft


class Drafter:
    def __init__(self, model, num_pages: int, num_cells: int, block_size: int = 16,
                 step_tokens: int = 256, max_seq_pages: int | None = None) -> None:
        self.runner = Runner(model, num_pages, num_cells, block_size,
                             max_batch_tokens=step_tokens, max_seq_pages=max_seq_pages)
        self.B, self.step_tokens = block_size, step_tokens
        self.free = list(range(num_pages - 1, -1, -1))
        self.tracks: dict[int, _Track] = {}

    def propose(self, asks: list[tuple[int, list[int], DraftLimits]]) -> list[list[int]]:
        """For each (key, tokens, limits): up to limits.n_max tokens to follow `tokens`
        (the target's, its last one not computed yet), each the draft's most likely,
        stopping at one it gives less than p_min; [] when shorter than n_min, or while
        the draft still catches up with a long prompt (step_tokens a step, all sequences
        together), or has no room. The sequences draft together: one draft step for
        all per drafted position."""
        out: list[list[int]] = [[] for _ in asks]
        work, drafting, budget = [], [], self.step_tokens
        for i, (key, tokens, limits) in enumerate(asks):
            t = self._follow(key, tokens)
            if t is None:
                continue
            seq = t.seq
            todo = len(tokens) - seq.num_computed
            if todo > budget:                     # a long prompt: part of it this step
                if budget and self._grow(seq, seq.num_computed + budget):
                    work.append((seq, budget))
                    budget = 0
                continue
            if self._grow(seq, len(tokens) + limits.n_max):
                work.append((seq, todo))
                drafting.append((i, t, limits))
                budget -= todo
        if not work:
            return out
        logits = self.runner.step(work)
        rows = {seq.id: logits[j] for j, (seq, _) in enumerate(work)}
        for _, t, _ in drafting:
            t.mark, t.drafted = self.runner.mark(t.seq), 0
        while drafting:
            going, step = [], []
            for i, t, limits in drafting:
                top = rows[t.seq.id].topk(min(TOP_K, rows[t.seq.id].numel()))
                if float(top.values.softmax(-1)[0]) < limits.p_min:
                    continue
                out[i].append(int(top.indices[0]))
                t.drafted += 1
                if t.drafted < limits.n_max:
                    t.seq.tokens.append(out[i][-1])
                    going.append((i, t, limits))
                    step.append((t.seq, 1))
            if step:
                logits = self.runner.step(step)
                rows = {seq.id: logits[j] for j, (seq, _) in enumerate(step)}
            drafting = going
        for i, (key, _, limits) in enumerate(asks):
            if len(out[i]) < max(limits.n_min, 1):
                out[i] = []
                self.keep(key, 0)             # what it computed of a dropped draft
        return out

    def _follow(self, key: int, tokens: list[int]) -> _Track | None:
        """The draft's sequence for `key`, its tokens made the target's (those it
        computed are the same by construction); None when it can't draft now."""
        t = self.tracks.get(key)
        if t is None:
            seq = Sequence([])
            try:
                self.runner.attach(seq)
            except OutOfCells:
                return None
            t = self.tracks[key] = _Track(seq)
        seq = t.seq
        new = tokens[seq.num_computed:]
        # none left to compute never happens (keep leaves one); an id only the model
        # has (the draft's vocabulary may be shorter): either way, start anew
        if not new or max(new) >= self.runner.vocab_size:
            self.release(key)
            return None
        del seq.tokens[seq.num_computed:]
        seq.tokens += new
        return t

    def keep(self, key: int, kept: int) -> None:
        """The target kept `kept` of the last draft's tokens: the draft's state goes back
        to the last of them it computed (a hybrid's to where the draft started: the
        next propose computes the kept ones with the target's next token)."""
        t = self.tracks.get(key)
        if t is None or t.mark is None:
            return
        seq, mark = t.seq, t.mark
        valid = mark.position + min(kept, max(t.drafted - 1, 0))
        if valid < seq.num_computed:
            self.runner.rewind(seq, mark, mark.position if mark.conv is not None else valid)
        del seq.tokens[seq.num_computed:]
        t.mark, t.drafted = None, 0

    def release(self, key: int) -> None:
        """The target sequence ended: its draft's pages and cell go back."""
        t = self.tracks.pop(key, None)
        if t is not None:
            self.free += t.seq.pages
            t.seq.pages = []
            self.runner.detach(t.seq)

    def _grow(self, seq: Sequence, end: int) -> bool:
        """Pages for the first `end` tokens; False (holding what it had) when none are left."""
        need = -(-end // self.B) - len(seq.pages)
        if need > len(self.free):
            return False
        for _ in range(max(need, 0)):
            seq.pages.append(self.free.pop())
        return True


def check_vocab(target_tok, draft_tok, target_vocab: int, draft_vocab: int) -> None:
    """ValueError (one line) unless the draft's vocabulary is the target's: sizes within
    VOCAB_SLACK, the same begin and end tokens, and the same token for every id both have."""
    if abs(target_vocab - draft_vocab) > VOCAB_SLACK:
        raise ValueError(f"--model-draft: its vocabulary ({draft_vocab} tokens) is not the "
                         f"model's ({target_vocab})")
    if (target_tok.bos_id, target_tok.eos_id) != (draft_tok.bos_id, draft_tok.eos_id):
        raise ValueError("--model-draft: its begin/end tokens differ from the model's")
    a, b = target_tok.tok.get_vocab(), draft_tok.tok.get_vocab()
    by_id = {i: s for s, i in b.items()}
    n = min(len(a), len(b))
    for s, i in a.items():
        if i < n and by_id.get(i) != s:
            raise ValueError(f"--model-draft: token {i} is {by_id.get(i)!r} in the draft, "
                             f"{s!r} in the model: not the same vocabulary")
