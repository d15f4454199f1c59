"""llama-server's decode tokens/s at a long context without its cold prefill: the peer's
`bench.decode --random-kv`.

    python -m ckptd.tools.bench.peer_decode --peer .peer-server/llama-server
        [--model M.gguf] [--context 7060,65000] [--decode 16] [--threads 2]

A 64K cold prefill of SmolLM2 takes llama-server hours on this 2-core machine (8.4 tok/s
by 4K tokens under load, falling as the context grows), and a decode step's cost does
not depend on the KV's values. So the server (`--slot-save-path`, a context of the
largest --context, the model's trained length overridden to reach it) first saves a
real slot after a short prompt; that save gives the file's layout (the server's token
list, one KV stream, each cell's position, every layer's K then V rows with their type
and row size), checked against what this module writes for the same tokens. Then for
each context: a slot of that many random tokens with random fp16 K/V is written,
restored (`POST /slots/0?action=restore`), and a /completion of the same tokens with
--decode tokens asked: `cache_n` (context - 1: it decoded on the restored context) and
`timings.predicted_per_second` are reported, with the server's CPU-seconds over the
request (its process tree, /proc) and the 1-minute load. Layout of llama.cpp 0.3.36's
slot files (its `llama_kv_cache::state_write`); a build that writes another refuses here.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ckptd.model.default import default_model_path
from ckptd.tools.bench.kept_weights import _cpu_s, _wait
from ckptd.tools.bench.managed import free_port

_MAGIC, _VERSION = 0x67677371, 3        # 'ggsq', llama.cpp's sequence state file
_F16 = 1                                # ggml's type id of f16


@dataclass(frozen=True)
class Layout:
    """What a slot file's KV part holds per cell: layers, and each K / V row's bytes."""
    layers: int
    row: int


def read_layout(blob: bytes) -> tuple[list[int], Layout]:
    """The tokens and KV layout of a slot file llama-server saved; ValueError for one
    this module can't write (another version, several streams, f32 or transposed V)."""
    magic, version, n = struct.unpack_from("<III", blob, 0)
    if (magic, version) != (_MAGIC, _VERSION):
        raise ValueError(f"not a version {_VERSION} slot file")
    listed = list(struct.unpack_from(f"<{n}i", blob, 12))
    off = 12 + 4 * n
    streams, cells = struct.unpack_from("<II", blob, off)
    if streams != 1 or listed[:2] != [-1, 1] or listed[2] != cells or listed[-1] != 0:
        raise ValueError("a slot file of another layout")
    off += 8 + 12 * cells
    v_trans, layers = struct.unpack_from("<II", blob, off)
    kind, row = struct.unpack_from("<iQ", blob, off + 8)
    if v_trans or kind != _F16:
        raise ValueError("only f16 K/V, not transposed")
    return listed[3:3 + cells], Layout(layers, row)


def write_slot(path: Path, tokens: list[int], layout: Layout, seed: int = 0) -> None:
    """A slot file holding `tokens` (positions 0..n-1 of sequence 0) with random f16 K/V
    (one layer's values, repeated: a step reads every layer's anyway)."""
    n = len(tokens)
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((n, layout.row // 2), dtype=np.float32)
    values = values.astype(np.float16).tobytes()
    cells = np.zeros((n, 3), dtype=np.int32)       # position, one sequence id, id 0
    cells[:, 0], cells[:, 1] = np.arange(n), 1
    listed = [-1, 1, n, *tokens, 0]
    with open(path, "wb") as f:
        f.write(struct.pack("<III", _MAGIC, _VERSION, len(listed)))
        f.write(np.asarray(listed, dtype=np.int32).tobytes())
        f.write(struct.pack("<II", 1, n))
        f.write(cells.tobytes())
        f.write(struct.pack("<II", 0, layout.layers))
        for _ in range(2 * layout.layers):             # every layer's K, then every V
            f.write(struct.pack("<iQ", _F16, layout.row))
            f.write(values)


def _post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=7200) as r:
        return json.loads(r.read())


def measure(port: int, pid: int, folder: Path, layout: Layout, tokens: list[int],
            decode: int) -> dict:
    name = f"ctx{len(tokens)}.bin"
    write_slot(folder / name, tokens, layout)
    _post(port, "/slots/0?action=restore", {"filename": name})
    (folder / name).unlink()
    cpu0 = _cpu_s(pid)
    out = _post(port, "/completion", {"prompt": tokens, "n_predict": decode,
                                      "cache_prompt": True, "temperature": 0,
                                      "ignore_eos": True})
    t = out["timings"]
    return {"server": "llama-server", "context": len(tokens), "cache_n": t["cache_n"],
            "decoded": t["predicted_n"], "ms_per_token": round(t["predicted_per_token_ms"], 1),
            "tokens_per_s": round(t["predicted_per_second"], 3),
            "cpu_s": round(_cpu_s(pid) - cpu0, 1),
            "load_1min": round(os.getloadavg()[0], 1)}


def run(args) -> int:
    contexts = [int(c) for c in args.context.split(",") if c.strip()]
    if not contexts or min(contexts) < 2 or args.decode < 1:
        raise ValueError("--context and --decode must be positive (contexts >= 2)")
    rng = np.random.default_rng(1)
    tokens = rng.integers(100, 20_000, max(contexts)).tolist()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="peer-slots-") as folder:
        ctx = max(contexts) + args.decode + 64
        cmd = [args.peer, "--model", args.model, "--port", str(port), "--host", "127.0.0.1",
               "--ctx-size", str(ctx), "--parallel", "1", "--threads", str(args.threads),
               "--threads-batch", str(args.threads), "--slot-save-path", folder,
               "--override-kv", f"{args.arch}.context_length=int:{ctx}", "--no-webui"]
        if args.flash_attn:
            cmd += ["--flash-attn", args.flash_attn]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait(port, proc)
            _post(port, "/completion", {"prompt": tokens[:8], "n_predict": 1})
            _post(port, "/slots/0?action=save", {"filename": "probe.bin"})
            blob = (Path(folder) / "probe.bin").read_bytes()
            saved, layout = read_layout(blob)
            write_slot(Path(folder) / "mine.bin", saved, layout)
            if len((Path(folder) / "mine.bin").read_bytes()) != len(blob):
                raise ValueError("this llama-server's slot file has another layout")
            for n in contexts:
                print(json.dumps(measure(port, proc.pid, Path(folder), layout, tokens[:n],
                                         args.decode)), flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="peer_decode", description=__doc__.split("\n")[0])
    p.add_argument("--peer", required=True, help="the llama-server binary")
    p.add_argument("--model", default=str(default_model_path()))
    p.add_argument("--arch", default="llama", help="the GGUF's architecture key prefix")
    p.add_argument("--context", default="7060,65000")
    p.add_argument("--decode", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--flash-attn", choices=("on", "off", "auto"), default=None,
                   help="passed to llama-server (default: the server's own, auto)")
    args = p.parse_args(argv)
    try:
        return run(args)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"peer_decode: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
