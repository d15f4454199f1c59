"""Images in the cached context, through the engine over a real store: a conversation
with an image in turn 1 and another in turn 2 gives the same tokens cached as
uncached, each turn restoring the longest prefix, again from disk alone after a
restart; no snapshot falls inside an image; the same picture hits whatever bytes carry
it, another picture of the same size never does; the encoder runs once per image."""

from __future__ import annotations

import pytest
import torch

from ckptd.cache.entry import SNAPSHOT
from ckptd.cache.manager import CacheManager
from ckptd.cache.store import CacheStore
from ckptd.daemon.engine import Engine
from ckptd.daemon.request import Finished, Request
from ckptd.model.loader import load_model
from ckptd.model.runner import Runner
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.text.tokenizer import Tokenizer
from ckptd.model.vision.embedder import ImageEmbedder
from ckptd.model.vision.image import decode, prepare
from ckptd.model.vision.load import load_vision_hf
from ckptd.model.vision.positions import inside
from tests.daemon.engines import made
from tests.images import encoded

B, STEP = 8, 40
ANSWER = 6


@pytest.fixture(scope="module")
def parts(tiny_vision):
    folder = tiny_vision()[0]
    return load_model(folder), load_vision_hf(folder), Tokenizer.from_dir(folder)


def _engine(parts, path, **store_options) -> Engine:
    model, encoder, tok = parts
    # room for one whole image beyond a step's budget (the daemon sizes it the same way)
    runner = Runner(model, 512, 2, B, max_batch_tokens=STEP + 256)
    runner.embedder = ImageEmbedder(encoder, model.dtype)
    store = CacheStore(path, runner.spec, model.fingerprint, **store_options) if path else None
    cache = CacheManager(runner, runner.spec, 512, model.fingerprint, store, 32, 16, 4.0)
    eng = Engine(runner, cache, tok, max_running=2, step_tokens=STEP)
    made.append(eng)
    return eng


class Conversation:
    """Token prompts with images, built turn by turn as a chat template would."""

    def __init__(self, encoder, seed: int = 0) -> None:
        self.cfg = encoder.config
        self.gen = torch.Generator().manual_seed(seed)
        self.tokens: list[int] = []
        self.images: list[tuple[int, object]] = []     # (start, Prepared)

    def text(self, n: int) -> Conversation:
        self.tokens += torch.randint(10, 500, (n,), generator=self.gen).tolist()
        return self

    def image(self, data: bytes) -> Conversation:
        img = prepare(decode(data), self.cfg.processing)
        self.tokens.append(self.cfg.vision_start_token_id)
        self.images.append((len(self.tokens), img))
        self.tokens += [self.cfg.image_token_id] * img.tokens(self.cfg.spatial_merge_size)
        self.tokens.append(self.cfg.vision_end_token_id)
        return self

    def spans(self, embedder):
        return tuple(embedder.span(img, s) for s, img in self.images)


def _ask(eng: Engine, conv: Conversation, use_cache: bool = True) -> tuple[list[int], Finished]:
    out, fin = [], []
    req = Request(list(conv.tokens), SamplingParams(max_tokens=ANSWER, ignore_eos=True),
                  lambda ev: fin.append(ev) if isinstance(ev, Finished) else out.append(ev.token),
                  use_cache=use_cache, images=conv.spans(eng.runner.embedder))
    eng.submit(req)
    while not fin:
        eng.step()
    assert fin[0].reason in ("stop", "length"), fin[0]
    return out, fin[0]


TURNS = (lambda c: c.text(30).image(encoded(300, 200, seed=1)).text(20),
         lambda c: c.text(10).image(encoded(90, 150, seed=2)).text(15),
         lambda c: c.text(12))


def _conversation(eng: Engine, parts, use_cache: bool = True):
    """Three turns: an image in turn 1, another (other size) in turn 2, text in turn 3;
    each turn's prompt is the last one, its answer and the new message."""
    conv = Conversation(parts[1])
    answers, stats = [], []
    for turn in TURNS:
        if answers:
            conv.tokens += answers[-1]
        turn(conv)
        tokens, fin = _ask(eng, conv, use_cache)
        answers.append(tokens)
        stats.append((len(conv.tokens), fin.stats.cache_n, list(conv.images)))
    return answers, stats


