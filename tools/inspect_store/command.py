"""`ckptd inspect`: look into a cache, on disk or in a running daemon, and tidy it.

    ckptd inspect [--cache-dir DIR | --url URL [--api-key KEY]] [--model PATH] [--json] ACTION
    ckptd inspect --remote s3://BUCKET/PREFIX [--fingerprint FP] stats|ls|verify|gc
    ckptd inspect [--cache-dir DIR] [--model PATH] why PROMPT_FILE [--salt S] [--fingerprint FP]

Reads go to the LMDB store directly, read-only, so they work beside a running daemon
(LMDB readers never block its writer), or to the daemon's /cache/* endpoints with
--url, or to a shared remote tier with --remote (inspect_store/remote.py). Changes
(pin, unpin, rm, clear, gc, verify --drop, import) open the store read-write only
when no other process has it open: a running daemon keeps the index in memory, so
its cache is changed through --url instead. `--json` prints the
machine-readable result of any action instead of tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from ckptd.cache.tree import build
from ckptd.daemon.config import default_cache_dir, parse_size
from ckptd.tools.inspect_store import render
from ckptd.tools.inspect_store import tree as inspect_tree
from ckptd.tools.inspect_store.source import (
    HttpSource,
    LocalSource,
    decoder,
    is_hybrid,
    resolve_key,
)

SORTS = ("last_used", "size", "hits", "created", "position")
KINDS = ("block", "snapshot")


class _Parser(argparse.ArgumentParser):
    """A subcommand's usage error is one line, like every other error of this tool."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _common(p: argparse.ArgumentParser, top: bool) -> None:
    # Accepted before and after the action; an action's copy only counts when given.
    d = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    p.add_argument("--cache-dir", default=d(None),
                   help="cache folder (default: $CKPTD_CACHE_DIR, else the daemon's default)")
    p.add_argument("--url", default=d(None), help="a running daemon, http://127.0.0.1:PORT")
    p.add_argument("--remote", default=d(None), metavar="s3://BUCKET/PREFIX",
                   help="a shared remote tier (endpoint and keys: the standard AWS_* "
                        "variables); stats, ls, verify and gc only")
    p.add_argument("--fingerprint", default=d(None),
                   help="with --remote or why: the model whose entries to read or change "
                        "(default: the only one there)")
    p.add_argument("--api-key", default=d(os.environ.get("CKPTD_API_KEY")),
                   help="the daemon's --api-key (default $CKPTD_API_KEY)")
    p.add_argument("--model", default=d(None),
                   help="model folder or .gguf whose tokenizer decodes previews")
    p.add_argument("--json", action="store_true", default=d(False),
                   help="print machine-readable JSON instead of tables")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser, top=True)
    common = argparse.ArgumentParser(add_help=False)
    _common(common, top=False)
    sub = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    sub.required = True

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help_text, description=help_text)

    add("stats", "entries, bytes stored and logical, tiers, model fingerprints, hits")
    p = add("ls", "list entries with text previews")
    p.add_argument("--sort", choices=SORTS, default="last_used")
    p.add_argument("--kind", choices=KINDS)
    p.add_argument("--limit", type=int, default=50, help="0: all (default 50)")
    p.add_argument("--offset", type=int, default=0)
    p = add("tree", "the prefix tree: shared prefixes, where snapshots sit, sizes")
    p.add_argument("--format", choices=("text", "json", "dot"), default="text")
    p = add("show", "one entry's metadata and its stored value's header")
    p.add_argument("key", help="32 hex digits, or a unique prefix of 8 or more")
    p = add("verify", "re-read every stored value and check it")
    p.add_argument("--drop", action="store_true", help="delete bad values (and what is below)")
    for name, what in (("pin", "pin an entry and its ancestors (never evicted)"),
                       ("unpin", "unpin an entry (and ancestors nothing else pinned needs)"),
                       ("rm", "delete an entry and everything below it")):
        add(name, what).add_argument("key", help="32 hex digits, or a unique prefix")
    p = add("clear", "delete every unpinned entry")
    p.add_argument("--include-pinned", action="store_true")
    p = add("gc", "evict least-recently-used leaves until the store fits SIZE (pinned kept); "
                  "with --remote, delete the oldest objects of one model")
    p.add_argument("--to", metavar="SIZE", help="e.g. 500MB, 2GiB, 0")
    p.add_argument("--older-than", metavar="AGE",
                   help="with --remote: delete objects older than this (e.g. 12h, 7d)")
    p.add_argument("--dry-run", action="store_true",
                   help="with --remote: say what would be deleted, delete nothing")
    p = add("why", "which cached prefix a prompt would restore, from where, and why not more")
    p.add_argument("prompt_file", metavar="PROMPT_FILE", help="the prompt: text (tokenized "
                   "with --model) or a JSON list of token ids; - reads stdin")
    p.add_argument("--salt", help="the requests' cache_salt")
    add("export", "copy the store (compacted) to an empty folder").add_argument("dir")
    add("import", "add the entries of an exported store (same model) to this one"
        ).add_argument("dir")


