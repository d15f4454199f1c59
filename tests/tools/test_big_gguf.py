"""tools/bench/big_gguf.py's files, and the memory property they exist to measure: a GGUF
loaded with --weights keep is served from the mapped file, not from a copy.

The model here has the A3B's widths (hidden 2048, experts of 512, heads of 128 / 256)
but 4 layers, 8 experts and a 512-token vocabulary: ~70 MB, written in about a second.
(The layout against llama.cpp's converter: tests/model/test_llamacpp_moe.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest

from ckptd.tools.bench.big_gguf import a3b_shaped, layout, main, random_blocks, write
from tests.kernels.quant_data import FIXTURE

# what a loaded model may add to the process's own memory, as a share of the file's
# quantized bytes: the fused projections (q/k/v, DeltaNet's inputs, the shared expert's
# gate/up) are concatenated copies, ~25% of this file; a copy of the experts adds >60%
ANON_SHARE = 0.45


def small_config() -> dict:
    cfg = a3b_shaped(4)
    cfg.update(num_experts=8, num_experts_per_tok=2, linear_num_key_heads=4,
               linear_num_value_heads=8, num_attention_heads=4)
    return cfg


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("big-gguf") / "a3b-small.gguf"
    specs = write(path, small_config(), tokenizer=FIXTURE)
    return path, specs


@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K", "Q8_0"])
def test_random_blocks_dequantize_to_the_asked_scale(fmt):
    rng = np.random.default_rng(0)
    kind = gguf.GGMLQuantizationType[fmt]
    w = gguf.quants.dequantize(random_blocks(fmt, 512, rng, 0.02).reshape(-1), kind)
    assert np.isfinite(w).all() and 0.01 < w.std() < 0.04 and abs(w.mean()) < 0.005


def test_written_file_reads_as_written(small_gguf):
    from ckptd.model.gguf.load import field, open_gguf
    from ckptd.model.loader import load_model

    path, specs = small_gguf
    reader = open_gguf(path)
    got = {t.name: (t.tensor_type.name, tuple(int(n) for n in reversed(t.shape.tolist())))
           for t in reader.tensors}
    assert got == {s.name: (s.fmt, s.shape) for s in specs}
    # llama-quantize's Q4_K_M choices for 4 layers: use_more_bits is true for 2 and 3
    assert got["output.weight"][0] == "Q6_K" and got["token_embd.weight"][0] == "Q4_K"
    assert [got[f"blk.{i}.ffn_down_exps.weight"][0] for i in range(4)] == \
        ["Q4_K", "Q4_K", "Q6_K", "Q6_K"]
    assert [got["blk.0.attn_qkv.weight"][0], got["blk.2.attn_qkv.weight"][0],
            got["blk.3.attn_v.weight"][0]] == ["Q4_K", "Q6_K", "Q6_K"]
    assert got["blk.1.ffn_gate_inp.weight"][0] == "F32"
    assert field(reader, "general.file_type") == 15
    model = load_model(path)
    assert model.config.num_layers == 4 and model.config.raw["num_experts"] == 8


def test_kept_load_makes_no_anonymous_copy_of_the_weights(small_gguf):
    """In a fresh process, after a warm-up load (imports, allocator), loading the file
    with kept weights grows the process's own memory (RssAnon) by well under the
    quantized bytes: the weights stay the file's mapped pages (RssFile)."""
    path, specs = small_gguf
    quant = sum(s.nbytes for s in specs if s.fmt not in ("F32", "F16"))
    child = (
        "import json, sys\n"
        "from ckptd.model.loader import load_model\n"
        "def anon():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('RssAnon:'):\n"
        "            return int(line.split()[1]) * 1024\n"
        "load_model(sys.argv[2])\n"
        "before = anon()\n"
        "model = load_model(sys.argv[1])\n"
        "print(json.dumps({'growth': anon() - before}))\n")
    r = subprocess.run([sys.executable, "-c", child, str(path), str(FIXTURE)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    growth = json.loads(r.stdout.splitlines()[-1])["growth"]
    assert growth < ANON_SHARE * quant, (growth, quant)


def test_cli_refuses_a_mix_its_rows_cannot_hold(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "x.gguf"), "--mix", "Q2_K"])
    assert e.value.code == 2 and "--mix" in capsys.readouterr().err
    with pytest.raises(ValueError, match="use --mix Q8_0"):
        layout({**small_config(), "moe_intermediate_size": 96}, 512)


def test_pooled_blocks_make_the_same_file_of_valid_weights(tmp_path, small_gguf):
    """--pool-mb (the GPU machine's fast path) writes the same tensors, each of blocks
    drawn from the pool at its own scale: same layout and size, finite weights whose
    spread is 1/sqrt(fan_in), and not fresh random bytes (a repeated run shows up)."""
    path, specs = small_gguf
    pooled = tmp_path / "pooled.gguf"
    assert write(pooled, small_config(), tokenizer=FIXTURE, pool_bytes=1 << 20) == specs
    assert pooled.stat().st_size == path.stat().st_size
    reader = gguf.GGUFReader(pooled)
    for t in reader.tensors:
        if t.tensor_type.name not in ("Q4_K", "Q6_K"):
            continue
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        fan_in = w.shape[-1]
        assert np.isfinite(w).all()
        assert 0.5 < w.std() * np.sqrt(fan_in) < 2, (t.name, w.std() * np.sqrt(fan_in))
    big = next(t for t in reader.tensors if t.name == "blk.0.ffn_down_exps.weight")
    raw = np.asarray(big.data).reshape(-1, 144)            # Q4_K blocks, 8 experts of 1 MiB
    assert raw.nbytes > 2 << 20
    assert len(np.unique(raw, axis=0)) < len(raw)          # the 1 MiB pool wrapped round
