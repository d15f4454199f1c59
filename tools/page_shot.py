"""The picture of the cache page in docs/img/: a real daemon, a scripted workload that
leaves the misses people ask about, then headless Chromium on `/` while a long
prefill runs.

    python -m ckptd.tools.page_shot [--model PATH] [--out docs/img/cache-page.png]
                                    [--minutes 3]

The default model is the embedded SmolLM2 (readable previews). The workload: two
named contexts (this project's own docs), questions over them, a tenant with its own
cache_salt, prompts that part from cached ones mid-block, a few that evict older
ones from small tiers, then a long prompt whose prefill the picture catches. The
tiers are sampled every 5 s, so the charts fill over --minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path

from ckptd.tools.bench.managed import ROOT, ManagedDaemon
from ckptd.tools.browser import Chromium

QUESTIONS = ("What is a snapshot?", "Where do evicted blocks go?", "How are keys hashed?",
             "What does the restorer do?", "Why are prompts cut at branch points?",
             "What survives a restart?")


def _text(path: str, chars: int) -> str:
    return (ROOT / path).read_text()[:chars]


def workload(client, minutes: float) -> None:
    def ok(method, path, body=None):
        status, out = client.request(method, path, body)
        if status >= 400:
            raise RuntimeError(f"{path}: {status} {out}")
        return out
    ok("POST", "/v1/contexts", {"name": "architecture", "text": _text("docs/ARCHITECTURE.md",
                                                                      6000)})
    ok("POST", "/v1/contexts", {"name": "readme", "text": _text("README.md", 3000)})
    end = time.monotonic() + minutes * 60
    i = 0
    while time.monotonic() < end:
        q = QUESTIONS[i % len(QUESTIONS)] + " " * (i // len(QUESTIONS))
        ctx = ("architecture", "readme")[i % 2]
        ok("POST", "/completion", {"prompt": f"\n\nQuestion: {q}\nAnswer:", "context": ctx,
                                   "n_predict": 8})
        if i % 3 == 0:                       # another tenant: its own entries
            ok("POST", "/completion", {"prompt": _text("README.md", 1500) + "\nSummary:",
                                       "cache_salt": "tenant-b", "n_predict": 4})
        if i % 4 == 1:                       # fresh prompts, which push old ones out
            ok("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content":
                _text("docs/BENCHMARKS.md", 4000)[i * 97 % 2000:][:1500]}], "max_tokens": 4})
        if i % 5 == 2:                       # a prompt seen long ago: evicted meanwhile?
            ok("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content":
                _text("docs/BENCHMARKS.md", 4000)[97:][:1500]}], "max_tokens": 4})
        i += 1
        time.sleep(2)


async def shoot(url: str, client, out: Path) -> None:
    _, ids = client.request("POST", "/tokenize", {"content": _text("docs/ARCHITECTURE.md",
                                                                     60000)[6000:]})
    long_prompt = {"prompt": ids["tokens"][:6000], "n_predict": 4}
    t = threading.Thread(target=client.request, args=("POST", "/completion", long_prompt),
                         daemon=True)
    async with Chromium(width=1440, height=1000) as page:
        await page.goto(url + "/")
        await page.wait_for("document.querySelectorAll('[data-node]').length > 0", 60)
        t.start()
        await page.wait_for("(() => { const r = document.querySelector("
                            "'[data-request][data-state=prefill]'); return r && "
                            "Number(r.dataset.computed) > 0.3 * Number(r.dataset.prompt); })()",
                            600, 0.2)
        await asyncio.sleep(0.5)
        await page.screenshot(out)
        if page.errors:
            raise RuntimeError(f"the page threw: {page.errors}")
    t.join()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptd.tools.page_shot",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model folder or GGUF (default: the embedded SmolLM2)")
    p.add_argument("--out", default=str(ROOT / "docs/img/cache-page.png"))
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--serve-args", default="", help="more flags for ckptd serve")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        daemon = ManagedDaemon(args.model, Path(tmp) / "cache", Path(tmp) / "daemon.log",
                               ["--max-context", "8192", "--parallel", "2", "--step-tokens",
                                "128", "--snapshot-interval", "256", "--max-snapshots", "4",
                                "--host-budget", "64MB", "--disk-budget", "160MB",
                                *args.serve_args.split()])
        with daemon:
            client = daemon.start()
            workload(client, args.minutes)
            asyncio.run(shoot(client.url, client, Path(args.out)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