def run(args: argparse.Namespace) -> int:
    if args.remote:
        # imported here: the remote side imports torch (codec), which a local look never needs
        from ckptd.tools.inspect_store import remote

        return remote.run(args)
    if args.fingerprint and args.action != "why":
        raise ValueError("--fingerprint goes with --remote or why")
    source = _source(args)
    out, code = ACTIONS[args.action](args, source)
    if args.json or getattr(args, "format", None) == "json":
        print(json.dumps(out, indent=1 if sys.stdout.isatty() else None))
    else:
        SHOW.get(args.action, _message)(args, out)
    return code


def _source(args) -> LocalSource | HttpSource:
    if args.url:
        if args.cache_dir:
            raise ValueError("give --cache-dir or --url, not both")
        return HttpSource(args.url, args.api_key)
    return LocalSource(args.cache_dir or os.environ.get("CKPTD_CACHE_DIR")
                       or default_cache_dir())


def _local(source, what: str) -> LocalSource:
    if not isinstance(source, LocalSource):
        raise ValueError(f"{what} works on the store itself: use --cache-dir, not --url "
                         "(stop the daemon first to change it)")
    return source


def _stats(args, source):
    st = source.stats()
    if isinstance(source, LocalSource):
        # Host tier, lookups and queue counters would be this process's own (zeros).
        st = {"entries": st["entries"], "disk": st["disk"]}
    rows = source.entries("hits")
    st["entry_hits"] = {"total": sum(e["hits"] for e in rows),
                        "entries_hit": sum(1 for e in rows if e["hits"]),
                        "top": [{k: e[k] for k in ("key", "kind", "position", "hits")}
                                for e in rows[:5] if e["hits"]]}
    return {"source": source.where, **st}, 0


def _ls(args, source):
    if args.limit < 0 or args.offset < 0:
        raise ValueError("--limit and --offset must be >= 0")
    rows = source.entries(args.sort)
    snaps: dict[str, list[int]] = {}
    for e in rows:
        if e["kind"] == "snapshot":
            snaps.setdefault(e["parent"], []).append(e["position"])
    rows = [e for e in rows if args.kind in (None, e["kind"])]
    end = None if args.limit == 0 else args.offset + args.limit
    page = rows[args.offset:end]
    decode = decoder(args.model, source)
    for e in page:
        e["snapshots"] = sorted(snaps.get(e["key"], ())) if e["kind"] == "block" else []
        e["text"] = None if decode is None else decode(e["tokens"]) if e["tokens"] else ""
    return {"source": source.where, "sort": args.sort, "kind": args.kind, "total": len(rows),
            "offset": args.offset, "limit": args.limit, "entries": page}, 0


def _tree(args, source):
    tree = build(source.entries("position"))
    if args.json or args.format == "json":
        return inspect_tree.to_json(tree), 0
    decode = decoder(args.model, source)
    if args.format == "dot":
        return inspect_tree.to_dot(tree, decode), 0
    return inspect_tree.to_rich(tree, decode), 0


def _show(args, source):
    rows = source.entries("position")
    key = resolve_key(source, args.key, rows)
    by_key = {e["key"]: e for e in rows}
    if key not in by_key:
        raise ValueError(f"no cache entry {key}")
    e = by_key[key]
    tokens, top = list(e["tokens"]), e
    while top["parent"] in by_key:
        top = by_key[top["parent"]]
        tokens = top["tokens"] + tokens
    decode = decoder(args.model, source)
    out = {"entry": e, "prefix": {"tokens": tokens, "complete": top["position"] == len(
        top["tokens"]), "text": decode(tokens) if decode else None},
        "children": [{k: c[k] for k in ("key", "kind", "position")}
                     for c in rows if c["parent"] == key], "value": None}
    if isinstance(source, LocalSource):
        # imported here: codec imports torch, which the other actions never load
        from ckptd.cache import codec

        blob = source.value(key)
        out["value"] = None if blob is None else codec.describe(blob)
    else:
        out["value_note"] = "value: the HTTP API does not serve values (use --cache-dir)"
    return out, 0


