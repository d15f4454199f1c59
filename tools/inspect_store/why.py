"""`ckptd inspect why PROMPT_FILE`: for a prompt, offline, which cached prefix would
restore, from where, and why not more.

The store is read as it is on disk (read-only, beside a running daemon): the plan is
the daemon's (cache/lookup.py), the answer for the first token it leaves is the
daemon's (cache/why/explain.py), with the departures the daemon recorded as of its
last save (gone.json: at shutdown, and every minute while it runs). What only a
running daemon knows is left out: its device pages and RAM tier (a daemon may
restore more from them), and its cost check (it may compute what reading would be
slower at).

PROMPT_FILE is text, tokenized with --model's tokenizer as /completion does, or a
JSON list of token ids (`[1, 2, 3]`, or `{"tokens": [...]}`); "-" reads stdin.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.markup import escape

from ckptd.cache.entry import BLOCK
from ckptd.cache.keys import prompt_chain
from ckptd.cache.lookup import plan_restore
from ckptd.cache.why.explain import Attempt, explain
from ckptd.cache.why.report import CacheReport, tier_runs
from ckptd.model.text.tokenizer import load_tokenizer
from ckptd.tools.inspect_store.render import human_bytes


def prompt_tokens(path: str, model: str | None) -> list[int]:
    raw = sys.stdin.read() if path == "-" else _read(path)
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict):
        data = data.get("tokens")
    if isinstance(data, list):
        if not data or not all(type(t) is int and t >= 0 for t in data):
            raise ValueError(f"{path}: a JSON prompt is a non-empty list of token ids")
        return data
    if model is None:
        raise ValueError(f"{path} is text: give --model to tokenize it (or a JSON list of "
                         "token ids)")
    tokens = load_tokenizer(model).encode(raw)
    if not tokens:
        raise ValueError(f"{path}: the prompt is empty")
    return tokens


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"no prompt file {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None


def _model(store, fingerprint: str | None) -> tuple[str, int]:
    """The fingerprint to key under (given, or the store's only one) and its block size."""
    with store.catalog.lock:
        sizes: dict[str, int] = {}
        for m in store.catalog.index.rows.values():
            if m.kind == BLOCK:
                sizes[m.fingerprint] = len(m.tokens)
            else:
                sizes.setdefault(m.fingerprint, 0)
    if not sizes:
        raise ValueError("the cache is empty: nothing would restore")
    if fingerprint is not None:
        found = [fp for fp in sizes if fp.startswith(fingerprint.lower())]
        if len(found) != 1:
            raise ValueError(f"no model with fingerprint {fingerprint!r} in the store" if not
                             found else f"{len(found)} models start with {fingerprint!r}")
        fp = found[0]
    elif len(sizes) > 1:
        raise ValueError(f"the store holds {len(sizes)} models: name one with --fingerprint "
                         f"({', '.join(sorted(f[:12] for f in sizes))})")
    else:
        fp = next(iter(sizes))
    if not sizes[fp]:
        raise ValueError(f"model {fp[:12]} has no block stored: its block size is unknown")
    return fp, sizes[fp]


def why(store, tokens: list[int], salt: str | None, fingerprint: str | None,
        hybrid: bool) -> dict:
    """The report a restore of `tokens` would give from this store alone."""
    fp, B = _model(store, fingerprint)
    chain = prompt_chain(fp, B, tokens, salt)
    n = len(tokens)
    plan = plan_restore(tokens, n, chain, hybrid, store.catalog)
    if plan.position == n and plan.snapshot is None:       # one token is computed
        plan = plan_restore(tokens, n - 1, chain, hybrid, store.catalog)
    runs = tier_runs(plan.blocks, plan.snapshot, plan.position, 0, B)
    miss = explain(tokens, chain, Attempt(plan.position, plan.shared), store.catalog,
                   store.gone, {chain.root: salt}, fp)
    report = CacheReport(n, plan.position, runs, explained=miss).to_dict()
    pieces = plan.pieces()
    return {"fingerprint": fp, "block_size": B, "hybrid": hybrid, "salted": salt is not None,
            **report, "blocks": len(plan.blocks),
            "snapshot": None if plan.snapshot is None else {
                "key": plan.snapshot.key.hex(), "position": plan.snapshot.position,
                "tier": plan.snapshot.tier},
            "read_bytes": sum(p.nbytes for p in pieces), "departures_recorded": len(store.gone)}


def render(console, out: dict) -> None:
    kind = "hybrid" if out["hybrid"] else "attention-only"
    console.print(f"prompt: {out['prompt']:,} tokens · model {out['fingerprint'][:12]} · "
                  f"block {out['block_size']} · {kind}")
    if out["restored"]:
        runs = ", ".join(f"{r['tier']} {r['start']:,}–{r['end']:,}" for r in out["runs"])
        snap = out["snapshot"]
        at = f"; its state from the snapshot at {snap['position']:,}" if snap else ""
        console.print(f"would restore: [bold]{out['restored']:,}[/] tokens "
                      f"({human_bytes(out['read_bytes'])} to read: {runs}){at}")
    else:
        console.print("would restore: [bold]nothing[/]")
    miss = out["miss"]
    if miss is None:
        console.print("why not more: nothing missed (one token is always computed unless "
                      "the snapshot kept the last logits)")
    else:
        console.print(f"why not more (token {miss['position']:,}): [bold]{miss['reason']}[/]"
                      f" — {escape(miss['detail'])}")
