"""The --remote side of `ckptd inspect` (tools/inspect_store/command.py): each action
run on a remote tier (remote.py: stats, ls; remote_check.py: verify, gc;
remote_migrate.py: migrate) and shown."""

from __future__ import annotations

import json
import sys

from ckptd.daemon.config import parse_size
from ckptd.tools.inspect_store import remote_check, remote_migrate, render
from ckptd.tools.inspect_store.remote import RemoteSource, ls, parse_age, stats

ACTIONS = ("stats", "ls", "verify", "gc", "migrate")


def run(args) -> int:
    """The --remote side of `ckptd inspect` (tools/inspect_store/command.py)."""
    if args.url or args.cache_dir:
        raise ValueError("give --remote, or --cache-dir / --url, not both")
    if args.action not in ACTIONS:
        raise ValueError(f"{args.action} works on a local store or a daemon; --remote "
                         f"takes {', '.join(ACTIONS)}")
    src = RemoteSource(args.remote, args.fingerprint)
    code = 0
    try:
        if args.action == "stats":
            out = stats(src)
        elif args.action == "ls":
            out = ls(src, args.sort, args.kind, args.offset, args.limit)
        elif args.action == "verify":
            out = remote_check.verify(src, args.drop)
            code = 1 if (out["bad"] or out["dangling"]) and not args.drop else 0
        elif args.action == "gc":
            out = remote_check.gc(
                src, parse_age(args.older_than) if args.older_than else None,
                parse_size(args.to, "--to") if args.to is not None else None,
                parse_age(args.grace, "--grace"), args.dry_run)
        else:
            out = remote_migrate.migrate(src, parse_size(args.segment_bytes,
                                                         "--segment-bytes"), args.dry_run)
    finally:
        src.close()
    if args.json:
        print(json.dumps(out, indent=1 if sys.stdout.isatty() else None))
    else:
        _show(args.action, out)
    return code


def _show(action: str, out: dict) -> None:
    console = render.console()
    h = render.human_bytes
    if action == "stats":
        t = render._table(f"remote {out['source']} ({out['endpoint']})", "format",
                          "fingerprint", "segments", "states", "bytes", "dedup", "first layout",
                          "oldest", "newest")
        for m in out["models"]:
            dedup = m.get("dedup_ratio")
            t.add_row(f"v{m['format_version']}", m["fingerprint"],
                      f"{m.get('segments', '-')} ({h(m.get('segment_bytes'))})",
                      f"{m.get('states', '-')} ({h(m.get('state_bytes'))})", h(m["bytes"]),
                      "-" if dedup is None else f"{dedup}x",
                      str(m.get("legacy_objects", "-")), render.age(m["oldest"]),
                      render.age(m["newest"]))
        console.print(t)
        console.print(f"{out['objects']} objects, {h(out['bytes'])}")
    elif action == "ls":
        t = render._table(f"{out['source']} model {out['fingerprint']}: {out['total']} "
                          "objects", "kind", "position", "key", "bytes", "stored")
        for e in out["entries"]:
            t.add_row(e["kind"], "" if e["position"] is None else str(e["position"]),
                      e["key"], h(e["bytes"]), render.age(e["modified"]))
        console.print(t)
    elif action == "verify":
        render.message(console, f"checked {out['checked']} objects: {len(out['bad'])} bad, "
                                f"{len(out['dangling'])} dangling states, "
                                f"{out['unreferenced']} segments no state names, "
                                f"{out['dropped']} deleted")
        for k in out["bad"] + out["dangling"]:
            console.print(f"  {k}")
    elif action == "gc":
        verb = "would delete" if out["dry_run"] else "deleted"
        render.message(console, f"{verb} {out['deleted_states']} states and "
                                f"{out['deleted_segments']} segments: "
                                f"{h(out['bytes_before'])} -> {h(out['bytes_after'])}")
    else:
        verb = "would migrate" if out["dry_run"] else "migrated"
        render.message(console, f"{verb} {out['legacy_objects']} objects of the first layout"
                                f": {out['states']} states in {out['segments']} segments "
                                f"({out['skipped']} states left out, their blocks missing)")
