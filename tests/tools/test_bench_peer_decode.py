"""tools/bench/peer_decode.py writes llama-server slot files of random KV in the layout
the server saves (llama.cpp 0.3.36), and reads that layout back."""

from __future__ import annotations

import pytest

from ckptd.tools.bench import peer_decode as pd


def test_a_written_slot_reads_back(tmp_path):
    tokens = list(range(5, 105))
    layout = pd.Layout(layers=30, row=384)          # SmolLM2: 3 kv heads x 64 x f16
    pd.write_slot(tmp_path / "s.bin", tokens, layout)
    blob = (tmp_path / "s.bin").read_bytes()
    assert pd.read_layout(blob) == (tokens, layout)
    # the size llama-server 0.3.36 saved for SmolLM2 Q4_1 after a 100-token prompt
    assert len(blob) == 2_306_364


def test_another_layout_is_refused(tmp_path):
    pd.write_slot(tmp_path / "s.bin", [1, 2, 3], pd.Layout(2, 16))
    blob = bytearray((tmp_path / "s.bin").read_bytes())
    with pytest.raises(ValueError, match="version"):
        pd.read_layout(b"\0" * 4 + bytes(blob[4:]))
    v_trans = 12 + 4 * 7 + 8 + 12 * 3
    blob[v_trans] = 1
    with pytest.raises(ValueError, match="transposed"):
        pd.read_layout(bytes(blob))
