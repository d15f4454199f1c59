"""A sequence's exact state as one file: what llama-server's slot save/restore writes.

The file is one value in the store's own format (cache/codec.py): the tokens, the
KV blocks and the snapshot at the end (recurrent state, partial page, logits), with
the weights fingerprint in its header and a checksum over all of it. Saving reads
the state from the store (a finished sequence's final checkpoint is there);
restoring verifies the file and puts its blocks and snapshot back into the store,
so the next request that starts with those tokens restores them like any entry.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ckptd.cache import codec
from ckptd.cache.keys import KeyChain, KeyContext
from ckptd.cache.snapshot import Snapshot
from ckptd.cache.store import CacheStore
from ckptd.model.vision.positions import ImageSpan

_SNAP = "snapshot."


class SlotStateError(ValueError):
    """The state can't be saved (not cached) or the file can't be restored."""


def save(store: CacheStore, tokens: list[int], salt: str | bytes | None, path: Path,
         images: tuple = ()) -> int:
    """Write the state after `tokens` to `path` (atomically). Returns the token count.
    images: the spans of the images among the tokens (their names key the state)."""
    store.flush()
    chain = _chain(store, tokens, salt, images)
    plan = store.lookup(tokens, salt, chain=chain)
    if plan.position != len(tokens):
        raise SlotStateError(f"the state after these {len(tokens)} tokens is no longer cached "
                             f"(only {plan.position}): it was evicted")
    state = store.load(plan)
    if not state.ok:
        raise SlotStateError("the cached state failed verification; it was dropped")
    tensors = {"tokens": torch.tensor(tokens, dtype=torch.int64)}
    if state.pages is not None and state.pages.shape[0]:
        tensors["pages"] = state.pages
    if state.snapshot:
        tensors.update({_SNAP + k: v for k, v in state.snapshot.tensors().items()})
    if salt:
        raw = salt.encode() if isinstance(salt, str) else salt    # bytes: a LoRA set's
        tensors["salt"] = torch.tensor(list(raw), dtype=torch.uint8)
    if images:
        tensors["image_spans"] = torch.tensor([[im.start, *im.grid, im.merge] for im in images],
                                              dtype=torch.int64)
        tensors["image_digests"] = torch.tensor([list(im.digest) for im in images],
                                                dtype=torch.uint8)
    blob = codec.encode(tensors, store.fp)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(blob)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return len(tokens)


def restore(store: CacheStore, path: Path, images_ok: bool = True
            ) -> tuple[list[int], str | bytes | None, tuple]:
    """Put the state saved in `path` into the store; returns (tokens, salt, images).
    images_ok False (the model has no vision tower): a state holding images is refused."""
    blob = path.read_bytes()
    try:
        header = codec.verify(blob, None)
    except codec.CorruptValue as e:
        raise SlotStateError(f"{path.name} is not a saved slot state or is damaged ({e})") \
            from None
    if header.get("fp") != store.fp:
        raise SlotStateError(f"{path.name} was saved by other model weights "
                             f"({str(header.get('fp'))[:16]}...), not this server's")
    try:
        t = codec.decode(blob, store.fp)
    except codec.CorruptValue as e:
        raise SlotStateError(f"{path.name} is damaged: {e}") from None
    if "tokens" not in t:
        raise SlotStateError(f"{path.name} is not a saved slot state (no tokens)")
    tokens = t["tokens"].tolist()
    salt = _salt(bytes(t["salt"].tolist())) if "salt" in t else None
    images = _images(t, path)
    if images and not images_ok:
        raise SlotStateError(f"Cannot restore media tokens without an mmproj: {path.name} "
                             "holds images, and this model has no vision tower (--mmproj)")
    chain = _chain(store, tokens, salt, images)
    pages = t.get("pages")
    if pages is not None:
        store.put_blocks(tokens, 0, pages, salt, chain=chain)
    snap = {k[len(_SNAP):]: v for k, v in t.items() if k.startswith(_SNAP)}
    if snap:
        store.put_snapshot(tokens, Snapshot.from_tensors(snap), salt, chain=chain)
    store.flush()
    return tokens, salt, images


def _chain(store: CacheStore, tokens: list[int], salt, images: tuple) -> KeyChain:
    ctx = KeyContext(salt, media=tuple(images), block_size=store.B) if images else None
    return KeyChain(store.root(salt), store.B, tokens, ctx)


def _images(t: dict, path: Path) -> tuple:
    """The image spans saved beside the tokens (their names: digest, grid, start)."""
    spans, digests = t.get("image_spans"), t.get("image_digests")
    if spans is None and digests is None:
        return ()
    if spans is None or digests is None or spans.dim() != 2 or spans.shape[1] != 5 \
            or tuple(digests.shape) != (spans.shape[0], 32):
        raise SlotStateError(f"{path.name}: its image records are damaged")
    return tuple(ImageSpan(int(s[0]), (int(s[1]), int(s[2]), int(s[3])), int(s[4]),
                           bytes(d.tolist())) for s, d in zip(spans, digests))


def _salt(raw: bytes) -> str | bytes:
    """A tenant's salt is text; a LoRA set's (daemon/lora.py) is bytes no text encodes to."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw
