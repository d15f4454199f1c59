"""Prefix sharing on the device: full KV pages published under their cache block keys
and adopted (refcounted, not copied) by later sequences whose prompt starts with them.

A page is published as soon as it is full and computed (prefill steps, restores,
checkpoints); a full page is never written again, so every sequence with that
prefix can hold the same page. The keys are the store's block keys: they chain the
model fingerprint, block size and tenant salt, so two tenants never share a page.
Pages nobody holds stay findable until the pool reclaims them (least recently used
first, when it runs short), so they are the fastest tier of the cache.
"""

from __future__ import annotations

from ckptd.cache.keys import block_keys
from ckptd.cache.store.store import CacheStore
from ckptd.model.runner import Runner, Sequence


class DevicePrefixes:
    def __init__(self, runner: Runner, store: CacheStore) -> None:
        self.runner, self.store = runner, store
        self.B = runner.block_size
        # The block tokens each published page holds: a hit compares tokens, not just
        # keys (as the store does). A page is re-published before anyone can find it
        # under a new key, so the entry of a findable page is always its own.
        self.tokens_of: list[list[int] | None] = [None] * runner.pages.num_pages

    def start(self, seq: Sequence, keys: list[bytes]) -> None:
        """Attach the sharing state to a new sequence (keys: its prompt's block keys)."""
        seq.block_keys, seq.published = keys, 0

    def keys(self, tokens: list[int], salt: str | None) -> list[bytes]:
        """The block keys of a prompt's full blocks."""
        return block_keys(self.store.root(salt), tokens, self.B)

    def find(self, tokens: list[int], salt: str | None,
             keys: list[bytes] | None = None) -> tuple[list[int], list[bytes]]:
        """(pages holding the prompt's leading full blocks, the prompt's block keys).
        The pages carry no reference: adopt them before the pool allocates again."""
        keys = self.keys(tokens, salt) if keys is None else list(keys)
        tokens = tokens if isinstance(tokens, list) else list(tokens)   # compared as lists
        found = []
        for i, page in enumerate(self.runner.pages.lookup(keys)):
            if self.tokens_of[page] != tokens[i * self.B:(i + 1) * self.B]:
                break
            found.append(page)
        return found, keys

    def adopt(self, seq: Sequence, pages: list[int]) -> None:
        """Start seq from found pages (its first len(pages) full blocks)."""
        self.runner.adopt(seq, pages, len(pages) * self.B)
        seq.published = len(pages)

    def publish(self, seq: Sequence) -> None:
        """Put seq's computed full pages in the prefix table. Where an equal page is there
        already (two sequences computed the same prefix at once), seq switches to it and
        its own copy is freed: the prefix is held once."""
        n = seq.num_computed // self.B
        if n <= seq.published:
            return
        keys = seq.block_keys
        if len(keys) < n:
            # Extend the chain from the last key: generated tokens, or a prompt whose
            # keys were cut at admission. Same bytes as block_keys over the whole prefix.
            prev = keys[-1] if keys else self.store.root(seq.salt)
            keys += block_keys(prev, seq.tokens[len(keys) * self.B:n * self.B], self.B)
        self.runner.publish(seq, keys[:n], first=seq.published)
        for i in range(seq.published, n):
            self.tokens_of[seq.pages[i]] = seq.tokens[i * self.B:(i + 1) * self.B]
        seq.published = n

    def computing(self, keys: list[bytes], prefills: list[Sequence]) -> bool:
        """Whether one of these running prefills is computing a block that a prompt with
        these keys starts with. That prompt then waits and adopts the pages once they are
        computed, instead of computing the same prefix a second time beside it."""
        for seq in prefills:
            theirs = seq.block_keys
            n = 0
            while n < len(keys) and n < len(theirs) and keys[n] == theirs[n]:
                n += 1
            if n * self.B > seq.num_computed:
                return True
        return False