def test_conversation_cached_equals_uncached(parts, tmp_path):
    want, _ = _conversation(_engine(parts, None), parts, use_cache=False)
    eng = _engine(parts, tmp_path / "cache")
    got, stats = _conversation(eng, parts)
    assert got == want
    # each turn restored the last turn's prompt and answer (its final checkpoint)
    for (prev_len, _, _), (_, cached, _) in zip(stats, stats[1:]):
        assert cached >= prev_len + ANSWER - 1
    again, stats2 = _conversation(eng, parts)              # RAM tier: all of each prompt
    assert again == want and all(c >= n - 1 for n, c, _ in stats2)
    _no_snapshot_inside_images(eng.cache.store, stats[-1][2])
    assert eng.runner.embedder.images_encoded == 2         # each image once
    eng.cache.close()
    eng = _engine(parts, tmp_path / "cache", host_budget=0)   # a restart: disk only
    third, stats3 = _conversation(eng, parts)
    assert third == want and all(c >= n - 1 for n, c, _ in stats3)
    assert eng.runner.embedder.images_encoded == 0         # every image token restored


def _no_snapshot_inside_images(store, images) -> None:
    store.flush()
    snaps = [e for e in store.admin.entries(limit=10 ** 6) if e.kind == SNAPSHOT]
    assert snaps
    after = 0
    for e in snaps:
        for start, img in images:
            assert not start < e.position < start + img.tokens(2), (e.position, start)
        if e.next_position is not None and e.next_position != e.position:
            after += 1
    assert after, "no snapshot after an image recorded its M-RoPE position"


def test_same_picture_hits_other_picture_misses(parts, tmp_path):
    """The same pixels as PNG and as BMP restore past the image; a different picture of
    the same size restores only up to it (its placeholder tokens are the same)."""
    eng = _engine(parts, tmp_path / "cache")
    first = Conversation(parts[1]).text(20).image(encoded(200, 160, seed=5)).text(12)
    _ask(eng, first)
    start = first.images[0][0]
    same = Conversation(parts[1]).text(20).image(encoded(200, 160, seed=5, fmt="BMP")).text(12)
    assert same.tokens == first.tokens
    tokens, fin = _ask(eng, same)
    assert fin.stats.cache_n >= start + same.images[0][1].tokens(2)
    other = Conversation(parts[1]).text(20).image(encoded(200, 160, seed=6)).text(12)
    assert other.tokens == first.tokens              # equal placeholders, other pixels
    got, fin = _ask(eng, other)
    assert fin.stats.cache_n <= start
    want, _ = _ask(_engine(parts, None), other, use_cache=False)
    assert got == want
    assert eng.runner.embedder.images_encoded == 2


def test_encoder_output_is_reused_after_other_text(parts, tmp_path):
    """A second prompt with the same image after different text recomputes the text
    but not the encoder; an image is never split across prefill chunks."""
    eng = _engine(parts, tmp_path / "cache")
    chunks: list[tuple[int, int, object]] = []
    run = eng.runner.run

    def spy(work, *args, **kw):
        chunks.extend((seq.num_computed, n, inside(seq.images, seq.num_computed + n))
                      for seq, n in work)
        return run(work, *args, **kw)
    eng.runner.run = spy
    a = Conversation(parts[1], seed=1).text(37).image(encoded(300, 200, seed=9)).text(30)
    b = Conversation(parts[1], seed=2).text(45).image(encoded(300, 200, seed=9)).text(30)
    _ask(eng, a)
    _, fin = _ask(eng, b)
    assert fin.stats.cache_n < b.images[0][0]
    assert eng.runner.embedder.images_encoded == 1 and eng.runner.embedder.hits == 1
    assert a.images[0][1].tokens(2) > STEP               # larger than a step's budget
    assert [c for c in chunks if c[2] is not None] == []  # no chunk ends inside an image
    assert any(n > STEP for _, n, _ in chunks)            # an image took a whole step
