"""The long-context workload against a peer: one big static context queried again
and again, the server killed and started again in the middle.

    python -m ckptd.tools.bench.long_context --model M.gguf --length 65536
        [--questions 5] [--question-tokens 24] [--answer 8] [--serve-arg=--flag=value]
        [--peer-name llama-server --peer-command ".peer-server/llama-server --port {port}
         --model M.gguf --ctx-size 262144 ..."] [--out DIR]

For each server, from nothing cached: a short warm-up request, then

    cold        the context followed by a first question (the whole prompt computed)
    question i  the same context followed by another question, --questions times
    restart     SIGKILL, start again (ckptd on the same cache folder), one more question
                (left out with --no-restart)

Prompts are token ids (random, within the model's vocabulary), sent to
/v1/completions, so both servers see the very same tokens, and each generates exactly
--answer tokens (ignore_eos). Reported per request: TTFT and the whole request's time on
the client, the decode speed after the first token, and the prompt tokens the server
says it computed.
Writes report.md and results.json into --out.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import tempfile
from pathlib import Path

from ckptd.model.gguf.load import field, open_gguf
from ckptd.tools.bench.client import Client, Measured
from ckptd.tools.bench.managed import ManagedDaemon, ManagedPeer


def _vocab(model: str) -> int:
    """Token ids every server accepts: the GGUF's vocabulary."""

    tokens = field(open_gguf(model), "tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError(f"{model}: no vocabulary in its header")
    return len(tokens)


# A cold 250K-token prompt streams nothing for many minutes on a CPU (the first token
# ends the prefill): the client waits that long for both servers.
_TIMEOUT = 4 * 3600.0


def _row(server: str, phase: str, m: Measured) -> dict:
    decode_s = (m.total_ms - m.ttft_ms) / 1000
    tokens = (m.completion_n or 0) - 1              # the first token ends the prefill
    return {"server": server, "phase": phase, "ttft_ms": round(m.ttft_ms, 1),
            "total_ms": round(m.total_ms, 1),
            "decode_tok_s": round(tokens / decode_s, 1) if tokens > 0 and decode_s > 0 else None,
            "prompt_n": m.prompt_n, "computed_n": m.computed_n, "cache_n": m.cache_n}


def _complete(client: Client, prompt: list[int], answer: int) -> Measured:
    return client.complete(prompt, answer, ignore_eos=True)


def scenario(name: str, server, doc: list[int], questions: list[list[int]],
             answer: int, restart: bool = True) -> list[dict]:
    """Runs the workload on a started server (ManagedDaemon or ManagedPeer); restart:
    with the SIGKILL and one more question after it."""
    client: Client = server.client
    client.timeout = _TIMEOUT
    client.complete([1, 2, 3, 4], 2)                       # one-time costs land here
    rows = [_row(name, "cold", _complete(client, doc + questions[0], answer))]
    for i, q in enumerate(questions[1:-1], 1):
        rows.append(_row(name, f"question {i}", _complete(client, doc + q, answer)))
        print(f"{name}: {rows[-1]}", flush=True)
    if not restart:
        print(f"{name}: {rows[0]}", flush=True)
        return rows
    server.kill()
    client = server.start()
    client.timeout = _TIMEOUT
    rows.append(_row(name, "restart", _complete(client, doc + questions[-1], answer)))
    print(f"{name}: {rows[0]}\n{name}: {rows[-1]}", flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    out = ["| server | phase | TTFT ms | total ms | decode tok/s | prompt tokens | computed |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        computed = "–" if r["computed_n"] is None else f"{r['computed_n']:,}"
        decode = "–" if r.get("decode_tok_s") is None else f"{r['decode_tok_s']:.1f}"
        out.append(f"| {r['server']} | {r['phase']} | {r['ttft_ms']:,.1f} | "
                   f"{r.get('total_ms', 0):,.1f} | {decode} | {r['prompt_n'] or '–'} | "
                   f"{computed} |")
    servers = list(dict.fromkeys(r["server"] for r in rows))
    if len(servers) == 2:
        a, b = servers

        def mean(server: str, prefix: str, key: str = "ttft_ms") -> float:
            xs = [r[key] for r in rows if r["server"] == server
                  and r["phase"].startswith(prefix)]
            return sum(xs) / len(xs)
        for phase in ("cold", "question", "restart"):
            if not any(r["phase"].startswith(phase) for r in rows):
                continue
            out.append(f"\n{phase}: {b} / {a} = {mean(b, phase) / mean(a, phase):.2f}x")
        out.append(f"\nquestion, whole request: {b} / {a} = "
                   f"{mean(b, 'question', 'total_ms') / mean(a, 'question', 'total_ms'):.2f}x")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptd.tools.bench.long_context",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a .gguf both servers load")
    p.add_argument("--length", type=int, default=65536, help="context tokens")
    p.add_argument("--questions", type=int, default=5)
    p.add_argument("--question-tokens", type=int, default=24)
    p.add_argument("--answer", type=int, default=8, help="tokens generated per request")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="an extra `ckptd serve` argument (repeatable)")
    p.add_argument("--peer-name", default="peer")
    p.add_argument("--peer-command", help="a shell command starting the peer on {port}")
    p.add_argument("--no-restart", dest="restart", action="store_false",
                   help="leave out the SIGKILL and restart (a 250K cold prefill is long: "
                        "a peer without a persistent cache computes it all again there)")
    p.add_argument("--out", default="bench-out/long-context")
    args = p.parse_args(argv)
    if args.length < 1 or args.questions < 1 or args.answer < 1:
        print("long_context: --length, --questions and --answer must be positive",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = _vocab(args.model)
    rng = random.Random(args.length)
    doc = [rng.randrange(3, vocab) for _ in range(args.length)]
    questions = [[rng.randrange(3, vocab) for _ in range(args.question_tokens)]
                 for _ in range(args.questions + 2)]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        serve = [a for arg in args.serve_arg for a in shlex.split(arg)]
        with ManagedDaemon(args.model, Path(tmp) / "cache", out / "ckptd.log", serve) as d:
            d.start()
            rows += scenario("ckptd", d, doc, questions, args.answer, args.restart)
    if args.peer_command:
        with ManagedPeer(args.peer_command, out / f"{args.peer_name}.log") as peer:
            peer.start()
            rows += scenario(args.peer_name, peer, doc, questions, args.answer, args.restart)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    report = markdown(rows)
    (out / "report.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
