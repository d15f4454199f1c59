"""`ckptd inspect` on real stores and a real daemon: listings match what the daemon
reports while it writes, verify finds damage, an export warms another daemon, the
prefix tree shows shared prefixes once, bad input is one line and exit code 2."""

from __future__ import annotations

import json
import threading
import time

import lmdb
import pytest

from ckptd.cache.store.store import CacheStore
from ckptd.tools.cli import main
from tests.cache.conftest import FP, fill, hybrid_spec
from tests.daemon.daemon_proc import start

KEY = "inspector-test-key"
SHARED = list(range(40, 40 + 48))                     # 3 full blocks of 16
PROMPTS = [SHARED + [5, 6, 7, 8, 9], SHARED + [11, 12], list(range(200, 237))]
SAME = ("key", "kind", "position", "parent", "tokens", "stored_bytes", "logical_bytes",
        "pinned", "fingerprint")


def inspect(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["inspect", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def inspect_json(capsys, *args: str):
    code, out, err = inspect(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def daemon(tiny_hybrid_dir, tmp_path_factory):
    d = start(tiny_hybrid_dir, tmp_path_factory.mktemp("inspect") / "cache", "--max-context",
              "256", "--snapshot-interval", "32", "--api-key", KEY)
    d.headers = {"Authorization": f"Bearer {KEY}"}
    yield d
    assert d.stop() == 0, d.output()


def complete(d, prompt: list[int]) -> dict:
    r = d.post("/v1/completions", {"prompt": prompt, "max_tokens": 3, "temperature": 0,
                                   "ignore_eos": True})
    assert r.status == 200, r.text
    return r.json


def wait_flushed(d) -> None:
    """Every completion so far has queued its checkpoints; wait until they are on disk."""
    deadline = time.monotonic() + 30
    while d.get("/cache/stats").json["write_queue"]["depth"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def daemon_entries(d) -> list[dict]:
    out, offset = [], 0
    while offset is not None:
        page = d.get(f"/cache/entries?offset={offset}&limit=1000").json
        out += page["data"]
        offset = page["next_offset"]
    return out


def by_key(rows: list[dict]) -> dict:
    return {e["key"]: {k: e[k] for k in SAME} for e in rows}


def test_listing_matches_the_daemon_while_it_writes(daemon, capsys):
    cache = str(daemon.cache_dir)
    writer = threading.Thread(target=lambda: [complete(daemon, p) for p in PROMPTS])
    writer.start()
    reads = 0
    while writer.is_alive() or not reads:              # a few hundred reads, in practice
        reads += 1
        # Read beside the writer: what is listed is whole prefixes, never a block
        # whose parent block is not there (commits are atomic, reads consistent).
        rows = inspect_json(capsys, "--cache-dir", cache, "ls", "--limit", "0")["entries"]
        keys = {e["key"] for e in rows}
        assert all(e["parent"] in keys for e in rows if e["position"] != len(e["tokens"]))
    writer.join()
    wait_flushed(daemon)
    want = by_key(daemon_entries(daemon))
    assert len(want) >= 8
    local = inspect_json(capsys, "--cache-dir", cache, "ls", "--limit", "0")
    assert local["total"] == len(want) and by_key(local["entries"]) == want
    remote = inspect_json(capsys, "--url", daemon.url, "--api-key", KEY, "ls", "--limit", "0")
    assert by_key(remote["entries"]) == want
    # --url gets the daemon's own view, hits and tiers included
    assert {e["key"]: e["hits"] for e in remote["entries"]} == \
        {e["key"]: e["hits"] for e in daemon_entries(daemon)}
    snaps = inspect_json(capsys, "--cache-dir", cache, "ls", "--kind", "snapshot", "--sort",
                         "position", "--limit", "2")
    positions = sorted((e["position"] for e in want.values() if e["kind"] == "snapshot"),
                       reverse=True)
    assert [e["position"] for e in snaps["entries"]] == positions[:2]
    text = inspect_json(capsys, "--cache-dir", cache, "--model", str(daemon_model(daemon)),
                        "ls", "--limit", "1")["entries"][0]["text"]
    assert isinstance(text, str)

    st = inspect_json(capsys, "--cache-dir", cache, "stats")
    assert st["disk"]["entries"] == len(want)
    assert st["disk"]["by_fingerprint"] and "write_queue" not in st
    assert inspect_json(capsys, "--url", daemon.url, "--api-key", KEY, "stats")[
        "write_queue"]["depth"] == 0
    code, out, _ = inspect(capsys, "--cache-dir", cache, "stats")
    assert code == 0 and "compression ratio" in out


def daemon_model(d):
    return d.proc.args[d.proc.args.index("--model") + 1]


def test_changes_go_through_the_daemon_and_bad_keys_fail(daemon, capsys):
    if not daemon_entries(daemon):
        complete(daemon, PROMPTS[0])
        wait_flushed(daemon)
    snap = next(e for e in daemon_entries(daemon) if e["kind"] == "snapshot")
    url = ("--url", daemon.url, "--api-key", KEY)
    # beside the running daemon the store is only read: changes go through --url
    code, _, err = inspect(capsys, "--cache-dir", str(daemon.cache_dir), "rm", snap["key"])
    assert code == 2 and "open in another process" in err and len(err.splitlines()) == 1
    out = inspect_json(capsys, *url, "pin", snap["key"][:10])
    assert out["key"] == snap["key"] and out["changed"] >= 1
    assert all(e["pinned"] for e in daemon_entries(daemon) if e["key"] == snap["key"])
    assert inspect_json(capsys, *url, "unpin", snap["key"])["changed"] >= 1
    for args, words in [
        ((*url, "show", "not-hex"), "not a cache key"),
        ((*url, "rm", "0" * 32), "no cache entry"),
        (("--url", daemon.url, "--api-key", "wrong", "stats"), "401"),
        (("--url", daemon.url, "stats"), "401"),
        ((*url, "verify"), "use --cache-dir"),
    ]:
        code, out, err = inspect(capsys, *args)
        assert code == 2 and words in err and len(err.splitlines()) == 1, (args, err)
        assert out == ""


def test_export_then_import_serves_warm(daemon, tiny_hybrid_dir, tmp_path, capsys):
    prompt = PROMPTS[0]
    complete(daemon, prompt)
    wait_flushed(daemon)
    # a hot copy, taken while the daemon runs
    out = inspect_json(capsys, "--cache-dir", str(daemon.cache_dir), "export",
                       str(tmp_path / "backup"))
    assert out["exported"] > 0
    code, _, err = inspect(capsys, "--cache-dir", str(daemon.cache_dir), "export",
                           str(tmp_path / "backup"))
    assert code == 2 and "already holds a store" in err
    fresh = tmp_path / "fresh"
    out = inspect_json(capsys, "--cache-dir", str(fresh), "import", str(tmp_path / "backup"))
    assert out["imported"] == inspect_json(capsys, "--cache-dir", str(fresh), "stats")[
        "entries"] > 0
    assert inspect_json(capsys, "--cache-dir", str(fresh), "verify")["bad"] == []
    d = start(tiny_hybrid_dir, fresh, "--max-context", "256", "--snapshot-interval", "32")
    try:
        r = complete(d, prompt)
    finally:
        assert d.stop() == 0, d.output()
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert r["timings"]["cache_tier"] == "disk"


@pytest.fixture
def store_dir(tmp_path):
    """Two prompts sharing blocks 0-2 (block size 4), and a third of its own."""
    spec = hybrid_spec()
    with CacheStore(tmp_path / "store", spec, FP) as s:
        fill(s, spec, list(range(12)) + [50, 51, 52, 53, 54, 55])
        fill(s, spec, list(range(12)) + [60, 61, 62, 63, 64])
        fill(s, spec, [9] * 6)
    return str(tmp_path / "store")


def test_tree_shows_a_shared_prefix_once_with_two_branches(store_dir, capsys):
    tree = inspect_json(capsys, "--cache-dir", store_dir, "tree", "--format", "json")
    nodes = {n["id"]: n for n in tree["nodes"]}
    root = nodes[tree["roots"][0]]
    assert len(tree["roots"]) == 1 and root["subtree_entries"] == 9
    firsts = [n for n in nodes.values() if n["kind"] == "blocks" and n["first_block"] == 0]
    assert len(firsts) == 2                                   # the shared run, and [9]*6's
    shared = next(n for n in firsts if n["count"] == 3)
    assert (shared["start"], shared["end"]) == (0, 12)
    branches = [nodes[c] for c in shared["children"] if nodes[c]["kind"] == "blocks"]
    assert sorted((b["first_block"], b["count"]) for b in branches) == [(3, 1), (3, 1)]
    assert sorted(nodes[b["children"][0]]["position"] for b in branches) == [17, 18]
    assert shared["subtree_entries"] == 3 + 2 * 2

    code, dot, _ = inspect(capsys, "--cache-dir", store_dir, "tree", "--format", "dot")
    assert code == 0 and dot.startswith("digraph")
    assert dot.count(f'"{shared["id"]}" [') == 1              # declared once
    edges = [b["id"] for b in branches]
    assert all(dot.count(f'"{shared["id"]}" -> "{b}"') == 1 for b in edges)
    code, text, _ = inspect(capsys, "--cache-dir", store_dir, "tree")
    assert code == 0 and text.count("blocks 0..2 (3 blocks") == 1


def test_verify_finds_a_flipped_byte_and_drop_removes_it(store_dir, capsys):
    rows = inspect_json(capsys, "--cache-dir", store_dir, "ls", "--limit", "0")["entries"]
    victim = next(e for e in rows if e["kind"] == "snapshot" and e["position"] == 17)
    env = lmdb.open(store_dir, max_dbs=8)
    with env.begin(write=True, db=env.open_db(b"snapshots")) as txn:
        value = bytearray(txn.get(bytes.fromhex(victim["key"])))
        value[len(value) // 2] ^= 0x40                       # inside the payload
        txn.put(bytes.fromhex(victim["key"]), bytes(value))
    env.close()
    shown = inspect_json(capsys, "--cache-dir", store_dir, "show", victim["key"])
    assert shown["value"]["checksum_ok"] is False and shown["prefix"]["complete"]
    code, out, _ = inspect(capsys, "--cache-dir", store_dir, "verify", "--json")
    report = json.loads(out)
    assert code == 1 and report["bad"] == [victim["key"]] and report["dropped"] == 0
    report = inspect_json(capsys, "--cache-dir", store_dir, "verify", "--drop")
    assert report["bad"] == [victim["key"]] and report["dropped"] == 1
    after = inspect_json(capsys, "--cache-dir", store_dir, "verify")
    assert after["bad"] == [] and after["checked"] == len(rows) - 1
    keys = {e["key"] for e in inspect_json(capsys, "--cache-dir", store_dir, "ls",
                                           "--limit", "0")["entries"]}
    assert victim["key"] not in keys and len(keys) == len(rows) - 1


def test_show_pin_gc_and_rm_on_a_store(store_dir, capsys):
    d = ("--cache-dir", store_dir)
    rows = inspect_json(capsys, *d, "ls", "--sort", "position", "--limit", "0")["entries"]
    deepest = rows[0]                                         # the snapshot at 18
    shown = inspect_json(capsys, *d, "show", deepest["key"][:8])
    assert shown["entry"]["key"] == deepest["key"]
    assert shown["prefix"]["tokens"] == list(range(12)) + [50, 51, 52, 53, 54, 55]
    v = shown["value"]
    assert v["checksum_ok"] and v["magic"] == "CKPV" and v["fp"] == FP
    assert {t["name"] for t in v["tensors"]} == {"kv", "conv", "ssm"}
    code, out, _ = inspect(capsys, *d, "show", deepest["key"])
    assert code == 0 and "plane16" in out and "checksum" in out
    assert inspect_json(capsys, *d, "pin", deepest["key"])["changed"] == 5   # 4 blocks + it
    out = inspect_json(capsys, *d, "gc", "--to", "0")
    assert out["evicted"] == len(rows) - 5 and out["stored_bytes_after"] > 0
    left = inspect_json(capsys, *d, "ls", "--limit", "0")["entries"]
    assert len(left) == 5 and all(e["pinned"] for e in left)
    assert inspect_json(capsys, *d, "unpin", deepest["key"])["changed"] == 5
    first = next(e for e in left if e["position"] == 4)
    assert inspect_json(capsys, *d, "rm", first["key"])["deleted"] == 5    # all below it
    assert inspect_json(capsys, *d, "stats")["entries"] == 0


def test_bad_input_is_one_line_and_exit_2(store_dir, tmp_path, capsys):
    d = ("--cache-dir", store_dir)
    for args, words in [
        ((*d, "show", "xyz"), "not a cache key"),
        ((*d, "show", "g" * 32), "not a cache key"),
        ((*d, "pin", "ab" * 17), "32 hex digits"),
        ((*d, "rm", "0" * 32), "no cache entry"),
        ((*d, "show", "00000000"), "no cache entry starts with"),
        (("--cache-dir", str(tmp_path / "missing"), "ls"), "no cache store"),
        (("--cache-dir", str(tmp_path / "missing"), "rm", "0" * 32), "no cache store"),
        ((*d, "gc", "--to", "lots"), "not a size"),
        ((*d, "import", str(tmp_path / "missing")), "no exported cache store"),
        (("--url", "http://127.0.0.1:9", "ls"), "cannot reach"),
        (("--url", "ftp://x", "ls"), "--url must be"),
        ((*d, "--url", "http://127.0.0.1:9", "ls"), "not both"),
    ]:
        code, out, err = inspect(capsys, *args)
        assert code == 2 and words in err and len(err.splitlines()) == 1, (args, err)
        assert "Traceback" not in err and out == ""
    with pytest.raises(SystemExit) as exc:
        main(["inspect", *d, "ls", "--sort", "bogus"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and "--sort" in err


def test_why_says_what_a_prompt_would_restore_and_why_not_more(store_dir, tmp_path, capsys):
    d = ("--cache-dir", store_dir)
    prompt = tmp_path / "prompt.json"

    def why(tokens, *more):
        prompt.write_text(json.dumps(tokens))
        return inspect_json(capsys, *d, "why", str(prompt), *more)
    shared = list(range(12))
    # past the end of a cached prompt: its snapshot at 18 restores, the rest is new
    out = why(shared + [50, 51, 52, 53, 54, 55, 70, 71])
    assert (out["restored"], out["miss"]["reason"], out["block_size"]) == (18, "unseen", 4)
    assert out["runs"] == [{"tier": "disk", "start": 0, "end": 18}] and out["hybrid"]
    # between snapshots (a hybrid's state can't be cut): from the one at 12? none: at 0
    out = why(shared + [50, 51, 99])
    assert out["restored"] == 0 and out["miss"]["reason"] == "no_snapshot"
    assert out["miss"]["recomputed"] == 14
    assert why(shared + [60, 61, 62, 63, 64])["miss"] is None            # cached whole
    assert why([1, 2, 3, 4, 5], "--salt", "x")["miss"]["reason"] == "unseen"
    # a departure the store recorded: the snapshot at 17 thinned away
    spec = hybrid_spec()
    with CacheStore(store_dir, spec, FP) as s:
        tokens = shared + [60, 61, 62, 63, 64]
        s.forget([s.lookup(tokens).snapshot.key])
    out = why(shared + [60, 61, 62, 63, 64, 80])
    assert out["restored"] == 0 and out["miss"]["reason"] == "thinned"
    assert out["miss"]["recomputed"] == 17 and out["departures_recorded"] == 1
    code, text, _ = inspect(capsys, *d, "why", str(prompt))
    assert code == 0 and "would restore: nothing" in text and "thinned" in text
    # text needs a tokenizer; bad files are one line
    prompt.write_text("plain text")
    code, _, err = inspect(capsys, *d, "why", str(prompt))
    assert code == 2 and "give --model" in err and len(err.strip().splitlines()) == 1
    code, _, err = inspect(capsys, *d, "why", str(tmp_path / "nope.txt"))
    assert code == 2 and "no prompt file" in err
