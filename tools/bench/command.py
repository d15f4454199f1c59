"""`ckptd bench`: time to first token, cold and warm, against a running daemon or one it starts.

    ckptd bench --model DIR|FILE.gguf [--out bench-out]     start a daemon, restart it too
    ckptd bench --url http://127.0.0.1:8080                 a daemon already running
    ckptd bench ... --peer http://127.0.0.1:8090            the same against llama.cpp's
                                                            or llama-cpp-python's server
    ckptd bench ... --peer-command "CMD --port {port}"      start that peer itself, and
                                                            restart it with the daemon

With neither --url nor --model it starts a daemon on the embedded default model.
Scenarios (tools/bench/scenarios.py): TTFT per context length (cold, warm, and
after a restart when the daemon is its own), a multi-turn chat, and a memory
store (one document, many questions). Writes results.json, report.md and PNG
plots into --out. Every prompt opens with this run's tag, so "cold" is cold even
on a daemon whose cache already holds an earlier run.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

from ckptd.model.placement import check_names
from ckptd.tools.bench import report as bench_report
from ckptd.tools.bench import scenarios as bench_scenarios
from ckptd.tools.bench.client import Client, ServerError
from ckptd.tools.bench.managed import ManagedDaemon, ManagedPeer

SCENARIOS = ("context", "chat", "memory")


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--lengths: expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"--lengths: expected positive integers, got {text!r}")
    return vals


def add_arguments(parser) -> None:
    where = parser.add_argument_group("what to benchmark")
    where.add_argument("--url", help="a running ckptd daemon (no restart measurement)")
    where.add_argument("--model", help="start a daemon on this HF folder or .gguf itself")
    where.add_argument("--cache-dir", help="the started daemon's cache (default: a new "
                       "temporary folder, removed afterwards)")
    where.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                       help="extra `ckptd serve` flag for the started daemon, e.g. "
                       "--serve-arg=--snapshot-interval=256 (repeatable)")
    where.add_argument("--weights", choices=("keep", "expand"),
                       help="the started daemon's --weights (default: its own, keep)")
    where.add_argument("--device", help="the started daemon's --device: auto, cpu, cuda or "
                       "cuda:N (default: the daemon's, auto)")
    where.add_argument("--dtype", help="the started daemon's --dtype: auto, bfloat16, float16 "
                       "or float32 (default: the daemon's, auto)")
    where.add_argument("--api-key", help="the daemon's API key")
    where.add_argument("--peer", metavar="URL", help="also run every scenario against this "
                       "OpenAI-compatible server (llama.cpp, llama-cpp-python)")
    where.add_argument("--peer-command", metavar="CMD", help="start the peer itself with this "
                       "shell command ({port} is replaced by a free port), and restart it "
                       "when the daemon restarts, to measure both after a restart")
    where.add_argument("--peer-name", default="llama.cpp", help="its label in the report")
    what = parser.add_argument_group("scenarios")
    what.add_argument("--scenarios", default=",".join(SCENARIOS),
                      help=f"comma-separated subset of {', '.join(SCENARIOS)}")
    what.add_argument("--lengths", default="512,1024,2048,4096",
                      help="context lengths in tokens (default 512,1024,2048,4096)")
    what.add_argument("--repeat", type=int, default=1, help="requests per point (median)")
    what.add_argument("--max-tokens", type=int, default=8, help="tokens generated per request")
    what.add_argument("--chat-turns", type=int, default=6)
    what.add_argument("--turn-tokens", type=int, default=128, help="tokens per user message")
    what.add_argument("--memory-tokens", type=int, default=2048, help="the document's length")
    what.add_argument("--questions", type=int, default=4)
    out = parser.add_argument_group("output")
    out.add_argument("--out", default="bench-out", help="folder for results (default bench-out)")
    out.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    out.add_argument("--timeout", type=float, default=600.0, help="seconds per request")


def _check(args) -> tuple[list[str], list[int]]:
    if args.url and args.model:
        raise ValueError("give --url (a running daemon) or --model (start one), not both")
    if args.peer and args.peer_command:
        raise ValueError("give --peer (a running server) or --peer-command (start one), "
                         "not both")
    if args.peer_command is not None and "{port}" not in args.peer_command:
        raise ValueError("--peer-command must contain {port}, where the peer listens")
    if args.url and (args.cache_dir or args.serve_arg or args.weights or args.device
                     or args.dtype):
        raise ValueError("--cache-dir, --serve-arg, --weights, --device and --dtype apply "
                         "only to a daemon started with --model")
    check_names(args.device or "auto", args.dtype or "auto")
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    bad = [s for s in scenarios if s not in SCENARIOS]
    if bad or not scenarios:
        raise ValueError(f"--scenarios: unknown {', '.join(bad) or '(none)'}; choose from "
                         f"{', '.join(SCENARIOS)}")
    for name in ("repeat", "max_tokens", "chat_turns", "turn_tokens", "memory_tokens",
                 "questions"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.model is not None and not Path(args.model).exists():
        raise FileNotFoundError(f"--model: no such file or folder: {args.model}")
    return scenarios, _int_list(args.lengths)


def run_server(name: str, client: Client, maker, args, scenarios: list[str],
               lengths: list[int], tag: str, log) -> tuple[list[dict], dict[int, str]]:
    """Every chosen scenario against one server; rows labelled with its name."""
    rows, prompts = [], {}
    bench_scenarios.warm_up(client, f"{tag}-{name}")
    if "context" in scenarios:
        log(f"{name}: context lengths {lengths}")
        got, prompts = bench_scenarios.context_lengths(client, maker, lengths, args.max_tokens,
                                                       args.repeat, tag)
        rows += got
    if "chat" in scenarios:
        log(f"{name}: chat, {args.chat_turns} turns")
        rows += bench_scenarios.chat(client, maker, args.chat_turns, args.turn_tokens,
                                     args.max_tokens, tag)
    if "memory" in scenarios:
        log(f"{name}: memory store, {args.memory_tokens} tokens, {args.questions} questions")
        rows += bench_scenarios.memory(client, maker, args.memory_tokens, args.questions,
                                       args.max_tokens, tag)
    for r in rows:
        r["server"] = name
    if "memory" in scenarios and name == "ckptd":
        log(f"{name}: memory store as a named context")
        got = bench_scenarios.memory_context(client, maker, args.memory_tokens,
                                             args.questions, args.max_tokens, tag)
        rows += [{**r, "server": f"{name} (named context)"} for r in got]
    return rows, prompts


def run(args) -> int:
    scenarios, lengths = _check(args)
    out = Path(args.out)
    tag = uuid.uuid4().hex[:8]
    log = lambda msg: print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)
    started = args.url is None
    with tempfile.TemporaryDirectory(prefix="ckptd-bench-") as tmp:
        daemon = None
        if started:
            cache_dir = Path(args.cache_dir) if args.cache_dir else Path(tmp) / "cache"
            extra = [f"--{k}={v}" for k, v in (("device", args.device), ("dtype", args.dtype),
                                                ("weights", args.weights)) if v]
            daemon = ManagedDaemon(args.model, cache_dir, out / "daemon.log",
                                   [*args.serve_arg, *extra])
            log(f"starting {' '.join(daemon.command())}")
            client = daemon.start()
        else:
            client = Client(args.url, args.api_key, args.timeout)
            client.wait_ready(30.0)
        client.timeout = args.timeout
        try:
            results = _run_all(args, client, daemon, scenarios, lengths, tag, log)
        finally:
            if daemon is not None:
                daemon.stop()
    results["meta"]["started daemon"] = started
    results["meta"]["load average at the end"] = _load()
    paths = bench_report.write(results, out, with_plots=not args.no_plots)
    print(bench_report.markdown(results))
    log("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _run_all(args, client: Client, daemon: ManagedDaemon | None, scenarios: list[str],
             lengths: list[int], tag: str, log) -> dict:
    maker = bench_scenarios.PromptMaker(client)
    meta = {"run": tag, "ckptd": client.url, "model": _model_id(client),
            "scenarios": ",".join(scenarios), "max tokens per request": args.max_tokens,
            "repeat": args.repeat, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "CPUs": os.cpu_count(), "load average at the start": _load()}
    if daemon is not None:
        meta["daemon command"] = "`" + " ".join(daemon.command()) + "`"
    rows, prompts = run_server("ckptd", client, maker, args, scenarios, lengths, tag, log)
    if daemon is not None and prompts:
        log("restarting the daemon: its RAM tier is gone, its disk tier stays")
        client = daemon.restart()
        client.timeout = args.timeout
        bench_scenarios.warm_up(client, f"{tag}-restart")
        restart = bench_scenarios.after_restart(client, maker, prompts, args.max_tokens)
        rows += [{**r, "server": "ckptd"} for r in restart]
    if args.peer or args.peer_command:
        with ManagedPeer(args.peer_command, Path(args.out) / "peer.log") \
                if args.peer_command else nullcontext() as managed:
            rows += _run_peer(args, managed, maker, meta, scenarios, lengths, tag, log)
    return {"meta": meta, "rows": rows}


def _run_peer(args, managed: ManagedPeer | None, maker, meta: dict, scenarios: list[str],
              lengths: list[int], tag: str, log) -> list[dict]:
    """The same scenarios against the peer; when the bench started it, restart it as the
    daemon was restarted and send each length's prompt again."""
    if managed is not None:
        log(f"starting the peer: {managed.cmd}")
        managed.start()
        meta["peer command"] = f"`{managed.cmd}`"
    def connect(url: str) -> Client:
        return Client(url, None, args.timeout, extra={"cache_prompt": True})
    peer = connect(managed.client.url if managed is not None else args.peer)
    peer.wait_ready(30.0)
    meta["peer"] = f"{args.peer_name} at {peer.url}, model {_model_id(peer)}"
    rows, prompts = run_server(args.peer_name, peer, maker, args, scenarios, lengths, tag, log)
    if managed is not None and prompts:
        log("restarting the peer")
        peer = connect(managed.restart().url)
        try:
            bench_scenarios.warm_up(peer, f"{tag}-peer-restart")
            restart = bench_scenarios.after_restart(peer, maker, prompts, args.max_tokens)
        except ServerError as e:       # the peer's failure is a finding, not the bench's
            log(f"the peer failed after its restart: {e}")
            meta["peer after restart"] = f"failed: {e} (see peer.log)"
            return rows
        rows += [{**r, "server": args.peer_name} for r in restart]
    return rows


def _model_id(client: Client) -> str:
    status, models = client.request("GET", "/v1/models")
    if status == 200 and isinstance(models, dict) and models.get("data"):
        return str(models["data"][0].get("id", "?"))
    return "?"


def _load() -> str:
    """1/5/15-minute load averages: other work on the machine skews every figure."""
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"