def _verify(args, source):
    with _local(source, "verify").open(write=args.drop) as s:
        report = asdict(s.verify(drop=args.drop))
    damaged = report["bad"] or report["orphans"]
    return {"source": source.where, **report}, 1 if damaged and not args.drop else 0


def _pin(args, source):
    key = resolve_key(source, args.key)
    pinned = args.action == "pin"
    n = source.pin(key, pinned)
    return {"key": key, "pinned": pinned, "changed": n,
            "message": f"{args.action}ned {key}: {n} entries changed"}, 0


def _rm(args, source):
    key = resolve_key(source, args.key)
    n = source.delete(key)
    return {"key": key, "deleted": n,
            "message": f"deleted {key} and what is below it: {n} entries"}, 0


def _clear(args, source):
    n = source.clear(args.include_pinned)
    return {"deleted": n, "include_pinned": args.include_pinned,
            "message": f"deleted {n} entries"}, 0


def _gc(args, source):
    if args.to is None or args.older_than or args.dry_run:
        raise ValueError("gc of a local store takes --to SIZE (--older-than and --dry-run "
                         "go with --remote)")
    target = parse_size(args.to, "--to")
    with _local(source, "gc").open(write=True) as s:
        out = s.evict_to(target, hybrid=is_hybrid(s))
    after = out["stored_bytes_after"]
    note = "" if after <= target else " (the rest is pinned)"
    out.update(target_bytes=target, message=(
        f"evicted {out['evicted']} entries: {render.human_bytes(out['stored_bytes_before'])}"
        f" -> {render.human_bytes(after)} stored{note}"))
    return out, 0


def _export(args, source):
    dest = Path(args.dir)
    with _local(source, "export").open() as s:
        n = s.export(dest)
    size = (dest / "data.mdb").stat().st_size
    return {"exported": n, "path": str(dest), "bytes": size,
            "message": f"exported {n} entries to {dest} ({render.human_bytes(size)})"}, 0


def _import(args, source):
    src = Path(args.dir)
    if not (src / "data.mdb").exists():
        raise FileNotFoundError(f"no exported cache store at {src}")
    here = _local(source, "import")
    # Room for everything: without a model the store could not rank what to evict.
    have = sum(f.stat().st_size for f in (here.path / "data.mdb", src / "data.mdb")
               if f.exists())
    with here.open(write=True, create=True, disk_budget=4 * have + (64 << 20)) as s:
        n = s.import_(src)
    return {"imported": n, "from": str(src), "path": str(here.path),
            "message": f"imported {n} entries from {src} into {here.path}"}, 0


def _why(args, source):
    # imported here: the restore plan (cache/lookup.py) imports torch, which a look at a
    # daemon and the other actions never load
    from ckptd.tools.inspect_store import why

    if not isinstance(source, LocalSource):
        raise ValueError("why reads the store itself: use --cache-dir (it works beside a "
                         "running daemon)")
    tokens = why.prompt_tokens(args.prompt_file, args.model)
    with source.open() as s:
        out = why.why(s, tokens, args.salt, args.fingerprint, is_hybrid(s))
    return {"source": source.where, **out}, 0


# each action returns (the JSON-able result, exit code)
ACTIONS = {"stats": _stats, "ls": _ls, "tree": _tree, "show": _show, "verify": _verify,
           "pin": _pin, "unpin": _pin, "rm": _rm, "clear": _clear, "gc": _gc,
           "export": _export, "import": _import, "why": _why}


def _message(args, out) -> None:
    render.message(render.console(), out["message"])


def _print_tree(args, out) -> None:
    if isinstance(out, str):
        sys.stdout.write(out)
        return
    console = render.console()
    if not out:
        console.print("the cache is empty")
    for t in out:
        console.print(t)


SHOW = {"stats": lambda a, o: render.stats(render.console(), o),
        "ls": lambda a, o: render.entries(render.console(), o),
        "show": lambda a, o: render.show(render.console(), o),
        "verify": lambda a, o: render.verify(render.console(), o),
        "tree": _print_tree,
        "why": lambda a, o: _why_render(o)}


def _why_render(out) -> None:
    # imported here, as in _why
    from ckptd.tools.inspect_store import why

    why.render(render.console(), out)
