"""A long chat with images: the next turn's time to first token, cold and cached, and
the vision encoder's share of the cold time (issue 29).

    python -m ckptd.tools.bench.vision [--context 32768] [--images 4] [--out DIR]
        [--model DIR|FILE.gguf [--mmproj FILE]] [--peer-command "CMD --port {port}"]

Without --model it writes a random multimodal Qwen3.5 (`make-tiny --vision` with the
shapes below: a text model of ~30M parameters a token and a vision tower in about the
real model's proportion to it) and, with a peer, its GGUF and mmproj. The chat: turns
of text with `--images` pictures spread over them, `--context` tokens in all, ending
with a question; its answer is appended with a second question, the next turn.

- cold: the next turn sent to a daemon with an empty cache (every image encoded);
- cached: the same daemon after it answered the turn before (a real chat's order);
- encoder: seconds the cold turn spent in the vision encoder (ckptd's /metrics).

The peer (llama-server with --mmproj) gets the same two requests on one process.
Writes results.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from ckptd.tools.bench.client import Client
from ckptd.tools.bench.managed import ManagedDaemon, ManagedPeer
from ckptd.tools.make_tiny_vision import make_tiny_vision

# ~1/10 of Qwen3.5-35B-A3B's active text weights a token against ~1/10 of its vision
# tower (27 blocks of 1152): their ratio, which sets the encoder's share, is kept
SHAPES = {"text": {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
                   "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 1536,
                   "linear_key_head_dim": 64, "linear_value_head_dim": 64,
                   "linear_num_key_heads": 4, "linear_num_value_heads": 8,
                   "layer_types": ["linear_attention"] * 3 + ["full_attention"]
                   + ["linear_attention"] * 3 + ["full_attention"],
                   "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
                                       "partial_rotary_factor": 0.25,
                                       "mrope_section": [3, 3, 2], "mrope_interleaved": True}},
          "vision": {"depth": 6, "hidden_size": 256, "num_heads": 4, "intermediate_size": 1024,
                     "out_hidden_size": 512, "num_position_embeddings": 2304}}
WORDS = ("the cache keeps what was computed so that a later question computes only "
         "itself while the picture stays in the context of the long conversation").split()


def _pictures(n: int, size: tuple[int, int]) -> list[str]:
    """n distinct seeded pictures as data URLs."""
    out = []
    for i in range(n):
        rng = np.random.default_rng(100 + i)
        # smooth noise: a photo-like picture (PNG of pure noise is all entropy)
        small = rng.integers(0, 256, (size[1] // 16, size[0] // 16, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize(size, Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        out.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    return out


def _chat(client: Client, context: int, n_images: int, size: tuple[int, int]) -> list[dict]:
    """The chat up to its last question: user and assistant turns of filler text,
    a picture in every len(turns) / n_images-th user turn, about `context` tokens."""
    pics = _pictures(n_images, size)
    turn_words = 300
    messages: list[dict] = []
    i = 0
    while True:
        words = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(turn_words))
        content: list[dict] = [{"type": "text", "text": f"Turn {i}: {words}"}]
        messages.append({"role": "user", "content": content})
        messages.append({"role": "assistant", "content": f"Noted, turn {i}. " + words[:200]})
        i += 1
        if _tokens(client, messages) >= context:
            break
    users = [m for m in messages if m["role"] == "user"]
    for k, url in enumerate(pics):
        users[(k * len(users)) // n_images]["content"].append(
            {"type": "image_url", "image_url": {"url": url}})
    messages.append({"role": "user", "content": "What did the first picture show?"})
    return messages


def _tokens(client: Client, messages: list[dict]) -> int:
    status, out = client.request("POST", "/v1/chat/completions/input_tokens",
                                 {"messages": messages})
    if status != 200:
        raise RuntimeError(f"input_tokens: HTTP {status}: {out}")
    return out["input_tokens"]


def _metric(client: Client, name: str) -> float:
    status, text = client.request("GET", "/metrics")
    for line in str(text).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _turns(client: Client, chat: list[dict], answer_tokens: int):
    """The turn before (answered) and the next turn's messages."""
    before = client.chat(chat, answer_tokens)
    return before, chat + [{"role": "assistant", "content": before.text},
                           {"role": "user", "content": "And the last one?"}]


def _measure(m) -> dict:
    return {"ttft_ms": round(m.ttft_ms, 1), "prompt_n": m.prompt_n, "cache_n": m.cache_n}


def run_ckptd(model: str, serve_args: list[str], out: Path, context: int, n_images: int,
              size: tuple[int, int], answer: int) -> tuple[dict, list[dict]]:
    """ckptd's figures, and the next turn's messages (for the peer)."""
    res: dict = {}
    with tempfile.TemporaryDirectory(prefix="ckptd-vision-") as tmp, \
            ManagedDaemon(model, Path(tmp), out / "ckptd-cached.log", serve_args) as d:
        client = d.start()
        client.timeout = 4 * 3600          # a cold 32K-token prefill on a small CPU
        chat = _chat(client, context, n_images, size)
        before, nxt = _turns(client, chat, answer)
        res["turn_before"] = _measure(before)
        res["cached"] = _measure(client.chat(nxt, answer))
    with tempfile.TemporaryDirectory(prefix="ckptd-vision-") as tmp, \
            ManagedDaemon(model, Path(tmp), out / "ckptd-cold.log", serve_args) as d:
        client = d.start()
        client.timeout = 4 * 3600
        enc0 = _metric(client, "ckptd_image_encode_seconds_total")
        res["cold"] = _measure(client.chat(nxt, answer))
        res["encoder_ms"] = round(
            (_metric(client, "ckptd_image_encode_seconds_total") - enc0) * 1000, 1)
        res["encoder_share"] = round(res["encoder_ms"] / res["cold"]["ttft_ms"], 4)
    return res, chat


def run_peer(command: str, out: Path, chat: list[dict], answer: int) -> dict:
    """The peer's next turn after the turn before on one process (its own cache), and on
    a fresh one."""
    res: dict = {}
    with ManagedPeer(command, out / "peer.log") as p:
        client = p.start()
        before, nxt = _turns(client, chat, answer)
        res["turn_before"] = _measure(before)
        res["cached"] = _measure(client.chat(nxt, answer))
        client = p.restart()
        res["cold"] = _measure(client.chat(nxt, answer))
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="HF folder or GGUF (default: a random one, see SHAPES)")
    p.add_argument("--mmproj", help="the vision tower of a GGUF --model")
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--images", type=int, default=4)
    p.add_argument("--image-size", default="640x480")
    p.add_argument("--answer", type=int, default=8, help="tokens a turn's answer takes")
    p.add_argument("--serve-arg", action="append", default=[])
    p.add_argument("--peer-command", help="llama-server ... --port {port}: the same turns")
    p.add_argument("--out", type=Path, default=Path("bench-out/vision"))
    args = p.parse_args(argv)
    size = tuple(int(x) for x in args.image_size.split("x"))
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        model = str(args.out / "model")
        if not (Path(model) / "config.json").is_file():
            make_tiny_vision("qwen3_5_text", model, sizes=SHAPES,
                             gguf=args.out / "model.gguf" if args.peer_command else None)
    serve = [*args.serve_arg, *(["--mmproj", args.mmproj] if args.mmproj else [])]
    ours, chat = run_ckptd(model, serve, args.out, args.context, args.images, size,
                           args.answer)
    res = {"context": args.context, "images": args.images, "image_size": args.image_size,
           "ckptd": ours}
    if args.peer_command:
        res["peer"] = run_peer(args.peer_command, args.out, chat, args.answer)
    (args.out / "results.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
