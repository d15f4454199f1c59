"""Speculative decoding (daemon/speculation.py): with a draft model the answer is the
one decoding without it gives — greedy and seeded sampling, llama and hybrid models,
a draft that agrees and one that never does — and the cache after a speculative run
restores to the uncached answer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckptd.cache.manager import CacheManager
from ckptd.cache.store import CacheStore
from ckptd.daemon.config import ServeConfig
from ckptd.daemon.engine import Engine
from ckptd.daemon.http.errors import ApiError
from ckptd.daemon.http.fields import Fields
from ckptd.daemon.http.sampling import draft_limits
from ckptd.daemon.request import Finished, Request
from ckptd.daemon.speculation import SpecConfig, Speculation
from ckptd.model.loader import load_model
from ckptd.model.runner import Runner
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.speculative.drafter import Drafter, check_vocab
from ckptd.model.speculative.params import DraftLimits, conditional, synth_rates
from ckptd.model.text.tokenizer import Tokenizer
from ckptd.tools.make_tiny import make_tiny
from tests.daemon.daemon_proc import start
from tests.daemon.engines import made

B, STEP, SLOTS = 8, 48, 3
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(20, 57)), [300, 301]]
GREEDY = SamplingParams(max_tokens=14, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=14, temperature=0.9, top_k=8, seed=4242, ignore_eos=True)


@pytest.fixture(scope="module")
def other_dir(tmp_path_factory):
    """A tiny llama of other random weights, the same vocabulary: a draft that the
    model almost never agrees with."""
    return make_tiny("llama", tmp_path_factory.mktemp("tiny-other"), seed=7)


def engine(model, tok, draft=None, path=None, limits=DraftLimits(4, 0, 0.0), synth=()):
    runner = Runner(model, 256, SLOTS, B, max_batch_tokens=STEP + SLOTS * 8)
    store = CacheStore(path, runner.spec, model.fingerprint) if path else None
    cache = CacheManager(runner, runner.spec, 256, model.fingerprint, store, 32)
    spec = None
    if draft is not None:
        spec = Speculation(Drafter(draft, 256, SLOTS, B, STEP), runner,
                           SpecConfig(limits, conditional(synth)), frozenset(tok.eos_ids))
    eng = Engine(runner, cache, tok, max_running=SLOTS, step_tokens=STEP, spec=spec)
    made.append(eng)          # stopped, checked (sanity_check) and closed after the test
    return eng


def run(eng, prompts, params):
    """Each prompt's tokens and final stats, all running together."""
    out = [([], []) for _ in prompts]
    for (tokens, ends), prompt in zip(out, prompts):
        def emit(ev, tokens=tokens, ends=ends):
            (ends.append(ev) if isinstance(ev, Finished) else tokens.append(ev.token))
        eng.submit(Request(list(prompt), params, emit))
    while not all(ends for _, ends in out):
        eng.step()
    for _, ends in out:
        assert ends[0].reason in ("stop", "length"), ends[0]
    return [tokens for tokens, _ in out], [ends[0].stats for _, ends in out]


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_same_answer_with_a_draft_that_agrees(tiny_dir, tiny_model, params):
    tok = Tokenizer.from_dir(tiny_dir)
    want, _ = run(engine(tiny_model, tok), PROMPTS, params)
    got, stats = run(engine(tiny_model, tok, tiny_model), PROMPTS, params)
    assert got == want
    assert all(s.draft_n > 0 for s in stats)
    assert sum(s.draft_n_accepted for s in stats) > 0
    assert all(s.timings()["draft_n"] == s.draft_n for s in stats)


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_same_answer_with_a_draft_that_disagrees(tiny_dir, tiny_model, other_dir, params):
    """Mostly rejected drafts: each step takes back KV and, on a hybrid, the recurrent
    state; the answer does not change."""
    tok = Tokenizer.from_dir(tiny_dir)
    want, _ = run(engine(tiny_model, tok), PROMPTS, params)
    got, stats = run(engine(tiny_model, tok, load_model(other_dir)), PROMPTS, params)
    assert got == want
    drafted = sum(s.draft_n for s in stats)
    assert drafted > 0 and sum(s.draft_n_accepted for s in stats) < drafted


