"""What a loaded daemon serves with, built once at start-up: the model, its tokenizer,
the runner that owns the state tensors, the cache (device pages over the store) and
the engine that drives them."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ckptd.cache.manager import CacheManager
from ckptd.cache.remote.client import RemoteConfig
from ckptd.cache.remote.layout import RemoteURL
from ckptd.cache.remote.tier import RemoteTier
from ckptd.cache.store import CacheStore
from ckptd.daemon import memory
from ckptd.daemon.config import ServeConfig
from ckptd.daemon.engine import Engine
from ckptd.daemon.lora import Adapters
from ckptd.daemon.sleep import Sleep
from ckptd.daemon.speculation import SpecConfig, Speculation
from ckptd.daemon.vision import load_embedder, max_image_tokens
from ckptd.model.config import ModelConfig
from ckptd.model.loader import load
from ckptd.model.lora.adapter import read_adapter
from ckptd.model.lora.apply import Lora
from ckptd.model.placement import Placement, resolve
from ckptd.model.runner import Runner
from ckptd.model.speculative.drafter import Drafter, check_vocab
from ckptd.model.speculative.params import conditional
from ckptd.model.text.tokenizer import Tokenizer

log = logging.getLogger("ckptd")

# Set by the test suite: the engine checks the cache's invariants whenever it goes idle,
# and a daemon that found one broken exits with CHECK_FAILED_EXIT at shutdown.
CHECK_ENV = "CKPTD_CHECK_INVARIANTS"
CHECK_FAILED_EXIT = 70


@dataclass(frozen=True)
class Runtime:
    config: ModelConfig            # the model's, kept while it sleeps (daemon/sleep.py)
    fingerprint: str
    tokenizer: Tokenizer
    runner: Runner
    store: CacheStore
    cache: CacheManager
    engine: Engine
    max_context: int               # tokens per sequence, prompt and answer
    kv_tokens: int                 # tokens the KV pool holds, all sequences together
    source: Path                   # what a wake-up loads again, and how
    where: Placement
    weights: str
    adapters: Adapters = field(default_factory=lambda: Adapters([], []))   # LoRA
    draft: Path | None = None      # the draft model's file (speculative decoding)
    mmproj: Path | None = None     # the vision tower's file (--mmproj)
    kv_dtype: torch.dtype | None = None   # --kv-dtype's, where not the compute dtype
    gemv_activations: str = "fp32"        # --gemv-activations

    @classmethod
    def load(cls, cfg: ServeConfig, path: Path) -> Runtime:
        """Load the model and build everything around it (blocking: seconds)."""
        t0 = time.perf_counter()
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        where = resolve(cfg.device, cfg.dtype)
        model, tok = load(path, where.dtype, where.device, weights=cfg.weights,
                          kv_dtype=_kv_dtype(cfg), gemv_activations=cfg.gemv_activations)
        limit = model.config.max_position_embeddings
        if cfg.max_context and cfg.max_context > limit:
            raise ValueError(f"--max-context {cfg.max_context} is beyond the model's "
                             f"{limit} positions")
        max_context = cfg.max_context or limit
        adapters = _adapters(cfg, model)
        B = cfg.block_size
        spec = model.state_spec(B)
        draft = _draft(cfg, where, tok, model) if cfg.drafting else None
        drafted = cfg.parallel * cfg.spec_draft_n_max if draft else 0
        # with a draft, a page of the budget is one page of each model's KV; a window
        # model's window layers have a pool of their own, sized by their windows
        rooms = memory.window_rooms(spec, cfg.parallel, cfg.step_tokens + drafted)
        page_bytes = spec.page_bytes() - spec.window_page_bytes() + \
            (draft.state_spec(B).page_bytes() if draft else 0)
        sizes = memory.plan(page_bytes, model.device, cfg.kv_budget, cfg.host_budget,
                            -(-max_context // B) + 1, cfg.parallel,
                            (rooms or 0) * spec.window_page_bytes())
        embedder = load_embedder(cfg, path, model, tok, where)
        # a prefill chunk takes an image whole: room for one beyond the step's budget
        image_room = max_image_tokens(embedder) if embedder is not None else 0
        runner = Runner(model, sizes.kv_pages, cfg.parallel, B,
                        max_batch_tokens=cfg.step_tokens + drafted + image_room,
                        graphs=False if cfg.enforce_eager else None,
                        max_seq_pages=-(-max_context // B), window_pages=rooms)
        runner.embedder = embedder
        remote = _remote(cfg, model.fingerprint, runner.spec) if cfg.remote else None
        store = CacheStore(cfg.cache_dir, runner.spec, model.fingerprint,
                           disk_budget=cfg.disk_budget, host_budget=sizes.host_bytes,
                           queue_bytes=cfg.write_queue, remote=remote)
        cache = CacheManager(runner, runner.spec, sizes.kv_pages, model.fingerprint, store,
                             cfg.snapshot_interval, cfg.max_snapshots, cfg.snapshot_budget,
                             cfg.step_tokens)
        speculation = None
        if draft is not None:
            drafter = Drafter(draft, sizes.kv_pages, cfg.parallel, B, cfg.step_tokens,
                              -(-(max_context + cfg.spec_draft_n_max) // B))
            speculation = Speculation(drafter, runner, SpecConfig(cfg.draft_limits(),
                                      conditional(cfg.synth())), frozenset(tok.eos_ids))
        engine = Engine(runner, cache, tok, max_running=cfg.parallel, queue_size=cfg.queue_size,
                        step_tokens=cfg.step_tokens,
                        check_invariants=os.environ.get(CHECK_ENV) == "1", spec=speculation)
        rt = cls(model.config, model.fingerprint, tok, runner, store, cache, engine,
                 max_context, sizes.kv_pages * B, path, where, cfg.weights, adapters,
                 Path(cfg.model_draft) if draft is not None else None,
                 Path(cfg.mmproj) if cfg.mmproj and embedder is not None else None,
                 model.kv_dtype, cfg.gemv_activations)
        if cfg.sleep_idle_seconds is not None:
            engine.sleep = Sleep(cfg.sleep_idle_seconds, rt.unload, rt.reload)
        engine.gc_pacer.freeze()       # the loaded objects leave the collector's walks
        log.info("loaded %s in %.1f s on %s: %s, %d layers, block %d, %s (%d tokens), RAM "
                 "tier %.0f MiB, context %d, %d parallel, %d torch threads", path.name,
                 time.perf_counter() - t0, where, model.config.arch,
                 len(model.config.layer_types), B,
                 sizes.source, sizes.kv_pages * B, sizes.host_bytes / 2**20, max_context,
                 cfg.parallel, torch.get_num_threads())
        return rt

    @property
    def model(self) -> torch.nn.Module | None:
        """The loaded model; None while the daemon sleeps."""
        return self.runner.model

    @property
    def vocab_size(self) -> int:
        """Valid token ids are those the model embeds (the tokenizer may name fewer)."""
        return self.config.vocab_size

    def unload(self) -> None:
        """Sleeping (the engine's thread, idle): the weights, KV pool and graphs go, the
        draft model's and the vision tower's too."""
        self.runner.release()
        if self.runner.embedder is not None:
            self.runner.embedder.release()
        if self.engine.spec is not None:
            self.engine.spec.unload()

    def reload(self) -> None:
        """Waking up: the same weights again (the store's entries are theirs: a file
        that changed meanwhile is refused, not served with the old cache)."""
        model, _ = load(self.source, self.where.dtype, self.where.device, weights=self.weights,
                        kv_dtype=self.kv_dtype, gemv_activations=self.gemv_activations)
        if model.fingerprint != self.fingerprint:
            raise ValueError(f"{self.source} changed while the daemon slept (weights "
                             f"fingerprint {model.fingerprint[:12]}, cached state is for "
                             f"{self.fingerprint[:12]}): restart the daemon to serve it")
        if len(self.adapters):      # read and checked at start-up; the same weights again
            Lora(self.adapters.adapters).attach(model)
        self.runner.reload(model)
        if self.runner.embedder is not None:
            self.runner.embedder.reload(self._vision_encoder(model))
        if self.engine.spec is not None:
            draft, _ = load(self.draft, self.where.dtype, self.where.device, weights=self.weights,
                            gemv_activations=self.gemv_activations)
            self.engine.spec.reload(draft)

    def _vision_encoder(self, model):
        """The vision tower loaded again on waking: the same one, or a ValueError."""
        cfg = ServeConfig(mmproj=str(self.mmproj) if self.mmproj else None)
        fresh = load_embedder(cfg, self.source, model, self.tokenizer, self.where)
        old = self.runner.embedder
        if fresh is None or fresh.fingerprint != old.fingerprint:
            raise ValueError("the vision tower changed while the daemon slept: restart it")
        return fresh.encoder

    def close(self) -> None:
        """Cancel what still runs, then store what the cache captured, flush and close."""
        self.engine.stop()
        self.cache.close()


def _kv_dtype(cfg: ServeConfig) -> torch.dtype | None:
    """--kv-dtype's torch dtype; None: the compute dtype."""
    return None if cfg.kv_dtype == "auto" else getattr(torch, cfg.kv_dtype)


def _adapters(cfg: ServeConfig, model) -> Adapters:
    """Read and check every --lora adapter against the model (a ValueError naming the
    file before anything is served), then attach them."""
    loaded = [read_adapter(f.path, model) for f in cfg.lora]
    if loaded:
        Lora(loaded).attach(model)
        log.info("LoRA adapters: %s", ", ".join(
            f"{i}: {f.path} (scale {0.0 if cfg.lora_init_without_apply else f.scale})"
            for i, f in enumerate(cfg.lora)))
    scales = [0.0 if cfg.lora_init_without_apply else f.scale for f in cfg.lora]
    return Adapters(loaded, scales)
def _draft(cfg: ServeConfig, where, tok: Tokenizer, model) -> torch.nn.Module:
    """The draft model, on the model's device and dtype; ValueError (one line) unless it
    has the model's vocabulary."""
    draft, draft_tok = load(Path(cfg.model_draft), where.dtype, where.device,
                            weights=cfg.weights, gemv_activations=cfg.gemv_activations)
    check_vocab(tok, draft_tok, model.config.vocab_size, draft.config.vocab_size)
    if cfg.synth():
        log.warning("synthetic speculative acceptance is on, for benchmarking: the output "
                    "is not the model's")
    log.info("draft model %s: speculative decoding, up to %d tokens a step",
             Path(cfg.model_draft).name, cfg.spec_draft_n_max)
    return draft


def _remote(cfg, fingerprint: str, spec) -> RemoteTier:
    """The shared tier. A remote that does not answer now is no reason not to serve:
    the daemon starts, says so, and uses it once it answers."""
    url = cfg.remote
    tier = RemoteTier(RemoteConfig(RemoteURL.parse(url),
                                   segment_bytes=cfg.remote_segment_bytes), fingerprint, spec)
    why = tier.check()
    if why is None:
        log.info("remote tier %s at %s, objects under %s", url, tier.client.endpoint,
                 tier.layout.root)
    else:
        log.warning("remote tier %s at %s does not answer (%s): serving from the local "
                    "tiers until it does", url, tier.client.endpoint, why)
    return tier
