"""Terminal output of `ckptd inspect`: rich tables from the dicts the commands build
(the same dicts `--json` prints)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

Decode = Callable[[list[int]], "str | None"]
_NUMERIC = {"entries", "stored", "logical", "budget", "bytes", "hits", "position"}  # right
_UNITS = ((10**12, "TB"), (10**9, "GB"), (10**6, "MB"), (10**3, "kB"))


def console() -> Console:
    """Where the tables go. Piped, rich would assume 80 columns and squeeze them."""
    return Console(width=None if sys.stdout.isatty() else 200, soft_wrap=True)


def human_bytes(n: int | None) -> str:
    """Decimal units, as the size flags read them (500MB = 500 * 10**6)."""
    if n is None:
        return "-"
    for size, unit in _UNITS:
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def age(t: float, now: float | None = None) -> str:
    s = max(0.0, (now or time.time()) - t)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if s >= size:
            return f"{s / size:.0f}{unit} ago"
    return f"{s:.0f}s ago"


def preview(tokens: list[int], decode: Decode | None = None, width: int = 40) -> str:
    """Decoded text (quoted, escapes shown) when a tokenizer is at hand, else token ids."""
    text = decode(tokens) if decode is not None and tokens else None
    if text is None:
        shown = " ".join(map(str, tokens[:8]))
        return f"ids {shown}{' …' if len(tokens) > 8 else ''}" if tokens else ""
    text = repr(text)
    return text if len(text) <= width else text[:width - 1] + "…"


def _table(title: str, *columns: str) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold")
    for c in columns:
        t.add_column(c, justify="right" if c in _NUMERIC else "left")
    return t


def stats(console: Console, st: dict) -> None:
    d = st["disk"]
    t = _table(f"cache {st['source']}", "", "value")
    ratio = d["compression_ratio"]
    for name, value in (
            ("entries", f"{d['entries']}  ({_kinds(d['by_kind'])})"),
            ("stored (compressed)", human_bytes(d["stored_bytes"])),
            ("logical", human_bytes(d["logical_bytes"])),
            ("compression ratio", "-" if ratio is None else f"{ratio:.2f}x"),
            ("pinned", f"{d['pinned_entries']} entries, {human_bytes(d['pinned_bytes'])}"),
            ("disk budget", human_bytes(d["budget_bytes"])),
            ("LMDB file", human_bytes(d["file_bytes"]))):
        t.add_row(name, value)
    console.print(t)
    tiers = _table("tiers", "tier", "entries", "bytes", "budget")
    tiers.add_row("disk", str(d["entries"]), human_bytes(d["stored_bytes"]),
                  human_bytes(d["budget_bytes"]))
    if "host" in st:
        h = st["host"]
        tiers.add_row("host (RAM)", str(h["entries"]), human_bytes(h["bytes"]),
                      human_bytes(h["budget_bytes"]))
    r = st.get("remote")
    if r:                    # a daemon's view: what it moved, not what the bucket holds
        up = r["uploads"] or {}
        tiers.add_row(f"remote {escape(r['url'])}", f"{up.get('uploaded', 0)} up, "
                      f"{r['fetch']['objects']} down", f"{human_bytes(r['bytes_up'])} up, "
                      f"{human_bytes(r['bytes_down'])} down",
                      "available" if r["available"] else "cooling off")
    console.print(tiers)
    fps = _table("model fingerprints", "fingerprint", "entries", "stored")
    for fp, row in sorted(d["by_fingerprint"].items()):
        fps.add_row(escape(fp), str(row["entries"]), human_bytes(row["stored_bytes"]))
    console.print(fps)
    h = st["entry_hits"]
    hits = _table("hits", "", "value")
    hits.add_row("restores served by entries (on disk)", str(h["total"]))
    hits.add_row("entries hit at least once", str(h["entries_hit"]))
    if "lookups" in st:
        lk = st["lookups"]
        hits.add_row("daemon lookups / hits / misses",
                     f"{lk['count']} / {lk['hits']} / {lk['misses']}")
        hits.add_row("tokens restored", str(lk["hit_tokens"]))
        wq = st["write_queue"]
        hits.add_row("write queue", f"{wq['depth']} entries, {human_bytes(wq['bytes'])}; "
                                    f"{wq['committed']} committed, {wq['dropped']} dropped")
    console.print(hits)
    if h["top"]:
        top = _table("most hit", "key", "kind", "position", "hits")
        for e in h["top"]:
            top.add_row(e["key"], e["kind"], str(e["position"]), str(e["hits"]))
        console.print(top)


def _kinds(by_kind: dict) -> str:
    return ", ".join(f"{n} {k}s" for k, n in sorted(by_kind.items())) or "empty"


def entries(console: Console, out: dict) -> None:
    rows = out["entries"]
    t = _table(f"{len(rows)} of {out['total']} entries in {out['source']} "
               f"(by {out['sort']})", "key", "kind", "position", "snapshots below", "stored",
               "logical", "hits", "last used", "pinned", "tiers", "text")
    now = time.time()
    for e in rows:
        snaps = ", ".join(f"@{p}" for p in e["snapshots"][:4])
        snaps += " …" if len(e["snapshots"]) > 4 else ""
        t.add_row(e["key"], e["kind"], str(e["position"]), snaps,
                  human_bytes(e["stored_bytes"]), human_bytes(e["logical_bytes"]),
                  str(e["hits"]), age(e["last_used"], now), "yes" if e["pinned"] else "",
                  ",".join(e["tiers"]), escape(_shown(e)))
    console.print(t)


def _shown(e: dict) -> str:
    return preview(e["tokens"], (lambda _: e["text"]) if e.get("text") is not None else None)


def show(console: Console, out: dict) -> None:
    e, p = out["entry"], out["prefix"]
    t = _table(f"{e['kind']} {e['key']}", "", "value")
    for name in ("position", "parent", "fingerprint", "stored_bytes", "logical_bytes",
                 "hits", "pinned", "tiers"):
        value = e[name]
        if name.endswith("bytes"):
            value = f"{human_bytes(value)} ({value})"
        elif name == "tiers":
            value = ", ".join(value)
        t.add_row(name, escape(str(value)))
    t.add_row("created", f"{time.ctime(e['created'])} ({age(e['created'])})")
    t.add_row("last used", f"{time.ctime(e['last_used'])} ({age(e['last_used'])})")
    t.add_row("own tokens", escape(_shown(e)))
    whole = "complete" if p["complete"] else "an ancestor is missing"
    t.add_row("prefix", f"{len(p['tokens'])} tokens ({whole})")
    if p.get("text") is not None:
        text = repr(p["text"])
        t.add_row("prefix text", escape(text if len(text) <= 200 else "…" + text[-199:]))
    below = ", ".join(f"{c['kind']} @{c['position']}" for c in out["children"][:8])
    t.add_row("children", (below + (" …" if len(out["children"]) > 8 else "")) or "none")
    console.print(t)
    v = out["value"]
    if v is None:
        console.print(out.get("value_note") or "value: not stored on disk")
        return
    h = _table("value", "", "value")
    h.add_row("format", f"{v['magic']} version {v['version']}")
    h.add_row("bytes", f"{human_bytes(v['bytes'])} ({v['bytes']})")
    h.add_row("model fingerprint", escape(str(v["fp"])))
    h.add_row("checksum (xxh3-128)", f"{v['checksum']} "
                                     f"({'ok' if v['checksum_ok'] else 'MISMATCH'})")
    if v["error"]:
        h.add_row("error", f"[red]{escape(v['error'])}[/]")
    console.print(h)
    if v["tensors"]:
        ts = _table("tensors", "name", "dtype", "shape", "codec", "stored")
        for x in v["tensors"]:
            ts.add_row(x["name"], x["dtype"], "[" + ", ".join(map(str, x["shape"])) + "]",
                       x["codec"], human_bytes(sum(x["parts"])))
        console.print(ts)


def verify(console: Console, out: dict) -> None:
    bad, orphans = out["bad"], out["orphans"]
    line = f"checked {out['checked']} values: {len(bad)} bad, {len(orphans)} orphaned"
    if out["dropped"]:
        line += f"; dropped {out['dropped']} entries (the bad ones and what is below them)"
    console.print(line)
    for k in bad:
        console.print(f"  bad      {k}")
    for k in orphans:
        console.print(f"  orphaned {k}")
    if (bad or orphans) and not out["dropped"]:
        console.print("run again with --drop to delete them (they are never served)")


def message(console: Console, text: str) -> None:
    console.print(escape(text), highlight=False)
