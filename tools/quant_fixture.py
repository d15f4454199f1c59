"""Writes tests/data/quant/tiny-hybrid-mix.gguf: a tiny Qwen3.5 hybrid quantized by
llama.cpp's own llama-quantize (tools/build_llama_cpp.sh llama-quantize) into every block format
ckptd keeps, so CI checks them all without the binary.

Q4_K_M is the base (Q4_K, with Q6_K for the output and some ffn_down / attn_v);
--tensor-type moves single tensors to Q5_K, Q8_0, Q4_0 and Q4_1. Every row is 256
values wide (hidden 256, value and attention widths 256), so no tensor falls back to a
format meant for narrow rows.

    python -m ckptd.tools.quant_fixture [--quantize .peer-server/llama-quantize]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from ckptd.tools.make_tiny import make_tiny

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "quant" / "tiny-hybrid-mix.gguf"
SIZES = {"hidden_size": 256, "intermediate_size": 256, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "linear_value_head_dim": 64,
         "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]}
# tensor name pattern -> type, on top of Q4_K_M
OVERRIDES = {"ffn_up": "q5_k", "attn_gate": "q8_0", "ffn_gate": "q4_0", "attn_output": "q4_1"}


def quantize(binary: Path, src: Path, dst: Path, base: str = "Q4_K_M",
             overrides: dict[str, str] | None = None, pure: bool = False) -> Path:
    """llama-quantize src (an F32 GGUF) into dst."""
    cmd = [str(binary)]
    if pure:
        cmd.append("--pure")
    for name, kind in (overrides or {}).items():
        cmd += ["--tensor-type", f"{name}={kind}"]
    cmd += [str(src), str(dst), base]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(f"llama-quantize failed: {r.stderr[-800:]}")
    return dst


def build(binary: Path, out: Path = OUT) -> Path:

    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "f32.gguf"
        make_tiny("qwen3_5_text", Path(tmp) / "hf", seed=3, gguf=f32, sizes=SIZES)
        out.parent.mkdir(parents=True, exist_ok=True)
        return quantize(binary, f32, out, overrides=OVERRIDES)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quantize", type=Path, default=ROOT / ".peer-server" / "llama-quantize")
    out = build(p.parse_args().quantize)
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