def _shifted_head(src, out):
    """The model with its output rows shifted by one token: the same states, so its
    greedy choice is always the model's choice minus one, never the model's."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, out)
    w = load_file(str(out / "model.safetensors"))
    w["lm_head.weight"] = torch.roll(w["lm_head.weight"], -1, dims=0).contiguous()
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_a_draft_that_agrees_is_fully_accepted(tiny_dir, tiny_model):
    """The model drafting for itself at greedy: every drafted token is the model's own
    choice, so every one is kept (an acceptance that broke after the first token of a
    draft would keep fewer)."""
    tok = Tokenizer.from_dir(tiny_dir)
    want, _ = run(engine(tiny_model, tok), PROMPTS, GREEDY)
    got, stats = run(engine(tiny_model, tok, tiny_model), PROMPTS, GREEDY)
    assert got == want
    for s in stats:
        assert s.draft_n > 0 and s.draft_n_accepted == s.draft_n, s.timings()


def test_a_draft_that_never_agrees_is_fully_rejected(tiny_dir, tiny_model, tmp_path):
    tok = Tokenizer.from_dir(tiny_dir)
    draft = load_model(_shifted_head(tiny_dir, tmp_path / "shifted"))
    want, _ = run(engine(tiny_model, tok), PROMPTS, GREEDY)
    got, stats = run(engine(tiny_model, tok, draft), PROMPTS, GREEDY)
    assert got == want
    for s in stats:
        assert s.draft_n > 0 and s.draft_n_accepted == 0, s.timings()


def test_a_tiny_draft_for_smollm2_gives_its_tokens(tmp_path):
    """SmolLM2 served with a draft of another model (a tiny random llama with SmolLM2's
    vocabulary, `ckptd make-tiny --vocab-of`): the greedy tokens of no draft."""
    from ckptd.model.default import default_model_path
    draft = make_tiny("llama", tmp_path / "draft", vocab_of=default_model_path())
    d = start(None, tmp_path / "cache", "--model-draft", str(draft), "--spec-draft-n-max",
              "4", "--spec-draft-p-min", "0", "--max-context", "512", "--parallel", "1",
              env={"OMP_NUM_THREADS": "1"})
    try:
        body = {"prompt": "The capital of France is", "n_predict": 16, "temperature": 0,
                "return_tokens": True, "ignore_eos": True, "cache_prompt": False}
        on = d.post("/completion", body, timeout=300).json
        off = d.post("/completion", {**body, "speculative.n_max": 0}, timeout=300).json
        assert on["tokens"] == off["tokens"] and len(on["tokens"]) == 16
        t = on["timings"]
        assert t["draft_n"] > 0 and t["draft_n_accepted"] < t["draft_n"], t
    finally:
        assert d.stop() == 0, d.output()


def test_hybrid_draft_rewinds_its_own_state(tiny_hybrid_dir, tiny_llama_dir):
    """A hybrid drafting for a llama: the draft's recurrent state goes back to where its
    draft started whenever the model does not keep all of it."""
    tok = Tokenizer.from_dir(tiny_llama_dir)
    target = load_model(tiny_llama_dir)
    want, _ = run(engine(target, tok), PROMPTS, GREEDY)
    got, stats = run(engine(target, tok, load_model(tiny_hybrid_dir)), PROMPTS, GREEDY)
    assert got == want and sum(s.draft_n for s in stats) > 0


@pytest.mark.parametrize("agrees", [True, False], ids=["agreeing", "disagreeing"])
def test_cache_after_a_speculative_run_restores_the_uncached_answer(tiny_dir, tiny_model,
                                                                    other_dir, tmp_path,
                                                                    agrees):
    """The checkpoints and pages a speculative run leaves (its prompt's, its answer's)
    hold only kept tokens: the next turn restored from them answers as an uncached run
    does."""
    tok = Tokenizer.from_dir(tiny_dir)
    draft = tiny_model if agrees else load_model(other_dir)
    eng = engine(tiny_model, tok, draft, tmp_path)
    first, _ = run(eng, PROMPTS[:2], GREEDY)
    turns = [p + a + [40, 41, 42] for p, a in zip(PROMPTS, first)]
    got, stats = run(eng, turns, GREEDY)
    assert all(s.cache_n >= len(p) for s, p in zip(stats, PROMPTS))
    want, _ = run(engine(tiny_model, tok), turns, GREEDY)
    assert got == want


def test_request_limits_and_synthetic_acceptance(tiny_llama_dir, other_dir):
    tok = Tokenizer.from_dir(tiny_llama_dir)
    model = load_model(tiny_llama_dir)
    off = SamplingParams(max_tokens=10, ignore_eos=True, draft=DraftLimits(n_max=0))
    _, stats = run(engine(model, tok, model), PROMPTS[:1], off)
    assert stats[0].draft_n == 0 and "draft_n" not in stats[0].timings()
    # n_min above what max_tokens leaves: no draft is ever long enough
    short = SamplingParams(max_tokens=3, ignore_eos=True, draft=DraftLimits(n_min=3))
    _, stats = run(engine(model, tok, model), PROMPTS[:1], short)
    assert stats[0].draft_n == 0
    # rates 0: every drafted token refused, the answer the model's own
    want, _ = run(engine(model, tok), PROMPTS[:1], SEEDED)
    got, stats = run(engine(model, tok, model, synth=(0.0,) * 4), PROMPTS[:1], SEEDED)
    assert got == want and stats[0].draft_n > 0 and stats[0].draft_n_accepted == 0
    # rates 1 and a draft the model disagrees with: every drafted token kept anyway
    draft = load_model(other_dir)
    _, stats = run(engine(model, tok, draft, synth=(1.0,) * 4), PROMPTS[:1], SEEDED)
    assert stats[0].draft_n > 0 and stats[0].draft_n_accepted == stats[0].draft_n


def test_a_different_vocabulary_is_refused(tiny_llama_dir, tmp_path):
    fim = make_tiny("llama", tmp_path / "fim", fim=True)
    a, b = Tokenizer.from_dir(tiny_llama_dir), Tokenizer.from_dir(fim)
    check_vocab(a, a, 512, 512)
    with pytest.raises(ValueError, match="not the same vocabulary|begin/end"):
        check_vocab(a, b, 512, 512)
    with pytest.raises(ValueError, match="vocabulary"):
        check_vocab(a, a, 512, 1024)


@pytest.mark.parametrize("p_min", [0.12, 0.2])
def test_drafts_cut_by_p_min_and_dropped_by_n_min(tiny_dir, tiny_model, p_min):
    """Drafts of every length: stopped early by p_min, the short ones dropped by n_min
    (what the draft computed of them is taken back too)."""
    tok = Tokenizer.from_dir(tiny_dir)
    want, _ = run(engine(tiny_model, tok), PROMPTS, GREEDY)
    got, stats = run(engine(tiny_model, tok, tiny_model, limits=DraftLimits(4, 2, p_min)),
                     PROMPTS, GREEDY)
    assert got == want
    assert all(s.draft_n == 0 or s.draft_n >= 2 for s in stats)


def test_synthetic_rates_as_llama_cpp_resolves_them():
    assert synth_rates(None, None, 4) == ()
    assert synth_rates(1.0, None, 4) == (0.0,) * 4         # only the model's token
    assert synth_rates(5.0, None, 4) == (1.0,) * 4         # every drafted token
    rates = synth_rates(3.4, None, 4)
    assert abs(sum(rates) - 2.4) < 1e-6 and list(rates) == sorted(rates, reverse=True)
    assert conditional((0.5, 0.25, 0.0, 0.0)) == (0.5, 0.5, 0.0, 0.0)
    for length, rates, why in [(2.0, (0.5,) * 4, "mutually exclusive"),
                               (6.0, None, "within"), (None, (0.5, 0.6, 0.1, 0.1), "increase"),
                               (None, (0.5,) * 3, "4 values"), (None, (1.5,) * 4, "within")]:
        with pytest.raises(ValueError, match=why):
            synth_rates(length, rates, 4)


def test_settings_are_checked(tiny_llama_dir):
    draft = str(tiny_llama_dir)
    cfg = ServeConfig(model_draft=draft, spec_draft_n_max=8, spec_synth_rates="0.5," * 7 + "0")
    assert cfg.drafting and len(cfg.synth()) == 8
    assert not ServeConfig(model_draft=draft, spec_type="none").drafting
    for kw, why in [({"spec_type": "ngram-simple", "model_draft": draft}, "not supported"),
                    ({"spec_type": "draft-simple"}, "needs --model-draft"),
                    ({"spec_synth_len": 2.0}, "needs a draft model"),
                    ({"model_draft": "/no/such/model"}, "no such file"),
                    ({"model_draft": draft, "spec_draft_n_max": -1}, "n_max"),
                    ({"model_draft": draft, "spec_draft_p_min": 2.0}, "p_min")]:
        with pytest.raises(ValueError, match=why):
            ServeConfig(**kw)


def test_request_fields_are_checked():
    assert draft_limits(Fields({})) is None
    got = draft_limits(Fields({"speculative.n_max": 2, "speculative.p_min": 0.5}))
    assert got == DraftLimits(2, None, 0.5)
    assert got.over(DraftLimits(8, 1, 0.0)) == DraftLimits(2, 1, 0.5)
    for body in ({"speculative.n_max": -1}, {"speculative.p_min": 1.5},
                 {"speculative.n_min": "3"}):
        with pytest.raises(ApiError) as e:
            draft_limits(Fields(body))
        assert e.value.status == 400 and e.value.param == next(iter(body))


def test_daemon_with_a_draft_model(tiny_hybrid_dir, tiny_llama_dir, tmp_path):
    """llama-server's flags on a real daemon: the same seeded tokens with the draft on
    and off (per request), timings.draft_n; another vocabulary is one line at start."""
    d = start(tiny_hybrid_dir, tmp_path / "cache", "--model-draft", str(tiny_hybrid_dir),
              "--spec-draft-n-max", "4", "--max-context", "256", "--parallel", "2")
    try:
        body = {"prompt": "Paris is", "n_predict": 12, "temperature": 0.7, "top_k": 8,
                "seed": 7, "return_tokens": True, "ignore_eos": True, "cache_prompt": False}
        on = d.post("/completion", body).json
        off = d.post("/completion", {**body, "speculative.n_max": 0}).json
        assert on["tokens"] == off["tokens"]
        assert on["timings"]["draft_n"] > 0 and "draft_n" not in off["timings"]
        bad = d.post("/completion", {**body, "speculative.p_min": 2})
        assert bad.status == 400 and bad.json["error"]["param"] == "speculative.p_min"
    finally:
        assert d.stop() == 0, d.output()
    fim = make_tiny("llama", tmp_path / "fim", fim=True)
    out = subprocess.run([sys.executable, "-m", "ckptd.tools.cli", "serve", "--model",
                          str(tiny_llama_dir), "--model-draft", str(fim), "--cache-dir",
                          str(tmp_path / "c2"), "--port", "0"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "--model-draft" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_draft_sleeps_and_wakes_with_the_model(tiny_hybrid_dir, tmp_path):
    """--sleep-idle-seconds frees the draft model with the model, and a wake-up loads it
    again: the same tokens, drafted, after a sleep."""
    from tests.daemon.test_sleep import _wait_asleep
    d = start(tiny_hybrid_dir, tmp_path / "cache", "--model-draft", str(tiny_hybrid_dir),
              "--max-context", "256", "--sleep-idle-seconds", "1")
    try:
        body = {"prompt": "Paris is", "n_predict": 12, "temperature": 0, "return_tokens": True,
                "ignore_eos": True, "cache_prompt": False}
        before = d.post("/completion", body).json
        _wait_asleep(d)
        after = d.post("/completion", body).json
        assert after["tokens"] == before["tokens"] and after["timings"]["draft_n"] > 0
    finally:
        assert d.stop() == 0, d.output()


def test_no_pages_for_a_draft_decodes_without_it(tiny_llama_dir):
    """When the pages a draft needs are not there, the sequence drops its draft and
    decodes its one token, as it would have without a draft (not a stall)."""
    tok = Tokenizer.from_dir(tiny_llama_dir)
    model = load_model(tiny_llama_dir)
    want, _ = run(engine(model, tok), PROMPTS[:1], GREEDY)
    eng = engine(model, tok, model)
    got, ends = [], []
    eng.submit(Request(list(PROMPTS[0]), GREEDY, lambda ev: (
        ends if isinstance(ev, Finished) else got).append(ev)))
    while not got:                         # the prompt (7 tokens, one page) and 1 token
        eng.step()
    dev = eng.cache.device
    held = dev.alloc(dev.num_free)         # no page left: position 7 fits, a draft won't
    eng.step()
    assert len(got) == 2 and not ends
    dev.decref(held)
    while not ends:
        eng.step()
    assert [ev.token for ev in got] == want[0] and ends[0].stats.draft_n > 0


def test_what_a_draft_kept_goes_when_its_sequence_ends(tiny_llama_dir):
    """Speculation follows the decoding sequences it is given each step: the next
    step after the requests end, the draft model holds no sequence, cell or page of
    theirs, and nothing of them is left in speculation (what sleeping needs)."""
    tok = Tokenizer.from_dir(tiny_llama_dir)
    model = load_model(tiny_llama_dir)
    eng = engine(model, tok, model, synth=(0.9, 0.7, 0.5, 0.3))   # rngs too
    _, stats = run(eng, PROMPTS, SEEDED)
    assert all(st.draft_n > 0 for st in stats)
    eng.step()                         # nothing runs: propose is given no sequence
    spec, drafter = eng.spec, eng.spec.drafter
    assert not drafter.tracks and not drafter.runner.live_cells()
    assert len(drafter.free) == 256
    assert not (spec.rngs or spec.stalled or spec.drafts or spec.decoding)
